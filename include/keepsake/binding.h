/**
 * @file binding.h
 * Calls for language bindings, tools and experts: not part of the public API
 * of libkeepsake.so, and not included by keepsake.h.
 *
 * What a binding needs besides the public headers: describing a program's
 * metrics of any class to the load engine, the metric records it saves and the
 * recorded metrics it rebuilds, the report lines it adds itself, the rules
 * about states older torchmetrics releases wrote, multi-threaded fetches into
 * its own memory, the glob of ignore lists; what the collective layer (dist.h)
 * reads back from a manager and a shard map; and instrumentation (a counting
 * I/O table for tests and benchmarks). These functions may change in any release,
 * so they are not exported from the shared library (they are declared with
 * hidden visibility, see export.h): they are in the static library,
 * libkeepsake.a (CMake: keepsake::keepsake_static; pkg-config: link
 * libkeepsake.a with `pkg-config --static --libs keepsake`), which the Python
 * extension, the CLI, the tests and the benchmarks link. A program that uses
 * them links libkeepsake.a; one linked with libkeepsake.so fails to link,
 * never at run time. Like zstd's ZSTD_STATIC_LINKING_ONLY section, but in a
 * header of its own.
 */
#ifndef KEEPSAKE_BINDING_H
#define KEEPSAKE_BINDING_H

#include "keepsake/export.h"

#include <stddef.h>
#include <stdint.h>

#include "keepsake/keepsake.h"
#include "keepsake/binding/dcpvalue.h"  /* DCP non-tensor values as typed JSON */
#include "keepsake/binding/structure.h" /* the structure document, written */

KS_BEGIN_BINDING_DECLS

/* ------------------------------------------------------------------------ */
/* Paths and globs.                                                          */
/* ------------------------------------------------------------------------ */

/**
 * Matches a '/'-joined path against a glob ('*' any run of bytes, '/' included;
 * '?' one byte). The glob also matches when it matches a '/'-prefix of the path,
 * so "rng" matches "rng/0/state", and "state/optimizers/" followed by a star matches every
 * optimizer entry.
 * @return nonzero on a match; 0 when either argument is NULL. Pure; thread safe.
 */
int ks_path_match(const char *glob, const char *path);

/* ------------------------------------------------------------------------ */
/* The key layout of a training state (layout.h), for bindings that save.    */
/* ------------------------------------------------------------------------ */

/** What a key of a training-state checkpoint names (ks_state_key's `part`). */
typedef enum ks_state_part {
  KS_PART_MODEL = 0,           /**< a model tensor: state/model/<name> */
  KS_PART_OPTIMIZER = 1,       /**< an optimizer's folder: state/optimizers/<name> */
  KS_PART_SCHEDULER = 2,       /**< state/schedulers/<name> */
  KS_PART_CALLBACK = 3,        /**< state/callbacks/<name> */
  KS_PART_DATASET_STATE = 4,   /**< state/dataset_state/<name> */
  KS_PART_RNG = 5,             /**< one rank's generators: rng/<name> (the rank) */
  KS_PART_TIMESTAMP = 6,       /**< a timestamp field: state/timestamp/Timestamp/<name> */
  KS_PART_TRAIN_METRIC = 7,    /**< a train metric's folder: state/train_metrics/<name> */
  KS_PART_EVAL_METRIC = 8,     /**< an eval metric's folder: state/eval_metrics/<base: label>/<name> */
  KS_PART_EXTRA = 9,           /**< the program's extra tree: state/extra[/<name>] */
  KS_PART_RANK_ZERO_SEED = 10, /**< state/rank_zero_seed (no name) */
  KS_PART_RUN_NAME = 11,       /**< state/run_name (no name) */
  KS_PART_METRIC_STATE = 12,   /**< a metric's state: <base: metric path>/state_dict/<name> */
  KS_PART_METRIC_COMPUTED = 13, /**< its cached compute() result: <base>/_computed (no name) */
  KS_PART_METRIC_ATTR = 14,    /**< a wrapper's attribute: <base>/attrs/<name> */
  KS_PART_METRIC_INNER = 15,   /**< a wrapper's inner metric: <base>/inner/<name> */
  KS_PART_METRIC_UPDATE_COUNT = 16, /**< an inner metric's update count: <base>/update_count (no name) */
  KS_PART_LIGHTNING = 17,      /**< Lightning's checkpoint dict apart from its model and metrics: lightning[/<name>] */
  KS_PART_COUNT_ = 18          /**< not a part: the number of parts */
} ks_state_part;

/** The metadata key of the record KeepsakeCheckpointIO (the Python package's Lightning plugin) writes. */
#define KS_META_LIGHTNING "keepsake.lightning"

/**
 * The key of a part of a training state, as ks_state_save names it for a C program and the
 * Python package for its objects: one layout for both (layout.h). `base` is the eval label for
 * KS_PART_EVAL_METRIC (NULL: the folder of every label) and the metric's path for the
 * KS_PART_METRIC_* parts (required); other parts take no base. `name` is the component's or the
 * entry's name; NULL gives the folder that holds every such part ("state/model",
 * "state/train_metrics", "<metric path>/state_dict"), which parts with no name always give.
 * Keys never end in '/': a folder's entries are `<key>/<entry>`. Names are joined as given.
 * @param buf receives the key, NUL-terminated; `cap` bytes.
 * @return KS_OK, KS_E_INVALID (unknown part, a base missing or given where there is none, a
 *         name given to a part that takes none), KS_E_LIMIT (longer than KS_MAX_NAME or cap - 1).
 */
KS_NODISCARD ks_status ks_state_key(ks_state_part part, const char *base, const char *name, char *buf, size_t cap,
                                    ks_error *err);

/**
 * The value keepsake writes for a layout record: KS_META_STATE (ks_state_save and the Python
 * package's training states) or KS_META_LIGHTNING (its Lightning checkpoints).
 * @return the record (static), or NULL for another key.
 */
const char *ks_layout_record(const char *meta_key);

/* ------------------------------------------------------------------------ */
/* Described metrics: a program's metric the catalogue need not implement.   */
/* ------------------------------------------------------------------------ */

/**
 * The reduction named `name`: "sum", "mean", "max", "min", "cat", or torchmetrics' function names
 * "dim_zero_sum" ... "dim_zero_cat" (a state's dist_reduce_fx).
 * @return KS_OK, or KS_E_NOTFOUND for any other name (a custom reduction, None), *out untouched.
 */
KS_NODISCARD ks_status ks_reduce_parse(const char *name, ks_reduce *out);

/** ks_metric_describe_state flag: a cat state whose rows keep the dtype they were stored with. */
#define KS_STATE_ANY_DTYPE 1u

/**
 * Creates a metric that only holds states: the description of a program's metric (any
 * torchmetrics class, catalogue or not), so that the load engine (ks_state_load_state_dict,
 * ks_metric_load_state_dict) decides what of a checkpoint fits it, and ks_metric_merge folds two
 * of them by their declared reductions. It cannot update or compute (KS_E_UNSUPPORTED).
 *
 * @param class_name the program's class name (copied), compared with the one a checkpoint records.
 * @param attrs_json the metric's attributes as JSON (see ks_metric_from_attributes), or NULL. When
 *                   the class is in the catalogue and the attributes give its arguments, the
 *                   metric carries those canonical arguments (ks_metric_args_json; otherwise NULL)
 *                   and its states inherit the catalogue's legacy names and reshape rules.
 * @return KS_OK, KS_E_INVALID (empty name), KS_E_NOMEM. Free *out with ks_metric_free.
 */
KS_NODISCARD ks_status ks_metric_describe(const char *class_name, const char *attrs_json, const ks_allocator *alloc,
                                          ks_metric **out, ks_error *err);

/**
 * Declares the next state of a described metric: name (copied), reduction, dtype and shape (cat
 * states: the row shape after dim 0, whose size is ignored; rows of any shape fit unless the
 * catalogue class fixes them). `flags`: KS_STATE_ANY_DTYPE. The value starts at zero / no rows.
 * @return KS_OK, KS_E_INVALID (not a described metric, bad shape, duplicate name), KS_E_LIMIT
 *         (more than 32 states, name too long), KS_E_NOMEM.
 */
KS_NODISCARD ks_status ks_metric_describe_state(ks_metric *m, const char *name, ks_reduce reduce, ks_dtype dtype,
                                                int rank, const int64_t *shape, unsigned flags, ks_error *err);

/**
 * Adds `inner` (a described metric, taken on success only) as the inner metric `name` of the
 * described metric `m`: a torchmetrics wrapper's base metric, task or side. The load engine
 * fills it from `<path>/inner/<name>/` with `m`, all or nothing; reset resets it with `m`.
 * @return KS_OK, KS_E_INVALID, KS_E_EXISTS (name taken), KS_E_LIMIT (name), KS_E_NOMEM.
 */
KS_NODISCARD ks_status ks_metric_add_inner(ks_metric *m, const char *name, ks_metric *inner, ks_error *err);

/** ks_metric_describe_attr flag: a plain integer (a KS_VAL_INT entry), not a tensor; dtype KS_I64, rank 0. */
#define KS_ATTR_INT 1u

/**
 * Declares an attribute of a described metric that is not a state: what a torchmetrics wrapper
 * keeps besides its states and needs to compute (Running's `_num_vals_seen`, MinMaxMetric's
 * `min_val` / `max_val`), saved as `<path>/attrs/<name>` (KS_KEY_METRIC_ATTRS). A tensor attribute
 * has a dtype and shape; a KS_ATTR_INT one is an integer within [min, max] (min and max are
 * ignored for tensors). The load engine fills the metric only when every declared attribute is in
 * the checkpoint as declared (ks_metric_load_attrs); otherwise the metric is `mismatched` and
 * reset, never half-filled. Attributes are not merged, and a clone has no staged values.
 * @return KS_OK, KS_E_INVALID (not a described metric, bad shape or range, duplicate name),
 *         KS_E_LIMIT (more than 64 attributes, name too long), KS_E_NOMEM.
 */
KS_NODISCARD ks_status ks_metric_describe_attr(ks_metric *m, const char *name, ks_dtype dtype, int rank,
                                               const int64_t *shape, unsigned flags, int64_t min, int64_t max,
                                               ks_error *err);

/**
 * Checks every declared attribute of `m` (not of its inner metrics) against the entries under
 * `prefix` (`<path>/attrs/`) and stages their values in `m`, all or none: each must be present,
 * a KS_ATTR_INT one an integer entry within its range, a tensor one of the declared dtype and
 * shape exactly. The load engine calls it for a described metric and each inner metric it
 * fills; ks_metric_reset drops what was staged.
 * @return KS_OK (also with no attributes), KS_E_NOTFOUND (absent), KS_E_DTYPE (another kind or
 *         dtype), KS_E_SHAPE, KS_E_MISMATCH (an integer out of range), KS_E_LIMIT (key too long),
 *         KS_E_NOMEM. On error nothing is staged (what was staged before is dropped).
 */
KS_NODISCARD ks_status ks_metric_load_attrs(ks_metric *m, const ks_statedict *src, const char *prefix,
                                            ks_error *err);

/**
 * Attribute i of a described metric: its name and flags, and in *value the value a load staged,
 * a view the metric owns until it is reset, loaded again or freed (a KS_ATTR_INT one as an I64
 * scalar), or a tensor with data NULL when nothing is staged.
 * @return KS_OK, or KS_E_NOTFOUND when i is out of range.
 */
KS_NODISCARD ks_status ks_metric_attr_at(const ks_metric *m, size_t i, const char **name, unsigned *flags,
                                         ks_tensor *value);

/** Number of inner metrics of `m` (0 for a catalogue metric). */
size_t ks_metric_inner_count(const ks_metric *m);

/** Inner metric i of `m` (and its name in *name, if not NULL), or NULL when out of range. */
ks_metric *ks_metric_inner_at(const ks_metric *m, size_t i, const char **name);

/**
 * The metric every rank of a group computes alike from the n ranks' copies of one metric
 * (parts[r] is rank r's): a clone of the last folded with ks_metric_merge down to the first, so
 * sums are added in one fixed order and cat rows end up in rank order. Every rank that folds the
 * same parts gets the same bits; the MPI sync (dist.h), the bindings' syncs and the sharded loader
 * at another world size (ks_shard_load_local) use this. A described wrapper (inner metrics,
 * ks_metric_add_inner) folds part by part, as a binding's sync folds it: its own states and update
 * count, then each inner metric's (the parts must have the same inner metrics, by name and order;
 * KS_E_MISMATCH otherwise). Kept attributes are not folded: the result has none staged.
 * @return KS_OK, KS_E_INVALID (n == 0, a NULL part), ks_metric_merge's errors. Free *out.
 */
KS_NODISCARD ks_status ks_metric_fold(const ks_metric *const *parts, size_t n, const ks_allocator *alloc,
                                      ks_metric **out, ks_error *err);

/* ------------------------------------------------------------------------ */
/* States and objects written by older torchmetrics releases.                */
/* ------------------------------------------------------------------------ */

/**
 * Rebuilds a metric from the attributes of a pickled torchmetrics object (as
 * Composer <= 0.13.5 saved them). The attributes that are catalogue
 * constructor arguments (num_classes, average, top_k, threshold, thresholds,
 * ...) are taken; the rest (F1's beta = 1, module flags) are ignored, since
 * they do not change the states.
 *
 * @param class_name      catalogue class, e.g. "MulticlassAccuracy".
 * @param attrs_json      a JSON object of the object's scalar attributes.
 * @param alloc           NULL for malloc; the probes and *out use it.
 * @param state_budget    NULL = no cap; else in: the bytes this call may allocate
 *                        for the probes that check the attributes and for *out;
 *                        out: decreased by what it allocated. One budget can so
 *                        bound a whole import. The attributes are untrusted:
 *                        num_classes = 12000 makes a confusion matrix of 1.1 GB.
 * @param out             receives the metric (its ks_metric_args_json is the
 *                        canonical argument set), or NULL when the arguments
 *                        cannot be rebuilt reliably: unknown class, attributes that
 *                        do not build it, or a binned curve metric, whose
 *                        thresholds are a tensor and not an attribute.
 * @return KS_OK (*out may be NULL), KS_E_LIMIT (the metric would need more than
 *         the budget left; err names class and arguments), KS_E_INVALID
 *         (attrs_json is not a JSON object), KS_E_NOMEM.
 * Ownership: free *out with ks_metric_free. Thread safety: no shared state.
 */
KS_NODISCARD ks_status ks_metric_from_attributes(const char *class_name, const char *attrs_json,
                                                 const ks_allocator *alloc, uint64_t *state_budget, ks_metric **out,
                                                 ks_error *err);

/**
 * ks_metric_create with the bytes the metric's states may allocate bounded:
 * for arguments that come from an untrusted file (num_classes = 100000 asks a
 * confusion matrix for 80 GB). The metric is first built on a counting
 * allocator that refuses past the budget, then for real.
 *
 * @param state_budget NULL = ks_metric_create; else in: the bytes this call may
 *                     allocate, out: decreased by what it allocated (unchanged on failure).
 * @return as ks_metric_create; KS_E_LIMIT when the metric would need more than
 *         the budget left (err names class and arguments).
 * Ownership: free *out with ks_metric_free. Thread safety: no shared state.
 */
KS_NODISCARD ks_status ks_metric_create_bounded(const char *class_name, const char *args_json,
                                                const ks_allocator *alloc, uint64_t *state_budget, ks_metric **out,
                                                ks_error *err);

/**
 * The state schema version of states stored without keepsake metadata, from
 * their names and shapes: 1 when prefix+"value" is a tensor and the class is
 * not CatMetric (torchmetrics < 1.1 named the aggregation states `value`), or
 * prefix+"sum_squared_error" is 0-d and the class is MeanSquaredError or
 * unknown (the old MSE sum shape); otherwise KS_METRIC_SCHEMA_VERSION.
 *
 * @param class_name catalogue class, or NULL when unknown.
 * @param src        the stored states; NULL gives KS_METRIC_SCHEMA_VERSION.
 * @param prefix     key prefix of the states, e.g. "state/train_metrics/M/state_dict/".
 */
int ks_metric_stored_schema_version(const char *class_name, const ks_statedict *src, const char *prefix);

/* ------------------------------------------------------------------------ */
/* The state: what a binding asks of the load engine and the registry.       */
/* ------------------------------------------------------------------------ */

/**
 * The `keepsake.metrics` metadata entry for metrics a binding describes, as JSON text (*out,
 * freed with the allocator's free; NULL alloc: free()). `description` is
 * `{"metrics": [{"path", "class", "update_count", "attrs", "lists", "inner"}, ...]}`: `class`
 * may carry its module (`torchmetrics.classification.MulticlassAccuracy`), `attrs` holds the
 * metric's attributes (see ks_metric_from_attributes), `lists` names its list states, `inner`
 * maps a wrapper's inner metrics to their classes (a load refuses other classes). Each record gets
 * the short class name, the update count, the schema version of the states stored in `sd`
 * under `<path>/state_dict/` (ks_metric_stored_schema_version), the lists, the inner classes and, for a
 * catalogue class its attributes build, the canonical args (ks_metric_describe's rule).
 * @return KS_OK, KS_E_INVALID / KS_E_FORMAT (description), KS_E_LIMIT (a path), KS_E_NOMEM.
 */
KS_NODISCARD ks_status ks_metric_records_json(const char *description, const ks_statedict *sd,
                                              const ks_allocator *alloc, char **out, ks_error *err);

/**
 * Builds, as the program's metrics of `st`, the catalogue metrics that a file's
 * `keepsake.metrics` (in `meta`; none: empty collections) records with a class and args: the
 * train metrics and those of every eval label it names. Their states may allocate at most
 * `budget` bytes in all (the arguments come from the file: KS_E_LIMIT beyond).
 * @return KS_OK, KS_E_FORMAT (the entry is not a JSON object), KS_E_LIMIT, KS_E_INVALID, KS_E_NOMEM.
 */
KS_NODISCARD ks_status ks_state_build_recorded_metrics(ks_state *st, const ks_meta *meta, uint64_t budget,
                                                       ks_error *err);
/** Number of eval labels whose metrics the state holds. */
size_t ks_state_eval_count(const ks_state *st);
/** Eval label i (owned by the state), or NULL when out of range. */
const char *ks_state_eval_label(const ks_state *st, size_t i);

/** Appends an item to a load report (the strings are copied): a binding's own notes about what
 *  it installed. @return KS_OK, KS_E_INVALID (NULL path or reason) or KS_E_NOMEM (report unchanged). */
KS_NODISCARD ks_status ks_load_report_add(ks_load_report *r, ks_load_kind kind, const char *path, const char *reason,
                                          ks_error *err);

/** The registered timestamp (borrowed), or NULL when none is (or st is NULL): the one the manager
 *  names checkpoint files by. */
const ks_timestamp *ks_state_timestamp(const ks_state *st);

/** The I/O table a checkpoint manager uses (ks_io_posix() when it was created with none): for the
 *  collective manager (dist.h), which saves and loads through it. */
const ks_io *ks_ckpt_manager_io(const ks_ckpt_manager *m);

/* The chunks of a shard map (shard.h), read back: for the collective layer (dist.h), which hands
   each rank's map to the writers. */
/** Number of chunks. */
size_t ks_shard_map_count(const ks_shard_map *m);
/** Chunk i (borrowed; valid until the map changes). @return KS_OK or KS_E_NOTFOUND. */
KS_NODISCARD ks_status ks_shard_map_at(const ks_shard_map *m, size_t i, ks_shard_chunk *out);
/** The chunk of `name`. @return KS_OK or KS_E_NOTFOUND. */
KS_NODISCARD ks_status ks_shard_map_get(const ks_shard_map *m, const char *name, ks_shard_chunk *out);

/* ------------------------------------------------------------------------ */
/* File images (format.h): what a save does with one.                       */
/* ------------------------------------------------------------------------ */

/**
 * The snapshot of a staged save: lays the image out for sd and meta (as ks_image_get does),
 * copies each tensor of sd that is not already at its place into it (tensors lying elsewhere in
 * the image's memory are copied aside first), and renders the header (its checksums are
 * ks_image_write's). sd and meta may change once it returns. Waits for a background save still
 * writing from the image first (KS_E_STATE beside one in busy mode).
 * @return KS_OK, KS_E_STATE (busy, or a layout-only image), KS_E_LIMIT (the caller's memory is too
 *         small for sd), KS_E_INVALID (a state ks_save refuses), KS_E_NOMEM. The image is unchanged on failure.
 */
KS_NODISCARD ks_status ks_image_stage(ks_image *im, const ks_statedict *sd, const ks_meta *meta, ks_error *err);

/**
 * Writes the state last staged in the image to path, as ks_save would write it: each tensor
 * hashed where it lies, the header put in its room, the file written from the image (its aligned
 * bulk with direct I/O where the table is local and the file system allows), then the durable
 * replace. Touches only the image (any thread, while nothing else uses the image).
 * @return as ks_save; KS_E_STATE when nothing was staged.
 */
KS_NODISCARD ks_status ks_image_write(ks_image *im, const char *path, const ks_save_opts *opts, ks_error *err);

/** A background save's wait for itself, for an image it writes from: may_refuse nonzero lets it
 *  refuse (KS_E_STATE) in busy mode instead of waiting. It releases the image (ks_image_set_writer). */
typedef ks_status (*ks_image_wait_fn)(void *ctx, int may_refuse, ks_error *err);

/**
 * Registers the background save writing from im (wait, ctx), or releases it (wait NULL, the same
 * ctx): until then ks_image_get, ks_image_stage and ks_image_free call wait first. One writer at
 * a time; called on the thread that drives the image.
 */
void ks_image_set_writer(ks_image *im, ks_image_wait_fn wait, void *ctx);
/* Sharded directories of a binding's torch.distributed front end (shard.h,  */
/* docs/FORMAT.md 9 and 9.1): the one layout, the DCP rules, per-rank items. */
/* ------------------------------------------------------------------------ */

/** Name prefix of a DCP non-tensor value's entry: `KS_SHARD_DCP_OBJECT` + its key (FORMAT.md 9.1). */
#define KS_SHARD_DCP_OBJECT "keepsake.dcp.object/"
/** Rank file metadata key of a DCP save: `{"planner_data": typed JSON string | null, "version": 1}`. */
#define KS_SHARD_DCP_RECORD "keepsake.dcp"
/**
 * Key prefix of the one DCP item by which a rank hands its per-rank entries to the writer
 * (`KS_SHARD_DCP_LOCAL` + its rank: distinct on every rank, so DCP's planner keeps each rank's).
 * Never stored: the writer stores the entries it carries under their own names. Refused as a DCP key.
 */
#define KS_SHARD_DCP_LOCAL "keepsake.dcp.local/"

/** One item of a torch.distributed.checkpoint (DCP) save plan, as a binding's StorageWriter holds it. */
typedef struct ks_shard_dcp_item {
  const char *fqn; /**< DCP's key (its flattened fully qualified name) */
  int object;      /**< a non-tensor value (DCP's BYTE_IO): `data`, a 1-d U8 tensor, is its typed JSON (dcpvalue) */
  int whole;       /**< a whole tensor or value, not a chunk of a DTensor or ShardedTensor */
  ks_tensor data;  /**< the item's bytes (borrowed until the call returns) */
  int64_t global_shape[KS_MAX_RANK]; /**< a chunk's: the global tensor's shape (data.rank dimensions) */
  int64_t offsets[KS_MAX_RANK];      /**< a chunk's: its first element in each dimension */
} ks_shard_dcp_item;

/** What rank `rank` of a DCP save writes (ks_shard_dcp_write_rank). */
typedef struct ks_shard_dcp_rank {
  int rank, world_size;
  const ks_shard_dcp_item *items; /**< DCP's items of this rank's plan */
  size_t n_items;
  /** Keepsake entries beside DCP's items, named as a C program names its state (docs/DESIGN.md, "Key layout"):
   *  each rank gives all of its state, and the writer keeps the per-rank ones (the default per-rank globs)
   *  in every rank's file and the replicated ones in rank 0's only, as ks_shard_write_rank does; the timestamp
   *  among them goes into every file's keepsake.shard record. May be NULL. */
  const ks_statedict *entries;
  const ks_meta *meta;      /**< their records (keepsake.metrics, keepsake.torch_structure, ...); may be NULL */
  int per_rank;             /**< the save holds per-rank entries (any rank's): record the default globs */
  int dcp;                  /**< the save holds DCP items (any rank's): record KS_SHARD_DCP_RECORD */
  const char *planner_data; /**< rank 0: DCP's merged planner data as typed JSON, or NULL */
} ks_shard_dcp_rank;

/**
 * Writes rank r->rank's file of a DCP save into `dir` (docs/FORMAT.md 9.1, items 1-3): on rank 0 a
 * whole item is a replicated entry; every other item is a chunk of the index's sharded section (a whole
 * one at offsets zero when DCP gave it to a rank above 0); a non-tensor value is the entry
 * KS_SHARD_DCP_OBJECT + its key; r->entries go in as ks_shard_write_rank places them; the file records
 * the default per-rank globs when r->per_rank (else none) and KS_SHARD_DCP_RECORD when r->dcp.
 * @return as ks_shard_write_rank; KS_E_INVALID (a key that is empty or begins with KS_SHARD_DCP_OBJECT or
 *         KS_SHARD_DCP_LOCAL, a key that names a per-rank entry when r->per_rank, an object that is no 1-d U8
 *         tensor, a chunk outside its global shape, a DCP item and an entry of one name), KS_E_UNSUPPORTED
 *         (two chunks of one tensor on this rank). Nothing is written on error.
 */
KS_NODISCARD ks_status ks_shard_dcp_write_rank(const char *dir, const ks_shard_dcp_rank *r, const ks_save_opts *opts,
                                               ks_shard_file_info *info, ks_error *err);

/** What a DCP load can ask of a directory (ks_shard_dcp_list): a tensor, a non-tensor value, a keepsake scalar. */
typedef enum ks_shard_dcp_kind {
  KS_SHARD_DCP_TENSOR = 0,
  KS_SHARD_DCP_OBJECT_VALUE,
  KS_SHARD_DCP_SCALAR
} ks_shard_dcp_kind;

/** One item a DCP load of a directory can ask for. */
typedef struct ks_shard_dcp_entry {
  const char *fqn;        /**< DCP's key */
  const char *name;       /**< the stored entry */
  ks_shard_dcp_kind kind; /**< an object's bytes are its typed JSON (a 1-d U8 tensor) */
  ks_dtype dtype;         /**< a tensor's or an object's */
  int rank;               /**< dimensions of global_shape */
  int64_t global_shape[KS_MAX_RANK];
  long sharded;           /**< its tensor i of the index's sharded section (ks_shard_index_chunk gives the chunks),
                               or -1: a whole entry of rank 0's file */
  const ks_entry *scalar; /**< KS_SHARD_DCP_SCALAR: its value (borrowed for the call) */
} ks_shard_dcp_entry;

/** Called by ks_shard_dcp_list for each item; nonzero stops the listing (the call then returns KS_E_STATE). */
typedef int (*ks_shard_dcp_visit_fn)(void *ctx, const ks_shard_dcp_entry *e);

/**
 * Lists what a DCP load of the directory `dir` (index `idx`, checked by the caller) can ask for
 * (docs/FORMAT.md 9.1, item 5): every tensor of the sharded section (an object: exactly one whole chunk of a 1-d U8
 * tensor, else KS_E_FORMAT), and rank 0's other entries and scalars that match no per-rank glob. Rank 0's
 * header is read through `io` (NULL: POSIX), never its data.
 * @param planner_data optional; receives rank 0's recorded planner data (typed JSON, through `alloc`'s free),
 *        or NULL when it recorded none.
 * @return KS_OK, KS_E_FORMAT (a malformed object or KS_SHARD_DCP_RECORD), KS_E_STATE (stopped), reader errors,
 *         KS_E_NOMEM.
 */
KS_NODISCARD ks_status ks_shard_dcp_list(const char *dir, const ks_shard_index *idx, const ks_io *io,
                                         const ks_allocator *alloc, ks_shard_dcp_visit_fn fn, void *ctx,
                                         char **planner_data, ks_error *err);

/** Where a sharded directory keeps its per-rank entries (ks_shard_local_layout). */
typedef enum ks_shard_local_kind {
  KS_SHARD_LOCAL_NAMED = 0, /**< under the names of a C program's state, matching the index's per-rank globs */
  KS_SHARD_LOCAL_DCP02 = 1  /**< none recorded: a DCP save, whose per-rank items keepsake 0.2's Python front end
                                 wrote as DCP items under `rank<r>/` (ks_shard_load_local renames them) */
} ks_shard_local_kind;

/**
 * How the directory `dir` (index `idx`) keeps per-rank entries: KS_SHARD_LOCAL_DCP02 when the index records no
 * per-rank globs and rank 0's file records a DCP save (its header is read through `io`, NULL: POSIX).
 * @return KS_OK, KS_E_INVALID, reader errors.
 */
KS_NODISCARD ks_status ks_shard_local_layout(const char *dir, const ks_shard_index *idx, const ks_io *io,
                                             ks_shard_local_kind *out, ks_error *err);

/** The program's metric at a metric path (`state/train_metrics/<name>`, `state/eval_metrics/<label>/<name>`),
 *  or NULL. */
typedef const ks_metric *(*ks_shard_metric_fn)(void *ctx, const char *path);

/** Options of ks_shard_load_local. All-zero (or NULL) gives the defaults. */
typedef struct ks_shard_local_opts {
  const ks_allocator *alloc; /**< NULL = malloc */
  const ks_io *io;           /**< every read goes through it; NULL = POSIX */
  int verify;                /**< verify each file the load reads against the index first (ks_shard_verify_file) */
  /** The program's metrics (described metrics, binding.h): a saved rank's states are read into a clone of the
   *  program's metric at their path and the saved ranks are folded with ks_metric_fold (a wrapper part by part);
   *  a 0.2 directory's inner-metric parts are named by its inner metrics. NULL, or NULL for a path: the catalogue
   *  class the file records, as ks_shard_load_rank. */
  ks_shard_metric_fn metric;
  void *metric_ctx;
} ks_shard_local_opts;

/**
 * Rank `rank` of `world_size`'s keepsake entries of a sharded checkpoint, as ks_shard_load_rank hands them out
 * (replicated entries from rank 0's file; per-rank entries: at the saved world size this rank's own, else the
 * metrics of the saved ranks ks_shard_assigned gives it folded, and the other per-rank entries of the first of
 * them), without what a DCP load reads: the index's sharded tensors, non-tensor values
 * (KS_SHARD_DCP_OBJECT) and the tensors rank 0's planner data names. A KS_SHARD_LOCAL_DCP02 directory's
 * per-rank items (`rank<s>/rng/...`, `rank<s>/dataset_state/<name>...`, `rank<s>/metrics/<name>/<part>` and
 * `rank<s>/eval_metrics/<label>/<name>/<part>`: metric states as keepsake bytes, part 0 the metric, part i its
 * inner metric i) are given under the per-rank names (`rng/0/...`, `state/dataset_state/<name>/...`,
 * `state/train_metrics/<name>/state_dict/<state>`, ...), with their update counts in keepsake.metrics.
 * @param meta receives rank 0's caller metadata with keepsake.metrics as this rank's metrics.
 * @return as ks_shard_load_rank; KS_E_FORMAT (a malformed 0.2 per-rank item). Nothing is returned on error.
 */
KS_NODISCARD ks_status ks_shard_load_local(const char *dir, const ks_shard_index *idx, int rank, int world_size,
                                           const ks_shard_local_opts *opts, ks_statedict **sd, ks_meta **meta,
                                           ks_error *err);

/* ------------------------------------------------------------------------ */
/* Reading into a binding's own memory.                                      */
/* ------------------------------------------------------------------------ */

/**
 * One tensor for ks_reader_fetch_many: tensor `index` into `cap` bytes at `buf`. A job with `buf`
 * NULL and `cap` 0 keeps nothing: the tensor is only checked against its checksum (a lazy reader
 * reads it piece by piece into a scratch piece of at most 512 KiB and hashes it there), so that a
 * binding can verify what it will later read into memory it must not change before every
 * checksum passed.
 */
typedef struct ks_fetch {
  size_t index;
  void *buf;
  size_t cap;
} ks_fetch;

/**
 * ks_reader_fetch of every job, on up to `threads` threads (0: one per online CPU, at most 4;
 * 1: this thread only; below 32 MiB in all, this thread only). The jobs are cut into runs of
 * about equal bytes, one per thread. Each tensor is verified as ks_reader_fetch verifies it.
 * @return KS_OK, or the error of the earliest job that failed (as ks_reader_fetch's): every
 *         job before it was fetched; jobs after it may be skipped (their memory is unspecified).
 * Thread safety: as ks_reader_fetch (the reader's table must allow concurrent reads, as
 * ks_io_posix()'s and the storage tables' do).
 */
KS_NODISCARD ks_status ks_reader_fetch_many(const ks_reader *r, const ks_fetch *jobs, size_t n, unsigned threads,
                                            ks_error *err);

/**
 * The file's bytes a reader holds in memory: its mapping (KS_READ_MMAP) or its copy (KS_READ_COPY,
 * ks_reader_open_buffer), `*len` bytes from `*p`, valid until ks_reader_free. For a binding that
 * hands them out (the Python Reader's buffer, whose tensors are views of it): a copy read by
 * KS_READ_COPY, on a few threads with each tensor hashed as it lands, needs no copy of its own.
 * @return KS_OK; KS_E_UNSUPPORTED for a lazy reader (it holds the header only); KS_E_INVALID for a
 *         NULL argument.
 */
KS_NODISCARD ks_status ks_reader_memory(const ks_reader *r, const void **p, size_t *len, ks_error *err);

/* ------------------------------------------------------------------------ */
/* A counting I/O table (tests and benchmarks).                              */

/** What a counting table saw. */
typedef struct ks_io_counts {
  uint64_t open_calls; /**< open_fn calls */
  uint64_t read_calls; /**< read_fn calls */
  uint64_t read_bytes; /**< bytes read_fn returned */
  uint64_t map_calls;  /**< successful map_fn calls */
} ks_io_counts;

/**
 * Creates a table that forwards every operation to `inner` and counts its
 * reads. With `no_map` nonzero it has no map_fn, like a remote backend, so
 * readers read through read_fn (what the tests and benchmarks of the lazy mode
 * measure).
 * @return KS_OK, KS_E_INVALID (out NULL, inner fails ks_io_check) or KS_E_NOMEM.
 * Thread safety: the counters are atomic; as thread safe as inner.
 */
KS_NODISCARD ks_status ks_io_counter_create(const ks_io *inner, int no_map, const ks_allocator *a, ks_io **out,
                                            ks_error *err);

/** The counts of a table made by ks_io_counter_create (all zero for another table or NULL). */
void ks_io_counter_get(const ks_io *counter, ks_io_counts *out);

/** Sets the counts of a counting table back to zero. */
void ks_io_counter_reset(const ks_io *counter);

/** Frees a counting table. Accepts NULL. */
void ks_io_counter_free(ks_io *counter);

/* ------------------------------------------------------------------------ */
/* The read side of the value tree (binding/structure.h, FORMAT.md §10).   */
/* ------------------------------------------------------------------------ */

/** What a node of a structure plan is (ks_plan_node's `tag`). */
typedef enum ks_plan_tag {
  KS_PLAN_LEAF = 0,  /**< an entry: `name` (index into the names given), `leaf_kind` */
  KS_PLAN_LIST = 1,  /**< items in index order; children's keys are their int indices */
  KS_PLAN_TUPLE = 2,
  KS_PLAN_SET = 3,
  KS_PLAN_DICT = 4,  /**< a dict whose keys follow from its names (str, or int for a 0.1.0 `intdict`) */
  KS_PLAN_KEYED = 5, /**< a dict whose typed keys the file lists */
  KS_PLAN_GUESS = 6, /**< no record: a dict, int-keyed by default when `int_keys`; children carry
                          `index` (their decimal name's value, or -1) for a template that says
                          list or tuple, and their name as a str key for one with str keys */
  KS_PLAN_NONE = 7   /**< no value (a bare-value file without its entry) */
} ks_plan_tag;

/** One node of a structure plan. Strings live as long as the plan. */
typedef struct ks_plan_node {
  ks_plan_tag tag;
  int leaf_kind;   /**< KS_PLAN_LEAF: 0 (stored as itself) or a ks_leaf_kind */
  int int_keys;    /**< KS_PLAN_GUESS: the default is int keys (no document, all names decimal) */
  size_t name;     /**< KS_PLAN_LEAF: index into the names */
  ks_key key;      /**< the key in the parent (KS_KEY_NONE for the root) */
  ks_key text;     /**< a KS_PLAN_GUESS parent's child: its name as a str key */
  int64_t index;   /**< a KS_PLAN_GUESS parent's child: its decimal name's value, or -1 */
  size_t first, n; /**< children: ks_plan_child(plan, first .. first + n - 1) */
} ks_plan_node;

/** A plan: how the entries under a prefix make one nested value. */
typedef struct ks_plan ks_plan;

/**
 * Decides, from a file's metadata records, what the entries under `prefix` rebuild as: which
 * folders are lists, tuples, sets or dicts, each dict key typed (str keys unescaped: the inverse
 * of ks_key_text; int, float, bool, None from the document's `keys` or the 0.1.0 table's codes),
 * and which leaves are big ints, arrays or bytes. Empty containers the records list appear.
 * @param document the structure document (KS_TORCH_STRUCTURE_META) or NULL when the file has
 *        none; text that is not JSON counts as no record at all.
 * @param pytree the `keepsake.pytree` table of 0.1.0 files, read only when `document` is NULL.
 * @param names the file's entry names (UTF-8); only those starting with `prefix` are used.
 * @param prefix "" or a folder path ending with '/'.
 * @param out receives the plan (free with ks_plan_free); node 0 is the root.
 * @return KS_OK; KS_E_FORMAT for records that do not describe the entries (an `intdict` name
 *         that is not an int, a malformed key list); KS_E_LIMIT past KS_PLAN_MAX_DEPTH name
 *         components; KS_E_INVALID for NULL arguments; KS_E_NOMEM. Nodes and memory are
 *         bounded by the size of the names and records.
 */
KS_NODISCARD ks_status ks_structure_plan(const char *document, size_t document_len, const char *pytree,
                                         size_t pytree_len, const char *const *names, const size_t *name_lens,
                                         size_t n_names, const char *prefix, const ks_allocator *alloc,
                                         ks_plan **out, ks_error *err);

/** The deepest plan, in name components. */
#define KS_PLAN_MAX_DEPTH 256

/** Node i of a plan (0 is the root), or NULL past the end. */
const ks_plan_node *ks_plan_at(const ks_plan *p, size_t i);

/** The node index of child slot i of a plan (a node's `first` + k). */
size_t ks_plan_child(const ks_plan *p, size_t i);

/** Frees a plan. Accepts NULL. */
void ks_plan_free(ks_plan *p);

KS_END_BINDING_DECLS
#endif
