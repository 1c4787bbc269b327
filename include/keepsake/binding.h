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
