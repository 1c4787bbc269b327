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

/* Glob over the first n bytes of t. */
static bool glob_n(const char *p, const char *t, size_t n) {
  const char *star = NULL;
  size_t i = 0, resume = 0;
  while (i < n) {
    if (*p == '*') {
      star = p++;
      resume = i;
    } else if (*p && (*p == '?' || *p == t[i])) {
      p++;
      i++;
    } else if (star) {
      p = star + 1;
      i = ++resume;
    } else {
      return false;
    }
  }
  while (*p == '*') p++;
  return *p == '\0';
}


int ks_path_match(const char *glob, const char *path) {
  if (!glob || !path) return 0;
  size_t n = strlen(path);
  if (glob_n(glob, path, n)) return 1;
  for (size_t j = 1; j < n; j++)
    if (path[j] == '/' && glob_n(glob, path, j)) return 1;
  return 0;
}
