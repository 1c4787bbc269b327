/**
 * @file binding.h
 * Calls for language bindings, tools and experts: not part of the public API
 * of libkeepsake.so, and not included by keepsake.h.
 *
 * What a binding needs besides the public headers: describing a program's
 * metrics of any class to the load engine, the records and catalogue behind
 * them, the report lines and components a binding adds itself, multi-threaded
 * fetches into a binding's own memory, and instrumentation (a counting I/O
 * table for tests and benchmarks). These functions may change in any release,
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

KS_BEGIN_BINDING_DECLS

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

KS_END_BINDING_DECLS
#endif
