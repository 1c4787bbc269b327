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

/*
 * Scratch counts of one batch. With few classes every sample bumps one cell of
 * a C x C matrix (one increment per sample); tc/pc/hit are derived after.
 */
#define KS__SMALL_C 64
typedef struct mc_counts {
  int64_t *cm;            /* C*C when C <= KS__SMALL_C, else NULL */
  int64_t *tc, *pc, *hit; /* each C long */
  int64_t n;
  size_t C;
  int64_t ign_in; /* ignore_index when it is a valid class, else -1 */
} mc_counts;

static ks_status bad_label(const char *what, size_t i, int64_t v, size_t C, ks_error *err) {
  return ks__err(err, KS_E_VALUE, "%s[%zu] = %lld is not a class in [0, %zu) nor ignore_index", what, i, (long long)v, C);
}

/* 1: count sample, 0: ignored, -1: invalid target. */
static inline int target_ok(const ks_metric *m, const mc_counts *c, int64_t y) {
  if ((uint64_t)y >= c->C) return ks__is_ignored(m, y) ? 0 : -1;
  return y != c->ign_in;
}

static inline void tally(mc_counts *c, size_t y, size_t p) {
  if (c->cm) c->cm[y * c->C + p]++;
  else {
    c->tc[y]++;
    c->pc[p]++;
    c->hit[y] += p == y;
  }
}

static ks_status count_labels(const ks_metric *m, const int64_t *p, const int64_t *t, size_t n, mc_counts *c,
                              ks_error *err) {
  for (size_t i = 0; i < n; i++) {
    int ok = target_ok(m, c, t[i]);
    if (ok < 0) return bad_label("target", i, t[i], c->C, err);
    if (!ok) continue;
    if ((uint64_t)p[i] >= c->C) return bad_label("preds", i, p[i], c->C, err);
    tally(c, (size_t)t[i], (size_t)p[i]);
    c->n++;
  }
  return KS_OK;
}

/* The hot path: (N, C) float32 logits, argmax per row. */
static ks_status count_argmax_rows(const ks_metric *m, const float *p, const int64_t *t, size_t n, mc_counts *c,
                                   ks_error *err) {
  size_t C = c->C;
  for (size_t i = 0; i < n; i++, p += C) {
    int ok = target_ok(m, c, t[i]);
    if (ok < 0) return bad_label("target", i, t[i], C, err);
    if (!ok) continue;
    tally(c, (size_t)t[i], ks__argmax_row(p, C));
    c->n++;
  }
  return KS_OK;
}

static ks_status count_logits(const ks_metric *m, const float *p, const int64_t *t, const ks__mcin *lay,
                              size_t *topk, mc_counts *c, ks_error *err) {
  size_t C = c->C, k = (size_t)m->args.top_k, P = lay->P;
  if (k == 1 && P == 1) return count_argmax_rows(m, p, t, lay->n, c, err);
  for (size_t i = 0; i < lay->n; i++) {
    int ok = target_ok(m, c, t[i]);
    if (ok < 0) return bad_label("target", i, t[i], C, err);
    if (!ok) continue;
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
  return KS_OK;
}

static void derive_from_matrix(mc_counts *c) {
  if (!c->cm) return;
  for (size_t y = 0; y < c->C; y++)
    for (size_t p = 0; p < c->C; p++) {
      int64_t v = c->cm[y * c->C + p];
      c->tc[y] += v;
      c->pc[p] += v;
      if (p == y) c->hit[y] += v;
    }
}

static void commit_multiclass(ks_metric *m, const mc_counts *c) {
  int64_t C = (int64_t)c->C;
  int64_t *tp = ks__i64(&m->st[0]), *fp = ks__i64(&m->st[1]), *tn = ks__i64(&m->st[2]), *fn = ks__i64(&m->st[3]);
  if (m->st[0].shape[0] == 1) { /* micro, top_k == 1 */
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

/* Labels as int64: I64 is borrowed unchecked (the counting loops check it), others are converted and checked. */
static ks_status raw_labels(const ks_metric *m, const ks_tensor *t, const char *what, ks__view *v, ks_error *err) {
  if (t->dtype != KS_I64)
    return ks__labels(m, t, m->args.num_classes, m->args.has_ignore, m->args.ignore_index, what, v, err);
  v->p = t->data;
  v->n = ks__numel(t);
  v->owned = NULL;
  return KS_OK;
}

static ks_status multiclass_count(ks_metric *m, const ks_tensor *preds, const ks__view *t, const ks__mcin *lay,
                                  mc_counts *c, ks_error *err) {
  ks__view p = {0};
  ks_status st;
  if (lay->logits) {
    size_t *topk = ks__malloc(&m->alloc, (size_t)m->args.top_k * sizeof *topk);
    if (!topk) return ks__err(err, KS_E_NOMEM, "out of memory for top_k");
    if (m->args.top_k > 1 || lay->P > 1) c->cm = NULL; /* the top-k loop counts tc/pc/hit itself */
    st = ks__view_as(m, preds, KS_F32, &p, err);
    if (!st) st = count_logits(m, p.p, t->p, lay, topk, c, err);
    ks__free(&m->alloc, topk);
  } else {
    st = raw_labels(m, preds, "preds", &p, err);
    if (!st) st = count_labels(m, p.p, t->p, t->n, c, err);
  }
  ks__view_free(m, &p);
  return st;
}

static ks_status counts_init(ks_metric *m, mc_counts *c, ks_error *err) {
  size_t C = (size_t)m->args.num_classes, cells = 3 * C + (C <= KS__SMALL_C ? C * C : 0);
  memset(c, 0, sizeof *c);
  c->C = C;
  c->ign_in = (m->args.has_ignore && m->args.ignore_index >= 0 && m->args.ignore_index < (int64_t)C)
                  ? m->args.ignore_index : -1;
  c->tc = ks__calloc(&m->alloc, cells, sizeof(int64_t));
  if (!c->tc) return ks__err(err, KS_E_NOMEM, "out of memory counting %s", m->cls->name);
  c->pc = c->tc + C;
  c->hit = c->pc + C;
  if (C <= KS__SMALL_C) c->cm = c->hit + C;
  return KS_OK;
}

ks_status ks__multiclass_stat_update(ks_metric *m, const ks_tensor *in, size_t n, ks_error *err) {
  ks__mcin lay;
  ks__view t = {0};
  mc_counts c;
  ks_status st = check_pair(m, in, n, err);
  if (!st) st = ks__mc_layout(m, &in[0], &in[1], &lay, err);
  if (!st) st = raw_labels(m, &in[1], "target", &t, err);
  if (st) return st;
  st = counts_init(m, &c, err);
  if (!st) st = multiclass_count(m, &in[0], &t, &lay, &c, err);
  if (!st) {
    derive_from_matrix(&c);
    commit_multiclass(m, &c);
  }
  ks__free(&m->alloc, c.tc);
  ks__view_free(m, &t);
  return st;
}
