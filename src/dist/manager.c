/*
 * The checkpoint manager over MPI: rank 0 owns the run directory (dead saves,
 * `latest`, retention, choosing what to resume from); every rank writes and
 * reads its own file. Each step ends in an agreement, so every rank returns
 * the same status and none is left waiting.
 */
#include <stdio.h>
#include <string.h>

#include <stdlib.h>

#include "dist/dist_internal.h"

/*
 * Rank 0's manager keeps the clocks (intervals, save_every_seconds: its last save is the one
 * that counts); a preemption signal counts on any rank.
 */
int ks_dist_ckpt_should_save(MPI_Comm comm, const ks_ckpt_manager *m, const ks_timestamp *ts, int epoch_end) {
  int rank = 0, any = 1;
  if (MPI_Comm_rank(comm, &rank) != MPI_SUCCESS) return 1;
  int mine = rank == 0 ? ks_ckpt_manager_should_save(m, ts, epoch_end) != 0 : !epoch_end && ks_preemption_signal() != 0;
  if (MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, comm) != MPI_SUCCESS) return 1;
  return any;
}

static KS_NODISCARD ks_status rank_of(MPI_Comm comm, int *rank, ks_error *err) {
  return ks__mpi_check(MPI_Comm_rank(comm, rank), "MPI_Comm_rank", err);
}

ks_status ks_dist_ckpt_save(MPI_Comm comm, ks_ckpt_manager *m, const ks_state *st, const ks_shard_map *shards,
                            const ks_dist_save_opts *opts, const char **saved, ks_error *err) {
  int rank = 0;
  ks_status s = m && st ? rank_of(comm, &rank, err) : ks__err(err, KS_E_INVALID, "ks_dist_ckpt_save: NULL argument");
  ks_timestamp zero;
  ks_timestamp_init(&zero);
  const ks_timestamp *ts = st ? ks_state_timestamp(st) : NULL;
  const char *dir = NULL;
  if (!s) s = rank == 0 ? ks_ckpt_manager_dir_begin(m, ts ? ts : &zero, &dir, NULL, err)
                        : ks_ckpt_manager_dir_path(m, ts ? ts : &zero, &dir, err);
  ks_statedict *sd = NULL;
  ks_meta *meta = NULL;
  if (!s) s = ks_statedict_create(NULL, &sd, err);
  if (!s) s = ks_meta_create(NULL, &meta, err);
  if (!s) s = ks_state_to_state_dict(st, sd, meta, err);
  s = ks_dist_agree(comm, s, err);
  ks_dist_save_opts o = opts ? *opts : (ks_dist_save_opts){0};
  if (!o.io) o.io = ks_ckpt_manager_io(m); /* the manager's storage, unless the caller names another */
  if (!s) s = ks_dist_save(comm, dir, sd, meta, shards, &o, err);
  ks_statedict_free(sd);
  ks_meta_free(meta);
  if (!s && rank == 0) s = ks_ckpt_manager_dir_commit(m, dir, err);
  s = ks_dist_agree(comm, s, err);
  if (!s && saved) *saved = dir;
  return s;
}

/* Rank 0's choice, broadcast: the same directory (or none) on every rank, as a malloc'd copy. */
static KS_NODISCARD ks_status choose(MPI_Comm comm, int rank, ks_ckpt_manager *m, char **dir, ks_error *err) {
  const char *mine = NULL;
  ks_status s = rank == 0 ? ks_ckpt_manager_dir_latest(m, &mine, err) : KS_OK;
  int len = mine ? (int)strlen(mine) + 1 : 0;
  *dir = NULL;
  s = ks_dist_agree(comm, s, err);
  if (!s) s = ks__mpi_check(MPI_Bcast(&len, 1, MPI_INT, 0, comm), "MPI_Bcast", err);
  char *buf = !s && len > 0 ? ks__malloc(NULL, (size_t)len) : NULL;
  if (!s && len > 0 && !buf) s = ks__err(err, KS_E_NOMEM, "out of memory");
  s = ks_dist_agree(comm, s, err);
  if (!s && len > 0 && rank == 0) memcpy(buf, mine, (size_t)len);
  if (!s && len > 0) s = ks__mpi_check(MPI_Bcast(buf, len, MPI_CHAR, 0, comm), "MPI_Bcast", err);
  s = ks_dist_agree(comm, s, err);
  if (s) ks__free(NULL, buf);
  else *dir = buf;
  return s;
}

ks_status ks_dist_ckpt_autoresume(MPI_Comm comm, ks_ckpt_manager *m, ks_state *st, const ks_shard_map *want,
                                  const ks_load_opts *opts, ks_load_report *report, int *resumed, char **path,
                                  ks_error *err) {
  int rank = 0;
  ks_status s = m && st && resumed ? rank_of(comm, &rank, err)
                                   : ks__err(err, KS_E_INVALID, "ks_dist_ckpt_autoresume: NULL argument");
  if (resumed) *resumed = 0;
  if (path) *path = NULL;
  s = ks_dist_agree(comm, s, err);
  char *dir = NULL;
  if (!s) s = choose(comm, rank, m, &dir, err);
  if (s || !dir) return s;
  ks_statedict *sd = NULL;
  ks_meta *meta = NULL;
  ks_shard_load_opts lo = {.alloc = NULL, .no_verify = 1, .io = ks_ckpt_manager_io(m)}; /* rank 0 just verified them */
  s = ks_dist_load(comm, dir, want, &lo, &sd, &meta, err);
  if (!s) s = ks_dist_agree(comm, ks_state_load_state_dict(st, sd, meta, opts, report, err), err);
  ks_statedict_free(sd);
  ks_meta_free(meta);
  if (!s) *resumed = 1;
  if (!s && path) *path = dir;
  else ks__free(NULL, dir);
  return s;
}
