/*
 * The POSIX I/O table whose fsyncs do nothing (src/core/io.c): what the tests,
 * the benchmarks and the Python extension's fsync=False use to save quickly
 * where durability does not matter. It is internal: the shared library does not
 * export it (hidden visibility, ks__ name); those three link keepsake_static,
 * where it resolves. This folder holds only this header, so the bench and the
 * Python extension can put it on their include path without seeing the rest of
 * src/. Not installed.
 */
#ifndef KS_CORE_IO_NOSYNC_H
#define KS_CORE_IO_NOSYNC_H

#include "keepsake/io.h"

/* A caps bit of the library's own, beyond the public ones: the table's fsyncs do nothing, so a
   save is not made durable and writes through the page cache (no direct I/O, which would wait
   for the disk). Copies of the table (the Python extension's fsync=False) keep it. */
#define KS__IO_CAP_NO_FSYNC (1u << 31)

/* Every operation of ks_io_posix(), except fsync_fn and fsync_dir_fn, which return 0
   without syncing; caps also has KS__IO_CAP_NO_FSYNC. A constant table: safe to use from any
   thread. */
const ks_io *ks__io_posix_nosync(void);

#endif
