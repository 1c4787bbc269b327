/*
 * Aggregation metrics: MeanMetric, SumMetric, MaxMetric, MinMetric, CatMetric.
 * As torchmetrics' BaseAggregator: NaN values (in value or weight) are dropped
 * with nan_strategy 'warn'/'ignore', refused with 'error', or replaced by a
 * number; values are cast to float32 before they are combined.
 */
#include <math.h>
#include <string.h>

#include "metrics/families.h"
#include "metrics/inputs.h"

typedef struct agg_acc {
  double sum_v, sum_vw, sum_w;
  float mx, mn;
  size_t kept;
  int dropped; /* some NaN was removed (CatMetric rows become 1-d) */
  int has_nan; /* a NaN was kept (nan_strategy 'disable'): max and min are NaN, as torch.max */
} agg_acc;

/* Strides that map a value index to its broadcast weight element. */
typedef struct bcast {
  int rank;
  int64_t shape[KS_MAX_RANK];
  int64_t wstride[KS_MAX_RANK];
} bcast;

static KS_NODISCARD ks_status bcast_init(const ks_tensor *v, const ks_tensor *w, bcast *b, ks_error *err) {
  memset(b, 0, sizeof *b);
  b->rank = v->rank;
  memcpy(b->shape, v->shape, sizeof b->shape);
  if (!w) return KS_OK;
  if (w->rank > v->rank) return ks__err(err, KS_E_SHAPE, "weight has more dimensions than value");
  int64_t stride = 1;
  for (int d = v->rank - 1; d >= 0; d--) {
    int wd = d - (v->rank - w->rank);
    if (wd < 0) continue;
    if (w->shape[wd] != 1 && w->shape[wd] != v->shape[d])
      return ks__err(err, KS_E_SHAPE, "weight dim %d (%lld) does not broadcast to value dim %d (%lld)", wd,
                     (long long)w->shape[wd], d, (long long)v->shape[d]);
    b->wstride[d] = w->shape[wd] == 1 ? 0 : stride;
    stride *= w->shape[wd];
  }
  return KS_OK;
}

/* Weight element index of value element i (row-major). */
static size_t bcast_index(const bcast *b, size_t i) {
  size_t wi = 0;
  for (int d = b->rank - 1; d >= 0 && i; d--) {
    size_t n = (size_t)b->shape[d];
    wi += (i % n) * (size_t)b->wstride[d];
    i /= n;
  }
  return wi;
}

/*
 * Applies the NaN policy to one (value, weight) pair; returns 0 to drop it, -1
 * for an error. A numeric nan_strategy replaces the value by the number and the
 * weight by 1 when either is NaN (torchmetrics >= 1.5; 1.4 set the weight to
 * the number too). 'disable' (torchmetrics 1.9) checks nothing: NaN flows into
 * the states, and, as torchmetrics 1.9 does, every weight becomes 1.
 */
static int nan_policy(const ks__margs *a, double *v, double *w) {
  if (a->nan_strategy == KS__NAN_DISABLE) {
    *w = 1.0;
    return 1;
  }
  if (!isnan(*v) && !isnan(*w)) return 1;
  if (a->nan_strategy == KS__NAN_ERROR) return -1;
  if (a->nan_strategy == KS__NAN_VALUE) {
    *v = a->nan_value;
    *w = 1.0;
    return 1;
  }
  return 0;
}

static KS_NODISCARD ks_status agg_scan(const ks_metric *m, const ks_tensor *val, const ks_tensor *wt, agg_acc *acc,
                          float *cat_out, ks_error *err) {
  bcast b;
  ks_status st = bcast_init(val, wt, &b, err);
  if (st) return st;
  size_t n = ks__numel(val);
  memset(acc, 0, sizeof *acc);
  acc->mx = -INFINITY;
  acc->mn = INFINITY;
  for (size_t i = 0; i < n; i++) {
    double v = ks_dtype_get_f64(val->dtype, val->data, i);
    double w = wt ? ks_dtype_get_f64(wt->dtype, wt->data, bcast_index(&b, i)) : 1.0;
    int keep = nan_policy(&m->args, &v, &w);
    if (keep < 0) return ks__err(err, KS_E_VALUE, "%s: value[%zu] is NaN (nan_strategy='error')", m->cls->name, i);
    if (!keep) {
      acc->dropped = 1;
      continue;
    }
    float fv = (float)v, fw = (float)w;
    acc->sum_v += (double)fv;
    acc->sum_vw += (double)(fv * fw);
    acc->sum_w += (double)fw;
    acc->has_nan |= fv != fv;
    acc->mx = fmaxf(acc->mx, fv);
    acc->mn = fminf(acc->mn, fv);
    if (cat_out) cat_out[acc->kept] = fv;
    acc->kept++;
  }
  return KS_OK;
}

static KS_NODISCARD ks_status agg_inputs(const ks_metric *m, const ks_tensor *in, size_t n, size_t max_in,
                                         ks_error *err) {
  ks_status st = ks__need_inputs(m, n, 1, max_in, err);
  for (size_t i = 0; !st && i < n; i++) st = ks__check_input(&in[i], i ? "weight" : "value", err);
  return st;
}

static KS_NODISCARD ks_status scalar_state(ks_metric *m, const char *name, const char *legacy, double fill,
                                           ks_error *err) {
  ks_status st = ks__state_declare(m, name, KS_REDUCE_SUM, KS_F32, 0, NULL, fill, err);
  if (!st) ks__state_last(m)->legacy_name = legacy;
  return st;
}

/* ---- MeanMetric ---- */

ks_status ks__mean_declare(ks_metric *m, ks_error *err) {
  ks_status st = scalar_state(m, "mean_value", "value", 0.0, err);
  return st ? st : scalar_state(m, "weight", NULL, 0.0, err);
}

ks_status ks__mean_update(ks_metric *m, const ks_tensor *in, size_t n, ks_error *err) {
  agg_acc acc;
  ks_status st = agg_inputs(m, in, n, 2, err);
  if (!st) st = agg_scan(m, &in[0], n > 1 ? &in[1] : NULL, &acc, NULL, err);
  if (st || !acc.kept) return st;
  *ks__f32(&m->st[0]) += (float)acc.sum_vw;
  *ks__f32(&m->st[1]) += (float)acc.sum_w;
  return KS_OK;
}

ks_status ks__mean_compute(ks_metric *m, ks_tensor *out, ks_error *err) {
  return ks__result_f32(m, out, (double)(*ks__f32(&m->st[0]) / *ks__f32(&m->st[1])), err);
}

/* ---- SumMetric / MaxMetric / MinMetric ---- */

ks_status ks__sum_declare(ks_metric *m, ks_error *err) { return scalar_state(m, "sum_value", "value", 0.0, err); }

ks_status ks__sum_update(ks_metric *m, const ks_tensor *in, size_t n, ks_error *err) {
  agg_acc acc;
  ks_status st = agg_inputs(m, in, n, 1, err);
  if (!st) st = agg_scan(m, &in[0], NULL, &acc, NULL, err);
  if (st || !acc.kept) return st;
  *ks__f32(&m->st[0]) += (float)acc.sum_v;
  return KS_OK;
}

static KS_NODISCARD ks_status scalar_result(ks_metric *m, ks_tensor *out, ks_error *err) {
  return ks__result_f32(m, out, (double)*ks__f32(&m->st[0]), err);
}

ks_status ks__sum_compute(ks_metric *m, ks_tensor *out, ks_error *err) { return scalar_result(m, out, err); }

ks_status ks__max_declare(ks_metric *m, ks_error *err) {
  ks_status st = ks__state_declare(m, "max_value", KS_REDUCE_MAX, KS_F32, 0, NULL, -INFINITY, err);
  if (!st) ks__state_last(m)->legacy_name = "value";
  return st;
}

/* MaxMetric and MinMetric: fold the batch's extreme into the one state. */
static KS_NODISCARD ks_status extreme_update(ks_metric *m, const ks_tensor *in, size_t n, int is_max, ks_error *err) {
  agg_acc acc;
  ks_status st = agg_inputs(m, in, n, 1, err);
  if (!st) st = agg_scan(m, &in[0], NULL, &acc, NULL, err);
  if (st || !acc.kept) return st;
  float *s = ks__f32(&m->st[0]);
  if (acc.has_nan || isnan(*s)) *s = NAN; /* torch.max / torch.min propagate NaN */
  else *s = is_max ? fmaxf(*s, acc.mx) : fminf(*s, acc.mn);
  return KS_OK;
}

ks_status ks__max_update(ks_metric *m, const ks_tensor *in, size_t n, ks_error *err) {
  return extreme_update(m, in, n, 1, err);
}

ks_status ks__max_compute(ks_metric *m, ks_tensor *out, ks_error *err) { return scalar_result(m, out, err); }

ks_status ks__min_declare(ks_metric *m, ks_error *err) {
  ks_status st = ks__state_declare(m, "min_value", KS_REDUCE_MIN, KS_F32, 0, NULL, INFINITY, err);
  if (!st) ks__state_last(m)->legacy_name = "value";
  return st;
}

ks_status ks__min_update(ks_metric *m, const ks_tensor *in, size_t n, ks_error *err) {
  return extreme_update(m, in, n, 0, err);
}

ks_status ks__min_compute(ks_metric *m, ks_tensor *out, ks_error *err) { return scalar_result(m, out, err); }

/* ---- CatMetric ---- */

ks_status ks__cat_declare(ks_metric *m, ks_error *err) {
  int64_t zero = 0;
  ks_status st = ks__state_declare(m, "value", KS_REDUCE_CAT, KS_F32, 1, &zero, 0.0, err);
  if (!st) ks__state_last(m)->row_dynamic = 1;
  return st;
}

/* Rows of this batch: value.shape[1:] (a 0-d value is one row; NaN removal flattens). */
static KS_NODISCARD ks_status cat_rows(ks__state *s, const ks_tensor *v, int flattened, int *rank, int64_t *shape,
                          ks_error *err) {
  *rank = (v->rank == 0 || flattened) ? 1 : v->rank;
  for (int i = 1; i < *rank; i++) shape[i] = v->shape[i];
  if (!s->row_known || s->shape[0] == 0) return KS_OK;
  int same = *rank == s->rank;
  for (int i = 1; same && i < *rank; i++) same = shape[i] == s->shape[i];
  return same ? KS_OK : ks__err(err, KS_E_SHAPE, "CatMetric: value rows differ in shape from earlier ones");
}

ks_status ks__cat_update(ks_metric *m, const ks_tensor *in, size_t n, ks_error *err) {
  ks__state *s = &m->st[0];
  agg_acc acc;
  ks_status st = agg_inputs(m, in, n, 1, err);
  if (!st) st = agg_scan(m, &in[0], NULL, &acc, NULL, err); /* validate and count first */
  if (st || !acc.kept) return st;
  int rank;
  int64_t shape[KS_MAX_RANK] = {0};
  if ((st = cat_rows(s, &in[0], acc.dropped, &rank, shape, err))) return st;
  size_t row = 1;
  for (int i = 1; i < rank; i++) row *= (size_t)shape[i];
  ks__state probe = *s; /* reserve with the batch's row shape */
  probe.rank = rank;
  for (int i = 1; i < rank; i++) probe.shape[i] = shape[i];
  if ((st = ks__cat_reserve(m, &probe, acc.kept / row, err))) return st;
  s->data = probe.data;
  s->cap = probe.cap;
  s->rank = rank;
  for (int i = 1; i < rank; i++) s->shape[i] = shape[i];
  s->row_known = 1;
  /* The first scan accepted these values; a failure here would be a bug, but never a silent one. */
  if ((st = agg_scan(m, &in[0], NULL, &acc, ks__cat_tail(s), err))) return st;
  ks__cat_commit(s, acc.kept / row);
  return KS_OK;
}

ks_status ks__cat_compute(ks_metric *m, ks_tensor *out, ks_error *err) {
  ks__state *s = &m->st[0];
  ks_status st = ks__result(m, out, KS_F32, s->rank, s->shape, err);
  if (!st && s->nbytes) memcpy(out->data, s->data, s->nbytes);
  return st;
}
