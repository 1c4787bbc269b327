/*
 * Composer checkpoints: maps both metric layouts onto
 *   <root>state_dict/<state>  and  <root>_computed
 * where <root> is state/train_metrics/<Name>/ or state/eval_metrics/<label>/<Name>/.
 * Composer >= 0.14 already writes that layout, except that a list ("cat")
 * state flattens to state_dict/<state>/0, /1, ...: those are joined. Composer
 * <= 0.13.5 pickled the whole torchmetrics object; flattening leaves its
 * attributes under <root>, and its state names are the keys of its
 * `_persistent` and `_defaults` attributes.
 *
 * Names and labels may hold '/', so a metric's root is found from what lies
 * under it: the shortest folder that is a pickled object (has `__class__`) or
 * holds `state_dict/` or `_computed`. Every lookup is hashed and every metric
 * keeps the chain of its own entries, so the work is linear in the entries.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/json.h"
#include "core/keys.h"
#include "import/import_internal.h"
#include "keepsake/layout.h"

#define TRAIN KS_KEY_TRAIN_METRICS
#define EVAL KS_KEY_EVAL_METRICS
#define STATES KS_KEY_METRIC_STATES
#define COMPUTED KS_KEY_METRIC_COMPUTED
#define CLASS "__class__"
#define NONE SIZE_MAX

typedef struct metric {
  char *root; /* "state/eval_metrics/val%2Fholdout/acc%2Ftop1/": keys holding '/' are escaped (torch.h) */
  size_t len;
  char *out;  /* the same root unescaped, as output names and the state loader spell it */
  size_t out_len;
  int pickled, emitted;
  size_t first, last; /* this metric's entries, in order, chained through norm.next */
} metric;

typedef struct norm {
  const ks_statedict *flat;
  ks_statedict *out;
  ks_take take;
  ks_error *err;
  const ks_allocator *a;
  metric *m;
  size_t n, cap;
  size_t *owner;        /* per entry of flat: metric index + 1, or 0 */
  size_t *next;         /* per entry: the next entry of the same metric, or NONE */
  ks_statedict *index;  /* metric root -> its index in m */
  ks_statedict *seen;   /* <root><state>: a state name already listed */
  ks_statedict *joined; /* list state key -> number of items joined into it */
  uint64_t *join_left;  /* bytes list states may still be joined into; NULL = no cap */
  ks__jv *list;
} norm;

static KS_NODISCARD ks_status nomem(ks_error *err) { return ks__err(err, KS_E_NOMEM, "composer: out of memory"); }

static int starts(const char *s, const char *p) { return !strncmp(s, p, strlen(p)); }

/* buf = the first n bytes of a, then b; 0 when it does not fit. */
static int join(char *buf, size_t cap, const char *a, size_t n, const char *b) {
  int w = snprintf(buf, cap, "%.*s%s", (int)n, a, b);
  return w >= 0 && (size_t)w < cap;
}

static int is_object(const norm *nm, const char *name, size_t len) {
  char key[KS_MAX_NAME + sizeof CLASS];
  ks_entry e;
  return join(key, sizeof key, name, len, CLASS) && ks_statedict_get(nm->flat, key, &e) == KS_OK &&
         e.kind == KS_VAL_STRING;
}

/* Whether `rest`, what follows a folder, is the start of a {state_dict, _computed} metric. */
static int dict_tail(const char *rest) {
  size_t n = strlen(COMPUTED);
  return starts(rest, STATES) || (!strncmp(rest, COMPUTED, n) && (rest[n] == 0 || rest[n] == '/'));
}

/*
 * Length of the metric root of `name`, or 0 when name is not under a metric.
 * Without a telling folder the root is the first one past the group (and label),
 * as when names held no '/'.
 */
static size_t root_len(const norm *nm, const char *name, int *pickled) {
  const char *p;
  int parts;
  *pickled = 0;
  if (starts(name, TRAIN)) p = name + strlen(TRAIN), parts = 1;
  else if (starts(name, EVAL)) p = name + strlen(EVAL), parts = 2;
  else return 0;
  size_t fallback = 0;
  for (int k = 1;; k++) {
    const char *slash = strchr(p, '/');
    if (!slash || slash == p) return fallback;
    p = slash + 1;
    size_t len = (size_t)(p - name);
    if (k < parts) continue;
    if (k == parts) fallback = len;
    if (is_object(nm, name, len)) return *pickled = 1, len;
    if (dict_tail(p)) return len;
  }
}

static KS_NODISCARD ks_status add_metric(norm *nm, const char *root, int pickled, size_t *idx) {
  if (nm->n == nm->cap) {
    size_t ncap = nm->cap ? nm->cap * 2 : 8;
    metric *m = ks__realloc(nm->a, nm->m, ncap * sizeof *m);
    if (!m) return nomem(nm->err);
    nm->m = m;
    nm->cap = ncap;
  }
  metric *m = &nm->m[nm->n];
  size_t len = strlen(root);
  *m = (metric){ks__strdup(nm->a, root), len, ks__malloc(nm->a, len + 1), 0, pickled, 0, NONE, NONE};
  if (m->out) m->out[m->out_len = ks__key_unescape(root, len, m->out)] = 0;
  if (!m->root || !m->out || ks_statedict_set_int(nm->index, root, (int64_t)nm->n, NULL)) {
    ks__free(nm->a, m->root);
    ks__free(nm->a, m->out);
    return nomem(nm->err);
  }
  *idx = nm->n++;
  return KS_OK;
}

/* Finds every metric and chains each entry to the metric it belongs to. */
static KS_NODISCARD ks_status collect(norm *nm) {
  size_t count = ks_statedict_count(nm->flat);
  nm->owner = ks__calloc(nm->a, count + 1, sizeof *nm->owner);
  nm->next = ks__calloc(nm->a, count + 1, sizeof *nm->next);
  if (!nm->owner || !nm->next) return nomem(nm->err);
  ks_entry e;
  char root[KS_MAX_NAME + 1];
  for (size_t i = 0; i < count && ks_statedict_at(nm->flat, i, &e) == KS_OK; i++) {
    int pickled;
    size_t len = root_len(nm, e.name, &pickled), idx = 0;
    nm->next[i] = NONE;
    if (!len || !join(root, sizeof root, e.name, len, "")) continue;
    ks_entry ie;
    if (ks_statedict_get(nm->index, root, &ie) == KS_OK) idx = (size_t)ie.i;
    else if (add_metric(nm, root, pickled, &idx)) return KS_E_NOMEM;
    metric *m = &nm->m[idx];
    if (m->last == NONE) m->first = i;
    else nm->next[m->last] = i;
    m->last = i;
    nm->owner[i] = idx + 1;
  }
  return KS_OK;
}

/* The i-th entry of flat, which exists: i comes from a chain. */
static ks_entry at(const norm *nm, size_t i) {
  ks_entry e;
  if (ks_statedict_at(nm->flat, i, &e)) memset(&e, 0, sizeof e); /* index in range: cannot fail */
  return e;
}

/* The output name of src, an entry under m's root: the unescaped root, then the rest of src. */
static int out_name(const metric *m, const char *src, char *buf, size_t cap) {
  return join(buf, cap, m->out, m->out_len, src + m->len);
}

static KS_NODISCARD ks_status put(norm *nm, const char *name, const ks_entry *e, ks_take take) {
  ks_status st = ks_statedict_set_entry(nm->out, name, e, take, NULL);
  return st ? ks__err_at(nm->err, st, NULL, name, -1, "composer: cannot add entry") : KS_OK;
}

/* The state name `rel` holds after `prefix` ("tp" of "_defaults/tp"), into buf; 0 when none. */
static int component(const char *rel, const char *prefix, char *buf, size_t cap) {
  if (!starts(rel, prefix)) return 0;
  const char *s = rel + strlen(prefix), *slash = strchr(s, '/');
  size_t n = slash ? (size_t)(slash - s) : strlen(s);
  if (n == 0 || n >= cap) return 0;
  memcpy(buf, s, n);
  buf[n] = 0;
  return 1;
}

/* Appends the state name s once. */
static KS_NODISCARD ks_status add_state(norm *nm, const metric *m, const char *s, ks__jv *names) {
  char key[KS_MAX_NAME + 1];
  ks_entry e;
  if (!join(key, sizeof key, m->root, m->len, s) || ks_statedict_get(nm->seen, key, &e) == KS_OK) return KS_OK;
  if (ks_statedict_set_null(nm->seen, key, NULL) || ks__jv_push(nm->a, names, ks__jv_str(nm->a, s)))
    return nomem(nm->err);
  return KS_OK;
}

/* State names: keys under <root>_persistent/ and <root>_defaults/ (pickled) or <root>state_dict/. */
static KS_NODISCARD ks_status state_names(norm *nm, const metric *m, ks__jv *names) {
  const char *p1 = m->pickled ? "_persistent/" : STATES, *p2 = m->pickled ? "_defaults/" : STATES;
  char buf[KS_MAX_NAME + 1];
  ks_status st = KS_OK;
  for (size_t i = m->first; i != NONE && !st; i = nm->next[i]) {
    const char *rel = at(nm, i).name + m->len;
    if (component(rel, p1, buf, sizeof buf) || component(rel, p2, buf, sizeof buf)) st = add_state(nm, m, buf, names);
  }
  return st;
}

static KS_NODISCARD ks_status cat_shape(norm *nm, const char *base, ks_dtype *dt, int *rank, int64_t *shape,
                                        size_t *count) {
  char key[KS_MAX_NAME + 32];
  *count = 0;
  shape[0] = 0;
  for (;; (*count)++) {
    const ks_tensor *t = NULL;
    if (snprintf(key, sizeof key, "%s/%zu", base, *count) < (int)sizeof key) t = ks_statedict_tensor(nm->flat, key);
    if (!t) return KS_OK;
    int r = t->rank ? t->rank : 1;
    int64_t d0 = t->rank ? t->shape[0] : 1;
    if (*count == 0) {
      *dt = t->dtype, *rank = r;
      for (int i = 1; i < r; i++) shape[i] = t->shape[i];
    }
    if (t->dtype != *dt)
      return ks__err_at(nm->err, KS_E_DTYPE, NULL, key, -1, "composer: list state items differ in dtype");
    int same = r == *rank; /* a lower rank after a higher one would be copied into too small a tensor */
    for (int i = 1; same && i < r; i++) same = t->shape[i] == shape[i];
    if (!same)
      return ks__err_at(nm->err, KS_E_SHAPE, NULL, key, -1, "composer: list state items differ in shape");
    if (d0 > INT64_MAX - shape[0])
      return ks__err_at(nm->err, KS_E_LIMIT, NULL, key, -1, "composer: list state too long");
    shape[0] += d0;
  }
}

/* A list state (torchmetrics `cat` reduction): items <base>/0, /1... joined along dim 0 into dst. */
static KS_NODISCARD ks_status cat_state(norm *nm, const char *base, const char *dst, size_t *count) {
  ks_dtype dt = KS_F32;
  int rank = 1;
  int64_t shape[KS_MAX_RANK] = {0};
  ks_status st = cat_shape(nm, base, &dt, &rank, shape, count);
  if (st) return st;
  size_t bytes;
  if (ks_shape_size(dt, rank, shape, NULL, &bytes) != KS_OK || (nm->join_left && bytes > *nm->join_left))
    return ks__err_at(nm->err, KS_E_LIMIT, NULL, dst, -1,
                      "composer: list state joins %lld rows, more bytes than the %llu left for this input",
                      (long long)shape[0], nm->join_left ? (unsigned long long)*nm->join_left : 0ull);
  /* Items may all view one shared storage: joining copies, so the budget counts copies. */
  if (nm->join_left) *nm->join_left -= bytes;
  uint8_t *data = NULL;
  if ((st = ks_statedict_new_tensor(nm->out, dst, dt, rank, shape, (void **)&data, NULL)) != KS_OK)
    return ks__err_at(nm->err, st, NULL, dst, -1, "composer: cannot add entry");
  char key[KS_MAX_NAME + 32];
  for (size_t i = 0, off = 0; i < *count; i++) {
    const ks_tensor *t = NULL;
    if (snprintf(key, sizeof key, "%s/%zu", base, i) < (int)sizeof key) t = ks_statedict_tensor(nm->flat, key);
    if (t && t->nbytes) memcpy(data + off, t->data, t->nbytes);
    off += t ? t->nbytes : 0;
  }
  return KS_OK;
}

static KS_NODISCARD ks_status emit_state(norm *nm, const metric *m, const char *s) {
  char src[KS_MAX_NAME + 1], dst[KS_MAX_NAME + 1];
  ks_entry e;
  size_t count;
  if (!join(src, sizeof src, m->root, m->len, s) ||
      snprintf(dst, sizeof dst, "%s%s%s", m->out, STATES, s) > KS_MAX_NAME)
    return ks__err_at(nm->err, KS_E_LIMIT, NULL, m->root, -1, "composer: state name too long");
  if (ks_statedict_get(nm->flat, src, &e) == KS_OK) return put(nm, dst, &e, KS_COPY);
  return cat_state(nm, src, dst, &count);
}

/* `_computed`: the value itself, or the sub-keys of a structured result; None when absent. */
static KS_NODISCARD ks_status emit_computed(norm *nm, const metric *m) {
  size_t klen = strlen(COMPUTED);
  int found = 0;
  for (size_t i = m->first; i != NONE; i = nm->next[i]) {
    ks_entry e = at(nm, i);
    const char *rel = e.name + m->len;
    if (strncmp(rel, COMPUTED, klen) || (rel[klen] && rel[klen] != '/')) continue;
    char dst[KS_MAX_NAME + 1];
    ks_status st = out_name(m, e.name, dst, sizeof dst)
                       ? put(nm, dst, &e, KS_COPY)
                       : ks__err_at(nm->err, KS_E_LIMIT, NULL, e.name, -1, "composer: name too long");
    if (st) return st;
    found = 1;
  }
  char key[KS_MAX_NAME + 1];
  if (found) return KS_OK;
  if (!join(key, sizeof key, m->out, m->out_len, COMPUTED))
    return ks__err_at(nm->err, KS_E_LIMIT, NULL, m->root, -1, "composer: metric name too long");
  return put(nm, key, &(ks_entry){.kind = KS_VAL_NULL}, KS_COPY);
}

static int module_attr(const char *s) {
  static const char *const skip[] = {"training", "compute_on_cpu", "dist_sync_on_step", "process_group",
                                     "dist_sync_fn", "sync_on_compute", "distributed_available_fn"};
  for (size_t i = 0; i < sizeof skip / sizeof skip[0]; i++)
    if (!strcmp(s, skip[i])) return 1;
  return s[0] == '_';
}

/* Whether a scalar has a JSON form: non-finite floats and non-UTF-8 strings are left out. */
static int has_json_form(const ks_entry *e) {
  if (e->kind == KS_VAL_FLOAT) return isfinite(e->f);
  if (e->kind == KS_VAL_STRING) return ks__utf8_valid((const uint8_t *)e->s, strlen(e->s));
  return e->kind == KS_VAL_INT || e->kind == KS_VAL_BOOL || e->kind == KS_VAL_NULL;
}

static ks__jv *scalar_json(const ks_allocator *a, const ks_entry *e) {
  switch (e->kind) {
    case KS_VAL_INT: return ks__jv_int(a, e->i);
    case KS_VAL_FLOAT: return ks__jv_real(a, e->f);
    case KS_VAL_BOOL: return ks__jv_bool(a, e->i != 0);
    case KS_VAL_STRING: return ks__jv_str(a, e->s);
    default: return ks__jv_null(a);
  }
}

/* Public scalar attributes of a pickled metric: its constructor arguments in practice. */
static KS_NODISCARD ks_status attrs_json(norm *nm, const metric *m, ks__jv *attrs) {
  for (size_t i = m->first; i != NONE; i = nm->next[i]) {
    ks_entry e = at(nm, i);
    const char *attr = e.name + m->len;
    if (strchr(attr, '/') || module_attr(attr) || !has_json_form(&e)) continue;
    if (ks__jv_set(nm->a, attrs, attr, scalar_json(nm->a, &e))) return nomem(nm->err);
  }
  return KS_OK;
}

/*
 * Train: name = all past the group. Eval: name = the last folder, label = the
 * folders before it. A '/' in an eval label cannot be told from one in the
 * name; the last folder is the name because Composer names metrics by class.
 * The path, which the state loader goes by, is exact either way.
 */
static void metric_names(const metric *m, int eval, char *label, char *name, size_t cap) {
  const char *rest = m->root + strlen(eval ? EVAL : TRAIN), *end = m->root + m->len - 1, *cut = rest;
  label[0] = 0;
  if (eval) {
    for (const char *p = rest; p < end; p++)
      if (*p == '/') cut = p + 1;
    size_t n = (size_t)(cut - rest - 1);
    label[ks__key_unescape(rest, n < cap ? n : cap - 1, label)] = 0;
  }
  size_t n = (size_t)(end - cut);
  name[ks__key_unescape(cut, n < cap ? n : cap - 1, name)] = 0;
}

/* {"path", "group", "label", "name", "class", "states", "update_count", "attrs"} in this order
   (emit_metric appends "lists");
   takes `states` in every case. */
static ks__jv *metric_json(norm *nm, const metric *m, ks__jv *states) {
  char label[KS_MAX_NAME + 1], name[KS_MAX_NAME + 1], key[KS_MAX_NAME + 32], path[KS_MAX_NAME + 1];
  int eval = starts(m->root, EVAL);
  ks_entry e;
  metric_names(m, eval, label, name, sizeof name);
  const ks_allocator *a = nm->a;
  join(key, sizeof key, m->root, m->len, CLASS);
  int has_cls = m->pickled && !ks_statedict_get(nm->flat, key, &e) && e.kind == KS_VAL_STRING &&
                ks__utf8_valid((const uint8_t *)e.s, strlen(e.s));
  ks__jv *cls = has_cls ? ks__jv_str(a, e.s) : ks__jv_null(a);
  int has_count = m->pickled && join(key, sizeof key, m->root, m->len, "_update_count") &&
                  !ks_statedict_get(nm->flat, key, &e) && e.kind == KS_VAL_INT;
  join(path, sizeof path, m->out, m->out_len - 1, "");
  ks__jv *o = ks__jv_object(a);
  ks_status s = o ? KS_OK : KS_E_NOMEM;
  if (!s) s = ks__jv_set(a, o, "path", ks__jv_str(a, path));
  if (!s) s = ks__jv_set(a, o, "group", ks__jv_str(a, eval ? "eval" : "train"));
  if (!s) s = ks__jv_set(a, o, "label", eval ? ks__jv_str(a, label) : ks__jv_null(a));
  if (!s) s = ks__jv_set(a, o, "name", ks__jv_str(a, name));
  if (!s) s = ks__jv_set(a, o, "class", cls), cls = NULL;
  if (!s) s = ks__jv_set(a, o, "states", states), states = NULL;
  if (!s) s = ks__jv_set(a, o, "update_count", has_count ? ks__jv_int(a, e.i) : ks__jv_null(a));
  if (!s) s = ks__jv_set(a, o, "attrs", ks__jv_object(a));
  ks__jv_free(a, cls);
  ks__jv_free(a, states);
  if (s) ks__jv_free(a, o), o = NULL;
  return o;
}

/* Whether state s was a Python list: a pickled attribute that is no single value (its items, or
   none), or a run of state_dict/<s>/0, /1... never beside an entry of the same name. */
static int was_list(norm *nm, const metric *m, const char *s) {
  char base[KS_MAX_NAME + 1], first[KS_MAX_NAME + 8];
  ks_entry e;
  int n = snprintf(base, sizeof base, "%.*s%s%s", (int)m->len, m->root, m->pickled ? "" : STATES, s);
  if (n < 0 || (size_t)n >= sizeof base || ks_statedict_get(nm->flat, base, &e) == KS_OK) return 0;
  return m->pickled || (join(first, sizeof first, base, (size_t)n, "/0") && ks_statedict_tensor(nm->flat, first));
}

/* "lists": the states that were lists (joined along dim 0 here), so that an export can write them
   back as lists; left out when there are none. */
static KS_NODISCARD ks_status list_names(norm *nm, const metric *m, const ks__jv *names, ks__jv *info) {
  ks__jv *lists = NULL;
  for (size_t i = 0; i < names->len; i++) {
    const char *s = ks__jv_string(names->items[i]);
    if (!s || !was_list(nm, m, s)) continue;
    if (!lists && !(lists = ks__jv_array(nm->a))) return nomem(nm->err);
    if (ks__jv_push(nm->a, lists, ks__jv_str(nm->a, s))) return ks__jv_free(nm->a, lists), nomem(nm->err);
  }
  return lists && ks__jv_set(nm->a, info, "lists", lists) ? nomem(nm->err) : KS_OK;
}

/* Describes the metric; a pickled one also has its states and _computed written. */
static KS_NODISCARD ks_status emit_metric(norm *nm, metric *m) {
  const ks_allocator *a = nm->a;
  ks__jv *states = ks__jv_array(a);
  if (!states) return nomem(nm->err);
  ks_status st = state_names(nm, m, states);
  if (st) {
    ks__jv_free(a, states);
    return st;
  }
  ks__jv *info = metric_json(nm, m, states);
  if (!info) return nomem(nm->err);
  if (m->pickled) st = attrs_json(nm, m, (ks__jv *)ks__jv_get(info, "attrs"));
  const ks__jv *names = ks__jv_get(info, "states");
  if (!st) st = list_names(nm, m, names, info);
  for (size_t i = 0; m->pickled && !st && i < names->len; i++) st = emit_state(nm, m, ks__jv_string(names->items[i]));
  if (!st && m->pickled) st = emit_computed(nm, m);
  if (!st) st = ks__jv_push(a, nm->list, info) ? nomem(nm->err) : KS_OK;
  else ks__jv_free(a, info);
  m->emitted = 1;
  return st;
}

/* Item number of a list state's entry ("12" of ".../state_dict/preds/12"); -1 when rel is not one. */
static int64_t list_item(const char *rel, size_t *base_len) {
  if (!starts(rel, STATES)) return -1;
  const char *s = rel + strlen(STATES), *slash = strchr(s, '/');
  if (!slash || slash == s || !slash[1] || strlen(slash + 1) > 18 || (slash[1] == '0' && slash[2])) return -1;
  int64_t n = 0;
  for (const char *d = slash + 1; *d; d++) {
    if (*d < '0' || *d > '9') return -1;
    n = n * 10 + (*d - '0');
  }
  *base_len = (size_t)(slash - rel);
  return n;
}

/*
 * A state_dict/<state>/<n> tensor of a {state_dict, _computed} metric: the items
 * of a list state, joined into state_dict/<state> when the first is met.
 * *done is set when e was one of the joined items.
 */
static KS_NODISCARD ks_status join_item(norm *nm, const metric *m, const ks_entry *e, int *done) {
  size_t blen;
  int64_t item = e->kind == KS_VAL_TENSOR ? list_item(e->name + m->len, &blen) : -1;
  char base[KS_MAX_NAME + 1], first[KS_MAX_NAME + 8];
  ks_entry je;
  *done = 0;
  char out[KS_MAX_NAME + 1];
  if (item < 0 || !join(base, sizeof base, e->name, m->len + blen, "") || !out_name(m, base, out, sizeof out))
    return KS_OK;
  if (ks_statedict_get(nm->joined, base, &je) == KS_OK) return *done = item < je.i, KS_OK;
  /* Only a run from /0 is a list, and never over an entry of the same name. */
  if (!join(first, sizeof first, base, strlen(base), "/0") || !ks_statedict_tensor(nm->flat, first) ||
      ks_statedict_get(nm->flat, base, &je) == KS_OK)
    return KS_OK;
  size_t count;
  ks_status st = cat_state(nm, base, out, &count);
  if (!st && ks_statedict_set_int(nm->joined, base, (int64_t)count, NULL)) st = nomem(nm->err);
  *done = !st && (uint64_t)item < count;
  return st;
}

static KS_NODISCARD ks_status run(norm *nm) {
  ks_status st = collect(nm);
  ks_entry e;
  for (size_t i = 0; !st && ks_statedict_at(nm->flat, i, &e) == KS_OK; i++) {
    metric *m = nm->owner[i] ? &nm->m[nm->owner[i] - 1] : NULL;
    if (m && !m->emitted) st = emit_metric(nm, m);
    if (st || (m && m->pickled)) continue;
    int done = 0;
    char out[KS_MAX_NAME + 1];
    if (m) st = join_item(nm, m, &e, &done);
    if (!st && !done && m && !out_name(m, e.name, out, sizeof out))
      st = ks__err_at(nm->err, KS_E_LIMIT, NULL, e.name, -1, "composer: name too long");
    if (!st && !done) st = put(nm, m ? out : e.name, &e, nm->take);
  }
  return st;
}

static KS_NODISCARD ks_status finish_json(norm *nm, const char *layout, char **out) {
  const ks_allocator *a = nm->a;
  ks__jv *doc = ks__jv_object(a);
  ks_status s = doc ? KS_OK : KS_E_NOMEM;
  if (!s) s = ks__jv_set(a, doc, "layout", ks__jv_str(a, layout));
  if (!s) s = ks__jv_set(a, doc, "metrics", nm->list), nm->list = NULL; /* the document takes the list */
  *out = s ? NULL : ks__jv_dump(a, doc, false);
  ks__jv_free(a, doc);
  return *out ? KS_OK : nomem(nm->err);
}

static const char *layout_of(const norm *nm) {
  int pickled = 0, dict = 0;
  for (size_t i = 0; i < nm->n; i++) nm->m[i].pickled ? pickled++ : dict++;
  return pickled && dict ? "mixed" : pickled ? "pickled-object" : dict ? "state-dict" : "none";
}

static void norm_free(norm *nm) {
  ks__jv_free(nm->a, nm->list);
  for (size_t i = 0; i < nm->n; i++) ks__free(nm->a, nm->m[i].root), ks__free(nm->a, nm->m[i].out);
  ks__free(nm->a, nm->m);
  ks__free(nm->a, nm->owner);
  ks__free(nm->a, nm->next);
  ks_statedict_free(nm->index);
  ks_statedict_free(nm->seen);
  ks_statedict_free(nm->joined);
}

ks_status ks__composer_normalize(const ks_statedict *flat, ks_take take, uint64_t *join_budget, ks_statedict **out,
                                 char **metrics_json, ks_error *err) {
  if (!flat || !out || (take != KS_COPY && take != KS_BORROW))
    return ks__err(err, KS_E_INVALID, "composer: bad argument");
  norm nm = {.flat = flat, .take = take, .err = err, .a = ks__statedict_allocator(flat), .join_left = join_budget};
  nm.list = ks__jv_array(nm.a);
  ks_status st = nm.list && !ks_statedict_create(nm.a, &nm.out, err) && !ks_statedict_create(nm.a, &nm.index, err) &&
                         !ks_statedict_create(nm.a, &nm.seen, err) && !ks_statedict_create(nm.a, &nm.joined, err)
                     ? KS_OK
                     : nomem(err);
  if (!st) st = run(&nm);
  char *json = NULL;
  if (!st && metrics_json) st = finish_json(&nm, layout_of(&nm), &json);
  norm_free(&nm);
  if (st) {
    ks_statedict_free(nm.out);
    return st;
  }
  if (metrics_json) *metrics_json = json;
  *out = nm.out;
  return KS_OK;
}
