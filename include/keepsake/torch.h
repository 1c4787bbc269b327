/**
 * @file torch.h
 * A safe bridge to PyTorch: reads torch.save files (zip + pickle) and
 * torch.distributed.checkpoint directories without executing anything, and
 * writes files that torch.load(weights_only=True) accepts. (Composer
 * checkpoints are mapped onto keepsake's metric layout by ks_torch_import,
 * import.h.)
 *
 * Reading never imports or calls anything named by the pickle. Known
 * constructors (tensors, storages, OrderedDict, torch.device, numpy arrays of
 * RNG state, sets, _codecs.encode, torch >= 2.3's _rebuild_tensor_v3 over an
 * UntypedStorage) are interpreted; every other GLOBAL, REDUCE, NEWOBJ or BUILD
 * becomes an inert object.
 *
 * Key layout of a flattened file: the '/'-joined path of each leaf. Dict keys
 * as written (ints in decimal, True/False/None by name), with '/' and '%' inside
 * a key escaped as "%2F" and "%25" (so {"a/b": 1, "a": {"b": 2}} gives the two
 * names "a%2Fb" and "a/b"); list, tuple and set items by index. Leaves: tensors
 * and numpy arrays -> tensors (views are materialised contiguously), bytes ->
 * 1-d U8 tensors, int/float/bool/str/None -> scalars (ints beyond 64 bits ->
 * decimal strings). An inert object adds `<path>/__class__` = "module.name"
 * and flattens its BUILD state (attributes) and any items appended to it under
 * its own path; an object with neither (datetime.timedelta, an enum member)
 * flattens its constructor arguments as the tuple `<path>/__args__`. Empty
 * containers, bare global references and BUILD state of dicts (OrderedDict
 * `_metadata`) add no entries. Two values that would still get one name (an int
 * key 1 beside a str key "1"), or a name that would be both a value and a
 * folder, are refused with KS_E_EXISTS: nothing is dropped silently.
 *
 * Structure: what names cannot say (which folders are lists, tuples or sets,
 * which dict keys are ints, bools, None or floats, which containers are empty)
 * is returned by ks_torch_load (its `structure` argument) as a JSON document, which
 * `keepsake convert` keeps in the metadata key KS_TORCH_STRUCTURE_META and
 * hands back to ks_torch_save (opts.structure), so that an exported .pt has
 * the lists, tuples and int keys of the original:
 *   {"version": 1, "containers": {"<escaped path>": {"kind": "list" | "tuple" | "set" | "dict" | "value",
 *                                  "len": <items, for list/tuple/set>,
 *                                  "keys": {"<name component>": <int|bool|null|float key>}}}}
 * The root container's path is ""; kind "value" there means the file held one
 * bare value (flattened as the entry "value"). Only containers that are not non-empty
 * str-keyed dicts are listed. See docs/FORMAT.md, "torch structure".
 */
#ifndef KEEPSAKE_TORCH_H
#define KEEPSAKE_TORCH_H

#include "keepsake/export.h"

#include <stddef.h>
#include <stdint.h>

#include "keepsake/alloc.h"
#include "keepsake/io.h"
#include "keepsake/layout.h"
#include "keepsake/statedict.h"
#include "keepsake/status.h"

KS_BEGIN_DECLS

/* KS_TORCH_STRUCTURE_META, the metadata key of the structure document, is in layout.h. */

/**
 * Options for reading. Zero-initialise; zero limits mean the defaults below.
 * Besides these, three fixed bounds keep a small hostile file cheap: the pickle
 * program's work (opcodes run plus items copied by constructors such as set()
 * or OrderedDict() of a memoised list) is capped at 32 per pickle byte + 2^20;
 * the memory it holds for its values, strings, items, stack, marks and memo at
 * 16 bytes per pickle byte + 1 MiB (real pickles take 4 to 13); and integers
 * longer than 4096 bytes are refused (KS_E_LIMIT) when they would become an
 * entry; shorter ones are converted to decimal once, however many times the
 * pickle references them. Nesting of _rebuild_from_type_v2 is unwrapped
 * iteratively, at any depth.
 */
typedef struct ks_torch_read_opts {
  size_t size;               /**< 0 or sizeof(this struct): see "Growing structs" in export.h */
  const ks_allocator *alloc; /**< NULL = malloc; also the result dict's allocator */
  int verify_crc;            /**< nonzero: check the CRC32 of every zip entry read */
  size_t max_memo;           /**< memo slots; default 1<<24 (and never more than pickle bytes) */
  size_t max_stack;          /**< pickle stack + mark depth; default 1<<20 */
  uint64_t max_string;       /**< one string or bytes object; default 1 GiB */
  uint64_t max_view_bytes;   /**< bytes materialised for strided views and byte-swapped numpy arrays;
                                  default 2*file+64 MiB */
  size_t max_depth;          /**< nesting depth of the flattened tree; default 64 */
  size_t max_entries; /**< flattened entries, and separately containers visited while flattening (a pickle can share one
                         container many times); default 8*pickle bytes + 4096 */
  uint64_t max_output_bytes; /**< bytes of all flattened names, tensors, bytes and strings together,
                                  a value shared by n paths counting n times, and the records they make:
                                  256 bytes per entry, and for each path to a list, tuple, set, dict
                                  or object its name plus 512 bytes; default 4*file+64 MiB */
  /** The table the file is read through (open, map or read, close; stat for the import's size):
   *  NULL = ks_io_posix(). A table that cannot map (remote, cache) reads the file into memory. */
  const ks_io *io;
  /** Appended in 0.3: the bytes of a torch.save file, read instead of a path when the path
   *  argument of ks_torch_load, ks_torch_import or ks_torch_probe is NULL (data_len bytes). */
  const void *data;
  size_t data_len;
} ks_torch_read_opts;

/**
 * Reads a torch.save file, from a path or from bytes in memory, into a flat
 * state dict (see the key layout above).
 *
 * @param path  file to read, or NULL to read opts->data instead. A file is
 *              memory-mapped, never modified. The mapping makes the same promise
 *              as KS_READ_MMAP (format.h): a file truncated by another process
 *              meanwhile raises SIGBUS. For files you do not control, read the
 *              bytes yourself and pass them as opts->data.
 * @param opts  NULL for defaults; opts->data and data_len: the bytes to read when
 *              path is NULL (exactly one of the two is given).
 * @param out   receives a new dict on success; untouched on failure. From a file,
 *              contiguous tensors are KS_MAPPED views into the file's mapping,
 *              which the dict keeps alive until ks_statedict_free; from bytes,
 *              tensor data is copied into the dict, so they may be freed as soon as
 *              the call returns.
 * @param structure optional; receives the structure document of the containers
 *              (see "Structure" above), NUL-terminated JSON allocated with
 *              opts->alloc (free with ks_torch_free); untouched on failure.
 * @param err   optional; says which entry, key or pickle byte offset failed.
 * @return KS_OK, KS_E_INVALID (no path and no opts->data, or both), KS_E_IO,
 *         KS_E_FORMAT (not a zip / bad pickle), KS_E_UNSUPPORTED
 *         (compressed entry, unknown opcode, the legacy non-zip format), KS_E_LIMIT (a limit
 *         of opts, e.g. max_output_bytes), KS_E_DTYPE (a dtype keepsake has no counterpart
 *         for: the message names it), KS_E_EXISTS (two values would get one name),
 *         KS_E_CHECKSUM or KS_E_NOMEM.
 * Thread safety: independent calls may run concurrently.
 */
KS_NODISCARD ks_status ks_torch_load(const char *path, const ks_torch_read_opts *opts, ks_statedict **out,
                                     char **structure, ks_error *err);

/** What ks_torch_probe finds. */
typedef enum ks_torch_kind {
  KS_TORCH_UNKNOWN = 0, /**< none of these (a keepsake or safetensors file, a missing path, ...) */
  KS_TORCH_ZIP = 1,     /**< a torch.save zip archive (the format of torch >= 1.6) */
  KS_TORCH_LEGACY = 2,  /**< torch's legacy, pre-1.6 serialization (`_use_new_zipfile_serialization=False`):
                             a pickled magic number, then more pickles and raw storages. The readers
                             refuse it with KS_E_UNSUPPORTED and a message naming the format */
  KS_TORCH_DCP = 3      /**< a checkpoint directory ks_torch_dcp_load reads: a directory (or a link to
                             one) holding a `.metadata` file (torch.distributed.checkpoint's
                             FileSystemWriter), a `model.safetensors.index.json` (keepsake's sharded
                             index, or a Hugging Face one) or a `model.safetensors` */
} ks_torch_kind;

/**
 * What torch wrote at `path`, or in opts->data when path is NULL, without reading it:
 * through opts->io (NULL = ks_io_posix()) a directory is only stat'ed (KS_TORCH_DCP
 * or KS_TORCH_UNKNOWN) and a file's first 14 bytes are read; bytes in memory are
 * looked at (14 suffice). Never fails: what cannot be read is KS_TORCH_UNKNOWN.
 */
ks_torch_kind ks_torch_probe(const char *path, const ks_torch_read_opts *opts);

/** Options for writing. Zero-initialise. */
typedef struct ks_torch_write_opts {
  size_t size;               /**< 0 or sizeof(this struct): see "Growing structs" in export.h */
  const ks_allocator *alloc; /**< NULL = malloc; used for temporary and output buffers */
  const char *root;          /**< archive folder name; NULL = "archive" */
  const ks_io *io;           /**< file operations of ks_torch_save; NULL = ks_io_posix() */
  const char *structure;     /**< NULL, or a structure document (see above): folders become the
                                  lists, tuples and typed-key dicts it names, empty containers it
                                  names are written, and name components are unescaped */
  int torch_compat;          /**< 0: torch >= 2.4 (native uint16/32/64 and float8 tensors, floats as
                                  Python floats); KS_TORCH_COMPAT_1_13: what torch 1.13's
                                  weights_only loader accepts (see ks_torch_save) */
} ks_torch_write_opts;

/** ks_torch_write_opts.torch_compat for files torch 1.13's torch.load(weights_only=True) reads. */
#define KS_TORCH_COMPAT_1_13 113

/**
 * Writes sd as a torch.save-compatible file: a stored zip with 64-byte aligned
 * storages, the byteorder / .format_version / .storage_alignment records, and a
 * pickle protocol 2 data.pkl that torch's default torch.load(weights_only=True)
 * accepts. The '/'-joined names are rebuilt into nested dicts with string keys,
 * or, with opts->structure, into the lists, tuples and typed keys it records.
 * Tensors become _rebuild_tensor_v2 calls, or _rebuild_tensor_v3 over an
 * UntypedStorage for U16/U32/U64/F8; floats, ints, bools, strings and null are
 * plain pickle values. With KS_TORCH_COMPAT_1_13, U16 and U32 are widened to
 * I32 / I64, U64 must fit in I64, F8 dtypes are refused and floats become 0-d
 * float64 tensors (1.13's safe loader lacks BINFLOAT and the newer dtypes).
 * A name nesting deeper than ks_torch_load's default depth (64), or longer than
 * KS_MAX_NAME once re-read and escaped, is refused with KS_E_LIMIT: the writer
 * never makes a file its own reader refuses.
 * The archive is streamed through opts->io to `<dir>/.<name>.tmp-<6 random
 * characters>`, which is fsynced, renamed over `path`, and the directory
 * fsynced (the same durable replace as ks_save). On any failure before the
 * rename the temporary file is removed and the previous file at `path` is
 * untouched. If only the final directory fsync fails, `path` already holds the
 * new file but its durability is unknown; KS_E_NOT_DURABLE is returned (KS_E_IO
 * always means `path` is unchanged).
 *
 * @param path destination; its directory must exist.
 * @return KS_OK, KS_E_INVALID (a name is both a value and a folder, bad UTF-8,
 *         path names a directory, a malformed structure document, list items that
 *         are not 0..len-1), KS_E_LIMIT, KS_E_DTYPE, KS_E_IO, KS_E_NOT_DURABLE or KS_E_NOMEM; err names
 *         `path` as the file.
 * Thread safety: sd is only read.
 */
KS_NODISCARD ks_status ks_torch_save(const char *path, const ks_statedict *sd, const ks_torch_write_opts *opts,
                        ks_error *err);

/**
 * Same as ks_torch_save, into memory. *out is allocated with opts->alloc; free it
 * with ks_torch_free(opts->alloc, *out).
 */
KS_NODISCARD ks_status ks_torch_save_buffer(const ks_statedict *sd, const ks_torch_write_opts *opts, void **out,
                               size_t *out_len, ks_error *err);

/** Frees memory this module returned (buffers, JSON). alloc NULL = libc. Accepts NULL p. */
void ks_torch_free(const ks_allocator *alloc, void *p);

/* ---- torch.distributed.checkpoint (DCP) directories ---- */

/**
 * Reads a torch.distributed.checkpoint directory (FileSystemWriter,
 * SerializationFormat.TORCH_SAVE, any number of ranks) into one flat state
 * dict, without executing anything.
 *
 * `.metadata` is run on the same non-executing pickle machine as ks_torch_load
 * and must name no global but DCP's metadata dataclasses, torch.Size, torch
 * dtypes, layouts and memory formats, pathlib paths and OrderedDict: anything
 * else (os.system, builtins.eval, ...) refuses the whole directory with
 * KS_E_UNSAFE. Each tensor is assembled from its chunks (each a torch.save
 * archive of one tensor at the (offset, length) `.metadata` records in a
 * `.distcp` file of the directory, read with the table's ranged read, never
 * mapped); the chunks must cover every element exactly once. Each non-tensor
 * item (a torch.save archive of any value) is kept when it is plain data
 * (None, bool, int, float, str, bytes, tensors, and lists, tuples, sets and
 * dicts of them); other objects are left out and listed in *info. Entries are
 * named as ks_torch_load names a torch.save file of the state dict that was
 * saved: planner_data's paths ('/'-joined, list items by index), or the DCP
 * key itself when the metadata has none.
 *
 * Without `.metadata`, `dir` may also be (docs/FORMAT.md 12):
 * - a directory keepsake.distributed.KeepsakeWriter wrote (an index with a
 *   keepsake member, rank 0 recording `keepsake.dcp`): checked against its index
 *   (and, with verify_crc, every tensor against its checksum), loaded as one
 *   rank, and named and flattened by the same rules from its planner data, so
 *   the same state saved by either writer gives the same dict; a sharded
 *   directory of the C library is KS_E_UNSUPPORTED;
 * - a Hugging Face safetensors layout: the files a model.safetensors.index.json
 *   names in its weight_map, or every *.safetensors file; chunks of one tensor
 *   placed by their files' DCP_SHARDING_INFO offsets must cover it exactly once;
 *   entries are named by their keys (or the names KS_META_HF_NAMES records).
 * A directory holding none of these is KS_E_UNSUPPORTED.
 *
 * Bounds: `.metadata` at most 1 GiB and opts' pickle limits per pickle; items
 * must lie inside their files and not overlap; the tensors together at most
 * opts->max_output_bytes (default 4 * (bytes of `.metadata` and the `.distcp`
 * files) + 64 MiB).
 *
 * @param dir       the checkpoint directory; only read.
 * @param opts      NULL for defaults; alloc, verify_crc (every zip entry read), limits and io as for ks_torch_load.
 * @param out       receives the dict; untouched on failure. Tensors are views into memory the dict owns.
 * @param structure optional; receives the structure document (as ks_torch_load's). Free with
 *                  ks_torch_free.
 * @param info      optional; receives {"format": "torch.distributed.checkpoint" | "keepsake.distributed" |
 *                  "safetensors", "version": <Metadata.version or null>, "tensors": n, "chunks": n, "objects": n,
 *                  "files": n, "checksummed": n, "skipped": {"<DCP key>": "<why>"}}. Free with ks_torch_free.
 * @param err       optional; names the file (`.metadata` or the `.distcp`), the DCP key and the byte offset.
 * @return KS_OK; KS_E_IO (a file cannot be opened or read), KS_E_UNSAFE (a global outside the list above),
 *         KS_E_FORMAT (malformed metadata, a missing or overlapping item, chunks that do not cover a tensor
 *         exactly once, an item that is not a torch.save archive, a file shorter than its items),
 *         KS_E_UNSUPPORTED (SerializationFormat.SAFETENSORS, transform extensions such as compression, legacy
 *         or big-endian archives), KS_E_DTYPE, KS_E_SHAPE (a chunk's tensor that is not the chunk's size),
 *         KS_E_LIMIT, KS_E_EXISTS (two entries of one name), KS_E_CHECKSUM (verify_crc), KS_E_NOMEM.
 * Thread safety: independent calls may run concurrently.
 */
KS_NODISCARD ks_status ks_torch_dcp_load(const char *dir, const ks_torch_read_opts *opts, ks_statedict **out,
                                         char **structure, char **info, ks_error *err);

KS_END_DECLS
#endif
