/*
 * Without MPI: rewriting a checkpoint for another world size (each new rank's
 * part built exactly as a load at that size builds it, then written as that
 * rank would write it), and finding the newest complete checkpoint of a run.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/io_ops.h"
#include "shard/shard_internal.h"

/* The dim-0 split of every sharded tensor for part `r` of `m`. */
KS_NODISCARD static ks_status split_map(const ks_shard_index *idx, int r, int m, const ks_allocator *a,
                                        ks_shard_map **out, ks_error *err) {
  ks_shard_map *map;
  if (ks_shard_map_create(a, &map, err)) return ks__err(err, KS_E_NOMEM, "out of memory");
  for (size_t i = 0; i < idx->n_sharded; i++) {
    const ks__sharded *s = &idx->sharded[i];
    int64_t off[KS_MAX_RANK], shape[KS_MAX_RANK];
    ks_shard_split_dim0(s->rank, s->global_shape, r, m, off, shape);
    if (ks_shard_map_add(map, s->name, s->rank, s->global_shape, off, shape, err)) {
      ks_shard_map_free(map);
      return ks__err(err, KS_E_NOMEM, "out of memory");
    }
  }
  *out = map;
  return KS_OK;
}

KS_NODISCARD static ks_status reshard_one(const char *dir, const ks_shard_index *idx, int r, int m, const char *out_dir,
                             const ks_save_opts *opts, ks_shard_file_info *info, ks_error *err) {
  const ks_allocator *a = opts ? opts->alloc : NULL;
  ks_shard_map *map = NULL;
  ks_statedict *sd = NULL;
  ks_meta *meta = NULL;
  ks_shard_load_opts lo = {a, 1, opts ? opts->io : NULL};
  ks_status st = split_map(idx, r, m, a, &map, err);
  if (!st) st = ks_shard_load_rank(dir, idx, r, m, map, &lo, &sd, &meta, err);
  if (!st)
    st = ks_shard_write_rank(out_dir, r, m, sd, meta, map, (const char *const *)idx->per_rank, idx->n_per_rank, opts,
                             info, err);
  ks_meta_free(meta);
  ks_statedict_free(sd);
  ks_shard_map_free(map);
  return st;
}

ks_status ks_shard_reshard(const char *dir, int world_size, const char *out_dir, const ks_save_opts *opts,
                           ks_error *err) {
  if (!dir || !out_dir || world_size < 1 || world_size > KS_SHARD_MAX_WORLD)
    return ks__err(err, KS_E_INVALID, "ks_shard_reshard: bad argument (world size %d)", world_size);
  const ks_allocator *a = opts ? opts->alloc : NULL;
  const ks_io *io = opts ? opts->io : NULL, *v2 = ks__io_v2(io);
  ks_shard_index *idx = NULL, *there = NULL;
  ks_status st = ks_shard_index_read(dir, a, io, &idx, err);
  if (!st && ks_shard_index_read(out_dir, a, io, &there, NULL) != KS_E_NOTFOUND)
    st = ks__err_at(err, KS_E_EXISTS, out_dir, NULL, -1, "already holds a checkpoint (or an unreadable index)");
  ks_shard_index_free(there);
  for (int f = 0; !st && f < idx->world_size; f++) st = ks_shard_verify_file(dir, idx, f, io, err);
  /* Every file is read anyway: check every header too, so that no chunk a load skips (an empty
     region reads nothing) is rewritten as something the files do not hold. */
  if (!st) st = ks_shard_check(dir, idx, io, KS_SHARD_CHECK_HEADERS, NULL, NULL, err);
  int rc = st ? 0 : v2->mkdir_fn(v2->ctx, out_dir);
  if (rc && rc != EEXIST) st = ks__err_at(err, KS_E_IO, out_dir, NULL, -1, "cannot create: %s", strerror(rc));
  ks_shard_file_info *infos = st ? NULL : ks__calloc(a, (size_t)world_size, sizeof *infos);
  if (!st && !infos) st = ks__err(err, KS_E_NOMEM, "out of memory");
  for (int r = 0; !st && r < world_size; r++) st = reshard_one(dir, idx, r, world_size, out_dir, opts, &infos[r], err);
  if (!st) st = ks_shard_write_index(out_dir, world_size, infos, opts, err);
  ks__free(a, infos);
  ks_shard_index_free(idx);
  return st;
}

typedef struct cand {
  char *path;
  ks__shard_ts ts;
} cand;

static int newer_first(const void *x, const void *y) {
  const cand *a = x, *b = y;
  int64_t ka[4] = {a->ts.epoch, a->ts.batch, a->ts.sample, a->ts.token};
  int64_t kb[4] = {b->ts.epoch, b->ts.batch, b->ts.sample, b->ts.token};
  for (int i = 0; i < 4; i++)
    if (ka[i] != kb[i]) return ka[i] < kb[i] ? 1 : -1;
  return strcmp(b->path, a->path);
}

typedef struct collector {
  const char *run_dir;
  const ks_allocator *a;
  cand *c;
  size_t n, cap;
  ks_status st;
  ks_error *err;
} collector;

static int on_dir(void *ctx, const char *name, ks_io_kind kind) {
  collector *k = ctx;
  if (name[0] == '.' || kind != KS_IO_DIR) return 0;
  char *p = ks__shard_join(k->a, k->run_dir, name);
  ks_shard_index *idx = NULL;
  if (!p) k->st = ks__err(k->err, KS_E_NOMEM, "out of memory");
  else if (ks_shard_index_read(p, k->a, NULL, &idx, NULL) != KS_OK) {
    ks__free(k->a, p); /* no index (a save that died) or not a checkpoint at all */
    return 0;
  }
  if (!k->st && k->n == k->cap) {
    size_t cap = k->cap ? k->cap * 2 : 8;
    cand *q = ks__realloc(k->a, k->c, cap * sizeof *q);
    if (!q) k->st = ks__err(k->err, KS_E_NOMEM, "out of memory");
    else k->c = q, k->cap = cap;
  }
  if (!k->st) {
    k->c[k->n].path = p;
    k->c[k->n++].ts = idx->ts;
  } else
    ks__free(k->a, p);
  ks_shard_index_free(idx);
  return k->st ? ECANCELED : 0;
}

KS_NODISCARD static ks_status collect(const char *run_dir, const ks_allocator *a, cand **out, size_t *n,
                                      ks_error *err) {
  const ks_io *io = ks_io_posix();
  collector k = {run_dir, a, NULL, 0, 0, KS_OK, err};
  int rc = io->list_fn(io->ctx, run_dir, "", on_dir, &k);
  if (!k.st && rc) k.st = ks__err_at(err, KS_E_IO, run_dir, NULL, -1, "cannot list: %s", strerror(rc));
  *out = k.c;
  *n = k.n;
  return k.st;
}

static int verifies(const char *dir, const ks_allocator *a) {
  ks_shard_index *idx;
  if (ks_shard_index_read(dir, a, NULL, &idx, NULL)) return 0;
  int ok = 1;
  for (int f = 0; ok && f < idx->world_size; f++) ok = ks_shard_verify_file(dir, idx, f, NULL, NULL) == KS_OK;
  ks_shard_index_free(idx);
  return ok;
}

ks_status ks_shard_latest(const char *run_dir, const ks_allocator *alloc, char **path, size_t *skipped,
                          ks_error *err) {
  if (!run_dir || !path) return ks__err(err, KS_E_INVALID, "ks_shard_latest: NULL argument");
  *path = NULL;
  if (skipped) *skipped = 0;
  cand *c = NULL;
  size_t n = 0;
  ks_status st = collect(run_dir, alloc, &c, &n, err);
  if (!st && n) qsort(c, n, sizeof *c, newer_first);
  for (size_t i = 0; !st && i < n && !*path; i++) {
    if (verifies(c[i].path, alloc)) {
      *path = c[i].path;
      c[i].path = NULL;
    } else if (skipped)
      (*skipped)++;
  }
  for (size_t i = 0; i < n; i++) ks__free(alloc, c[i].path);
  ks__free(alloc, c);
  return st;
}
