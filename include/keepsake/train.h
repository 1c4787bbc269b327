/**
 * @file train.h
 * The training helpers a program registers in a ks_state: the xoshiro256** PRNG,
 * the timestamp, dataset positions, SGD and AdamW with torch's state names, and a
 * warmup + cosine scheduler. Each writes and reads its own state dict entries
 * through its ks_stateful.
 *
 * Thread safety: none of these objects may be used from two threads at once;
 * distinct objects are independent (there is no global state).
 */
#ifndef KEEPSAKE_TRAIN_H
#define KEEPSAKE_TRAIN_H

#include "keepsake/export.h"

#include <stddef.h>
#include <stdint.h>

#include "keepsake/alloc.h"
#include "keepsake/statedict.h"
#include "keepsake/status.h"

KS_BEGIN_DECLS

/**
 * A component that saves and restores its own state dict entries: the built-in
 * components below give theirs (ks_rng_stateful, ks_timestamp_stateful,
 * ks_optimizer_stateful, ks_scheduler_stateful), and a program writes its own
 * (register it with ks_state_add_component, state.h).
 */
typedef struct ks_stateful {
  void *ctx;
  /** Writes entries named `prefix` + anything. */
  ks_status (*to_state_dict)(void *ctx, ks_statedict *dst, const char *prefix, ks_error *err);
  /** Reads them back; should leave the component unchanged on error. */
  ks_status (*load_state_dict)(void *ctx, const ks_statedict *src, const char *prefix, ks_error *err);
} ks_stateful;

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
/**
 * The generator's state as a component (r is borrowed): to_state_dict writes
 * `<prefix>xoshiro256starstar`, I64 [4] holding the bit patterns of the four 64-bit
 * state words (torch has no uint64, so the entry exports to .pt): KS_OK or KS_E_NOMEM;
 * load_state_dict reads it back (U64 accepted too): KS_OK, KS_E_NOTFOUND, KS_E_SHAPE,
 * KS_E_DTYPE or KS_E_VALUE (all-zero state), r unchanged on error.
 */
ks_stateful ks_rng_stateful(ks_rng *r);

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
/**
 * The timestamp as a component (ts is borrowed): to_state_dict writes `<prefix>epoch` ...
 * `<prefix>batch_wct` as scalars (KS_OK or KS_E_NOMEM); load_state_dict reads them back,
 * integer fields as non-negative ints, the wall-clock ones when present: KS_OK,
 * KS_E_NOTFOUND or KS_E_VALUE (ts unchanged).
 */
ks_stateful ks_timestamp_stateful(ks_timestamp *ts);

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
KS_NODISCARD ks_status ks_optimizer_create_sgd(const ks_sgd_opts *opts, const ks_allocator *alloc, ks_optimizer **out,
                                               ks_error *err);
KS_NODISCARD ks_status ks_optimizer_create_adamw(const ks_adamw_opts *opts, const ks_allocator *alloc,
                                                 ks_optimizer **out, ks_error *err);
/** Frees the optimizer and its state buffers (never the parameters). Accepts NULL. */
void ks_optimizer_free(ks_optimizer *o);

/**
 * Appends parameter number `count` (torch's param index). `param` and `grad` are
 * borrowed F32 buffers of `numel` elements and must outlive the optimizer; the
 * shape is used for the state tensors and for load checks.
 * @return KS_OK, KS_E_INVALID, KS_E_LIMIT or KS_E_NOMEM (optimizer unchanged).
 */
KS_NODISCARD ks_status ks_optimizer_add_param(ks_optimizer *o, float *param, const float *grad, int rank,
                                 const int64_t *shape, ks_error *err);
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
 * The optimizer as a component (o is borrowed; ks_state_add_optimizer registers it so).
 * to_state_dict writes torch's optimizer.state_dict() flattened:
 * `<prefix>state/<i>/exp_avg`, `exp_avg_sq`, `step` (F32 0-d) for AdamW,
 * `momentum_buffer` for SGD, and `<prefix>param_groups/0/lr`, `betas/0`, ...
 * `params/<i>`: KS_OK or KS_E_NOMEM (dst may hold some entries). load_state_dict
 * restores state and hyperparameters; all entries are checked (presence, dtype F32
 * or a widening of it, shape) before anything is written: KS_OK, KS_E_NOTFOUND,
 * KS_E_SHAPE, KS_E_DTYPE or KS_E_VALUE, the optimizer unchanged on error.
 */
ks_stateful ks_optimizer_stateful(ks_optimizer *o);

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
/**
 * The scheduler as a component (s is borrowed): to_state_dict writes `<prefix>base_lrs/0`,
 * `last_epoch`, `_step_count`, `_last_lr/0`, `t_warmup`, `t_max`, `alpha_f` (KS_OK or
 * KS_E_NOMEM); load_state_dict restores them: KS_OK, KS_E_NOTFOUND or KS_E_VALUE (s unchanged).
 */
ks_stateful ks_scheduler_stateful(ks_scheduler *s);

/** Which end of a metric is better, for keep-best and early stopping. */
typedef enum ks_best_mode {
  KS_BEST_MAX = 0, /**< higher is better (accuracy) */
  KS_BEST_MIN = 1  /**< lower is better (loss) */
} ks_best_mode;

/* ------------------------------------------------------------------------ */
/* Early stopping, saved like any other component.                           */
/* ------------------------------------------------------------------------ */

/**
 * Early stopping on a monitored metric, as Lightning's EarlyStopping: a value
 * improves when it beats the best by more than min_delta (in the mode's
 * direction); after `patience` epochs in a row without improvement, training
 * stops. Saved as state/callbacks/<name>/{monitor,mode,patience,min_delta,
 * best_score,wait_count,stopped_epoch} through ks_early_stop_stateful, so a run
 * resumed mid-patience stops at the same epoch as one never interrupted
 * (ks_early_stop_stateful in state.h).
 * A NaN value never improves.
 */
typedef struct ks_early_stop {
  char monitor[256];      /**< e.g. "eval/MulticlassAccuracy" */
  ks_best_mode mode;
  int64_t patience;       /**< >= 1 */
  double min_delta;       /**< >= 0 */
  int has_best;           /**< 0 until the first finite value */
  double best_score;
  int64_t wait_count;     /**< epochs since the last improvement */
  int64_t stopped_epoch;  /**< epoch at which it fired; -1 while running */
} ks_early_stop;

/**
 * Initialises es for `monitor` (NUL-terminated, under 256 bytes).
 * @return KS_OK or KS_E_INVALID (empty/long monitor, patience < 1, min_delta < 0 or NaN, bad mode).
 */
KS_NODISCARD ks_status ks_early_stop_init(ks_early_stop *es, const char *monitor, ks_best_mode mode, int64_t patience,
                             double min_delta, ks_error *err);

/**
 * Records the monitored value at the end of `epoch`.
 * @return 1 when training should stop now (stopped_epoch is set), else 0.
 */
int ks_early_stop_update(ks_early_stop *es, double value, int64_t epoch);


KS_END_DECLS
#endif
