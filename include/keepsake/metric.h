/**
 * @file metric.h
 * Streaming evaluation metrics with torchmetrics-compatible state.
 *
 * A metric is a set of named states (tensors), each with a default value, a
 * dtype, a shape and a reduction used to merge states across processes. State
 * names, shapes and dtypes are exactly those of torchmetrics 1.x (and Composer
 * for the language metrics), so a state dict moves between keepsake and
 * torchmetrics unchanged. Metrics are built by torchmetrics class name plus a
 * JSON object of constructor arguments:
 *
 *   ks_metric *m;
 *   ks_metric_create("MulticlassAccuracy", "{\"num_classes\":10}", NULL, &m, &err);
 *   ks_metric_update(m, inputs, 2, &err);      // (preds, target)
 *   const ks_tensor *acc;
 *   ks_metric_compute(m, &acc, &err);          // 0-d F32
 *
 * Catalogue: MeanMetric, SumMetric, MaxMetric, MinMetric, CatMetric,
 * BinaryAccuracy, BinaryPrecision, BinaryRecall, BinaryF1Score,
 * BinaryConfusionMatrix, BinaryAUROC, BinaryAveragePrecision,
 * MulticlassAccuracy, MulticlassPrecision, MulticlassRecall, MulticlassF1Score,
 * MulticlassConfusionMatrix, MulticlassAUROC, MulticlassJaccardIndex,
 * MultilabelAccuracy, MultilabelF1Score, MeanSquaredError, MeanAbsoluteError,
 * R2Score, LanguageCrossEntropy, LanguagePerplexity.
 *
 * Wrappers: MinMaxMetric over any of them,
 *   ks_metric_create("MinMaxMetric", "{\"base_metric\":{\"class\":\"MeanMetric\",\"args\":{}}}", ...)
 * (torchmetrics' base_metric argument as a class and its arguments). As torchmetrics 1.9.0's
 * WrapperMetric: update forwards to the base metric and is not counted (the wrapper's update
 * count stays 0, ks_metric_computed stays NULL: `_computed` None); each compute computes the base
 * and, its result being a scalar (KS_E_STATE otherwise, torchmetrics' RuntimeError), moves
 * min_val / max_val (initially +inf / -inf), and returns F32 [3]: raw, max, min (torchmetrics'
 * {"raw", "max", "min"}); reset resets the base and keeps min_val / max_val. It is a described
 * wrapper (binding.h): its base is inner metric "_base_metric" (ks_metric_inner_at), its bounds are
 * attributes "max_val", "min_val" (ks_metric_attr_at), and ks_state_save writes it as the Python
 * package writes torchmetrics' (`attrs/`, `inner/_base_metric/`, a record naming the inner class).
 *
 * Reference: torchmetrics 1.9.0 (tests/vectors replays 663 of its cases, and 587
 * of 1.4.3's and 522 of 0.11.4's through the migrations, with 0 failures). Where
 * the releases differ keepsake follows 1.9.0:
 *  - top_k > 1: the k best classes are the ones torch.topk (CPU) returns, ties
 *    included (its nth_element/partial_sort order, reproduced exactly), and the
 *    stat scores count one prediction per sample, the target when it is among
 *    them, else the first (1.7+). tp and fn, so accuracy and recall, agree with
 *    the older rule; fp and tn of states saved by torchmetrics < 1.7 were
 *    counted per prediction and load as they are (nothing can convert them).
 *  - MeanAbsoluteError's sum is (num_outputs,) and R2Score's sums are () for one
 *    output (1.5+); the 1.4 shapes load as a migration.
 *  - A numeric nan_strategy gives the replaced element weight 1 (1.5+);
 *    'disable' (1.9) checks nothing and, as 1.9 does, sets every weight to 1.
 *  - One-element compute() results are 0-d (torchmetrics squeezes them).
 * Remaining differences from torchmetrics 1.9.0:
 *  - States and results are float32. torchmetrics keeps float64 where the input
 *    was float64 in exact-curve list states and in R2Score's sums and result.
 *  - Summation order: each update adds its batch's sum to the float32 state once,
 *    as torchmetrics' `state += batch.sum()`, so sums across updates round
 *    alike. Within a batch keepsake adds in double (MSE/MAE: float lanes per
 *    512-element block, blocks in double) and rounds once, where torch adds
 *    float32 in a CPU-dependent vectorised cascade: the two differ by float32
 *    rounding of partial sums (e.g. [2^24, 1, 1] sums to 2^24 in torch, 2^24 + 2
 *    here), within 1e-5 relative on the reference vectors.
 *  - R2Score is told num_outputs; torchmetrics >= 1.5 infers it from the first
 *    update (its () initial sums load into num_outputs > 1 by broadcasting).
 *  - Arguments outside the list under ks_metric_create (zero_division,
 *    multidim_average="samplewise", R2Score's adjusted/multioutput, ...) are
 *    refused, never ignored.
 *
 * Errors: every update validates all of its inputs before it changes anything;
 * on any error (bad input or KS_E_NOMEM) the metric is exactly as before.
 *
 * Thread safety: a metric or collection must not be used from two threads at
 * once; distinct metrics are independent. Nothing here touches global state.
 * This module knows nothing about files.
 */
#ifndef KEEPSAKE_METRIC_H
#define KEEPSAKE_METRIC_H

#include "keepsake/export.h"

#include <stddef.h>
#include <stdint.h>

#include "keepsake/alloc.h"
#include "keepsake/statedict.h"
#include "keepsake/status.h"
#include "keepsake/tensor.h"

KS_BEGIN_DECLS

/**
 * Current state schema version written by this library. Version 1 is the
 * pre-torchmetrics-1.1 layout (aggregation states named `value`); version 2 is
 * the torchmetrics 1.1+ layout (`mean_value`, `sum_value`, `max_value`, `min_value`).
 * torchmetrics 1.5's shape changes (MeanAbsoluteError's (n,) sum, R2Score's ()
 * sums) need no new version: a load recognises either layout by its shape.
 */
#define KS_METRIC_SCHEMA_VERSION 2

typedef struct ks_metric ks_metric;

/** How a state is combined with the same state of another process (torchmetrics dist_reduce_fx). */
typedef enum ks_reduce {
  KS_REDUCE_SUM = 0,  /**< element-wise sum */
  KS_REDUCE_MEAN = 1, /**< mean, weighted by the update counts of the two sides */
  KS_REDUCE_MAX = 2,  /**< element-wise max */
  KS_REDUCE_MIN = 3,  /**< element-wise min */
  KS_REDUCE_CAT = 4   /**< concatenation along dim 0; the state grows with every update */
} ks_reduce;

/**
 * Builds a metric from a torchmetrics class name and its constructor arguments.
 *
 * @param class_name torchmetrics (or Composer) class name, e.g. "MulticlassAccuracy", or a wrapper:
 *                   "MinMaxMetric", whose args_json is {"base_metric": {"class": C, "args": {...}}}
 *                   (the base metric is built with the same rules; see "Wrappers" above).
 * @param args_json  a JSON object of constructor arguments ("{\"num_classes\":10}"); NULL or ""
 *                   means {}. Parsed strictly: duplicate keys, unknown keys and values of the
 *                   wrong type or range are rejected. Accepted names: num_classes, num_labels,
 *                   average, top_k, ignore_index, threshold, thresholds (int or list of floats),
 *                   normalize, squared, num_outputs, multidim_average ("global" only),
 *                   nan_strategy (aggregation: "warn", "ignore", "error", "disable" or a
 *                   number), and validate_args / dist_sync_on_step /
 *                   sync_on_compute / compute_on_cpu / compute_with_cache (accepted, ignored).
 * @param alloc      NULL for malloc; copied, its ctx must outlive the metric.
 * @param out        receives the metric; untouched on failure.
 * @param err        optional details.
 * @return KS_OK, KS_E_NOTFOUND (unknown class), KS_E_INVALID (bad args), KS_E_NOMEM.
 * Ownership: free *out with ks_metric_free.
 */
KS_NODISCARD ks_status ks_metric_create(const char *class_name, const char *args_json, const ks_allocator *alloc,
                           ks_metric **out, ks_error *err);

/** Frees a metric and everything it owns. Accepts NULL. */
void ks_metric_free(ks_metric *m);

/**
 * Makes an independent deep copy of `m` (states, cached result, update count).
 * @param alloc NULL to use m's allocator.
 * @return KS_OK or KS_E_NOMEM (then *out is untouched).
 */
KS_NODISCARD ks_status ks_metric_clone(const ks_metric *m, const ks_allocator *alloc, ks_metric **out, ks_error *err);

/** The class name the metric was built with (static string owned by the library). */
const char *ks_metric_class(const ks_metric *m);

/**
 * Canonical JSON of the full constructor arguments, defaults included, keys
 * sorted, no spaces: feeding it back to ks_metric_create rebuilds the same
 * metric. Two metrics can be merged iff class and this string are equal.
 * The string is owned by the metric and lives as long as it.
 */
const char *ks_metric_args_json(const ks_metric *m);

/**
 * Accumulates one batch, as torchmetrics' update().
 *
 * @param inputs   the update() arguments in order, e.g. (preds, target) for classification and
 *                 regression, (value[, weight]) for aggregation, (logits, target) for language.
 *                 Any dtype; data is read, never kept (except copied into cat states).
 * @param n_inputs number of tensors in `inputs`.
 * @return KS_OK; KS_E_INVALID (wrong number of inputs); KS_E_SHAPE (wrong shape, mismatched
 *         batch sizes); KS_E_VALUE (label out of range and not ignore_index, NaN/non-integer
 *         where a label is expected, aggregation NaN with nan_strategy "error");
 *         KS_E_DTYPE (unsupported dtype); KS_E_LIMIT; KS_E_NOMEM.
 *         On any error the metric is unchanged. On success the cached result is dropped
 *         and the update count grows by one.
 */
KS_NODISCARD ks_status ks_metric_update(ks_metric *m, const ks_tensor *inputs, size_t n_inputs, ks_error *err);

/**
 * Computes the metric value from the current states (cached until the next
 * update / reset / merge / load).
 * @param out receives a pointer to a tensor owned by the metric, valid until the next
 *            update, reset, merge, load, restore_computed or free.
 * @return KS_OK, KS_E_NOMEM, or KS_E_STATE when the metric cannot be computed yet
 *         (R2Score with < 2 samples, exact AUROC/AP with no samples).
 */
KS_NODISCARD ks_status ks_metric_compute(ks_metric *m, const ks_tensor **out, ks_error *err);

/** The cached result (torchmetrics `_computed`) or NULL when there is none. Never computes. */
const ks_tensor *ks_metric_computed(const ks_metric *m);

/** Puts every state back to its default, drops the cache and zeroes the update count. */
void ks_metric_reset(ks_metric *m);

/**
 * Merges src's states into dst (the cross-process reduction): sum states add,
 * max/min take the element-wise max/min, mean states average weighted by update
 * counts, and cat states become src's rows followed by dst's rows (torchmetrics'
 * merge_state order: incoming first). The update counts add up.
 * @return KS_OK, KS_E_MISMATCH (different class or args), KS_E_SHAPE (CatMetric rows of a
 *         different shape), KS_E_LIMIT, KS_E_NOMEM. On error dst is unchanged. src is never changed.
 */
KS_NODISCARD ks_status ks_metric_merge(ks_metric *dst, const ks_metric *src, ks_error *err);

/** Number of successful updates (plus merged counts, or what restore_computed set). */
int64_t ks_metric_update_count(const ks_metric *m);

/** Number of states (fixed for a given class + args). */
size_t ks_metric_state_count(const ks_metric *m);

/**
 * Describes state i.
 * @param name    receives the torchmetrics state name (owned by the metric); may be NULL.
 * @param reduce  receives the reduction; may be NULL.
 * @param current receives a borrowed view of the current value (cat states: all rows
 *                concatenated, dim 0 may be 0); valid until the next mutation. May be NULL.
 * @return KS_OK or KS_E_NOTFOUND when i >= state count.
 */
KS_NODISCARD ks_status ks_metric_state_info(const ks_metric *m, size_t i, const char **name, ks_reduce *reduce,
                               ks_tensor *current);

/**
 * Writes every state as a tensor named prefix+state_name (prefix may be "" or NULL),
 * copied into dst. Cat states are written as one concatenated tensor.
 * @return KS_OK, KS_E_NOMEM, KS_E_INVALID (name too long). On error dst may hold some
 *         of the states; the metric is never changed.
 */
KS_NODISCARD ks_status ks_metric_to_state_dict(const ks_metric *m, ks_statedict *dst, const char *prefix,
                                               ks_error *err);

/**
 * Fills the states from the prefix+state_name tensors of src.
 *
 * @param schema_version  version that wrote the states (1 or 2). Version 1 names are migrated
 *                        (`value` -> mean_value/sum_value/max_value/min_value). In every version
 *                        MSE, MAE and R2Score sums are reshaped between () and (num_outputs,) when
 *                        the element counts agree (torchmetrics 1.4 <-> 1.5+ layouts), and a ()
 *                        R2Score sum broadcasts to (num_outputs,) (a fresh 1.5+ R2Score). These
 *                        reshapes need no version: the shapes say which layout was written.
 * @param allow_narrowing 0 refuses a stored dtype that does not widen exactly to the declared one
 *                        (KS_E_DTYPE); nonzero converts anyway. Widening (F16/BF16 -> F32,
 *                        I32 -> I64, ...) is always done.
 * @param migrated        optional; set nonzero when a rename or reshape happened, else 0.
 * @param converted       optional; set nonzero when a dtype conversion happened, else 0.
 * @return KS_OK, KS_E_NOTFOUND (a state is missing; err->key names it), KS_E_DTYPE, KS_E_SHAPE,
 *         KS_E_VERSION (schema_version unknown), KS_E_INVALID (entry is not a tensor), KS_E_NOMEM.
 *         On any error the metric is unchanged. On success the cached result is dropped;
 *         the update count is left alone (see ks_metric_restore_computed).
 */
KS_NODISCARD ks_status ks_metric_load_state_dict(ks_metric *m, const ks_statedict *src, const char *prefix,
                                    int schema_version, int allow_narrowing, int *migrated, int *converted,
                                    ks_error *err);

/**
 * Restores the cached compute() result and the update count after a load.
 * @param computed the saved `_computed` (copied), or NULL for None.
 * @param update_count must be >= 0.
 * @return KS_OK, KS_E_INVALID (negative count), KS_E_NOMEM. On error nothing changes.
 */
KS_NODISCARD ks_status ks_metric_restore_computed(ks_metric *m, const ks_tensor *computed, int64_t update_count,
                                     ks_error *err);

/** Number of classes in the catalogue. */
size_t ks_metric_class_count(void);
/** Name of catalogue class i, or NULL when i is out of range. */
const char *ks_metric_class_name(size_t i);

/* Described metrics (a program's metrics of any class, as a binding describes them to the
   load engine) and the rules about states older torchmetrics releases wrote are in binding.h. */

/* ---- Collection keyed by name (MetricCollection / Composer get_metrics()) ---- */

typedef struct ks_metric_collection ks_metric_collection;

/** Creates an empty collection. @return KS_OK or KS_E_NOMEM. Free with ks_metric_collection_free. */
KS_NODISCARD ks_status ks_metric_collection_create(const ks_allocator *a, ks_metric_collection **out, ks_error *err);

/** Frees the collection and the metrics it holds. Accepts NULL. */
void ks_metric_collection_free(ks_metric_collection *c);

/**
 * Adds a metric under `name` (1..KS_MAX_NAME bytes), keeping insertion order.
 * Takes ownership of m on success only.
 * @return KS_OK, KS_E_EXISTS (name taken), KS_E_INVALID, KS_E_NOMEM.
 */
KS_NODISCARD ks_status ks_metric_collection_add(ks_metric_collection *c, const char *name, ks_metric *m, ks_error *err);

/** The metric named `name`, or NULL. Still owned by the collection. */
ks_metric *ks_metric_collection_get(const ks_metric_collection *c, const char *name);

/** Number of metrics. */
size_t ks_metric_collection_count(const ks_metric_collection *c);

/** Metric at insertion position i (and its name in *name, if not NULL), or NULL when out of range. */
ks_metric *ks_metric_collection_at(const ks_metric_collection *c, size_t i, const char **name);

KS_END_DECLS
#endif
