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

#include <stdio.h>

#include "keepsake/alloc.h"
#include "keepsake/io.h"
#include "keepsake/state.h"
#include "keepsake/status.h"
#include "keepsake/train.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Checkpoint manager.                                                       */
/* ------------------------------------------------------------------------ */

typedef struct ks_ckpt_manager ks_ckpt_manager;

typedef struct ks_ckpt_opts {
  const char *run_dir;       /**< created if missing */
  const char *save_interval; /**< "100ba" (every 100 batches) or "2ep" (every 2 epochs); NULL = "1ep" */
  const char *filename;      /**< template with {epoch} {batch} {sample}; NULL = "ep{epoch}-ba{batch}.keepsake" */
  int keep;                  /**< keep the N newest checkpoints; 0 keeps all */
  const ks_allocator *alloc;
  const ks_io *io;           /**< passed to ks_save; NULL = POSIX */
  int no_fsync;              /**< tests only */
  FILE *log;                 /**< warnings (skipped corrupt checkpoints); NULL = stderr */
} ks_ckpt_opts;

/**
 * Creates a manager for a run directory (mkdir -p).
 * @return KS_OK, KS_E_INVALID (bad interval or template), KS_E_IO or KS_E_NOMEM.
 */
ks_status ks_ckpt_manager_create(const ks_ckpt_opts *opts, ks_ckpt_manager **out, ks_error *err);
void ks_ckpt_manager_free(ks_ckpt_manager *m);
/**
 * Nonzero when a checkpoint is due: call after every batch (epoch_end = 0) and
 * after every epoch (epoch_end = 1) with the updated timestamp.
 */
int ks_ckpt_manager_due(const ks_ckpt_manager *m, const ks_timestamp *ts, int epoch_end);
/**
 * Saves the state under the templated name (atomic, durable), then points
 * `latest` at it (symlink to a temporary name, rename, fsync the directory), then
 * deletes the oldest checkpoints beyond `keep`.
 * @param saved optional; receives the path (owned by the manager, valid until the next save).
 */
ks_status ks_ckpt_manager_save(ks_ckpt_manager *m, const ks_state *st, const char **saved, ks_error *err);
/**
 * Loads the newest checkpoint of the run directory that fully verifies; corrupt
 * or partial ones are skipped with a warning. Leftover temporary files are removed.
 * @param resumed receives 1 when a checkpoint was loaded, 0 when there was none.
 * @param path optional; receives the loaded path (owned by the manager).
 * @return KS_OK (also when there is nothing to resume), or the load error.
 */
ks_status ks_ckpt_manager_autoresume(ks_ckpt_manager *m, ks_state *st, const ks_load_opts *opts,
                                     ks_load_report *report, int *resumed, const char **path,
                                     ks_error *err);
/** Number of checkpoints skipped as corrupt by the last autoresume. */
size_t ks_ckpt_manager_skipped(const ks_ckpt_manager *m);

#ifdef __cplusplus
}
#endif
#endif
