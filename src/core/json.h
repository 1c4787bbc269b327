/*
 * The library's one JSON reader and one JSON writer, and the string buffer both
 * rest on. Every allocation goes through the caller's allocator.
 *
 *   ks__sbuf   growable byte buffer (sbuf.c) with JSON string/number output;
 *   ks__json   streaming reader over untrusted bytes (json.c): bounded, zero-copy
 *              strings, used directly for safetensors headers;
 *   ks__jv     a JSON value tree (jv.c) parsed with ks__json and written with
 *              ks__sbuf, for metadata, metric arguments and Composer's JSON.
 */
#ifndef KS_CORE_JSON_H
#define KS_CORE_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/hindex.h"
#include "core/internal.h"

/* Growable byte buffer. On allocation failure it latches `failed` and ignores further appends. */
typedef struct ks__sbuf {
  const ks_allocator *alloc;
  char *p;
  size_t len, cap;
  bool failed;
} ks__sbuf;

void ks__sbuf_init(ks__sbuf *b, const ks_allocator *a);
void ks__sbuf_free(ks__sbuf *b);
/* Out-of-line path of ks__sbuf_put: grows the buffer, then appends. */
void ks__sbuf_put_slow(ks__sbuf *b, const void *s, size_t n);
/* Headers of 100,000 tensors make millions of tiny appends, so the common case is inline. */
static inline void ks__sbuf_put(ks__sbuf *b, const void *s, size_t n) {
  if (n && !b->failed && n <= b->cap - b->len) {
    memcpy(b->p + b->len, s, n);
    b->len += n;
  } else {
    ks__sbuf_put_slow(b, s, n);
  }
}
static inline void ks__sbuf_puts(ks__sbuf *b, const char *s) { ks__sbuf_put(b, s, strlen(s)); }
static inline void ks__sbuf_putc(ks__sbuf *b, char c) {
  if (!b->failed && b->len < b->cap)
    b->p[b->len++] = c;
  else
    ks__sbuf_put_slow(b, &c, 1);
}
void ks__sbuf_put_u64(ks__sbuf *b, uint64_t v);
void ks__sbuf_put_i64(ks__sbuf *b, int64_t v);
/* Appends v as 16 lowercase hex digits. */
void ks__sbuf_put_hex64(ks__sbuf *b, uint64_t v);
/* Appends s as a quoted JSON string (s must be valid UTF-8). */
void ks__sbuf_put_json_str(ks__sbuf *b, const char *s, size_t n);
/* Appends what ks__sbuf_put_json_str would, escaped once more, for JSON nested in a string value. */
void ks__sbuf_put_json_str_nested(ks__sbuf *b, const char *s, size_t n);
/* Appends a finite double as the shortest JSON number that reads back exactly,
   always with a '.' or exponent so it reads back as a float. */
void ks__sbuf_put_double(ks__sbuf *b, double v);

/* Parses 16 lowercase/uppercase hex digits. */
bool ks__parse_hex64(const char *s, size_t n, uint64_t *out);


/* A streaming JSON reader over untrusted bytes (json.c). */

typedef struct ks__json {
  const uint8_t *s;
  size_t n, pos;
  int64_t base; /* absolute file offset of s[0], for errors */
  const char *file;
  const ks_allocator *alloc;
  ks_error *err;
  ks__sbuf kbuf, vbuf; /* scratch for decoded keys and values */
  bool skipping;       /* inside a value that is read and dropped: \u0000 is allowed there */
  bool lone_surrogates; /* a lone surrogate escape decodes to its 3-byte form (WTF-8) instead of failing:
                           the typed JSON of Python strings (src/shard/dcpvalue.c) */
} ks__json;

void ks__json_init(ks__json *j, const void *s, size_t n, int64_t base, const char *file, const ks_allocator *a,
                   ks_error *err);
void ks__json_free(ks__json *j);
/* Records an error at the current position and returns code. */
KS_NODISCARD ks_status ks__json_fail(ks__json *j, ks_status code, const char *key, const char *fmt, ...)
    KS__PRINTF(4, 5);
void ks__json_ws(ks__json *j);
/* Skips whitespace; true when the next byte is c (not consumed). */
bool ks__json_peek(ks__json *j, char c);
KS_NODISCARD ks_status ks__json_expect(ks__json *j, char c);
/* A string: *s points into the input (no escapes) or into b; valid until b is reused. */
KS_NODISCARD ks_status ks__json_string(ks__json *j, ks__sbuf *b, const char **s, size_t *n);
/* A non-negative integer without fraction or exponent; `what` names it in errors. */
KS_NODISCARD ks_status ks__json_u64(ks__json *j, const char *key, const char *what, uint64_t *v);
/* Skips any value. `depth` is the nesting level of the value (the header object is 1);
   containers deeper than 127 are refused with KS_E_LIMIT, as the reference reader does. */
KS_NODISCARD ks_status ks__json_skip(ks__json *j, int depth);
/* True when the reference reader refuses the number s[0..n) (valid JSON grammar) as out
   of range of an f64 (json_range.c). */
bool ks__json_number_out_of_range(const uint8_t *s, size_t n);
/* Object iteration: start with *first = true; *done becomes true at the closing brace.
   The key lives in j->kbuf or the input and is followed by the ':' (consumed). */
KS_NODISCARD ks_status ks__json_next_key(ks__json *j, bool *first, bool *done, const char **key, size_t *klen);
/* Only whitespace may remain. */
KS_NODISCARD ks_status ks__json_end(ks__json *j);

/* The extent of a JSON number literal at s[0..n) per the grammar (jv.c); 0 when malformed.
   *real: it has a fraction or an exponent. */
size_t ks__json_number_len(const uint8_t *s, size_t n, bool *real);

/* ---- JSON values (jv.c) ---- */

typedef enum ks__jv_type {
  KS__JV_NULL,
  KS__JV_BOOL,
  KS__JV_INT,
  KS__JV_REAL,
  KS__JV_STRING,
  KS__JV_ARRAY,
  KS__JV_OBJECT
} ks__jv_type;

/* A JSON value. Objects keep their members in insertion order; keys are unique. */
typedef struct ks__jv ks__jv;
struct ks__jv {
  ks__jv_type type;
  bool b;
  int64_t i;
  double d;
  char *s;          /* KS__JV_STRING: NUL-terminated copy (may hold NULs before len) */
  size_t len;       /* string length, or number of items/members */
  size_t cap;
  ks__jv **items;   /* array items, object values */
  char **keys;      /* object keys */
  uint64_t *hashes; /* object keys' hashes */
  ks__hindex index; /* object keys, once there are more than a few (large objects stay O(1)) */
};

/* Constructors: NULL when out of memory. Free with ks__jv_free (NULL is fine). */
ks__jv *ks__jv_null(const ks_allocator *a);
ks__jv *ks__jv_bool(const ks_allocator *a, bool v);
ks__jv *ks__jv_int(const ks_allocator *a, int64_t v);
ks__jv *ks__jv_real(const ks_allocator *a, double v);
ks__jv *ks__jv_str(const ks_allocator *a, const char *s);
ks__jv *ks__jv_array(const ks_allocator *a);
ks__jv *ks__jv_object(const ks_allocator *a);
void ks__jv_free(const ks_allocator *a, ks__jv *v);
/* A deep copy, or NULL when out of memory. */
ks__jv *ks__jv_copy(const ks_allocator *a, const ks__jv *v);

/* A deep copy of doc in which the object member doc[member] lacks the keys drop(ctx, key)
   names (the torch structure document's "containers", pruned by path); a doc that is not an
   object is copied whole. NULL when out of memory. */
ks__jv *ks__jv_copy_pruned(const ks_allocator *a, const ks__jv *doc, const char *member,
                           int (*drop)(void *ctx, const char *key), void *ctx);

/* Sets obj[key] = val, replacing (and freeing) an old value. Takes val in every case:
   on failure val is freed. @return KS_OK, KS_E_INVALID (not an object, val NULL) or KS_E_NOMEM. */
KS_NODISCARD ks_status ks__jv_set(const ks_allocator *a, ks__jv *obj, const char *key, ks__jv *val);
/* Appends val to an array, with the same ownership rule. */
KS_NODISCARD ks_status ks__jv_push(const ks_allocator *a, ks__jv *arr, ks__jv *val);

/* obj[key], or NULL (also when obj is not an object). */
const ks__jv *ks__jv_get(const ks__jv *obj, const char *key);
/* The string of a KS__JV_STRING value, else NULL. */
const char *ks__jv_string(const ks__jv *v);
/* Nonzero for a KS__JV_INT (into *out). */
bool ks__jv_is_int(const ks__jv *v, int64_t *out);
/* Nonzero for an int or real (into *out). */
bool ks__jv_is_number(const ks__jv *v, double *out);
static inline bool ks__jv_is(const ks__jv *v, ks__jv_type t) { return v && v->type == t; }
/* The value of an int or real (0 for anything else). */
static inline double ks__jv_number(const ks__jv *v) {
  return !v ? 0.0 : v->type == KS__JV_INT ? (double)v->i : v->type == KS__JV_REAL ? v->d : 0.0;
}
/* Same JSON value: types equal (1 and 1.0 differ, as in jansson), objects regardless of order. */
bool ks__jv_equal(const ks__jv *x, const ks__jv *y);

/*
 * Parses one JSON value from text[0..n) (untrusted; depth limit 64, duplicate
 * keys refused). Errors name `what` (e.g. the metadata key) and the offset.
 * @return KS_OK, KS_E_FORMAT or KS_E_NOMEM.
 */
KS_NODISCARD ks_status ks__jv_parse(const ks_allocator *a, const char *text, size_t n, const char *what, ks__jv **out,
                       ks_error *err);
/* Compact JSON (no spaces) as a NUL-terminated string owned by the caller (free with ks__free);
   sort_keys orders object members by key bytes. NULL when out of memory. */
char *ks__jv_dump(const ks_allocator *a, const ks__jv *v, bool sort_keys);
/* As ks__jv_dump, with each member and item on its own line, `indent` spaces per level, ": "
   after keys and empty containers as {} and []: the layout of jansson's JSON_INDENT(n), so
   files written before keep their bytes (indent <= 0 is compact). */
char *ks__jv_dump_indented(const ks_allocator *a, const ks__jv *v, bool sort_keys, int indent);

#endif
