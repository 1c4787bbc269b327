/**
 * @file shard.h
 * Sharded checkpoints without MPI: the directory layout, the index, chunk
 * bookkeeping, loading one rank's part at any world size, and resharding.
 *
 * A sharded checkpoint is a directory (by convention `ep{epoch}-ba{batch}/`)
 * holding one keepsake file per rank, `rank-XXXXX-of-YYYYY.keepsake`, and the
 * index `model.safetensors.index.json`, written last: the commit marker. The
 * index follows the Hugging Face sharded convention (`metadata.total_size` and
 * a `weight_map` from each whole tensor to the file holding it) and adds a
 * `keepsake` object: the world size, the timestamp, every file's size and
 * whole-file XXH3-64, the per-rank entry globs, and every sharded tensor's
 * dtype, global shape and chunks (rank, offsets, shape). Each rank file also
 * records every tensor's offsets in `__metadata__["DCP_SHARDING_INFO"]` with
 * torch DCP's schema (`{fqn: {"saved_offsets": [...]}}`, plus `global_shape` for
 * chunks), so torch DCP's HuggingFaceStorageReader loads the model tensors.
 * docs/FORMAT.md section 9 is the specification.
 *
 * Entries fall in three classes: sharded tensors (each rank holds a chunk),
 * per-rank entries (RNG, data positions, local metric states: every rank saves
 * its own) and replicated entries (everything else, saved once, in rank 0's file).
 *
 * The MPI collectives built on these functions are in keepsake/dist.h.
 * Thread safety: objects are not shared between threads; distinct objects are independent.
 */
#ifndef KEEPSAKE_SHARD_H
#define KEEPSAKE_SHARD_H

#include "keepsake/export.h"

#include <stddef.h>
#include <stdint.h>

#include "keepsake/alloc.h"
#include "keepsake/format.h"
#include "keepsake/io.h"
#include "keepsake/statedict.h"
#include "keepsake/status.h"
#include "keepsake/tensor.h"

KS_BEGIN_DECLS

/** Name of the index file inside a sharded checkpoint directory. */
#define KS_SHARD_INDEX_NAME "model.safetensors.index.json"
/**
 * Version of the keepsake part of the index that ks_shard_write_index writes. Version 2 records
 * each rank file's header hash (`header_xxh3`), version 1 its whole-file hash (`xxh3`); readers
 * accept both (docs/FORMAT.md section 9).
 */
#define KS_SHARD_INDEX_VERSION 2
/** Largest world size accepted (file names have five digits). */
#define KS_SHARD_MAX_WORLD 99999

/** One chunk of a tensor: where it sits in the global tensor. */
typedef struct ks_shard_chunk {
  const char *name;                   /**< tensor name */
  int rank;                           /**< number of dimensions */
  int64_t global_shape[KS_MAX_RANK];  /**< shape of the whole tensor */
  int64_t offsets[KS_MAX_RANK];       /**< first element of the chunk in each dimension */
  int64_t shape[KS_MAX_RANK];         /**< shape of the chunk */
} ks_shard_chunk;

/** A set of chunks keyed by tensor name: what a rank saves, or what it wants loaded. */
typedef struct ks_shard_map ks_shard_map;

/** Creates an empty map. @return KS_OK or KS_E_NOMEM. Free with ks_shard_map_free. */
KS_NODISCARD ks_status ks_shard_map_create(const ks_allocator *alloc, ks_shard_map **out, ks_error *err);
/** Frees a map. Accepts NULL. */
void ks_shard_map_free(ks_shard_map *m);
/**
 * Adds (or replaces) the chunk of tensor `name`.
 * @return KS_OK, KS_E_INVALID (rank out of 0..8, negative sizes, a chunk outside the
 *         global shape, bad name), KS_E_NOMEM. The map is unchanged on error.
 */
KS_NODISCARD ks_status ks_shard_map_add(ks_shard_map *m, const char *name, int rank, const int64_t *global_shape,
                           const int64_t *offsets, const int64_t *shape, ks_error *err);
/**
 * The even split along dimension 0 that torch.chunk makes: part `index` of
 * `count` gets ceil(d0 / count) rows (the last parts fewer, possibly none).
 * @param offsets, shape receive `rank` values each.
 */
void ks_shard_split_dim0(int rank, const int64_t *global_shape, int index, int count, int64_t *offsets,
                         int64_t *shape);

/** The default per-rank globs: rng, state/dataset_state, state/train_metrics, state/eval_metrics. */
const char *const *ks_shard_default_per_rank(size_t *n);

/** Writes "rank-XXXXX-of-YYYYY.keepsake" into buf. @return KS_OK or KS_E_INVALID. */
KS_NODISCARD ks_status ks_shard_file_name(int rank, int world_size, char *buf, size_t cap);

/* ------------------------------------------------------------------------ */
/* Writing (each rank its file, then one writer the index).                 */
/* ------------------------------------------------------------------------ */

/** What the index records about one rank's file. */
typedef struct ks_shard_file_info {
  uint64_t size;     /**< bytes */
  uint64_t checksum; /**< XXH3-64 of the file's first 8 + N bytes (its length and header, which holds every
                          tensor's checksum); in a version 1 index read back, of the whole file */
} ks_shard_file_info;

/**
 * Writes rank `rank`'s file of a `world_size`-rank checkpoint into `dir`
 * (which must exist): the chunks named in `shards`, the per-rank entries (those
 * matching `per_rank`, NULL = the defaults) and, for rank 0 only, every other
 * (replicated) entry, in one pass over the data (each tensor hashed just before it is written).
 * The header hash for the index is taken from the header read back, not from the data.
 * @param meta optional caller metadata (e.g. keepsake.metrics) copied into the file.
 * @param info receives the file's size and checksum (also with KS_E_NOT_DURABLE).
 * @return KS_OK, KS_E_INVALID (a chunk whose tensor is missing or has another shape), KS_E_NOMEM,
 *         KS_E_IO (the file is unchanged), KS_E_NOT_DURABLE (the file is in place and info filled,
 *         but the directory fsync failed: it may not survive a crash), or any ks_save error.
 */
KS_NODISCARD ks_status ks_shard_write_rank(const char *dir, int rank, int world_size, const ks_statedict *sd,
                              const ks_meta *meta, const ks_shard_map *shards, const char *const *per_rank,
                              size_t n_per_rank, const ks_save_opts *opts, ks_shard_file_info *info,
                              ks_error *err);

/**
 * Writes the index of a checkpoint whose `world_size` rank files are in `dir`,
 * atomically and durably. Reads each file's header (not its data) to list its
 * tensors and chunks, and checks that the files' timestamps and world sizes agree.
 * @param infos world_size entries, from ks_shard_write_rank.
 * @return KS_OK, KS_E_MISMATCH (timestamps differ; names both files), KS_E_FORMAT, KS_E_NOMEM,
 *         KS_E_IO (no index was written: the checkpoint is not committed) or KS_E_NOT_DURABLE (the
 *         index is in place, so the checkpoint is committed, but the directory fsync failed).
 */
KS_NODISCARD ks_status ks_shard_write_index(const char *dir, int world_size, const ks_shard_file_info *infos,
                               const ks_save_opts *opts, ks_error *err);

/* ------------------------------------------------------------------------ */
/* Reading.                                                                  */
/* ------------------------------------------------------------------------ */

typedef struct ks_shard_index ks_shard_index;

/**
 * Reads and validates the index of `dir`, the `sharded` section whole before anything is
 * allocated from it: dims and offsets non-negative integers, every volume and byte count
 * overflow-checked, each tensor's chunks inside its global shape and tiling it exactly (no gap,
 * no overlap, at most one chunk per rank file), and the bytes of the chunks of each rank file
 * at most its recorded size. ks_shard_check compares the index with the files themselves.
 * @param io every read goes through it (NULL = ks_io_posix()).
 * @return KS_OK, KS_E_NOTFOUND (no index: not a complete checkpoint), KS_E_FORMAT (malformed,
 *         the key named), KS_E_VERSION, KS_E_LIMIT, KS_E_IO, KS_E_NOMEM.
 */
KS_NODISCARD ks_status ks_shard_index_read(const char *dir, const ks_allocator *alloc, const ks_io *io,
                                           ks_shard_index **out, ks_error *err);
/** Frees an index. Accepts NULL. */
void ks_shard_index_free(ks_shard_index *idx);
/**
 * What an index records about its checkpoint (ks_shard_index_get). An output that grows as the
 * option structs do: set size to sizeof(ks_shard_index_info) (KS_OPTS_INIT) and the library
 * fills only the members your header knows of (size 0: the library's own layout).
 */
typedef struct ks_shard_index_info {
  size_t size;
  int version;    /**< 1 or 2: what ks_shard_file_info.checksum hashes (the whole file in 1, the header in 2) */
  int world_size; /**< ranks the checkpoint was written with */
  int64_t epoch;  /**< the saved timestamp's epoch (-1 when the state had no timestamp) */
  int64_t batch;  /**< and its batch (-1 likewise) */
  size_t n_sharded;            /**< sharded tensors recorded (ks_shard_index_sharded_at) */
  const char *const *per_rank; /**< the per-rank globs the checkpoint was saved with (owned by the index) */
  size_t n_per_rank;
} ks_shard_index_info;

/** Fills *out (its size set) from idx; idx NULL gives zeros, with epoch and batch -1. */
void ks_shard_index_get(const ks_shard_index *idx, ks_shard_index_info *out);

/** The file of saved rank `rank` (NULL when out of range); *info (may be NULL) gets its recorded size and hash. */
const char *ks_shard_index_file(const ks_shard_index *idx, int rank, ks_shard_file_info *info);
/**
 * Sharded tensor i: name, dtype and global shape in *whole (offsets all zero), and its number
 * of saved chunks. @return KS_OK or KS_E_NOTFOUND.
 */
KS_NODISCARD ks_status ks_shard_index_sharded_at(const ks_shard_index *idx, size_t i, ks_shard_chunk *whole,
                                                 ks_dtype *dtype, size_t *n_chunks);
/** Chunk j of sharded tensor i and the saved rank whose file holds it. @return KS_OK or KS_E_NOTFOUND. */
KS_NODISCARD ks_status ks_shard_index_chunk(const ks_shard_index *idx, size_t i, size_t j, ks_shard_chunk *chunk,
                                            int *file);

/**
 * Checks rank `rank`'s file against the index: present, of the recorded size, and every byte
 * as recorded (reads the whole file once). Version 2 index: the length and header hash to the
 * recorded header_xxh3, the file's structure is valid (its tensors tile the data section) and
 * every tensor matches its checksum in that header. Version 1 index: the whole file hashes to
 * the recorded xxh3. The file is opened, mapped or read through `io` (NULL = ks_io_posix()).
 * @return KS_OK, KS_E_NOTFOUND (missing), KS_E_FORMAT (truncated or grown),
 *         KS_E_CHECKSUM (corrupt: the header, a tensor, or a structure that no longer parses),
 *         KS_E_IO, KS_E_NOMEM; the message names the rank and err->file the file.
 */
KS_NODISCARD ks_status ks_shard_verify_file(const char *dir, const ks_shard_index *idx, int rank, const ks_io *io,
                                            ks_error *err);

/** ks_shard_check: every rank file exists and has the index's size (stat through the table). */
#define KS_SHARD_CHECK_SIZES 1u
/**
 * ks_shard_check: every rank file's header agrees with the index: in a version 2 index its
 * length and header hash to the recorded header_xxh3 (read, never mapped: a header edited in
 * place or a file swapped for another of the same size is KS_E_CHECKSUM before it is parsed),
 * its keepsake.shard record (rank, world size, timestamp), every chunk the index lists is there
 * with the index's dtype, shape and DCP offsets, and every chunk the file holds is listed.
 * Implies KS_SHARD_CHECK_SIZES: a header is read only from a file of the recorded size.
 */
#define KS_SHARD_CHECK_HEADERS 2u

/**
 * Checks the index of `dir` against its rank files before anything is allocated from it.
 * ks_shard_index_read already refused an index whose `sharded` section does not tile each
 * global shape exactly (overflow-checked volumes that add up to the global volume, no two
 * chunks overlapping, at most one chunk per rank file) or whose chunks hold more bytes than
 * the recorded size of their file; this adds what needs the files: with KS_SHARD_CHECK_SIZES
 * each file's real size (stat_fn of `io`, NULL = ks_io_posix()) must be the recorded one, so
 * every sharded tensor's bytes are bounded by the files' real sizes; with
 * KS_SHARD_CHECK_HEADERS each file's header (read; its data is not) must hash to the index's
 * header_xxh3 and agree with the index. ks_shard_load_rank (and so ks_shard_reshard, ks_dist_load
 * and `keepsake diff`) runs the size check on the files it reads before it allocates; `keepsake
 * verify DIR`, `keepsake diff`, ks_shard_reshard and the Python KeepsakeReader run both.
 * @param what a set of KS_SHARD_CHECK_* bits.
 * @param on_problem optional; called for each problem (file and key set), nonzero stops;
 *        NULL stops at the first problem.
 * @return KS_OK, or the status of the first problem: KS_E_NOTFOUND (a missing file or tensor),
 *         KS_E_FORMAT (another size, a malformed record), KS_E_CHECKSUM (a header that does not
 *         hash to header_xxh3), KS_E_MISMATCH (dtype, shape, offsets, timestamp or rank differ;
 *         a chunk the index does not list), KS_E_IO, KS_E_NOMEM;
 *         err receives the first problem.
 */
KS_NODISCARD ks_status ks_shard_check(const char *dir, const ks_shard_index *idx, const ks_io *io, unsigned what,
                                      ks_verify_fn on_problem, void *ctx, ks_error *err);

/** Options of a load. All-zero (or NULL) gives the defaults. */
typedef struct ks_shard_load_opts {
  const ks_allocator *alloc; /**< NULL = malloc */
  int no_verify;             /**< skip ks_shard_verify_file (ks_dist_load verifies in parallel itself); the
                                  size check of the files the load reads (ks_shard_check) still runs */
  const ks_io *io;           /**< every read (index, verification, headers, chunks) goes through it; NULL = POSIX */
} ks_shard_load_opts;

/**
 * Builds rank `rank`'s state dict when a checkpoint written by N ranks is
 * loaded on `world_size` = M ranks, ready for ks_state_load_state_dict:
 * - replicated entries, from rank 0's file;
 * - sharded tensors: the chunk `want` names for the tensor (same global shape
 *   required), or the whole tensor when `want` (may be NULL) has none; copied
 *   from the overlapping saved chunks, reading only the bytes needed (mapped);
 * - per-rank entries: at M = N, exactly this rank's saved entries. Otherwise
 *   saved rank s goes to rank floor(s*M/N) (contiguous blocks, so cat rows stay
 *   in rank order): the metrics of all saved ranks assigned here are merged with
 *   ks_metric_merge (so the global metric is unchanged; a rank assigned none gets
 *   default metrics), and the other per-rank entries (RNG, data position) come
 *   from the first saved rank assigned here, or saved rank (rank mod N) when none.
 * Every file read must carry the index's timestamp (else KS_E_MISMATCH naming it). Before anything
 * is allocated, every file the load reads must have the index's size (KS_E_NOTFOUND, KS_E_FORMAT),
 * which bounds every region allocated; each chunk read must be in its file with the index's dtype,
 * shape and DCP offsets, and rank 0's file may hold no chunk the index leaves out (KS_E_FORMAT).
 * @param meta receives the metadata to load with (keepsake.metrics with merged update counts).
 * @return KS_OK, KS_E_SHAPE (want's global shape differs from the saved one), KS_E_MISMATCH,
 *         ks_shard_verify_file errors, reader errors, KS_E_NOMEM. Nothing is returned on error.
 */
KS_NODISCARD ks_status ks_shard_load_rank(const char *dir, const ks_shard_index *idx, int rank, int world_size,
                             const ks_shard_map *want, const ks_shard_load_opts *opts, ks_statedict **sd,
                             ks_meta **meta, ks_error *err);

/**
 * The rule by which ks_shard_load_rank hands out per-rank entries: which saved ranks rank `rank`
 * of `world_size` (M) takes when the checkpoint was written by `saved_world` (N) ranks. Saved rank
 * s goes to rank floor(s*M/N), so each rank gets a contiguous block [*lo, *hi) of saved ranks (at
 * M = N exactly its own; empty when M > N leaves this rank none). Its metrics are the fold of that
 * block in saved-rank order (ks_metric_fold; default metrics when it is empty), so the ranks'
 * metrics still fold to the saved global metric; its other per-rank entries (RNG, data position)
 * come from saved rank *first: *lo, or saved rank (rank mod N) when the block is empty. Bindings
 * that restore per-rank state themselves (the Python distributed manager) ask this function.
 * @return KS_OK; KS_E_INVALID (a NULL pointer, N or M below 1 or above KS_SHARD_MAX_WORLD, rank
 *         outside [0, M)).
 */
KS_NODISCARD ks_status ks_shard_assigned(int saved_world, int world_size, int rank, int *lo, int *hi, int *first,
                                         ks_error *err);

/**
 * Rewrites the checkpoint in `dir` for `world_size` ranks into `out_dir` (created;
 * must not hold an index yet), once every file of `dir` is verified and checked against the
 * index (ks_shard_verify_file, ks_shard_check with KS_SHARD_CHECK_HEADERS): every rank's part
 * as ks_shard_load_rank builds it, with the sharded tensors split by ks_shard_split_dim0, then
 * the index.
 * @return as ks_shard_load_rank and ks_shard_write_rank; KS_E_EXISTS when out_dir holds a checkpoint.
 */
KS_NODISCARD ks_status ks_shard_reshard(const char *dir, int world_size, const char *out_dir, const ks_save_opts *opts,
                           ks_error *err);

/**
 * Finds the newest complete checkpoint directory in `run_dir`: subdirectories
 * with an index, newest timestamp first, the first whose files all verify.
 * Incomplete ones (no index: a save that died) are ignored; ones that fail to
 * verify are skipped.
 * @param path receives a malloc'd path (through alloc), or NULL when there is none.
 * @param skipped optional; receives how many indexed directories failed to verify.
 * @return KS_OK (also when none), KS_E_IO, KS_E_NOMEM.
 */
KS_NODISCARD ks_status ks_shard_latest(const char *run_dir, const ks_allocator *alloc, char **path, size_t *skipped,
                          ks_error *err);

KS_END_DECLS
#endif
