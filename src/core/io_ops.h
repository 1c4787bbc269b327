/*
 * What the library builds out of a ks_io table: the version rules (which table
 * serves an operation), `mkdir -p` with durable entries, and the atomic update
 * of a pointer (`latest`). Not installed.
 */
#ifndef KS_CORE_IO_OPS_H
#define KS_CORE_IO_OPS_H

#include "keepsake/io.h"
#include "keepsake/status.h"

/* io, or ks_io_posix() for NULL: the table of the version 1 (durable replace) operations. */
const ks_io *ks__io_v1(const ks_io *io);
/* The table of the version 2 operations: io when its version has them, else ks_io_posix(). */
const ks_io *ks__io_v2(const ks_io *io);
/* The rmdir of a table: its own from version 3 (possibly NULL: none), else ks_io_posix()'s. */
int ks__io_rmdir(const ks_io *io, const char *path);

/* The validator of handle fd of open_fn (validator_fn, version 6); ENOTSUP when the table has none. */
int ks__io_validator(const ks_io *io, int fd, char *buf, size_t cap);
/* The table's own account of a failed call of this thread that returned rc (detail_fn, version 6), into buf;
 * its length, 0 and "" when the table has none. */
size_t ks__io_detail(const ks_io *io, int rc, char *buf, size_t cap);
/* What the library's messages say about a failed call of the table: strerror(rc), followed by the
 * table's detail in parentheses when it has one ("Connection refused (PUT s3://b/x at endpoint ...)").
 * Into buf (cap bytes; KS__IO_WHY_MAX holds any message); returns buf. */
#define KS__IO_WHY_MAX 512
const char *ks__io_why(const ks_io *io, int rc, char *buf, size_t cap);

/* The read mode for a whole-file load through io: KS_READ_MMAP when the table can map,
 * else KS_READ_LAZY (header first, then parallel ranged reads). An invalid table gets
 * KS_READ_MMAP: ks_reader_open then reports what is wrong with it. */
int ks__io_read_mode(const ks_io *io);

/* The name of the pointer a checkpoint manager keeps at a run's newest checkpoint. */
#define KS__LATEST "latest"

/*
 * open_fn of `path` through io (NULL: POSIX), for readers: a path through a run's `latest` (a
 * component named KS__LATEST that is a link, `run/latest` or `run/latest/rank0.keepsake`) may
 * name a checkpoint that retention deleted between the reading of the link and the opening of
 * its target (a second step in a store that follows pointers itself, a path walk in a kernel).
 * When open fails with ENOENT and such a link exists, it is opened again; and again while each
 * failure finds the links pointing elsewhere than before it (a manager moved `latest` on and
 * deleted the previous one), at most KS__LATEST_TRIES times. A link that still names the same
 * missing target is the answer: ENOENT. Same results as open_fn (errno-style).
 */
#define KS__LATEST_TRIES 64
int ks__io_open_follow(const ks_io *io, const char *path, int *fd, uint64_t *size);

/*
 * Creates dir and every missing parent; after each mkdir the parent directory is
 * fsynced so the new entry survives a crash, and dir's parent
 * is fsynced even when dir existed (a crashed run may have left it unsynced). An existing
 * directory is fine; an existing non-directory is KS_E_IO. KS_E_LIMIT when too long.
 */
KS_NODISCARD ks_status ks__io_mkdir_p(const ks_io *io, const char *dir, ks_error *err);

/*
 * Points dir/name at `target` atomically: a link dir/.name.tmp is created (after
 * removing a stale one), renamed over dir/name, and dir is fsynced. On failure
 * before the rename the temporary link is removed and dir/name is unchanged. KS_E_IO
 * names the step and path; KS_E_NOT_DURABLE: dir/name was replaced but the directory
 * fsync failed; KS_E_LIMIT when too long.
 */
KS_NODISCARD ks_status ks__io_pointer_set(const ks_io *io, const char *dir, const char *name, const char *target,
                             ks_error *err);

#endif
