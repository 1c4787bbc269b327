/*
 * Metric synchronisation: every rank's states travel once (MPI_Allgatherv of
 * one encoded blob per rank, lengths may differ and may be zero rows), then
 * every rank folds them with ks_metric_merge in the same order. One merge rule
 * for files and processes alike, and bit-identical results on every rank,
 * which a floating-point MPI_Allreduce does not promise.
 *
 * Wire encoding (native byte order, every field 8 bytes, state bytes padded to
 * 8): n_metrics, then per metric: name, class+args signature, update count,
 * n_states, then per state dtype, rank, shape[rank], nbytes, bytes.
 */
#include <stdio.h>
#include <string.h>

#include "dist/dist_internal.h"

struct ks_dist_cache {
  ks_allocator alloc;
  size_t n;
  ks_metric **local;
};

void ks_dist_cache_free(ks_dist_cache *cache) {
  if (!cache) return;
  for (size_t i = 0; i < cache->n; i++) ks_metric_free(cache->local[i]);
  ks_allocator a = cache->alloc;
  ks__free(&a, cache->local);
  ks__free(&a, cache);
}

static void put_str(ks__wbuf *b, const char *s) {
  size_t n = strlen(s);
  ks__wbuf_i64(b, (int64_t)n);
  ks__wbuf_put(b, s, n);
  static const uint8_t zeros[8] = {0};
  ks__wbuf_put(b, zeros, (8 - n % 8) % 8);
}

static void encode_metric(ks__wbuf *b, const char *name, const ks_metric *m) {
  put_str(b, name);
  put_str(b, ks_metric_class(m));
  put_str(b, ks_metric_args_json(m));
  ks__wbuf_i64(b, ks_metric_update_count(m));
  size_t n = ks_metric_state_count(m);
  ks__wbuf_i64(b, (int64_t)n);
  for (size_t i = 0; i < n; i++) {
    ks_tensor t;
    if (ks_metric_state_info(m, i, NULL, NULL, &t)) continue; /* index in range: cannot fail */
    ks__wbuf_i64(b, (int64_t)t.dtype);
    ks__wbuf_i64(b, t.rank);
    for (int d = 0; d < t.rank; d++) ks__wbuf_i64(b, t.shape[d]);
    ks__wbuf_i64(b, (int64_t)t.nbytes);
    ks__wbuf_put(b, t.data, t.nbytes);
    static const uint8_t zeros[8] = {0};
    ks__wbuf_put(b, zeros, (8 - t.nbytes % 8) % 8);
  }
}

static KS_NODISCARD ks_status encode(const ks_metric_collection *c, ks__wbuf *b, ks_error *err) {
  size_t n = ks_metric_collection_count(c);
  ks__wbuf_i64(b, (int64_t)n);
  for (size_t i = 0; i < n; i++) {
    const char *name;
    const ks_metric *m = ks_metric_collection_at(c, i, &name);
    encode_metric(b, name, m);
  }
  if (b->failed == KS_E_LIMIT) return ks__err(err, KS_E_LIMIT, "metric states exceed 2 GiB on one rank");
  if (b->failed) return ks__err(err, KS_E_NOMEM, "out of memory encoding metric states");
  return KS_OK;
}

/* A bounded reader over one rank's blob; every length is checked before use. */
typedef struct rd {
  ks__cursor c;
  int rank;
} rd;

static int get_i64(rd *r, int64_t *v) {
  const uint8_t *p;
  if (!ks__take(&r->c, 8, &p)) return 0;
  memcpy(v, p, 8);
  return 1;
}

static int get_bytes(rd *r, int64_t n, const uint8_t **p) {
  if (n < 0 || (uint64_t)n > SIZE_MAX - 8) return 0;
  size_t padded = (size_t)n + (8 - (size_t)n % 8) % 8;
  if (!ks__take(&r->c, padded, p)) return 0;
  return 1;
}

/* Reads a string and checks it equals `want`. */
static KS_NODISCARD ks_status expect_str(rd *r, const char *want, const char *what, const char *metric, ks_error *err) {
  int64_t n;
  const uint8_t *p;
  if (!get_i64(r, &n) || !get_bytes(r, n, &p))
    return ks__err(err, KS_E_FORMAT, "metric states from rank %d are truncated", r->rank);
  if ((size_t)n != strlen(want) || memcmp(p, want, (size_t)n) != 0)
    return ks__err_at(err, KS_E_MISMATCH, NULL, metric, -1, "%s of metric '%s' differs on rank %d: '%.*s', here '%s'",
                      what, metric, r->rank, (int)(n > 200 ? 200 : n), (const char *)p, want);
  return KS_OK;
}

/* Decodes one metric of rank r->rank into a fresh metric shaped like `like`. */
static KS_NODISCARD ks_status decode_metric(rd *r, const char *name, const ks_metric *like, const ks_allocator *a,
                               ks_metric **out, ks_error *err) {
  ks_status st = expect_str(r, name, "the name", name, err);
  if (!st) st = expect_str(r, ks_metric_class(like), "the class", name, err);
  if (!st) st = expect_str(r, ks_metric_args_json(like), "the arguments", name, err);
  if (st) return st;
  int64_t count, n;
  if (!get_i64(r, &count) || !get_i64(r, &n) || count < 0 || n != (int64_t)ks_metric_state_count(like))
    return ks__err_at(err, KS_E_FORMAT, NULL, name, -1, "metric '%s' from rank %d is malformed", name, r->rank);
  ks_statedict *sd;
  if (ks_statedict_create(a, &sd, err)) return ks__err(err, KS_E_NOMEM, "out of memory decoding metric states");
  for (int64_t i = 0; !st && i < n; i++) {
    int64_t dtype, rank, nbytes;
    ks_tensor t;
    memset(&t, 0, sizeof t);
    int ok = get_i64(r, &dtype) && get_i64(r, &rank) && rank >= 0 && rank <= KS_MAX_RANK;
    for (int d = 0; ok && d < rank; d++) ok = get_i64(r, &t.shape[d]) && t.shape[d] >= 0;
    const uint8_t *p = NULL;
    ok = ok && get_i64(r, &nbytes) && get_bytes(r, nbytes, &p);
    const char *sname = NULL;
    if (ks_metric_state_info(like, (size_t)i, &sname, NULL, NULL)) continue; /* index in range: cannot fail */
    if (!ok) {
      st = ks__err_at(err, KS_E_FORMAT, NULL, name, -1, "state %lld of metric '%s' from rank %d is malformed",
                      (long long)i, name, r->rank);
      break;
    }
    t.dtype = (ks_dtype)dtype;
    t.rank = (int)rank;
    t.data = (void *)p;
    t.nbytes = (size_t)nbytes;
    t.ownership = KS_BORROWED;
    st = ks_statedict_set_tensor(sd, sname, &t, KS_BORROW, err);
    if (st) st = ks__err(err, st, "cannot stage state '%s' of metric '%s'", sname, name);
  }
  ks_metric *m = NULL;
  if (!st) st = ks_metric_clone(like, a, &m, err);
  if (!st) st = ks_metric_load_state_dict(m, sd, "", KS_METRIC_SCHEMA_VERSION, 0, NULL, NULL, err);
  if (!st) st = ks_metric_restore_computed(m, NULL, count, err);
  ks_statedict_free(sd);
  if (st) {
    if (err) ks__err_set_key(err, name);
    ks_metric_free(m);
    return st;
  }
  *out = m;
  return KS_OK;
}

/* Copies src's states and update count into dst (same class and args); dst's cache is dropped. */
static KS_NODISCARD ks_status assign(ks_metric *dst, const ks_metric *src, const ks_allocator *a, ks_error *err) {
  ks_statedict *sd;
  if (ks_statedict_create(a, &sd, err)) return ks__err(err, KS_E_NOMEM, "out of memory copying metric states");
  ks_status st = KS_OK;
  for (size_t i = 0; !st && i < ks_metric_state_count(src); i++) {
    const char *name;
    ks_tensor t;
    if (ks_metric_state_info(src, i, &name, NULL, &t)) continue; /* index in range: cannot fail */
    st = ks_statedict_set_tensor(sd, name, &t, KS_BORROW, err);
  }
  if (st) st = ks__err(err, st, "out of memory copying metric states");
  if (!st) st = ks_metric_load_state_dict(dst, sd, "", KS_METRIC_SCHEMA_VERSION, 0, NULL, NULL, err);
  if (!st) st = ks_metric_restore_computed(dst, NULL, ks_metric_update_count(src), err);
  ks_statedict_free(sd);
  return st;
}

typedef struct gathered {
  uint8_t *buf;
  int *counts, *displs;
} gathered;

static void gathered_free(const ks_allocator *a, gathered *g) {
  ks__free(a, g->buf);
  ks__free(a, g->counts);
  ks__free(a, g->displs);
}

/* MPI_Allgather of the lengths, then MPI_Allgatherv of the blobs. */
static KS_NODISCARD ks_status exchange(MPI_Comm comm, int size, const ks__wbuf *mine, const ks_allocator *a,
                                       gathered *g, ks_error *err) {
  int len = (int)mine->len;
  g->counts = ks__calloc(a, (size_t)size, sizeof(int));
  g->displs = ks__calloc(a, (size_t)size, sizeof(int));
  int local = g->counts && g->displs ? KS_OK : KS_E_NOMEM;
  ks_status st = ks_dist_agree(comm, local ? ks__err(err, local, "out of memory gathering metric states") : KS_OK, err);
  if (st) return st;
  st = ks__mpi_check(MPI_Allgather(&len, 1, MPI_INT, g->counts, 1, MPI_INT, comm), "MPI_Allgather", err);
  size_t total = 0;
  for (int q = 0; !st && q < size; q++) {
    if (total > (size_t)INT32_MAX - (size_t)g->counts[q]) {
      st = ks__err(err, KS_E_LIMIT, "gathered metric states exceed 2 GiB");
      break;
    }
    g->displs[q] = (int)total;
    total += (size_t)g->counts[q];
  }
  if (!st && !(g->buf = ks__malloc(a, total ? total : 8)))
    st = ks__err(err, KS_E_NOMEM, "out of memory gathering metric states");
  st = ks_dist_agree(comm, st, err);
  if (st) return st;
  return ks__mpi_check(MPI_Allgatherv(mine->p ? mine->p : (uint8_t *)g->buf, len, MPI_BYTE, g->buf, g->counts,
                                      g->displs, MPI_BYTE, comm),
                       "MPI_Allgatherv", err);
}

/* Decodes metric i of every rank and folds them (ks_metric_fold: last rank first, so cat rows end
 * up in rank order), the rule every binding's sync uses too. */
static KS_NODISCARD ks_status fold(rd *rds, int size, const char *name, const ks_metric *like,
                      const ks_allocator *a, ks_metric **out, ks_error *err) {
  ks_metric **parts = ks__calloc(a, (size_t)size, sizeof *parts);
  if (!parts) return ks__err(err, KS_E_NOMEM, "out of memory reducing metric states");
  ks_status st = KS_OK;
  for (int q = 0; !st && q < size; q++) st = decode_metric(&rds[q], name, like, a, &parts[q], err);
  if (!st) st = ks_metric_fold((const ks_metric *const *)parts, (size_t)size, a, out, err);
  for (int q = 0; q < size; q++) ks_metric_free(parts[q]);
  ks__free(a, parts);
  return st;
}

static KS_NODISCARD ks_status cache_new(const ks_metric_collection *c, const ks_allocator *a, ks_dist_cache **out,
                           ks_error *err) {
  ks_dist_cache *k = ks__calloc(a, 1, sizeof *k);
  size_t n = ks_metric_collection_count(c);
  if (k) k->alloc = *ks__alloc_or_default(a);
  if (k && !(k->local = ks__calloc(a, n ? n : 1, sizeof *k->local))) {
    ks__free(a, k);
    k = NULL;
  }
  if (!k) return ks__err(err, KS_E_NOMEM, "out of memory for the metric sync cache");
  k->n = n;
  *out = k;
  return KS_OK;
}

/* Decodes and folds every metric into `k->local` slots of a scratch cache. */
static KS_NODISCARD ks_status reduce_all(const ks_metric_collection *c, const gathered *g, int size,
                                         const ks_allocator *a, ks_dist_cache *synced, ks_error *err) {
  rd *rds = ks__calloc(a, (size_t)size, sizeof *rds);
  if (!rds) return ks__err(err, KS_E_NOMEM, "out of memory reducing metric states");
  ks_status st = KS_OK;
  for (int q = 0; !st && q < size; q++) {
    ks__cursor_init(&rds[q].c, g->buf + g->displs[q], (size_t)g->counts[q]);
    rds[q].rank = q;
    int64_t n;
    if (!get_i64(&rds[q], &n)) st = ks__err(err, KS_E_FORMAT, "metric states from rank %d are truncated", q);
    else if (n != (int64_t)synced->n)
      st = ks__err(err, KS_E_MISMATCH, "rank %d has %lld metrics, this rank %zu", q, (long long)n, synced->n);
  }
  for (size_t i = 0; !st && i < synced->n; i++) {
    const char *name;
    const ks_metric *m = ks_metric_collection_at(c, i, &name);
    st = fold(rds, size, name, m, a, &synced->local[i], err);
  }
  ks__free(a, rds);
  return st;
}

/* Installs `from` into the collection; on failure puts `undo` back into what was changed. */
static KS_NODISCARD ks_status install(ks_metric_collection *c, const ks_dist_cache *from, const ks_dist_cache *undo,
                         const ks_allocator *a, ks_error *err) {
  ks_status st = KS_OK;
  size_t i = 0;
  for (; !st && i < from->n; i++) st = assign(ks_metric_collection_at(c, i, NULL), from->local[i], a, err);
  size_t undo_failed = 0;
  if (st && undo)
    for (size_t j = 0; j + 1 < i; j++)
      undo_failed += assign(ks_metric_collection_at(c, j, NULL), undo->local[j], a, NULL) != KS_OK;
  if (undo_failed) /* said, not hidden: those metrics now hold synced values */
    return ks__err(err, st, "installing synced metric states failed, and %zu of them could not be restored",
                   undo_failed);
  return st;
}

static KS_NODISCARD ks_status snapshot(const ks_metric_collection *c, const ks_allocator *a, ks_dist_cache **out,
                          ks_error *err) {
  ks_dist_cache *k = NULL;
  ks_status st = cache_new(c, a, &k, err);
  for (size_t i = 0; !st && i < k->n; i++)
    st = ks_metric_clone(ks_metric_collection_at(c, i, NULL), a, &k->local[i], err);
  if (st && k) ks_dist_cache_free(k);
  if (!st) *out = k;
  return st;
}

ks_status ks_dist_sync(ks_metric_collection *c, MPI_Comm comm, const ks_allocator *alloc, ks_dist_cache **cache,
                       ks_error *err) {
  int size = 0;
  ks_status st = c ? KS_OK : ks__err(err, KS_E_INVALID, "ks_dist_sync: NULL collection");
  if (!st) st = ks__mpi_check(MPI_Comm_size(comm, &size), "MPI_Comm_size", err);
  const ks_allocator *a = ks__alloc_or_default(alloc);
  ks__wbuf mine = {a, NULL, 0, 0, 0};
  if (!st) st = encode(c, &mine, err);
  gathered g = {NULL, NULL, NULL};
  st = ks_dist_agree(comm, st, err);
  if (!st) st = exchange(comm, size, &mine, a, &g, err);
  ks__wbuf_free(&mine);
  ks_dist_cache *synced = NULL, *local = NULL;
  ks_status mine_st = st;
  if (!st) mine_st = cache_new(c, a, &synced, err);
  if (!mine_st) mine_st = reduce_all(c, &g, size, a, synced, err);
  if (!mine_st) mine_st = snapshot(c, a, &local, err);
  if (!st) st = ks_dist_agree(comm, mine_st, err);
  gathered_free(a, &g);
  /* Installing may still run out of memory: agree again, and undo everywhere if any rank failed. */
  if (!st) {
    ks_status inst = install(c, synced, local, a, err);
    st = ks_dist_agree(comm, inst, err);
    /* Another rank failed: put the local states back here too (a failure to is reported instead). */
    if (st && !inst && install(c, local, NULL, a, NULL) != KS_OK)
      st = ks__err(err, st, "metric sync failed on another rank, and restoring this rank's local states failed");
  }
  ks_dist_cache_free(synced);
  if (st || !cache) ks_dist_cache_free(local);
  else *cache = local;
  return st;
}

ks_status ks_dist_unsync(ks_metric_collection *c, const ks_dist_cache *cache, ks_error *err) {
  if (!c || !cache) return ks__err(err, KS_E_INVALID, "ks_dist_unsync: NULL argument");
  if (cache->n != ks_metric_collection_count(c))
    return ks__err(err, KS_E_MISMATCH, "the cache holds %zu metrics, the collection %zu", cache->n,
                   ks_metric_collection_count(c));
  for (size_t i = 0; i < cache->n; i++) {
    const ks_metric *m = ks_metric_collection_at(c, i, NULL);
    if (strcmp(ks_metric_class(m), ks_metric_class(cache->local[i])) ||
        strcmp(ks_metric_args_json(m), ks_metric_args_json(cache->local[i])))
      return ks__err(err, KS_E_MISMATCH, "the cache does not come from this collection (metric %zu differs)", i);
  }
  return install(c, cache, NULL, &cache->alloc, err);
}
