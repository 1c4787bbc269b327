/* Chunk maps, the dim-0 split, file names and the small helpers the other files share. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shard/shard_internal.h"

typedef struct map_item {
  char *name;
  ks_shard_chunk c;
} map_item;

struct ks_shard_map {
  ks_allocator alloc;
  map_item *items;
  size_t count, cap;
};

ks_status ks_shard_map_create(const ks_allocator *alloc, ks_shard_map **out, ks_error *err) {
  if (!out) return ks__err(err, KS_E_INVALID, "ks_shard_map_create: NULL out");
  ks_shard_map *m = ks__calloc(alloc, 1, sizeof *m);
  if (!m) return ks__err(err, KS_E_NOMEM, "out of memory for a shard map");
  m->alloc = *ks__alloc_or_default(alloc);
  *out = m;
  return KS_OK;
}

void ks_shard_map_free(ks_shard_map *m) {
  if (!m) return;
  for (size_t i = 0; i < m->count; i++) ks__free(&m->alloc, m->items[i].name);
  ks__free(&m->alloc, m->items);
  ks_allocator a = m->alloc;
  ks__free(&a, m);
}

static long find(const ks_shard_map *m, const char *name) {
  for (size_t i = 0; m && i < m->count; i++)
    if (!strcmp(m->items[i].name, name)) return (long)i;
  return -1;
}

static int chunk_ok(int rank, const int64_t *g, const int64_t *o, const int64_t *s) {
  if (rank < 0 || rank > KS_MAX_RANK) return 0;
  for (int d = 0; d < rank; d++)
    if (g[d] < 0 || o[d] < 0 || s[d] < 0 || o[d] > g[d] || s[d] > g[d] - o[d]) return 0;
  return 1;
}

ks_status ks_shard_map_add(ks_shard_map *m, const char *name, int rank, const int64_t *global_shape,
                           const int64_t *offsets, const int64_t *shape, ks_error *err) {
  ks_status st = ks__name_check(name, err);
  if (st) return st;
  if (!m || (rank > 0 && (!global_shape || !offsets || !shape)))
    return ks__err_at(err, KS_E_INVALID, NULL, name, -1, "ks_shard_map_add: NULL map or shape");
  if (!chunk_ok(rank, global_shape, offsets, shape))
    return ks__err_at(err, KS_E_INVALID, NULL, name, -1, "chunk of '%.200s' (rank %d) lies outside its global shape",
                      name, rank);
  long at = find(m, name);
  if (at < 0) {
    if (m->count == m->cap) {
      size_t cap = m->cap ? m->cap * 2 : 8;
      map_item *p = ks__realloc(&m->alloc, m->items, cap * sizeof *p);
      if (!p) return ks__err_at(err, KS_E_NOMEM, NULL, name, -1, "out of memory adding '%.200s'", name);
      m->items = p;
      m->cap = cap;
    }
    char *copy = ks__strdup(&m->alloc, name);
    if (!copy) return ks__err_at(err, KS_E_NOMEM, NULL, name, -1, "out of memory adding '%.200s'", name);
    at = (long)m->count++;
    m->items[at].name = copy;
  }
  ks_shard_chunk *c = &m->items[at].c;
  memset(c, 0, sizeof *c);
  c->name = m->items[at].name;
  c->rank = rank;
  for (int d = 0; d < rank; d++) {
    c->global_shape[d] = global_shape[d];
    c->offsets[d] = offsets[d];
    c->shape[d] = shape[d];
  }
  return KS_OK;
}

size_t ks_shard_map_count(const ks_shard_map *m) { return m ? m->count : 0; }

ks_status ks_shard_map_at(const ks_shard_map *m, size_t i, ks_shard_chunk *out) {
  if (!m || i >= m->count || !out) return KS_E_NOTFOUND;
  *out = m->items[i].c;
  return KS_OK;
}

ks_status ks_shard_map_get(const ks_shard_map *m, const char *name, ks_shard_chunk *out) {
  long at = name ? find(m, name) : -1;
  if (at < 0 || !out) return KS_E_NOTFOUND;
  *out = m->items[at].c;
  return KS_OK;
}

void ks_shard_split_dim0(int rank, const int64_t *global_shape, int index, int count, int64_t *offsets,
                         int64_t *shape) {
  for (int d = 0; d < rank; d++) {
    offsets[d] = 0;
    shape[d] = global_shape[d];
  }
  if (rank == 0 || count <= 0) return;
  int64_t n = global_shape[0], per = (n + count - 1) / count, lo = per * index;
  if (lo > n) lo = n;
  int64_t hi = lo + per > n ? n : lo + per;
  offsets[0] = lo;
  shape[0] = hi - lo;
}

static const char *const k_per_rank[] = {"rng", "state/dataset_state", "state/train_metrics", "state/eval_metrics"};

const char *const *ks_shard_default_per_rank(size_t *n) {
  if (n) *n = sizeof k_per_rank / sizeof k_per_rank[0];
  return k_per_rank;
}

ks_status ks_shard_file_name(int rank, int world_size, char *buf, size_t cap) {
  if (world_size < 1 || world_size > KS_SHARD_MAX_WORLD || rank < 0 || rank >= world_size || !buf) return KS_E_INVALID;
  int n = snprintf(buf, cap, "rank-%05d-of-%05d.keepsake", rank, world_size);
  return n > 0 && (size_t)n < cap ? KS_OK : KS_E_INVALID;
}

char *ks__shard_join(const ks_allocator *a, const char *dir, const char *name) {
  size_t n = strlen(dir) + strlen(name) + 2;
  char *p = ks__malloc(a, n);
  if (p) snprintf(p, n, "%s/%s", dir, name);
  return p;
}

static int64_t scalar_int(const ks_statedict *sd, const char *name, int *ok) {
  ks_entry e;
  if (ks_statedict_get(sd, name, &e) || e.kind != KS_VAL_INT) {
    *ok = 0;
    return -1;
  }
  return e.i;
}

void ks__shard_ts_of(const ks_statedict *sd, ks__shard_ts *ts) {
  int ok = 1;
  ts->epoch = scalar_int(sd, "state/timestamp/Timestamp/epoch", &ok);
  ts->batch = scalar_int(sd, "state/timestamp/Timestamp/batch", &ok);
  ts->sample = scalar_int(sd, "state/timestamp/Timestamp/sample", &ok);
  ts->token = scalar_int(sd, "state/timestamp/Timestamp/token", &ok);
  ts->has = ok;
  if (!ok) ts->epoch = ts->batch = ts->sample = ts->token = -1;
}

ks__jv *ks__shard_ts_json(const ks_allocator *a, const ks__shard_ts *ts) {
  if (!ts->has) return ks__jv_null(a);
  ks__jv *o = ks__jv_object(a);
  ks_status st = KS_OK;
  ks__shard_put(a, o, "epoch", ks__jv_int(a, ts->epoch), &st);
  ks__shard_put(a, o, "batch", ks__jv_int(a, ts->batch), &st);
  ks__shard_put(a, o, "sample", ks__jv_int(a, ts->sample), &st);
  ks__shard_put(a, o, "token", ks__jv_int(a, ts->token), &st);
  if (st) {
    ks__jv_free(a, o);
    return NULL;
  }
  return o;
}

static int get_int(const ks__jv *o, const char *k, int64_t *v) { return ks__jv_is_int(ks__jv_get(o, k), v); }

int ks__shard_ts_parse(const ks__jv *j, ks__shard_ts *ts) {
  memset(ts, 0, sizeof *ts);
  ts->epoch = ts->batch = ts->sample = ts->token = -1;
  if (ks__jv_is(j, KS__JV_NULL)) return 1;
  if (!ks__jv_is(j, KS__JV_OBJECT)) return 0;
  ts->has = 1;
  return get_int(j, "epoch", &ts->epoch) && get_int(j, "batch", &ts->batch) && get_int(j, "sample", &ts->sample) &&
         get_int(j, "token", &ts->token);
}

int ks__shard_ts_equal(const ks__shard_ts *a, const ks__shard_ts *b) {
  return a->has == b->has && a->epoch == b->epoch && a->batch == b->batch && a->sample == b->sample &&
         a->token == b->token;
}

void ks__shard_ts_format(const ks__shard_ts *ts, char *buf, size_t cap) {
  if (!ts->has) snprintf(buf, cap, "no timestamp");
  else
    snprintf(buf, cap, "epoch %lld batch %lld sample %lld token %lld", (long long)ts->epoch, (long long)ts->batch,
             (long long)ts->sample, (long long)ts->token);
}

int ks__shard_matches(const char *name, const char *const *globs, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (ks_path_match(globs[i], name)) return 1;
  return 0;
}

int ks__shard_dims(const ks__jv *j, int64_t *out) {
  if (!ks__jv_is(j, KS__JV_ARRAY) || j->len > KS_MAX_RANK) return -1;
  for (size_t i = 0; i < j->len; i++)
    if (!ks__jv_is_int(j->items[i], &out[i]) || out[i] < 0) return -1;
  return (int)j->len;
}

ks__jv *ks__shard_dims_json(const ks_allocator *a, int rank, const int64_t *v) {
  ks__jv *arr = ks__jv_array(a);
  ks_status st = KS_OK;
  for (int d = 0; d < rank; d++) ks__shard_push(a, arr, ks__jv_int(a, v[d]), &st);
  if (st) {
    ks__jv_free(a, arr);
    return NULL;
  }
  return arr;
}

void ks__shard_put(const ks_allocator *a, ks__jv *obj, const char *key, ks__jv *val, ks_status *st) {
  if (*st || !obj || !val) {
    ks__jv_free(a, val);
    if (!*st) *st = KS_E_NOMEM;
    return;
  }
  *st = ks__jv_set(a, obj, key, val);
}

void ks__shard_push(const ks_allocator *a, ks__jv *arr, ks__jv *val, ks_status *st) {
  if (*st || !arr || !val) {
    ks__jv_free(a, val);
    if (!*st) *st = KS_E_NOMEM;
    return;
  }
  *st = ks__jv_push(a, arr, val);
}

ks_status ks__shard_parse_meta(const ks_allocator *a, const char *text, const char *key, ks__jv **out,
                               ks_error *err) {
  *out = NULL;
  return text ? ks__jv_parse(a, text, strlen(text), key, out, err) : KS_OK;
}
