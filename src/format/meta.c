/*
 * ks_meta: the ordered string map stored as the safetensors __metadata__.
 * Pairs live in insertion order; an open-addressing table of indices keeps
 * lookups O(1) because foreign files may carry very many pairs.
 */
#include <string.h>

#include "core/hindex.h"
#include "format/fmt_internal.h"

typedef struct meta_pair {
  char *key;
  char *value;
  size_t klen;
  uint64_t hash;
} meta_pair;

struct ks_meta {
  ks_allocator alloc;
  meta_pair *pairs;
  size_t count, cap;
  ks__hindex index; /* by key */
};

static uint64_t pair_hash(const void *ctx, size_t i) { return ((const ks_meta *)ctx)->pairs[i].hash; }

static const char *pair_key(const void *ctx, size_t i, size_t *len) {
  const meta_pair *p = &((const ks_meta *)ctx)->pairs[i];
  *len = p->klen;
  return p->key;
}

static const ks__hindex_ops meta_ops = {pair_hash, pair_key};

ks_status ks_meta_create(const ks_allocator *a, ks_meta **out, ks_error *err) {
  if (!out) return ks__err(err, KS_E_INVALID, "ks_meta_create: NULL out");
  ks_meta *m = ks__calloc(a, 1, sizeof *m);
  if (!m) return ks__err(err, KS_E_NOMEM, "out of memory for metadata");
  m->alloc = *ks__alloc_or_default(a);
  *out = m;
  return KS_OK;
}

void ks_meta_free(ks_meta *m) {
  if (!m) return;
  for (size_t i = 0; i < m->count; i++) {
    ks__free(&m->alloc, m->pairs[i].key);
    ks__free(&m->alloc, m->pairs[i].value);
  }
  ks__free(&m->alloc, m->pairs);
  ks__hindex_free(&m->index, &m->alloc);
  ks__free(&m->alloc, m);
}

static long find_n(const ks_meta *m, const char *key, size_t klen) {
  return m ? ks__hindex_find(&m->index, key, klen, ks__hash(key, klen), &meta_ops, m) : -1;
}

static long find_index(const ks_meta *m, const char *key) { return find_n(m, key, strlen(key)); }

/* Room for one more pair, keeping the table at most half full. */
static KS_NODISCARD ks_status reserve_one(ks_meta *m) {
  if (m->count >= UINT32_MAX - 1) return KS_E_LIMIT;
  ks_status s = ks__grow(&m->alloc, &m->pairs, &m->cap, m->count + 1, sizeof *m->pairs);
  if (s) return s;
  return ks__hindex_reserve(&m->index, &m->alloc, m->count + 1, m->count, &meta_ops, m);
}

ks_status ks__meta_append(ks_meta *m, const char *key, size_t klen, const char *value, size_t vlen) {
  ks_status st = reserve_one(m);
  if (st) return st;
  char *k = ks__strndup(&m->alloc, key, klen);
  char *v = ks__strndup(&m->alloc, value, vlen);
  if (!k || !v) {
    ks__free(&m->alloc, k);
    ks__free(&m->alloc, v);
    return KS_E_NOMEM;
  }
  meta_pair *p = &m->pairs[m->count];
  p->key = k;
  p->value = v;
  p->klen = klen;
  p->hash = ks__hash(k, klen);
  ks__hindex_insert(&m->index, m->count, p->hash);
  m->count++;
  return KS_OK;
}

bool ks__meta_has(const ks_meta *m, const char *key, size_t klen) { return find_n(m, key, klen) >= 0; }

ks_status ks_meta_set(ks_meta *m, const char *key, const char *value, ks_error *err) {
  if (!m || !key || !value) return ks__err(err, KS_E_INVALID, "ks_meta_set: NULL argument");
  size_t klen = strlen(key), vlen = strlen(value);
  if (!ks__utf8_valid((const uint8_t *)key, klen) || !ks__utf8_valid((const uint8_t *)value, vlen))
    return ks__err_at(err, KS_E_INVALID, NULL, key, -1, "metadata %s of '%.200s' is not valid UTF-8",
                      ks__utf8_valid((const uint8_t *)key, klen) ? "value" : "key", key);
  long idx = find_index(m, key);
  ks_status st = KS_OK;
  if (idx < 0) {
    if ((st = ks__meta_append(m, key, klen, value, vlen)))
      return ks__err_at(err, st, NULL, key, -1, "cannot set metadata '%.200s': %s", key, ks_strerror(st));
    return KS_OK;
  }
  char *v = ks__strndup(&m->alloc, value, vlen);
  if (!v) return ks__err_at(err, KS_E_NOMEM, NULL, key, -1, "out of memory setting metadata '%.200s'", key);
  ks__free(&m->alloc, m->pairs[idx].value);
  m->pairs[idx].value = v;
  return KS_OK;
}

const char *ks_meta_get(const ks_meta *m, const char *key) {
  if (!key) return NULL;
  long idx = find_index(m, key);
  return idx < 0 ? NULL : m->pairs[idx].value;
}

size_t ks_meta_count(const ks_meta *m) { return m ? m->count : 0; }

ks_status ks_meta_at(const ks_meta *m, size_t i, const char **key, const char **value) {
  if (!m || i >= m->count) return KS_E_NOTFOUND;
  if (key) *key = m->pairs[i].key;
  if (value) *value = m->pairs[i].value;
  return KS_OK;
}

ks_status ks__meta_copy(ks_meta *dst, const ks_meta *src, ks_error *err) {
  if (!dst || !src) return ks__err(err, KS_E_INVALID, "meta copy: NULL argument");
  for (size_t i = 0; i < src->count; i++) {
    ks_status st = ks_meta_set(dst, src->pairs[i].key, src->pairs[i].value, err);
    if (st) return st;
  }
  return KS_OK;
}
