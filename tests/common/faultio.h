/*
 * A ks_io that fails its Nth call (and counts every call), for the fault-injection
 * tests of the durable writers: each step of a save is made to fail in turn.
 * Only the durable replace (the version 1 operations) is counted and failed;
 * tests/crash/crashio.h injects faults into every operation.
 */
#ifndef KS_TEST_FAULTIO_H
#define KS_TEST_FAULTIO_H

#include <stddef.h>

#include "keepsake/io.h"

typedef enum ks_fault_op {
  KS_FAULT_CREATE,
  KS_FAULT_WRITE,
  KS_FAULT_FSYNC,
  KS_FAULT_CLOSE,
  KS_FAULT_RENAME,
  KS_FAULT_UNLINK,
  KS_FAULT_FSYNC_DIR,
  KS_FAULT_OP_COUNT
} ks_fault_op;

typedef struct ks_fault_io {
  ks_io io;
  long calls, fail_at;  /* fail_at 0: never fail, only count */
  int failed_op;        /* the op that was made to fail, or -1 */
  size_t max_write;     /* 0 = no limit: writes are cut to this size to force short writes */
  int op_count[KS_FAULT_OP_COUNT];
  char created[512];    /* last temporary path created */
} ks_fault_io;

/* Resets f to fail its fail_at-th call (1-based; 0 = never), passing the rest to POSIX. */
void ks_fault_io_init(ks_fault_io *f, long fail_at);

#endif
