/* The open-addressing hash index described in hindex.h (linear probing). */
#include <string.h>

#include <xxhash.h>

#include "core/hindex.h"

uint64_t ks__hash(const void *key, size_t len) { return XXH3_64bits(key, len); }

void ks__hindex_free(ks__hindex *ix, const ks_allocator *a) {
  ks__free(a, ix->slots);
  ix->slots = NULL;
  ix->nslots = 0;
}

void ks__hindex_insert(ks__hindex *ix, size_t item, uint64_t h) {
  size_t mask = ix->nslots - 1, s = (size_t)h & mask;
  while (ix->slots[s].item) s = (s + 1) & mask;
  ix->slots[s] = (ks__hslot){(uint32_t)(item + 1), (uint32_t)(h >> 32)};
}

void ks__hindex_rebuild(ks__hindex *ix, size_t count, const ks__hindex_ops *ops, const void *ctx) {
  if (!ix->nslots) return;
  memset(ix->slots, 0, ix->nslots * sizeof *ix->slots);
  for (size_t i = 0; i < count; i++) ks__hindex_insert(ix, i, ops->hash(ctx, i));
}

ks_status ks__hindex_reserve(ks__hindex *ix, const ks_allocator *a, size_t count, size_t indexed,
                             const ks__hindex_ops *ops, const void *ctx) {
  if (count > KS__HINDEX_MAX) return KS_E_LIMIT;
  if (count * 2 <= ix->nslots) return KS_OK;
  size_t n = ix->nslots ? ix->nslots : 16;
  while (n < count * 2) n *= 2;
  ks__hslot *slots = ks__calloc(a, n, sizeof *slots);
  if (!slots) return KS_E_NOMEM;
  ks__free(a, ix->slots);
  ix->slots = slots;
  ix->nslots = n;
  ks__hindex_rebuild(ix, indexed, ops, ctx);
  return KS_OK;
}

long ks__hindex_find(const ks__hindex *ix, const char *key, size_t len, uint64_t h, const ks__hindex_ops *ops,
                     const void *ctx) {
  if (!ix->nslots) return -1;
  size_t mask = ix->nslots - 1;
  uint32_t tag = (uint32_t)(h >> 32);
  for (size_t s = (size_t)h & mask; ix->slots[s].item; s = (s + 1) & mask) {
    if (ix->slots[s].tag != tag) continue;
    size_t item = ix->slots[s].item - 1, n;
    if (ops->hash(ctx, item) != h) continue;
    const char *k = ops->key(ctx, item, &n);
    if (n == len && memcmp(k, key, len) == 0) return (long)item;
  }
  return -1;
}
