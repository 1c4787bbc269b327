/**
 * @file layout.h
 * The names keepsake gives things inside a training-state checkpoint: the
 * metadata keys it writes beside the tensors, and the key prefixes of each part
 * of the state. The layout is Composer's state dict flattened with '/', so a
 * Composer checkpoint and a keepsake state file name the same thing alike.
 *
 *   state/model/<param>                                   model tensors
 *   state/optimizers/<Name>/...                           optimizer state dicts
 *   state/schedulers/<Name>/...                           LR scheduler state dicts
 *   state/callbacks/<Name>/...   state/dataset_state/...  other components
 *   state/timestamp/Timestamp/<field>                     training progress
 *   state/rank_zero_seed   state/run_name                 run identity
 *   state/train_metrics/<Name>/state_dict/<state>         train metric states
 *   state/train_metrics/<Name>/_computed                  its cached result (or null)
 *   state/eval_metrics/<label>/<Name>/state_dict/<state>  eval metric states (and _computed)
 *   <metric>/attrs/<a>   <metric>/inner/<n>/...            a wrapper's attributes and inner metrics
 *   state/extra/...      rng/<rank>/...                    a program's extra tree, the generators
 *
 * Metric and label names may themselves contain '/': a metric is named by its
 * whole path, e.g. "state/eval_metrics/val/holdout/acc/top1".
 *
 * Header-only constants; nothing to link. The format's own keys
 * (keepsake.format, keepsake.checksums, ...) are in format.h.
 */
#ifndef KEEPSAKE_LAYOUT_H
#define KEEPSAKE_LAYOUT_H

/* ---- metadata keys ---- */

/** JSON object: metric path -> {class, args, schema_version, update_count, lists}. */
#define KS_META_METRICS "keepsake.metrics"
/** The container table keepsake 0.1.0's Python package wrote ({path: kind}); read, not written (§10). */
#define KS_META_PYTREE "keepsake.pytree"
/** JSON object describing the state layout: {"layout_version":1}. */
#define KS_META_STATE "keepsake.state"
/** JSON description of the metrics found in an imported Composer checkpoint (ks_torch_import, import.h). */
#define KS_META_COMPOSER_METRICS "keepsake.composer_metrics"
/**
 * The torch structure document: which folders are lists, tuples, sets or dicts with typed keys
 * (docs/FORMAT.md §10). Written through ks_structure (binding/structure.h) by `keepsake convert` from a
 * torch file, by ks_state_save and by the Python package.
 */
#define KS_TORCH_STRUCTURE_META "keepsake.torch_structure"

/* ---- key prefixes (each ends in '/') and fixed keys ---- */

#define KS_KEY_STATE "state/"                          /**< root of the training state */
#define KS_KEY_MODEL "state/model/"                    /**< model tensors */
#define KS_KEY_OPTIMIZERS "state/optimizers/"          /**< one folder per optimizer */
#define KS_KEY_SCHEDULERS "state/schedulers/"          /**< one folder per scheduler */
#define KS_KEY_CALLBACKS "state/callbacks/"            /**< one folder per callback */
#define KS_KEY_DATASET_STATE "state/dataset_state/"    /**< data loader position */
#define KS_KEY_TIMESTAMP "state/timestamp/Timestamp/"  /**< training progress fields */
#define KS_KEY_TRAIN_METRICS "state/train_metrics/"    /**< then <Name>/ */
#define KS_KEY_EVAL_METRICS "state/eval_metrics/"      /**< then <label>/<Name>/ */
#define KS_KEY_RANK_ZERO_SEED "state/rank_zero_seed"   /**< int */
#define KS_KEY_RUN_NAME "state/run_name"               /**< string */

/** Inside a metric's folder: its states, as `state_dict/<state>`. */
#define KS_KEY_METRIC_STATES "state_dict/"
/** Inside a metric's folder: its cached compute() result, a tensor or null. */
#define KS_KEY_METRIC_COMPUTED "_computed"
/** A described metric's attributes that are not states (a wrapper's): `<metric path>/attrs/<name>`. */
#define KS_KEY_METRIC_ATTRS "attrs/"
/** A described wrapper's inner metrics: `<metric path>/inner/<name>/`, each laid out as a metric. */
#define KS_KEY_METRIC_INNER "inner/"
/** Inside an inner metric's folder: its update count (an int; a top metric's is in keepsake.metrics). */
#define KS_KEY_METRIC_UPDATE_COUNT "update_count"
/** A Python program's `extra` tree (nested dicts, lists, tensors, scalars). */
#define KS_KEY_EXTRA "state/extra"
/** One folder per rank's generators: `rng/<rank>/...` (a single file holds rank 0's). */
#define KS_KEY_RNG "rng/"

/**
 * What `keepsake convert` read from a torch.distributed.checkpoint directory (ks_torch_dcp_load's info
 * document: DCP version, counts, and the non-tensor objects left out with the reason).
 */
#define KS_META_DCP_IMPORT "keepsake.dcp_import"

/**
 * In the files of a Hugging Face layout that keepsake wrote (ks_convert_opts.hf): the keepsake name of
 * each tensor stored under another key, as JSON {"<stored key>": "<keepsake name>"}. Tensors are stored
 * under the name torch DCP and Hugging Face give them (the components of the keepsake name, '%2F' and
 * '%25' read back, joined by '.'); reading the layout back (ks_dcp_import) renames them.
 */
#define KS_META_HF_NAMES "keepsake.hf_names"

#endif
