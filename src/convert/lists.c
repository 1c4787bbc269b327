/*
 * List ("cat") states of a .pt export. keepsake stores a torchmetrics list
 * state as one tensor (the items joined along dim 0); torchmetrics' next
 * update() appends to a list, so the export writes it back as a list: one item
 * (the joined tensor), or none when it has no rows. Which states are lists is
 * the metrics module's knowledge (KS_REDUCE_CAT), for the class and arguments
 * the file's KS_META_METRICS records (the arguments are untrusted, so the
 * metrics are built within a byte budget), and what a record's "lists" names:
 * the states that were lists where the file came from (a torch file, as the
 * import saw it; a Python program's metric, whatever its class).
 */
#include <stdio.h>
#include <string.h>

#include "convert/convert_internal.h"
#include "core/json.h"
#include "keepsake/binding.h"
#include "keepsake/layout.h"
#include "keepsake/metric.h"
#include "keepsake/torch.h"

typedef struct lists {
  const ks_allocator *a;
  const ks_statedict *src;
  uint64_t *budget;
  ks__jv *containers; /* of the structure document being extended */
  ks__jv *renamed;    /* entry name -> number of list items (0 or 1) */
  ks_error *err;
} lists;

static KS_NODISCARD ks_status nomem(ks_error *err) {
  return ks__err(err, KS_E_NOMEM, "convert: out of memory writing list states");
}

/* Records the cat state `key` as a list, unless the structure already describes it. */
static KS_NODISCARD ks_status add_list(lists *c, const char *key, const ks_tensor *t) {
  if (ks__jv_get(c->containers, key) || ks__jv_get(c->renamed, key)) return KS_OK;
  int64_t items = t->rank > 0 && t->shape[0] == 0 ? 0 : 1;
  ks__jv *rec = ks__jv_object(c->a);
  ks_status st = rec ? ks__jv_set(c->a, rec, "kind", ks__jv_str(c->a, "list")) : KS_E_NOMEM;
  if (!st) st = ks__jv_set(c->a, rec, "len", ks__jv_int(c->a, items));
  if (!st) st = ks__jv_set(c->a, c->containers, key, rec), rec = NULL;
  if (!st) st = ks__jv_set(c->a, c->renamed, key, ks__jv_int(c->a, items));
  ks__jv_free(c->a, rec);
  return st ? nomem(c->err) : KS_OK;
}

/* The state `name` of the metric at `path`, when it is a tensor there, recorded as a list. */
static KS_NODISCARD ks_status state_list(lists *c, const char *path, const char *name) {
  char key[KS_MAX_NAME + 1];
  int n = snprintf(key, sizeof key, "%s/%s%s", path, KS_KEY_METRIC_STATES, name);
  const ks_tensor *t = n > 0 && (size_t)n < sizeof key ? ks_statedict_tensor(c->src, key) : NULL;
  return t ? add_list(c, key, t) : KS_OK; /* absent (ignored, or other args): nothing to do */
}

/* The cat states of one built metric whose entries are under `path`. */
static KS_NODISCARD ks_status metric_lists(lists *c, const ks_metric *m, const char *path) {
  for (size_t i = 0; i < ks_metric_state_count(m); i++) {
    const char *name = NULL;
    ks_reduce reduce = KS_REDUCE_SUM;
    if (ks_metric_state_info(m, i, &name, &reduce, NULL) || reduce != KS_REDUCE_CAT) continue;
    ks_status st = state_list(c, path, name);
    if (st) return st;
  }
  return KS_OK;
}

/* The states a KS_META_METRICS record names in "lists": they were lists where the file came from
   (a torch file's, or a Python program's metric), whether or not the catalogue can build it. */
static KS_NODISCARD ks_status recorded_lists(lists *c, const char *path, const ks__jv *rec) {
  const ks__jv *names = ks__jv_get(rec, "lists");
  ks_status st = KS_OK;
  for (size_t k = 0; !st && ks__jv_is(names, KS__JV_ARRAY) && k < names->len; k++)
    if (ks__jv_string(names->items[k])) st = state_list(c, path, ks__jv_string(names->items[k]));
  return st;
}

/* One KS_META_METRICS record: the lists it records (its writer saw them), else the cat states of
   the metric built from its class and args when the catalogue can build it. */
static KS_NODISCARD ks_status record_lists(lists *c, const char *path, const ks__jv *rec) {
  const char *cls = ks__jv_string(ks__jv_get(rec, "class"));
  const ks__jv *args = ks__jv_get(rec, "args");
  if (ks__jv_is(ks__jv_get(rec, "lists"), KS__JV_ARRAY)) return recorded_lists(c, path, rec);
  if (!cls) return KS_OK;
  char *args_json = ks__jv_is(args, KS__JV_OBJECT) ? ks__jv_dump(c->a, args, true) : NULL;
  if (ks__jv_is(args, KS__JV_OBJECT) && !args_json) return nomem(c->err);
  ks_metric *m = NULL;
  ks_error e;
  ks_status st = ks_metric_create_bounded(cls, args_json, c->a, c->budget, &m, &e);
  ks__free(c->a, args_json);
  if (st == KS_E_LIMIT || st == KS_E_NOMEM) {
    if (c->err) *c->err = e;
    ks__err_set_key(c->err, path);
    return st;
  } /* any other failure (unknown class, bad args): the metric keeps its tensors */
  st = m ? metric_lists(c, m, path) : KS_OK;
  ks_metric_free(m);
  return st;
}

/* src's entries, the renamed ones as `<name>/0` (or left out for an empty list). */
static KS_NODISCARD ks_status renamed_dict(lists *c, ks_statedict **out) {
  ks_statedict *dst = NULL;
  ks_status st = ks_statedict_create(c->a, &dst, NULL);
  ks_entry e;
  for (size_t i = 0; !st && ks_statedict_at(c->src, i, &e) == KS_OK; i++) {
    int64_t items = -1;
    if (!ks__jv_is_int(ks__jv_get(c->renamed, e.name), &items)) {
      st = ks_statedict_set_entry(dst, e.name, &e, KS_BORROW, NULL);
      continue;
    }
    char name[KS_MAX_NAME + 3];
    snprintf(name, sizeof name, "%s/0", e.name);
    if (items && strlen(name) > KS_MAX_NAME)
      st = ks__err_at(c->err, KS_E_LIMIT, NULL, e.name, -1, "convert: list state name too long for its item");
    else if (items)
      st = ks_statedict_set_entry(dst, name, &e, KS_BORROW, NULL);
  }
  if (st == KS_E_NOMEM) st = nomem(c->err);
  if (st) ks_statedict_free(dst);
  else *out = dst;
  return st;
}

/* The structure document to extend: the file's (parsed) or a new empty one. */
static KS_NODISCARD ks_status structure_doc(const ks_allocator *a, const char *text, ks__jv **doc, ks_error *err) {
  if (text) return ks__jv_parse(a, text, strlen(text), KS_TORCH_STRUCTURE_META, doc, err);
  *doc = ks__jv_object(a);
  ks_status st = *doc ? ks__jv_set(a, *doc, "version", ks__jv_int(a, 1)) : KS_E_NOMEM;
  if (!st) st = ks__jv_set(a, *doc, "containers", ks__jv_object(a));
  return st ? nomem(err) : KS_OK;
}

static KS_NODISCARD ks_status find_lists(lists *c, const ks__jv *metrics) {
  ks_status st = KS_OK;
  for (size_t i = 0; !st && i < metrics->len; i++)
    if (ks__jv_is(metrics->items[i], KS__JV_OBJECT)) st = record_lists(c, metrics->keys[i], metrics->items[i]);
  return st;
}

/* meta[key] parsed; NULL when absent. */
static KS_NODISCARD ks_status parse_key(const ks_allocator *a, const ks_meta *meta, const char *key, ks__jv **out,
                                        ks_error *err) {
  const char *text = ks_meta_get(meta, key);
  *out = NULL;
  return text ? ks__jv_parse(a, text, strlen(text), key, out, err) : KS_OK;
}

/* The lists of the metrics document, into the structure document *doc (the file's or a new one). */
static KS_NODISCARD ks_status lists_of(lists *c, const ks_meta *meta, const ks__jv *metrics, ks__jv **doc) {
  ks_error serr;
  if (structure_doc(c->a, ks_meta_get(meta, KS_TORCH_STRUCTURE_META), doc, &serr)) /* the writer names what is wrong */
    return serr.code == KS_E_NOMEM ? nomem(c->err) : KS_OK;
  c->containers = (ks__jv *)ks__jv_get(*doc, "containers");
  return ks__jv_is(c->containers, KS__JV_OBJECT) ? find_lists(c, metrics) : KS_OK;
}

ks_status ks__convert_pt_lists(const ks_allocator *a, const ks_statedict *src, const ks_meta *meta, uint64_t *budget,
                               ks_statedict **out, char **structure_out, size_t *n_lists, ks_error *err) {
  *out = NULL, *structure_out = NULL, *n_lists = 0;
  ks__jv *metrics = NULL, *doc = NULL;
  lists c = {a, src, budget, NULL, ks__jv_object(a), err};
  ks_status st = c.renamed ? parse_key(a, meta, KS_META_METRICS, &metrics, err) : nomem(err);
  if (!st && metrics && !ks__jv_is(metrics, KS__JV_OBJECT))
    st = ks__err_at(err, KS_E_FORMAT, NULL, KS_META_METRICS, -1, "metadata is not a JSON object");
  if (!st && metrics) st = lists_of(&c, meta, metrics, &doc);
  if (!st && c.renamed->len) st = renamed_dict(&c, out);
  if (!st && c.renamed->len && !(*structure_out = ks__jv_dump(a, doc, false))) st = nomem(err);
  if (st) ks_statedict_free(*out), *out = NULL;
  else *n_lists = c.renamed->len;
  ks__jv_free(a, c.renamed);
  ks__jv_free(a, metrics);
  ks__jv_free(a, doc);
  return st;
}
