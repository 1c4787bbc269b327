/* The POSIX implementation of ks_io, the layer the durable writers do all their file I/O through. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include "keepsake/io.h"

static int errno_or_io(void) { return errno ? errno : EIO; }

static int posix_create(void *ctx, const char *path, int *fd) {
  (void)ctx;
  int f = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (f < 0) return errno_or_io();
  *fd = f;
  return 0;
}

static int posix_write(void *ctx, int fd, const void *buf, size_t n, size_t *written) {
  (void)ctx;
  ssize_t w;
  do {
    w = write(fd, buf, n);
  } while (w < 0 && errno == EINTR);
  if (w < 0) return errno_or_io();
  *written = (size_t)w;
  return 0;
}

static int posix_fsync(void *ctx, int fd) {
  (void)ctx;
  return fsync(fd) == 0 ? 0 : errno_or_io();
}

static int posix_close(void *ctx, int fd) {
  (void)ctx;
  /* Linux releases the descriptor even when close fails, so it is never retried. */
  return close(fd) == 0 || errno == EINTR ? 0 : errno_or_io();
}

static int posix_rename(void *ctx, const char *from, const char *to) {
  (void)ctx;
  return rename(from, to) == 0 ? 0 : errno_or_io();
}

static int posix_unlink(void *ctx, const char *path) {
  (void)ctx;
  return unlink(path) == 0 ? 0 : errno_or_io();
}

static int posix_fsync_dir(void *ctx, const char *dir) {
  (void)ctx;
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno_or_io();
  int rc = fsync(fd) == 0 ? 0 : errno_or_io();
  close(fd);
  return rc;
}

const ks_io *ks_io_posix(void) {
  static const ks_io io = {sizeof(ks_io), NULL, posix_create, posix_write,    posix_fsync,
                           posix_close,  posix_rename, posix_unlink,   posix_fsync_dir};
  return &io;
}
