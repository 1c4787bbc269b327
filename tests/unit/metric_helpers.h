/* Helpers shared by the metric unit tests (header-only: tests/unit/test_*.c are separate programs). */
#ifndef KS_TEST_METRIC_HELPERS_H
#define KS_TEST_METRIC_HELPERS_H

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "keepsake/keepsake.h"
#include "keepsake/metric.h"
#include "testutil.h"

/* A borrowed tensor over caller data; rank 0..2 (d0/d1 used as needed). */
static inline ks_tensor mt_tensor(ks_dtype dt, const void *data, int rank, int64_t d0, int64_t d1) {
  ks_tensor t;
  int64_t shape[2] = {d0, d1};
  assert_int_equal(ks_tensor_init(&t, dt, rank, shape, (void *)data), KS_OK);
  return t;
}
#define F32V(arr) mt_tensor(KS_F32, arr, 1, (int64_t)(sizeof arr / sizeof arr[0]), 0)
#define I64V(arr) mt_tensor(KS_I64, arr, 1, (int64_t)(sizeof arr / sizeof arr[0]), 0)

static inline ks_metric *mt_make(const char *cls, const char *args) {
  ks_metric *m = NULL;
  ks_error e;
  ks_status st = ks_metric_create(cls, args, NULL, &m, &e);
  if (st) fail_msg("create %s %s: %s", cls, args ? args : "", e.message);
  return m;
}

static inline void mt_update(ks_metric *m, const ks_tensor *in, size_t n) {
  ks_error e;
  ks_status st = ks_metric_update(m, in, n, &e);
  if (st) fail_msg("update %s: %s", ks_metric_class(m), e.message);
}

static inline void mt_update2(ks_metric *m, ks_tensor a, ks_tensor b) {
  ks_tensor in[2] = {a, b};
  mt_update(m, in, 2);
}

/* compute() as a double (element i). */
static inline double mt_value(ks_metric *m, size_t i) {
  const ks_tensor *t;
  ks_error e;
  ks_status st = ks_metric_compute(m, &t, &e);
  if (st) fail_msg("compute %s: %s", ks_metric_class(m), e.message);
  return ks_dtype_get_f64(t->dtype, t->data, i);
}

static inline ks_statedict *mt_snapshot(const ks_metric *m) {
  ks_statedict *sd;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  assert_int_equal(ks_metric_to_state_dict(m, sd, "", NULL), KS_OK);
  return sd;
}

/* Nonzero when both dicts hold the same tensors byte for byte (same names, order, shapes). */
static inline int mt_same_sd(const ks_statedict *a, const ks_statedict *b) {
  if (ks_statedict_count(a) != ks_statedict_count(b)) return 0;
  for (size_t i = 0; i < ks_statedict_count(a); i++) {
    ks_entry x, y;
    if (ks_statedict_at(a, i, &x)) continue; /* index in range: cannot fail */
    if (ks_statedict_get(b, x.name, &y)) return 0;
    if (x.tensor.dtype != y.tensor.dtype || !ks_tensor_same_shape(&x.tensor, &y.tensor)) return 0;
    if (x.tensor.nbytes != y.tensor.nbytes) return 0;
    if (x.tensor.nbytes && memcmp(x.tensor.data, y.tensor.data, x.tensor.nbytes)) return 0;
  }
  return 1;
}

/* The metric's state equals a snapshot taken earlier. */
static inline int mt_unchanged(const ks_metric *m, const ks_statedict *before) {
  ks_statedict *now = mt_snapshot(m);
  int same = mt_same_sd(now, before);
  ks_statedict_free(now);
  return same;
}

/* An update that must fail with `code` and leave the metric untouched. */
static inline void mt_rejects(ks_metric *m, const ks_tensor *in, size_t n, ks_status code) {
  ks_statedict *before = mt_snapshot(m);
  int64_t count = ks_metric_update_count(m);
  ks_error e;
  ks_status st = ks_metric_update(m, in, n, &e);
  if (st != code) fail_msg("%s: expected %s, got %s (%s)", ks_metric_class(m), ks_status_name(code), ks_status_name(st),
                           st ? e.message : "");
  assert_true(mt_unchanged(m, before));
  assert_int_equal(ks_metric_update_count(m), count);
  ks_statedict_free(before);
}

static inline void mt_rejects2(ks_metric *m, ks_tensor a, ks_tensor b, ks_status code) {
  ks_tensor in[2] = {a, b};
  mt_rejects(m, in, 2, code);
}

static inline int mt_close(double a, double b) {
  if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
  return fabs(a - b) <= 1e-5 * fmax(fabs(a), fabs(b)) + 1e-6;
}

/* Deterministic pseudo-random floats in [0,1). */
static inline float mt_rand(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((*s >> 40) & 0xFFFFFF) / 16777216.0f;
}

#endif
