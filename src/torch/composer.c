/*
 * Composer checkpoints: maps both metric layouts onto
 *   <root>state_dict/<state>  and  <root>_computed
 * where <root> is state/train_metrics/<Name>/ or state/eval_metrics/<label>/<Name>/.
 * Composer >= 0.14 already writes that layout. Composer <= 0.13.5 pickled the
 * whole torchmetrics object; flattening leaves its attributes under <root>, and
 * its state names are the keys of its `_persistent` and `_defaults` attributes.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/json.h"
#include "torch/torch_internal.h"

#define TRAIN "state/train_metrics/"
#define EVAL "state/eval_metrics/"

typedef struct metric {
  char root[KS_MAX_NAME + 1];
  size_t len;
  int pickled;
  int emitted;
} metric;

typedef struct norm {
  const ks_statedict *flat;
  ks_statedict *out;
  ks_take take;
  ks_error *err;
  metric *m;
  size_t n, cap;
  ks__jv *list;
} norm;

static ks_status nomem(ks_error *err) { return ks__err(err, KS_E_NOMEM, "composer: out of memory"); }

static int starts(const char *s, const char *p) { return !strncmp(s, p, strlen(p)); }

/* Length of the metric root of `name` ("state/train_metrics/Acc/"), or 0. */
static size_t root_len(const char *name) {
  const char *p;
  int parts;
  if (starts(name, TRAIN)) p = name + strlen(TRAIN), parts = 1;
  else if (starts(name, EVAL)) p = name + strlen(EVAL), parts = 2;
  else return 0;
  for (; parts > 0; parts--) {
    const char *slash = strchr(p, '/');
    if (!slash || slash == p) return 0;
    p = slash + 1;
  }
  return (size_t)(p - name);
}

static metric *find_metric(norm *nm, const char *name, size_t len) {
  for (size_t i = nm->n; i-- > 0;)
    if (nm->m[i].len == len && !strncmp(nm->m[i].root, name, len)) return &nm->m[i];
  return NULL;
}

static ks_status collect(norm *nm) {
  const ks_allocator *a = ks_statedict_allocator(nm->flat);
  ks_entry e;
  for (size_t i = 0; ks_statedict_at(nm->flat, i, &e) == KS_OK; i++) {
    size_t len = root_len(e.name);
    if (!len || find_metric(nm, e.name, len)) continue;
    if (ks__grow(a, &nm->m, &nm->cap, nm->n + 1, sizeof *nm->m)) return nomem(nm->err);
    metric *m = &nm->m[nm->n++];
    memcpy(m->root, e.name, len);
    m->root[len] = 0;
    m->len = len;
    m->emitted = 0;
    char cls[KS_MAX_NAME + 16];
    snprintf(cls, sizeof cls, "%s__class__", m->root);
    m->pickled = ks_statedict_get(nm->flat, cls, &e) == KS_OK && e.kind == KS_VAL_STRING;
  }
  return KS_OK;
}

static ks_status put(norm *nm, const char *name, const ks_entry *e, ks_take take) {
  ks_status st = ks_statedict_set_entry(nm->out, name, e, take);
  return st ? ks__err_at(nm->err, st, NULL, name, -1, "composer: cannot add entry") : KS_OK;
}

/* Next path component after `prefix` in name, into buf; 0 when name is not under prefix. */
static int component(const char *name, const char *prefix, char *buf, size_t cap) {
  if (!starts(name, prefix)) return 0;
  const char *s = name + strlen(prefix), *slash = strchr(s, '/');
  size_t n = slash ? (size_t)(slash - s) : strlen(s);
  if (n == 0 || n >= cap) return 0;
  memcpy(buf, s, n);
  buf[n] = 0;
  return 1;
}

static const ks_allocator *alloc_of(const norm *nm) { return ks_statedict_allocator(nm->flat); }

static int json_has(const ks__jv *arr, const char *s) {
  for (size_t i = 0; i < arr->len; i++)
    if (!strcmp(ks__jv_string(arr->items[i]), s)) return 1;
  return 0;
}

/* State names: keys under <root>_persistent/ and <root>_defaults/ (pickled) or <root>state_dict/. */
static ks_status state_names(norm *nm, const metric *m, ks__jv *names) {
  char p1[KS_MAX_NAME + 32], p2[KS_MAX_NAME + 32], buf[KS_MAX_NAME + 1];
  snprintf(p1, sizeof p1, "%s%s", m->root, m->pickled ? "_persistent/" : "state_dict/");
  snprintf(p2, sizeof p2, "%s%s", m->root, m->pickled ? "_defaults/" : "state_dict/");
  ks_entry e;
  for (size_t i = 0; ks_statedict_at(nm->flat, i, &e) == KS_OK; i++) {
    if (!component(e.name, p1, buf, sizeof buf) && !component(e.name, p2, buf, sizeof buf)) continue;
    if (json_has(names, buf)) continue;
    if (ks__jv_push(alloc_of(nm), names, ks__jv_str(alloc_of(nm), buf))) return nomem(nm->err);
  }
  return KS_OK;
}

static ks_status cat_shape(norm *nm, const char *base, ks_dtype *dt, int *rank, int64_t *shape, size_t *count) {
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
    if (t->dtype != *dt) return ks__err_at(nm->err, KS_E_DTYPE, NULL, key, -1, "composer: list state items differ in dtype");
    int same = r == *rank; /* a lower rank after a higher one would be copied into too small a tensor */
    for (int i = 1; same && i < r; i++) same = t->shape[i] == shape[i];
    if (!same)
      return ks__err_at(nm->err, KS_E_SHAPE, NULL, key, -1, "composer: list state items differ in shape");
    if (d0 > INT64_MAX - shape[0]) return ks__err_at(nm->err, KS_E_LIMIT, NULL, key, -1, "composer: list state too long");
    shape[0] += d0;
  }
}

/* A list state (torchmetrics `cat` reduction): items <base>/0, /1... joined along dim 0. */
static ks_status cat_state(norm *nm, const char *base, const char *dst) {
  ks_dtype dt = KS_F32;
  int rank = 1;
  int64_t shape[KS_MAX_RANK] = {0};
  size_t count;
  ks_status st = cat_shape(nm, base, &dt, &rank, shape, &count);
  if (st) return st;
  uint8_t *data = NULL;
  if ((st = ks_statedict_new_tensor(nm->out, dst, dt, rank, shape, (void **)&data)) != KS_OK)
    return ks__err_at(nm->err, st, NULL, dst, -1, "composer: cannot add entry");
  char key[KS_MAX_NAME + 32];
  for (size_t i = 0, off = 0; i < count; i++) {
    const ks_tensor *t = NULL;
    if (snprintf(key, sizeof key, "%s/%zu", base, i) < (int)sizeof key) t = ks_statedict_tensor(nm->flat, key);
    if (t && t->nbytes) memcpy(data + off, t->data, t->nbytes);
    off += t ? t->nbytes : 0;
  }
  return KS_OK;
}

static ks_status emit_state(norm *nm, const metric *m, const char *s) {
  char src[KS_MAX_NAME + 32], dst[KS_MAX_NAME + 48];
  ks_entry e;
  snprintf(src, sizeof src, "%s%s", m->root, s);
  if (snprintf(dst, sizeof dst, "%sstate_dict/%s", m->root, s) > KS_MAX_NAME)
    return ks__err_at(nm->err, KS_E_LIMIT, NULL, m->root, -1, "composer: state name too long");
  if (ks_statedict_get(nm->flat, src, &e) == KS_OK) return put(nm, dst, &e, KS_COPY);
  return cat_state(nm, src, dst);
}

/* `_computed`: the value itself, or the sub-keys of a structured result; None when absent. */
static ks_status emit_computed(norm *nm, const metric *m) {
  char key[KS_MAX_NAME + 32];
  size_t klen = (size_t)snprintf(key, sizeof key, "%s_computed", m->root);
  ks_entry e;
  int found = 0;
  for (size_t i = 0; ks_statedict_at(nm->flat, i, &e) == KS_OK; i++) {
    if (strncmp(e.name, key, klen) || (e.name[klen] && e.name[klen] != '/')) continue;
    ks_status st = put(nm, e.name, &e, KS_COPY);
    if (st) return st;
    found = 1;
  }
  return found ? KS_OK : put(nm, key, &(ks_entry){.kind = KS_VAL_NULL}, KS_COPY);
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
static ks_status attrs_json(norm *nm, const metric *m, ks__jv *attrs) {
  ks_entry e;
  for (size_t i = 0; ks_statedict_at(nm->flat, i, &e) == KS_OK; i++) {
    if (strncmp(e.name, m->root, m->len) || strchr(e.name + m->len, '/')) continue;
    const char *attr = e.name + m->len;
    if (module_attr(attr) || !has_json_form(&e)) continue;
    if (ks__jv_set(alloc_of(nm), attrs, attr, scalar_json(alloc_of(nm), &e))) return nomem(nm->err);
  }
  return KS_OK;
}

static void metric_names(const metric *m, int eval, char *label, char *name, size_t cap) {
  char prefix[KS_MAX_NAME + 32];
  label[0] = name[0] = 0;
  if (!eval) {
    component(m->root, TRAIN, name, cap);
    return;
  }
  component(m->root, EVAL, label, cap);
  snprintf(prefix, sizeof prefix, "%s%s/", EVAL, label);
  component(m->root, prefix, name, cap);
}

/* {"path", "group", "label", "name", "class", "states", "update_count", "attrs"} in this order;
   takes `states` in every case. */
static ks__jv *metric_json(norm *nm, const metric *m, ks__jv *states) {
  char label[KS_MAX_NAME + 1], name[KS_MAX_NAME + 1], key[KS_MAX_NAME + 32], path[KS_MAX_NAME + 1];
  int eval = starts(m->root, EVAL);
  ks_entry e;
  metric_names(m, eval, label, name, sizeof name);
  snprintf(key, sizeof key, "%s__class__", m->root);
  const ks_allocator *a = alloc_of(nm);
  int has_cls = m->pickled && !ks_statedict_get(nm->flat, key, &e) && e.kind == KS_VAL_STRING &&
                ks__utf8_valid((const uint8_t *)e.s, strlen(e.s));
  ks__jv *cls = has_cls ? ks__jv_str(a, e.s) : ks__jv_null(a);
  snprintf(key, sizeof key, "%s_update_count", m->root);
  int has_count = m->pickled && !ks_statedict_get(nm->flat, key, &e) && e.kind == KS_VAL_INT;
  snprintf(path, sizeof path, "%.*s", (int)m->len - 1, m->root);
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

static ks_status emit_metric(norm *nm, metric *m) {
  const ks_allocator *a = alloc_of(nm);
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
  for (size_t i = 0; m->pickled && !st && i < names->len; i++) st = emit_state(nm, m, ks__jv_string(names->items[i]));
  if (!st && m->pickled) st = emit_computed(nm, m);
  if (!st) st = ks__jv_push(a, nm->list, info) ? nomem(nm->err) : KS_OK;
  else ks__jv_free(a, info);
  m->emitted = 1;
  return st;
}

static ks_status run(norm *nm) {
  ks_status st = collect(nm);
  ks_entry e;
  for (size_t i = 0; !st && ks_statedict_at(nm->flat, i, &e) == KS_OK; i++) {
    size_t len = root_len(e.name);
    metric *m = len ? find_metric(nm, e.name, len) : NULL;
    if (m && !m->emitted) st = emit_metric(nm, m);
    if (!st && (!m || !m->pickled)) st = put(nm, e.name, &e, nm->take);
  }
  return st;
}

static ks_status finish_json(norm *nm, const char *layout, char **out) {
  const ks_allocator *a = alloc_of(nm);
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

ks_status ks_composer_normalize(const ks_statedict *flat, ks_take take, ks_statedict **out, char **metrics_json,
                                ks_error *err) {
  if (!flat || !out || (take != KS_COPY && take != KS_BORROW)) return ks__err(err, KS_E_INVALID, "composer: bad argument");
  const ks_allocator *a = ks_statedict_allocator(flat);
  norm nm = {flat, NULL, take, err, NULL, 0, 0, ks__jv_array(a)};
  ks_status st = nm.list ? ks_statedict_create(a, &nm.out) : KS_E_NOMEM;
  if (st) st = nomem(err);
  if (!st) st = run(&nm);
  char *json = NULL;
  if (!st && metrics_json) st = finish_json(&nm, layout_of(&nm), &json);
  ks__jv_free(a, nm.list);
  ks__free(a, nm.m);
  if (st) {
    ks_statedict_free(nm.out);
    return st;
  }
  if (metrics_json) *metrics_json = json;
  *out = nm.out;
  return KS_OK;
}
