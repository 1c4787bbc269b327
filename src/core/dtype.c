#include <math.h>
#include <string.h>

#include "core/internal.h"
#include "keepsake/dtype.h"

typedef struct dtype_info {
  const char *name;
  size_t size;
  int is_float; /* 1 real floating point, 2 complex */
} dtype_info;

static const dtype_info infos[KS_DTYPE_COUNT] = {
    [KS_BOOL] = {"BOOL", 1, 0},    [KS_U8] = {"U8", 1, 0},        [KS_I8] = {"I8", 1, 0},
    [KS_U16] = {"U16", 2, 0},      [KS_I16] = {"I16", 2, 0},      [KS_U32] = {"U32", 4, 0},
    [KS_I32] = {"I32", 4, 0},      [KS_U64] = {"U64", 8, 0},      [KS_I64] = {"I64", 8, 0},
    [KS_F16] = {"F16", 2, 1},      [KS_BF16] = {"BF16", 2, 1},    [KS_F32] = {"F32", 4, 1},
    [KS_F64] = {"F64", 8, 1},      [KS_F8_E4M3] = {"F8_E4M3", 1, 1},
    [KS_F8_E5M2] = {"F8_E5M2", 1, 1},  [KS_C64] = {"C64", 8, 2},
    [KS_F8_E4M3FNUZ] = {"F8_E4M3FNUZ", 1, 1},
    [KS_F8_E5M2FNUZ] = {"F8_E5M2FNUZ", 1, 1},
};

static int valid(ks_dtype dt) { return (unsigned)dt < KS_DTYPE_COUNT; }

size_t ks_dtype_size(ks_dtype dt) { return valid(dt) ? infos[dt].size : 0; }

const char *ks_dtype_name(ks_dtype dt) { return valid(dt) ? infos[dt].name : "?"; }

int ks_dtype_is_float(ks_dtype dt) { return valid(dt) && infos[dt].is_float == 1; }

int ks_dtype_is_complex(ks_dtype dt) { return valid(dt) && infos[dt].is_float == 2; }

ks_status ks_dtype_parse(const char *name, size_t len, ks_dtype *out) {
  for (int i = 0; i < KS_DTYPE_COUNT; i++) {
    if (strlen(infos[i].name) == len && memcmp(infos[i].name, name, len) == 0) {
      *out = (ks_dtype)i;
      return KS_OK;
    }
  }
  return KS_E_DTYPE;
}

/* Exactness table: bit i of widen_mask[from] is set when `from` fits in dtype i. Every 8-bit
 * row is checked against a conversion of all 256 values in tests/unit/test_dtypes_new.c. */
#define B(x) (1u << (x))
#define REALS (((1u << KS_DTYPE_COUNT) - 1u) & ~B(KS_C64))
static const unsigned widen_mask[KS_DTYPE_COUNT] = {
    [KS_BOOL] = REALS, /* 0 and 1: every real dtype; not C64, which converts to nothing else */
    [KS_U8] = B(KS_U8) | B(KS_U16) | B(KS_I16) | B(KS_U32) | B(KS_I32) | B(KS_U64) | B(KS_I64) |
              B(KS_F16) | B(KS_BF16) | B(KS_F32) | B(KS_F64),
    [KS_I8] = B(KS_I8) | B(KS_I16) | B(KS_I32) | B(KS_I64) | B(KS_F16) | B(KS_BF16) | B(KS_F32) |
              B(KS_F64),
    [KS_U16] = B(KS_U16) | B(KS_U32) | B(KS_I32) | B(KS_U64) | B(KS_I64) | B(KS_F32) | B(KS_F64),
    [KS_I16] = B(KS_I16) | B(KS_I32) | B(KS_I64) | B(KS_F32) | B(KS_F64),
    [KS_U32] = B(KS_U32) | B(KS_U64) | B(KS_I64) | B(KS_F64),
    [KS_I32] = B(KS_I32) | B(KS_I64) | B(KS_F64),
    [KS_U64] = B(KS_U64),
    [KS_I64] = B(KS_I64),
    [KS_F16] = B(KS_F16) | B(KS_F32) | B(KS_F64),
    [KS_BF16] = B(KS_BF16) | B(KS_F32) | B(KS_F64),
    [KS_F32] = B(KS_F32) | B(KS_F64),
    [KS_F64] = B(KS_F64),
    [KS_F8_E4M3] = B(KS_F8_E4M3) | B(KS_F16) | B(KS_BF16) | B(KS_F32) | B(KS_F64),
    [KS_F8_E5M2] = B(KS_F8_E5M2) | B(KS_F16) | B(KS_BF16) | B(KS_F32) | B(KS_F64),
    [KS_C64] = B(KS_C64),
    /* Not to F8_E4M3 (no 2^-10) or F8_E5M2 (no 2^-17): FNUZ has one more exponent below. */
    [KS_F8_E4M3FNUZ] = B(KS_F8_E4M3FNUZ) | B(KS_F16) | B(KS_BF16) | B(KS_F32) | B(KS_F64),
    [KS_F8_E5M2FNUZ] = B(KS_F8_E5M2FNUZ) | B(KS_F16) | B(KS_BF16) | B(KS_F32) | B(KS_F64),
};
#undef REALS
#undef B

int ks_dtype_widens_to(ks_dtype from, ks_dtype to) {
  if (!valid(from) || !valid(to)) return 0;
  return (widen_mask[from] >> to) & 1u;
}

/* What a small float format does with its special values. */
typedef enum mf_kind {
  MF_IEEE, /* top exponent is inf/NaN; -0 exists */
  MF_FN,   /* e4m3fn: no inf, only S.1111.111 is NaN; -0 exists */
  MF_FNUZ  /* no inf, no -0: 1.0000.000 (the negative zero pattern) is the only NaN */
} mf_kind;

/* A small binary float format: ebits exponent bits, mbits mantissa bits, exponent bias. */
typedef struct minifloat {
  int ebits, mbits, bias;
  mf_kind kind;
} minifloat;

static const minifloat fmt_f16 = {5, 10, 15, MF_IEEE};
static const minifloat fmt_e4m3 = {4, 3, 7, MF_FN};
static const minifloat fmt_e5m2 = {5, 2, 15, MF_IEEE};
static const minifloat fmt_e4m3fnuz = {4, 3, 8, MF_FNUZ};
static const minifloat fmt_e5m2fnuz = {5, 2, 16, MF_FNUZ};

static uint32_t mf_sign(const minifloat *f) { return 1u << (f->ebits + f->mbits); }

static uint32_t mf_nan(const minifloat *f) { return f->kind == MF_FNUZ ? mf_sign(f) : mf_sign(f) - 1u; }

static uint32_t mf_overflow(const minifloat *f) {
  return f->kind == MF_IEEE ? ((1u << f->ebits) - 1u) << f->mbits : mf_nan(f);
}

/* Largest finite exponent (unbiased): IEEE formats keep the top exponent for inf and NaN. */
static int mf_emax(const minifloat *f) {
  int top = (1 << f->ebits) - 1;
  return (f->kind == MF_IEEE ? top - 1 : top) - f->bias;
}

static uint32_t mf_encode_abs(const minifloat *f, double a) {
  int bias = f->bias, emin = 1 - bias;
  uint32_t one = 1u << f->mbits;
  int e;
  frexp(a, &e);
  e -= 1; /* a = m * 2^e with m in [1,2) */
  if (e < emin) return (uint32_t)nearbyint(ldexp(a, f->mbits - emin)); /* may carry into normal */
  double q = nearbyint(ldexp(a, f->mbits - e));
  if (q >= (double)(2u * one)) {
    q = one;
    e++;
  }
  if (e > mf_emax(f)) return mf_overflow(f);
  uint32_t bits = ((uint32_t)(e + bias) << f->mbits) | ((uint32_t)q - one);
  if (f->kind == MF_FN && bits >= mf_nan(f)) return mf_nan(f);
  return bits;
}

static uint32_t mf_encode(const minifloat *f, double v) {
  uint32_t sign = signbit(v) ? mf_sign(f) : 0u;
  if (f->kind == MF_FNUZ) { /* one NaN, no -0: the sign goes only on nonzero finite values */
    if (isnan(v) || isinf(v)) return mf_nan(f);
    uint32_t a = v == 0 ? 0u : mf_encode_abs(f, fabs(v));
    return a == 0 || a == mf_nan(f) ? a : sign | a;
  }
  if (isnan(v)) return sign | mf_nan(f);
  if (isinf(v)) return sign | mf_overflow(f);
  if (v == 0) return sign;
  return sign | mf_encode_abs(f, fabs(v));
}

static double mf_decode(const minifloat *f, uint32_t bits) {
  int bias = f->bias;
  uint32_t mant = bits & ((1u << f->mbits) - 1u);
  uint32_t exp = (bits >> f->mbits) & ((1u << f->ebits) - 1u);
  int neg = (bits >> (f->ebits + f->mbits)) & 1u;
  double v;
  if (f->kind == MF_IEEE && exp == (1u << f->ebits) - 1u)
    v = mant ? NAN : INFINITY;
  else if (f->kind == MF_FN && (bits & mf_nan(f)) == mf_nan(f))
    v = NAN;
  else if (f->kind == MF_FNUZ && bits == mf_nan(f))
    v = NAN;
  else if (exp == 0)
    v = ldexp((double)mant, 1 - bias - f->mbits);
  else
    v = ldexp((double)(mant | (1u << f->mbits)), (int)exp - bias - f->mbits);
  return neg ? -v : v;
}

static uint16_t f32_to_f16(float f) { return (uint16_t)mf_encode(&fmt_f16, f); }
static float f16_to_f32(uint16_t h) { return (float)mf_decode(&fmt_f16, h); }
static uint8_t f32_to_f8e4m3(float f) { return (uint8_t)mf_encode(&fmt_e4m3, f); }
static float f8e4m3_to_f32(uint8_t v) { return (float)mf_decode(&fmt_e4m3, v); }
static uint8_t f32_to_f8e5m2(float f) { return (uint8_t)mf_encode(&fmt_e5m2, f); }
static float f8e5m2_to_f32(uint8_t v) { return (float)mf_decode(&fmt_e5m2, v); }
static uint8_t f32_to_f8e4m3fnuz(float f) { return (uint8_t)mf_encode(&fmt_e4m3fnuz, f); }
static float f8e4m3fnuz_to_f32(uint8_t v) { return (float)mf_decode(&fmt_e4m3fnuz, v); }
static uint8_t f32_to_f8e5m2fnuz(float f) { return (uint8_t)mf_encode(&fmt_e5m2fnuz, f); }
static float f8e5m2fnuz_to_f32(uint8_t v) { return (float)mf_decode(&fmt_e5m2fnuz, v); }

static uint16_t f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
  u += 0x7FFFu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static float bf16_to_f32(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static float load_f32(const uint8_t *p) {
  uint32_t u = ks__le32(p);
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static double load_f64(const uint8_t *p) {
  uint64_t u = ks__le64(p);
  double d;
  memcpy(&d, &u, 8);
  return d;
}

double ks_dtype_get_f64(ks_dtype dt, const void *data, size_t i) {
  const uint8_t *p = (const uint8_t *)data + i * ks_dtype_size(dt);
  switch (dt) {
    case KS_BOOL: return p[0] ? 1.0 : 0.0;
    case KS_U8: return p[0];
    case KS_I8: return (int8_t)p[0];
    case KS_U16: return ks__le16(p);
    case KS_I16: return (int16_t)ks__le16(p);
    case KS_U32: return ks__le32(p);
    case KS_I32: return (int32_t)ks__le32(p);
    case KS_U64: return (double)ks__le64(p);
    case KS_I64: return (double)(int64_t)ks__le64(p);
    case KS_F16: return f16_to_f32(ks__le16(p));
    case KS_BF16: return bf16_to_f32(ks__le16(p));
    case KS_F32: return load_f32(p);
    case KS_F64: return load_f64(p);
    case KS_F8_E4M3: return f8e4m3_to_f32(p[0]);
    case KS_F8_E5M2: return f8e5m2_to_f32(p[0]);
    case KS_F8_E4M3FNUZ: return f8e4m3fnuz_to_f32(p[0]);
    case KS_F8_E5M2FNUZ: return f8e5m2fnuz_to_f32(p[0]);
    case KS_C64: return NAN; /* a complex element has no single real value */
    default: return 0.0;
  }
}

/* Double to int64 without undefined behaviour: NaN is 0, out of range saturates. */
static int64_t f64_to_i64(double v) {
  if (isnan(v)) return 0;
  if (v >= 9223372036854775807.0) return INT64_MAX;
  if (v <= -9223372036854775808.0) return INT64_MIN;
  return (int64_t)v;
}

int64_t ks_dtype_get_i64(ks_dtype dt, const void *data, size_t i) {
  const uint8_t *p = (const uint8_t *)data + i * ks_dtype_size(dt);
  switch (dt) {
    case KS_BOOL: return p[0] ? 1 : 0;
    case KS_U8: return p[0];
    case KS_I8: return (int8_t)p[0];
    case KS_U16: return ks__le16(p);
    case KS_I16: return (int16_t)ks__le16(p);
    case KS_U32: return ks__le32(p);
    case KS_I32: return (int32_t)ks__le32(p);
    case KS_U64: return (int64_t)ks__le64(p);
    case KS_I64: return (int64_t)ks__le64(p);
    default: return f64_to_i64(ks_dtype_get_f64(dt, data, i));
  }
}

static int64_t clamp_i64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }

void ks_dtype_set_i64(ks_dtype dt, void *data, size_t i, int64_t v) {
  uint8_t *p = (uint8_t *)data + i * ks_dtype_size(dt);
  switch (dt) {
    case KS_BOOL: p[0] = v != 0; break;
    case KS_U8: p[0] = (uint8_t)v; break;
    case KS_I8: p[0] = (uint8_t)(int8_t)v; break;
    case KS_U16: ks__put_le16(p, (uint16_t)v); break;
    case KS_I16: ks__put_le16(p, (uint16_t)(int16_t)v); break;
    case KS_U32: ks__put_le32(p, (uint32_t)v); break;
    case KS_I32: ks__put_le32(p, (uint32_t)(int32_t)v); break;
    case KS_U64:
    case KS_I64: ks__put_le64(p, (uint64_t)v); break;
    case KS_C64: break; /* left unchanged, as ks_dtype_set_f64 leaves it */
    default: ks_dtype_set_f64(dt, data, i, (double)v); break;
  }
}

void ks_dtype_set_f64(ks_dtype dt, void *data, size_t i, double v) {
  uint8_t *p = (uint8_t *)data + i * ks_dtype_size(dt);
  switch (dt) {
    case KS_BOOL: p[0] = v != 0.0; break; /* NaN is true, as in torch */
    case KS_F16: ks__put_le16(p, f32_to_f16((float)v)); break;
    case KS_BF16: ks__put_le16(p, f32_to_bf16((float)v)); break;
    case KS_F8_E4M3: p[0] = f32_to_f8e4m3((float)v); break;
    case KS_F8_E5M2: p[0] = f32_to_f8e5m2((float)v); break;
    case KS_F8_E4M3FNUZ: p[0] = f32_to_f8e4m3fnuz((float)v); break;
    case KS_F8_E5M2FNUZ: p[0] = f32_to_f8e5m2fnuz((float)v); break;
    case KS_C64: break; /* no real value to write a complex element from: left unchanged */
    case KS_F32: {
      float f = (float)v;
      uint32_t u;
      memcpy(&u, &f, 4);
      ks__put_le32(p, u);
      break;
    }
    case KS_F64: {
      uint64_t u;
      memcpy(&u, &v, 8);
      ks__put_le64(p, u);
      break;
    }
    case KS_U8: p[0] = (uint8_t)clamp_i64(f64_to_i64(v), 0, UINT8_MAX); break;
    case KS_I8: ks_dtype_set_i64(dt, data, i, clamp_i64(f64_to_i64(v), INT8_MIN, INT8_MAX)); break;
    case KS_U16: ks_dtype_set_i64(dt, data, i, clamp_i64(f64_to_i64(v), 0, UINT16_MAX)); break;
    case KS_I16: ks_dtype_set_i64(dt, data, i, clamp_i64(f64_to_i64(v), INT16_MIN, INT16_MAX)); break;
    case KS_U32: ks_dtype_set_i64(dt, data, i, clamp_i64(f64_to_i64(v), 0, UINT32_MAX)); break;
    case KS_I32: ks_dtype_set_i64(dt, data, i, clamp_i64(f64_to_i64(v), INT32_MIN, INT32_MAX)); break;
    case KS_U64:
      ks__put_le64(p, v <= 0 || isnan(v) ? 0 : v >= 18446744073709551616.0 ? UINT64_MAX : (uint64_t)v);
      break;
    case KS_I64: ks_dtype_set_i64(dt, data, i, f64_to_i64(v)); break;
    default: break;
  }
}

ks_status ks_dtype_convert(ks_dtype ddt, void *dst, ks_dtype sdt, const void *src, size_t n) {
  if (!valid(ddt) || !valid(sdt)) return KS_E_DTYPE;
  if (ddt == sdt) {
    if (n) memmove(dst, src, n * ks_dtype_size(sdt));
    return KS_OK;
  }
  if (ks_dtype_is_complex(ddt) || ks_dtype_is_complex(sdt)) return KS_E_DTYPE; /* complex <-> real */
  int ints = !infos[ddt].is_float && !infos[sdt].is_float;
  for (size_t i = 0; i < n; i++) {
    if (ints)
      ks_dtype_set_i64(ddt, dst, i, ks_dtype_get_i64(sdt, src, i));
    else
      ks_dtype_set_f64(ddt, dst, i, ks_dtype_get_f64(sdt, src, i));
  }
  return KS_OK;
}
