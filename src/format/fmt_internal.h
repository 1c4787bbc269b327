/*
 * Internals of the format module: the reader's layout, a growable byte buffer
 * with JSON escaping, scalar encoding and the header parser. Not installed.
 */
#ifndef KS_FORMAT_INTERNAL_H
#define KS_FORMAT_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/internal.h"
#include "keepsake/format.h"

/* One tensor of an open file; offsets are relative to the data section. */
typedef struct fmt_entry {
  const char *name; /* into the reader's name arena */
  size_t name_off;  /* the same, as an offset while the arena grows */
  size_t name_len;
  uint64_t hash;
  ks_dtype dtype;
  int rank;
  int64_t shape[KS_MAX_RANK];
  uint64_t begin, end;
} fmt_entry;

struct ks_reader {
  ks_allocator alloc;
  char *path;
  const uint8_t *bytes; /* whole file: the mapping, the copy or the caller's buffer */
  size_t size;
  const void *map; /* non-NULL when bytes is a mapping of map_len bytes by io */
  size_t map_len;
  const ks_io *io; /* the table that opened the file (never NULL for a file) */
  uint8_t *copy; /* non-NULL when bytes is owned heap memory */
  uint64_t header_len;
  uint64_t data_off; /* 8 + header_len */
  fmt_entry *entries;
  size_t count;
  char *names; /* arena of NUL-terminated names */
  uint32_t *slots; /* index+1 into entries, 0 = empty; power-of-two size */
  size_t nslots;
  ks_meta *meta;
  int version; /* keepsake format version, 0 for plain safetensors */
};

/* Index of the tensor named name[0..n), or -1. */
long ks__reader_find_n(const ks_reader *r, const char *name, size_t n);

/* Hash used by every name index of the module. */
uint64_t ks__fmt_hash(const char *s, size_t n);

/* Steps of opening a file, in order (header.c), then the layout checks (layout.c). */
ks_status ks__fmt_read_prefix(ks_reader *r, ks_error *err);
ks_status ks__fmt_check_utf8(const ks_reader *r, ks_error *err);
ks_status ks__fmt_read_header(ks_reader *r, ks_error *err);
/* Parses and validates the header and layout of r->bytes; fills the reader. */
ks_status ks__fmt_parse(ks_reader *r, ks_error *err);
/* Absolute byte offset of the first `"name"` in the header, or 8 when not found. */
int64_t ks__fmt_key_offset(const ks_reader *r, const char *name);

/* True when the map holds key[0..klen). */
bool ks__meta_has(const ks_meta *m, const char *key, size_t klen);
/* Appends a pair without looking for an existing key (the caller knows it is new). */
ks_status ks__meta_append(ks_meta *m, const char *key, size_t klen, const char *value, size_t vlen);

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

/* Encodes the scalar entries of sd as the JSON object stored under "keepsake.scalars". */
ks_status ks__scalars_encode(const ks_statedict *sd, ks__sbuf *out, ks_error *err);
/* Decodes a "keepsake.scalars" value into dst; `file` names the source in errors. */
ks_status ks__scalars_decode(const char *json, const char *file, int64_t offset, ks_statedict *dst,
                             ks_error *err);

/* A streaming JSON reader over untrusted bytes (json.c). */
typedef struct ks__jbuf {
  char *p;
  size_t len, cap;
} ks__jbuf;

typedef struct ks__json {
  const uint8_t *s;
  size_t n, pos;
  int64_t base; /* absolute file offset of s[0], for errors */
  const char *file;
  const ks_allocator *alloc;
  ks_error *err;
  ks__jbuf kbuf, vbuf; /* scratch for decoded keys and values */
  bool skipping;       /* inside a value that is read and dropped: \u0000 is allowed there */
} ks__json;

void ks__json_init(ks__json *j, const void *s, size_t n, int64_t base, const char *file, const ks_allocator *a,
                   ks_error *err);
void ks__json_free(ks__json *j);
/* Records an error at the current position and returns code. */
ks_status ks__json_fail(ks__json *j, ks_status code, const char *key, const char *fmt, ...) KS__PRINTF(4, 5);
void ks__json_ws(ks__json *j);
/* Skips whitespace; true when the next byte is c (not consumed). */
bool ks__json_peek(ks__json *j, char c);
ks_status ks__json_expect(ks__json *j, char c);
/* A string: *s points into the input (no escapes) or into b; valid until b is reused. */
ks_status ks__json_string(ks__json *j, ks__jbuf *b, const char **s, size_t *n);
/* A non-negative integer without fraction or exponent; `what` names it in errors. */
ks_status ks__json_u64(ks__json *j, const char *key, const char *what, uint64_t *v);
/* Skips any value. `depth` is the nesting level of the value (the header object is 1);
   containers deeper than 127 are refused with KS_E_LIMIT, as the reference reader does. */
ks_status ks__json_skip(ks__json *j, int depth);
/* True when the reference reader refuses the number s[0..n) (valid JSON grammar) as out
   of range of an f64 (json_range.c). */
bool ks__json_number_out_of_range(const uint8_t *s, size_t n);
/* Object iteration: start with *first = true; *done becomes true at the closing brace.
   The key lives in j->kbuf or the input and is followed by the ':' (consumed). */
ks_status ks__json_next_key(ks__json *j, bool *first, bool *done, const char **key, size_t *klen);
/* Only whitespace may remain. */
ks_status ks__json_end(ks__json *j);

/* Builds the 8-byte length prefix, JSON header and padding of a file holding sd;
   *data_len receives the size of the data section that must follow. */
ks_status ks__build_header(const ks_statedict *sd, const ks_meta *extra, const ks_allocator *a, ks__sbuf *h,
                           uint64_t *data_len, ks_error *err);

/* Parses 16 lowercase/uppercase hex digits. */
bool ks__parse_hex64(const char *s, size_t n, uint64_t *out);

#endif
