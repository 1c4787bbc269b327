/**
 * @file dtype.h
 * Element types: every safetensors dtype, with names, sizes and conversions.
 * All functions are pure and thread safe.
 */
#ifndef KEEPSAKE_DTYPE_H
#define KEEPSAKE_DTYPE_H

#include "keepsake/export.h"

#include <stddef.h>
#include <stdint.h>

#include "keepsake/status.h"

KS_BEGIN_DECLS

/** Element type. Values are stable (stored in no file, but kept fixed anyway): new dtypes are
 *  appended, and KS_DTYPE_COUNT grows with them. */
typedef enum ks_dtype {
  KS_BOOL = 0,
  KS_U8 = 1,
  KS_I8 = 2,
  KS_U16 = 3,
  KS_I16 = 4,
  KS_U32 = 5,
  KS_I32 = 6,
  KS_U64 = 7,
  KS_I64 = 8,
  KS_F16 = 9,
  KS_BF16 = 10,
  KS_F32 = 11,
  KS_F64 = 12,
  KS_F8_E4M3 = 13,
  KS_F8_E5M2 = 14,
  KS_C64 = 15,         /**< complex64: an F32 real part, then an F32 imaginary part (8 bytes) */
  KS_F8_E4M3FNUZ = 16, /**< FP8 E4M3 FNUZ: bias 8, max 240, no inf, no -0, NaN is 0x80 only */
  KS_F8_E5M2FNUZ = 17, /**< FP8 E5M2 FNUZ: bias 16, max 57344, no inf, no -0, NaN is 0x80 only */
  KS_DTYPE_COUNT = 18
} ks_dtype;

/** Size of one element in bytes; 0 for an invalid dtype. */
size_t ks_dtype_size(ks_dtype dt);

/** The safetensors name ("F32", "BF16", "F8_E4M3", "C64"...); "?" for an invalid dtype. */
const char *ks_dtype_name(ks_dtype dt);

/**
 * Parses a safetensors dtype name (exact, case-sensitive).
 * @param name bytes of the name, not necessarily NUL-terminated.
 * @param len  length of name.
 * @param out  receives the dtype on success; untouched on failure.
 * @return KS_OK or KS_E_DTYPE for an unknown name.
 */
KS_NODISCARD ks_status ks_dtype_parse(const char *name, size_t len, ks_dtype *out);

/** Nonzero when dt is a real floating type (F16, BF16, F32, F64, F8_*). C64 is not: see
 *  ks_dtype_is_complex. */
int ks_dtype_is_float(ks_dtype dt);

/** Nonzero when dt is a complex type (C64). */
int ks_dtype_is_complex(ks_dtype dt);

/**
 * Nonzero when a value of `from` always fits in `to` exactly (a widening). Every dtype widens
 * to itself. C64 widens to nothing else, and nothing else widens to C64 (ks_dtype_convert
 * does not mix complex and real). F8_E4M3FNUZ and F8_E5M2FNUZ widen to F16, BF16, F32, F64.
 */
int ks_dtype_widens_to(ks_dtype from, ks_dtype to);

/*
 * Element access. A complex element (C64) has no single real value: ks_dtype_get_f64 returns
 * NaN and ks_dtype_get_i64 0 for it, and the setters leave it unchanged. Read its two F32
 * parts directly (or with ks_dtype_get_f64(KS_F32, data, 2 * i) and 2 * i + 1).
 *
 * The float formats (in ks_dtype_set_f64 and ks_dtype_convert; a double is first rounded to
 * float32, then to the format, round to nearest even; every format widens exactly to
 * float32, so the decode is exact):
 *  - F16: IEEE binary16; NaN and inf preserved.
 *  - BF16: bfloat16; NaN stays NaN.
 *  - F8_E4M3 (E4M3FN): no inf; NaN is S.1111.111; max 448; values that round past 448, and
 *    inf, become NaN, as in PyTorch and ml_dtypes.
 *  - F8_E5M2: IEEE-like, with inf and NaN.
 *  - F8_E4M3FNUZ, F8_E5M2FNUZ: as PyTorch converts them: NaN, inf and values that round past
 *    the largest finite value (240, 57344) become 0x80 (NaN); -0.0, and negative values that
 *    round to zero, become 0x00.
 * To convert one float32 `f` to F16 bits: `uint8_t h[2]; ks_dtype_set_f64(KS_F16, h, 0, f);`
 * (little-endian bytes); back: `ks_dtype_get_f64(KS_F16, h, 0)`.
 */
/** Reads element `i` of a little-endian buffer of dtype dt as a double. */
double ks_dtype_get_f64(ks_dtype dt, const void *data, size_t i);
/** Reads element `i` as int64 (floats truncate toward zero, NaN gives 0). */
int64_t ks_dtype_get_i64(ks_dtype dt, const void *data, size_t i);
/** Writes element `i` from a double (rounded as the dtype's conversion does). */
void ks_dtype_set_f64(ks_dtype dt, void *data, size_t i, double v);
/** Writes element `i` from an int64 (exact when representable). */
void ks_dtype_set_i64(ks_dtype dt, void *data, size_t i, int64_t v);

/**
 * Converts n elements from src (dtype sdt) to dst (dtype ddt). Buffers must not
 * overlap unless ddt == sdt. Integer to integer conversions go through int64 so
 * they are exact where representable; anything involving floats goes through
 * double (F16/BF16/F8 round to nearest even). C64 converts only to C64 (a copy).
 * @return KS_OK, or KS_E_DTYPE for an invalid dtype or a conversion between C64 and a real
 *         dtype (nothing is written then).
 */
KS_NODISCARD ks_status ks_dtype_convert(ks_dtype ddt, void *dst, ks_dtype sdt, const void *src, size_t n);

KS_END_DECLS
#endif
