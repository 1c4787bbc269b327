/* Growing public structs (export.h): reading a caller's layout into this library's. */
#include <string.h>

#include "core/internal.h"

ks_status ks__struct_in(void *dst, size_t dst_size, const void *src, size_t v1_size) {
  memset(dst, 0, dst_size);
  if (!src) return KS_OK;
  size_t n;
  memcpy(&n, src, sizeof n);
  if (n == 0) n = dst_size; /* unset: the caller was built against this library's own headers */
  if (n < v1_size) return KS_E_INVALID;
  /* A newer caller: the members this library does not know must be unset. */
  const unsigned char *p = src;
  for (size_t i = dst_size; i < n; i++)
    if (p[i]) return KS_E_INVALID;
  memcpy(dst, src, n < dst_size ? n : dst_size);
  return KS_OK;
}
