/* Prefixed keys and typed scalar reads used by every state component. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/keys.h"

ks_status ks__key(char *buf, const char *prefix, const char *name) {
  return ks__keyf(buf, prefix, "%s", name);
}

ks_status ks__keyf(char *buf, const char *prefix, const char *fmt, ...) {
  int n = snprintf(buf, KS__KEY_MAX + 1, "%s", prefix);
  if (n < 0 || n > KS__KEY_MAX) return KS_E_LIMIT;
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(buf + n, (size_t)(KS__KEY_MAX + 1 - n), fmt, ap);
  va_end(ap);
  if (m < 0 || m > KS__KEY_MAX - n) return KS_E_LIMIT;
  return KS_OK;
}

ks_status ks__key_limit(ks_error *err, const char *prefix, const char *name) {
  size_t n = strlen(prefix) + strlen(name);
  return ks__err_at(err, KS_E_LIMIT, NULL, prefix, -1,
                    "key '%.200s...%.100s' would be %zu bytes or more; at most %d (KS_MAX_NAME)", prefix, name, n,
                    KS_MAX_NAME);
}

ks_status ks__key_err(char *buf, const char *prefix, const char *name, ks_error *err) {
  return ks__key(buf, prefix, name) ? ks__key_limit(err, prefix, name) : KS_OK;
}

ks_status ks__put_int(ks_statedict *dst, const char *prefix, const char *name, int64_t v, ks_error *err) {
  char k[KS__KEY_MAX + 1];
  ks_status s = ks__key_err(k, prefix, name, err);
  return s ? s : ks_statedict_set_int(dst, k, v, err);
}

ks_status ks__put_float(ks_statedict *dst, const char *prefix, const char *name, double v, ks_error *err) {
  char k[KS__KEY_MAX + 1];
  ks_status s = ks__key_err(k, prefix, name, err);
  return s ? s : ks_statedict_set_float(dst, k, v, err);
}

static KS_NODISCARD ks_status lookup(const ks_statedict *src, const char *prefix, const char *name, ks_entry *e,
                        char *k, ks_error *err) {
  if (ks__key(k, prefix, name)) return ks__key_limit(err, prefix, name);
  if (ks_statedict_get(src, k, e) != KS_OK)
    return ks__err_at(err, KS_E_NOTFOUND, NULL, k, -1, "missing entry '%s'", k);
  return KS_OK;
}

static int scalar_tensor(const ks_entry *e) {
  return e->kind == KS_VAL_TENSOR && ks_tensor_numel(&e->tensor) == 1 && e->tensor.data != NULL;
}

ks_status ks__get_int(const ks_statedict *src, const char *prefix, const char *name, int64_t *out,
                      ks_error *err) {
  char k[KS__KEY_MAX + 1];
  ks_entry e;
  ks_status s = lookup(src, prefix, name, &e, k, err);
  if (s) return s;
  if (e.kind == KS_VAL_INT || e.kind == KS_VAL_BOOL) {
    *out = e.i;
    return KS_OK;
  }
  if (scalar_tensor(&e) && !ks_dtype_is_float(e.tensor.dtype) && !ks_dtype_is_complex(e.tensor.dtype)) {
    *out = ks_dtype_get_i64(e.tensor.dtype, e.tensor.data, 0);
    return KS_OK;
  }
  return ks__err_at(err, KS_E_VALUE, NULL, k, -1, "'%s': expected an integer", k);
}

ks_status ks__get_float(const ks_statedict *src, const char *prefix, const char *name, double *out,
                        ks_error *err) {
  char k[KS__KEY_MAX + 1];
  ks_entry e;
  ks_status s = lookup(src, prefix, name, &e, k, err);
  if (s) return s;
  if (e.kind == KS_VAL_FLOAT) *out = e.f;
  else if (e.kind == KS_VAL_INT) *out = (double)e.i;
  else if (scalar_tensor(&e) && !ks_dtype_is_complex(e.tensor.dtype))
    *out = ks_dtype_get_f64(e.tensor.dtype, e.tensor.data, 0);
  else return ks__err_at(err, KS_E_VALUE, NULL, k, -1, "'%s': expected a number", k);
  return KS_OK;
}
