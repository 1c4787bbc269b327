/**
 * @file import.h
 * Imports a torch.save or Composer checkpoint as a keepsake state dict plus
 * the metadata the state loader needs, in one call:
 *
 *   ks_statedict *sd; ks_meta *meta;
 *   ks_torch_import("ep1-ba40-rank0.pt", NULL, &sd, &meta, &err);
 *   ks_save("run.keepsake", sd, meta, NULL, &err);   // what `keepsake convert` writes
 *
 * The file is read with ks_torch_load (nothing pickled is ever executed).
 * When it holds Composer metrics (state/train_metrics/, state/eval_metrics/),
 * each becomes <path>/state_dict/<state> (list states joined along dim 0) and
 * <path>/_computed, whether the file holds Composer >= 0.14's
 * `{state_dict, _computed}` or a whole pickled torchmetrics object (Composer
 * <= 0.13.5), and they are described in two metadata keys
 * (layout.h): KS_META_COMPOSER_METRICS (what the file held) and
 * KS_META_METRICS, the layout ks_state_save writes:
 *   {"<metric path>": {"class": catalogue class (when known), "args": constructor
 *     arguments (only when rebuilt from a pickled object's attributes),
 *     "schema_version": 1 for pre-torchmetrics-1.1 names and shapes, else 2,
 *     "update_count": the object's _update_count, else 1,
 *     "lists": the states that were Python lists in the file (joined along dim 0;
 *       absent when none), so that a .pt export writes them as lists again}}
 * (args are rebuilt from a pickled object's catalogue attributes, the schema
 * version is guessed from the states' names and shapes). ks_state_load then fills a program's metrics by name, and
 * migrates old states. The metadata also holds KS_TORCH_STRUCTURE_META (torch.h):
 * the file's lists, tuples, typed keys and empty containers (without the metric
 * subtrees the mapping rewrote), which a .pt export (ks_torch_save with
 * opts.structure) rebuilds. ks_convert (convert.h) is the whole conversion,
 * `keepsake convert` itself: this import, --ignore, and the keepsake or .pt
 * write, with metric list states written back as lists.
 */
#ifndef KEEPSAKE_IMPORT_H
#define KEEPSAKE_IMPORT_H

#include "keepsake/export.h"

#include <stddef.h>
#include <stdint.h>

#include "keepsake/format.h"
#include "keepsake/statedict.h"
#include "keepsake/status.h"
#include "keepsake/torch.h"

KS_BEGIN_DECLS

/** Options of ks_torch_import. Zero-initialise; new fields are added at the end, zero meaning the default. */
typedef struct ks_import_opts {
  const ks_torch_read_opts *read; /**< how the file is read (allocator, CRC checks, limits); NULL = defaults */
  /**
   * Bytes that rebuilding metrics from pickled attributes may allocate, all
   * metrics together. The attributes are untrusted (num_classes drives a
   * confusion matrix's size). 0 = 2 * input bytes + 64 MiB: a metric whose state
   * is really that large also stores it in the file.
   */
  uint64_t max_metric_bytes;
} ks_import_opts;

/**
 * Reads a torch.save / Composer file, from a path or from bytes in memory, into a
 * state dict and its metadata.
 *
 * @param path  file to read, memory-mapped, never modified; or NULL to read the bytes
 *              opts->read->data instead (copied: they may be freed after the call).
 * @param opts  NULL for defaults.
 * @param out   receives the dict (opts->read->alloc); tensors may be mapped views
 *              into the file, kept alive by the dict until ks_statedict_free.
 * @param meta  receives the metadata to save beside it (the structure document,
 *              and the metric keys when the file has Composer metrics); free with
 *              ks_meta_free. May be NULL.
 * @param err   optional; names the file, key or byte offset that failed.
 * @return as ks_torch_load; and KS_E_SHAPE / KS_E_DTYPE (list state items that
 *         cannot be joined), KS_E_LIMIT (metric arguments asking for more state
 *         than max_metric_bytes allows; err names the metric and its arguments).
 *         On failure *out and *meta are untouched.
 * Thread safety: independent calls may run concurrently.
 */
KS_NODISCARD ks_status ks_torch_import(const char *path, const ks_import_opts *opts, ks_statedict **out, ks_meta **meta,
                          ks_error *err);

/**
 * Reads a checkpoint directory (ks_torch_dcp_load, torch.h): a torch.distributed
 * checkpoint (nothing pickled is executed; a `.metadata` naming anything but DCP's
 * own classes is refused), one keepsake's DCP writer wrote, or a Hugging Face
 * safetensors layout, into a state dict and its metadata: the structure
 * document (KS_TORCH_STRUCTURE_META) and KS_META_DCP_IMPORT, which records the
 * format and version, the counts read and the non-tensor objects left out (with why).
 *
 * @param dir  the checkpoint directory (holding `.metadata` and `*.distcp` files).
 * @param opts NULL for defaults; only `read` is used (allocator, CRC checks, limits, io table).
 * @param out  receives the dict; untouched on failure.
 * @param meta receives the metadata (free with ks_meta_free); may be NULL.
 * @param err  optional; names the file, DCP key and byte offset that failed.
 * @return as ks_torch_dcp_load.
 */
KS_NODISCARD ks_status ks_dcp_import(const char *dir, const ks_import_opts *opts, ks_statedict **out, ks_meta **meta,
                                     ks_error *err);

KS_END_DECLS
#endif
