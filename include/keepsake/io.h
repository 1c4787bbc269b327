/**
 * @file io.h
 * The storage interface: every file system call of the writers (ks_save,
 * ks_torch_save), of the keepsake/safetensors reader (ks_reader_open, ks_load,
 * ks_state_load), of the torch.save reader (ks_torch_load, ks_torch_import) and
 * of the checkpoint manager (ks_ckpt_manager_*) goes through one ks_io table, in
 * the spirit of SQLite's VFS. Wrapping tables (a local cache, a counter) are in
 * io_cache.h. Tests (and programs
 * that want to simulate a crash or a failing disk) replace each step and make
 * it fail, or record it and drop what was not made durable. NULL wherever a
 * ks_io pointer is accepted means ks_io_posix(), the local file system.
 *
 * Versions. The first member, `version`, says which members the table has:
 *   - 1: ctx and the durable replace (create_fn .. fsync_dir_fn);
 *   - 2: also reading (open_fn, read_fn, map_fn, unmap_fn), stat_fn, list_fn,
 *        mkdir_fn, symlink_fn and readlink_fn;
 *   - 3: also rmdir_fn (removing the directory of a sharded checkpoint);
 *   - 4: also caps (what the backend is and can do, KS_IO_CAP_*), lock_fn and
 *        unlock_fn (the checkpoint manager's exclusive lock on its run directory);
 *   - 5: also pwrite_fn (a write at an offset, with which ks_save hashes each
 *        tensor as it writes it and then fills the checksums into the header it
 *        wrote first, instead of reading all the data twice);
 *   - 6: also validator_fn (what identifies the content of a file open for
 *        reading, an HTTP ETag: a read cache keys its pieces by it) and
 *        detail_fn (the backend's own account of a failure, e.g. the request and
 *        the endpoint, which the library adds to its messages).
 * Rules, so the struct can grow without breaking programs already built:
 *   - members are only ever appended, each new group under a new version;
 *   - the library reads only the members the table's version has; an operation
 *     that a table's version lacks is done by ks_io_posix() (such a table was
 *     written before the operation went through ks_io), except pwrite_fn: a
 *     table older than version 5 is treated as having none (its handles need
 *     not be file descriptors);
 *   - a table of a version newer than the library's KS_IO_VERSION is used as
 *     the newest version the library knows;
 *   - version 0 or a NULL member the table's version has is refused with
 *     KS_E_INVALID, except map_fn and unmap_fn, which may be NULL (the backend
 *     cannot map: the library reads instead), and rmdir_fn, which may be NULL
 *     (a store without directories: removing a prefix's last object removes it),
 *     and lock_fn and unlock_fn, which may both be NULL (no locks: see caps),
 *     and pwrite_fn, which may be NULL (the writers then hash the data in a pass
 *     of its own before writing it; the file is byte for byte the same), and
 *     validator_fn and detail_fn, which may be NULL (no validators, no details).
 * Always set `.version = KS_IO_VERSION` so a rebuilt program gets the current
 * layout. A table written from scratch has caps 0 (the library assumes nothing).
 *
 * Capabilities. The library decides what a backend is by its caps, never by the
 * table's address, so a copy of *ks_io_posix() is treated exactly as the
 * original: the same stale temporary file cleanup, temp-file locks and run
 * directory lock. A table of version 3 or older has caps 0. Copying
 * *ks_io_posix() and replacing members is fine as long as paths keep naming
 * the same local files (a counter, a fault injector, fsync dropped); a table
 * whose paths live anywhere else must clear KS_IO_CAP_LOCAL (and set lock_fn,
 * unlock_fn and KS_IO_CAP_LOCK only for locks of its own). A copy that changes
 * what write_fn does with the bytes (rather than only failing, delaying or
 * counting calls) must replace pwrite_fn to match, or set it to NULL.
 *
 * What bypasses the table. With KS_IO_CAP_LOCAL, and only then, the durable
 * writer also uses the path directly for four things the table has no
 * operation for: the check that the destination is not a device, FIFO or
 * directory (lstat), an advisory lock on its own temporary file while it is
 * written (flock on the handle create_fn returned), direct I/O for the
 * aligned bulk of a large durable save (fcntl O_DIRECT on that handle; the
 * writes still go through write_fn, and a refused one, EINVAL or ENOTSUP,
 * sends the rest through the page cache), and the removal of
 * temporary files of killed writers (readdir, openat, flock, fstat, unlinkat);
 * and ks_convert checks an existing output with lstat (a symlink, device or
 * read-only file is refused). Every other file system call of the library goes
 * through the table.
 *
 * Paths are the library's own strings ("run/ep1-ba10.keepsake"); a backend
 * may map them anywhere. Handles (`fd`) are nonnegative ints the backend
 * chooses; ks_io_posix() uses file descriptors. Every function returns 0 or
 * an errno value (ENOENT, EEXIST, ENOSPC, ...), never -1.
 *
 * Remote stores (s3://, http(s)://) fit the same table as later versions:
 * there the object write (create..rename) becomes one upload committed by
 * rename_fn onto the final key, `latest` a small pointer object, and listing
 * a prefix query; the manager and the writers need no change.
 *
 * Thread safety: a table may be shared by concurrent writers only when its
 * functions (and ctx) are thread safe; ks_io_posix() is. A manager's async
 * save calls its table from a background thread. A full load in KS_READ_LAZY
 * mode (format.h; what ks_state_load and autoresume use for a table without
 * map_fn) calls read_fn from several threads at once on the same handle, at
 * different offsets: a table used that way must allow it. So does a
 * KS_READ_COPY open of a file of 32 MiB or more through a table with
 * KS_IO_CAP_LOCAL (a copy of ks_io_posix(), whose read_fn is pread). A large
 * durable save (ks_save) through such a table writes from the calling thread
 * only, but with O_DIRECT set on the handle for most of the file (below).
 *
 * Cost model: the lazy mode assumes each read_fn call may be a round trip (a
 * ranged GET) and makes few, large calls; open_fn may be a HEAD.
 */
#ifndef KEEPSAKE_IO_H
#define KEEPSAKE_IO_H

#include "keepsake/export.h"

#include <stddef.h>
#include <stdint.h>

#include "keepsake/status.h"

KS_BEGIN_DECLS

/** The version of ks_io this header describes. */
#define KS_IO_VERSION 6u

/**
 * caps bits (version 4). KS_IO_CAP_LOCAL: paths name files of this machine's
 * file system and create_fn's handles are file descriptors, so the library may
 * use them directly (see "What bypasses the table"). KS_IO_CAP_LOCK: lock_fn
 * and unlock_fn take locks that no other process can hold at the same time and
 * that end when the holder dies (at once, or, for a lease such as the S3
 * table's, once its time to live passes without renewal). KS_IO_CAP_MAP: map_fn maps (informative; the
 * library still falls back to reading when map_fn returns ENOTSUP).
 * KS_IO_CAP_READ_ONLY: every write (create_fn, rename_fn, mkdir_fn, ...)
 * fails with EROFS (an HTTP location), so parts that must write, such as the
 * checkpoint manager, refuse the table at once with a clear error.
 */
#define KS_IO_CAP_LOCAL 1u
#define KS_IO_CAP_LOCK 2u
#define KS_IO_CAP_MAP 4u
#define KS_IO_CAP_READ_ONLY 8u

/** What a path names, as stat_fn and list_fn report it (a final symlink is not followed). */
typedef enum ks_io_kind {
  KS_IO_FILE = 1, /**< a regular file (an object) */
  KS_IO_DIR = 2,  /**< a directory (a prefix) */
  KS_IO_LINK = 3, /**< a symbolic link (a pointer) */
  KS_IO_OTHER = 4 /**< anything else (device, socket, ...) */
} ks_io_kind;

/** What stat_fn reports. */
typedef struct ks_io_stat {
  ks_io_kind kind;
  uint64_t size; /**< bytes of a file; of a link, the length of its target */
} ks_io_stat;

/**
 * Called by list_fn once per entry. @return 0 to go on, or an errno value that
 * stops the listing and becomes list_fn's result.
 */
typedef int (*ks_io_list_cb)(void *cb_ctx, const char *name, ks_io_kind kind);

/**
 * The storage operations. A durable replace performs, in order: create_fn
 * (exclusive create of the temp file), write_fn (repeatedly), pwrite_fn (where
 * set: once, the header's checksums, after the data), fsync_fn, close_fn,
 * rename_fn, fsync_dir_fn; unlink_fn removes the temp file after a failure.
 * The manager also creates its run directory (stat_fn, mkdir_fn, fsync_dir_fn
 * of the parent), points `latest` at a checkpoint (unlink_fn,
 * symlink_fn, rename_fn, fsync_dir_fn), lists the run directory (list_fn,
 * stat_fn) and deletes checkpoints (unlink_fn; a sharded checkpoint's files,
 * then its directory with rmdir_fn).
 */
typedef struct ks_io {
  unsigned version; /**< KS_IO_VERSION when written for this header; see the rules above */
  void *ctx;        /**< passed unchanged as the first argument of every function */
  /* --- version 1 --- */
  /** Creates `path` with O_CREAT|O_EXCL for writing (mode 0666 & ~umask); EEXIST when it exists. */
  int (*create_fn)(void *ctx, const char *path, int *fd);
  /** Writes up to n bytes at the end; *written receives the count (may be short). */
  int (*write_fn)(void *ctx, int fd, const void *buf, size_t n, size_t *written);
  /** Flushes the file's data and metadata to stable storage. */
  int (*fsync_fn)(void *ctx, int fd);
  /** Closes a handle of create_fn or open_fn; it is released even when an error is returned. */
  int (*close_fn)(void *ctx, int fd);
  /** Atomically replaces `to` with `from` (same directory); durable after fsync_dir_fn. */
  int (*rename_fn)(void *ctx, const char *from, const char *to);
  /** Removes the file or link `path` (ENOENT when missing); durable after fsync_dir_fn. */
  int (*unlink_fn)(void *ctx, const char *path);
  /** Makes the directory's entries durable (POSIX: open it, fsync, close). */
  int (*fsync_dir_fn)(void *ctx, const char *dir);
  /* --- version 2 --- */
  /** Opens the regular file `path` for reading; *size receives its length. EISDIR for a directory, ENODEV for another
   * non-file. */
  int (*open_fn)(void *ctx, const char *path, int *fd, uint64_t *size);
  /** Reads up to n bytes at offset off; *got < n only at the end of the file. Called concurrently on one handle by lazy
   * full loads (see Thread safety). */
  int (*read_fn)(void *ctx, int fd, void *buf, size_t n, uint64_t off, size_t *got);
  /** Maps the first `size` bytes read-only into *addr; may be NULL, or return ENOTSUP (then the library reads). */
  int (*map_fn)(void *ctx, int fd, uint64_t size, const void **addr);
  /** Releases a mapping of map_fn (NULL exactly when map_fn is). */
  int (*unmap_fn)(void *ctx, const void *addr, uint64_t size);
  /** Describes `path` without following a final link (lstat); ENOENT when missing. */
  int (*stat_fn)(void *ctx, const char *path, ks_io_stat *st);
  /** Calls cb for each entry of directory `dir` whose name starts with `prefix` ("" = all), "." and ".." excepted. */
  int (*list_fn)(void *ctx, const char *dir, const char *prefix, ks_io_list_cb cb, void *cb_ctx);
  /** Creates one directory (mode 0777 & ~umask); EEXIST when `path` exists. Durable after fsync_dir_fn of its parent.
   */
  int (*mkdir_fn)(void *ctx, const char *path);
  /** Creates the link `path` whose content is `target`; EEXIST when `path` exists. */
  int (*symlink_fn)(void *ctx, const char *target, const char *path);
  /** Reads a link's content into buf (cap bytes, NUL-terminated); *len its length; ENAMETOOLONG when it does not fit.
   */
  int (*readlink_fn)(void *ctx, const char *path, char *buf, size_t cap, size_t *len);
  /* --- version 3 --- */
  /**
   * Removes the empty directory `path` (ENOTEMPTY when it is not, ENOENT when missing);
   * durable after fsync_dir_fn of its parent. May be NULL: the library then leaves the
   * emptied directory (or prefix) in place.
   */
  int (*rmdir_fn)(void *ctx, const char *path);
  /* --- version 4 --- */
  /** KS_IO_CAP_* bits: what the backend is and can do (0: nothing assumed). */
  unsigned caps;
  /**
   * Takes an exclusive lock named `path` without waiting, creating what it needs.
   * On success *handle is set and `owner` (a NUL-terminated line naming the
   * holder, e.g. "pid 4242 on host n1") is recorded. When another holds it:
   * EWOULDBLOCK, with the holder's record copied into holder (cap bytes,
   * NUL-terminated; "" when unknown). A holder that dies releases it. ENOTSUP:
   * the backend turned out unable to lock (a store that ignores conditional
   * writes); the checkpoint manager then treats the table as one without locks.
   * May be NULL (together with unlock_fn): the backend has no locks.
   */
  int (*lock_fn)(void *ctx, const char *path, const char *owner, int *handle, char *holder, size_t cap);
  /** Releases a lock of lock_fn; the handle is gone even when an error is returned. */
  int (*unlock_fn)(void *ctx, int handle);
  /* --- version 5 --- */
  /**
   * Writes up to n bytes at offset `off` of a handle of create_fn, within what
   * write_fn has already written, without moving where write_fn appends;
   * *written receives the count (may be short). May be NULL (a store that can
   * only append, such as an upload): ks_save then hashes every tensor before
   * writing the file instead of while writing it.
   */
  int (*pwrite_fn)(void *ctx, int fd, const void *buf, size_t n, uint64_t off, size_t *written);
  /* --- version 6 --- */
  /**
   * The validator of a handle of open_fn: a string the store changes whenever the
   * file's content is replaced (an HTTP ETag, else its Last-Modified time), as
   * open_fn found it. Copied into buf (cap bytes, NUL-terminated). ENOTSUP when the
   * store gave none, ENAMETOOLONG when it does not fit, EBADF for another handle.
   * A read cache (io_cache.h) keys the bytes it keeps by it and checks it on every
   * open, so an object replaced by another of the same size is read anew. May be
   * NULL: the backend has no validators (a cache then knows a file by its path and
   * size only).
   */
  int (*validator_fn)(void *ctx, int fd, char *buf, size_t cap);
  /**
   * The backend's account of the failure of its most recent call made by the
   * calling thread, when that call returned rc: e.g. "PUT s3://b/run/x at endpoint
   * http://127.0.0.1:9: Failed to connect ... after 5 retries". Copied into buf (cap
   * bytes, NUL-terminated, truncated to fit). @return its full length; 0 (and "")
   * when the backend has nothing to add. The library adds it, in parentheses, to
   * its messages about a failed call of the table ("cannot rename into place
   * temporary file '...': Connection refused (PUT s3://...)"). May be NULL.
   */
  size_t (*detail_fn)(void *ctx, int rc, char *buf, size_t cap);
} ks_io;

/**
 * The POSIX implementation (what NULL means), version KS_IO_VERSION.
 * @return a pointer to a static table, never NULL; ctx is NULL.
 * Thread safety: safe to use from any number of threads.
 */
const ks_io *ks_io_posix(void);

/**
 * The capabilities of a table: its caps from version 4, 0 for an older table,
 * those of ks_io_posix() for NULL.
 */
unsigned ks_io_caps(const ks_io *io);
/**
 * Checks a table against the rules above (NULL is ks_io_posix(), valid).
 * @return KS_OK, or KS_E_INVALID (version 0, or a required member NULL) with a
 * message naming the member.
 */
KS_NODISCARD ks_status ks_io_check(const ks_io *io, ks_error *err);

/**
 * The local path a location names: `file:///abs/dir` and `file://rel` become
 * the path after "file://"; a plain path is itself.
 * @return KS_OK with *path pointing into `location` (no copy), KS_E_UNSUPPORTED
 * for another scheme (s3://, http://, ...: not built in this version), or
 * KS_E_INVALID for NULL or an empty path.
 */
KS_NODISCARD ks_status ks_io_local_path(const char *location, const char **path, ks_error *err);

KS_END_DECLS
#endif
