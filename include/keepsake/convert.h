/**
 * @file convert.h
 * Converts a checkpoint file in one call: what `keepsake convert IN OUT` and
 * the Python package's keepsake.convert() do, both through this call.
 *
 *   ks_convert_opts o = {0};
 *   ks_convert_report *rep = NULL;
 *   ks_status st = ks_convert("ep1-ba40-rank0.pt", "run.keepsake", &o, &rep, &err);
 *   for (size_t i = 0; i < ks_convert_report_warning_count(rep); i++) ...
 *   ks_convert_report_free(rep);
 *
 * The steps, in order:
 *  1. OUT is checked: it must be absent or a writable regular file. A symbolic
 *     link (never followed), directory, device, FIFO, socket or read-only file
 *     is refused and left as it is.
 *  2. IN is read whole into memory, never mapped (a file truncated meanwhile
 *     gives an error, not SIGBUS); a FIFO or device is refused at once. Its
 *     kind comes from its bytes: a zip archive (or torch's legacy format, which
 *     the import refuses with a message naming it) is a torch.save / Composer
 *     file, read by ks_torch_import (import.h); anything else is a
 *     keepsake or safetensors file, read by ks_load_buffer, whose metadata pairs
 *     are kept (but the writer's own keys). An IN that is a directory is read
 *     by ks_dcp_import (import.h) instead, through opts->in_io: a torch
 *     distributed checkpoint (`.metadata`), a directory keepsake's DCP writer
 *     wrote, or a Hugging Face safetensors layout.
 *  3. Integrity: every zip entry's CRC32, every keepsake checksum is checked. A
 *     mismatch fails with KS_E_CHECKSUM and nothing is written, unless
 *     opts->salvage: then each problem becomes a warning of the report and the
 *     input is read again without the checks.
 *  4. opts->ignore: entries matching a glob (ks_path_match, binding.h: a '/'-prefix match
 *     counts) are left out, and so are the structure records (torch.h,
 *     KS_TORCH_STRUCTURE_META) of the containers they match.
 *  5. With opts->hf, OUT is a directory in the Hugging Face layout (see
 *     ks_convert_opts.hf). Else OUT ending in ".pt" or ".pth" is written by ks_torch_save with the
 *     structure document (lists, tuples, typed keys come back as they were) and
 *     opts->torch_compat; list ("cat") states of the metrics named in the
 *     KS_META_METRICS metadata become one-item lists (see below). Any other OUT
 *     is written by ks_save with the metadata.
 *
 * List states in a .pt: torchmetrics keeps a cat state (CatMetric's value,
 * the preds and target of exact curve metrics) as a Python list of tensors, and
 * its next update() appends to it. keepsake stores such a state as one tensor,
 * all items joined along dim 0. The export builds each metric of KS_META_METRICS
 * from its class and args (ks_metric_create_bounded, binding.h: the args come from the
 * file, so opts->max_metric_bytes bounds what the metrics may allocate) and asks
 * which states reduce by KS_REDUCE_CAT (ks_metric_state_info; this depends on
 * the args: BinaryAUROC with thresholds keeps a confusion matrix). A record
 * with a "lists" member (the import and the Python package record the states
 * that were lists where they came from) is taken at its word instead. Each such
 * entry `<metric>/state_dict/<state>` is written as the list
 * `[<the joined tensor>]`, or `[]` when it has no rows, with the record
 * {"kind": "list", "len": 1 or 0} in the structure document. A metric whose
 * class is not in the catalogue, or whose args do not build it, and that names no
 * "lists", keeps its states as they are (they still load, as tensors).
 */
#ifndef KEEPSAKE_CONVERT_H
#define KEEPSAKE_CONVERT_H

#include "keepsake/export.h"

#include <stddef.h>
#include <stdint.h>

#include "keepsake/alloc.h"
#include "keepsake/io.h"
#include "keepsake/status.h"

KS_BEGIN_DECLS

/** Options of ks_convert. Zero-initialise; see "Growing structs" in export.h. */
typedef struct ks_convert_opts {
  size_t size;                /**< 0 or sizeof(this struct) */
  const ks_allocator *alloc;  /**< NULL = malloc; every allocation of the call, the report's too */
  const char *const *ignore;  /**< globs of entries to leave out (ks_path_match, binding.h); may be NULL */
  size_t n_ignore;            /**< number of globs in ignore */
  int salvage;                /**< nonzero: integrity problems become warnings, the input is converted anyway */
  int torch_compat;           /**< ks_torch_write_opts.torch_compat of a .pt output (KS_TORCH_COMPAT_1_13) */
  uint64_t max_metric_bytes;  /**< bytes that metrics built from the file's arguments may allocate, in the
                                   import and again in the .pt export; 0 = 2 * input bytes + 64 MiB */
  const ks_io *io;            /**< file operations of the output's durable replace; NULL = ks_io_posix().
                                   The output checks (symlink, device, FIFO, read-only) apply to local outputs only */
  const ks_io *in_io; /**< file operations of reading the input (read whole, never mapped); NULL = ks_io_posix() */
  /**
   * Nonzero: OUT is a directory (absent, or empty; created) in the Hugging Face safetensors layout,
   * which torch's HuggingFaceStorageReader and transformers' from_pretrained read as written: one
   * `model.safetensors`, or `model-00001-of-0000N.safetensors` files and `model.safetensors.index.json`
   * (`metadata.total_size`, `weight_map`), written last. Every tensor is whole (a sharded input is
   * consolidated) and stored under the name torch DCP and Hugging Face give it: its keepsake name's
   * components, '%2F' and '%25' read back, joined by '.' (`model/emb.weight` -> `model.emb.weight`), the
   * keepsake name recorded beside it (KS_META_HF_NAMES). Each file is a keepsake file (per-tensor
   * checksums in its header, with `format` = `pt`); the first also holds the scalars and metadata.
   */
  int hf;
  /** With hf: the most tensor bytes one file holds (a larger tensor gets a file of its own); 0 = 5 GB,
      transformers' default max_shard_size. */
  uint64_t hf_shard_bytes;
} ks_convert_opts;

/** What a conversion did. Opaque; read with the functions below. */
typedef struct ks_convert_report ks_convert_report;

/**
 * Converts IN to OUT (the steps are in the file comment above).
 *
 * @param in     input file; only read.
 * @param out    output file; replaced atomically and durably (as ks_save / ks_torch_save).
 * @param opts   NULL for defaults.
 * @param report optional; receives the report, on failure too (with the warnings gathered
 *               until then) unless memory ran out first (then NULL). Free with
 *               ks_convert_report_free.
 * @param err    optional; names the file, key or byte offset that failed.
 * @return KS_OK; KS_E_INVALID (OUT exists and is not a writable regular file: err's message
 *         says what it is; NULL argument), KS_E_IO (IN cannot be read, or is not a regular
 *         file), KS_E_CHECKSUM (an integrity check failed and opts->salvage is 0), KS_E_LIMIT
 *         (metric arguments asking for more than max_metric_bytes), KS_E_FORMAT (also: a .pt
 *         output whose input's KS_META_METRICS is not a JSON object), or any status of
 *         ks_torch_import, ks_load_buffer, ks_save and ks_torch_save
 *         (KS_E_NOT_DURABLE: OUT is in place, its directory fsync failed). On failure before
 *         the write, OUT is untouched.
 * Thread safety: independent calls may run concurrently (on different OUT paths).
 */
KS_NODISCARD ks_status ks_convert(const char *in, const char *out, const ks_convert_opts *opts,
                                  ks_convert_report **report, ks_error *err);

/** Entries written to OUT. 0 for NULL. */
size_t ks_convert_report_written(const ks_convert_report *r);
/** Entries of IN that opts->ignore left out. 0 for NULL. */
size_t ks_convert_report_ignored(const ks_convert_report *r);
/** List (cat) states written as lists into a .pt output. 0 for NULL. */
size_t ks_convert_report_list_states(const ks_convert_report *r);
/**
 * Integrity problems that opts->salvage converted despite, in the order found: all of
 * them are counted, the first KS_CONVERT_MAX_WARNINGS are kept (ks_convert_report_warning).
 * 0 for NULL.
 */
size_t ks_convert_report_warning_count(const ks_convert_report *r);
/** Warnings kept by a report (the rest are only counted). */
#define KS_CONVERT_MAX_WARNINGS 4096
/** Warning i (i < min(count, KS_CONVERT_MAX_WARNINGS)), owned by the report; NULL when out of range. */
const ks_error *ks_convert_report_warning(const ks_convert_report *r, size_t i);
/** Frees a report. Accepts NULL. */
void ks_convert_report_free(ks_convert_report *r);

KS_END_DECLS
#endif
