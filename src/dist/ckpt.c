/*
 * Sharded checkpoints over MPI: every rank writes its own file, the ranks
 * agree, rank 0 gathers each file's size and checksum after a barrier and
 * writes the index last. Loading verifies the files in parallel (file f on
 * rank f mod M) and then builds each rank's part (src/shard, no MPI there).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "core/io_ops.h"
#include "dist/dist_internal.h"

/* What the index records (ks_shard_index_get), by value. */
static ks_shard_index_info index_info(const ks_shard_index *idx) {
  ks_shard_index_info info = KS_OPTS_INIT(ks_shard_index_info);
  ks_shard_index_get(idx, &info);
  return info;
}

/* Temporary files a save that died left behind (".<name>.tmp-XXXXXX"): nothing else writes them. */
typedef struct leftovers {
  const ks_io *io;
  const char *dir;
} leftovers;

static int on_leftover(void *ctx, const char *name, ks_io_kind kind) {
  leftovers *l = ctx;
  char p[4096];
  if (kind == KS_IO_DIR || !strstr(name, ".tmp-") || snprintf(p, sizeof p, "%s/%s", l->dir, name) >= (int)sizeof p)
    return 0;
  (void)ks__io_v1(l->io)->unlink_fn(ks__io_v1(l->io)->ctx, p); /* a failure only leaves a file no reader takes */
  return 0;
}

static KS_NODISCARD ks_status prepare_dir(int rank, const char *dir, const ks_io *io, ks_error *err) {
  if (rank != 0) return KS_OK;
  const ks_io *v1 = ks__io_v1(io), *v2 = ks__io_v2(io);
  int rc = v2->mkdir_fn(v2->ctx, dir);
  if (rc && rc != EEXIST)
    return ks__err_at(err, KS_E_IO, dir, NULL, -1, "cannot create the checkpoint directory: %s", strerror(rc));
  leftovers l = {io, dir};
  (void)v2->list_fn(v2->ctx, dir, ".", on_leftover, &l);
  /* Rewriting a checkpoint: drop its commit marker first, so a crash cannot leave an index naming new files. */
  size_t n = strlen(dir) + sizeof "/" KS_SHARD_INDEX_NAME;
  char *idx = ks__malloc(NULL, n);
  if (!idx) return ks__err(err, KS_E_NOMEM, "out of memory");
  snprintf(idx, n, "%s/%s", dir, KS_SHARD_INDEX_NAME);
  ks_status st = KS_OK;
  if ((rc = v1->unlink_fn(v1->ctx, idx)) != 0 && rc != ENOENT)
    st = ks__err_at(err, KS_E_IO, idx, NULL, -1, "cannot remove the old index: %s", strerror(rc));
  ks__free(NULL, idx);
  return st;
}

static int64_t ts_field(const ks_statedict *sd, const char *name) {
  ks_entry e;
  return ks_statedict_get(sd, name, &e) == KS_OK && e.kind == KS_VAL_INT ? e.i : INT64_MIN;
}

/* Every rank's timestamp counters must equal rank 0's. */
static KS_NODISCARD ks_status check_timestamps(MPI_Comm comm, int rank, int size, const ks_statedict *sd,
                                               ks_error *err) {
  static const char *const names[4] = {"state/timestamp/Timestamp/epoch", "state/timestamp/Timestamp/batch",
                                       "state/timestamp/Timestamp/sample", "state/timestamp/Timestamp/token"};
  int64_t mine[4], *all = ks__calloc(NULL, (size_t)size * 4, sizeof(int64_t));
  for (int i = 0; i < 4; i++) mine[i] = ts_field(sd, names[i]);
  ks_status st = ks_dist_agree(comm, all ? KS_OK : ks__err(err, KS_E_NOMEM, "out of memory"), err);
  if (!st) st = ks__mpi_check(MPI_Allgather(mine, 4, MPI_INT64_T, all, 4, MPI_INT64_T, comm), "MPI_Allgather", err);
  for (int q = 1; !st && q < size; q++)
    if (memcmp(all + 4 * q, all, 4 * sizeof(int64_t)))
      st = ks__err(err, KS_E_MISMATCH,
                   "timestamps differ across ranks: rank %d is at epoch %lld batch %lld sample %lld, rank 0 at epoch "
                   "%lld batch %lld sample %lld",
                   q, (long long)all[4 * q], (long long)all[4 * q + 1], (long long)all[4 * q + 2], (long long)all[0],
                   (long long)all[1], (long long)all[2]);
  (void)rank;
  ks__free(NULL, all);
  return st;
}

ks_status ks__dist_save_begin(MPI_Comm comm, const char *dir, const ks_statedict *sd, const ks_dist_save_opts *opts,
                              int *rank, int *size, ks_error *err) {
  ks_status st = dir && sd ? KS_OK : ks__err(err, KS_E_INVALID, "ks_dist_save: NULL argument");
  if (!st) st = ks__mpi_check(MPI_Comm_rank(comm, rank), "MPI_Comm_rank", err);
  if (!st) st = ks__mpi_check(MPI_Comm_size(comm, size), "MPI_Comm_size", err);
  if (!st && *size > KS_SHARD_MAX_WORLD)
    st = ks__err(err, KS_E_LIMIT, "world size %d is above %d", *size, KS_SHARD_MAX_WORLD);
  if (!st) st = prepare_dir(*rank, dir, opts ? opts->io : NULL, err);
  st = ks_dist_agree(comm, st, err);
  if (!st) st = check_timestamps(comm, *rank, *size, sd, err);
  return st;
}

ks_status ks__dist_save_commit(MPI_Comm comm, const char *dir, ks_status local, const ks_shard_file_info *info,
                               const ks_dist_save_opts *opts, ks_error *err) {
  int rank = 0, size = 1;
  /* A rank file in place whose directory fsync failed can still be committed: the index
     lists it, and this rank reports KS_E_NOT_DURABLE at the end instead of failing all. */
  ks_status soft = local == KS_E_NOT_DURABLE ? local : KS_OK;
  ks_status st = ks_dist_agree(comm, soft ? KS_OK : local, err);
  if (!st) st = ks__mpi_check(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank", err);
  if (!st) st = ks__mpi_check(MPI_Comm_size(comm, &size), "MPI_Comm_size", err);
  if (st) return ks_dist_agree(comm, st, err);
  /* Every file is durable: only now does rank 0 learn the sizes and checksums and commit. */
  st = ks__mpi_check(MPI_Barrier(comm), "MPI_Barrier", err);
  uint64_t mine[2] = {info->size, info->checksum};
  ks_shard_file_info *infos = rank == 0 ? ks__calloc(NULL, (size_t)size, sizeof *infos) : NULL;
  if (!st && rank == 0 && !infos) st = ks__err(err, KS_E_NOMEM, "out of memory");
  st = ks_dist_agree(comm, st, err);
  if (!st) st = ks__mpi_check(MPI_Gather(mine, 2, MPI_UINT64_T, infos, 2, MPI_UINT64_T, 0, comm), "MPI_Gather", err);
  ks_save_opts so = {.alloc = opts ? opts->alloc : NULL, .io = opts ? opts->io : NULL};
  if (!st && rank == 0) st = ks_shard_write_index(dir, size, infos, &so, err);
  ks__free(NULL, infos);
  st = ks_dist_agree(comm, st, err);
  return st ? st : soft; /* err still holds the rank file's KS_E_NOT_DURABLE details */
}

ks_status ks_dist_save(MPI_Comm comm, const char *dir, const ks_statedict *sd, const ks_meta *meta,
                       const ks_shard_map *shards, const ks_dist_save_opts *opts, ks_error *err) {
  int rank = 0, size = 1;
  ks_status st = ks__dist_save_begin(comm, dir, sd, opts, &rank, &size, err);
  if (st) return st;
  ks_save_opts so = {.alloc = opts ? opts->alloc : NULL, .io = opts ? opts->io : NULL};
  ks_shard_file_info info = {0, 0};
  ks_status local = ks_shard_write_rank(dir, rank, size, sd, meta, shards, opts ? opts->per_rank : NULL,
                                        opts ? opts->n_per_rank : 0, &so, &info, err);
  return ks__dist_save_commit(comm, dir, local, &info, opts, err);
}

ks_status ks_dist_load(MPI_Comm comm, const char *dir, const ks_shard_map *want, const ks_shard_load_opts *opts,
                       ks_statedict **sd, ks_meta **meta, ks_error *err) {
  int rank = 0, size = 1;
  ks_status st = dir && sd && meta ? KS_OK : ks__err(err, KS_E_INVALID, "ks_dist_load: NULL argument");
  if (!st) st = ks__mpi_check(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank", err);
  if (!st) st = ks__mpi_check(MPI_Comm_size(comm, &size), "MPI_Comm_size", err);
  const ks_allocator *a = opts ? opts->alloc : NULL;
  const ks_io *io = opts ? opts->io : NULL;
  ks_shard_index *idx = NULL;
  if (!st) st = ks_shard_index_read(dir, a, io, &idx, err);
  st = ks_dist_agree(comm, st, err);
  for (int f = rank; !st && !(opts && opts->no_verify) && f < index_info(idx).world_size; f += size)
    st = ks_shard_verify_file(dir, idx, f, io, err);
  if (idx) st = ks_dist_agree(comm, st, err);
  ks_statedict *out = NULL;
  ks_meta *m = NULL;
  ks_shard_load_opts lo = {a, 1, io};
  if (!st) st = ks_dist_agree(comm, ks_shard_load_rank(dir, idx, rank, size, want, &lo, &out, &m, err), err);
  ks_shard_index_free(idx);
  if (st) {
    ks_statedict_free(out);
    ks_meta_free(m);
    return st;
  }
  *sd = out;
  *meta = m;
  return KS_OK;
}

ks_status ks_dist_latest(MPI_Comm comm, const char *run_dir, char **path, ks_error *err) {
  int rank = 0;
  ks_status st = run_dir && path ? KS_OK : ks__err(err, KS_E_INVALID, "ks_dist_latest: NULL argument");
  if (!st) st = ks__mpi_check(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank", err);
  char *found = NULL;
  if (!st && rank == 0) st = ks_shard_latest(run_dir, NULL, &found, NULL, err);
  int len = found ? (int)strlen(found) + 1 : 0;
  st = ks_dist_agree(comm, st, err);
  if (!st) st = ks__mpi_check(MPI_Bcast(&len, 1, MPI_INT, 0, comm), "MPI_Bcast", err);
  if (!st && rank != 0 && len > 0 && !(found = ks__malloc(NULL, (size_t)len)))
    st = ks__err(err, KS_E_NOMEM, "out of memory");
  st = ks_dist_agree(comm, st, err);
  if (!st && len > 0) st = ks__mpi_check(MPI_Bcast(found, len, MPI_CHAR, 0, comm), "MPI_Bcast", err);
  if (st) {
    ks__free(NULL, found);
    return st;
  }
  *path = found;
  return KS_OK;
}
