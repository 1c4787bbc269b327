/*
 * Background sharded saves. The collective steps stay on the calling thread
 * (MPI needs no thread support): the save begins collectively (rank 0 prepares
 * the directory, the timestamps are compared), each rank snapshots its state
 * and a thread writes its file while training goes on, and the commit (every
 * rank's result agreed, sizes and checksums gathered, the index, `latest`,
 * retention) happens at the next collective point: the next save, or
 * ks_dist_saver_wait. Until then the directory has no index: a crash leaves a
 * dead save, which the next save or resume removes.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "dist/dist_internal.h"

struct ks_dist_saver {
  MPI_Comm comm;
  ks_ckpt_manager *m;
  int rank, size;
  int in_flight;   /* a thread was started and not yet joined */
  int uncommitted; /* its file is written (or failed) but the index not yet committed */
  pthread_t thread;
  /* The snapshot and what the thread needs, owned until the commit. */
  char *dir;
  ks_statedict *sd;
  ks_meta *meta;
  ks_shard_map *shards;
  ks_dist_save_opts opts;
  ks_status result;
  ks_shard_file_info info;
  ks_error err;
};

ks_status ks_dist_saver_create(MPI_Comm comm, ks_ckpt_manager *m, ks_dist_saver **out, ks_error *err) {
  if (!m || !out) return ks__err(err, KS_E_INVALID, "ks_dist_saver_create: NULL argument");
  ks_dist_saver *s = ks__calloc(NULL, 1, sizeof *s);
  if (!s) return ks__err(err, KS_E_NOMEM, "out of memory");
  s->comm = comm;
  s->m = m;
  ks_status st = ks__mpi_check(MPI_Comm_rank(comm, &s->rank), "MPI_Comm_rank", err);
  if (!st) st = ks__mpi_check(MPI_Comm_size(comm, &s->size), "MPI_Comm_size", err);
  if (st) {
    ks__free(NULL, s);
    return st;
  }
  *out = s;
  return KS_OK;
}

static void drop_snapshot(ks_dist_saver *s) {
  ks_statedict_free(s->sd);
  ks_meta_free(s->meta);
  ks_shard_map_free(s->shards);
  ks__free(NULL, s->dir);
  s->sd = NULL;
  s->meta = NULL;
  s->shards = NULL;
  s->dir = NULL;
}

static void join(ks_dist_saver *s) {
  if (!s->in_flight) return;
  pthread_join(s->thread, NULL);
  s->in_flight = 0;
}

void ks_dist_saver_free(ks_dist_saver *s) {
  if (!s) return;
  join(s); /* the file lands (or fails); without a commit it is a dead save, removed later */
  drop_snapshot(s);
  ks__free(NULL, s);
}

ks_status ks_dist_saver_wait(ks_dist_saver *s, ks_error *err) {
  if (!s) return ks__err(err, KS_E_INVALID, "ks_dist_saver_wait: NULL saver");
  int mine = s->uncommitted, any = 0;
  ks_status st = ks__mpi_check(MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, s->comm), "MPI_Allreduce", err);
  if (st || !any) return ks_dist_agree(s->comm, st, err);
  join(s);
  ks_status local = s->uncommitted ? s->result : ks__err(&s->err, KS_E_STATE, "rank %d has no save to commit", s->rank);
  if (local && err) *err = s->err;
  st = ks__dist_save_commit(s->comm, s->dir, local, &s->info, &s->opts, err);
  if (!st && s->rank == 0) st = ks_ckpt_manager_dir_commit(s->m, s->dir, err);
  st = ks_dist_agree(s->comm, st, err);
  s->uncommitted = 0;
  drop_snapshot(s);
  return st;
}

static void *write_thread(void *arg) {
  ks_dist_saver *s = arg;
  ks_save_opts so = {.alloc = s->opts.alloc, .io = s->opts.io};
  ks_error_clear(&s->err);
  s->result = ks_shard_write_rank(s->dir, s->rank, s->size, s->sd, s->meta, s->shards, s->opts.per_rank,
                                  s->opts.n_per_rank, &so, &s->info, &s->err);
  return NULL;
}

/* A deep copy of this rank's state and chunk map: training may change the originals at once. */
static KS_NODISCARD ks_status snapshot(ks_dist_saver *s, const ks_state *st, const ks_shard_map *shards,
                                       ks_error *err) {
  ks_statedict *view = NULL;
  ks_meta *meta = NULL;
  ks_status r = ks_statedict_create(NULL, &view, err);
  if (!r) r = ks_meta_create(NULL, &meta, err);
  if (!r) r = ks_state_to_state_dict(st, view, meta, err);
  if (!r) r = ks_statedict_create(NULL, &s->sd, err);
  if (!r) r = ks_shard_map_create(NULL, &s->shards, err);
  for (size_t i = 0; !r && i < ks_statedict_count(view); i++) {
    ks_entry e;
    r = ks_statedict_at(view, i, &e);
    if (!r) r = ks_statedict_set_entry(s->sd, e.name, &e, KS_COPY, err);
  }
  for (size_t i = 0; !r && shards && i < ks_shard_map_count(shards); i++) {
    ks_shard_chunk c;
    r = ks_shard_map_at(shards, i, &c);
    if (!r) r = ks_shard_map_add(s->shards, c.name, c.rank, c.global_shape, c.offsets, c.shape, err);
  }
  ks_statedict_free(view);
  s->meta = meta;
  return r;
}

ks_status ks_dist_saver_save(ks_dist_saver *s, const ks_state *st, const ks_shard_map *shards,
                             const ks_dist_save_opts *opts, const char **saved, ks_error *err) {
  if (!s || !st) return ks__err(err, KS_E_INVALID, "ks_dist_saver_save: NULL argument");
  ks_status r = ks_dist_saver_wait(s, err); /* the previous save commits (or its error surfaces) first */
  if (r) return r;
  ks_timestamp zero;
  ks_timestamp_init(&zero);
  const ks_timestamp *ts = ks_state_timestamp(st);
  const char *dir = NULL;
  r = s->rank == 0 ? ks_ckpt_manager_dir_begin(s->m, ts ? ts : &zero, &dir, NULL, err)
                   : ks_ckpt_manager_dir_path(s->m, ts ? ts : &zero, &dir, err);
  if (!r && !(s->dir = ks__strdup(NULL, dir))) r = ks__err(err, KS_E_NOMEM, "out of memory");
  if (!r) r = snapshot(s, st, shards, err);
  s->opts = opts ? *opts : (ks_dist_save_opts){0};
  if (!s->opts.io) s->opts.io = ks_ckpt_manager_io(s->m);
  r = ks_dist_agree(s->comm, r, err);
  int rank, size;
  if (!r) r = ks__dist_save_begin(s->comm, s->dir, s->sd, &s->opts, &rank, &size, err);
  if (!r && pthread_create(&s->thread, NULL, write_thread, s))
    r = ks__err(err, KS_E_IO, "cannot start the save thread");
  if (!r) s->in_flight = 1;
  r = ks_dist_agree(s->comm, r, err);
  if (r) {
    join(s);
    drop_snapshot(s);
    return r;
  }
  s->uncommitted = 1;
  if (saved) *saved = dir;
  return KS_OK;
}
