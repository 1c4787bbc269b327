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
 * a ks_load_report. The checkpoint manager adds save intervals, retention, a
 * `latest` symlink and autoresume from the newest checkpoint that verifies.
 *
 * Thread safety: none of these objects may be used from two threads at once;
 * distinct objects are independent (there is no global state).
 */
#ifndef KEEPSAKE_STATE_H
#define KEEPSAKE_STATE_H

#include <stdint.h>
#include <stdio.h>

#include "keepsake/alloc.h"
#include "keepsake/format.h"
#include "keepsake/metric.h"
#include "keepsake/statedict.h"
#include "keepsake/status.h"
#include "keepsake/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* PRNG: xoshiro256**, 256 bits of state, all of it saved.                   */
/* ------------------------------------------------------------------------ */

/** A xoshiro256** generator. A plain value: copy it to fork a stream. */
typedef struct ks_rng {
  uint64_t s[4];
} ks_rng;

/** Seeds from one 64-bit value (expanded with splitmix64, so seed 0 is fine). */
void ks_rng_seed(ks_rng *r, uint64_t seed);
/** Next 64 random bits. */
uint64_t ks_rng_next(ks_rng *r);
/** Uniform integer in [0, n) without modulo bias; returns 0 when n is 0. */
uint64_t ks_rng_below(ks_rng *r, uint64_t n);
/** Uniform double in [0, 1) with 53 random bits. */
double ks_rng_uniform(ks_rng *r);
/** Standard normal (Box-Muller; consumes exactly two draws, caches nothing). */
double ks_rng_normal(ks_rng *r);
/** Fisher-Yates shuffle of n indices in place. */
void ks_rng_shuffle(ks_rng *r, int64_t *idx, size_t n);
/** Writes `<prefix>xoshiro256starstar` (U64 [4]). @return KS_OK or KS_E_NOMEM. */
ks_status ks_rng_to_state_dict(const ks_rng *r, ks_statedict *dst, const char *prefix);
/** Reads what ks_rng_to_state_dict wrote. @return KS_OK, KS_E_NOTFOUND, KS_E_SHAPE or KS_E_DTYPE (r unchanged). */
ks_status ks_rng_load_state_dict(ks_rng *r, const ks_statedict *src, const char *prefix, ks_error *err);

/* ------------------------------------------------------------------------ */
/* Timestamp: Composer's counters plus wall-clock totals (the *_wct fields). */
/* ------------------------------------------------------------------------ */

typedef struct ks_timestamp {
  int64_t epoch, batch, sample, token;
  int64_t batch_in_epoch, sample_in_epoch, token_in_epoch;
  double total_wct, epoch_wct, batch_wct; /**< seconds; never compared by resume tests */
} ks_timestamp;

/** All counters zero. */
void ks_timestamp_init(ks_timestamp *ts);
/** Counts one finished batch of `samples` samples / `tokens` tokens that took `seconds`. */
void ks_timestamp_batch_done(ks_timestamp *ts, int64_t samples, int64_t tokens, double seconds);
/** Counts a finished epoch: epoch+1, in-epoch counters and epoch_wct back to zero. */
void ks_timestamp_epoch_done(ks_timestamp *ts);
/** Writes `<prefix>epoch` ... `<prefix>batch_wct` as scalars. @return KS_OK or KS_E_NOMEM. */
ks_status ks_timestamp_to_state_dict(const ks_timestamp *ts, ks_statedict *dst, const char *prefix);
/** Reads them back; integer fields must be ints. @return KS_OK, KS_E_NOTFOUND or KS_E_VALUE (ts unchanged). */
ks_status ks_timestamp_load_state_dict(ks_timestamp *ts, const ks_statedict *src, const char *prefix,
                                       ks_error *err);

/** Where a data loader is: which epoch's order, how far into it, and the shuffle seed. */
typedef struct ks_dataset_state {
  int64_t epoch;
  int64_t sample_in_epoch;
  int64_t shuffle_seed;
} ks_dataset_state;

/* ------------------------------------------------------------------------ */
/* Optimizers: SGD with momentum and AdamW, with torch's state names.        */
/* ------------------------------------------------------------------------ */

typedef struct ks_optimizer ks_optimizer;

/** torch.optim.SGD hyperparameters (defaults: all zero except lr). */
typedef struct ks_sgd_opts {
  double lr, momentum, dampening, weight_decay;
  int nesterov;
} ks_sgd_opts;

/** torch.optim.AdamW hyperparameters (torch defaults: 1e-3, 0.9, 0.999, 1e-8, 1e-2). */
typedef struct ks_adamw_opts {
  double lr, beta1, beta2, eps, weight_decay;
} ks_adamw_opts;

/**
 * Creates an optimizer over no parameters yet; add them with ks_optimizer_add_param.
 * @return KS_OK, KS_E_INVALID (NULL opts, negative lr...) or KS_E_NOMEM.
 * Ownership: free with ks_optimizer_free.
 */
ks_status ks_optimizer_create_sgd(const ks_sgd_opts *opts, const ks_allocator *alloc, ks_optimizer **out);
ks_status ks_optimizer_create_adamw(const ks_adamw_opts *opts, const ks_allocator *alloc, ks_optimizer **out);
/** Frees the optimizer and its state buffers (never the parameters). Accepts NULL. */
void ks_optimizer_free(ks_optimizer *o);

/**
 * Appends parameter number `count` (torch's param index). `param` and `grad` are
 * borrowed F32 buffers of `numel` elements and must outlive the optimizer; the
 * shape is used for the state tensors and for load checks.
 * @return KS_OK, KS_E_INVALID, KS_E_LIMIT or KS_E_NOMEM (optimizer unchanged).
 */
ks_status ks_optimizer_add_param(ks_optimizer *o, float *param, const float *grad, int rank,
                                 const int64_t *shape);
/** One update of every parameter from its gradient, as torch does it (F32 arithmetic). */
void ks_optimizer_step(ks_optimizer *o);
/** Current learning rate of param group 0, and setting it (schedulers do). */
double ks_optimizer_lr(const ks_optimizer *o);
void ks_optimizer_set_lr(ks_optimizer *o, double lr);
/** "SGD" or "AdamW": the key optimizers are saved under by convention. */
const char *ks_optimizer_name(const ks_optimizer *o);
/** Number of parameters. */
size_t ks_optimizer_param_count(const ks_optimizer *o);

/**
 * Writes torch's optimizer.state_dict() flattened: `<prefix>state/<i>/exp_avg`,
 * `exp_avg_sq`, `step` (F32 0-d) for AdamW, `momentum_buffer` for SGD, and
 * `<prefix>param_groups/0/lr`, `betas/0`, ... `params/<i>`.
 * @return KS_OK or KS_E_NOMEM (dst may hold some entries).
 */
ks_status ks_optimizer_to_state_dict(const ks_optimizer *o, ks_statedict *dst, const char *prefix);
/**
 * Restores state and hyperparameters. All entries are checked (presence, dtype
 * F32 or a widening of it, shape) before anything is written.
 * @return KS_OK, KS_E_NOTFOUND, KS_E_SHAPE, KS_E_DTYPE or KS_E_VALUE; optimizer unchanged on error.
 */
ks_status ks_optimizer_load_state_dict(ks_optimizer *o, const ks_statedict *src, const char *prefix,
                                       ks_error *err);

/* ------------------------------------------------------------------------ */
/* Scheduler: linear warmup then cosine decay, stepped once per batch.       */
/* ------------------------------------------------------------------------ */

/**
 * Like Composer's CosineAnnealingWithWarmupScheduler over a torch LambdaLR:
 * multiplier t/t_warmup during warmup, then alpha_f + (1-alpha_f)(1+cos(pi*frac))/2.
 * A plain value; `last_epoch` counts scheduler steps as in torch.
 */
typedef struct ks_scheduler {
  double base_lr;
  int64_t t_warmup, t_max;
  double alpha_f;
  int64_t last_epoch;
  double last_lr;
} ks_scheduler;

/** Initializes and applies the step-0 learning rate to `opt` (may be NULL). */
void ks_scheduler_init(ks_scheduler *s, ks_optimizer *opt, double base_lr, int64_t t_warmup, int64_t t_max,
                       double alpha_f);
/** The learning rate after `t` steps. */
double ks_scheduler_lr_at(const ks_scheduler *s, int64_t t);
/** Advances one step and sets the new learning rate on `opt` (may be NULL). */
void ks_scheduler_step(ks_scheduler *s, ks_optimizer *opt);
/** Writes `<prefix>base_lrs/0`, `last_epoch`, `_step_count`, `_last_lr/0`, `t_warmup`, `t_max`, `alpha_f`. */
ks_status ks_scheduler_to_state_dict(const ks_scheduler *s, ks_statedict *dst, const char *prefix);
/** Restores it. @return KS_OK, KS_E_NOTFOUND or KS_E_VALUE (s unchanged). */
ks_status ks_scheduler_load_state_dict(ks_scheduler *s, const ks_statedict *src, const char *prefix,
                                       ks_error *err);

/* ------------------------------------------------------------------------ */
/* Load report.                                                              */
/* ------------------------------------------------------------------------ */

typedef enum ks_load_kind {
  KS_LOAD_LOADED = 0,     /**< filled from the checkpoint as-is */
  KS_LOAD_MIGRATED = 1,   /**< filled after a schema migration (old state names/shapes) */
  KS_LOAD_CONVERTED = 2,  /**< filled after a dtype conversion (widening, or allowed narrowing) */
  KS_LOAD_SKIPPED = 3,    /**< in the checkpoint, not used: program lacks it, ignored by glob, weights-only */
  KS_LOAD_MISSING = 4,    /**< in the program, not in the checkpoint: kept at defaults */
  KS_LOAD_MISMATCHED = 5  /**< in both but incompatible (args, shape, dtype): left at defaults */
} ks_load_kind;

typedef struct ks_load_report ks_load_report;

/** One line of a report. Strings are owned by the report. */
typedef struct ks_load_item {
  ks_load_kind kind;
  const char *path;   /**< '/' path of the component, e.g. state/train_metrics/MulticlassAccuracy */
  const char *reason; /**< human readable */
} ks_load_item;

/** Creates an empty report. @return KS_OK or KS_E_NOMEM. Free with ks_load_report_free. */
ks_status ks_load_report_create(const ks_allocator *alloc, ks_load_report **out);
void ks_load_report_free(ks_load_report *r);
/** Appends an item (the strings are copied). @return KS_OK or KS_E_NOMEM (report unchanged). */
ks_status ks_load_report_add(ks_load_report *r, ks_load_kind kind, const char *path, const char *reason);
/** Empties the report. */
void ks_load_report_clear(ks_load_report *r);
size_t ks_load_report_count(const ks_load_report *r);
/** Number of items of one kind. */
size_t ks_load_report_count_kind(const ks_load_report *r, ks_load_kind kind);
/** Item i. @return KS_OK or KS_E_NOTFOUND. */
ks_status ks_load_report_at(const ks_load_report *r, size_t i, ks_load_item *out);
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

/** A custom component: state goes out and comes back through two callbacks. */
typedef struct ks_stateful {
  void *ctx;
  /** Writes entries named `prefix` + anything. */
  ks_status (*to_state_dict)(void *ctx, ks_statedict *dst, const char *prefix, ks_error *err);
  /** Reads them back; should leave the component unchanged on error. */
  ks_status (*load_state_dict)(void *ctx, const ks_statedict *src, const char *prefix, ks_error *err);
} ks_stateful;

/**
 * The program's get_metrics(): builds a fresh collection of default metrics for
 * `label` (NULL for the train metrics, an evaluator label such as "eval" otherwise).
 */
typedef ks_status (*ks_metrics_factory)(void *ctx, const char *label, const ks_allocator *alloc,
                                        ks_metric_collection **out, ks_error *err);

/**
 * Creates an empty state.
 * @param run_name saved as state/run_name (copied; NULL = "").
 * @param rank_zero_seed saved as state/rank_zero_seed.
 * @return KS_OK or KS_E_NOMEM. Free with ks_state_free.
 */
ks_status ks_state_create(const char *run_name, int64_t rank_zero_seed, const ks_allocator *alloc,
                          ks_state **out);
/** Frees the state and the metric collections it built; registered components are borrowed. */
void ks_state_free(ks_state *st);

/**
 * Registers a model tensor (parameter or buffer) saved as state/model/<name>.
 * The descriptor is copied; its data is borrowed and overwritten in place on load.
 * @return KS_OK, KS_E_EXISTS, KS_E_INVALID or KS_E_NOMEM.
 */
ks_status ks_state_add_tensor(ks_state *st, const char *name, const ks_tensor *t);
/** Registers an optimizer saved as state/optimizers/<name>/ (borrowed). */
ks_status ks_state_add_optimizer(ks_state *st, const char *name, ks_optimizer *opt);
/** Registers a scheduler saved as state/schedulers/<name>/ (borrowed). */
ks_status ks_state_add_scheduler(ks_state *st, const char *name, ks_scheduler *sched);
/** Registers a custom component saved as state/callbacks/<name>/ (the struct is copied). */
ks_status ks_state_add_stateful(ks_state *st, const char *name, const ks_stateful *cb);
/** Registers a dataset position saved as state/dataset_state/<name>/ (borrowed). */
ks_status ks_state_add_dataset(ks_state *st, const char *name, ks_dataset_state *ds);
/** The timestamp, saved as state/timestamp/Timestamp/ (borrowed; NULL unregisters). */
void ks_state_set_timestamp(ks_state *st, ks_timestamp *ts);
/** The rank-0 PRNG, saved as rng/0/ (borrowed; NULL unregisters). */
void ks_state_set_rng(ks_state *st, ks_rng *rng);

/**
 * Builds the default metrics through the program's factory: the train metrics
 * (label NULL) and one collection per evaluator label. Replaces any built before.
 * @return KS_OK, the factory's error, KS_E_INVALID or KS_E_NOMEM (state unchanged on error).
 */
ks_status ks_state_build_metrics(ks_state *st, ks_metrics_factory factory, void *ctx,
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
ks_status ks_state_to_state_dict(const ks_state *st, ks_statedict *dst, ks_meta *meta, ks_error *err);
/** ks_state_to_state_dict + ks_save (atomic and durable). */
ks_status ks_state_save(const ks_state *st, const char *path, const ks_save_opts *opts, ks_error *err);

/** Options of a load. All-zero (or NULL) gives the defaults. */
typedef struct ks_load_opts {
  int non_strict_model;       /**< report+skip model shape/dtype mismatches instead of failing */
  int weights_only;           /**< load state/model only */
  const char *const *ignore;  /**< globs over '/' paths; a glob matching a '/'-prefix ignores the subtree */
  size_t n_ignore;
  int allow_narrowing;        /**< accept stored dtypes wider than the declared ones */
  int verify_checksums;       /**< ks_state_load only: verify every checksum first */
} ks_load_opts;

/**
 * Fills the program's components from a flattened checkpoint (see the header
 * comment and docs/DESIGN.md for the rules). `report` (may be NULL) gets one item
 * per component that was not loaded plainly, and one per loaded component.
 * @return KS_OK; KS_E_SHAPE / KS_E_DTYPE / KS_E_NOTFOUND for model mismatches in
 *         strict mode (nothing is written then); KS_E_NOMEM; a component's error.
 *         Components loaded before a non-model error keep their new values.
 */
ks_status ks_state_load_state_dict(ks_state *st, const ks_statedict *src, const ks_meta *meta,
                                   const ks_load_opts *opts, ks_load_report *report, ks_error *err);
/** ks_load (copying, so nothing stays mapped) + ks_state_load_state_dict. */
ks_status ks_state_load(ks_state *st, const char *path, const ks_load_opts *opts, ks_load_report *report,
                        ks_error *err);

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
