/*
 * Updates of the curve metrics (BinaryAUROC, BinaryAveragePrecision,
 * MulticlassAUROC). Exact mode keeps every (pred, target) in cat states;
 * binned mode (thresholds=T) counts a (T, [C,] 2, 2) confusion matrix of
 * pred >= threshold. Preds outside [0,1] (ignored targets left out) are logits:
 * sigmoid for binary, softmax over classes for multiclass.
 */
#include <math.h>
#include <string.h>

#include "metrics/classify.h"
#include "metrics/families.h"

static KS_NODISCARD ks_status declare_curve(ks_metric *m, int64_t C, ks_error *err) {
  const ks__margs *a = &m->args;
  if (a->n_thr) {
    int64_t shape[4] = {a->n_thr, C, 2, 2};
    if (C == 1) return ks__state_declare(m, "confmat", KS_REDUCE_SUM, KS_I64, 3, (int64_t[]){a->n_thr, 2, 2}, 0.0, err);
    return ks__state_declare(m, "confmat", KS_REDUCE_SUM, KS_I64, 4, shape, 0.0, err);
  }
  int64_t pshape[2] = {0, C}, zero = 0;
  ks_status st = ks__state_declare(m, "preds", KS_REDUCE_CAT, KS_F32, C == 1 ? 1 : 2, pshape, 0.0, err);
  return st ? st : ks__state_declare(m, "target", KS_REDUCE_CAT, KS_I64, 1, &zero, 0.0, err);
}

ks_status ks__binary_curve_declare(ks_metric *m, ks_error *err) {
  m->task = KS__TASK_BINARY;
  return declare_curve(m, 1, err);
}

ks_status ks__multiclass_curve_declare(ks_metric *m, ks_error *err) {
  m->task = KS__TASK_MULTICLASS;
  return declare_curve(m, m->args.num_classes, err);
}

/* Number of thresholds <= v (sorted thresholds): v >= thr[t] exactly for t below it. */
static size_t thr_rank(const float *thr, size_t T, float v) {
  size_t lo = 0, hi = T;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (v >= thr[mid]) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* Scratch for one binned batch: per (class, target) a histogram over threshold ranks. */
typedef struct binned {
  int64_t *h;
  size_t T, C;
} binned;

/* linspace(0, 1, T): start from v * (T-1) and step to the exact rank (at most a step or two). */
static size_t thr_rank_linspace(const float *thr, size_t T, float v) {
  if (!(v >= 0.0f)) return 0; /* negative or NaN: below every threshold */
  if (v >= 1.0f) return T;
  size_t k = (size_t)(v * (float)(T - 1));
  while (k < T && v >= thr[k]) k++;
  while (k > 0 && v < thr[k - 1]) k--;
  return k;
}

static void binned_add(const ks_metric *m, binned *b, size_t c, int y, float v) {
  const float *thr = m->args.thr;
  int64_t *row = b->h + (c * 2 + (size_t)y) * (b->T + 1);
  if (!m->args.thr_list) {
    row[thr_rank_linspace(thr, b->T, v)]++;
    return;
  }
  if (m->args.thr_sorted) {
    row[thr_rank(thr, b->T, v)]++;
    return;
  }
  for (size_t t = 0; t < b->T; t++) row[t] += v >= thr[t]; /* unsorted: direct counts per threshold */
  row[b->T]++;
}

static void binned_commit(ks_metric *m, const binned *b) {
  int64_t *cm = ks__i64(&m->st[0]);
  for (size_t c = 0; c < b->C; c++)
    for (int y = 0; y < 2; y++) {
      const int64_t *row = b->h + (c * 2 + (size_t)y) * (b->T + 1);
      int64_t total = 0, above = 0;
      for (size_t k = 0; k <= b->T; k++) total += m->args.thr_sorted ? row[k] : 0;
      if (!m->args.thr_sorted) total = row[b->T];
      for (size_t t = b->T; t-- > 0;) {
        above = m->args.thr_sorted ? above + row[t + 1] : row[t];
        int64_t *cell = cm + (t * b->C + c) * 4 + (size_t)y * 2;
        cell[1] += above;
        cell[0] += total - above;
      }
    }
}

static KS_NODISCARD ks_status binned_init(const ks_metric *m, binned *b, size_t C, ks_error *err) {
  b->T = (size_t)m->args.n_thr;
  b->C = C;
  b->h = ks__calloc(&m->alloc, C * 2 * (b->T + 1), sizeof *b->h);
  return b->h ? KS_OK : ks__err(err, KS_E_NOMEM, "out of memory for binned counts");
}

static KS_NODISCARD ks_status check_pair(const ks_metric *m, const ks_tensor *in, size_t n, ks_error *err) {
  ks_status st = ks__check_pair(m, in, n, err);
  if (!st && !ks_dtype_is_float(in[0].dtype))
    st = ks__err(err, KS_E_DTYPE, "%s needs float preds (probabilities or logits), got %s", m->cls->name,
                 ks_dtype_name(in[0].dtype));
  return st;
}

static size_t count_valid(const ks_metric *m, const int64_t *t, size_t n) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++) k += !ks__is_ignored(m, t[i]);
  return k;
}

/* ---- binary ---- */

static KS_NODISCARD ks_status binary_apply(ks_metric *m, const ks__bpreds *bp, const int64_t *t, size_t n,
                                           ks_error *err) {
  const float *p = bp->v.p;
  if (m->args.n_thr) {
    binned b;
    ks_status st = binned_init(m, &b, 1, err);
    if (st) return st;
    for (size_t i = 0; i < n; i++)
      if (!ks__is_ignored(m, t[i])) binned_add(m, &b, 0, t[i] == 1, bp->sig ? ks__sigmoidf(p[i]) : p[i]);
    binned_commit(m, &b);
    ks__free(&m->alloc, b.h);
    return KS_OK;
  }
  size_t k = count_valid(m, t, n);
  ks_status st = ks__cat_reserve(m, &m->st[0], k, err);
  if (!st) st = ks__cat_reserve(m, &m->st[1], k, err);
  if (st) return st;
  float *op = ks__cat_tail(&m->st[0]);
  int64_t *ot = ks__cat_tail(&m->st[1]);
  for (size_t i = 0, j = 0; i < n; i++) {
    if (ks__is_ignored(m, t[i])) continue;
    op[j] = bp->sig ? ks__sigmoidf(p[i]) : p[i];
    ot[j++] = t[i];
  }
  ks__cat_commit(&m->st[0], k);
  ks__cat_commit(&m->st[1], k);
  return KS_OK;
}

ks_status ks__binary_curve_update(ks_metric *m, const ks_tensor *in, size_t n, ks_error *err) {
  ks__view t = {0};
  ks__bpreds bp = {0};
  ks_status st = check_pair(m, in, n, err);
  if (!st) st = ks__binary_inputs(m, in, &t, &bp, err);
  if (!st) st = binary_apply(m, &bp, t.p, t.n, err);
  ks__bpreds_free(m, &bp);
  ks__view_free(m, &t);
  return st;
}

/* ---- multiclass ---- */

typedef struct mc_rows {
  const float *p;
  const int64_t *t;
  size_t n, C, P;
  int softmax;
} mc_rows;

/* Sample i's class scores, softmaxed when the batch holds logits. */
static void mc_row(const mc_rows *r, size_t i, float *out) {
  const float *base = r->p + (i / r->P) * r->C * r->P + i % r->P;
  for (size_t c = 0; c < r->C; c++) out[c] = base[c * r->P];
  if (!r->softmax) return;
  float mx = out[0];
  for (size_t c = 1; c < r->C; c++) mx = fmaxf(mx, out[c]);
  double z = 0;
  for (size_t c = 0; c < r->C; c++) z += exp((double)out[c] - (double)mx);
  for (size_t c = 0; c < r->C; c++) out[c] = (float)(exp((double)out[c] - (double)mx) / z);
}

static int mc_needs_softmax(const ks_metric *m, const mc_rows *r) {
  for (size_t i = 0; i < r->n; i++) {
    if (ks__is_ignored(m, r->t[i])) continue;
    const float *base = r->p + (i / r->P) * r->C * r->P + i % r->P;
    for (size_t c = 0; c < r->C; c++)
      if (!(base[c * r->P] >= 0.0f && base[c * r->P] <= 1.0f)) return 1;
  }
  return 0;
}

static KS_NODISCARD ks_status mc_binned(ks_metric *m, const mc_rows *r, float *row, ks_error *err) {
  binned b;
  ks_status st = binned_init(m, &b, r->C, err);
  if (st) return st;
  for (size_t i = 0; i < r->n; i++) {
    if (ks__is_ignored(m, r->t[i])) continue;
    mc_row(r, i, row);
    for (size_t c = 0; c < r->C; c++) binned_add(m, &b, c, r->t[i] == (int64_t)c, row[c]);
  }
  binned_commit(m, &b);
  ks__free(&m->alloc, b.h);
  return KS_OK;
}

static KS_NODISCARD ks_status mc_exact(ks_metric *m, const mc_rows *r, ks_error *err) {
  size_t k = count_valid(m, r->t, r->n);
  ks_status st = ks__cat_reserve(m, &m->st[0], k, err);
  if (!st) st = ks__cat_reserve(m, &m->st[1], k, err);
  if (st) return st;
  float *op = ks__cat_tail(&m->st[0]);
  int64_t *ot = ks__cat_tail(&m->st[1]);
  for (size_t i = 0, j = 0; i < r->n; i++) {
    if (ks__is_ignored(m, r->t[i])) continue;
    mc_row(r, i, op + j * r->C);
    ot[j++] = r->t[i];
  }
  ks__cat_commit(&m->st[0], k);
  ks__cat_commit(&m->st[1], k);
  return KS_OK;
}

ks_status ks__multiclass_curve_update(ks_metric *m, const ks_tensor *in, size_t n, ks_error *err) {
  ks__mcin lay;
  ks__view t = {0}, p = {0};
  ks_status st = check_pair(m, in, n, err);
  if (!st) st = ks__mc_layout(m, &in[0], &in[1], &lay, err);
  if (!st && !lay.logits) st = ks__err(err, KS_E_SHAPE, "MulticlassAUROC needs preds of shape (N, C, ...)");
  if (!st) st = ks__labels(m, &in[1], m->args.num_classes, m->args.has_ignore, m->args.ignore_index, "target", &t, err);
  if (!st) st = ks__view_as(m, &in[0], KS_F32, &p, err);
  float *row = NULL;
  if (!st && !(row = ks__malloc(&m->alloc, (size_t)m->args.num_classes * sizeof *row)))
    st = ks__err(err, KS_E_NOMEM, "out of memory for a row");
  if (!st) {
    mc_rows r = {p.p, t.p, lay.n, (size_t)m->args.num_classes, lay.P, 0};
    r.softmax = mc_needs_softmax(m, &r);
    st = m->args.n_thr ? mc_binned(m, &r, row, err) : mc_exact(m, &r, err);
  }
  ks__free(&m->alloc, row);
  ks__view_free(m, &p);
  ks__view_free(m, &t);
  return st;
}
