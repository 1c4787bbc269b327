/*
 * xoshiro256** (Blackman & Vigna): small, fast, 256 bits of state that are
 * saved whole, so a resumed run draws exactly the numbers it would have drawn.
 */
#include <math.h>
#include <string.h>

#include "core/keys.h"
#include "keepsake/train.h"

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void ks_rng_seed(ks_rng *r, uint64_t seed) {
  for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

uint64_t ks_rng_next(ks_rng *r) {
  uint64_t *s = r->s;
  uint64_t result = rotl(s[1] * 5, 7) * 9;
  uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

/* Rejection keeps it unbiased: only draws below a multiple of n are used. */
uint64_t ks_rng_below(ks_rng *r, uint64_t n) {
  if (n == 0) return 0;
  uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  for (;;) {
    uint64_t x = ks_rng_next(r);
    if (x < limit) return x % n;
  }
}

double ks_rng_uniform(ks_rng *r) { return (double)(ks_rng_next(r) >> 11) * 0x1p-53; }

double ks_rng_normal(ks_rng *r) {
  double u1 = 1.0 - ks_rng_uniform(r); /* (0, 1]: log never sees 0 */
  double u2 = ks_rng_uniform(r);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

void ks_rng_shuffle(ks_rng *r, int64_t *idx, size_t n) {
  for (size_t i = n; i > 1; i--) {
    size_t j = (size_t)ks_rng_below(r, (uint64_t)i);
    int64_t t = idx[i - 1];
    idx[i - 1] = idx[j];
    idx[j] = t;
  }
}

#define RNG_KEY "xoshiro256starstar"

static KS_NODISCARD ks_status rng_save(void *ctx, ks_statedict *dst, const char *prefix, ks_error *err) {
  const ks_rng *r = ctx;
  if (!r || !dst || !prefix) return ks__err(err, KS_E_INVALID, "rng save: NULL argument");
  char k[KS__KEY_MAX + 1];
  ks_status s = ks__key_err(k, prefix, RNG_KEY, err);
  if (s) return s;
  int64_t shape[1] = {4};
  void *data;
  /* I64 holding the words' bit patterns: torch has no uint64, and a checkpoint must export to .pt. */
  s = ks_statedict_new_tensor(dst, k, KS_I64, 1, shape, &data, err);
  if (s) return s;
  for (int i = 0; i < 4; i++) ks__put_le64((uint8_t *)data + 8 * i, r->s[i]);
  return KS_OK;
}

static KS_NODISCARD ks_status rng_load(void *ctx, const ks_statedict *src, const char *prefix, ks_error *err) {
  ks_rng *r = ctx;
  if (!r || !src || !prefix) return ks__err(err, KS_E_INVALID, "rng load: NULL argument");
  char k[KS__KEY_MAX + 1];
  if (ks__key(k, prefix, RNG_KEY)) return ks__key_limit(err, prefix, RNG_KEY);
  const ks_tensor *t = ks_statedict_tensor(src, k);
  if (!t) return ks__err_at(err, KS_E_NOTFOUND, NULL, k, -1, "missing PRNG state '%s'", k);
  if (t->dtype != KS_U64 && t->dtype != KS_I64)
    return ks__err_at(err, KS_E_DTYPE, NULL, k, -1, "PRNG state: expected I64 (or U64), found %s",
                      ks_dtype_name(t->dtype));
  if (t->rank != 1 || t->shape[0] != 4 || !t->data)
    return ks__err_at(err, KS_E_SHAPE, NULL, k, -1, "PRNG state: expected shape [4]");
  uint64_t s[4];
  for (int i = 0; i < 4; i++) s[i] = ks__le64((const uint8_t *)t->data + 8 * i);
  if ((s[0] | s[1] | s[2] | s[3]) == 0)
    return ks__err_at(err, KS_E_VALUE, NULL, k, -1, "PRNG state is all zero (xoshiro would be stuck)");
  memcpy(r->s, s, sizeof s);
  return KS_OK;
}

ks_stateful ks_rng_stateful(ks_rng *r) {
  return (ks_stateful){.ctx = r, .to_state_dict = rng_save, .load_state_dict = rng_load};
}
