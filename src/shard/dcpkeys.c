/*
 * Distinct dict keys in decoded typed JSON (docs/FORMAT.md 9.1). A dict is written from a Python
 * dict, which never holds two equal keys, so two equal keys in one `{"dict": ...}` are a damaged or
 * forged value: decoding it would keep one of the two values silently. Equal is Python's equality:
 * numbers by value across bool, int and float (True == 1 == 1.0, 0 == -0.0, 2**70 == 2.0**70),
 * strings and bytes by their bytes, None with None, tuples item by item. A NaN equals nothing (each
 * decoded NaN is its own object), nor does an io.BytesIO (hashed by identity), nor a tuple holding
 * either.
 *
 * Each key gets a canonical byte string, the same for equal keys and different for unequal ones;
 * the strings are sorted, so a dict of n keys costs n log n comparisons, and the strings take a
 * few bytes more than the keys' own JSON.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "shard/shard_internal.h"

/* Whether the integer with these decimal digits ('-' first when negative) is exactly the double *d. */
static bool digits_are_double(const char *s, size_t n, double *d) {
  char buf[400];
  if (n > 330) return false; /* above DBL_MAX's 309 digits */
  *d = strtod(s, NULL);
  if (!isfinite(*d)) return false;
  int w = snprintf(buf, sizeof buf, "%.0f", *d); /* exact: a double above 2^53 is an integer */
  return w > 0 && (size_t)w == n && !memcmp(buf, s, n);
}

static void put_u64(ks__sbuf *b, uint64_t v) {
  uint8_t x[8];
  for (int i = 0; i < 8; i++) x[i] = (uint8_t)(v >> (8 * i));
  ks__sbuf_put(b, x, 8);
}

/* A number that a double represents exactly: its bits (0.0 for -0.0), whatever type it came as. */
static void put_double(ks__sbuf *b, double d) {
  uint64_t bits;
  if (d == 0) d = 0; /* -0.0 == 0 */
  memcpy(&bits, &d, sizeof bits);
  ks__sbuf_putc(b, 'D');
  put_u64(b, bits);
}

static void put_int(ks__sbuf *b, int64_t i) {
  double d = (double)i;
  if (d >= -9223372036854775808.0 && d < 9223372036854775808.0 && (int64_t)d == i) {
    put_double(b, d);
  } else { /* no double equals it: only the same integer does */
    ks__sbuf_putc(b, 'I');
    put_u64(b, (uint64_t)i);
  }
}

static void put_bytes(ks__sbuf *b, char tag, const char *s, size_t n) {
  ks__sbuf_putc(b, tag);
  put_u64(b, n);
  ks__sbuf_put(b, s, n);
}

/* Appends v's canonical string; false (nothing meaningful appended) when v equals no other value. */
static bool put_key(ks__sbuf *b, const ks_dcp_value *v) {
  double d;
  switch (v->kind) {
    case KS_DCP_NONE: ks__sbuf_putc(b, 'N'); return true;
    case KS_DCP_BOOL:
    case KS_DCP_INT: put_int(b, v->i); return true;
    case KS_DCP_FLOAT:
      if (isnan(v->f)) return false;
      put_double(b, v->f);
      return true;
    case KS_DCP_BIGINT:
      if (digits_are_double(v->s, v->len, &d)) put_double(b, d);
      else put_bytes(b, 'G', v->s, v->len); /* outside int64 and no double: only the same digits */
      return true;
    case KS_DCP_STR: put_bytes(b, 'S', v->s, v->len); return true;
    case KS_DCP_BYTES: put_bytes(b, 'B', v->s, v->len); return true;
    case KS_DCP_TUPLE:
      ks__sbuf_putc(b, 'T');
      put_u64(b, v->count);
      for (size_t i = 0; i < v->count; i++)
        if (!put_key(b, &v->items[i])) return false;
      return true;
    default: return false; /* io.BytesIO (identity); lists and dicts are never keys */
  }
}

typedef struct key_ref {
  size_t off, len; /* its canonical string in the buffer */
  size_t item;     /* its pair in the dict */
  const char *base;
} key_ref;

static int by_key(const void *x, const void *y) {
  const key_ref *a = x, *b = y;
  size_t n = a->len < b->len ? a->len : b->len;
  int c = memcmp(a->base + a->off, b->base + b->off, n);
  if (c) return c;
  if (a->len != b->len) return a->len < b->len ? -1 : 1;
  return a->item < b->item ? -1 : a->item > b->item; /* equal keys: in order, so the first pair is first */
}

ks_status ks__dcp_dict_keys_distinct(const ks_allocator *a, const ks_dcp_value *items, size_t n, size_t *first,
                                     size_t *second) {
  if (n < 2) return KS_OK;
  key_ref *refs = ks__calloc(a, n, sizeof *refs);
  if (!refs) return KS_E_NOMEM;
  ks__sbuf b;
  ks__sbuf_init(&b, a);
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    size_t at = b.len;
    if (!put_key(&b, &items[2 * i])) {
      b.len = at; /* equals nothing: left out */
      continue;
    }
    refs[m++] = (key_ref){at, b.len - at, i, NULL};
  }
  ks_status st = b.failed ? KS_E_NOMEM : KS_OK;
  if (!st) {
    for (size_t i = 0; i < m; i++) refs[i].base = b.p;
    qsort(refs, m, sizeof *refs, by_key);
    /* The first repeat in dict order: the lowest item equal to an earlier one, and that earlier one. */
    size_t best = SIZE_MAX, run = 0;
    for (size_t i = 1; i < m; i++) {
      const key_ref *x = &refs[i - 1], *y = &refs[i];
      if (x->len != y->len || memcmp(b.p + x->off, b.p + y->off, x->len)) {
        run = i;
        continue;
      }
      if (y->item < best) {
        best = y->item;
        *first = refs[run].item;
        *second = y->item;
      }
    }
    if (best != SIZE_MAX) st = KS_E_EXISTS;
  }
  ks__sbuf_free(&b);
  ks__free(a, refs);
  return st;
}
