/*
 * A growable byte buffer for building headers, with JSON string escaping and
 * exact number formatting. Allocation failure latches so callers check once.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"

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
  if (ks__grow(b->alloc, &b->p, &b->cap, need, 1)) return b->failed = true, false;
  return true;
}

void ks__sbuf_put_slow(ks__sbuf *b, const void *s, size_t n) {
  if (n == 0 || !grow(b, n)) return;
  memcpy(b->p + b->len, s, n);
  b->len += n;
}

static const char hex_digits[] = "0123456789abcdef";

/* Two digits per step: header numbers are formatted a few hundred thousand times per file. */
static const char dec_pairs[] = "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
                                "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
                                "8081828384858687888990919293949596979899";

void ks__sbuf_put_u64(ks__sbuf *b, uint64_t v) {
  char tmp[20];
  size_t i = sizeof tmp;
  while (v >= 100) {
    size_t d = (size_t)(v % 100) * 2;
    v /= 100;
    tmp[--i] = dec_pairs[d + 1];
    tmp[--i] = dec_pairs[d];
  }
  if (v >= 10) {
    tmp[--i] = dec_pairs[v * 2 + 1];
    tmp[--i] = dec_pairs[v * 2];
  } else {
    tmp[--i] = (char)('0' + v);
  }
  ks__sbuf_put(b, tmp + i, sizeof tmp - i);
}

void ks__sbuf_put_i64(ks__sbuf *b, int64_t v) {
  if (v < 0) ks__sbuf_putc(b, '-');
  /* The magnitude in unsigned arithmetic, so INT64_MIN does not overflow. */
  ks__sbuf_put_u64(b, v < 0 ? 0 - (uint64_t)v : (uint64_t)v);
}

void ks__sbuf_put_hex64(ks__sbuf *b, uint64_t v) {
  char tmp[16];
  for (int i = 7; i >= 0; i--, v >>= 8) {
    tmp[2 * i] = hex_digits[(v >> 4) & 15];
    tmp[2 * i + 1] = hex_digits[v & 15];
  }
  ks__sbuf_put(b, tmp, sizeof tmp);
}

static bool needs_escape(unsigned char c) { return c < 0x20 || c == '"' || c == '\\'; }

/* Writes the JSON escape of c (a byte needs_escape accepts) to out; returns its length. */
static size_t escape_of(unsigned char c, char out[6]) {
  char short_form = c == '"' ? '"' : c == '\\' ? '\\' : c == '\n' ? 'n' : c == '\r' ? 'r' : c == '\t' ? 't' : 0;
  out[0] = '\\';
  if (short_form) {
    out[1] = short_form;
    return 2;
  }
  memcpy(out + 1, "u00", 3);
  out[4] = hex_digits[c >> 4];
  out[5] = hex_digits[c & 15];
  return 6;
}

void ks__sbuf_put_json_str(ks__sbuf *b, const char *s, size_t n) {
  ks__sbuf_putc(b, '"');
  size_t run = 0; /* start of the pending unescaped run */
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (!needs_escape(c)) continue;
    char esc[6];
    ks__sbuf_put(b, s + run, i - run);
    ks__sbuf_put(b, esc, escape_of(c, esc));
    run = i + 1;
  }
  ks__sbuf_put(b, s + run, n - run);
  ks__sbuf_putc(b, '"');
}

/* Bytes that need no escape stay the same through both levels, and an escape is
   plain ASCII in which only the backslash and the quote need escaping again. */
void ks__sbuf_put_json_str_nested(ks__sbuf *b, const char *s, size_t n) {
  ks__sbuf_put(b, "\\\"", 2);
  size_t run = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (!needs_escape(c)) continue;
    char esc[6];
    size_t k = escape_of(c, esc);
    ks__sbuf_put(b, s + run, i - run);
    for (size_t j = 0; j < k; j++) {
      if (esc[j] == '"' || esc[j] == '\\') ks__sbuf_putc(b, '\\');
      ks__sbuf_putc(b, esc[j]);
    }
    run = i + 1;
  }
  ks__sbuf_put(b, s + run, n - run);
  ks__sbuf_put(b, "\\\"", 2);
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
