/*
 * tp/fp/tn/fn states of the Binary*, Multiclass* and Multilabel* accuracy,
 * precision, recall and F1 metrics. Each update counts into scratch arrays
 * and adds them to the states only when the whole batch was valid.
 */
#include <string.h>

#include "metrics/classify.h"
#include "metrics/families.h"

static const char *const k_stat_names[4] = {"tp", "fp", "tn", "fn"};

static ks_status declare_stats(ks_metric *m, int64_t size, int task, ks_error *err) {
  m->task = task;
  for (int i = 0; i < 4; i++) {
    ks_status st = ks__state_declare(m, k_stat_names[i], KS_REDUCE_SUM, KS_I64, 1, &size, 0.0, err);
    if (st) return st;
  }
  return KS_OK;
}

ks_status ks__binary_stat_declare(ks_metric *m, ks_error *err) { return declare_stats(m, 1, KS__TASK_BINARY, err); }

ks_status ks__multiclass_stat_declare(ks_metric *m, ks_error *err) {
  int micro = m->args.average == KS__AVG_MICRO && m->args.top_k == 1;
  return declare_stats(m, micro ? 1 : m->args.num_classes, KS__TASK_MULTICLASS, err);
}

ks_status ks__multilabel_stat_declare(ks_metric *m, ks_error *err) {
  return declare_stats(m, m->args.num_classes, KS__TASK_MULTILABEL, err);
}

/* Adds counts laid out as tp[L] fp[L] tn[L] fn[L] to the states. */
static void commit_counts(ks_metric *m, const int64_t *c, size_t L) {
  for (int k = 0; k < 4; k++) {
    int64_t *s = ks__i64(&m->st[k]);
    for (size_t i = 0; i < L; i++) s[i] += c[(size_t)k * L + i];
  }
}

/* ---- binary and multilabel: element-wise 0/1 comparisons ---- */

static void count_binary(const ks_metric *m, const ks__bpreds *bp, const int64_t *t, size_t n, size_t L,
                         size_t P, int64_t *c) {
  for (size_t i = 0; i < n; i++) {
    if (ks__is_ignored(m, t[i])) continue;
    size_t l = L == 1 ? 0 : (i / P) % L;
    int p = ks__bpred(bp, i), y = t[i] == 1;
    /* tp fp tn fn */
    c[(size_t)(y ? (p ? 0 : 3) : (p ? 1 : 2)) * L + l]++;
  }
}

static ks_status binary_like_update(ks_metric *m, const ks_tensor *in, size_t L, size_t P, ks_error *err) {
  ks__view t = {0};
  ks__bpreds bp = {0};
  ks_status st = ks__labels(m, &in[1], 2, m->args.has_ignore, m->args.ignore_index, "target", &t, err);
  if (!st) st = ks__bpreds_init(m, &in[0], &t, 0, &bp, err);
  int64_t local[4], *c = L == 1 ? local : NULL;
  memset(local, 0, sizeof local);
  if (!st && !c && !(c = ks__calloc(&m->alloc, 4 * L, sizeof *c)))
    st = ks__err(err, KS_E_NOMEM, "out of memory counting %s", m->cls->name);
  if (!st) {
    count_binary(m, &bp, t.p, t.n, L, P, c);
    commit_counts(m, c, L);
  }
  if (c != local) ks__free(&m->alloc, c);
  ks__bpreds_free(m, &bp);
  ks__view_free(m, &t);
  return st;
}

static ks_status check_pair(const ks_metric *m, const ks_tensor *in, size_t n, ks_error *err) {
  ks_status st = ks__need_inputs(m, n, 2, 2, err);
  if (!st) st = ks__check_input(&in[0], "preds", err);
  if (!st) st = ks__check_input(&in[1], "target", err);
  return st;
}

ks_status ks__binary_stat_update(ks_metric *m, const ks_tensor *in, size_t n, ks_error *err) {
  ks_status st = check_pair(m, in, n, err);
  if (!st) st = ks__same_shape(&in[0], &in[1], "preds", "target", err);
  return st ? st : binary_like_update(m, in, 1, 1, err);
}

ks_status ks__multilabel_stat_update(ks_metric *m, const ks_tensor *in, size_t n, ks_error *err) {
  ks_status st = check_pair(m, in, n, err);
  if (!st) st = ks__same_shape(&in[0], &in[1], "preds", "target", err);
  if (st) return st;
  if (in[0].rank < 2 || in[0].shape[1] != m->args.num_classes)
    return ks__err(err, KS_E_SHAPE, "multilabel preds need shape (N, num_labels=%lld, ...)",
                   (long long)m->args.num_classes);
  size_t P = 1;
  for (int i = 2; i < in[0].rank; i++) P *= (size_t)in[0].shape[i];
  return binary_like_update(m, in, (size_t)m->args.num_classes, P, err);
}

/* ---- multiclass: per-class target count, prediction count and hits ---- */

typedef struct mc_counts {
  int64_t *tc, *pc, *hit; /* each C long */
  int64_t n;
} mc_counts;

static ks_status bad_pred(size_t i, int64_t p, int64_t C, ks_error *err) {
  return ks__err(err, KS_E_VALUE, "preds[%zu] = %lld is not a class in [0, %lld)", i, (long long)p, (long long)C);
}

static ks_status count_labels(const ks_metric *m, const int64_t *p, const int64_t *t, size_t n, mc_counts *c,
                              ks_error *err) {
  int64_t C = m->args.num_classes;
  for (size_t i = 0; i < n; i++) {
    if (ks__is_ignored(m, t[i])) continue;
    if (p[i] < 0 || p[i] >= C) return bad_pred(i, p[i], C, err);
    c->tc[t[i]]++;
    c->pc[p[i]]++;
    c->hit[t[i]] += p[i] == t[i];
    c->n++;
  }
  return KS_OK;
}

/* The hot path: (N, C) float32 logits, argmax per row. */
static void count_argmax_rows(const ks_metric *m, const float *p, const int64_t *t, size_t n, size_t C,
                              mc_counts *c) {
  for (size_t i = 0; i < n; i++, p += C) {
    if (ks__is_ignored(m, t[i])) continue;
    size_t a = ks__argmax_f32(p, C, 1);
    c->tc[t[i]]++;
    c->pc[a]++;
    c->hit[t[i]] += (int64_t)a == t[i];
    c->n++;
  }
}

static void count_logits(const ks_metric *m, const float *p, const int64_t *t, const ks__mcin *lay,
                         size_t *topk, mc_counts *c) {
  size_t C = (size_t)m->args.num_classes, k = (size_t)m->args.top_k, P = lay->P;
  if (k == 1 && P == 1) {
    count_argmax_rows(m, p, t, lay->n, C, c);
    return;
  }
  for (size_t i = 0; i < lay->n; i++) {
    if (ks__is_ignored(m, t[i])) continue;
    const float *row = p + (i / P) * C * P + i % P;
    if (k == 1) topk[0] = ks__argmax_f32(row, C, P);
    else ks__topk_f32(row, C, P, k, topk);
    c->tc[t[i]]++;
    for (size_t j = 0; j < k; j++) {
      c->pc[topk[j]]++;
      c->hit[t[i]] += (int64_t)topk[j] == t[i];
    }
    c->n++;
  }
}

static void commit_multiclass(ks_metric *m, const mc_counts *c) {
  int64_t C = m->args.num_classes;
  int64_t *tp = ks__i64(&m->st[0]), *fp = ks__i64(&m->st[1]), *tn = ks__i64(&m->st[2]), *fn = ks__i64(&m->st[3]);
  if (m->st[0].shape[0] == 1 && C > 1) { /* micro, top_k == 1 */
    int64_t hits = 0;
    for (int64_t i = 0; i < C; i++) hits += c->hit[i];
    tp[0] += hits;
    fp[0] += c->n - hits;
    fn[0] += c->n - hits;
    tn[0] += C * c->n - (2 * c->n - hits);
    return;
  }
  for (int64_t i = 0; i < C; i++) {
    tp[i] += c->hit[i];
    fp[i] += c->pc[i] - c->hit[i];
    fn[i] += c->tc[i] - c->hit[i];
    tn[i] += c->n - c->pc[i] - c->tc[i] + c->hit[i];
  }
}

static ks_status multiclass_count(ks_metric *m, const ks_tensor *preds, const ks__view *t, const ks__mcin *lay,
                                  mc_counts *c, ks_error *err) {
  ks__view p = {0};
  ks_status st;
  if (lay->logits) {
    size_t *topk = ks__malloc(&m->alloc, (size_t)m->args.top_k * sizeof *topk);
    if (!topk) return ks__err(err, KS_E_NOMEM, "out of memory for top_k");
    st = ks__view_as(m, preds, KS_F32, &p, err);
    if (!st) count_logits(m, p.p, t->p, lay, topk, c);
    ks__free(&m->alloc, topk);
  } else {
    st = ks__labels(m, preds, m->args.num_classes, m->args.has_ignore, m->args.ignore_index, "preds", &p, err);
    if (!st) st = count_labels(m, p.p, t->p, t->n, c, err);
  }
  ks__view_free(m, &p);
  return st;
}

ks_status ks__multiclass_stat_update(ks_metric *m, const ks_tensor *in, size_t n, ks_error *err) {
  ks__mcin lay;
  ks__view t = {0};
  ks_status st = check_pair(m, in, n, err);
  if (!st) st = ks__mc_layout(m, &in[0], &in[1], &lay, err);
  if (!st) st = ks__labels(m, &in[1], m->args.num_classes, m->args.has_ignore, m->args.ignore_index, "target", &t, err);
  if (st) return st;
  size_t C = (size_t)m->args.num_classes;
  mc_counts c = {ks__calloc(&m->alloc, 3 * C, sizeof(int64_t)), NULL, NULL, 0};
  if (!c.tc) st = ks__err(err, KS_E_NOMEM, "out of memory counting %s", m->cls->name);
  if (!st) {
    c.pc = c.tc + C;
    c.hit = c.pc + C;
    st = multiclass_count(m, &in[0], &t, &lay, &c, err);
  }
  if (!st) commit_multiclass(m, &c);
  ks__free(&m->alloc, c.tc);
  ks__view_free(m, &t);
  return st;
}
