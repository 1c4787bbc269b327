/**
 * @file io.h
 * Injectable file I/O for the writers that replace a file atomically and
 * durably (ks_save, ks_torch_save).
 *
 * Every writer does all its file system work through a ks_io table, so tests
 * (and programs that want to simulate a crash) can replace each step and make
 * it fail in turn. NULL wherever a ks_io pointer is accepted means
 * ks_io_posix().
 */
#ifndef KEEPSAKE_IO_H
#define KEEPSAKE_IO_H

#include "keepsake/export.h"

#include <stddef.h>

KS_BEGIN_DECLS

/**
 * The file operations a durable replace performs, in order: create_fn
 * (exclusive create of the temp file), write_fn (repeatedly), fsync_fn,
 * close_fn, rename_fn, fsync_dir_fn; unlink_fn removes the temp file after a
 * failure. Every function returns 0 or an errno value. All members must be set.
 * Thread safety: a table may be shared by concurrent writers only when its
 * functions (and ctx) are thread safe; ks_io_posix() is.
 */
typedef struct ks_io {
  size_t size; /**< 0 or sizeof(ks_io): see "Growing structs" in export.h */
  void *ctx; /**< passed unchanged as the first argument of every function */
  /** Creates `path` with O_CREAT|O_EXCL for writing (mode 0666 & ~umask); EEXIST when it exists. */
  int (*create_fn)(void *ctx, const char *path, int *fd);
  /** Writes up to n bytes; *written receives the count (may be short). */
  int (*write_fn)(void *ctx, int fd, const void *buf, size_t n, size_t *written);
  /** Flushes the file's data and metadata to stable storage. */
  int (*fsync_fn)(void *ctx, int fd);
  /** Closes the descriptor; it is released even when an error is returned. */
  int (*close_fn)(void *ctx, int fd);
  /** Atomically replaces `to` with `from` (same directory). */
  int (*rename_fn)(void *ctx, const char *from, const char *to);
  /** Removes `path`. */
  int (*unlink_fn)(void *ctx, const char *path);
  /** Opens the directory, fsyncs it and closes it. */
  int (*fsync_dir_fn)(void *ctx, const char *dir);
} ks_io;

/**
 * The POSIX implementation (what NULL means).
 * @return a pointer to a static table, never NULL; ctx is NULL.
 * Thread safety: safe to use from any number of threads.
 */
const ks_io *ks_io_posix(void);

KS_END_DECLS
#endif
