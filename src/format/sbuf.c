/*
 * A growable byte buffer for building headers, with JSON string escaping and
 * exact number formatting. Allocation failure latches so callers check once.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/fmt_internal.h"

void ks__sbuf_init(ks__sbuf *b, const ks_allocator *a) {
  memset(b, 0, sizeof *b);
  b->alloc = a;
}

void ks__sbuf_free(ks__sbuf *b) {
  ks__free(b->alloc, b->p);
  b->p = NULL;
  b->len = b->cap = 0;
}

static bool grow(ks__sbuf *b, size_t extra) {
  size_t need;
  if (b->failed || !ks__add_size(b->len, extra, &need)) return b->failed = true, false;
  if (need <= b->cap) return true;
  size_t ncap = b->cap ? b->cap : 256;
  while (ncap < need) {
    if (ncap > SIZE_MAX / 2) return b->failed = true, false;
    ncap *= 2;
  }
  char *p = ks__realloc(b->alloc, b->p, ncap);
  if (!p) return b->failed = true, false;
  b->p = p;
  b->cap = ncap;
  return true;
}

void ks__sbuf_put(ks__sbuf *b, const void *s, size_t n) {
  if (n == 0 || !grow(b, n)) return;
  memcpy(b->p + b->len, s, n);
  b->len += n;
}

void ks__sbuf_puts(ks__sbuf *b, const char *s) { ks__sbuf_put(b, s, strlen(s)); }

void ks__sbuf_putc(ks__sbuf *b, char c) { ks__sbuf_put(b, &c, 1); }

void ks__sbuf_put_u64(ks__sbuf *b, uint64_t v) {
  char tmp[24];
  int n = snprintf(tmp, sizeof tmp, "%" PRIu64, v);
  ks__sbuf_put(b, tmp, (size_t)n);
}

void ks__sbuf_put_i64(ks__sbuf *b, int64_t v) {
  char tmp[24];
  int n = snprintf(tmp, sizeof tmp, "%" PRId64, v);
  ks__sbuf_put(b, tmp, (size_t)n);
}

/* The escape for byte c, or NULL when it is copied as is. */
static const char *escape_of(unsigned char c, char tmp[8]) {
  switch (c) {
    case '"': return "\\\"";
    case '\\': return "\\\\";
    case '\n': return "\\n";
    case '\r': return "\\r";
    case '\t': return "\\t";
    default: break;
  }
  if (c >= 0x20) return NULL;
  snprintf(tmp, 8, "\\u%04x", c);
  return tmp;
}

void ks__sbuf_put_json_str(ks__sbuf *b, const char *s, size_t n) {
  ks__sbuf_putc(b, '"');
  size_t run = 0; /* start of the pending unescaped run */
  char tmp[8];
  for (size_t i = 0; i < n; i++) {
    const char *esc = escape_of((unsigned char)s[i], tmp);
    if (!esc) continue;
    ks__sbuf_put(b, s + run, i - run);
    ks__sbuf_puts(b, esc);
    run = i + 1;
  }
  ks__sbuf_put(b, s + run, n - run);
  ks__sbuf_putc(b, '"');
}

/* Rewrites a locale decimal separator to '.', so output never depends on setlocale. */
static void c_locale_number(char *s) {
  for (; *s; s++)
    if (!((*s >= '0' && *s <= '9') || *s == '-' || *s == '+' || *s == 'e' || *s == 'E')) *s = '.';
}

void ks__sbuf_put_double(ks__sbuf *b, double v) {
  char tmp[40];
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(tmp, sizeof tmp, "%.*g", prec, v);
    if (strtod(tmp, NULL) == v) break;
  }
  c_locale_number(tmp);
  ks__sbuf_puts(b, tmp);
  if (!strpbrk(tmp, ".e")) ks__sbuf_puts(b, ".0");
}

static int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool ks__parse_hex64(const char *s, size_t n, uint64_t *out) {
  if (n != 16) return false;
  uint64_t v = 0;
  for (size_t i = 0; i < n; i++) {
    int d = hex_value(s[i]);
    if (d < 0) return false;
    v = (v << 4) | (uint64_t)d;
  }
  *out = v;
  return true;
}
