/*
 * Accuracy, precision, recall and F1 from tp/fp/tn/fn, as torchmetrics'
 * _accuracy_reduce / _precision_recall_reduce / _fbeta_reduce: division by
 * zero gives 0; macro averaging skips classes never seen (multiclass only);
 * weighted averaging weights by support tp+fn.
 */
#include "metrics/families.h"

typedef enum { SCORE_ACC, SCORE_PREC, SCORE_REC, SCORE_F1 } score_kind;

typedef struct stats {
  const int64_t *tp, *fp, *tn, *fn;
  size_t L;
} stats;

static double safe_div(double a, double b) { return b != 0 ? (double)((float)a / (float)b) : 0.0; }

static double score(score_kind k, int multilabel, double tp, double fp, double tn, double fn) {
  switch (k) {
    case SCORE_ACC: return multilabel ? safe_div(tp + tn, tp + tn + fp + fn) : safe_div(tp, tp + fn);
    case SCORE_PREC: return safe_div(tp, tp + fp);
    case SCORE_REC: return safe_div(tp, tp + fn);
    default: return safe_div(2 * tp, 2 * tp + fn + fp);
  }
}

static double binary_score(score_kind k, const stats *s) {
  double tp = (double)s->tp[0], fp = (double)s->fp[0], tn = (double)s->tn[0], fn = (double)s->fn[0];
  if (k == SCORE_ACC) return safe_div(tp + tn, tp + tn + fp + fn);
  return score(k, 0, tp, fp, tn, fn);
}

static double micro_score(score_kind k, int multilabel, const stats *s) {
  double tp = 0, fp = 0, tn = 0, fn = 0;
  for (size_t i = 0; i < s->L; i++) {
    tp += (double)s->tp[i];
    fp += (double)s->fp[i];
    tn += (double)s->tn[i];
    fn += (double)s->fn[i];
  }
  return score(k, multilabel, tp, fp, tn, fn);
}

/* Weight of class i in a macro / weighted average. */
static double class_weight(const ks_metric *m, score_kind k, const stats *s, size_t i) {
  if (m->args.average == KS__AVG_WEIGHTED) return (double)(s->tp[i] + s->fn[i]);
  if (m->task == KS__TASK_MULTILABEL) return 1.0;
  int topk = k != SCORE_F1 && m->args.top_k > 1; /* _fbeta_reduce does not pass top_k */
  int64_t seen = topk ? s->tp[i] + s->fn[i] : s->tp[i] + s->fp[i] + s->fn[i];
  return seen ? 1.0 : 0.0;
}

static KS_NODISCARD ks_status reduce(ks_metric *m, score_kind k, ks_tensor *out, ks_error *err) {
  stats s = {ks__i64(&m->st[0]), ks__i64(&m->st[1]), ks__i64(&m->st[2]), ks__i64(&m->st[3]),
             (size_t)m->st[0].shape[0]};
  int multilabel = m->task == KS__TASK_MULTILABEL;
  if (m->task == KS__TASK_BINARY) return ks__result_f32(m, out, binary_score(k, &s), err);
  if (m->args.average == KS__AVG_MICRO) return ks__result_f32(m, out, micro_score(k, multilabel, &s), err);
  if (m->args.average == KS__AVG_NONE) {
    int64_t L = (int64_t)s.L;
    ks_status st = ks__result(m, out, KS_F32, 1, &L, err);
    for (size_t i = 0; !st && i < s.L; i++)
      ((float *)out->data)[i] =
          (float)score(k, multilabel, (double)s.tp[i], (double)s.fp[i], (double)s.tn[i], (double)s.fn[i]);
    return st;
  }
  double num = 0, wsum = 0;
  for (size_t i = 0; i < s.L; i++) {
    double w = class_weight(m, k, &s, i);
    float sc = (float)score(k, multilabel, (double)s.tp[i], (double)s.fp[i], (double)s.tn[i], (double)s.fn[i]);
    num += w * (double)sc;
    wsum += w;
  }
  return ks__result_f32(m, out, wsum != 0 ? num / wsum : 0.0, err);
}

ks_status ks__accuracy_compute(ks_metric *m, ks_tensor *out, ks_error *err) { return reduce(m, SCORE_ACC, out, err); }
ks_status ks__precision_compute(ks_metric *m, ks_tensor *out, ks_error *err) { return reduce(m, SCORE_PREC, out, err); }
ks_status ks__recall_compute(ks_metric *m, ks_tensor *out, ks_error *err) { return reduce(m, SCORE_REC, out, err); }
ks_status ks__f1_compute(ks_metric *m, ks_tensor *out, ks_error *err) { return reduce(m, SCORE_F1, out, err); }
