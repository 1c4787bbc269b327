#include <string.h>

#include "core/internal.h"
#include "keepsake/binding.h"
#include "keepsake/statedict.h"

/* Length of the UTF-8 sequence starting with byte b, or 0 when b cannot start one. */
static size_t utf8_seq_len(uint8_t b) {
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) return 2;
  if (b >= 0xE0 && b <= 0xEF) return 3;
  if (b >= 0xF0 && b <= 0xF4) return 4;
  return 0;
}

/* Second-byte bounds that rule out overlongs, surrogates and code points past U+10FFFF. */
static bool utf8_second_ok(uint8_t lead, uint8_t b) {
  if (lead == 0xE0) return b >= 0xA0 && b <= 0xBF;
  if (lead == 0xED) return b >= 0x80 && b <= 0x9F;
  if (lead == 0xF0) return b >= 0x90 && b <= 0xBF;
  if (lead == 0xF4) return b >= 0x80 && b <= 0x8F;
  return (b & 0xC0) == 0x80;
}

bool ks__utf8_valid(const uint8_t *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    size_t len = utf8_seq_len(s[i]);
    if (len == 0 || len > n - i) return false;
    if (len > 1 && !utf8_second_ok(s[i], s[i + 1])) return false;
    for (size_t k = 2; k < len; k++)
      if ((s[i + k] & 0xC0) != 0x80) return false;
    i += len;
  }
  return true;
}

/*
 * ks_path_match in one pass over the path. A glob is segments (runs of bytes and '?') joined by
 * '*': s0*s1*...*sk. It matches a '/'-prefix of the path (or the path), ending at a boundary j
 * (j == n, or 0 < j < n with path[j] == '/'), when s0 starts the path, s1..s(k-1) follow in order
 * and sk ends at j. Each middle segment is placed at its leftmost possible start: that leaves the
 * most room for what follows, for every j at once, so no boundary needs a run of its own (the old
 * matcher ran the glob again over each prefix: quadratic in the name, for every glob).
 */

/* Length of the segment at p: up to the next '*' or the end. */
static size_t seg_len(const char *p) {
  size_t m = 0;
  while (p[m] && p[m] != '*') m++;
  return m;
}

/* Whether the m bytes of segment p match t[0..m) ('?' any byte). */
static bool seg_at(const char *p, size_t m, const char *t) {
  for (size_t i = 0; i < m; i++)
    if (p[i] != '?' && p[i] != t[i]) return false;
  return true;
}

/* Whether a match may end at j in a path of n bytes. */
static bool boundary(const char *t, size_t n, size_t j) { return j == n || (j > 0 && j < n && t[j] == '/'); }

int ks_path_match(const char *glob, const char *path) {
  if (!glob || !path) return 0;
  size_t n = strlen(path), m = seg_len(glob);
  const char *p = glob;
  if (!p[m]) return m <= n && boundary(path, n, m) && seg_at(p, m, path); /* no '*': one length */
  if (m > n || !seg_at(p, m, path)) return 0;
  size_t pos = m; /* where the next segment may start */
  for (p += m;;) {
    while (*p == '*') p++;
    m = seg_len(p);
    if (!p[m]) break; /* the last segment */
    size_t q = pos;
    while (q + m <= n && !seg_at(p, m, path + q)) q++;
    if (q + m > n) return 0;
    pos = q + m;
    p += m;
  }
  for (size_t j = pos + m; j <= n; j++)
    if (boundary(path, n, j) && seg_at(p, m, path + j - m)) return 1;
  return 0;
}
