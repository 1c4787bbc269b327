/*
 * Composer checkpoints: maps both metric layouts onto
 *   <root>state_dict/<state>  and  <root>_computed
 * where <root> is state/train_metrics/<Name>/ or state/eval_metrics/<label>/<Name>/.
 * Composer >= 0.14 already writes that layout. Composer <= 0.13.5 pickled the
 * whole torchmetrics object; flattening leaves its attributes under <root>, and
 * its state names are the keys of its `_persistent` and `_defaults` attributes.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

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
  json_t *list;
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
    if (nm->n == nm->cap) {
      size_t ncap = nm->cap ? nm->cap * 2 : 8;
      metric *m = ks__realloc(a, nm->m, ncap * sizeof *m);
      if (!m) return nomem(nm->err);
      nm->m = m;
      nm->cap = ncap;
    }
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
  ks_status st;
  switch (e->kind) {
    case KS_VAL_TENSOR: st = ks_statedict_set_tensor(nm->out, name, &e->tensor, take); break;
    case KS_VAL_INT: st = ks_statedict_set_int(nm->out, name, e->i); break;
    case KS_VAL_FLOAT: st = ks_statedict_set_float(nm->out, name, e->f); break;
    case KS_VAL_BOOL: st = ks_statedict_set_bool(nm->out, name, (int)e->i); break;
    case KS_VAL_STRING: st = ks_statedict_set_string(nm->out, name, e->s); break;
    default: st = ks_statedict_set_null(nm->out, name); break;
  }
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

static int json_has(json_t *arr, const char *s) {
  size_t i;
  json_t *v;
  json_array_foreach(arr, i, v) if (!strcmp(json_string_value(v), s)) return 1;
  return 0;
}

/* State names: keys under <root>_persistent/ and <root>_defaults/ (pickled) or <root>state_dict/. */
static ks_status state_names(norm *nm, const metric *m, json_t *names) {
  char p1[KS_MAX_NAME + 32], p2[KS_MAX_NAME + 32], buf[KS_MAX_NAME + 1];
  snprintf(p1, sizeof p1, "%s%s", m->root, m->pickled ? "_persistent/" : "state_dict/");
  snprintf(p2, sizeof p2, "%s%s", m->root, m->pickled ? "_defaults/" : "state_dict/");
  ks_entry e;
  for (size_t i = 0; ks_statedict_at(nm->flat, i, &e) == KS_OK; i++) {
    if (!component(e.name, p1, buf, sizeof buf) && !component(e.name, p2, buf, sizeof buf)) continue;
    if (json_has(names, buf)) continue;
    if (json_array_append_new(names, json_string(buf))) return nomem(nm->err);
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

static json_t *scalar_json(const ks_entry *e) {
  switch (e->kind) {
    case KS_VAL_INT: return json_integer(e->i);
    case KS_VAL_FLOAT: return json_real(e->f);
    case KS_VAL_BOOL: return json_boolean(e->i);
    case KS_VAL_STRING: return json_string(e->s);
    case KS_VAL_NULL: return json_null();
    default: return NULL;
  }
}

/* Public scalar attributes of a pickled metric: its constructor arguments in practice. */
static ks_status attrs_json(norm *nm, const metric *m, json_t *attrs) {
  ks_entry e;
  for (size_t i = 0; ks_statedict_at(nm->flat, i, &e) == KS_OK; i++) {
    if (strncmp(e.name, m->root, m->len) || strchr(e.name + m->len, '/')) continue;
    const char *attr = e.name + m->len;
    json_t *v = module_attr(attr) ? NULL : scalar_json(&e);
    if (v && json_object_set_new(attrs, attr, v)) return nomem(nm->err);
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

static json_t *metric_json(norm *nm, const metric *m, json_t *states) {
  char label[KS_MAX_NAME + 1], name[KS_MAX_NAME + 1], key[KS_MAX_NAME + 32], path[KS_MAX_NAME + 1];
  int eval = starts(m->root, EVAL);
  ks_entry e;
  metric_names(m, eval, label, name, sizeof name);
  snprintf(key, sizeof key, "%s__class__", m->root);
  json_t *cls = m->pickled && !ks_statedict_get(nm->flat, key, &e) ? json_string(e.s) : json_null();
  snprintf(key, sizeof key, "%s_update_count", m->root);
  int has_count = m->pickled && !ks_statedict_get(nm->flat, key, &e) && e.kind == KS_VAL_INT;
  snprintf(path, sizeof path, "%.*s", (int)m->len - 1, m->root);
  return json_pack("{s:s, s:s, s:o, s:s, s:o, s:O, s:o, s:o}", "path", path, "group", eval ? "eval" : "train",
                   "label", eval ? json_string(label) : json_null(), "name", name, "class", cls, "states", states,
                   "update_count", has_count ? json_integer(e.i) : json_null(), "attrs", json_object());
}

static ks_status emit_metric(norm *nm, metric *m) {
  json_t *states = json_array();
  if (!states) return nomem(nm->err);
  ks_status st = state_names(nm, m, states);
  json_t *info = st ? NULL : metric_json(nm, m, states);
  json_decref(states);
  if (!st && !info) return nomem(nm->err);
  if (!st && m->pickled) st = attrs_json(nm, m, json_object_get(info, "attrs"));
  size_t i;
  json_t *v;
  if (m->pickled) json_array_foreach(json_object_get(info, "states"), i, v) if (!st) st = emit_state(nm, m, json_string_value(v));
  if (!st && m->pickled) st = emit_computed(nm, m);
  if (!st && json_array_append_new(nm->list, info)) st = nomem(nm->err);
  else if (st) json_decref(info);
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
  json_t *doc = json_pack("{s:s, s:O}", "layout", layout, "metrics", nm->list);
  char *s = doc ? json_dumps(doc, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
  json_decref(doc);
  if (!s) return nomem(nm->err);
  *out = ks__strdup(ks_statedict_allocator(nm->flat), s);
  free(s);
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
  norm nm = {flat, NULL, take, err, NULL, 0, 0, json_array()};
  const ks_allocator *a = ks_statedict_allocator(flat);
  ks_status st = nm.list ? ks_statedict_create(a, &nm.out) : KS_E_NOMEM;
  if (st) st = nomem(err);
  if (!st) st = run(&nm);
  char *json = NULL;
  if (!st && metrics_json) st = finish_json(&nm, layout_of(&nm), &json);
  json_decref(nm.list);
  ks__free(a, nm.m);
  if (st) {
    ks_statedict_free(nm.out);
    return st;
  }
  if (metrics_json) *metrics_json = json;
  *out = nm.out;
  return KS_OK;
}
