/**
 * @file dist.h
 * Distributed runs on MPI: metric synchronisation and sharded checkpoints.
 *
 * Built only when keepsake is configured with MPI (KS_WITH_MPI resolves ON);
 * the core library never needs MPI, so keepsake.h does not include this header.
 * Every function here is collective over `comm`: all ranks of the communicator
 * must call it, in the same order, with compatible arguments. Every one of
 * them ends with an agreement step (an MPI_Allreduce of the local status), so
 * either every rank succeeds or every rank returns the same status and the same
 * ks_error (that of the lowest failing rank); no rank is left waiting.
 *
 * Thread safety: as MPI itself; a communicator must not be used for these calls
 * from two threads at once.
 */
#ifndef KEEPSAKE_DIST_H
#define KEEPSAKE_DIST_H

#include "keepsake/export.h"

#include <mpi.h>

#include "keepsake/format.h"
#include "keepsake/manager.h"
#include "keepsake/metric.h"
#include "keepsake/shard.h"
#include "keepsake/statedict.h"
#include "keepsake/status.h"

KS_BEGIN_DECLS

/* ------------------------------------------------------------------------ */
/* Agreement on a status.                                                    */
/* ------------------------------------------------------------------------ */

/**
 * Collective: makes every rank return the same result. When every rank passes
 * KS_OK, returns KS_OK. Otherwise the lowest rank whose `local` is not KS_OK
 * broadcasts its status and its *err, and every rank returns that status with
 * that error copied into its own err (when not NULL).
 * @return the agreed status; KS_E_IO when MPI itself fails.
 */
KS_NODISCARD ks_status ks_dist_agree(MPI_Comm comm, ks_status local, ks_error *err);

/* ------------------------------------------------------------------------ */
/* Metric synchronisation (torchmetrics sync / unsync).                      */
/* ------------------------------------------------------------------------ */

/** The local states a sync replaced, kept so unsync can put them back. */
typedef struct ks_dist_cache ks_dist_cache;

/**
 * Collective: replaces every metric of `c` by the reduction of that metric over
 * all ranks, as torchmetrics' sync() does. Every rank's states are gathered
 * (MPI_Allgatherv, so ranks may hold cat states of different lengths, zero
 * included) and folded with ks_metric_merge in rank order: the one merge rule,
 * so sum / max / min states reduce element-wise, mean states by their update
 * counts, cat states concatenate rank 0's rows first, and update counts add
 * up. Every rank folds the same bytes in the same order, so every rank ends
 * with bit-identical states, and compute() equals the single-process result on
 * the union of the data fed in rank order (exactly, up to the association of
 * floating-point sums).
 *
 * The collections must hold the same metrics (name, class, arguments) in the
 * same order on every rank; otherwise KS_E_MISMATCH naming the metric and rank.
 *
 * @param c     the local collection; changed only on success.
 * @param alloc scratch memory and the cache; NULL for malloc.
 * @param cache receives the local states (free with ks_dist_cache_free, or pass
 *              to ks_dist_unsync). May be NULL when the local states are not needed.
 * @return KS_OK, KS_E_MISMATCH, KS_E_LIMIT (a rank holds more than 2 GiB of
 *         states), KS_E_NOMEM, KS_E_IO (MPI failed); the same on every rank.
 *         On error every rank's collection is unchanged and *cache untouched.
 */
KS_NODISCARD ks_status ks_dist_sync(ks_metric_collection *c, MPI_Comm comm, const ks_allocator *alloc,
                       ks_dist_cache **cache, ks_error *err);

/**
 * Local (not collective): puts back the states that the sync which produced
 * `cache` replaced, as torchmetrics' unsync() does: states, update counts, and
 * the cached results are dropped. The cache stays owned by the caller.
 * @return KS_OK, KS_E_MISMATCH (cache from another collection), KS_E_NOMEM.
 */
KS_NODISCARD ks_status ks_dist_unsync(ks_metric_collection *c, const ks_dist_cache *cache, ks_error *err);

/** Frees a cache. Accepts NULL. */
void ks_dist_cache_free(ks_dist_cache *cache);

/* ------------------------------------------------------------------------ */
/* Sharded checkpoints.                                                      */
/* ------------------------------------------------------------------------ */

/** Options of ks_dist_save. All-zero (or NULL) gives the defaults. */
typedef struct ks_dist_save_opts {
  const ks_allocator *alloc; /**< scratch memory; NULL = malloc */
  const ks_io *io;           /**< passed to ks_save for the rank's file; NULL = POSIX */
  /**
   * Globs (ks_path_match, binding.h) of the entries saved by every rank rather than once.
   * NULL = ks_shard_default_per_rank(): rng, dataset positions and the train and eval metrics.
   */
  const char *const *per_rank;
  size_t n_per_rank;
} ks_dist_save_opts;

/**
 * Collective: writes one sharded checkpoint directory `dir` (created when
 * missing; its parent must exist; an index and temporary files left there by an
 * earlier save are removed first). Each rank writes `rank-XXXXX-of-YYYYY.keepsake`
 * holding its chunks of the sharded tensors (named in `shards`), its per-rank
 * entries and, on rank 0 only, the replicated entries (everything else: model
 * tensors not sharded, hyperparameters, timestamp). Then every rank hashes its
 * file, the ranks agree on the outcome, rank 0 gathers each file's size and
 * checksum after a barrier, and writes the index `model.safetensors.index.json`
 * last (atomically, durably): the commit marker. A directory without it is not
 * a checkpoint.
 *
 * The timestamps (state/timestamp/Timestamp/ counters) of all ranks must agree.
 *
 * @param sd    this rank's flattened state (ks_state_to_state_dict).
 * @param meta  this rank's file metadata (the keepsake.metrics entry); may be NULL.
 * @param shards this rank's chunk of each sharded tensor; NULL when nothing is sharded.
 * @return KS_OK; KS_E_MISMATCH (timestamps or world sizes differ; the message names the
 *         ranks); KS_E_IO; KS_E_INVALID; KS_E_NOMEM; any ks_save error. The same on every
 *         rank. On error no index is written (a previous checkpoint stays the newest).
 *         KS_E_NOT_DURABLE: the checkpoint is committed (its index is in place) but a
 *         directory fsync failed after a rename, so it may not survive a crash: returned on
 *         every rank for the index, on the affected rank only for its own file.
 */
KS_NODISCARD ks_status ks_dist_save(MPI_Comm comm, const char *dir, const ks_statedict *sd, const ks_meta *meta,
                       const ks_shard_map *shards, const ks_dist_save_opts *opts, ks_error *err);

/**
 * Collective: loads this rank's part of a sharded checkpoint written by N ranks
 * on the M ranks of `comm` (any M >= 1); see ks_shard_load_rank for what each
 * rank receives. Before anything is read, the files are verified against the
 * index (size and whole-file checksum), file f by rank f mod M, and the ranks
 * agree on the result.
 * @return as ks_shard_load_rank; the same status on every rank.
 */
KS_NODISCARD ks_status ks_dist_load(MPI_Comm comm, const char *dir, const ks_shard_map *want,
                                    const ks_shard_load_opts *opts, ks_statedict **sd, ks_meta **meta, ks_error *err);

/**
 * Collective: the newest complete checkpoint directory of `run_dir`, as
 * ks_shard_latest finds it on rank 0 (directories without an index, such as a
 * save that a dying rank interrupted, are ignored; ones that fail to verify are
 * skipped), broadcast so every rank resumes from the same one.
 * @param path receives a malloc'd path, or NULL when there is no checkpoint.
 * @return KS_OK (also when there is none), KS_E_IO, KS_E_NOMEM; the same on every rank.
 */
KS_NODISCARD ks_status ks_dist_latest(MPI_Comm comm, const char *run_dir, char **path, ks_error *err);

/* ------------------------------------------------------------------------ */
/* The checkpoint manager over sharded directories.                         */
/* ------------------------------------------------------------------------ */

/**
 * Collective: nonzero on every rank when rank 0's manager says a checkpoint is due
 * (ks_ckpt_manager_should_save: interval, save_every_seconds, a preemption signal)
 * or a preemption signal reached any rank at a batch boundary, so all ranks save
 * together and by one clock. Returns 1 when MPI fails (a save is then attempted,
 * and its agreement reports the failure).
 */
int ks_dist_ckpt_should_save(MPI_Comm comm, const ks_ckpt_manager *m, const ks_timestamp *ts, int epoch_end);

/**
 * Collective: one checkpoint of a manager created with opts.sharded on every rank
 * (same options): rank 0 removes the directories of dead saves
 * (ks_ckpt_manager_dir_begin), every rank writes its file of run_dir/<template>
 * with ks_dist_save (the index last), then rank 0 points `latest` at it and applies
 * retention (ks_ckpt_manager_dir_commit).
 * @param st     this rank's state; its timestamp names the directory (the same on every rank).
 * @param shards this rank's chunks of sharded tensors, or NULL (data parallel: all replicated).
 * @param opts   as for ks_dist_save; its io NULL = the manager's (ks_ckpt_manager_io, binding.h); may be NULL.
 * @param saved  optional; receives the directory (owned by the manager, valid until its next call).
 * @return KS_OK or the first failure (any rank's), the same on every rank; on failure no index
 *         is written and `latest` still names the previous checkpoint.
 */
KS_NODISCARD ks_status ks_dist_ckpt_save(MPI_Comm comm, ks_ckpt_manager *m, const ks_state *st,
                                         const ks_shard_map *shards, const ks_dist_save_opts *opts, const char **saved,
                                         ks_error *err);

/**
 * Collective: resumes every rank from the newest complete checkpoint directory
 * whose files verify (ks_ckpt_manager_dir_latest on rank 0, which also removes
 * the directories of dead saves), loaded with ks_dist_load (each rank its own
 * per-rank state at the same world size; merged or split at another) and
 * ks_state_load_state_dict.
 * @param want     this rank's chunks of sharded tensors, or NULL (whole tensors).
 * @param resumed  receives 1 when a checkpoint was loaded, 0 when there was none (every rank alike).
 * @param path     optional; receives a malloc'd copy of the directory loaded (free() it), or NULL.
 * @return KS_OK (also when there is nothing to resume) or the first failure, the same on every rank.
 */
KS_NODISCARD ks_status ks_dist_ckpt_autoresume(MPI_Comm comm, ks_ckpt_manager *m, ks_state *st,
                                               const ks_shard_map *want, const ks_load_opts *opts,
                                               ks_load_report *report, int *resumed, char **path, ks_error *err);

/**
 * Background sharded saves with a manager: the file writes overlap training,
 * the collective steps stay on the calling thread (no MPI thread support needed).
 * The commit (agreement on every rank's write, the index, `latest`, retention)
 * is deferred to the next ks_dist_saver_save or ks_dist_saver_wait, so a save's
 * directory has no index until then; a crash before it leaves a dead save that
 * the next save or autoresume removes, and the previous checkpoint stays the newest.
 */
typedef struct ks_dist_saver ks_dist_saver;

/** Local: a saver for the manager `m` (sharded) on `comm`. Free with ks_dist_saver_free. */
KS_NODISCARD ks_status ks_dist_saver_create(MPI_Comm comm, ks_ckpt_manager *m, ks_dist_saver **out, ks_error *err);

/**
 * Local: frees the saver. A write in flight is waited for, but not committed
 * (committing is collective: call ks_dist_saver_wait first). Accepts NULL.
 */
void ks_dist_saver_free(ks_dist_saver *s);

/**
 * Collective: commits the previous save (as ks_dist_saver_wait; its error is
 * returned here, once), begins the directory for `st`'s timestamp (rank 0
 * removes dead saves and prepares it; timestamps compared), snapshots this
 * rank's state (a deep copy: training may go on at once) and returns while a
 * thread writes this rank's file.
 * @param opts copied; the strings and the io table it points to must outlive the save.
 * @param saved optional; receives the directory being written (owned by the manager).
 * @return KS_OK (started), or the first failure, the same on every rank.
 */
KS_NODISCARD ks_status ks_dist_saver_save(ks_dist_saver *s, const ks_state *st, const ks_shard_map *shards,
                             const ks_dist_save_opts *opts, const char **saved, ks_error *err);

/**
 * Collective: waits for the write in flight on every rank and commits it (index by
 * rank 0, then `latest` and retention). KS_OK at once when no save is pending.
 * @return KS_OK or the first failure (any rank's write, the index, retention), the same on every rank.
 */
KS_NODISCARD ks_status ks_dist_saver_wait(ks_dist_saver *s, ks_error *err);

KS_END_DECLS
#endif
