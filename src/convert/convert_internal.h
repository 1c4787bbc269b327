/* The convert module's parts: the report, the input readers, the --ignore pruning and the .pt list states. */
#ifndef KS_CONVERT_INTERNAL_H
#define KS_CONVERT_INTERNAL_H

#include "core/internal.h"
#include "keepsake/binding.h"
#include "keepsake/convert.h"
#include "keepsake/format.h"

struct ks_convert_report {
  const ks_allocator *a;
  size_t written, ignored, list_states;
  size_t n_warnings, cap;
  ks_error *warnings; /* the first KS_CONVERT_MAX_WARNINGS of n_warnings */
};

/* A new empty report (NULL when out of memory). */
ks_convert_report *ks__convert_report_new(const ks_allocator *a);
/* Counts a warning and keeps it, naming `file` (the input), while fewer than
   KS_CONVERT_MAX_WARNINGS are kept. r may be NULL (nothing is kept). */
void ks__convert_warn(ks_convert_report *r, const ks_error *problem, const char *file);

/* KS_E_INVALID unless `out` is absent or a writable regular file (a symbolic link is not followed). */
KS_NODISCARD ks_status ks__convert_check_output(const char *out, ks_error *err);

/*
 * A .pt export of a file the Python package wrote: its container table (`keepsake.pytree`) set into
 * meta as the structure document (KS_TORCH_STRUCTURE_META) the .pt writer reads, when meta has
 * none. KS_E_UNSUPPORTED for a dict whose str keys were saved by position (pytree.c).
 */
KS_NODISCARD ks_status ks__convert_pytree(const ks_allocator *a, const ks_statedict *sd, ks_meta *meta,
                                          ks_error *err);

/*
 * The entries of src that no glob matches, borrowing src's data (src must outlive *out); and the
 * structure document of meta (KS_TORCH_STRUCTURE_META) without the containers they match, set
 * back into meta. No globs: *out is NULL (src is used as it is) and meta is left alone.
 */
KS_NODISCARD ks_status ks__convert_ignore(const ks_statedict *src, const char *const *globs, size_t n, ks_meta *meta,
                             ks_statedict **out, ks_error *err);

/*
 * The list states of a .pt export: the cat states of the metrics in meta's KS_META_METRICS
 * (built within *budget) and the states its records name in "lists". *out
 * borrows src's entries, renaming each `<metric>/state_dict/<s>` to `.../<s>/0` (leaving it out
 * when it has no rows), and *structure_out is meta's structure document (or a new one) with a
 * {"kind":"list"} record for each (free with ks__free(a, ...)). None found: *out and
 * *structure_out are NULL (write src and the structure as they are).
 */
KS_NODISCARD ks_status ks__convert_pt_lists(const ks_allocator *a, const ks_statedict *src, const ks_meta *meta,
                                            uint64_t *budget, ks_statedict **out, char **structure_out, size_t *n_lists,
                                            ks_error *err);

/*
 * Writes sd (tensors, scalars) and meta as a Hugging Face safetensors layout in directory `dir` (absent: made;
 * else it must be empty), through io: ks_convert_opts.hf (hf.c). shard_bytes 0: 5 GB.
 */
KS_NODISCARD ks_status ks__convert_write_hf(const ks_allocator *a, const ks_io *io, const char *dir,
                                            const ks_statedict *sd, const ks_meta *meta, uint64_t shard_bytes,
                                            ks_error *err);

#endif
