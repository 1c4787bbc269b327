/*
 * "Does some checkpoint key start with this '/'-terminated prefix?", asked
 * once per program component and metric. Answered from a hash set of the keys'
 * prefixes instead of a scan of every key: the set for a depth (number of '/'
 * in the prefix) is built on the first question of that depth, in one pass, so
 * a load costs O(keys x distinct depths asked) however many components it has.
 */
#include <string.h>

#include "core/hindex.h"
#include "state/state_internal.h"

typedef struct pfx_item {
  const char *s; /* into a key of the state dict (which outlives the set) */
  size_t len;
  uint64_t hash;
} pfx_item;

struct ks__prefixes {
  ks_allocator alloc;
  const ks_statedict *sd;
  uint64_t depths_done; /* bit d: the prefixes with d '/' are in the set */
  pfx_item *items;
  size_t count, cap;
  ks__hindex index;
};

static uint64_t item_hash(const void *ctx, size_t i) { return ((const ks__prefixes *)ctx)->items[i].hash; }

static const char *item_key(const void *ctx, size_t i, size_t *len) {
  const pfx_item *it = &((const ks__prefixes *)ctx)->items[i];
  *len = it->len;
  return it->s;
}

static const ks__hindex_ops pfx_ops = {item_hash, item_key};

ks_status ks__prefixes_create(const ks_allocator *a, const ks_statedict *sd, ks__prefixes **out) {
  ks__prefixes *p = ks__calloc(a, 1, sizeof *p);
  if (!p) return KS_E_NOMEM;
  p->alloc = *ks__alloc_or_default(a);
  p->sd = sd;
  *out = p;
  return KS_OK;
}

void ks__prefixes_free(ks__prefixes *p) {
  if (!p) return;
  ks__hindex_free(&p->index, &p->alloc);
  ks__free(&p->alloc, p->items);
  ks__free(&p->alloc, p);
}

/* Length of `key` up to and including its d-th '/', or 0 when it has fewer. */
static size_t prefix_len(const char *key, unsigned d) {
  const char *q = key;
  for (unsigned i = 0; i < d; i++) {
    q = strchr(q, '/');
    if (!q) return 0;
    q++;
  }
  return (size_t)(q - key);
}

static KS_NODISCARD ks_status add(ks__prefixes *p, const char *s, size_t len) {
  uint64_t h = ks__hash(s, len);
  if (ks__hindex_find(&p->index, s, len, h, &pfx_ops, p) >= 0) return KS_OK;
  ks_status st = ks__grow(&p->alloc, (void **)&p->items, &p->cap, p->count + 1, sizeof *p->items);
  if (!st) st = ks__hindex_reserve(&p->index, &p->alloc, p->count + 1, p->count, &pfx_ops, p);
  if (st) return st;
  p->items[p->count] = (pfx_item){s, len, h};
  ks__hindex_insert(&p->index, p->count++, h);
  return KS_OK;
}

/* Keys of one component are usually adjacent, so a prefix equal to the last one is skipped unhashed. */
static KS_NODISCARD ks_status index_depth(ks__prefixes *p, unsigned d) {
  size_t n = ks_statedict_count(p->sd), last_len = 0;
  const char *last = NULL;
  for (size_t i = 0; i < n; i++) {
    ks_entry e;
    if (ks_statedict_at(p->sd, i, &e) != KS_OK) continue;
    size_t len = prefix_len(e.name, d);
    if (!len || (len == last_len && !memcmp(e.name, last, len))) continue;
    ks_status s = add(p, e.name, len);
    if (s) return s;
    last = e.name;
    last_len = len;
  }
  p->depths_done |= (uint64_t)1 << d;
  return KS_OK;
}

ks_status ks__prefixes_has(ks__prefixes *p, const char *prefix, int *found) {
  size_t len = strlen(prefix);
  unsigned d = 0;
  for (size_t i = 0; i < len; i++) d += prefix[i] == '/';
  *found = 0;
  if (len == 0 || prefix[len - 1] != '/' || d >= 64) return KS_E_INVALID;
  if (!(p->depths_done & ((uint64_t)1 << d))) {
    ks_status s = index_depth(p, d);
    if (s) return s;
  }
  *found = ks__hindex_find(&p->index, prefix, len, ks__hash(prefix, len), &pfx_ops, p) >= 0;
  return KS_OK;
}
