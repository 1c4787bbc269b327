/**
 * @file io_cache.h
 * A table that wraps another ks_io table: a local cache of the bytes read from
 * it (for remote stores, where every read is a download). It forwards every
 * operation to the inner table, which must outlive it; it is a KS_IO_VERSION
 * table. (A counter of a table's reads, for tests and benchmarks, is in
 * binding.h.)
 */
#ifndef KEEPSAKE_IO_CACHE_H
#define KEEPSAKE_IO_CACHE_H

#include "keepsake/export.h"

#include <stddef.h>
#include <stdint.h>

#include "keepsake/alloc.h"
#include "keepsake/io.h"
#include "keepsake/status.h"

KS_BEGIN_DECLS

/* ------------------------------------------------------------------------ */
/* The cache.                                                                */

/**
 * Creates a table that forwards to `inner` and keeps the bytes it reads in
 * `cache_dir`, so reading the same bytes of the same file twice downloads them
 * once. A file is identified by its path, its size (as inner's open_fn reports
 * it) and its validator (inner's validator_fn, version 6 of io.h: a remote
 * store's ETag, else its Last-Modified), asked of inner at every open, so an
 * object another writer replaced on the server, even by one of the same size,
 * is read anew and never served from the old one's pieces; an inner table
 * without validators identifies a file by path and size only (then a file
 * replaced behind the cache by one of the same size is not noticed). Each
 * range read from inner is kept as one "piece" file under
 * cache_dir/<hash of path>-<size>[-<hash of validator>]/; the first open of a
 * new version deletes the pieces of the path's other versions. A
 * later read is assembled from the pieces that cover it (several adjacent or
 * overlapping ones when it spans them), and only the gaps between them are
 * read from inner, each kept as a new piece; a read that would take more than
 * 64 parts (pieces and gaps) is read whole from inner instead. A handle lists
 * its file's folder once, at its first read (pieces kept later by other
 * handles are not seen by it), and keeps the pieces sorted in memory, so a
 * read costs a binary search and a pass over the pieces near its range, not a
 * directory listing. Pieces
 * are written with the durable replace (temp file, fsync, rename, fsync dir)
 * and carry the path (and validator), the range and the XXH3-64 of their bytes
 * (the hash "keepsake.checksums" uses): a piece whose size, header or hash does not
 * match (torn, truncated, corrupted) is never trusted: it is deleted and its
 * part of the read is read from inner again. On top, readers verify tensor
 * checksums as in any mode.
 *
 * Only file contents are cached: stat_fn, list_fn, readlink_fn (`latest`) and
 * open_fn (the size and validator) always go to inner, and every write goes to
 * inner unchanged. unlink_fn and rename_fn drop the cached pieces of the path
 * removed or replaced. validator_fn, detail_fn and the run directory lock
 * (lock_fn, unlock_fn and KS_IO_CAP_LOCK, as KS_IO_CAP_READ_ONLY) are inner's.
 * The table has no map_fn: readers read (use KS_READ_LAZY).
 * A failure to write a piece (full disk) is not an error: the read still
 * succeeds, and the failure is counted in the statistics.
 *
 * @param inner     the table to forward to (NULL = ks_io_posix()); must outlive the cache.
 * @param cache_dir local directory, created (with its parents) when missing.
 * @param a         allocator, NULL for malloc; copied.
 * @param out       receives the table; free with ks_io_cache_free.
 * @return KS_OK, KS_E_INVALID (NULL argument, inner fails ks_io_check), KS_E_IO
 *         (cache_dir cannot be created), KS_E_LIMIT (path too long), KS_E_NOMEM.
 * Thread safety: the table's functions may be called from any number of
 * threads at once when inner's may (reads of one handle run concurrently).
 */
KS_NODISCARD ks_status ks_io_cache_create(const ks_io *inner, const char *cache_dir, const ks_allocator *a, ks_io **out,
                             ks_error *err);

/** Frees a cache table (the files stay in cache_dir). Handles still open are closed. Accepts NULL. */
void ks_io_cache_free(ks_io *cache);

/**
 * What a cache table did since it was created. A read is a hit when every
 * byte came from pieces and a miss when any came from inner (a read served
 * partly from pieces is one miss); bytes are counted where they came from, so
 * hit_bytes + miss_bytes is what the reads returned and miss_bytes what was
 * downloaded.
 */
typedef struct ks_io_cache_stats {
  uint64_t hit_reads, hit_bytes;   /**< reads served wholly from pieces; bytes copied out of pieces */
  uint64_t miss_reads, miss_bytes; /**< reads that went to the inner table, wholly or partly; bytes it returned */
  uint64_t stored;                 /**< pieces written to the cache */
  uint64_t store_failures;         /**< pieces that could not be written (the read still succeeded) */
  uint64_t rejected;               /**< pieces found torn or corrupt, deleted and read again */
} ks_io_cache_stats;

/** The statistics of a table made by ks_io_cache_create (all zero for another table or NULL). */
void ks_io_cache_get_stats(const ks_io *cache, ks_io_cache_stats *out);

KS_END_DECLS
#endif
