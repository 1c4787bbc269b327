/*
 * The generators a Python training program holds (Python's and numpy's Mersenne Twisters, torch's
 * CPU generator), described by a C program through a component under rng/<rank>/ with the entries
 * the Python package writes for them (python/keepsake/_state/rng.py), in its order: as a C program
 * that embeds CPython would hold them. Shared by the two cross-language tests
 * (tests/interop/state_header_c.c, tests/mpi/same_components.c); header-only, test code.
 */
#ifndef KS_TESTS_PY_GENERATORS_H
#define KS_TESTS_PY_GENERATORS_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "keepsake/keepsake.h"

enum { PYGEN_MT_N = 624, PYGEN_TORCH_BYTES = 5056 };

typedef struct py_generators {
  int64_t python[PYGEN_MT_N + 1]; /* random.getstate()[1]: the words, then the position */
  int64_t numpy[PYGEN_MT_N];      /* np.random.get_state()[1], widened to I64 as the Python package stores it */
  uint8_t torch[PYGEN_TORCH_BYTES];
} py_generators;

static inline void pygen_twister(uint32_t *mt, uint32_t seed) { /* init_genrand: numpy's seed(int) */
  mt[0] = seed;
  for (uint32_t i = 1; i < PYGEN_MT_N; i++) mt[i] = 1812433253u * (mt[i - 1] ^ (mt[i - 1] >> 30)) + i;
}

/* init_by_array: CPython's random.seed(int) */
static inline void pygen_twister_by_array(uint32_t *mt, const uint32_t *key, uint32_t n) {
  pygen_twister(mt, 19650218u);
  uint32_t i = 1, j = 0;
  for (uint32_t k = PYGEN_MT_N > n ? PYGEN_MT_N : n; k; k--) {
    mt[i] = (mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1664525u)) + key[j] + j;
    if (++i >= PYGEN_MT_N) mt[0] = mt[PYGEN_MT_N - 1], i = 1;
    if (++j >= n) j = 0;
  }
  for (uint32_t k = PYGEN_MT_N - 1; k; k--) {
    mt[i] = (mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1566083941u)) - i;
    if (++i >= PYGEN_MT_N) mt[0] = mt[PYGEN_MT_N - 1], i = 1;
  }
  mt[0] = 0x80000000u;
}

static inline void pygen_le_put(uint8_t *p, uint64_t v, int n) {
  for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* What random.seed(seed), np.random.seed(seed) and torch.manual_seed(seed) leave. */
static inline void py_generators_seed(py_generators *g, uint32_t seed) {
  uint32_t mt[PYGEN_MT_N];
  pygen_twister_by_array(mt, &seed, 1);
  for (int i = 0; i < PYGEN_MT_N; i++) g->python[i] = mt[i];
  g->python[PYGEN_MT_N] = PYGEN_MT_N;
  pygen_twister(mt, seed);
  for (int i = 0; i < PYGEN_MT_N; i++) g->numpy[i] = mt[i];
  /* torch.get_rng_state() after torch.manual_seed(seed): its CPU generator's legacy state,
   * little-endian: u64 initial seed, i32 left = 1, i32 seeded = 1, u64 next = 0, u64 [624] the
   * words, then the normal-sample caches (40 zero bytes). */
  memset(g->torch, 0, sizeof g->torch);
  pygen_le_put(g->torch, seed, 8);
  pygen_le_put(g->torch + 8, 1, 4);
  pygen_le_put(g->torch + 12, 1, 4);
  for (int i = 0; i < PYGEN_MT_N; i++) pygen_le_put(g->torch + 24 + 8 * i, mt[i], 8);
}

static inline ks_status pygen_put(ks_statedict *dst, const char *prefix, const char *name, ks_dtype dt, int64_t n,
                                  void *data, ks_error *err) {
  char k[256];
  ks_tensor t;
  snprintf(k, sizeof k, "%s%s", prefix, name);
  ks_status s = ks_tensor_init(&t, dt, 1, &n, data);
  return s ? s : ks_statedict_set_tensor(dst, k, &t, KS_COPY, err);
}

/* ks_stateful.to_state_dict: the entries the Python package writes, in its order. */
static inline ks_status py_generators_save(void *ctx, ks_statedict *dst, const char *prefix, ks_error *err) {
  py_generators *g = ctx;
  char k[256];
#define PYGEN_KEY(name) (snprintf(k, sizeof k, "%s%s", prefix, name), k)
  ks_status s = ks_statedict_set_int(dst, PYGEN_KEY("python/version"), 3, err);
  if (!s) s = pygen_put(dst, prefix, "python/state", KS_I64, PYGEN_MT_N + 1, g->python, err);
  if (!s) s = ks_statedict_set_null(dst, PYGEN_KEY("python/gauss_next"), err);
  if (!s) s = ks_statedict_set_string(dst, PYGEN_KEY("numpy/kind"), "MT19937", err);
  if (!s) s = pygen_put(dst, prefix, "numpy/keys", KS_I64, PYGEN_MT_N, g->numpy, err);
  if (!s) s = ks_statedict_mark_leaf(dst, PYGEN_KEY("numpy/keys"), KS_LEAF_NDARRAY, err); /* an ndarray in Python */
  if (!s) s = ks_statedict_set_int(dst, PYGEN_KEY("numpy/pos"), PYGEN_MT_N, err);
  if (!s) s = ks_statedict_set_int(dst, PYGEN_KEY("numpy/has_gauss"), 0, err);
  if (!s) s = ks_statedict_set_float(dst, PYGEN_KEY("numpy/cached_gaussian"), 0.0, err);
  if (!s) s = pygen_put(dst, prefix, "torch", KS_U8, PYGEN_TORCH_BYTES, g->torch, err);
#undef PYGEN_KEY
  return s;
}

/* Reads one generator's words back: I64 [n] or U8 [n], as py_generators_save writes them. */
static inline ks_status pygen_get(const ks_statedict *src, const char *prefix, const char *name, ks_dtype dt,
                                  int64_t n, void *out, ks_error *err) {
  char k[256];
  snprintf(k, sizeof k, "%s%s", prefix, name);
  const ks_tensor *t = ks_statedict_tensor(src, k);
  if (!t || t->dtype != dt || t->rank != 1 || t->shape[0] != n) {
    if (err) snprintf(err->message, sizeof err->message, "generator state '%s' is missing or of another shape", k);
    return KS_E_MISMATCH;
  }
  memcpy(out, t->data, t->nbytes);
  return KS_OK;
}

/* ks_stateful.load_state_dict: all or nothing. */
static inline ks_status py_generators_load(void *ctx, const ks_statedict *src, const char *prefix, ks_error *err) {
  py_generators *g = ctx, tmp;
  ks_status s = pygen_get(src, prefix, "python/state", KS_I64, PYGEN_MT_N + 1, tmp.python, err);
  if (!s) s = pygen_get(src, prefix, "numpy/keys", KS_I64, PYGEN_MT_N, tmp.numpy, err);
  if (!s) s = pygen_get(src, prefix, "torch", KS_U8, PYGEN_TORCH_BYTES, tmp.torch, err);
  if (!s) *g = tmp;
  return s;
}

#endif
