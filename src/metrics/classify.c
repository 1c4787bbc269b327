/* Classification input helpers (see classify.h). */
#include <stdio.h>

#include "metrics/classify.h"

ks_status ks__bpreds_init(const ks_metric *m, const ks_tensor *preds, const ks__view *target, int skip_ignored,
                          ks__bpreds *bp, ks_error *err) {
  bp->is_float = ks_dtype_is_float(preds->dtype);
  bp->thr = (float)m->args.threshold;
  bp->sig = 0;
  if (!bp->is_float) return ks__labels(m, preds, 2, 0, 0, "preds", &bp->v, err);
  ks_status st = ks__view_as(m, preds, KS_F32, &bp->v, err);
  if (st) return st;
  const float *p = bp->v.p;
  if (!skip_ignored || !m->args.has_ignore) {
    bp->sig = !ks__all_unit_f32(p, bp->v.n);
    return KS_OK;
  }
  const int64_t *t = target->p;
  for (size_t i = 0; i < bp->v.n && !bp->sig; i++)
    if (!ks__is_ignored(m, t[i])) bp->sig = !(p[i] >= 0.0f && p[i] <= 1.0f);
  return KS_OK;
}

void ks__bpreds_free(const ks_metric *m, ks__bpreds *bp) { ks__view_free(m, &bp->v); }

static KS_NODISCARD ks_status shape_err(const ks_tensor *p, const ks_tensor *t, const char *why, ks_error *err) {
  char a[128], b[128];
  return ks__err(err, KS_E_SHAPE, "preds %s and target %s: %s", ks_shape_format(p->rank, p->shape, a, sizeof a),
                 ks_shape_format(t->rank, t->shape, b, sizeof b), why);
}

ks_status ks__mc_layout(const ks_metric *m, const ks_tensor *preds, const ks_tensor *target, ks__mcin *lay,
                        ks_error *err) {
  lay->n = ks__numel(target);
  lay->P = 1;
  lay->logits = preds->rank == target->rank + 1;
  if (!lay->logits) {
    if (m->args.top_k > 1) return ks__err(err, KS_E_SHAPE, "top_k > 1 needs preds with a class dimension");
    if (!ks_tensor_same_shape(preds, target)) return shape_err(preds, target, "expected equal shapes", err);
    return KS_OK;
  }
  if (!ks_dtype_is_float(preds->dtype))
    return ks__err(err, KS_E_DTYPE, "preds with a class dimension must be floats, not %s", ks_dtype_name(preds->dtype));
  if (preds->rank < 2 || preds->shape[1] != m->args.num_classes)
    return shape_err(preds, target, "dim 1 of preds must be num_classes", err);
  if (preds->shape[0] != target->shape[0]) return shape_err(preds, target, "batch sizes differ", err);
  for (int i = 2; i < preds->rank; i++) {
    if (preds->shape[i] != target->shape[i - 1]) return shape_err(preds, target, "extra dims differ", err);
    lay->P *= (size_t)preds->shape[i];
  }
  return KS_OK;
}

ks_status ks__binary_inputs(const ks_metric *m, const ks_tensor *in, ks__view *t, ks__bpreds *bp, ks_error *err) {
  ks_status st = ks__same_shape(&in[0], &in[1], "preds", "target", err);
  if (!st) st = ks__labels(m, &in[1], 2, m->args.has_ignore, m->args.ignore_index, "target", t, err);
  if (!st) st = ks__bpreds_init(m, &in[0], t, 1, bp, err);
  return st;
}
