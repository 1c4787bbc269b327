/*
 * The one hash index of the library: open addressing over an array the caller
 * owns (state dict entries, metadata pairs, a reader's tensors, a state's
 * components, report items). The index stores item numbers only; it reaches
 * each item's key and stored hash through two callbacks, so the items keep
 * their order and their own layout. Lookups are O(1) expected; the table is
 * kept at most half full.
 */
#ifndef KS_CORE_HINDEX_H
#define KS_CORE_HINDEX_H

#include <stddef.h>
#include <stdint.h>

#include "core/internal.h"

/* Items are numbered 0 .. KS__HINDEX_MAX - 1 (slots hold number + 1 in 32 bits). */
#define KS__HINDEX_MAX ((size_t)UINT32_MAX - 1)

/* A slot keeps the top 32 bits of the hash, so a probe rarely touches the caller's items. */
typedef struct ks__hslot {
  uint32_t item; /* item + 1; 0 = empty */
  uint32_t tag;  /* hash >> 32 */
} ks__hslot;

typedef struct ks__hindex {
  ks__hslot *slots;
  size_t nslots; /* power of two, or 0 before the first reserve */
} ks__hindex;

/* How the index reaches the caller's items. */
typedef struct ks__hindex_ops {
  uint64_t (*hash)(const void *ctx, size_t item);                /* the hash stored with the item */
  const char *(*key)(const void *ctx, size_t item, size_t *len); /* its key bytes */
} ks__hindex_ops;

/* Hash of a key (XXH3, 64 bits). Every index uses this one. */
uint64_t ks__hash(const void *key, size_t len);

/* Frees the table; the index is empty (and usable) afterwards. */
void ks__hindex_free(ks__hindex *ix, const ks_allocator *a);

/*
 * Makes room for `count` items under half load. When the table grows, items
 * 0 .. indexed-1 are re-inserted. @return KS_OK, KS_E_LIMIT or KS_E_NOMEM
 * (index unchanged on error).
 */
KS_NODISCARD ks_status ks__hindex_reserve(ks__hindex *ix, const ks_allocator *a, size_t count, size_t indexed,
                             const ks__hindex_ops *ops, const void *ctx);

/* The first inserted item with this key, or -1. */
long ks__hindex_find(const ks__hindex *ix, const char *key, size_t len, uint64_t h, const ks__hindex_ops *ops,
                     const void *ctx);

/* Records `item` (whose stored hash is h). Requires a reserve covering it; duplicates are kept behind the first. */
void ks__hindex_insert(ks__hindex *ix, size_t item, uint64_t h);

/* Re-indexes items 0 .. count-1 in the current table (after the caller removed or moved items). */
void ks__hindex_rebuild(ks__hindex *ix, size_t count, const ks__hindex_ops *ops, const void *ctx);

#endif
