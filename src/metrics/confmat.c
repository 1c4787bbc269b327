/*
 * Confusion matrices (rows are targets, columns predictions) and the Jaccard
 * index computed from them. Ignored targets are dropped before anything else,
 * including the logit test of binary predictions.
 */
#include <math.h>
#include <string.h>

#include "metrics/classify.h"
#include "metrics/families.h"

ks_status ks__binary_confmat_declare(ks_metric *m, ks_error *err) {
  int64_t shape[2] = {2, 2};
  m->task = KS__TASK_BINARY;
  return ks__state_declare(m, "confmat", KS_REDUCE_SUM, KS_I64, 2, shape, 0.0, err);
}

ks_status ks__multiclass_confmat_declare(ks_metric *m, ks_error *err) {
  int64_t shape[2] = {m->args.num_classes, m->args.num_classes};
  m->task = KS__TASK_MULTICLASS;
  return ks__state_declare(m, "confmat", KS_REDUCE_SUM, KS_I64, 2, shape, 0.0, err);
}

static KS_NODISCARD ks_status check_pair(const ks_metric *m, const ks_tensor *in, size_t n, ks_error *err) {
  return ks__check_pair(m, in, n, err);
}

ks_status ks__binary_confmat_update(ks_metric *m, const ks_tensor *in, size_t n, ks_error *err) {
  ks__view t = {0};
  ks__bpreds bp = {0};
  ks_status st = check_pair(m, in, n, err);
  if (!st) st = ks__binary_inputs(m, in, &t, &bp, err);
  if (!st) {
    const int64_t *y = t.p;
    int64_t c[4] = {0, 0, 0, 0};
    for (size_t i = 0; i < t.n; i++)
      if (!ks__is_ignored(m, y[i])) c[y[i] * 2 + ks__bpred(&bp, i)]++;
    for (int k = 0; k < 4; k++) ks__i64(&m->st[0])[k] += c[k];
  }
  ks__bpreds_free(m, &bp);
  ks__view_free(m, &t);
  return st;
}

/* Predicted class of every sample (argmax for logits); labels are checked against C. */
static KS_NODISCARD ks_status mc_predictions(const ks_metric *m, const ks_tensor *preds, const ks__mcin *lay,
                                             const int64_t *t, int64_t *out, ks_error *err) {
  int64_t C = m->args.num_classes;
  if (lay->logits) {
    ks__view p = {0};
    ks_status st = ks__view_as(m, preds, KS_F32, &p, err);
    if (st) return st;
    const float *f = p.p;
    for (size_t i = 0; i < lay->n; i++)
      out[i] = (int64_t)ks__argmax_f32(f + (i / lay->P) * (size_t)C * lay->P + i % lay->P, (size_t)C, lay->P);
    ks__view_free(m, &p);
    return KS_OK;
  }
  ks__view p = {0};
  ks_status st = ks__labels(m, preds, C, m->args.has_ignore, m->args.ignore_index, "preds", &p, err);
  const int64_t *q = p.p;
  for (size_t i = 0; !st && i < lay->n; i++) {
    if (!ks__is_ignored(m, t[i]) && (q[i] < 0 || q[i] >= C))
      st = ks__err(err, KS_E_VALUE, "preds[%zu] = %lld is not a class in [0, %lld)", i, (long long)q[i], (long long)C);
    out[i] = q[i];
  }
  ks__view_free(m, &p);
  return st;
}

ks_status ks__multiclass_confmat_update(ks_metric *m, const ks_tensor *in, size_t n, ks_error *err) {
  ks__mcin lay;
  ks__view t = {0};
  ks_status st = check_pair(m, in, n, err);
  if (!st) st = ks__mc_layout(m, &in[0], &in[1], &lay, err);
  if (!st) st = ks__labels(m, &in[1], m->args.num_classes, m->args.has_ignore, m->args.ignore_index, "target", &t, err);
  if (st) return st;
  int64_t *pred = ks__malloc(&m->alloc, (lay.n ? lay.n : 1) * sizeof *pred);
  if (!pred) st = ks__err(err, KS_E_NOMEM, "out of memory for predictions");
  if (!st) st = mc_predictions(m, &in[0], &lay, t.p, pred, err);
  if (!st) {
    const int64_t *y = t.p;
    int64_t *cm = ks__i64(&m->st[0]), C = m->args.num_classes;
    for (size_t i = 0; i < lay.n; i++)
      if (!ks__is_ignored(m, y[i])) cm[y[i] * C + pred[i]]++;
  }
  ks__free(&m->alloc, pred);
  ks__view_free(m, &t);
  return st;
}

/* Divides by row sums (true), column sums (pred) or the total (all); NaN becomes 0. */
static void normalize(const int64_t *cm, int64_t C, int how, float *out) {
  double total = 0;
  for (int64_t i = 0; i < C * C; i++) total += (double)cm[i];
  for (int64_t r = 0; r < C; r++)
    for (int64_t c = 0; c < C; c++) {
      double d = total;
      if (how != KS__NORM_ALL) {
        d = 0;
        for (int64_t k = 0; k < C; k++) d += (double)(how == KS__NORM_TRUE ? cm[r * C + k] : cm[k * C + c]);
      }
      float v = (float)cm[r * C + c] / (float)d;
      out[r * C + c] = isnan(v) ? 0.0f : v;
    }
}

ks_status ks__confmat_compute(ks_metric *m, ks_tensor *out, ks_error *err) {
  ks__state *s = &m->st[0];
  int64_t C = s->shape[0];
  int norm = m->args.normalize != KS__NORM_NONE;
  ks_status st = ks__result(m, out, norm ? KS_F32 : KS_I64, 2, s->shape, err);
  if (st) return st;
  if (norm) normalize(s->data, C, m->args.normalize, out->data);
  else memcpy(out->data, s->data, s->nbytes);
  return KS_OK;
}

/* Jaccard: diag / (col sum + row sum - diag), averaged as torchmetrics' _jaccard_index_reduce. */
ks_status ks__jaccard_compute(ks_metric *m, ks_tensor *out, ks_error *err) {
  const int64_t *cm = m->st[0].data;
  int64_t C = m->args.num_classes;
  int ig = m->args.has_ignore && m->args.ignore_index >= 0 && m->args.ignore_index < C;
  int avg = m->args.average;
  float *jac = ks__calloc(&m->alloc, (size_t)C, sizeof *jac);
  if (!jac) return ks__err(err, KS_E_NOMEM, "out of memory computing Jaccard");
  double num_all = 0, den_all = 0, wsum = 0, acc = 0;
  for (int64_t c = 0; c < C; c++) {
    double row = 0, col = 0, d = (double)cm[c * C + c];
    for (int64_t k = 0; k < C; k++) {
      row += (double)cm[c * C + k];
      col += (double)cm[k * C + c];
    }
    double den = row + col - d;
    jac[c] = den != 0 ? (float)d / (float)den : 0.0f;
    num_all += d;
    den_all += (ig && c == m->args.ignore_index) ? 0 : den;
    double w = avg == KS__AVG_WEIGHTED ? row : ((ig && c == m->args.ignore_index) || row + col == 0) ? 0 : 1;
    wsum += w;
    acc += w * (double)jac[c];
  }
  ks_status st;
  if (avg == KS__AVG_NONE) {
    st = ks__result(m, out, KS_F32, 1, &C, err);
    if (!st) memcpy(out->data, jac, (size_t)C * sizeof *jac);
  } else if (avg == KS__AVG_MICRO)
    st = ks__result_f32(m, out, den_all != 0 ? num_all / den_all : 0.0, err);
  else
    st = ks__result_f32(m, out, acc / wsum, err); /* 0/0 is NaN, as torchmetrics */
  ks__free(&m->alloc, jac);
  return st;
}
