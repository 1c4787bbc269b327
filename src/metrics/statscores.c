/*
 * tp/fp/tn/fn states of the Binary*, Multiclass* and Multilabel* accuracy,
 * precision, recall and F1 metrics. Each update counts into scratch arrays
 * and adds them to the states only when the whole batch was valid.
 */
#include <string.h>

#include "metrics/classify.h"
#include "metrics/families.h"

static const char *const k_stat_names[4] = {"tp", "fp", "tn", "fn"};

static KS_NODISCARD ks_status declare_stats(ks_metric *m, int64_t size, int task, ks_error *err) {
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

static KS_NODISCARD ks_status binary_like_update(ks_metric *m, const ks_tensor *in, size_t L, size_t P, ks_error *err) {
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

static KS_NODISCARD ks_status check_pair(const ks_metric *m, const ks_tensor *in, size_t n, ks_error *err) {
  return ks__check_pair(m, in, n, err);
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
 * Scratch counts of one batch, in 32-bit fields so the per-class arrays stay
 * small (12 bytes a class) and a sample costs two increments: th[y] counts the
 * target in its low half and a hit in its high half, pc[p] the prediction.
 * With few classes each sample bumps one cell of a C x C matrix instead (one
 * increment), folded into th/pc after. A batch is counted in chunks short
 * enough that no 32-bit field overflows; each chunk but the last is spilled
 * into 64-bit totals. The states see nothing until the whole batch was valid.
 */
#define KS__SMALL_C 64
#define KS__MC_CHUNK ((size_t)1 << 31) /* predictions counted per chunk */

typedef struct mc_counts {
  uint64_t *th;   /* C: targets (low 32 bits) | hits (high 32 bits) */
  uint32_t *pc;   /* C: predictions */
  uint32_t *cm;   /* C*C when the matrix is used, else NULL */
  int64_t *tot;   /* tc[C] pc[C] hit[C] of spilled chunks; NULL until a spill */
  int64_t n;      /* samples counted (not ignored) */
  size_t C;
  int64_t ign_in; /* ignore_index when it is a valid class, else -1 */
} mc_counts;

static KS_NODISCARD ks_status bad_label(const char *what, size_t i, int64_t v, size_t C, ks_error *err) {
  return ks__err(err, KS_E_VALUE, "%s[%zu] = %lld is not a class in [0, %zu) nor ignore_index", what, i, (long long)v,
                 C);
}

/* 1: count sample, 0: ignored, -1: invalid target. */
static inline int target_ok(const ks_metric *m, const mc_counts *c, int64_t y) {
  if ((uint64_t)y >= c->C) return ks__is_ignored(m, y) ? 0 : -1;
  return y != c->ign_in;
}

static inline void tally(mc_counts *c, size_t y, size_t p) {
  if (c->cm) c->cm[y * c->C + p]++;
  else {
    c->th[y] += 1 + ((uint64_t)(p == y) << 32);
    c->pc[p]++;
  }
}

/* A label pair off the fast path: 1 count, 0 ignored, -1 invalid (error in *st). */
static int label_slow(const ks_metric *m, const mc_counts *c, int64_t q, int64_t y, size_t i, ks_status *st,
                      ks_error *err) {
  int ok = target_ok(m, c, y);
  if (ok < 0) *st = bad_label("target", i, y, c->C, err);
  else if (ok && (uint64_t)q >= c->C) {
    *st = bad_label("preds", i, q, c->C, err);
    ok = -1;
  }
  return ok;
}

#if defined(__GNUC__)
#define KS__NOINLINE __attribute__((noinline))
#else
#define KS__NOINLINE
#endif
#if defined(__GNUC__) && !defined(__clang__)
#define KS__UNROLL4 _Pragma("GCC unroll 4")
#else
#define KS__UNROLL4
#endif

/*
 * Counts label pairs from i on until hi or the first pair that is out of
 * range or (ign >= 0) has target ign; returns where it stopped. Kept out of
 * line so the loop keeps its few pointers in registers; the ignore_index
 * compare is skipped when ignore_index is not a class, as the range test
 * already catches it.
 */
#define KS__FAST_LOOP(COUNT)                                                               \
  if (ign < 0) {                                                                           \
    KS__UNROLL4 for (; i < hi; i++) {                                                      \
      int64_t y = t[i], q = p[i];                                                          \
      if (((uint64_t)y >= C) | ((uint64_t)q >= C)) break;                                  \
      COUNT;                                                                               \
    }                                                                                      \
  } else {                                                                                 \
    KS__UNROLL4 for (; i < hi; i++) {                                                      \
      int64_t y = t[i], q = p[i];                                                          \
      if (((uint64_t)y >= C) | ((uint64_t)q >= C) | (y == ign)) break;                     \
      COUNT;                                                                               \
    }                                                                                      \
  }                                                                                        \
  return i;

static KS__NOINLINE size_t fast_pairs(const int64_t *p, const int64_t *t, size_t i, size_t hi, uint64_t C,
                                      int64_t ign, uint64_t *th, uint32_t *pc) {
  KS__FAST_LOOP((th[y] += 1 + ((uint64_t)(q == y) << 32), pc[q]++))
}

static KS__NOINLINE size_t fast_cells(const int64_t *p, const int64_t *t, size_t i, size_t hi, uint64_t C,
                                      int64_t ign, uint32_t *cm) {
  KS__FAST_LOOP(cm[(uint64_t)y * C + (uint64_t)q]++)
}

static KS_NODISCARD ks_status count_labels(const ks_metric *m, const int64_t *p, const int64_t *t, size_t lo, size_t hi,
                              mc_counts *c, ks_error *err) {
  size_t skipped = 0;
  for (size_t i = lo;; i++) {
    i = c->cm ? fast_cells(p, t, i, hi, c->C, c->ign_in, c->cm)
              : fast_pairs(p, t, i, hi, c->C, c->ign_in, c->th, c->pc);
    if (i == hi) break;
    ks_status st = KS_OK;
    int ok = label_slow(m, c, p[i], t[i], i, &st, err);
    if (ok < 0) return st;
    if (ok) tally(c, (size_t)t[i], (size_t)p[i]);
    else skipped++;
  }
  c->n += (int64_t)(hi - lo - skipped);
  return KS_OK;
}

/* Scratch of the top-k path: C (score, index) pairs and the k chosen indices. */
typedef struct topk_buf {
  ks__scored *work;
  size_t *idx;
} topk_buf;

/* The hot path: (N, C) float32 logits, argmax per row. */
static KS_NODISCARD ks_status count_argmax_rows(const ks_metric *m, const float *p, const int64_t *t, size_t lo,
                                                size_t hi, mc_counts *c, ks_error *err) {
  size_t C = c->C;
  p += lo * C;
  for (size_t i = lo; i < hi; i++, p += C) {
    int ok = target_ok(m, c, t[i]);
    if (ok < 0) return bad_label("target", i, t[i], C, err);
    if (!ok) continue;
    tally(c, (size_t)t[i], ks__argmax_row(p, C));
    c->n++;
  }
  return KS_OK;
}

/*
 * The predicted class of one sample under top_k > 1, as torchmetrics >= 1.7
 * (_refine_preds_oh): the target when it is among torch.topk's k best, else
 * torch.topk's first. Each sample so predicts exactly one class.
 */
static size_t topk_prediction(const float *row, size_t C, size_t P, size_t k, size_t y, ks__scored *work,
                              size_t *topk) {
  ks__topk_f32(row, C, P, k, work, topk);
  for (size_t j = 0; j < k; j++)
    if (topk[j] == y) return y;
  return topk[0];
}

static KS_NODISCARD ks_status count_logits(const ks_metric *m, const float *p, const int64_t *t, const ks__mcin *lay,
                              const topk_buf *tb, size_t lo, size_t hi, mc_counts *c, ks_error *err) {
  size_t C = c->C, k = (size_t)m->args.top_k, P = lay->P;
  if (k == 1 && P == 1) return count_argmax_rows(m, p, t, lo, hi, c, err);
  for (size_t i = lo; i < hi; i++) {
    int ok = target_ok(m, c, t[i]);
    if (ok < 0) return bad_label("target", i, t[i], C, err);
    if (!ok) continue;
    const float *row = p + (i / P) * C * P + i % P;
    size_t pred = k == 1 ? ks__argmax_f32(row, C, P) : topk_prediction(row, C, P, k, (size_t)t[i], tb->work, tb->idx);
    c->pc[pred]++;
    c->th[t[i]] += 1 + ((uint64_t)(pred == (size_t)t[i]) << 32);
    c->n++;
  }
  return KS_OK;
}

/* Adds the matrix of a chunk to th/pc and clears it. */
static void derive_from_matrix(mc_counts *c) {
  if (!c->cm) return;
  for (size_t y = 0; y < c->C; y++)
    for (size_t p = 0; p < c->C; p++) {
      uint64_t v = c->cm[y * c->C + p];
      c->th[y] += v + (p == y ? v << 32 : 0);
      c->pc[p] += (uint32_t)v;
    }
  memset(c->cm, 0, c->C * c->C * sizeof *c->cm);
}

/* Moves the 32-bit counts of a finished chunk into the 64-bit totals. */
static KS_NODISCARD ks_status spill(ks_metric *m, mc_counts *c, ks_error *err) {
  size_t C = c->C;
  if (!c->tot && !(c->tot = ks__calloc(&m->alloc, 3 * C, sizeof *c->tot)))
    return ks__err(err, KS_E_NOMEM, "out of memory counting %s", m->cls->name);
  for (size_t i = 0; i < C; i++) {
    c->tot[i] += (int64_t)(c->th[i] & 0xffffffffu);
    c->tot[C + i] += c->pc[i];
    c->tot[2 * C + i] += (int64_t)(c->th[i] >> 32);
  }
  memset(c->th, 0, C * sizeof *c->th);
  memset(c->pc, 0, C * sizeof *c->pc);
  return KS_OK;
}

/* Batch totals of class i: targets, predictions, hits. */
static inline void class_counts(const mc_counts *c, size_t i, int64_t *tc, int64_t *pc, int64_t *hit) {
  *tc = (int64_t)(c->th[i] & 0xffffffffu);
  *pc = c->pc[i];
  *hit = (int64_t)(c->th[i] >> 32);
  if (!c->tot) return;
  *tc += c->tot[i];
  *pc += c->tot[c->C + i];
  *hit += c->tot[2 * c->C + i];
}

static void commit_multiclass(ks_metric *m, const mc_counts *c) {
  int64_t *tp = ks__i64(&m->st[0]), *fp = ks__i64(&m->st[1]), *tn = ks__i64(&m->st[2]), *fn = ks__i64(&m->st[3]);
  int64_t tc, pc, hit, n = c->n;
  if (m->st[0].shape[0] == 1) { /* micro, top_k == 1 */
    int64_t hits = 0;
    for (size_t i = 0; i < c->C; i++) {
      class_counts(c, i, &tc, &pc, &hit);
      hits += hit;
    }
    tp[0] += hits;
    fp[0] += n - hits;
    fn[0] += n - hits;
    tn[0] += (int64_t)c->C * n - (2 * n - hits);
    return;
  }
  for (size_t i = 0; i < c->C; i++) {
    class_counts(c, i, &tc, &pc, &hit);
    tp[i] += hit;
    fp[i] += pc - hit;
    fn[i] += tc - hit;
    tn[i] += n - pc - tc + hit;
  }
}

/* Labels as int64: I64 is borrowed unchecked (the counting loops check it), others are converted and checked. */
static KS_NODISCARD ks_status raw_labels(const ks_metric *m, const ks_tensor *t, const char *what, ks__view *v,
                                         ks_error *err) {
  if (t->dtype != KS_I64)
    return ks__labels(m, t, m->args.num_classes, m->args.has_ignore, m->args.ignore_index, what, v, err);
  v->p = t->data;
  v->n = ks__numel(t);
  v->owned = NULL;
  return KS_OK;
}

/* Counts samples [0, n) chunk by chunk; 32-bit fields hold at most KS__MC_CHUNK each. */
static KS_NODISCARD ks_status count_chunks(ks_metric *m, const ks__view *p, const ks__view *t, const ks__mcin *lay,
                              const topk_buf *tb, mc_counts *c, ks_error *err) {
  size_t n = t->n, chunk = KS__MC_CHUNK;
  ks_status st = KS_OK;
  for (size_t lo = 0; !st && lo < n; lo += chunk) {
    size_t hi = n - lo <= chunk ? n : lo + chunk;
    st = lay->logits ? count_logits(m, p->p, t->p, lay, tb, lo, hi, c, err)
                     : count_labels(m, p->p, t->p, lo, hi, c, err);
    derive_from_matrix(c);
    if (!st && hi < n) st = spill(m, c, err);
  }
  return st;
}

static KS_NODISCARD ks_status multiclass_count(ks_metric *m, const ks_tensor *preds, const ks__view *t,
                                               const ks__mcin *lay, mc_counts *c, ks_error *err) {
  ks__view p = {0};
  topk_buf tb = {NULL, NULL};
  ks_status st;
  if (lay->logits) {
    size_t k = (size_t)m->args.top_k;
    if (k > 1) {
      tb.work = ks__malloc(&m->alloc, c->C * sizeof *tb.work);
      tb.idx = ks__malloc(&m->alloc, k * sizeof *tb.idx);
      if (!tb.work || !tb.idx) {
        ks__free(&m->alloc, tb.work);
        ks__free(&m->alloc, tb.idx);
        return ks__err(err, KS_E_NOMEM, "out of memory for top_k");
      }
    }
    if (k > 1 || lay->P > 1) c->cm = NULL; /* the per-sample loop counts th/pc itself */
    st = ks__view_as(m, preds, KS_F32, &p, err);
  } else {
    st = raw_labels(m, preds, "preds", &p, err);
  }
  if (!st) st = count_chunks(m, &p, t, lay, &tb, c, err);
  ks__free(&m->alloc, tb.work);
  ks__free(&m->alloc, tb.idx);
  ks__view_free(m, &p);
  return st;
}

/* One block: th (8 bytes a class), pc (4), then the matrix (4 a cell) when C is small. */
static KS_NODISCARD ks_status counts_init(ks_metric *m, mc_counts *c, ks_error *err) {
  size_t C = (size_t)m->args.num_classes, words = 3 * C + (C <= KS__SMALL_C ? C * C : 0);
  memset(c, 0, sizeof *c);
  c->C = C;
  c->ign_in = (m->args.has_ignore && m->args.ignore_index >= 0 && m->args.ignore_index < (int64_t)C)
                  ? m->args.ignore_index : -1;
  void *block = ks__calloc(&m->alloc, words, sizeof(uint32_t));
  if (!block) return ks__err(err, KS_E_NOMEM, "out of memory counting %s", m->cls->name);
  c->th = block;
  c->pc = (uint32_t *)(c->th + C);
  if (C <= KS__SMALL_C) c->cm = c->pc + C;
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
  if (!st) commit_multiclass(m, &c);
  ks__free(&m->alloc, c.th);
  ks__free(&m->alloc, c.tot);
  ks__view_free(m, &t);
  return st;
}
