/*
 * Composer's LanguageCrossEntropy and LanguagePerplexity: the summed token
 * cross-entropy over targets that are not ignore_index (-100 by default), and
 * the count of those tokens. Logits are (N, V) or (B, S, V) with targets (N) /
 * (B, S). log-softmax is computed stably (max subtracted) in double.
 */
#include <math.h>

#include "metrics/families.h"
#include "metrics/inputs.h"

ks_status ks__lm_declare(ks_metric *m, ks_error *err) {
  ks_status st = ks__state_declare(m, "sum_loss", KS_REDUCE_SUM, KS_F32, 0, NULL, 0.0, err);
  return st ? st : ks__state_declare(m, "total_items", KS_REDUCE_SUM, KS_I64, 0, NULL, 0.0, err);
}

static KS_NODISCARD ks_status lm_shapes(const ks_metric *m, const ks_tensor *logits, const ks_tensor *target, size_t *V,
                           ks_error *err) {
  int ok = logits->rank == target->rank + 1 && logits->rank >= 2;
  for (int i = 0; ok && i < target->rank; i++) ok = logits->shape[i] == target->shape[i];
  if (!ok) {
    char a[128], b[128];
    return ks__err(err, KS_E_SHAPE, "%s: logits %s must be target %s plus a vocabulary dim", m->cls->name,
                   ks_shape_format(logits->rank, logits->shape, a, sizeof a),
                   ks_shape_format(target->rank, target->shape, b, sizeof b));
  }
  if (!ks_dtype_is_float(logits->dtype)) return ks__err(err, KS_E_DTYPE, "%s: logits must be floats", m->cls->name);
  if (ks_dtype_is_float(target->dtype))
    return ks__err(err, KS_E_DTYPE, "%s: targets must be integer class indices", m->cls->name);
  *V = (size_t)logits->shape[logits->rank - 1];
  return KS_OK;
}

/* -log softmax(row)[y]: logsumexp(row) - row[y], with the max taken out first. */
static double token_loss(const float *row, size_t V, size_t y) {
  float mx = row[0];
  for (size_t v = 1; v < V; v++) mx = row[v] > mx ? row[v] : mx;
  double z[4] = {0, 0, 0, 0};
  size_t v = 0;
  for (; v + 4 <= V; v += 4)
    for (size_t k = 0; k < 4; k++) z[k] += (double)expf(row[v + k] - mx);
  for (; v < V; v++) z[0] += (double)expf(row[v] - mx);
  return (double)mx + log((z[0] + z[1]) + (z[2] + z[3])) - (double)row[y];
}

ks_status ks__lm_update(ks_metric *m, const ks_tensor *in, size_t n, ks_error *err) {
  size_t V = 0;
  ks__view lg = {0}, t = {0};
  ks_status st = ks__need_inputs(m, n, 2, 2, err);
  if (!st) st = ks__check_input(&in[0], "logits", err);
  if (!st) st = ks__check_input(&in[1], "target", err);
  if (!st) st = lm_shapes(m, &in[0], &in[1], &V, err);
  if (!st && V == 0 && ks__numel(&in[1]) > 0) st = ks__err(err, KS_E_SHAPE, "%s: empty vocabulary", m->cls->name);
  if (!st) st = ks__labels(m, &in[1], (int64_t)V, m->args.has_ignore, m->args.ignore_index, "target", &t, err);
  if (!st) st = ks__view_as(m, &in[0], KS_F32, &lg, err);
  if (!st) {
    const float *x = lg.p;
    const int64_t *y = t.p;
    double loss = 0;
    int64_t items = 0;
    for (size_t i = 0; i < t.n; i++) {
      if (m->args.has_ignore && y[i] == m->args.ignore_index) continue;
      loss += token_loss(x + i * V, V, (size_t)y[i]);
      items++;
    }
    *ks__f32(&m->st[0]) += (float)loss;
    *ks__i64(&m->st[1]) += items;
  }
  ks__view_free(m, &lg);
  ks__view_free(m, &t);
  return st;
}

ks_status ks__lm_ce_compute(ks_metric *m, ks_tensor *out, ks_error *err) {
  float v = *ks__f32(&m->st[0]) / (float)*ks__i64(&m->st[1]);
  return ks__result_f32(m, out, (double)v, err);
}

ks_status ks__lm_ppl_compute(ks_metric *m, ks_tensor *out, ks_error *err) {
  float v = *ks__f32(&m->st[0]) / (float)*ks__i64(&m->st[1]);
  return ks__result_f32(m, out, (double)expf(v), err);
}
