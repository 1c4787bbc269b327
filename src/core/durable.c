/*
 * Durable replace through ks_io. The temporary file lives in the destination's
 * directory so the final rename never crosses a file system, and its name is
 * random so concurrent writers of the same path never share a temporary file.
 */
#include "core/durable.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/internal.h"

#define MAX_WRITE ((size_t)1 << 30)
#define TMP_ATTEMPTS 64

static ks_status io_fail(ks__durable *d, int rc, const char *what) {
  return ks__err_at(d->err, KS_E_IO, d->path, NULL, -1, "%s '%s': %s", what, d->have_tmp ? d->tmp : d->path,
                    strerror(rc));
}

ks_status ks__durable_prepare(ks__durable *d, const char *path, const ks_io *io, const ks_allocator *a,
                              ks_error *err) {
  *d = (ks__durable){.alloc = a, .path = path, .fd = -1, .err = err};
  d->io = &d->io_copy;
  if (ks__struct_in(&d->io_copy, sizeof d->io_copy, io ? io : ks_io_posix(), KS__V1_SIZE(ks_io, fsync_dir_fn)))
    return ks__err_at(err, KS_E_INVALID, path, NULL, -1, "ks_io: struct size is not one this library knows");
  if (!d->io_copy.create_fn || !d->io_copy.write_fn || !d->io_copy.fsync_fn || !d->io_copy.close_fn ||
      !d->io_copy.rename_fn || !d->io_copy.unlink_fn || !d->io_copy.fsync_dir_fn)
    return ks__err_at(err, KS_E_INVALID, path, NULL, -1, "ks_io: every member must be set");
  const char *slash = strrchr(path, '/');
  const char *base = slash ? slash + 1 : path;
  if (!*base) return ks__err_at(err, KS_E_INVALID, path, NULL, -1, "path names a directory, not a file");
  size_t dlen = slash ? (size_t)(slash - path) : 1;
  d->dir = slash ? ks__strndup(a, path, dlen ? dlen : 1) : ks__strdup(a, ".");
  size_t cap = dlen + strlen(base) + 16;
  d->tmp = ks__malloc(a, cap);
  if (!d->dir || !d->tmp) return ks__err(err, KS_E_NOMEM, "out of memory");
  int n = snprintf(d->tmp, cap, "%.*s/.%s.tmp-", (int)dlen, slash ? path : ".", base);
  d->tmp_suffix = (size_t)n;
  return KS_OK;
}

static uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

static void random_suffix(ks__durable *d, unsigned attempt) {
  static const char chars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  uint64_t r = splitmix64((uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ ((uint64_t)getpid() << 12) ^
                          (uint64_t)(uintptr_t)d ^ attempt);
  char *s = d->tmp + d->tmp_suffix;
  for (int i = 0; i < 6; i++, r /= 62) s[i] = chars[r % 62];
  s[6] = '\0';
}

ks_status ks__durable_open(ks__durable *d) {
  for (unsigned attempt = 0; attempt < TMP_ATTEMPTS; attempt++) {
    random_suffix(d, attempt);
    int rc = d->io->create_fn(d->io->ctx, d->tmp, &d->fd);
    if (rc == EEXIST) continue;
    if (rc) return io_fail(d, rc, "cannot create temporary file");
    d->have_fd = d->have_tmp = true;
    return KS_OK;
  }
  return io_fail(d, EEXIST, "cannot find a free temporary name like");
}

ks_status ks__durable_write(ks__durable *d, const void *p, size_t n) {
  const uint8_t *b = p;
  while (n > 0) {
    size_t w = 0;
    int rc = d->io->write_fn(d->io->ctx, d->fd, b, n < MAX_WRITE ? n : MAX_WRITE, &w);
    if (!rc && w == 0) rc = EIO; /* no progress and no error: never spin */
    if (rc) return io_fail(d, rc, "cannot write temporary file");
    b += w;
    n -= w;
  }
  return KS_OK;
}

ks_status ks__durable_commit(ks__durable *d) {
  int rc = d->io->fsync_fn(d->io->ctx, d->fd);
  if (rc) return io_fail(d, rc, "cannot fsync temporary file");
  d->have_fd = false;
  if ((rc = d->io->close_fn(d->io->ctx, d->fd)) != 0) return io_fail(d, rc, "cannot close temporary file");
  if ((rc = d->io->rename_fn(d->io->ctx, d->tmp, d->path)) != 0)
    return io_fail(d, rc, "cannot rename into place temporary file");
  d->have_tmp = false;
  if ((rc = d->io->fsync_dir_fn(d->io->ctx, d->dir)) != 0)
    return ks__err_at(d->err, KS_E_NOT_DURABLE, d->path, NULL, -1,
                      "file saved, but fsync of directory '%s' failed (%s): durability unknown", d->dir,
                      strerror(rc));
  return KS_OK;
}

void ks__durable_abort(ks__durable *d) {
  if (d->have_fd) d->io->close_fn(d->io->ctx, d->fd);
  if (d->have_tmp) d->io->unlink_fn(d->io->ctx, d->tmp);
  d->have_fd = d->have_tmp = false;
  ks__free(d->alloc, d->dir);
  ks__free(d->alloc, d->tmp);
  d->dir = d->tmp = NULL;
}
