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

/** Element type. Values are stable (stored in no file, but kept fixed anyway). */
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
  KS_DTYPE_COUNT = 15
} ks_dtype;

/** Size of one element in bytes; 0 for an invalid dtype. */
size_t ks_dtype_size(ks_dtype dt);

/** The safetensors name ("F32", "BF16", "F8_E4M3"...); "?" for an invalid dtype. */
const char *ks_dtype_name(ks_dtype dt);

/**
 * Parses a safetensors dtype name (exact, case-sensitive).
 * @param name bytes of the name, not necessarily NUL-terminated.
 * @param len  length of name.
 * @param out  receives the dtype on success; untouched on failure.
 * @return KS_OK or KS_E_DTYPE for an unknown name.
 */
KS_NODISCARD ks_status ks_dtype_parse(const char *name, size_t len, ks_dtype *out);

/** Nonzero when dt is a floating type (F16, BF16, F32, F64, F8_*). */
int ks_dtype_is_float(ks_dtype dt);

/** Nonzero when a value of `from` always fits in `to` exactly (a widening). */
int ks_dtype_widens_to(ks_dtype from, ks_dtype to);

/** IEEE binary16 <-> binary32, round to nearest even; NaN and inf preserved. */
uint16_t ks_f32_to_f16(float f);
float ks_f16_to_f32(uint16_t h);
/** bfloat16 <-> binary32, round to nearest even; NaN stays NaN. */
uint16_t ks_f32_to_bf16(float f);
float ks_bf16_to_f32(uint16_t b);
/** FP8 E4M3FN (no inf; NaN is S.1111.111; max 448; values that round past 448,
 *  and inf, become NaN as in PyTorch and ml_dtypes) <-> binary32, round to nearest even. */
uint8_t ks_f32_to_f8e4m3(float f);
float ks_f8e4m3_to_f32(uint8_t v);
/** FP8 E5M2 (IEEE-like, with inf and NaN) <-> binary32, round to nearest even. */
uint8_t ks_f32_to_f8e5m2(float f);
float ks_f8e5m2_to_f32(uint8_t v);

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
 * double (F16/BF16/F8 round to nearest even).
 * @return KS_OK, or KS_E_DTYPE for an invalid dtype.
 */
KS_NODISCARD ks_status ks_dtype_convert(ks_dtype ddt, void *dst, ks_dtype sdt, const void *src, size_t n);

KS_END_DECLS
#endif
