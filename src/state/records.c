/*
 * keepsake.metrics records for metrics a binding describes, and the catalogue
 * metrics a file's records rebuild. Both were JSON jobs of the Python
 * extension; they are the state layer's, so every writer records a metric the
 * same way and every reader rebuilds it the same way.
 */
#include <stdio.h>
#include <string.h>

#include "core/json.h"
#include "state/state_internal.h"

/* The canonical arguments of class `cls` built from `attrs` (ks_metric_describe's rule), or NULL. */
static KS_NODISCARD ks_status args_of(const ks_allocator *a, const char *cls, const ks__jv *attrs, ks__jv **out) {
  *out = NULL;
  if (!ks__jv_is(attrs, KS__JV_OBJECT)) return KS_OK;
  char *txt = ks__jv_dump(a, attrs, true);
  if (!txt) return KS_E_NOMEM;
  ks_metric *m = NULL;
  ks_status s = ks_metric_describe(cls, txt, a, &m, NULL);
  ks__free(a, txt);
  const char *args = s ? NULL : ks_metric_args_json(m);
  if (args) s = ks__jv_parse(a, args, strlen(args), "args", out, NULL);
  ks_metric_free(m);
  return s == KS_E_NOMEM ? s : KS_OK;
}

static int in_catalogue(const char *name) {
  for (size_t i = 0; i < ks_metric_class_count(); i++)
    if (!strcmp(ks_metric_class_name(i), name)) return 1;
  return 0;
}

/* One record: class, update count, schema version of the stored states, list states, args. */
static KS_NODISCARD ks_status record_of(const ks_allocator *a, const ks__jv *d, const char *path,
                                        const ks_statedict *sd, ks__jv **out) {
  const char *global = ks__jv_string(ks__jv_get(d, "class"));
  const char *dot = global ? strrchr(global, '.') : NULL;
  const char *cls = dot ? dot + 1 : global;
  int known = cls && *cls && in_catalogue(cls);
  int64_t n = 1;
  if (!ks__jv_is_int(ks__jv_get(d, "update_count"), &n) || n < 0) n = 1;
  char prefix[KS__KEY_MAX + 1];
  if (ks__key(prefix, path, "/" KS_KEY_METRIC_STATES)) return KS_E_LIMIT;
  ks__jv *e = ks__jv_object(a), *args = NULL;
  ks_status s = e ? KS_OK : KS_E_NOMEM;
  if (!s) s = ks__jv_set(a, e, "schema_version",
                         ks__jv_int(a, ks_metric_stored_schema_version(known ? cls : NULL, sd, prefix)));
  if (!s) s = ks__jv_set(a, e, "update_count", ks__jv_int(a, n));
  if (!s && cls && *cls) s = ks__jv_set(a, e, "class", ks__jv_str(a, cls));
  const ks__jv *lists = ks__jv_get(d, "lists"); /* list states: a .pt export writes them as lists */
  if (!s && ks__jv_is(lists, KS__JV_ARRAY)) s = ks__jv_set(a, e, "lists", ks__jv_copy(a, lists));
  const ks__jv *inner = ks__jv_get(d, "inner"); /* a wrapper's inner metrics: {name: class} */
  if (!s && ks__jv_is(inner, KS__JV_OBJECT)) s = ks__jv_set(a, e, "inner", ks__jv_copy(a, inner));
  if (!s && known) s = args_of(a, cls, ks__jv_get(d, "attrs"), &args);
  if (!s && args) s = ks__jv_set(a, e, "args", args);
  if (s) {
    ks__jv_free(a, e);
    return s;
  }
  *out = e;
  return KS_OK;
}

ks_status ks_metric_records_json(const char *description, const ks_statedict *sd, const ks_allocator *alloc,
                                 char **out, ks_error *err) {
  if (!description || !out) return ks__err(err, KS_E_INVALID, "ks_metric_records_json: NULL argument");
  const ks_allocator *a = ks__alloc_or_default(alloc);
  ks__jv *doc = NULL, *meta = NULL;
  ks_status s = ks__jv_parse(a, description, strlen(description), "metric description", &doc, err);
  const ks__jv *list = s ? NULL : ks__jv_get(doc, "metrics");
  if (!s && !ks__jv_is(list, KS__JV_ARRAY))
    s = ks__err(err, KS_E_INVALID, "metric description is not {\"metrics\": [...]}");
  if (!s && !(meta = ks__jv_object(a))) s = KS_E_NOMEM;
  for (size_t i = 0; !s && i < list->len; i++) {
    const char *path = ks__jv_string(ks__jv_get(list->items[i], "path"));
    ks__jv *e = NULL;
    if (!path) continue;
    s = record_of(a, list->items[i], path, sd, &e);
    if (s == KS_E_LIMIT) s = ks__err_at(err, s, NULL, path, -1, "metric path '%.200s' is too long", path);
    else if (!s) s = ks__jv_set(a, meta, path, e);
  }
  char *txt = s ? NULL : ks__jv_dump(a, meta, true);
  if (!s && !txt) s = KS_E_NOMEM;
  if (s == KS_E_NOMEM) s = ks__err(err, s, "out of memory describing the metrics");
  ks__jv_free(a, doc);
  ks__jv_free(a, meta);
  *out = txt;
  return s;
}

/* ---- rebuilding the catalogue metrics a file records ---- */

/* "state/train_metrics/<Name>" -> label ""; "state/eval_metrics/<label>/<Name>" -> label. NULL otherwise. */
static const char *split_path(const char *path, char *label, size_t cap) {
  const char *name = NULL;
  size_t nt = strlen(KS_KEY_TRAIN_METRICS), ne = strlen(KS_KEY_EVAL_METRICS);
  if (!strncmp(path, KS_KEY_TRAIN_METRICS, nt)) {
    label[0] = 0;
    name = path + nt;
  } else if (!strncmp(path, KS_KEY_EVAL_METRICS, ne)) {
    const char *slash = strchr(path + ne, '/');
    size_t n = slash ? (size_t)(slash - (path + ne)) : 0;
    if (!slash || !n || n + 1 > cap) return NULL; /* "state/eval_metrics//M" is no train metric */
    memcpy(label, path + ne, n);
    label[n] = 0;
    name = slash + 1;
  }
  return name && *name && !strchr(name, '/') ? name : NULL;
}

typedef struct recorded {
  const ks__jv *records;
  uint64_t budget; /* bytes the metrics' states may still allocate: the arguments come from the file */
} recorded;

static KS_NODISCARD ks_status build_recorded(void *ctx, const char *label, const ks_allocator *alloc,
                                             ks_metric_collection **out, ks_error *err) {
  recorded *f = ctx;
  ks_metric_collection *c = NULL;
  ks_status s = ks_metric_collection_create(alloc, &c, err);
  for (size_t i = 0; !s && i < f->records->len; i++) {
    char lab[KS__KEY_MAX + 1];
    const ks__jv *m = f->records->items[i];
    const char *name = split_path(f->records->keys[i], lab, sizeof lab);
    const char *cls = ks__jv_string(ks__jv_get(m, "class"));
    const ks__jv *args = ks__jv_get(m, "args");
    if (!name || !cls || !ks__jv_is(args, KS__JV_OBJECT) || strcmp(lab, label ? label : "")) continue;
    char *a = ks__jv_dump(alloc, args, true);
    ks_metric *metric = NULL;
    /* Bounded: a record asking for num_classes = 10^6 must fail with KS_E_LIMIT, not allocate
     * terabytes (ks_convert bounds the same records). */
    s = a ? ks_metric_create_bounded(cls, a, alloc, &f->budget, &metric, err) : KS_E_NOMEM;
    ks__free(alloc, a);
    if (!s) s = ks_metric_collection_add(c, name, metric, err);
    if (s) ks_metric_free(metric); /* the collection takes the metric on success only (metric.h) */
  }
  if (s) {
    ks_metric_collection_free(c); /* ours to free on failure (state.h); the library ignores *out */
    return s;
  }
  *out = c;
  return KS_OK;
}

/* The eval labels the records name, once each, in record order (borrowed from the records). */
static KS_NODISCARD ks_status labels_of(const ks_allocator *a, const ks__jv *records, char ***out, size_t *n) {
  char **labels = ks__calloc(a, records->len + 1, sizeof *labels);
  if (!labels) return KS_E_NOMEM;
  size_t k = 0;
  for (size_t i = 0; i < records->len; i++) {
    char lab[KS__KEY_MAX + 1];
    if (!split_path(records->keys[i], lab, sizeof lab) || !lab[0]) continue;
    int seen = 0;
    for (size_t j = 0; j < k && !seen; j++) seen = !strcmp(labels[j], lab);
    if (seen) continue;
    if (!(labels[k] = ks__strdup(a, lab))) {
      for (size_t j = 0; j < k; j++) ks__free(a, labels[j]);
      ks__free(a, labels);
      return KS_E_NOMEM;
    }
    k++;
  }
  *out = labels;
  *n = k;
  return KS_OK;
}

ks_status ks_state_build_recorded_metrics(ks_state *st, const ks_meta *meta, uint64_t budget, ks_error *err) {
  if (!st) return ks__err(err, KS_E_INVALID, "ks_state_build_recorded_metrics: NULL state");
  const char *txt = meta ? ks_meta_get(meta, KS_META_METRICS) : NULL;
  ks__jv *records = NULL;
  ks_status s = txt ? ks__jv_parse(&st->alloc, txt, strlen(txt), KS_META_METRICS, &records, err) : KS_OK;
  if (!s && txt && !ks__jv_is(records, KS__JV_OBJECT))
    s = ks__err_at(err, KS_E_FORMAT, NULL, KS_META_METRICS, -1, "metadata '%s' is not a JSON object", KS_META_METRICS);
  else if (s && s != KS_E_NOMEM)
    s = ks__err_at(err, KS_E_FORMAT, NULL, KS_META_METRICS, -1, "metadata '%s' is not JSON", KS_META_METRICS);
  ks__jv empty = {.type = KS__JV_OBJECT};
  recorded f = {records ? records : &empty, budget};
  char **labels = NULL;
  size_t n = 0;
  if (!s) s = labels_of(&st->alloc, f.records, &labels, &n);
  if (!s) s = ks_state_build_metrics(st, build_recorded, &f, (const char *const *)labels, n, err);
  for (size_t i = 0; labels && i < n; i++) ks__free(&st->alloc, labels[i]);
  ks__free(&st->alloc, labels);
  ks__jv_free(&st->alloc, records);
  return s;
}

size_t ks_state_eval_count(const ks_state *st) { return st ? st->n_evals : 0; }

const char *ks_state_eval_label(const ks_state *st, size_t i) {
  return st && i < st->n_evals ? st->evals[i].label : NULL;
}
