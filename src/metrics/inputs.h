/*
 * Input handling shared by the metric families: descriptor checks, dtype views
 * (borrowed when the dtype already matches, converted copies otherwise) and
 * label validation. Everything here only reads the inputs, so an update can
 * run all of it before it touches any state.
 */
#ifndef KS_METRICS_INPUTS_H
#define KS_METRICS_INPUTS_H

#include "metrics/internal.h"

/* A read-only array of n elements of the requested dtype. */
typedef struct ks__view {
  const void *p;
  void *owned; /* non-NULL when converted; freed by ks__view_free */
  size_t n;
} ks__view;

/* Checks the number of update() arguments. */
KS_NODISCARD ks_status ks__need_inputs(const ks_metric *m, size_t n, size_t lo, size_t hi, ks_error *err);

/* Exactly two inputs (preds, target), each a consistent descriptor. */
KS_NODISCARD ks_status ks__check_pair(const ks_metric *m, const ks_tensor *in, size_t n, ks_error *err);

/* Checks a caller's descriptor: dtype, rank, dims, nbytes and data pointer agree. */
KS_NODISCARD ks_status ks__check_input(const ks_tensor *t, const char *what, ks_error *err);

/* Number of elements of a checked descriptor, as size_t. */
size_t ks__numel(const ks_tensor *t);

/* Same rank and dims, else KS_E_SHAPE naming both shapes. */
KS_NODISCARD ks_status ks__same_shape(const ks_tensor *a, const ks_tensor *b, const char *an, const char *bn,
                         ks_error *err);

/* The data of t as dtype `want` (F32, F64 or I64): borrowed or converted. */
KS_NODISCARD ks_status ks__view_as(const ks_metric *m, const ks_tensor *t, ks_dtype want, ks__view *v, ks_error *err);
void ks__view_free(const ks_metric *m, ks__view *v);

/*
 * The data of t as int64 labels. Every value must be an integer (floats: finite
 * and integral, so NaN is refused) in [0, hi) or equal to `ignore` when has_ignore.
 * Returns KS_E_VALUE naming the first bad element.
 */
KS_NODISCARD ks_status ks__labels(const ks_metric *m, const ks_tensor *t, int64_t hi, int has_ignore, int64_t ignore,
                     const char *what, ks__view *v, ks_error *err);

/* Nonzero when every element of p[0..n) lies in [0, 1] (NaN does not). */
int ks__all_unit_f32(const float *p, size_t n);

#endif
