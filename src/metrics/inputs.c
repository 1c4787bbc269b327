/* Reading and validating update() inputs. */
#include <math.h>
#include <stdio.h>

#include "metrics/inputs.h"

ks_status ks__need_inputs(const ks_metric *m, size_t n, size_t lo, size_t hi, ks_error *err) {
  if (n >= lo && n <= hi) return KS_OK;
  if (lo == hi)
    return ks__err(err, KS_E_INVALID, "%s.update: expected %zu inputs, got %zu", m->cls->name, lo, n);
  return ks__err(err, KS_E_INVALID, "%s.update: expected %zu to %zu inputs, got %zu", m->cls->name, lo, hi,
                 n);
}

ks_status ks__check_pair(const ks_metric *m, const ks_tensor *in, size_t n, ks_error *err) {
  ks_status st = ks__need_inputs(m, n, 2, 2, err);
  if (!st) st = ks__check_input(&in[0], "preds", err);
  if (!st) st = ks__check_input(&in[1], "target", err);
  return st;
}

ks_status ks__check_input(const ks_tensor *t, const char *what, ks_error *err) {
  if (!t) return ks__err(err, KS_E_INVALID, "%s: NULL tensor", what);
  size_t nbytes;
  ks_status st = ks_shape_size(t->dtype, t->rank, t->shape, NULL, &nbytes);
  if (st == KS_E_DTYPE) return ks__err(err, st, "%s: invalid dtype %d", what, (int)t->dtype);
  if (st) return ks__err(err, st, "%s: invalid shape (rank %d)", what, t->rank);
  if (t->nbytes != nbytes)
    return ks__err(err, KS_E_SHAPE, "%s: nbytes is %zu but the shape needs %zu", what, t->nbytes, nbytes);
  if (nbytes && !t->data) return ks__err(err, KS_E_INVALID, "%s: NULL data", what);
  return KS_OK;
}


size_t ks__numel(const ks_tensor *t) { return (size_t)ks_tensor_numel(t); }

ks_status ks__same_shape(const ks_tensor *a, const ks_tensor *b, const char *an, const char *bn,
                         ks_error *err) {
  if (ks_tensor_same_shape(a, b)) return KS_OK;
  char sa[128], sb[128];
  return ks__err(err, KS_E_SHAPE, "%s shape %s and %s shape %s differ", an,
                 ks_shape_format(a->rank, a->shape, sa, sizeof sa), bn,
                 ks_shape_format(b->rank, b->shape, sb, sizeof sb));
}

ks_status ks__view_as(const ks_metric *m, const ks_tensor *t, ks_dtype want, ks__view *v, ks_error *err) {
  v->n = ks__numel(t);
  v->owned = NULL;
  v->p = t->data;
  if (t->dtype == want) return KS_OK;
  size_t bytes;
  if (!ks__mul_size(v->n, ks_dtype_size(want), &bytes)) return ks__err(err, KS_E_LIMIT, "input too large");
  v->owned = ks__malloc(&m->alloc, bytes ? bytes : 1);
  if (!v->owned) return ks__err(err, KS_E_NOMEM, "out of memory converting an input to %s", ks_dtype_name(want));
  ks_status st = ks_dtype_convert(want, v->owned, t->dtype, t->data, v->n);
  if (st) {
    ks__free(&m->alloc, v->owned);
    v->owned = NULL;
    return ks__err(err, st, "cannot convert an input from %s to %s", ks_dtype_name(t->dtype), ks_dtype_name(want));
  }
  v->p = v->owned;
  return KS_OK;
}

void ks__view_free(const ks_metric *m, ks__view *v) {
  ks__free(&m->alloc, v->owned);
  v->owned = NULL;
}

static KS_NODISCARD ks_status bad_label(ks_error *err, const char *what, size_t i, double v, int64_t hi) {
  if (isnan(v)) return ks__err(err, KS_E_VALUE, "%s[%zu] is NaN where a label is expected", what, i);
  return ks__err(err, KS_E_VALUE, "%s[%zu] = %g is not a label in [0, %lld) nor ignore_index", what, i, v,
                 (long long)hi);
}

static int label_ok(int64_t x, int64_t hi, int has_ignore, int64_t ignore) {
  return (x >= 0 && x < hi) || (has_ignore && x == ignore);
}

/* Fast path: I64 labels are checked in place. */
static KS_NODISCARD ks_status check_i64(const int64_t *p, size_t n, int64_t hi, int has_ignore, int64_t ignore,
                           const char *what, ks_error *err) {
  for (size_t i = 0; i < n; i++)
    if (!label_ok(p[i], hi, has_ignore, ignore)) return bad_label(err, what, i, (double)p[i], hi);
  return KS_OK;
}

/* Floats carrying labels must be finite integers that fit in int64. */
static KS_NODISCARD ks_status float_labels(const ks_tensor *t, int64_t *out, size_t n, int64_t hi, int has_ignore,
                              int64_t ignore, const char *what, ks_error *err) {
  for (size_t i = 0; i < n; i++) {
    double d = ks_dtype_get_f64(t->dtype, t->data, i);
    if (!(d == floor(d)) || fabs(d) > 9.0e18) return bad_label(err, what, i, d, hi);
    out[i] = (int64_t)d;
    if (!label_ok(out[i], hi, has_ignore, ignore)) return bad_label(err, what, i, d, hi);
  }
  return KS_OK;
}

ks_status ks__labels(const ks_metric *m, const ks_tensor *t, int64_t hi, int has_ignore, int64_t ignore,
                     const char *what, ks__view *v, ks_error *err) {
  size_t n = ks__numel(t);
  if (t->dtype == KS_I64) {
    v->n = n;
    v->p = t->data;
    v->owned = NULL;
    return check_i64(t->data, n, hi, has_ignore, ignore, what, err);
  }
  ks_status st = ks__view_as(m, t, KS_I64, v, err);
  if (st) return st;
  if (ks_dtype_is_float(t->dtype))
    st = float_labels(t, v->owned, n, hi, has_ignore, ignore, what, err);
  else if (t->dtype == KS_U64) {
    for (size_t i = 0; i < n && !st; i++)
      if (ks_dtype_get_i64(KS_U64, t->data, i) < 0) st = bad_label(err, what, i, 1.9e19, hi);
    if (!st) st = check_i64(v->p, n, hi, has_ignore, ignore, what, err);
  } else
    st = check_i64(v->p, n, hi, has_ignore, ignore, what, err);
  if (st) ks__view_free(m, v);
  return st;
}

int ks__all_unit_f32(const float *p, size_t n) {
  int ok = 1;
  for (size_t i = 0; i < n; i++) ok &= (p[i] >= 0.0f) & (p[i] <= 1.0f);
  return ok;
}
