#include "faultio.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* Counts the call; returns the errno to fail with when this is the chosen call, else 0. */
static int inject(ks_fault_io *f, ks_fault_op op, int errnum) {
  f->op_count[op]++;
  if (++f->calls != f->fail_at) return 0;
  f->failed_op = (int)op;
  return errnum;
}

#define BASE ks_io_posix()
static int f_create(void *c, const char *p, int *fd) {
  ks_fault_io *f = c;
  snprintf(f->created, sizeof f->created, "%s", p);
  int e = inject(f, KS_FAULT_CREATE, EACCES);
  return e ? e : BASE->create_fn(NULL, p, fd);
}
static int f_write(void *c, int fd, const void *b, size_t n, size_t *w) {
  ks_fault_io *f = c;
  int e = inject(f, KS_FAULT_WRITE, ENOSPC);
  if (f->max_write && n > f->max_write) n = f->max_write;
  return e ? e : BASE->write_fn(NULL, fd, b, n, w);
}
static int f_fsync(void *c, int fd) {
  int e = inject(c, KS_FAULT_FSYNC, EIO);
  return e ? e : BASE->fsync_fn(NULL, fd);
}
static int f_close(void *c, int fd) {
  int e = inject(c, KS_FAULT_CLOSE, EIO);
  int rc = BASE->close_fn(NULL, fd); /* a failed close still releases the descriptor */
  return e ? e : rc;
}
static int f_rename(void *c, const char *a, const char *b) {
  int e = inject(c, KS_FAULT_RENAME, EXDEV);
  return e ? e : BASE->rename_fn(NULL, a, b);
}
static int f_unlink(void *c, const char *p) {
  int e = inject(c, KS_FAULT_UNLINK, EIO);
  return e ? e : BASE->unlink_fn(NULL, p);
}
static int f_fsync_dir(void *c, const char *d) {
  int e = inject(c, KS_FAULT_FSYNC_DIR, EIO);
  return e ? e : BASE->fsync_dir_fn(NULL, d);
}

void ks_fault_io_init(ks_fault_io *f, long fail_at) {
  memset(f, 0, sizeof *f);
  f->io = *BASE; /* the version 2 operations (reading, listing, mkdir, links) pass through uncounted */
  f->io.ctx = f;
  f->io.create_fn = f_create;
  f->io.write_fn = f_write;
  f->io.fsync_fn = f_fsync;
  f->io.close_fn = f_close;
  f->io.rename_fn = f_rename;
  f->io.unlink_fn = f_unlink;
  f->io.fsync_dir_fn = f_fsync_dir;
  f->fail_at = fail_at;
  f->failed_op = -1;
}
