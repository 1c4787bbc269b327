/*
 * The `sharded` section of an index is untrusted: every later allocation (a
 * global tensor, a region of it) and every element loop is sized from it. This
 * checks, before any of that, that each tensor's chunks tile its global shape
 * exactly without building the global tensor: the overflow-checked chunk
 * volumes add up to the global volume and no two chunks overlap (a sweep along
 * the dimension the chunks are split in most, with a cap on the pairs compared:
 * only a 3-d grid over ~100,000 ranks reaches it), and that the chunk bytes a
 * rank file holds fit in that file's recorded size, which ks_shard_check then
 * compares with the file's real size.
 */
#include <stdlib.h>
#include <string.h>

#include "shard/shard_internal.h"

/* Elements of a box; false when the count overflows 64 bits. A zero dimension makes it empty
   whatever the others are (safetensors allows [0, 2^32, 2^32]). */
static bool volume(int rank, const int64_t *shape, uint64_t *out) {
  for (int d = 0; d < rank; d++)
    if (shape[d] == 0) return (*out = 0), true;
  uint64_t n = 1;
  for (int d = 0; d < rank; d++)
    if (!ks__mul_u64(n, (uint64_t)shape[d], &n)) return false;
  *out = n;
  return true;
}

/* Counts chunk j's bytes against its file and checks the file holds no other chunk of this tensor. */
KS_NODISCARD static ks_status tally_chunk(const ks_shard_index *idx, size_t ti, size_t j, uint64_t *covered,
                                          ks__shard_tally *t, const char *path, ks_error *err) {
  const ks__sharded *s = &idx->sharded[ti];
  const ks__saved_chunk *k = &s->chunks[j];
  uint64_t n, bytes;
  if (!volume(s->rank, k->shape, &n) || !ks__mul_u64(n, ks_dtype_size(s->dtype), &bytes) ||
      !ks__add_u64(*covered, n, covered))
    return ks__err_at(err, KS_E_FORMAT, path, s->name, -1,
                      "index: '%s' chunk %zu (rank %d): its element count overflows", s->name, j, k->file);
  if (t->seen[k->file] == ti + 1)
    return ks__err_at(err, KS_E_FORMAT, path, s->name, -1,
                      "index: '%s' chunk %zu (rank %d): that rank file already holds a chunk of it", s->name, j,
                      k->file);
  t->seen[k->file] = ti + 1;
  uint64_t have = idx->infos[k->file].size;
  if (!ks__add_u64(t->bytes[k->file], bytes, &t->bytes[k->file]) || t->bytes[k->file] > have)
    return ks__err_at(err, KS_E_FORMAT, path, s->name, -1,
                      "index: '%s' chunk %zu (rank %d): the chunks of rank file %d need more bytes than its %llu",
                      s->name, j, k->file, k->file, (unsigned long long)have);
  return KS_OK;
}

static int overlap(int rank, const ks__saved_chunk *a, const ks__saved_chunk *b) {
  for (int d = 0; d < rank; d++)
    if (a->offsets[d] >= b->offsets[d] + b->shape[d] || b->offsets[d] >= a->offsets[d] + a->shape[d]) return 0;
  return 1;
}

/* qsort has no context argument: each key carries the chunk's start along the sweep dimension
   (no global: the library is used from many threads). */
typedef struct sweep_key {
  int64_t start;
  const ks__saved_chunk *c;
} sweep_key;

static int by_start(const void *x, const void *y) {
  const sweep_key *a = x, *b = y;
  return a->start < b->start ? -1 : a->start > b->start;
}

static int by_value(const void *x, const void *y) {
  int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
  return a < b ? -1 : a > b;
}

/* The dimension with the most distinct chunk starts: a split along it leaves the fewest chunks
   open side by side (one for a split along any single dimension, k for a k x k grid). */
static int sweep_dim(const ks__sharded *s, const ks__saved_chunk **chunks, int64_t *v, size_t m) {
  int best = 0;
  size_t most = 0;
  for (int d = 0; d < s->rank; d++) {
    for (size_t i = 0; i < m; i++) v[i] = chunks[i]->offsets[d];
    qsort(v, m, sizeof *v, by_value);
    size_t distinct = m ? 1 : 0;
    for (size_t i = 1; i < m; i++) distinct += v[i] != v[i - 1];
    if (distinct > most) most = distinct, best = d;
  }
  return best;
}

/* Position of chunk c in s (for messages). */
static size_t chunk_no(const ks__sharded *s, const ks__saved_chunk *c) { return (size_t)(c - s->chunks); }

/* Sweeps the non-empty chunks along one dimension: each is compared with the chunks still open
   there only, so a split along one dimension costs n log n and a k x k grid n k. */
KS_NODISCARD static ks_status sweep(const ks__sharded *s, const ks__saved_chunk **chunks, sweep_key *keys,
                                    int64_t *scratch, const ks__saved_chunk **open, size_t m, const char *path,
                                    ks_error *err) {
  int d = sweep_dim(s, chunks, scratch, m);
  for (size_t i = 0; i < m; i++) {
    keys[i].c = chunks[i];
    keys[i].start = chunks[i]->offsets[d];
  }
  qsort(keys, m, sizeof *keys, by_start);
  size_t n_open = 0;
  uint64_t pairs = 0;
  for (size_t i = 0; i < m; i++) {
    const ks__saved_chunk *c = keys[i].c;
    size_t keep = 0;
    for (size_t o = 0; o < n_open; o++)
      if (open[o]->offsets[d] + open[o]->shape[d] > keys[i].start) open[keep++] = open[o];
    n_open = keep;
    if ((pairs += n_open) > KS__SHARD_MAX_PAIRS)
      return ks__err_at(err, KS_E_LIMIT, path, s->name, -1, "index: '%s': too many chunks side by side to check (%zu)",
                        s->name, s->n_chunks);
    for (size_t o = 0; o < n_open; o++)
      if (overlap(s->rank, open[o], c))
        return ks__err_at(err, KS_E_FORMAT, path, s->name, -1,
                          "index: '%s' chunk %zu (rank %d) overlaps chunk %zu (rank %d)", s->name, chunk_no(s, c),
                          c->file, chunk_no(s, open[o]), open[o]->file);
    open[n_open++] = c;
  }
  return KS_OK;
}

/* Chunks inside the global shape whose volumes add up to it and that are pairwise disjoint tile it. */
KS_NODISCARD static ks_status disjoint(const ks_shard_index *idx, const ks__sharded *s, const char *path,
                                       ks_error *err) {
  if (s->rank == 0) return KS_OK; /* volumes 1 adding up to 1: a single non-empty chunk */
  const ks_allocator *a = &idx->alloc;
  size_t n = s->n_chunks ? s->n_chunks : 1;
  const ks__saved_chunk **chunks = ks__calloc(a, n, 2 * sizeof *chunks);
  sweep_key *keys = ks__calloc(a, n, sizeof *keys);
  int64_t *scratch = ks__calloc(a, n, sizeof *scratch);
  ks_status st = chunks && keys && scratch
                     ? KS_OK
                     : ks__err(err, KS_E_NOMEM, "out of memory checking the chunks of '%s'", s->name);
  size_t m = 0;
  for (size_t j = 0; !st && j < s->n_chunks; j++) {
    uint64_t v = 0;
    if (volume(s->rank, s->chunks[j].shape, &v) && v) chunks[m++] = &s->chunks[j]; /* empty chunks overlap nothing */
  }
  if (!st) st = sweep(s, chunks, keys, scratch, chunks + n, m, path, err);
  ks__free(a, (void *)chunks);
  ks__free(a, keys);
  ks__free(a, scratch);
  return st;
}

/* What a sharded entry is besides a tiling: some rank file holds it (a writer lists a tensor because a
   file holds a chunk of it, so an entry with none, even of an empty global shape, is no checkpoint's),
   and a DCP value (FORMAT.md 9.1) is one whole 1-d U8 tensor, held by one file. */
KS_NODISCARD static ks_status check_entry(const ks__sharded *s, const char *path, ks_error *err) {
  if (s->n_chunks == 0)
    return ks__err_at(err, KS_E_FORMAT, path, s->name, -1, "index: '%s' has no chunks: no rank file holds it",
                      s->name);
  if (strncmp(s->name, KS__DCP_OBJECT, strlen(KS__DCP_OBJECT))) return KS_OK;
  if (s->dtype != KS_U8 || s->rank != 1 || s->n_chunks != 1)
    return ks__err_at(err, KS_E_FORMAT, path, s->name, -1,
                      "index: '%s' is a DCP value: one whole 1-d U8 tensor in one rank file, not %s of rank %d in "
                      "%zu chunks",
                      s->name, ks_dtype_name(s->dtype), s->rank, s->n_chunks);
  return KS_OK;
}

ks_status ks__shard_check_tiling(const ks_shard_index *idx, size_t ti, ks__shard_tally *t, const char *path,
                                 ks_error *err) {
  const ks__sharded *s = &idx->sharded[ti];
  uint64_t whole, bytes, covered = 0;
  ks_status est = check_entry(s, path, err);
  if (est) return est;
  if (!volume(s->rank, s->global_shape, &whole) || !ks__mul_u64(whole, ks_dtype_size(s->dtype), &bytes))
    return ks__err_at(err, KS_E_FORMAT, path, s->name, -1, "index: '%s': the global shape's byte count overflows",
                      s->name);
  for (size_t j = 0; j < s->n_chunks; j++) {
    ks_status st = tally_chunk(idx, ti, j, &covered, t, path, err);
    if (st) return st;
  }
  if (covered != whole)
    return ks__err_at(err, KS_E_FORMAT, path, s->name, -1,
                      "index: '%s': the chunks hold %llu elements, the global shape %llu: they do not cover it exactly",
                      s->name, (unsigned long long)covered, (unsigned long long)whole);
  return disjoint(idx, s, path, err);
}
