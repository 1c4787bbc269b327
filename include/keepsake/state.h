/**
 * @file state.h
 * The whole state of a training run, saved and restored by name.
 *
 * A program registers its components in a ks_state under fixed names: model
 * tensors, optimizers, schedulers, the timestamp, the PRNG, dataset positions,
 * train and eval metrics, and custom components. ks_state_save writes them to one
 * keepsake file whose keys follow Composer's checkpoint dictionary flattened with
 * '/' (state/model/..., state/optimizers/AdamW/state/0/exp_avg, rng/0/...).
 *
 * Loading walks the *program's* components and fills each from the checkpoint
 * entry of the same name; everything that could not be loaded as-is is listed in
 * a ks_load_report. The components themselves (PRNG, timestamp, optimizers,
 * scheduler) are in train.h; the checkpoint manager is in manager.h.
 *
 * Thread safety: none of these objects may be used from two threads at once;
 * distinct objects are independent (there is no global state).
 */
#ifndef KEEPSAKE_STATE_H
#define KEEPSAKE_STATE_H

#include "keepsake/export.h"

#include <stdint.h>
#include <stdio.h>

#include "keepsake/alloc.h"
#include "keepsake/format.h"
#include "keepsake/metric.h"
#include "keepsake/statedict.h"
#include "keepsake/status.h"
#include "keepsake/tensor.h"
#include "keepsake/train.h"

KS_BEGIN_DECLS

/* ------------------------------------------------------------------------ */
/* Load report.                                                              */
/* ------------------------------------------------------------------------ */

typedef enum ks_load_kind {
  KS_LOAD_LOADED = 0,     /**< filled from the checkpoint as-is */
  KS_LOAD_MIGRATED = 1,   /**< filled after a schema migration (old state names/shapes) */
  KS_LOAD_CONVERTED = 2,  /**< filled after a dtype conversion (widening, or allowed narrowing) */
  KS_LOAD_SKIPPED = 3,    /**< in the checkpoint, not used: program lacks it, ignored by glob, weights-only */
  KS_LOAD_MISSING = 4,    /**< in the program, not in the checkpoint: kept at defaults */
  KS_LOAD_MISMATCHED = 5, /**< in both but incompatible (args, shape, dtype): left at defaults */
  KS_LOAD_ANY = -1        /**< ks_load_report_count: items of every kind */
} ks_load_kind;

typedef struct ks_load_report ks_load_report;

/** One line of a report. Strings are owned by the report. */
typedef struct ks_load_item {
  ks_load_kind kind;
  const char *path;   /**< '/' path of the component, e.g. state/train_metrics/MulticlassAccuracy */
  const char *reason; /**< human readable */
} ks_load_item;

/** Creates an empty report. @return KS_OK or KS_E_NOMEM. Free with ks_load_report_free. */
KS_NODISCARD ks_status ks_load_report_create(const ks_allocator *alloc, ks_load_report **out, ks_error *err);
void ks_load_report_free(ks_load_report *r);
/** Number of items of one kind, or of every kind with KS_LOAD_ANY (0 for NULL). Each load adds
 *  its items to the report given: use a fresh report per load to see that load's alone. */
size_t ks_load_report_count(const ks_load_report *r, ks_load_kind kind);
/** Item i. @return KS_OK or KS_E_NOTFOUND. */
KS_NODISCARD ks_status ks_load_report_at(const ks_load_report *r, size_t i, ks_load_item *out);
/** Finds the first item whose path equals `path`; NULL when none. Valid until the report changes. */
const ks_load_item *ks_load_report_find(const ks_load_report *r, const char *path);
/** "loaded", "migrated", ... */
const char *ks_load_kind_name(ks_load_kind kind);
/** Prints one line per item, grouped by kind, then a summary line. */
void ks_load_report_print(const ks_load_report *r, FILE *out);

/* ------------------------------------------------------------------------ */
/* The state object.                                                         */
/* ------------------------------------------------------------------------ */

typedef struct ks_state ks_state;

/* ks_stateful, a component whose state goes out and comes back through two callbacks, is in train.h. */

/**
 * The component to register with ks_state_add_component(st, KS_ROOT_CALLBACKS, ...)
 * (es is borrowed). Loading
 * refuses, with KS_E_MISMATCH and es unchanged, a saved monitor or mode other than
 * es's; patience and min_delta are the program's own.
 */
ks_stateful ks_early_stop_stateful(ks_early_stop *es);

/**
 * The program's get_metrics(): builds a fresh collection of default metrics for
 * `label` (NULL for the train metrics, an evaluator label such as "eval" otherwise).
 * Ownership: on KS_OK the library owns *out; on failure the factory frees whatever it
 * built, and the library ignores *out (never frees it), whatever it was left pointing at.
 */
typedef ks_status (*ks_metrics_factory)(void *ctx, const char *label, const ks_allocator *alloc,
                                        ks_metric_collection **out, ks_error *err);

/**
 * Creates an empty state.
 * @param run_name saved as state/run_name (copied; NULL = "").
 * @param rank_zero_seed saved as state/rank_zero_seed.
 * @return KS_OK or KS_E_NOMEM. Free with ks_state_free.
 */
KS_NODISCARD ks_status ks_state_create(const char *run_name, int64_t rank_zero_seed, const ks_allocator *alloc,
                          ks_state **out, ks_error *err);
/** Frees the state and the metric collections it built; registered components are borrowed. */
void ks_state_free(ks_state *st);

/**
 * Registers a model tensor (parameter or buffer) saved as state/model/<name>.
 * The descriptor is copied; its data is borrowed and overwritten in place on load.
 * @return KS_OK, KS_E_EXISTS, KS_E_INVALID or KS_E_NOMEM.
 */
KS_NODISCARD ks_status ks_state_add_tensor(ks_state *st, const char *name, const ks_tensor *t, ks_error *err);
/** Registers an optimizer saved as state/optimizers/<name>/ (borrowed). */
KS_NODISCARD ks_status ks_state_add_optimizer(ks_state *st, const char *name, ks_optimizer *opt, ks_error *err);
/** Registers a scheduler saved as state/schedulers/<name>/ (borrowed). */
KS_NODISCARD ks_status ks_state_add_scheduler(ks_state *st, const char *name, ks_scheduler *sched, ks_error *err);
/** Registers a dataset position saved as state/dataset_state/<name>/ (borrowed). */
KS_NODISCARD ks_status ks_state_add_dataset(ks_state *st, const char *name, ks_dataset_state *ds, ks_error *err);

/** Where a component added with ks_state_add_component lives. */
typedef enum ks_state_root {
  KS_ROOT_OPTIMIZERS = 1,    /**< state/optimizers/<name>/ */
  KS_ROOT_SCHEDULERS = 2,    /**< state/schedulers/<name>/ */
  KS_ROOT_CALLBACKS = 3,     /**< state/callbacks/<name>/: a program's own component (ks_early_stop_stateful) */
  KS_ROOT_DATASET_STATE = 4, /**< state/dataset_state/<name>/ */
  KS_ROOT_RNG = 5            /**< rng/<name>/ (name "0": the random generators of rank 0) */
} ks_state_root;

/**
 * Registers a component of the program's own kind under `root` (the struct is copied): a
 * custom callback (KS_ROOT_CALLBACKS, such as ks_early_stop_stateful), or a binding's
 * optimizer, scheduler, data position or random generators. The load engine decides
 * for it as for the built-in kinds (ignored, missing, skipped, loaded or mismatched, strict or
 * not) and calls cb->load_state_dict with its prefix only when the checkpoint has entries there.
 * @return KS_OK, KS_E_INVALID (bad root, name or callbacks), KS_E_EXISTS, KS_E_LIMIT, KS_E_NOMEM.
 */
KS_NODISCARD ks_status ks_state_add_component(ks_state *st, ks_state_root root, const char *name,
                                              const ks_stateful *cb, ks_error *err);

/** The timestamp, saved as state/timestamp/Timestamp/ (borrowed; NULL unregisters). */
void ks_state_set_timestamp(ks_state *st, ks_timestamp *ts);
/** The rank-0 PRNG, saved as rng/0/ (borrowed; NULL unregisters). */
void ks_state_set_rng(ks_state *st, ks_rng *rng);

/**
 * Builds the default metrics through the program's factory: the train metrics
 * (label NULL) and one collection per evaluator label. Replaces any built before.
 * @return KS_OK, the factory's error, KS_E_INVALID or KS_E_NOMEM (state unchanged on error).
 */
KS_NODISCARD ks_status ks_state_build_metrics(ks_state *st, ks_metrics_factory factory, void *ctx,
                                 const char *const *eval_labels, size_t n_eval, ks_error *err);
/** The train metrics built above (NULL before). Owned by the state. */
ks_metric_collection *ks_state_train_metrics(const ks_state *st);
/** The eval metrics of one evaluator label (NULL when unknown). Owned by the state. */
ks_metric_collection *ks_state_eval_metrics(const ks_state *st, const char *label);

/**
 * Flattens every component into `dst` and adds "keepsake.metrics" (class, args,
 * schema version and update count of each metric, keyed by its path) to `meta`.
 * @return KS_OK, KS_E_NOMEM, or a component's error.
 */
KS_NODISCARD ks_status ks_state_to_state_dict(const ks_state *st, ks_statedict *dst, ks_meta *meta, ks_error *err);
/** ks_state_to_state_dict + ks_save (atomic and durable). */
KS_NODISCARD ks_status ks_state_save(const ks_state *st, const char *path, const ks_save_opts *opts, ks_error *err);

/** Options of a load. All-zero (or NULL) gives the defaults. */
typedef struct ks_load_opts {
  size_t size;               /**< 0 or sizeof(this struct): see "Growing structs" in export.h */
  /** Non-strict: model tensors that are missing or differ in shape/dtype, file tensors the
   *  program lacks, and optimizers/schedulers/custom components/timestamp/RNG whose load
   *  fails, are reported (missing, mismatched, skipped) and left as they are, instead of
   *  failing the load; everything else still loads. */
  int non_strict_model;
  int weights_only;           /**< load state/model only */
  const char *const *ignore;  /**< globs over '/' paths; a glob matching a '/'-prefix ignores the subtree */
  size_t n_ignore;
  int allow_narrowing;        /**< accept stored dtypes wider than the declared ones */
  int verify_checksums;       /**< ks_state_load only: verify every checksum first */
  /** ks_state_load only: the table the checkpoint is read through (NULL = ks_io_posix()).
   *  A table that can map is mapped; one that cannot (a remote store, a cache) is read
   *  in KS_READ_LAZY mode: header first, then the data in parallel ranges, each tensor
   *  verified against its checksum as it arrives. The autoresume of a manager reads
   *  through the manager's table when this is NULL. */
  const ks_io *io;
  /** Appended in 0.5. Nonzero: the program loads no model (a binding's load without one), so the
   *  file's state/model/ entries are left alone: neither checked (strict), loaded nor reported. */
  int model_absent;
} ks_load_opts;

/**
 * Fills the program's components from a flattened checkpoint (see the header
 * comment and docs/DESIGN.md for the rules). `report` (may be NULL) gets one item
 * per component that was not loaded plainly, and one per loaded component.
 * @return KS_OK; KS_E_SHAPE / KS_E_DTYPE / KS_E_NOTFOUND for model mismatches in
 *         strict mode (nothing is written then); KS_E_NOMEM; a component's error.
 *         Components loaded before a non-model error keep their new values.
 */
KS_NODISCARD ks_status ks_state_load_state_dict(ks_state *st, const ks_statedict *src, const ks_meta *meta,
                                   const ks_load_opts *opts, ks_load_report *report, ks_error *err);
/**
 * ks_load of `path` through opts->io (memory-mapped when the table can map, else
 * lazy with parallel ranged reads verified on arrival; every checksum verified first
 * when opts->verify_checksums) + ks_state_load_state_dict. Tensor data is copied out of the mapping into the
 * program's buffers, and the mapping is released before returning, so nothing
 * stays mapped afterwards and the file may change or vanish.
 */
KS_NODISCARD ks_status ks_state_load(ks_state *st, const char *path, const ks_load_opts *opts, ks_load_report *report,
                        ks_error *err);

/* ------------------------------------------------------------------------ */
/* Background (async) saves.                                                 */
/* ------------------------------------------------------------------------ */

/**
 * A background saver: snapshots a state into a file image (format.h: the
 * caller's, or the saver's own, reused from save to save), then writes the file
 * from it on a thread of its own with exactly the durable replace of
 * ks_state_save (temp file, fsync, rename, directory fsync). At most one save
 * is in flight per saver.
 *
 * Thread safety: a saver is driven from one thread (the training loop); the
 * allocator it is given is also used from its background thread, so it must be
 * thread-safe (malloc is).
 */
typedef struct ks_async_saver ks_async_saver;

/** What starting a save does while another is still in flight. */
typedef enum ks_async_busy {
  KS_ASYNC_WAIT = 0,     /**< wait for it to finish, then start (default) */
  KS_ASYNC_FAIL_BUSY = 1 /**< return KS_E_STATE at once; the one in flight goes on */
} ks_async_busy;

/** Options of a saver. Zero-initialise; new fields are only ever appended. */
typedef struct ks_async_opts {
  size_t size;               /**< 0 or sizeof(this struct): see "Growing structs" in export.h */
  const ks_allocator *alloc; /**< NULL = malloc; must be thread-safe */
  ks_async_busy busy;
  void *staging;             /**< optional caller memory for the saver's own image: used while it is
                                  KS_IMAGE_ALIGN-aligned and large enough, else the saver stages in
                                  memory of its own (grown, then reused) */
  size_t staging_size;       /**< bytes at `staging` */
} ks_async_opts;

/**
 * Called on the background thread once the file is durable at `path`, before the
 * save counts as finished; an error it returns is the save's error.
 */
typedef ks_status (*ks_after_save_fn)(void *ctx, const char *path, ks_error *err);

/**
 * Creates a saver.
 * @return KS_OK, KS_E_INVALID (staging_size without staging) or KS_E_NOMEM.
 * Ownership: free with ks_async_saver_free.
 */
KS_NODISCARD ks_status ks_async_saver_create(const ks_async_opts *opts, ks_async_saver **out, ks_error *err);

/**
 * Finishes a save in flight (it is never cut short: the file is either fully
 * committed or, if it fails, its temp file removed), then frees. Accepts NULL.
 * A result not yet collected by ks_async_saver_wait is dropped here, so call
 * wait first when the outcome matters.
 */
void ks_async_saver_free(ks_async_saver *sv);

/**
 * Snapshots `st` and returns; a background thread then saves it to `path`.
 * The state may change as soon as this returns. Before starting, a save still
 * in flight is waited for (or refused, per ks_async_opts.busy), and if the
 * previous save failed its error is returned now, once, and nothing new starts.
 * @return KS_OK (started), the previous save's error, KS_E_STATE (busy),
 *         KS_E_NOMEM / KS_E_LIMIT (snapshot) or KS_E_IO (no thread).
 */
KS_NODISCARD ks_status ks_state_save_async(ks_async_saver *sv, const ks_state *st, const char *path,
                                           const ks_save_opts *opts, ks_error *err);

/** ks_state_save_async with an after-commit step run on the background thread (may be NULL). */
KS_NODISCARD ks_status ks_async_saver_start(ks_async_saver *sv, const ks_state *st, const char *path,
                               const ks_save_opts *opts, ks_after_save_fn after, void *ctx, ks_error *err);

/**
 * ks_async_saver_start for a state the caller flattened itself (the Python package's), through a
 * file image: every tensor of sd not already at its place in the image is copied into it, and
 * the header (sd's scalars, meta's pairs) is rendered, before it returns, so the caller may
 * change or free sd and meta at once. The write is ks_save(path, sd, meta)'s file, written from
 * the image (ks_save_opts.image). Before the snapshot, a save still in flight is waited for (or
 * refused, per ks_async_opts.busy) and a previous save's error returned, once, as by a start.
 *
 * @param im the image (ks_image_create), made once for a state like sd: a state of other
 *           entries is laid out anew in it (ks_image_create). A caller that copies tensors into
 *           the image itself (device tensors, into page-locked memory) asks ks_image_get(im, sd,
 *           meta) where they go, copies them there and points sd's entries at them: they are
 *           copied no further. NULL: the saver's own image (made on first use, reused, over
 *           ks_async_opts.staging when that is aligned and large enough).
 * @return as ks_async_saver_start; KS_E_LIMIT (sd does not fit the caller's memory of im).
 */
KS_NODISCARD ks_status ks_async_saver_start_image(ks_async_saver *sv, ks_image *im, const ks_statedict *sd,
                                                  const ks_meta *meta, const char *path, const ks_save_opts *opts,
                                                  ks_after_save_fn after, void *ctx, ks_error *err);

/**
 * Waits for the save in flight, if any.
 * @return its result (KS_OK when none failed since the last call), with err filled.
 */
KS_NODISCARD ks_status ks_async_saver_wait(ks_async_saver *sv, ks_error *err);

/** Nonzero while a background save is still running. */
int ks_async_saver_busy(ks_async_saver *sv);

KS_END_DECLS
#endif
