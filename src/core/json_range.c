/*
 * Which JSON numbers the reference safetensors reader refuses as "number out
 * of range". Its JSON parser (serde_json, default features) reads every number
 * that is not a plain 64-bit integer into an f64 as (u64 significand) x 10^exp
 * and fails when that product is infinite. Headers may carry any number in a
 * field readers ignore, so keepsake mirrors that computation step for step:
 * the same digits dropped, the same saturating exponent, the same one
 * multiplication, and therefore the same answer right at the boundary
 * (1.7976931348623157e308 is read, 1.7976931348623158e308 is refused).
 */
#include <math.h>

#include "core/json.h"

#define E(x) 1e##x
#define R10(p) E(p##0), E(p##1), E(p##2), E(p##3), E(p##4), E(p##5), E(p##6), E(p##7), E(p##8), E(p##9)
/* 1e0 .. 1e308, each the correctly rounded double, as in serde_json's table. */
static const double POW10[309] = {
    E(0),    E(1),    E(2),    E(3),    E(4),    E(5),    E(6),    E(7),    E(8),    E(9),    R10(1),
    R10(2),  R10(3),  R10(4),  R10(5),  R10(6),  R10(7),  R10(8),  R10(9),  R10(10), R10(11), R10(12),
    R10(13), R10(14), R10(15), R10(16), R10(17), R10(18), R10(19), R10(20), R10(21), R10(22), R10(23),
    R10(24), R10(25), R10(26), R10(27), R10(28), R10(29), E(300),  E(301),  E(302),  E(303),  E(304),
    E(305),  E(306),  E(307),  E(308)};

static bool digit_at(const uint8_t *s, size_t n, size_t i) { return i < n && s[i] >= '0' && s[i] <= '9'; }

/* True when a * 10 + d does not fit in 64 bits (serde_json's overflow! test). */
static bool u64_step_overflows(uint64_t a, unsigned d) {
  return a >= UINT64_MAX / 10 && (a > UINT64_MAX / 10 || d > UINT64_MAX % 10);
}

static int32_t sat_add(int32_t a, int64_t b) {
  int64_t s = (int64_t)a + b;
  return s > INT32_MAX ? INT32_MAX : s < INT32_MIN ? INT32_MIN : (int32_t)s;
}

/* Integer digits: accumulate until the next digit would overflow, then count the rest as exponent. */
static size_t int_part(const uint8_t *s, size_t n, size_t i, uint64_t *sig, int32_t *exp, bool *is_float) {
  for (; digit_at(s, n, i); i++) {
    unsigned d = (unsigned)(s[i] - '0');
    if (u64_step_overflows(*sig, d)) {
      *is_float = true;
      for (; digit_at(s, n, i); i++) *exp = sat_add(*exp, 1);
      return i;
    }
    *sig = *sig * 10 + d;
  }
  return i;
}

/* Fraction digits join the significand while they fit; the rest are dropped. */
static size_t frac_part(const uint8_t *s, size_t n, size_t i, uint64_t *sig, int32_t *exp) {
  int64_t after = 0;
  for (; digit_at(s, n, i); i++) {
    unsigned d = (unsigned)(s[i] - '0');
    if (u64_step_overflows(*sig, d)) {
      while (digit_at(s, n, i)) i++;
      break;
    }
    *sig = *sig * 10 + d;
    after--;
  }
  *exp = sat_add(*exp, after);
  return i;
}

/* The exponent; returns -1 (out of range) or 0 (in range) when its digits overflow an i32, else 1. */
static int exp_part(const uint8_t *s, size_t n, size_t i, uint64_t sig, int32_t *exp) {
  bool positive = true;
  if (i < n && (s[i] == '+' || s[i] == '-')) positive = s[i++] == '+';
  int32_t e = 0;
  for (; digit_at(s, n, i); i++) {
    int32_t d = s[i] - '0';
    if (e >= INT32_MAX / 10 && (e > INT32_MAX / 10 || d > INT32_MAX % 10)) return sig != 0 && positive ? -1 : 0;
    e = e * 10 + d;
  }
  *exp = sat_add(*exp, positive ? (int64_t)e : -(int64_t)e);
  return 1;
}

bool ks__json_number_out_of_range(const uint8_t *s, size_t n) {
  size_t i = s[0] == '-';
  uint64_t sig = 0;
  int32_t exp = 0;
  bool is_float = false;
  i = int_part(s, n, i, &sig, &exp, &is_float);
  if (i < n && s[i] == '.') is_float = true, i = frac_part(s, n, i + 1, &sig, &exp);
  if (i < n && (s[i] == 'e' || s[i] == 'E')) {
    is_float = true;
    int r = exp_part(s, n, i + 1, sig, &exp);
    if (r <= 0) return r < 0;
  }
  if (!is_float || exp < 0) return false; /* integers that fit are exact; division never overflows */
  if (exp > 308) return sig != 0;
  return isinf((double)sig * POW10[exp]);
}
