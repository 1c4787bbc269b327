/*
 * ks_meta: the ordered string map stored as the safetensors __metadata__.
 * Pairs live in insertion order; an open-addressing table of indices keeps
 * lookups O(1) because foreign files may carry very many pairs.
 */
#include <string.h>

#include <xxhash.h>

#include "format/fmt_internal.h"

typedef struct meta_pair {
  char *key;
  char *value;
  uint64_t hash;
} meta_pair;

struct ks_meta {
  ks_allocator alloc;
  meta_pair *pairs;
  size_t count, cap;
  uint32_t *slots; /* index+1, 0 = empty */
  size_t nslots;
};

uint64_t ks__fmt_hash(const char *s, size_t n) { return XXH3_64bits(s, n); }

ks_status ks_meta_create(const ks_allocator *a, ks_meta **out) {
  if (!out) return KS_E_INVALID;
  ks_meta *m = ks__calloc(a, 1, sizeof *m);
  if (!m) return KS_E_NOMEM;
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
  ks__free(&m->alloc, m->slots);
  ks__free(&m->alloc, m);
}

static size_t find_slot(const ks_meta *m, const char *key, uint64_t h) {
  size_t mask = m->nslots - 1, s = (size_t)h & mask;
  while (m->slots[s]) {
    const meta_pair *p = &m->pairs[m->slots[s] - 1];
    if (p->hash == h && strcmp(p->key, key) == 0) return s;
    s = (s + 1) & mask;
  }
  return s;
}

static long find_index(const ks_meta *m, const char *key) {
  if (!m || m->nslots == 0) return -1;
  size_t s = find_slot(m, key, ks__fmt_hash(key, strlen(key)));
  return m->slots[s] ? (long)m->slots[s] - 1 : -1;
}

static ks_status rebuild_index(ks_meta *m, size_t nslots) {
  uint32_t *slots = ks__calloc(&m->alloc, nslots, sizeof *slots);
  if (!slots) return KS_E_NOMEM;
  ks__free(&m->alloc, m->slots);
  m->slots = slots;
  m->nslots = nslots;
  for (size_t i = 0; i < m->count; i++)
    m->slots[find_slot(m, m->pairs[i].key, m->pairs[i].hash)] = (uint32_t)(i + 1);
  return KS_OK;
}

/* Room for one more pair, keeping the table at most half full. */
static ks_status reserve_one(ks_meta *m) {
  if (m->count >= UINT32_MAX - 1) return KS_E_LIMIT;
  if (m->count == m->cap) {
    size_t ncap = m->cap ? m->cap * 2 : 8, bytes;
    if (!ks__mul_size(ncap, sizeof(meta_pair), &bytes)) return KS_E_LIMIT;
    meta_pair *p = ks__realloc(&m->alloc, m->pairs, bytes);
    if (!p) return KS_E_NOMEM;
    m->pairs = p;
    m->cap = ncap;
  }
  if ((m->count + 1) * 2 > m->nslots) return rebuild_index(m, m->nslots ? m->nslots * 2 : 16);
  return KS_OK;
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
  p->hash = ks__fmt_hash(k, klen);
  m->slots[find_slot(m, k, p->hash)] = (uint32_t)(m->count + 1);
  m->count++;
  return KS_OK;
}

bool ks__meta_has(const ks_meta *m, const char *key, size_t klen) {
  if (!m->nslots) return false;
  uint64_t h = ks__fmt_hash(key, klen);
  size_t mask = m->nslots - 1;
  for (size_t s = (size_t)h & mask; m->slots[s]; s = (s + 1) & mask) {
    const meta_pair *p = &m->pairs[m->slots[s] - 1];
    if (p->hash == h && strncmp(p->key, key, klen) == 0 && p->key[klen] == '\0') return true;
  }
  return false;
}

ks_status ks_meta_set(ks_meta *m, const char *key, const char *value) {
  if (!m || !key || !value) return KS_E_INVALID;
  size_t klen = strlen(key), vlen = strlen(value);
  if (!ks__utf8_valid((const uint8_t *)key, klen) || !ks__utf8_valid((const uint8_t *)value, vlen))
    return KS_E_INVALID;
  long idx = find_index(m, key);
  if (idx < 0) return ks__meta_append(m, key, klen, value, vlen);
  char *v = ks__strndup(&m->alloc, value, vlen);
  if (!v) return KS_E_NOMEM;
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

ks_status ks_meta_copy(ks_meta *dst, const ks_meta *src) {
  if (!dst || !src) return KS_E_INVALID;
  for (size_t i = 0; i < src->count; i++) {
    ks_status st = ks_meta_set(dst, src->pairs[i].key, src->pairs[i].value);
    if (st) return st;
  }
  return KS_OK;
}
