/*
 * A crash-simulation ks_io, after SQLite's crash test. Every operation is done
 * on the real file system (so readers see what a live process would see) and
 * also applied to an in-memory model of the tree under `root` that keeps two
 * images of it:
 *   - volatile: what the running process sees;
 *   - durable: what survives power loss. A file's data becomes durable only
 *     at fsync of that file; a directory's entries (created, renamed, unlinked
 *     names, new links and subdirectories) only at fsync of that directory.
 * The mutating operations (create, write, fsync, close, rename, unlink,
 * fsync_dir, mkdir, symlink) are numbered steps. A run can crash before any
 * chosen step: from then on every operation fails with EIO and changes
 * nothing, as if the machine had lost power; a run can instead fail one
 * chosen step with an errno and go on (fault injection). Afterwards an image
 * is materialised into a fresh directory:
 *   - KS_CRASH_DURABLE: durable entries, durable data (what fsync promised);
 *   - KS_CRASH_NAMES: volatile entries, durable data (metadata journaled
 *     ahead of data, as ext4 data=writeback can leave it);
 *   - KS_CRASH_VOLATILE: everything that was done (a process kill);
 *   - KS_CRASH_PREFIX: in between, drawn from `seed`: per directory, the
 *     durable entries plus the first j of the changes made since its last
 *     fsync (an ordered metadata journal), and per file, its durable data plus
 *     a random part of what was appended after it (a torn tail).
 * A file whose data was never fsynced comes back empty in the first two.
 * Real fsyncs are skipped: the model is the disk.
 *
 * Thread safe (one mutex): async saves call it from their background thread.
 */
#ifndef KS_TEST_CRASHIO_H
#define KS_TEST_CRASHIO_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "keepsake/io.h"

typedef enum ks_crash_op {
  KS_CRASH_OP_CREATE,
  KS_CRASH_OP_WRITE,
  KS_CRASH_OP_FSYNC,
  KS_CRASH_OP_CLOSE,
  KS_CRASH_OP_RENAME,
  KS_CRASH_OP_UNLINK,
  KS_CRASH_OP_FSYNC_DIR,
  KS_CRASH_OP_MKDIR,
  KS_CRASH_OP_SYMLINK,
  KS_CRASH_OP_COUNT
} ks_crash_op;

typedef enum ks_crash_image { KS_CRASH_DURABLE, KS_CRASH_NAMES, KS_CRASH_VOLATILE, KS_CRASH_PREFIX } ks_crash_image;

/* One numbered step, as recorded. Paths are relative to root ("run/x"). */
typedef struct ks_crash_step {
  ks_crash_op op;
  char path[160], path2[160];
} ks_crash_step;

typedef struct ks_crash_node ks_crash_node;

typedef struct ks_crash_io {
  ks_io io;
  pthread_mutex_t mu;
  char root[512];
  long steps;          /* steps done (or attempted) so far */
  long crash_at;       /* crash before this step (1-based); 0 = never */
  long fail_at;        /* fail this step with fail_errno and go on; 0 = never */
  int fail_errno;
  int crashed;         /* the crash happened */
  int failed_op;       /* the op of the failed or crashing step, or -1 */
  int model_error;     /* the model met something it cannot represent: the test must fail */
  ks_crash_node *nodes;
  size_t n_nodes, cap_nodes;
  struct { int fd; size_t node; } handles[64];
  ks_crash_step *log;  /* every step, when recording */
  size_t n_log, cap_log;
  int record;
  uint64_t seed;       /* draws of KS_CRASH_PREFIX */
} ks_crash_io;

/* Models the existing, empty, durable directory `root`; crash_at/fail_at 0 = never. */
void ks_crash_io_init(ks_crash_io *c, const char *root, int record);
void ks_crash_io_free(ks_crash_io *c);
/*
 * Writes the chosen image of the tree under root into the existing empty
 * directory `out`. @return 0, or -1 when a file could not be written.
 */
int ks_crash_io_materialise(ks_crash_io *c, ks_crash_image image, const char *out);

#endif
