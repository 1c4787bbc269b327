/**
 * @file manager.h
 * The checkpoint manager: save intervals, a name template, retention, a
 * `latest` symlink and autoresume from the newest checkpoint that verifies.
 *
 * Thread safety: a manager may not be used from two threads at once; distinct
 * managers are independent (there is no global state).
 */
#ifndef KEEPSAKE_MANAGER_H
#define KEEPSAKE_MANAGER_H

#include "keepsake/export.h"

#include <stdio.h>

#include "keepsake/alloc.h"
#include "keepsake/io.h"
#include "keepsake/state.h"
#include "keepsake/status.h"
#include "keepsake/train.h"

KS_BEGIN_DECLS

/* ------------------------------------------------------------------------ */
/* Checkpoint manager.                                                       */
/* ------------------------------------------------------------------------ */

typedef struct ks_ckpt_manager ks_ckpt_manager;

/**
 * Options of a manager. Zero-initialise: every field's zero is its default, and
 * new fields are only ever appended.
 *
 * Preservation: a checkpoint is kept when ANY configured policy keeps it (keep,
 * keep_best, keep_every, keep_period_seconds); the newest checkpoint is always
 * kept; with no policy at all, all are kept. The set is recomputed after every
 * save from the checkpoints in run_dir (their timestamps and stored metric
 * values), so it survives resumes and another spelling of run_dir. Files that
 * do not match the template, or whose header cannot be read, are never deleted.
 */
/** The run directory lock policy of ks_ckpt_opts.lock. */
typedef enum ks_ckpt_lock {
  KS_CKPT_LOCK_AUTO = 0,    /**< lock where the table can, else run unlocked */
  KS_CKPT_LOCK_REQUIRE = 1, /**< refuse a table that cannot lock (KS_E_UNSUPPORTED) */
  KS_CKPT_LOCK_OFF = 2      /**< never lock */
} ks_ckpt_lock;

typedef struct ks_ckpt_opts {
  size_t size;               /**< 0 or sizeof(this struct): see "Growing structs" in export.h */
  const char *run_dir;       /**< created if missing */
  const char *save_interval; /**< "100ba" (every 100 batches) or "2ep" (every 2 epochs); NULL = "1ep" */
  const char *filename;      /**< template with {epoch} {batch} {sample}; NULL = "ep{epoch}-ba{batch}.keepsake" */
  int keep;                  /**< keep the N newest checkpoints; 0 keeps all */
  const ks_allocator *alloc;
  const ks_io *io;           /**< passed to ks_save; NULL = POSIX */
  FILE *log;                 /**< warnings (skipped corrupt checkpoints); NULL = stderr */
  /* --- appended in 0.2 --- */
  int keep_best;             /**< keep the N best checkpoints by best_metric; 0 = off */
  /**
   * The metric keep_best ranks by, as stored in each checkpoint's own `_computed`:
   * "eval/MulticlassAccuracy" (evaluator label / metric name), "train/Name", the key
   * layout's folders "train_metrics/Name" and "eval_metrics/label/Name", or a full path
   * "state/.../Name". A checkpoint whose value is absent, None or not
   * finite (e.g. saved before the first evaluation) is never among the best; other
   * policies may still keep it. The first save whose value cannot rank is warned
   * about on the log (once per manager). See also `metrics`.
   */
  const char *best_metric;
  ks_best_mode best_mode;
  const char *keep_every;     /**< "5ep": keep checkpoints taken at the end of every 5th epoch; "500ba": at every 500th
                                 batch; NULL = off */
  double keep_period_seconds; /**< keep the first checkpoint of each period of training wall-clock time (total_wct); 0 =
                                 off */
  FILE *retention_log;       /**< if set, one line per checkpoint after each save: kept (and why) or deleted */
  double save_every_seconds; /**< ks_ckpt_manager_should_save is also true once this much time passed since the last
                                save; 0 = off */
  ks_async_busy async_busy;  /**< ks_ckpt_manager_save_async while one is in flight: wait (default) or KS_E_STATE */
  void *staging;             /**< optional caller memory for the background saver's own image (see ks_async_opts) */
  size_t staging_size;
  /* --- appended in 0.3 --- */
  /**
   * Save locally, then upload. When set, each checkpoint committed in run_dir is
   * copied to upload_dir through this second table (e.g. ks_storage_io() of
   * "s3://bucket/run", storage.h): the copy is the table's durable replace, so
   * the object is complete under its name before upload_dir's `latest` pointer
   * is set to it. This happens after the local `latest` and retention, on the
   * background thread for async saves. A failed upload is the save's error
   * (KS_E_IO, naming the upload); the local checkpoint is saved all the same,
   * and the next save uploads its own checkpoint. NULL = off. Must stay valid
   * for the manager's life.
   * Autoresume: when no checkpoint of run_dir loads (run_dir empty, missing or
   * all corrupt), the newest checkpoint of upload_dir is downloaded into run_dir
   * (durably, under its name), verified with its checksums and loaded; one that
   * does not verify is skipped with a warning (its copy renamed .corrupt) and
   * the next older one is tried.
   */
  const ks_io *upload_io;
  const char *upload_dir;     /**< the run directory in upload_io (ks_storage_path()); required with upload_io */
  /**
   * Nonzero: the preservation policies (keep, keep_best, keep_every,
   * keep_period_seconds) also delete the uploaded copies, computed from what
   * upload_dir holds. 0 (default): uploaded copies are never deleted.
   */
  int upload_retention;
  /**
   * Nonzero: checkpoints are sharded directories (keepsake/shard.h), written by the
   * ranks of a distributed run (ks_dist_ckpt_save in keepsake/dist.h) between
   * ks_ckpt_manager_dir_begin and ks_ckpt_manager_dir_commit. The template then
   * names directories (NULL = "ep{epoch}-ba{batch}"); only directories whose index
   * is present and valid are checkpoints; retention reads each one's timestamp and
   * stored metric from rank 0's file (replicated state and that rank's `_computed`,
   * which a distributed run sets from the synced metrics); deleting one removes its
   * index first, then its files, then the directory. ks_ckpt_manager_save and
   * ks_ckpt_manager_save_async refuse (KS_E_STATE); autoresume loads the newest
   * complete directory merged onto one process (see ks_shard_load_rank).
   */
  int sharded;
  /* --- appended in 0.4 --- */
  /**
   * The run directory's lock. Two managers on one run directory would delete each
   * other's checkpoints and share `latest`'s temporary link, so a manager holds an
   * exclusive lock (`run_dir/.keepsake.lock`, an flock on the local file system,
   * a lease object written with conditional writes on s3:// (storage.h, "Locks"),
   * recording "pid N on host H since T") until ks_ckpt_manager_free. A second
   * manager is refused with KS_E_LOCKED naming the holder; a killed holder's lock
   * is gone with it (on s3://: at once from the same machine, else when its lease
   * expires). KS_CKPT_LOCK_AUTO (0): lock where the table can (KS_IO_CAP_LOCK, io.h:
   * the local file system, s3://); a table that cannot (custom tables, a store
   * without conditional writes, whose lock_fn answers ENOTSUP) runs unlocked, and
   * the caller must not share the run directory. KS_CKPT_LOCK_REQUIRE:
   * refuse (KS_E_UNSUPPORTED) a table that cannot lock. KS_CKPT_LOCK_OFF: no lock
   * (the ranks of a distributed run other than rank 0, which share rank 0's run
   * directory and never delete).
   */
  ks_ckpt_lock lock;
  /* --- appended in 0.5 --- */
  /**
   * The metrics the program saves, as their paths in a checkpoint
   * ("state/train_metrics/Name", "state/eval_metrics/label/Name"): n_metrics of
   * them; NULL = not given. When given, a keep_best whose best_metric names none
   * of them is refused (KS_E_INVALID, the message lists them): it would rank no
   * checkpoint, in silence. Copied at creation if needed: need not outlive it.
   */
  const char *const *metrics;
  size_t n_metrics;
} ks_ckpt_opts;

/**
 * Creates a manager for a run directory (mkdir -p) and takes its lock (see
 * ks_ckpt_opts.lock).
 * @return KS_OK, KS_E_INVALID (bad interval or template), KS_E_LOCKED (another
 * manager holds the run directory: the message names it), KS_E_UNSUPPORTED
 * (KS_CKPT_LOCK_REQUIRE on a table without locks, or a read-only table,
 * KS_IO_CAP_READ_ONLY: an http(s):// location), KS_E_IO or KS_E_NOMEM.
 */
KS_NODISCARD ks_status ks_ckpt_manager_create(const ks_ckpt_opts *opts, ks_ckpt_manager **out, ks_error *err);
void ks_ckpt_manager_free(ks_ckpt_manager *m);
/**
 * Saves the state under the templated name (atomic, durable), then points
 * `latest` at it (symlink to a temporary name, rename, fsync the directory), then
 * deletes the oldest checkpoints beyond `keep`.
 * @param saved optional; receives the path (owned by the manager, valid until the next save).
 * @return KS_OK; KS_E_NOT_DURABLE when a directory fsync failed after a rename (the
 *         checkpoint, or the new `latest`, is in place but may not survive a crash;
 *         `latest` is not re-pointed at a checkpoint whose save returned it); any
 *         ks_state_save error (nothing changed).
 */
KS_NODISCARD ks_status ks_ckpt_manager_save(ks_ckpt_manager *m, const ks_state *st, const char **saved, ks_error *err);
/**
 * Like ks_ckpt_manager_save, but returns once the state is snapshotted: the file,
 * then `latest`, then retention are done on a background thread, in that order and
 * with the same durability. At most one save is in flight (see async_busy).
 * An error of the previous background save is returned by this call or the next
 * manager call (or ks_ckpt_manager_wait), once; it is never swallowed.
 * @param saved optional; receives the path being written (owned by the manager).
 * @return KS_OK (started) or an error (see ks_state_save_async).
 */
KS_NODISCARD ks_status ks_ckpt_manager_save_async(ks_ckpt_manager *m, const ks_state *st, const char **saved,
                                                  ks_error *err);

/**
 * Saves a state the caller flattened itself (sd and its metadata; the Python package's
 * checkpoints) exactly as ks_ckpt_manager_save saves a ks_state: the file named from the
 * template and `ts` (NULL: all zero), atomic and durable, then `latest`, retention and the
 * upload. async != 0: as ks_ckpt_manager_save_async, returning once every tensor of sd and every
 * pair of meta are copied (the caller may change them at once); the write runs on the manager's
 * background thread, from a file image (format.h).
 * @param im  the file image to save through (ks_image_create: made once for a state like sd, its
 *            memory allocated and touched before training, or the caller's page-locked memory that
 *            device tensors were copied into at the offsets ks_image_get gives); the image is
 *            laid out anew for a state of other entries. NULL: a blocking save writes from sd's
 *            memory (ks_save), a background one through the saver's own image.
 * @param saved optional; receives the path (owned by the manager, valid until the next save).
 * @return as ks_ckpt_manager_save / ks_ckpt_manager_save_async; KS_E_STATE for a sharded
 *         manager; KS_E_LIMIT (sd does not fit the caller's memory of im: make an image with more).
 */
KS_NODISCARD ks_status ks_ckpt_manager_save_image(ks_ckpt_manager *m, ks_image *im, const ks_statedict *sd,
                                                  const ks_meta *meta, const ks_timestamp *ts, int async,
                                                  const char **saved, ks_error *err);

/**
 * Waits for a background save in flight.
 * @return its result, or KS_OK when there was none or it succeeded.
 */
KS_NODISCARD ks_status ks_ckpt_manager_wait(ks_ckpt_manager *m, ks_error *err);

/**
 * Nonzero when a checkpoint is due: call after every batch (epoch_end = 0) and
 * after every epoch (epoch_end = 1) with the updated timestamp. Due when the
 * timestamp reaches a multiple of the interval (every `every` batches or epochs),
 * or (at a batch boundary) save_every_seconds elapsed since the last save, or a
 * preemption signal is pending (ks_preemption_signal). A loop that does not advance its timestamp never comes due: when
 * KS_CKPT_STUCK_CALLS calls of one kind in a row (batch ends, or epoch ends) see
 * the same timestamp (epoch and batch; epoch for epoch ends), the manager warns
 * on its log, once.
 */
int ks_ckpt_manager_should_save(const ks_ckpt_manager *m, const ks_timestamp *ts, int epoch_end);
/** Calls of ks_ckpt_manager_should_save of one kind with the same timestamp that make the manager warn. */
#define KS_CKPT_STUCK_CALLS 3

/**
 * Loads the newest checkpoint of the run directory that fully verifies; corrupt
 * or partial ones are skipped with a warning. Leftover temporary files are removed.
 * @param resumed receives 1 when a checkpoint was loaded, 0 when there was none.
 * @param path optional; receives the loaded path (owned by the manager).
 * @return KS_OK (also when there is nothing to resume), or the load error.
 */
KS_NODISCARD ks_status ks_ckpt_manager_autoresume(ks_ckpt_manager *m, ks_state *st, const ks_load_opts *opts,
                                     ks_load_report *report, int *resumed, const char **path,
                                     ks_error *err);
/** Number of checkpoints skipped as corrupt by the last autoresume. */
size_t ks_ckpt_manager_skipped(const ks_ckpt_manager *m);

/* ------------------------------------------------------------------------ */
/* Sharded checkpoint directories (opts.sharded).                            */
/* ------------------------------------------------------------------------ */

/**
 * Starts a sharded save: removes the directories of saves that died (matching
 * the template, no index) and leftover temporary files, then returns the
 * directory the ranks are to write for timestamp `ts` (run_dir/<template>).
 * Call it on one process (rank 0) while no other save of this run is in flight:
 * every directory without an index is then a dead save.
 * @param dir receives the path (owned by the manager, valid until the next call).
 * @param removed optional; receives how many incomplete directories were removed.
 * @return KS_OK, KS_E_STATE (not a sharded manager), KS_E_LIMIT, KS_E_IO (listing failed), KS_E_NOMEM.
 */
KS_NODISCARD ks_status ks_ckpt_manager_dir_begin(ks_ckpt_manager *m, const ks_timestamp *ts, const char **dir,
                                                 size_t *removed, ks_error *err);

/**
 * The directory a sharded save at `ts` writes (run_dir/<template>), as
 * ks_ckpt_manager_dir_begin returns it, without touching the disk: for the
 * ranks other than the one that owns the run directory.
 * @param dir receives the path (owned by the manager, valid until its next call).
 * @return KS_OK, KS_E_STATE (not a sharded manager), KS_E_LIMIT, KS_E_NOMEM.
 */
KS_NODISCARD ks_status ks_ckpt_manager_dir_path(ks_ckpt_manager *m, const ks_timestamp *ts, const char **dir,
                                                ks_error *err);

/**
 * Finishes a sharded save whose index is durable: points `latest` at the
 * directory, then applies the retention policies (never deleting `dir`).
 * @return KS_OK, KS_E_STATE, KS_E_NOTFOUND (dir has no valid index: not committed),
 *         KS_E_IO, KS_E_NOT_DURABLE (as ks_ckpt_manager_save).
 */
KS_NODISCARD ks_status ks_ckpt_manager_dir_commit(ks_ckpt_manager *m, const char *dir, ks_error *err);

/**
 * The newest complete checkpoint directory whose files all verify against its
 * index (size and whole-file checksum); others are skipped with a warning, and
 * incomplete directories of dead saves are removed first.
 * @param dir receives the path (owned by the manager), or NULL when there is none.
 * @return KS_OK (also when there is none), KS_E_STATE, KS_E_IO, KS_E_NOMEM.
 */
KS_NODISCARD ks_status ks_ckpt_manager_dir_latest(ks_ckpt_manager *m, const char **dir, ks_error *err);

/* ------------------------------------------------------------------------ */
/* Preemption.                                                               */
/* ------------------------------------------------------------------------ */

/** Exit status a program uses after saving on preemption (EX_TEMPFAIL: "try again"). */
#define KS_EXIT_PREEMPTED 75

/**
 * Installs handlers that record the arrival of each signal in `signals` (e.g.
 * SIGTERM, SIGUSR1) instead of terminating; the program then saves at its next
 * batch boundary (ks_ckpt_manager_should_save turns true) and exits with
 * KS_EXIT_PREEMPTED. The handler also calls the handler each signal had before
 * (a function the program installed: it still runs; SIG_DFL and SIG_IGN are
 * replaced). Installs are counted per signal: undo each with
 * ks_preemption_uninstall (a manager's close), and the last one puts the
 * previous disposition back, so after it SIGTERM ends the process again, or
 * reaches the program's own handler. Only signals received while an install is
 * in force are acted on: a signal recorded earlier is forgotten when the first
 * install begins, and when the last one is undone. Signal dispositions are
 * process-wide, and so is this state (the library's only process-wide state;
 * the functions are thread safe).
 * @return KS_OK, KS_E_INVALID (n == 0 or a bad signal) or KS_E_IO (sigaction
 *         failed: nothing is installed).
 */
KS_NODISCARD ks_status ks_preemption_install(const int *signals, size_t n, ks_error *err);

/**
 * Undoes one ks_preemption_install of the same signals: the last install of a
 * signal to be undone restores the disposition its first install replaced
 * (unless the program has set another one since, which stays).
 * @return KS_OK, KS_E_INVALID (n == 0 or a bad signal), KS_E_STATE (a signal
 *         that is not installed: nothing is undone) or KS_E_IO (sigaction failed;
 *         the count is undone all the same).
 */
KS_NODISCARD ks_status ks_preemption_uninstall(const int *signals, size_t n, ks_error *err);

/** The signal that asked for preemption, or 0. Async-signal-safe to call. */
int ks_preemption_signal(void);

KS_END_DECLS
#endif
