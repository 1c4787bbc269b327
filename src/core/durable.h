/*
 * Durable replace: write a file under a temporary name in its directory, fsync
 * it, rename it over the destination and fsync the directory, all through a
 * ks_io table. Shared by every writer of files (format, torch). Not installed.
 *
 * Use: prepare (allocations only, no I/O), open, write... (and pwrite, to patch
 * bytes already written, where the table has it), commit, then always abort,
 * which removes whatever is left of the temporary file and frees memory.
 * Errors name the destination path as the file; messages name the temp file.
 */
#ifndef KS_CORE_DURABLE_H
#define KS_CORE_DURABLE_H

#include <stdbool.h>
#include <stddef.h>

#include "keepsake/alloc.h"
#include "keepsake/io.h"
#include "keepsake/status.h"

typedef struct ks__durable {
  const ks_allocator *alloc;
  const ks_io *io;
  const char *path; /* borrowed: must outlive the ks__durable */
  char *dir, *tmp;
  size_t tmp_suffix; /* where the random suffix of tmp starts */
  int fd;
  bool have_fd, have_tmp;
  bool direct; /* direct I/O is on for the temporary file (ks__durable_direct_begin) */
  ks_error *err;
} ks__durable;

/* Splits path into its directory and "<dir>/.<name>.tmp-<6 random characters>". io NULL = POSIX.
 * KS_E_INVALID when path names a directory or io fails ks_io_check, KS_E_NOMEM.
 * Call abort even on failure. */
KS_NODISCARD ks_status ks__durable_prepare(ks__durable *d, const char *path, const ks_io *io, const ks_allocator *a,
                              ks_error *err);
/* Creates the temporary file exclusively under a fresh random name. With the POSIX
 * ks_io it first refuses (KS_E_INVALID) a destination that exists and is neither a
 * regular file nor a symlink (a device, FIFO, socket or directory), then removes stale temporary files of this pattern
 * in the directory
 * (".*.tmp-XXXXXX" that no writer holds flock'd and unmodified for 60 s: left by a
 * killed writer), and holds an flock on its own until close. */
KS_NODISCARD ks_status ks__durable_open(ks__durable *d);
/* Writes all n bytes to the temporary file (retrying short writes). */
KS_NODISCARD ks_status ks__durable_write(ks__durable *d, const void *p, size_t n);
/* True when io (NULL = POSIX) writes at offsets: pwrite_fn of a version 5 table, set.
 * A table of an older version has none (its handles need not be file descriptors). */
bool ks__io_can_pwrite(const ks_io *io);
/* Writes all n bytes at offset off of the temporary file (retrying short writes), leaving
 * where write appends unchanged. Only for a table of which ks__io_can_pwrite is true. */
KS_NODISCARD ks_status ks__durable_pwrite(ks__durable *d, const void *p, size_t n, uint64_t off);
/* What direct writes need: memory address, length and file offset multiples of this (the
 * largest logical block size in common use). */
#define KS__DIRECT_ALIGN ((size_t)4096)
/* Direct writes (O_DIRECT: no copy into the page cache, no writeback left to the kernel) for what
 * ks__durable_write_blocks writes next: true when on, which needs a local table (KS_IO_CAP_LOCAL:
 * its handles are file descriptors) and a system and file system that allow it (tmpfs may not). */
bool ks__durable_direct_begin(ks__durable *d);
/* Writes n bytes at p to the end of the temporary file, which is at a multiple of
 * KS__DIRECT_ALIGN while direct writes are on: the whole blocks of an aligned p with direct I/O,
 * the rest through the page cache, which ends direct writes. A file system that refuses a direct
 * write (EINVAL, ENOTSUP) ends them too, and gets the bytes buffered. Same errors as
 * ks__durable_write. */
KS_NODISCARD ks_status ks__durable_write_blocks(ks__durable *d, const void *p, size_t n);
/* Writes all n bytes at p at offset off of the temporary file in whatever mode its descriptor is
 * in (direct or not; retrying short writes): 0 or the errno, formatting no error, so that several
 * threads may write different ranges at once; ks__durable_fail reports a failure. Only for a table
 * of which ks__io_can_pwrite is true. */
int ks__durable_pwrite_raw(ks__durable *d, const void *p, size_t n, uint64_t off);
/* KS_E_IO for a failed write (errno rc) of the temporary file, as ks__durable_write reports it. */
KS_NODISCARD ks_status ks__durable_fail(ks__durable *d, int rc);
/* Gives the temporary file its final size, its blocks allocated (fallocate), where the table is
 * local and the file system can: direct writes then go into allocated blocks within the file's
 * size, which the file system lets several run at once, instead of extending it one at a time.
 * False when it did not (nothing changed; the writes allocate as they go). */
bool ks__durable_reserve(ks__durable *d, uint64_t size);
/* Ends direct writes (nothing when they are off); KS_E_IO when the descriptor refuses. Before any
 * pwrite of bytes that are not whole aligned blocks. */
KS_NODISCARD ks_status ks__durable_direct_end(ks__durable *d);
/* Writes the n bytes at p, which is KS__DIRECT_ALIGN-aligned, to the still empty temporary file:
 * its aligned bulk with direct I/O where the table and file system allow it (as above), the rest
 * (and everything where they do not) as ks__durable_write does. Same errors as ks__durable_write. */
KS_NODISCARD ks_status ks__durable_write_image(ks__durable *d, const void *p, size_t n);
/* fsync, close, rename over path, fsync the directory. KS_E_IO: nothing changed at
 * path. KS_E_NOT_DURABLE: the directory fsync failed with the new file already in place. */
KS_NODISCARD ks_status ks__durable_commit(ks__durable *d);
/* Closes and unlinks the temporary file if still held, frees memory. Idempotent. */
void ks__durable_abort(ks__durable *d);

#endif
