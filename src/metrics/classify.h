/*
 * Reading classification inputs the torchmetrics way: binary predictions
 * (probabilities, logits or 0/1 labels against a threshold) and multiclass
 * predictions (argmax / top-k over the class dim, or labels).
 */
#ifndef KS_METRICS_CLASSIFY_H
#define KS_METRICS_CLASSIFY_H

#include <math.h>
#include <stdint.h>

#include "metrics/inputs.h"

/* Binary predictions: bit(i) = pred i is positive. */
typedef struct ks__bpreds {
  ks__view v; /* F32 for float preds, I64 for labels */
  int is_float;
  int sig; /* some value lies outside [0,1]: the floats are logits, sigmoid first */
  float thr;
} ks__bpreds;

/*
 * Prepares binary predictions. Integer preds must be 0/1. The logit test looks at
 * every element, or (skip_ignored, as the confusion-matrix and curve metrics do) only
 * at elements whose target is not ignore_index.
 */
KS_NODISCARD ks_status ks__bpreds_init(const ks_metric *m, const ks_tensor *preds, const ks__view *target,
                                       int skip_ignored, ks__bpreds *bp, ks_error *err);
void ks__bpreds_free(const ks_metric *m, ks__bpreds *bp);
/* Binary (preds, target) of one shape: target labels 0/1 (ignore_index dropped) into t, preds into bp. */
KS_NODISCARD ks_status ks__binary_inputs(const ks_metric *m, const ks_tensor *in, ks__view *t, ks__bpreds *bp,
                                         ks_error *err);

static inline float ks__sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

static inline int ks__bpred(const ks__bpreds *bp, size_t i) {
  if (!bp->is_float) return ((const int64_t *)bp->v.p)[i] != 0;
  float p = ((const float *)bp->v.p)[i];
  return (bp->sig ? ks__sigmoidf(p) : p) > bp->thr;
}

static inline int ks__is_ignored(const ks_metric *m, int64_t t) {
  return m->args.has_ignore && t == m->args.ignore_index;
}

/* Multiclass input layout: n samples; logits (n, C, P...) or labels. */
typedef struct ks__mcin {
  int logits;  /* preds carry a class dim */
  size_t n;    /* samples (= target numel) */
  size_t P;    /* positions per sample row (product of dims after the class dim) */
} ks__mcin;

/* Checks preds/target shapes for a multiclass task with C classes. */
KS_NODISCARD ks_status ks__mc_layout(const ks_metric *m, const ks_tensor *preds, const ks_tensor *target, ks__mcin *lay,
                        ks_error *err);

/* Index of the largest of C values spaced `stride` apart; NaN wins, ties go to the first. */
static inline size_t ks__argmax_f32(const float *r, size_t C, size_t stride) {
  size_t best = 0;
  float bv = r[0];
  if (bv != bv) return 0;
  for (size_t c = 1; c < C; c++) {
    float v = r[c * stride];
    if (v > bv) {
      bv = v;
      best = c;
    } else if (v != v)
      return c;
  }
  return best;
}

#if defined(__SSE2__) && defined(__GNUC__)
#include <emmintrin.h>

/* First index in r[0..C) equal to the broadcast max m (C >= 4; overlapping tail load). */
static inline size_t ks__first_eq_sse(const float *r, size_t C, __m128 m) {
  size_t c = 0;
  if (C <= 64) {
    uint64_t bits = 0;
    for (; c + 4 <= C; c += 4) bits |= (uint64_t)_mm_movemask_ps(_mm_cmpeq_ps(_mm_loadu_ps(r + c), m)) << c;
    if (c < C) bits |= (uint64_t)_mm_movemask_ps(_mm_cmpeq_ps(_mm_loadu_ps(r + C - 4), m)) << (C - 4);
    return (size_t)__builtin_ctzll(bits);
  }
  for (;; c = c + 4 <= C - 4 ? c + 4 : C - 4) {
    int mask = _mm_movemask_ps(_mm_cmpeq_ps(_mm_loadu_ps(r + c), m));
    if (mask) return c + (size_t)__builtin_ctz((unsigned)mask);
  }
}

/*
 * Argmax of a contiguous row, vectorised: max over 4-wide blocks (rows holding
 * a NaN take the scalar path, so NaN still wins), then the first index equal
 * to the max. Same result as ks__argmax_f32.
 */
static inline size_t ks__argmax_row(const float *r, size_t C) {
  if (C < 4) return ks__argmax_f32(r, C, 1);
  __m128 m = _mm_loadu_ps(r), nan = _mm_cmpunord_ps(m, m);
  size_t c = 4;
  for (; c + 4 <= C; c += 4) {
    __m128 v = _mm_loadu_ps(r + c);
    m = _mm_max_ps(m, v);
    nan = _mm_or_ps(nan, _mm_cmpunord_ps(v, v));
  }
  if (c < C) {
    __m128 v = _mm_loadu_ps(r + C - 4);
    m = _mm_max_ps(m, v);
    nan = _mm_or_ps(nan, _mm_cmpunord_ps(v, v));
  }
  if (_mm_movemask_ps(nan)) return ks__argmax_f32(r, C, 1);
  m = _mm_max_ps(m, _mm_shuffle_ps(m, m, _MM_SHUFFLE(2, 3, 0, 1)));
  m = _mm_max_ps(m, _mm_shuffle_ps(m, m, _MM_SHUFFLE(1, 0, 3, 2)));
  return ks__first_eq_sse(r, C, m);
}
#else
static inline size_t ks__argmax_row(const float *r, size_t C) { return ks__argmax_f32(r, C, 1); }
#endif

/* A score and its class index: torch.topk's working pairs. */
typedef struct ks__scored {
  float v;
  size_t i;
} ks__scored;

/*
 * Indices of the k largest of C values spaced `stride` apart into out[k]: the same
 * set as torch.topk's and the same first index, ties and NaN (largest) included
 * (topk.c; when ties decide the set, the whole order is torch's). work holds C pairs.
 */
void ks__topk_f32(const float *r, size_t C, size_t stride, size_t k, ks__scored *work, size_t *out);

#endif
