#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/internal.h"
#include "keepsake/status.h"

const char *ks_strerror(ks_status code) {
  switch (code) {
#define KS__STATUS_TEXT(name, num, text) \
  case num:                              \
    return text;
    KS_STATUS_LIST(KS__STATUS_TEXT)
#undef KS__STATUS_TEXT
    default:
      return "unknown status";
  }
}

const char *ks_status_name(ks_status code) {
  switch (code) {
#define KS__STATUS_NAME(name, num, text) \
  case num:                              \
    return #name;
    KS_STATUS_LIST(KS__STATUS_NAME)
#undef KS__STATUS_NAME
    default:
      return "KS_E_UNKNOWN";
  }
}

void ks_error_clear(ks_error *err) {
  if (!err) return;
  memset(err, 0, sizeof *err);
  err->offset = -1;
}

static void copy_where(char *dst, const char *src) {
  if (!src) return;
  snprintf(dst, KS_ERROR_WHERE_MAX, "%s", src);
}

KS__PRINTF(3, 0) static void verr(ks_error *err, ks_status code, const char *fmt, va_list ap) {
  err->code = code;
  vsnprintf(err->message, sizeof err->message, fmt, ap);
}

ks_status ks__err(ks_error *err, ks_status code, const char *fmt, ...) {
  if (!err) return code;
  ks_error_clear(err);
  va_list ap;
  va_start(ap, fmt);
  verr(err, code, fmt, ap);
  va_end(ap);
  return code;
}

ks_status ks__err_at(ks_error *err, ks_status code, const char *file, const char *key, int64_t offset,
                     const char *fmt, ...) {
  if (!err) return code;
  ks_error_clear(err);
  va_list ap;
  va_start(ap, fmt);
  verr(err, code, fmt, ap);
  va_end(ap);
  copy_where(err->file, file);
  copy_where(err->key, key);
  err->offset = offset;
  return code;
}

void ks__err_set_file(ks_error *err, const char *file) {
  if (err && err->file[0] == '\0') copy_where(err->file, file);
}

void ks__err_set_key(ks_error *err, const char *key) {
  if (err && err->key[0] == '\0') copy_where(err->key, key);
}

char *ks_error_format(const ks_error *err, char *buf, size_t cap) {
  if (cap == 0) return buf;
  buf[0] = '\0';
  if (!err) return buf;
  size_t used = 0;
  int n;
#define KS__APPEND(...)                                          \
  do {                                                           \
    n = snprintf(buf + used, cap - used, __VA_ARGS__);           \
    if (n > 0) used += (size_t)n < cap - used ? (size_t)n : cap - used - 1; \
  } while (0)
  if (err->file[0]) KS__APPEND("%s: ", err->file);
  if (err->key[0]) KS__APPEND("'%s': ", err->key);
  if (err->offset >= 0) KS__APPEND("at byte %lld: ", (long long)err->offset);
  KS__APPEND("%s (%s)", err->message[0] ? err->message : ks_strerror(err->code),
             ks_status_name(err->code));
#undef KS__APPEND
  return buf;
}
