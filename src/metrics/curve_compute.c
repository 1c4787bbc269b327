/*
 * ROC / precision-recall curves and their areas, as torchmetrics:
 * exact curves sort the scores descending and take one point per distinct
 * score (starting the ROC at (0,0)); binned curves read the (T,[C,]2,2)
 * confusion matrices. Rates are float32 like torch's; the areas are summed in
 * double.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "metrics/families.h"

typedef struct scored {
  float p;
  int32_t y;
} scored;

/* Descending, NaN first (torch sorts NaN as the largest value). */
static int by_score_desc(const void *a, const void *b) {
  float x = ((const scored *)a)->p, y = ((const scored *)b)->p;
  if (x != x) return (y != y) ? 0 : -1;
  if (y != y) return 1;
  return (x < y) - (x > y);
}

/* One point per distinct score: cumulative true and false positives. */
typedef struct curve {
  int64_t *tps, *fps;
  size_t k;
} curve;

static void clf_curve(scored *s, size_t n, curve *c) {
  qsort(s, n, sizeof *s, by_score_desc);
  int64_t tp = 0;
  c->k = 0;
  for (size_t i = 0; i < n; i++) {
    tp += s[i].y;
    if (i + 1 < n && (s[i + 1].p - s[i].p) == 0.0f) continue;
    c->tps[c->k] = tp;
    c->fps[c->k] = 1 + (int64_t)i - tp;
    c->k++;
  }
}

static double trapz(const float *x, const float *y, size_t n) {
  double a = 0;
  for (size_t i = 1; i < n; i++) a += ((double)x[i] - (double)x[i - 1]) * ((double)y[i] + (double)y[i - 1]);
  return a / 2;
}

static float rate(int64_t a, int64_t b) { return b != 0 ? (float)a / (float)b : 0.0f; }

/* Scratch big enough for one exact curve of n samples. */
typedef struct work {
  scored *s;
  curve c;
  float *x, *y;
} work;

static KS_NODISCARD ks_status work_init(const ks_metric *m, work *w, size_t n, ks_error *err) {
  memset(w, 0, sizeof *w);
  size_t k = n + 1;
  w->s = ks__malloc(&m->alloc, k * sizeof *w->s);
  w->c.tps = ks__malloc(&m->alloc, k * sizeof(int64_t));
  w->c.fps = ks__malloc(&m->alloc, k * sizeof(int64_t));
  w->x = ks__malloc(&m->alloc, k * sizeof(float));
  w->y = ks__malloc(&m->alloc, k * sizeof(float));
  if (w->s && w->c.tps && w->c.fps && w->x && w->y) return KS_OK;
  return ks__err(err, KS_E_NOMEM, "out of memory computing %s", m->cls->name);
}

static void work_free(const ks_metric *m, work *w) {
  ks__free(&m->alloc, w->s);
  ks__free(&m->alloc, w->c.tps);
  ks__free(&m->alloc, w->c.fps);
  ks__free(&m->alloc, w->x);
  ks__free(&m->alloc, w->y);
}

/* ROC area of the loaded scores (w->s) against positives. */
static double exact_auroc(work *w, size_t n) {
  clf_curve(w->s, n, &w->c);
  int64_t tlast = w->c.tps[w->c.k - 1], flast = w->c.fps[w->c.k - 1];
  w->x[0] = w->y[0] = 0.0f;
  for (size_t i = 0; i < w->c.k; i++) {
    w->x[i + 1] = flast > 0 ? (float)w->c.fps[i] / (float)flast : 0.0f;
    w->y[i + 1] = tlast > 0 ? (float)w->c.tps[i] / (float)tlast : 0.0f;
  }
  return trapz(w->x, w->y, w->c.k + 1);
}

static double exact_ap(work *w, size_t n) {
  clf_curve(w->s, n, &w->c);
  size_t k = w->c.k;
  float tlast = (float)w->c.tps[k - 1];
  /* torchmetrics reverses the curve, appends (recall 0, precision 1) and takes
     -sum (R[j+1]-R[j]) P[j]; in curve order that is sum (r_i - r_{i-1}) p_i, r_{-1} = 0.
     Without positive targets torchmetrics warns and sets every recall to 1; every
     precision is then 0, so the area is (-)0, not 0/0. */
  double ap = 0, r_next = 0;
  for (size_t i = 0; i < k; i++) {
    float r = tlast > 0 ? (float)w->c.tps[i] / tlast : 1.0f;
    float p = (float)w->c.tps[i] / (float)(w->c.tps[i] + w->c.fps[i]);
    ap += ((double)r - r_next) * (double)p;
    r_next = (double)r;
  }
  return ap;
}

static KS_NODISCARD ks_status need_samples(const ks_metric *m, ks_error *err) {
  if (m->st[1].shape[0] > 0) return KS_OK;
  return ks__err(err, KS_E_STATE, "%s: no samples to compute from (update first)", m->cls->name);
}

static void load_binary(const ks_metric *m, work *w, size_t n) {
  const float *p = m->st[0].data;
  const int64_t *t = m->st[1].data;
  for (size_t i = 0; i < n; i++) {
    w->s[i].p = p[i];
    w->s[i].y = t[i] == 1;
  }
}

/* Binned ROC area of class c from a (T, C, 2, 2) confusion matrix (C = 1 for binary). */
static double binned_auroc(const int64_t *cm, size_t T, size_t C, size_t c, float *x, float *y) {
  for (size_t t = 0; t < T; t++) {
    const int64_t *q = cm + (t * C + c) * 4; /* [y][p] */
    x[T - 1 - t] = rate(q[1], q[1] + q[0]);
    y[T - 1 - t] = rate(q[3], q[3] + q[2]);
  }
  return trapz(x, y, T);
}

/*
 * Binned AP in the order the thresholds were given (torchmetrics does not sort
 * a list): precision and recall are 0/0 = NaN where nothing is predicted
 * positive / nothing is positive, and NaN counts as 0 in the sum (1.9); 1.4's
 * _safe_divide gave 0 directly, the same sum.
 */
static double binned_ap(const int64_t *cm, size_t T) {
  double ap = 0;
  for (size_t t = 0; t < T; t++) {
    const int64_t *q = cm + t * 4;
    float prec = rate(q[3], q[3] + q[1]);
    float rec = rate(q[3], q[3] + q[2]);
    float rnext = 0.0f;
    if (t + 1 < T) rnext = rate(cm[(t + 1) * 4 + 3], cm[(t + 1) * 4 + 3] + cm[(t + 1) * 4 + 2]);
    ap -= ((double)rnext - (double)rec) * (double)prec;
  }
  return ap;
}

static KS_NODISCARD ks_status binary_curve(ks_metric *m, int ap, ks_tensor *out, ks_error *err) {
  size_t T = (size_t)m->args.n_thr;
  if (T) {
    if (ap) return ks__result_f32(m, out, binned_ap(m->st[0].data, T), err);
    float *xy = ks__malloc(&m->alloc, 2 * T * sizeof *xy);
    if (!xy) return ks__err(err, KS_E_NOMEM, "out of memory computing %s", m->cls->name);
    double a = binned_auroc(m->st[0].data, T, 1, 0, xy, xy + T);
    ks__free(&m->alloc, xy);
    return ks__result_f32(m, out, a, err);
  }
  ks_status st = need_samples(m, err);
  if (st) return st;
  size_t n = (size_t)m->st[1].shape[0];
  work w;
  if (!(st = work_init(m, &w, n, err))) {
    load_binary(m, &w, n);
    double v = ap ? exact_ap(&w, n) : exact_auroc(&w, n);
    st = ks__result_f32(m, out, v, err);
  }
  work_free(m, &w);
  return st;
}

ks_status ks__binary_auroc_compute(ks_metric *m, ks_tensor *out, ks_error *err) {
  return binary_curve(m, 0, out, err);
}

ks_status ks__binary_ap_compute(ks_metric *m, ks_tensor *out, ks_error *err) { return binary_curve(m, 1, out, err); }

/* ---- multiclass one-vs-rest ---- */

/* Per-class areas and support (number of samples of the class). */
static KS_NODISCARD ks_status mc_areas(ks_metric *m, double *auc, double *support, ks_error *err) {
  size_t C = (size_t)m->args.num_classes, T = (size_t)m->args.n_thr;
  if (T) {
    const int64_t *cm = m->st[0].data;
    float *xy = ks__malloc(&m->alloc, 2 * T * sizeof *xy);
    if (!xy) return ks__err(err, KS_E_NOMEM, "out of memory computing %s", m->cls->name);
    for (size_t c = 0; c < C; c++) {
      auc[c] = binned_auroc(cm, T, C, c, xy, xy + T);
      support[c] = (double)(cm[c * 4 + 2] + cm[c * 4 + 3]);
    }
    ks__free(&m->alloc, xy);
    return KS_OK;
  }
  ks_status st = need_samples(m, err);
  if (st) return st;
  size_t n = (size_t)m->st[1].shape[0];
  const float *p = m->st[0].data;
  const int64_t *t = m->st[1].data;
  work w;
  if (!(st = work_init(m, &w, n, err)))
    for (size_t c = 0; c < C; c++) {
      support[c] = 0;
      for (size_t i = 0; i < n; i++) {
        w.s[i].p = p[i * C + c];
        w.s[i].y = t[i] == (int64_t)c;
        support[c] += w.s[i].y;
      }
      auc[c] = exact_auroc(&w, n);
    }
  work_free(m, &w);
  return st;
}

static KS_NODISCARD ks_status mc_reduce(ks_metric *m, const double *auc, const double *support, ks_tensor *out,
                                        ks_error *err) {
  int64_t C = m->args.num_classes;
  if (m->args.average == KS__AVG_NONE) {
    ks_status st = ks__result(m, out, KS_F32, 1, &C, err);
    for (int64_t c = 0; !st && c < C; c++) ((float *)out->data)[c] = (float)auc[c];
    return st;
  }
  double num = 0, den = 0, wsum = 0, cnt = 0;
  for (int64_t c = 0; c < C; c++)
    if (!isnan(auc[c])) {
      num += auc[c];
      cnt += 1;
      wsum += support[c];
    }
  if (m->args.average == KS__AVG_MACRO) return ks__result_f32(m, out, num / cnt, err);
  num = 0;
  for (int64_t c = 0; c < C; c++)
    if (!isnan(auc[c])) {
      den = wsum != 0 ? support[c] / wsum : 0;
      num += auc[c] * den;
    }
  return ks__result_f32(m, out, num, err);
}

ks_status ks__multiclass_auroc_compute(ks_metric *m, ks_tensor *out, ks_error *err) {
  size_t C = (size_t)m->args.num_classes;
  double *buf = ks__malloc(&m->alloc, 2 * C * sizeof *buf);
  if (!buf) return ks__err(err, KS_E_NOMEM, "out of memory computing %s", m->cls->name);
  ks_status st = mc_areas(m, buf, buf + C, err);
  if (!st) st = mc_reduce(m, buf, buf + C, out, err);
  ks__free(&m->alloc, buf);
  return st;
}
