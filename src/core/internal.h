/*
 * Internal helpers shared by all modules: allocation through an object's
 * allocator, error reporting, checked arithmetic and the bounded cursor used by
 * every parser of untrusted bytes. Not installed.
 */
#ifndef KS_CORE_INTERNAL_H
#define KS_CORE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "keepsake/alloc.h"
#include "keepsake/statedict.h"
#include "keepsake/status.h"

#if defined(__GNUC__)
#define KS__PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define KS__PRINTF(f, a)
#endif

/* Returns the allocator to use: `a` itself, or the libc one when a is NULL. */
const ks_allocator *ks__alloc_or_default(const ks_allocator *a);
void *ks__malloc(const ks_allocator *a, size_t n);
void *ks__calloc(const ks_allocator *a, size_t count, size_t size);
void *ks__realloc(const ks_allocator *a, void *p, size_t n);
void ks__free(const ks_allocator *a, void *p);
char *ks__strdup(const ks_allocator *a, const char *s);
char *ks__strndup(const ks_allocator *a, const char *s, size_t n);

/*
 * The one grow-by-doubling helper: makes the array at *arrayp (a pointer to any
 * T*) hold at least `need` elements of `size` bytes, doubling its capacity
 * (at least 16). @return KS_OK, KS_E_LIMIT (size overflow) or KS_E_NOMEM; the
 * array and *cap are unchanged on error.
 */
KS_NODISCARD ks_status ks__grow(const ks_allocator *a, void *arrayp, size_t *cap, size_t need, size_t size);

/*
 * Reads a caller's growing struct (first member `size_t size`, see export.h)
 * into dst (dst_size bytes: this library's layout), zeroing what the caller's
 * layout lacks. src NULL gives all zeros; size 0 means this library's layout.
 * v1_size is the smallest layout ever released (the first with a size field).
 * @return KS_OK or KS_E_INVALID (a size this library cannot read).
 */
KS_NODISCARD ks_status ks__struct_in(void *dst, size_t dst_size, const void *src, size_t v1_size);

/* At the top of a public function: copies *opts (NULL, older or newer layout) into a
 * local of this library's layout and points opts at it. */
#define KS__TAKE_OPTS(type, opts, v1_size, err)                                                \
  type ks__opts_local_;                                                                        \
  if (ks__struct_in(&ks__opts_local_, sizeof ks__opts_local_, (opts), (v1_size)) != KS_OK)     \
    return ks__err((err), KS_E_INVALID, "options: struct size %zu is not one this library knows", \
                   *(const size_t *)(const void *)(opts));                                     \
  (opts) = &ks__opts_local_

/* The first layouts with a size field (0.2) of the growing structs: the smallest size accepted.
 * Frozen: name the member that was last then, never a member appended later. */
#define KS__V1_SIZE(type, last) (offsetof(type, last) + sizeof(((type *)0)->last))

/*
 * Records an error and returns `code`, so callers can write
 *   return ks__err(err, KS_E_FORMAT, "header: expected '{'");
 * err may be NULL. Not KS_NODISCARD, unlike every other ks_status function: recording
 * the details of a failure already being returned is a use of its own.
 */
ks_status ks__err(ks_error *err, ks_status code, const char *fmt, ...) KS__PRINTF(3, 4);
/* Same, also naming the file/key/offset (any may be NULL / -1). */
ks_status ks__err_at(ks_error *err, ks_status code, const char *file, const char *key, int64_t offset,
                     const char *fmt, ...) KS__PRINTF(6, 7);
/* Fills in the file of an error already recorded, when it has none. */
void ks__err_set_file(ks_error *err, const char *file);
/* Fills in the key of an error already recorded, when it has none. */
void ks__err_set_key(ks_error *err, const char *key);

static inline bool ks__mul_size(size_t a, size_t b, size_t *out) {
  if (a != 0 && b > SIZE_MAX / a) return false;
  *out = a * b;
  return true;
}

static inline bool ks__add_size(size_t a, size_t b, size_t *out) {
  if (b > SIZE_MAX - a) return false;
  *out = a + b;
  return true;
}

static inline bool ks__mul_u64(uint64_t a, uint64_t b, uint64_t *out) {
  if (a != 0 && b > UINT64_MAX / a) return false;
  *out = a * b;
  return true;
}

static inline bool ks__add_u64(uint64_t a, uint64_t b, uint64_t *out) {
  if (b > UINT64_MAX - a) return false;
  *out = a + b;
  return true;
}

/* A bounded cursor over untrusted bytes: every read asks it first. */
typedef struct ks__cursor {
  const uint8_t *base;
  size_t len;
  size_t pos;
} ks__cursor;

static inline void ks__cursor_init(ks__cursor *c, const void *p, size_t n) {
  c->base = (const uint8_t *)p;
  c->len = n;
  c->pos = 0;
}

static inline size_t ks__cursor_left(const ks__cursor *c) { return c->len - c->pos; }

static inline bool ks__take(ks__cursor *c, size_t n, const uint8_t **out) {
  if (n > c->len - c->pos) return false;
  *out = c->base + c->pos;
  c->pos += n;
  return true;
}

static inline bool ks__seek(ks__cursor *c, size_t pos) {
  if (pos > c->len) return false;
  c->pos = pos;
  return true;
}

/* Little-endian decoding, explicit so host byte order never matters. */
static inline uint16_t ks__le16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t ks__le32(const uint8_t *p) {
  return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t ks__le64(const uint8_t *p) {
  return (uint64_t)ks__le32(p) | ((uint64_t)ks__le32(p + 4) << 32);
}
static inline void ks__put_le16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}
static inline void ks__put_le32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void ks__put_le64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static inline bool ks__read_u8(ks__cursor *c, uint8_t *v) {
  const uint8_t *p = NULL;
  if (!ks__take(c, 1, &p)) return false;
  *v = *p;
  return true;
}
static inline bool ks__read_u16(ks__cursor *c, uint16_t *v) {
  const uint8_t *p = NULL;
  if (!ks__take(c, 2, &p)) return false;
  *v = ks__le16(p);
  return true;
}
static inline bool ks__read_u32(ks__cursor *c, uint32_t *v) {
  const uint8_t *p = NULL;
  if (!ks__take(c, 4, &p)) return false;
  *v = ks__le32(p);
  return true;
}
static inline bool ks__read_u64(ks__cursor *c, uint64_t *v) {
  const uint8_t *p = NULL;
  if (!ks__take(c, 8, &p)) return false;
  *v = ks__le64(p);
  return true;
}

/* Returns true when [s, s+n) is valid UTF-8 (no overlongs, no surrogates). */
bool ks__utf8_valid(const uint8_t *s, size_t n);

/* Shell-style glob over '/'-joined keys: '*' matches any run (including '/'), '?' one byte. */


/* ---- state dicts (statedict.c) ---- */

/*
 * Checks a name against the library's one name rule (KS_MAX_NAME, statedict.h): non-NULL,
 * 1..KS_MAX_NAME bytes. Every module calls it where a name enters.
 * @param err optional: the key and the length found vs allowed.
 * @return KS_OK, KS_E_INVALID (NULL or empty) or KS_E_LIMIT (too long). Thread safe.
 */
KS_NODISCARD ks_status ks__name_check(const char *name, ks_error *err);
/* The allocator sd was created with (never NULL: a copy of the defaults). */
const ks_allocator *ks__statedict_allocator(const ks_statedict *sd);
/* The leaf kind ks_statedict_mark_leaf gave entry i (insertion order), 0 for none. */
int ks__statedict_leaf(const ks_statedict *sd, size_t i);
/*
 * Attaches an owner released when the dict is freed, e.g. a reader whose mapping
 * KS_MAPPED_VIEW tensors point into. @return KS_OK or KS_E_NOMEM (then `release` is NOT called).
 */
KS_NODISCARD ks_status ks__statedict_attach(ks_statedict *sd, void *owner, void (*release)(void *owner),
                                            ks_error *err);
/*
 * Copies every entry of src whose name starts with `prefix` into dst, with the prefix replaced
 * by `new_prefix` (either may be ""). Tensor data is copied.
 * @return KS_OK, KS_E_NOMEM or KS_E_INVALID; on failure dst may hold some entries.
 */
KS_NODISCARD ks_status ks__statedict_copy_prefix(ks_statedict *dst, const ks_statedict *src, const char *prefix,
                                                 const char *new_prefix, ks_error *err);

#endif
