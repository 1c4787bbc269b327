/**
 * @file format.h
 * Keepsake files: safetensors-compatible files that hold a whole state dict.
 *
 * A keepsake file is a valid safetensors file (8-byte little-endian header
 * length N, N bytes of UTF-8 JSON, then the tensor data). Keepsake keeps its own
 * information (format version, writer, scalars, per-tensor XXH3-64 checksums,
 * component schemas) as string pairs in the safetensors `__metadata__`.
 * docs/FORMAT.md is the normative specification.
 *
 * Reading accepts exactly the files the reference safetensors reader accepts,
 * except where keepsake is stricter on purpose (duplicate keys, NUL or empty
 * names, name length, rank, dtypes outside format version 1, keepsake metadata
 * checks; docs/FORMAT.md section 5.1 lists each), so any file - keepsake or
 * plain safetensors - can be opened safely from untrusted bytes. Writing is atomic and durable (temp file, fsync,
 * rename, fsync dir).
 */
#ifndef KEEPSAKE_FORMAT_H
#define KEEPSAKE_FORMAT_H

#include "keepsake/export.h"

#include <stddef.h>
#include <stdint.h>

#include "keepsake/alloc.h"
#include "keepsake/io.h" /* ks_io, ks_io_posix: the writer's injectable I/O */
#include "keepsake/statedict.h"
#include "keepsake/status.h"
#include "keepsake/tensor.h"

KS_BEGIN_DECLS

/** The keepsake format version this library writes, and the newest it reads. */
#define KS_FORMAT_VERSION 1
/** Value of the "keepsake.format" metadata key in every keepsake file. */
#define KS_FORMAT_NAME "keepsake"
/** Largest header accepted, in bytes (the reference reader's limit). */
#define KS_MAX_HEADER 100000000u
/** Most tensors accepted in one file. */
#define KS_MAX_TENSORS 10000000u
/** The data section starts at a multiple of this many bytes in files keepsake writes. */
#define KS_DATA_ALIGN 64u

/* Metadata keys owned by the writer (see docs/FORMAT.md). Callers may not set them. */
#define KS_META_FORMAT "keepsake.format"                 /**< "keepsake" */
#define KS_META_FORMAT_VERSION "keepsake.format_version" /**< decimal, "1" */
#define KS_META_WRITER "keepsake.writer"                 /**< "keepsake <library version>" */
#define KS_META_SCALARS "keepsake.scalars"               /**< JSON object: name -> scalar */
#define KS_META_CHECKSUMS "keepsake.checksums"           /**< JSON object: name -> 16 hex digits */

/* ------------------------------------------------------------------------ */
/* Metadata: an ordered string -> string map (the safetensors __metadata__). */

typedef struct ks_meta ks_meta;

/**
 * Creates an empty metadata map.
 * @param a   allocator, NULL for malloc; copied, its ctx must outlive the map.
 * @param out receives the map; untouched on failure.
 * @return KS_OK, KS_E_INVALID (out NULL) or KS_E_NOMEM. Free with ks_meta_free.
 * Thread safety: concurrent reads are safe; mutation needs exclusive access.
 */
KS_NODISCARD ks_status ks_meta_create(const ks_allocator *a, ks_meta **out, ks_error *err);

/** Frees a map and its strings. Accepts NULL. */
void ks_meta_free(ks_meta *m);

/**
 * Inserts a pair, or replaces the value of an existing key (keeping its position).
 * @param key   NUL-terminated UTF-8, copied.
 * @param value NUL-terminated UTF-8, copied.
 * @return KS_OK, KS_E_INVALID (NULL argument or invalid UTF-8) or KS_E_NOMEM;
 *         on failure the map is unchanged.
 */
KS_NODISCARD ks_status ks_meta_set(ks_meta *m, const char *key, const char *value, ks_error *err);

/** The value of `key`, or NULL when absent. Valid until the key is replaced or the map freed. */
const char *ks_meta_get(const ks_meta *m, const char *key);

/** Number of pairs (0 for NULL). */
size_t ks_meta_count(const ks_meta *m);

/**
 * The pair at insertion position i.
 * @param key, value receive borrowed pointers (either may be NULL).
 * @return KS_OK or KS_E_NOTFOUND when i >= count.
 */
KS_NODISCARD ks_status ks_meta_at(const ks_meta *m, size_t i, const char **key, const char **value);

/* ------------------------------------------------------------------------ */
/* Writing. */

typedef struct ks_image ks_image;

typedef struct ks_save_opts {
  size_t size;               /**< 0 or sizeof(this struct): see "Growing structs" in export.h */
  const ks_allocator *alloc; /**< scratch memory; NULL = malloc */
  const ks_io *io;           /**< NULL = ks_io_posix() */
  /* --- appended in 0.3 --- */
  /**
   * Write through this file image (ks_image_create): the state is copied into the image (each
   * tensor not already at its place there), hashed where it lies, and the file written from the
   * image, its aligned bulk with direct I/O (O_DIRECT) where the table is local and the file
   * system allows it. The same file, durability and errors as without it, plus the image's
   * (KS_E_LIMIT: a state that no longer fits a caller's memory). NULL: none. ks_save and
   * ks_state_save honour it; a background saver takes its image as an argument.
   */
  ks_image *image;
} ks_save_opts;

/**
 * Atomically and durably writes every entry of sd (tensors and scalars, in
 * insertion order) to `path`, with keepsake's metadata plus the `extra` pairs.
 *
 * The data is streamed, each byte of sd read once (docs/FORMAT.md section 6):
 * the header, then the tensor bytes, hashed as they are written (on a second
 * thread where there is a second CPU; a large durable save through a local
 * table writes with O_DIRECT, around the page cache), then the checksums
 * patched into the header, all to
 * `<dir>/.<name>.tmp-<6 random characters>`, which is fsynced, renamed over `path`, and the
 * directory fsynced. On any failure before the rename the temp file is removed
 * and the previous file at `path` is untouched. With the default (POSIX) io the
 * writer holds an flock on its temp file, and first removes temp files of this
 * pattern in the directory that nobody holds and that are unmodified for 60 s
 * (left by a killed writer). A `path` that exists and is a device, FIFO, socket
 * or directory is refused (KS_E_INVALID); a symlink is replaced by the new file
 * (its target is untouched) and so is a read-only file; the CLI refuses both. If only the final directory
 * fsync fails, `path` already holds the new file but its durability is unknown;
 * KS_E_NOT_DURABLE is returned (KS_E_IO always means `path` is unchanged).
 * With opts->image, the file is written from that image (see ks_save_opts.image).
 *
 * @param path  destination; its directory must exist.
 * @param sd    entries to save; names must not be "__metadata__".
 * @param extra optional caller pairs (e.g. "keepsake.metrics" -> JSON). Keys
 *              starting "keepsake." are reserved for keepsake components; the
 *              KS_META_* writer keys are refused with KS_E_INVALID.
 * @param opts  NULL for defaults.
 * @param err   optional details (file, key, expected vs found).
 * @return KS_OK, KS_E_INVALID, KS_E_NOMEM, KS_E_LIMIT, KS_E_IO or KS_E_NOT_DURABLE
 *         (and with an image: KS_E_STATE, a background save still writing from it in busy mode).
 * Thread safety: sd must not be mutated during the call; distinct paths may be
 * saved concurrently. The call may start one thread of its own (hashing or
 * copying, ended before it returns); every call of io and of the allocator is
 * made on the calling thread.
 */
KS_NODISCARD ks_status ks_save(const char *path, const ks_statedict *sd, const ks_meta *extra,
                  const ks_save_opts *opts, ks_error *err);

/* ------------------------------------------------------------------------ */
/* File images: a state laid out as the file holds it, for staged saves.    */

/** Alignment of an image's memory: its address and its size. */
#define KS_IMAGE_ALIGN 4096u

/**
 * Options of an image. Zero-initialise; new fields are only ever appended.
 * Memory: the caller's (buf), the image's own (buf NULL), or none (layout_only).
 */
typedef struct ks_image_opts {
  size_t size;               /**< 0 or sizeof(this struct): see "Growing structs" in export.h */
  const ks_allocator *alloc; /**< NULL = malloc; must be thread-safe when a background saver writes the image */
  /**
   * The caller's memory for the image (page-locked host memory that device tensors are copied
   * into, say): KS_IMAGE_ALIGN-aligned, buf_size bytes, at least ks_image_info.need of them
   * (else KS_E_LIMIT: make a layout_only image first to learn the size). It must stay valid
   * until the image is freed, and the caller writes into it only as ks_image_get allows.
   * NULL: the image allocates its own, and touches every page of it now, so that the first
   * save does not fault a fresh buffer in while its caller waits.
   */
  void *buf;
  size_t buf_size;
  int layout_only; /**< nonzero (buf NULL): no memory at all, only the layout (ks_image_get's need); saves refuse it */
} ks_image_opts;

/**
 * Creates the file image of a state dict and its metadata: the file ks_save writes for them,
 * laid out once in memory: the header's room (with 1 MiB of headroom for a header that grows,
 * aligned), then each tensor's bytes packed at its offset in the file. A staged save
 * (ks_save_opts.image, ks_async_saver_start_image, ks_ckpt_manager_save_image) copies a state
 * into it, hashes each tensor where it lies and writes the file from it, its aligned bulk with
 * O_DIRECT where the file system allows (the caller's bytes are never copied into the page cache).
 *
 * The image knows the names, kinds, dtypes and shapes of sd (tensor data is not read here):
 * a later state of the same entries is saved through it as it is; one whose entries differ
 * (a name, a dtype or a shape changed, an entry added or removed), or whose header outgrows
 * the room, is laid out anew in the same image (the image's own memory grows; the caller's
 * must hold it, else KS_E_LIMIT with ks_image_info.need, and the image is unchanged).
 * @return KS_OK, KS_E_INVALID (a state ks_save refuses, buf unaligned), KS_E_LIMIT (buf_size
 *         below what the image needs; a header larger than readers accept), KS_E_NOMEM.
 * Ownership: free with ks_image_free. Thread safety: one thread at a time (a background save
 * writing from the image counts as one: see ks_image_get).
 */
KS_NODISCARD ks_status ks_image_create(const ks_statedict *sd, const ks_meta *meta, const ks_image_opts *opts,
                                       ks_image **out, ks_error *err);

/** Frees an image, after a background save still writing from it ends. Accepts NULL. */
void ks_image_free(ks_image *im);

/** What an image is (ks_image_get). An output that grows: set size (KS_OPTS_INIT). */
typedef struct ks_image_info {
  size_t size;
  size_t need;         /**< bytes of memory the layout needs (KS_IMAGE_ALIGN multiple, headroom included) */
  size_t header_len;   /**< bytes of the header: of the last state given (ks_image_get, a save), or the first */
  uint64_t data_len;   /**< bytes of tensor data, packed */
  void *buf;           /**< the image's memory (NULL: layout only) */
  size_t buf_size;
  size_t count;        /**< entries of the layout */
  /** Entry i's offset from buf (count of them, owned by the image, valid until its next call):
   *  where a tensor's bytes go for the state last given; UINT64_MAX for a scalar. */
  const uint64_t *offsets;
} ks_image_info;

/**
 * Describes the image, and lets the caller write into its memory: first waits for a background
 * save still writing from it (or, when that saver is in KS_ASYNC_FAIL_BUSY mode, returns
 * KS_E_STATE at once; that save's own result stays its saver's to return). With sd (and meta,
 * its metadata), lays the image out for that state first (as a save would: entries that
 * differ give a new layout; a header of another length moves the data), so that offsets are
 * where sd's tensors go for its next save. A caller then copies tensors (from a device, say)
 * to buf + offsets[i] and points sd's entries there: the save copies them no further.
 * @param sd optional; meta optional.
 * @return KS_OK, KS_E_STATE (busy), KS_E_LIMIT (sd does not fit the caller's memory: info is
 *         filled, its need the bytes wanted), KS_E_INVALID, KS_E_NOMEM.
 */
KS_NODISCARD ks_status ks_image_get(ks_image *im, const ks_statedict *sd, const ks_meta *meta, ks_image_info *info,
                                    ks_error *err);

/* ------------------------------------------------------------------------ */
/* Reading. */

/*
 * What the mapped mode promises: the views show the file as it is on disk, page by
 * page, for as long as the reader lives. It does not promise that the pages stay
 * there: if another process truncates the file while it is mapped, touching a view
 * (or verifying, which reads every byte) past the new end raises SIGBUS in the
 * reading process, and bytes rewritten in place change under the views. Map only
 * files that nobody else modifies while they are read (keepsake's own writers never
 * modify a file in place: they write a new file and rename it over the old one, which
 * leaves existing mappings intact). For files you do not control use KS_READ_COPY:
 * a file that shrinks while it is read then gives KS_E_IO or KS_E_FORMAT, never a
 * signal. The keepsake CLI reads every input in copy mode.
 */
/*
 * KS_READ_LAZY is for tables whose reads are expensive (remote objects, where
 * each read_fn is a ranged GET and map_fn is NULL). Open reads only the 8-byte
 * length and the header: one read of the first 64 KiB (which holds most
 * headers, and a small file entirely) and, for a larger header, one more. The
 * structure is validated exactly as in the other modes (same errors). The
 * table's handle stays open until ks_reader_free. Tensor bytes are then read on
 * demand through read_fn and verified against "keepsake.checksums" as they
 * arrive: by ks_reader_fetch into the caller's memory, or by ks_reader_tensor(_at)
 * into reader memory kept until ks_reader_free (fetched once, also when
 * several threads ask at once). ks_load over a lazy reader reads the whole data
 * section with a few threads issuing large ranged reads concurrently, each
 * tensor verified as its last range arrives: the table's read_fn must then be
 * safe to call from several threads at once on one handle (ks_io_posix()'s is).
 * ks_reader_verify (and verify_checksums at open) on a lazy reader reads the file
 * forward in windows of at least 8 MiB, keeping none of it; ks_load with
 * verify_checksums reads each byte once. Over a buffer (ks_reader_open_buffer)
 * lazy is the same as KS_READ_MMAP.
 */
typedef enum ks_read_mode {
  KS_READ_MMAP =
      0, /**< map the file; tensor views point into the mapping (open cost independent of data size); see above */
  KS_READ_COPY = 1, /**< read everything into memory; the file may change or vanish afterwards */
  KS_READ_LAZY = 2  /**< read the header only; tensors on demand through the table, verified on arrival (above) */
} ks_read_mode;

typedef struct ks_read_opts {
  size_t size;               /**< 0 or sizeof(this struct): see "Growing structs" in export.h */
  const ks_allocator *alloc; /**< NULL = malloc */
  ks_read_mode mode;
  int verify_checksums; /**< nonzero: run ks_reader_verify during open and fail at the first mismatch */
  const ks_io *io;       /**< file operations of ks_reader_open (open, map or read, close); NULL = ks_io_posix() */
} ks_read_opts;

typedef struct ks_reader ks_reader;

/** Where a tensor lives in the file; offsets are absolute byte positions. */
typedef struct ks_tensor_info {
  const char *name;
  uint64_t begin; /**< absolute offset of the first byte */
  uint64_t end;   /**< absolute offset one past the last byte */
} ks_tensor_info;

/**
 * Opens a keepsake or safetensors file and validates its structure.
 *
 * @param path  file to open; read-only, never modified.
 * @param opts  NULL for defaults (mmap, no checksum verification).
 * @param out   receives the reader; untouched on failure.
 * @param err   optional; names the file, key and byte offset of the problem.
 * @return KS_OK; KS_E_IO (cannot open/read); KS_E_FORMAT (truncated, header
 *         length past EOF, bad UTF-8/JSON, a number out of range of a double,
 *         \u0000 in a name or metadata, an empty name, offsets that do not tile the data
 *         section, size/shape mismatch, trailing bytes); KS_E_LIMIT (header >
 *         KS_MAX_HEADER, name > KS_MAX_NAME, rank > 8, more than KS_MAX_TENSORS,
 *         shape product overflow, JSON nested deeper than 127); KS_E_DTYPE (unknown dtype); KS_E_EXISTS
 *         (duplicate key); KS_E_VERSION (keepsake format newer than
 *         KS_FORMAT_VERSION; the message names the version); KS_E_CHECKSUM
 *         (verify_checksums and a mismatch); KS_E_NOMEM.
 * Ownership: free *out with ks_reader_free; tensor views live as long as it.
 * Thread safety: a reader is never visibly mutated after open; any number of
 * threads may use it at once (in KS_READ_LAZY mode a tensor's first fetch into
 * reader memory is published atomically; see above).
 */
KS_NODISCARD ks_status ks_reader_open(const char *path, const ks_read_opts *opts, ks_reader **out, ks_error *err);

/**
 * Same as ks_reader_open over bytes in memory. In KS_READ_MMAP mode the views
 * point into `buf`, which must outlive the reader; KS_READ_COPY copies it.
 * Error messages name the file "<buffer>".
 */
KS_NODISCARD ks_status ks_reader_open_buffer(const void *buf, size_t len, const ks_read_opts *opts, ks_reader **out,
                                ks_error *err);

/** Frees a reader (unmapping the file). Accepts NULL. */
void ks_reader_free(ks_reader *r);

/** Number of tensors (the __metadata__ entry is not a tensor). */
size_t ks_reader_count(const ks_reader *r);

/**
 * Tensor i in header order (for keepsake files, the order they were saved in).
 * @param name receives a pointer valid as long as the reader (may be NULL).
 * @param view receives a descriptor with ownership KS_MAPPED pointing into the
 *             reader's memory. Data is not necessarily aligned to the dtype:
 *             read elements with memcpy or ks_dtype_get_*. In KS_READ_LAZY mode
 *             the bytes are read and verified on the first call for tensor i
 *             (view NULL reads nothing); use ks_reader_tensor for the error details.
 * @return KS_OK or KS_E_NOTFOUND when i >= count; in lazy mode also KS_E_IO,
 *         KS_E_CHECKSUM, KS_E_FORMAT (checksum table) or KS_E_NOMEM.
 */
KS_NODISCARD ks_status ks_reader_tensor_at(const ks_reader *r, size_t i, const char **name, ks_tensor *view);

/**
 * Looks a tensor up by name in O(1) (lazy mode: fetched as ks_reader_tensor_at does).
 * @return KS_OK or KS_E_NOTFOUND (err names the key); lazy mode as ks_reader_tensor_at.
 */
KS_NODISCARD ks_status ks_reader_tensor(const ks_reader *r, const char *name, ks_tensor *view, ks_error *err);

/**
 * Copies tensor i's bytes into buf and verifies them against the file's stored
 * checksum (keepsake files; a plain safetensors file has none). In KS_READ_LAZY
 * mode only the tensor's byte range is read through the table, straight into
 * buf (nothing is kept by the reader), unless the reader already holds it.
 * @param cap  bytes available at buf; at least the tensor's size (ks_tensor_info).
 * @return KS_OK; KS_E_NOTFOUND (i >= count); KS_E_INVALID (buf too small);
 *         KS_E_IO (read failed or file shrank); KS_E_CHECKSUM naming the tensor,
 *         its absolute offset and both hashes (buf then holds the bad bytes);
 *         KS_E_FORMAT (checksum table malformed or lacking the tensor); KS_E_NOMEM.
 * Thread safety: any number of threads may fetch from one reader at once.
 */
KS_NODISCARD ks_status ks_reader_fetch(const ks_reader *r, size_t i, void *buf, size_t cap, ks_error *err);

/** Index of tensor `name`, or -1. */
long ks_reader_find(const ks_reader *r, const char *name);

/** File position of tensor i. @return KS_OK or KS_E_NOTFOUND. */
KS_NODISCARD ks_status ks_reader_tensor_info(const ks_reader *r, size_t i, ks_tensor_info *info);

/**
 * Tensor i's dtype, rank, shape and size, without its bytes: nothing is read, in
 * KS_READ_LAZY mode either (view->data is NULL). For a lazy reader's callers
 * that fetch the bytes themselves (ks_reader_fetch into their own memory).
 * @return KS_OK or KS_E_NOTFOUND (i >= count, or view NULL).
 */
KS_NODISCARD ks_status ks_reader_tensor_desc(const ks_reader *r, size_t i, ks_tensor *view);

/** The raw __metadata__ pairs (possibly empty, never NULL for a valid reader). */
const ks_meta *ks_reader_meta(const ks_reader *r);

/** Nonzero when the file carries keepsake's own metadata ("keepsake.format" = "keepsake"). */
int ks_reader_is_keepsake(const ks_reader *r);

/** The keepsake format version of the file, or 0 for a plain safetensors file. */
int ks_reader_format_version(const ks_reader *r);

/** The path the reader was opened from ("<buffer>" for ks_reader_open_buffer). */
const char *ks_reader_path(const ks_reader *r);

/** Total file size and the absolute offset where the data section starts (8 + N). */
uint64_t ks_reader_file_size(const ks_reader *r);
uint64_t ks_reader_data_offset(const ks_reader *r);

/**
 * Called by ks_reader_verify for each problem found. Return nonzero to stop at
 * this problem, 0 to go on looking for more.
 */
typedef int (*ks_verify_fn)(void *ctx, const ks_error *problem);

/**
 * Full verification: every tensor's checksum, the checksum table itself
 * (malformed, missing or extra entries: no entry for a tensor the file lacks) and
 * the scalar table. Structural rules were already enforced at open.
 * @param on_problem optional; called for each problem found (NULL stops at the first).
 * @param err receives the first problem.
 * @return KS_OK when the file is good (a plain safetensors file carries no
 *         checksums), else the status of the first problem (KS_E_CHECKSUM with key,
 *         byte offset, expected and found hashes; KS_E_FORMAT) or KS_E_NOMEM.
 */
KS_NODISCARD ks_status ks_reader_verify(const ks_reader *r, ks_verify_fn on_problem, void *ctx, ks_error *err);

/**
 * Decodes the keepsake scalars of the file into dst (insert or replace), in
 * saved order. A plain safetensors file has none (KS_OK, nothing added).
 * @return KS_OK, KS_E_FORMAT (malformed "keepsake.scalars"), KS_E_NOMEM,
 *         KS_E_INVALID/KS_E_LIMIT (name rejected by the dict).
 */
KS_NODISCARD ks_status ks_reader_scalars(const ks_reader *r, ks_statedict *dst, ks_error *err);

/**
 * Convenience: the whole file as a state dict (tensors in file order, then the
 * scalars) and a copy of the metadata. Tensors are KS_MAPPED views into the
 * reader's memory (the mapping in KS_READ_MMAP mode, one heap copy in
 * KS_READ_COPY mode, one heap copy of the data section read in parallel ranges
 * and verified on arrival in KS_READ_LAZY mode, which then also returns
 * KS_E_CHECKSUM); the dict keeps the reader alive until ks_statedict_free.
 * @param sd   receives the dict; free with ks_statedict_free.
 * @param meta optional; receives a copy of __metadata__; free with ks_meta_free.
 * @return any ks_reader_open status, or the status of building the dict.
 *         On failure nothing is returned and nothing leaks.
 */
KS_NODISCARD ks_status ks_load(const char *path, const ks_read_opts *opts, ks_statedict **sd, ks_meta **meta,
                               ks_error *err);

/** ks_load over bytes in memory (see ks_reader_open_buffer for lifetime rules). */
KS_NODISCARD ks_status ks_load_buffer(const void *buf, size_t len, const ks_read_opts *opts, ks_statedict **sd,
                         ks_meta **meta, ks_error *err);

/** XXH3-64 of `n` bytes as stored in "keepsake.checksums" (seed 0). Pure; thread safe. */
uint64_t ks_checksum(const void *data, size_t n);

KS_END_DECLS
#endif
