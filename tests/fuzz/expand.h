/*
 * Structure-aware input expansion shared by the pickle-level fuzz targets, so
 * that a small input can reach depth and size limits (tens of thousands of
 * nested levels, megabytes of program) that a 64 KB input never reaches.
 *
 * An input that starts with 0xFE is a template:
 *   0xFE, k, lp, la, lb, lc (one byte each), then P (lp bytes), A (la), B (lb), C (lc), D (the rest)
 * and expands to P + A*r + B + C*r + D with r = 2^(k % 18) (at most 131072 copies),
 * e.g. A = "(" MARK opening a level, C = "t" closing it and D = ".". The expansion is
 * capped at KS_FUZZ_EXPAND_MAX bytes. Any other input is used as it is.
 */
#ifndef KS_FUZZ_EXPAND_H
#define KS_FUZZ_EXPAND_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define KS_FUZZ_EXPAND_MAX ((size_t)8 << 20)

/* *out is data itself (owned = 0) or a malloc'd expansion (owned = 1). Returns 0, or -1 when out of memory. */
static inline int ks_fuzz_expand(const uint8_t *data, size_t size, const uint8_t **out, size_t *len, int *owned) {
  *out = data, *len = size, *owned = 0;
  if (size < 6 || data[0] != 0xFE) return 0;
  size_t r = (size_t)1 << (data[1] % 18), lp = data[2], la = data[3], lb = data[4], lc = data[5];
  const uint8_t *p = data + 6;
  if (lp + la + lb + lc > size - 6) return 0;
  const uint8_t *a = p + lp, *b = a + la, *c = b + lb, *d = c + lc;
  size_t ld = size - 6 - lp - la - lb - lc;
  while (r > 1 && lp + lb + ld + r * (la + lc) > KS_FUZZ_EXPAND_MAX) r /= 2;
  size_t total = lp + lb + ld + r * (la + lc);
  uint8_t *buf = malloc(total ? total : 1), *w = buf;
  if (!buf) return -1;
  memcpy(w, p, lp), w += lp;
  for (size_t i = 0; i < r; i++) memcpy(w, a, la), w += la;
  memcpy(w, b, lb), w += lb;
  for (size_t i = 0; i < r; i++) memcpy(w, c, lc), w += lc;
  memcpy(w, d, ld);
  *out = buf, *len = total, *owned = 1;
  return 0;
}

#endif
