/*
 * The metric lifecycle: create from the registry, update with the cache
 * dropped, compute with caching, reset, clone, and the state primitives the
 * families use (declare, cat growth, results).
 */
#include <math.h>
#include <string.h>

#include "metrics/internal.h"

static void states_free(ks_metric *m) {
  for (size_t i = 0; i < m->n_states; i++) {
    ks__free(&m->alloc, m->st[i].data);
    m->st[i].data = NULL;
  }
}

static void computed_drop(ks_metric *m) {
  ks__free(&m->alloc, m->computed.data);
  memset(&m->computed, 0, sizeof m->computed);
  m->has_computed = 0;
}

void ks_metric_free(ks_metric *m) {
  if (!m) return;
  states_free(m);
  computed_drop(m);
  ks__described_free(m);
  ks__args_free(&m->alloc, &m->args);
  ks__free(&m->alloc, m->args_json);
  ks_allocator a = m->alloc;
  ks__free(&a, m);
}

ks_status ks_metric_create(const char *class_name, const char *args_json, const ks_allocator *alloc,
                           ks_metric **out, ks_error *err) {
  if (!class_name || !out) return ks__err(err, KS_E_INVALID, "ks_metric_create: NULL argument");
  const ks__class *cls = ks__class_find(class_name);
  if (!cls) return ks__wrapper_create(class_name, args_json, alloc, out, err);
  ks_metric *m = ks__calloc(alloc, 1, sizeof *m);
  if (!m) return ks__err(err, KS_E_NOMEM, "out of memory creating %s", class_name);
  m->alloc = *ks__alloc_or_default(alloc);
  m->cls = cls;
  m->st = m->st_inline;
  m->cap_states = KS__MAX_STATES;
  ks_status st = ks__args_parse(cls, args_json, &m->alloc, &m->args, err);
  if (!st && ks__args_canonical(cls, &m->args, &m->alloc, &m->args_json))
    st = ks__err(err, KS_E_NOMEM, "out of memory creating %s", class_name);
  if (!st) st = cls->declare(m, err);
  if (st) {
    ks_metric_free(m);
    return st;
  }
  *out = m;
  return KS_OK;
}

const char *ks_metric_class(const ks_metric *m) { return m->described ? m->described : m->cls->name; }
const char *ks_metric_args_json(const ks_metric *m) { return m->args_json; }
int64_t ks_metric_update_count(const ks_metric *m) { return m->update_count; }
size_t ks_metric_state_count(const ks_metric *m) { return m->n_states; }

ks_status ks_metric_update(ks_metric *m, const ks_tensor *inputs, size_t n_inputs, ks_error *err) {
  if (!m || (n_inputs && !inputs)) return ks__err(err, KS_E_INVALID, "ks_metric_update: NULL argument");
  ks_status st = m->cls->update(m, inputs, n_inputs, err);
  if (st) return st;
  computed_drop(m);
  if (!m->cls->wrapper) m->update_count++; /* a WrapperMetric's update is not counted: its base's is */
  return KS_OK;
}

ks_status ks_metric_compute(ks_metric *m, const ks_tensor **out, ks_error *err) {
  if (!m || !out) return ks__err(err, KS_E_INVALID, "ks_metric_compute: NULL argument");
  if (m->cls->wrapper) { /* torchmetrics caches no WrapperMetric result: each compute computes */
    ks_tensor t;
    memset(&t, 0, sizeof t);
    ks_status st = m->cls->compute(m, &t, err);
    if (st) return st;
    computed_drop(m);
    m->computed = t;
    *out = &m->computed;
    return KS_OK;
  }
  if (!m->has_computed) {
    ks_tensor t;
    memset(&t, 0, sizeof t);
    ks_status st = m->cls->compute(m, &t, err);
    if (st) return st;
    if (ks_tensor_numel(&t) == 1) t.rank = 0; /* torchmetrics squeezes one-element results */
    m->computed = t;
    m->has_computed = 1;
  }
  *out = &m->computed;
  return KS_OK;
}

static void state_fill_default(ks__state *s) {
  if (s->reduce == KS_REDUCE_CAT) {
    s->shape[0] = 0;
    s->nbytes = 0;
    if (s->row_dynamic) {
      s->row_known = 0;
      s->rank = 1;
    }
    return;
  }
  size_t n = s->nbytes / ks_dtype_size(s->dtype);
  for (size_t i = 0; i < n; i++) ks_dtype_set_f64(s->dtype, s->data, i, s->fill);
}

const ks_tensor *ks_metric_computed(const ks_metric *m) { return m->has_computed ? &m->computed : NULL; }

void ks_metric_reset(ks_metric *m) {
  if (!m) return;
  for (size_t i = 0; i < m->n_states; i++) state_fill_default(&m->st[i]);
  computed_drop(m);
  m->update_count = 0;
  if (!m->cls->wrapper) ks__attrs_unstage(m); /* torchmetrics' reset keeps a wrapper's min_val / max_val */
  for (size_t i = 0; i < m->n_inner; i++) ks_metric_reset(m->inner[i]);
}

ks_status ks_metric_state_info(const ks_metric *m, size_t i, const char **name, ks_reduce *reduce,
                               ks_tensor *current) {
  if (!m || i >= m->n_states) return KS_E_NOTFOUND;
  const ks__state *s = &m->st[i];
  if (name) *name = s->name;
  if (reduce) *reduce = s->reduce;
  if (current) {
    memset(current, 0, sizeof *current);
    current->dtype = s->dtype;
    current->rank = s->rank;
    memcpy(current->shape, s->shape, sizeof s->shape);
    current->data = s->data;
    current->nbytes = s->nbytes;
    current->ownership = KS_BORROWED;
  }
  return KS_OK;
}

/* ---- states ---- */

size_t ks__state_row_bytes(const ks__state *s) {
  size_t n = ks_dtype_size(s->dtype);
  for (int i = 1; i < s->rank; i++) n *= (size_t)s->shape[i];
  return n;
}


ks_status ks__state_declare(ks_metric *m, const char *name, ks_reduce reduce, ks_dtype dtype, int rank,
                            const int64_t *shape, double fill, ks_error *err) {
  if (m->n_states >= m->cap_states) return ks__err(err, KS_E_LIMIT, "too many states (at most %zu)", m->cap_states);
  ks__state *s = &m->st[m->n_states];
  memset(s, 0, sizeof *s);
  s->name = name;
  s->reduce = reduce;
  s->dtype = dtype;
  s->rank = rank;
  s->fill = fill;
  for (int i = 0; i < rank; i++) s->shape[i] = shape[i];
  size_t nbytes;
  ks_status st = ks_shape_size(dtype, rank, s->shape, NULL, &nbytes);
  if (st) return ks__err(err, st, "state '%s' is too large", name);
  if (reduce != KS_REDUCE_CAT) {
    s->data = ks__malloc(&m->alloc, nbytes ? nbytes : 1);
    if (!s->data) return ks__err(err, KS_E_NOMEM, "out of memory for state '%s'", name);
    s->nbytes = nbytes;
  }
  m->n_states++;
  state_fill_default(s);
  return KS_OK;
}

ks__state *ks__state_last(ks_metric *m) { return &m->st[m->n_states - 1]; }

ks_status ks__cat_reserve(const ks_metric *m, ks__state *s, uint64_t rows, ks_error *err) {
  uint64_t add, need;
  if (!ks__mul_u64(rows, ks__state_row_bytes(s), &add) || !ks__add_u64(add, s->nbytes, &need) ||
      need > SIZE_MAX / 2)
    return ks__err(err, KS_E_LIMIT, "state '%s' would exceed the address space", s->name);
  if (ks__grow(&m->alloc, &s->data, &s->cap, (size_t)need, 1))
    return ks__err(err, KS_E_NOMEM, "out of memory growing state '%s'", s->name);
  return KS_OK;
}

void *ks__cat_tail(ks__state *s) { return (char *)s->data + s->nbytes; }

void ks__cat_commit(ks__state *s, uint64_t rows) {
  s->shape[0] += (int64_t)rows;
  s->nbytes += (size_t)rows * ks__state_row_bytes(s);
}

/* ---- results ---- */

ks_status ks__result(const ks_metric *m, ks_tensor *out, ks_dtype dtype, int rank, const int64_t *shape,
                     ks_error *err) {
  size_t nbytes;
  ks_status st = ks_shape_size(dtype, rank, shape, NULL, &nbytes);
  if (st) return ks__err(err, st, "result too large");
  void *p = ks__calloc(&m->alloc, 1, nbytes ? nbytes : 1);
  if (!p) return ks__err(err, KS_E_NOMEM, "out of memory for the result");
  if ((st = ks_tensor_init(out, dtype, rank, shape, p))) {
    ks__free(&m->alloc, p);
    return ks__err(err, st, "bad result shape (rank %d)", rank);
  }
  out->ownership = KS_OWNED;
  return KS_OK;
}

ks_status ks__result_f32(const ks_metric *m, ks_tensor *out, double v, ks_error *err) {
  ks_status st = ks__result(m, out, KS_F32, 0, NULL, err);
  if (!st) *(float *)out->data = (float)v;
  return st;
}
