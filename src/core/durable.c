/*
 * Durable replace through ks_io. The temporary file lives in the destination's
 * directory so the final rename never crosses a file system, and its name is
 * random so concurrent writers of the same path never share a temporary file.
 */
#define _GNU_SOURCE /* O_DIRECT */
#include "core/durable.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/internal.h"
#include "core/io_ops.h"

#define MAX_WRITE ((size_t)1 << 30)
#define TMP_ATTEMPTS 64
/* A temporary file nobody holds locked is stale once unmodified this long. The age
 * protects writers that hold no lock (a custom ks_io) and the instant between a
 * writer's close and its rename; a killed writer's lock is gone at once. */
#define STALE_AGE_S 60

/* The table's own account of the failure (a remote store's request and endpoint) ends the message. */
static KS_NODISCARD ks_status io_fail(ks__durable *d, int rc, const char *what) {
  char why[KS__IO_WHY_MAX];
  return ks__err_at(d->err, KS_E_IO, d->path, NULL, -1, "%s '%s': %s", what, d->have_tmp ? d->tmp : d->path,
                    ks__io_why(d->io, rc, why, sizeof why));
}

ks_status ks__durable_prepare(ks__durable *d, const char *path, const ks_io *io, const ks_allocator *a,
                              ks_error *err) {
  *d = (ks__durable){a, ks__io_v1(io), path, NULL, NULL, 0, -1, false, false, false, err};
  ks_status s = ks_io_check(io, err);
  if (s) return s;
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

/* ".<name>.tmp-" followed by exactly 6 letters or digits: the names this file makes. */
static bool is_our_tmp(const char *name) {
  size_t n = strlen(name);
  if (n < 13 || name[0] != '.' || memcmp(name + n - 11, ".tmp-", 5) != 0) return false;
  for (size_t i = n - 6; i < n; i++) {
    char c = name[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))) return false;
  }
  return true;
}

/* Removes one temporary file when provably abandoned: no writer holds its lock, and old. */
static void remove_if_stale(int dfd, const char *name, time_t now) {
  int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return;
  struct stat sb, cur;
  if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && now - sb.st_mtime >= STALE_AGE_S &&
      flock(fd, LOCK_EX | LOCK_NB) == 0 && fstatat(dfd, name, &cur, AT_SYMLINK_NOFOLLOW) == 0 &&
      cur.st_ino == sb.st_ino && cur.st_dev == sb.st_dev)
    unlinkat(dfd, name, 0);
  close(fd);
}

/* Best effort: temporary files of killed writers (ours, in this directory) would pile up. */
static void clean_stale(const ks__durable *d) {
  DIR *dir = opendir(d->dir);
  if (!dir) return;
  time_t now = time(NULL);
  struct dirent *e;
  while ((e = readdir(dir)) != NULL)
    if (is_our_tmp(e->d_name)) remove_if_stale(dirfd(dir), e->d_name, now);
  closedir(dir);
}

/* The same check asked of a custom table (version 2 has stat_fn; version 1 cannot be asked). */
static KS_NODISCARD ks_status check_destination_io(const ks__durable *d) {
  ks_io_stat st;
  if (d->io->version < 2 || d->io->stat_fn(d->io->ctx, d->path, &st) != 0 || st.kind == KS_IO_FILE ||
      st.kind == KS_IO_LINK)
    return KS_OK;
  return ks__err_at(d->err, KS_E_INVALID, d->path, NULL, -1, "destination exists and is %s; refusing to replace it",
                    st.kind == KS_IO_DIR ? "a directory" : "not a regular file");
}

/* A rename over a device, FIFO, socket or directory would replace it (as root, even /dev/null). */
static KS_NODISCARD ks_status check_destination(const ks__durable *d) {
  if (!(ks_io_caps(d->io) & KS_IO_CAP_LOCAL)) return check_destination_io(d);
  struct stat sb;
  if (lstat(d->path, &sb) != 0 || S_ISREG(sb.st_mode) || S_ISLNK(sb.st_mode)) return KS_OK;
  const char *what = S_ISDIR(sb.st_mode)   ? "a directory"
                     : S_ISCHR(sb.st_mode) ? "a character device"
                     : S_ISBLK(sb.st_mode) ? "a block device"
                     : S_ISFIFO(sb.st_mode) ? "a FIFO"
                                            : "not a regular file";
  return ks__err_at(d->err, KS_E_INVALID, d->path, NULL, -1, "destination exists and is %s; refusing to replace it",
                    what);
}

ks_status ks__durable_open(ks__durable *d) {
  /* Only a table whose paths are local files (its caps say so, io.h) keeps them where we look. */
  bool posix = (ks_io_caps(d->io) & KS_IO_CAP_LOCAL) != 0;
  ks_status st = check_destination(d);
  if (st) return st;
  if (posix) clean_stale(d);
  for (unsigned attempt = 0; attempt < TMP_ATTEMPTS; attempt++) {
    random_suffix(d, attempt);
    int rc = d->io->create_fn(d->io->ctx, d->tmp, &d->fd);
    if (rc == EEXIST) continue;
    if (rc) { /* the message names the temporary file, not the destination */
      d->have_tmp = true;
      st = io_fail(d, rc, "cannot create temporary file");
      d->have_tmp = false;
      return st;
    }
    d->have_fd = d->have_tmp = true;
    if (posix) flock(d->fd, LOCK_EX | LOCK_NB); /* held until close: tells cleaners we are alive */
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

/* Turns direct I/O on or off for the temporary file; false when it cannot be (a table that is not
   local, a system without O_DIRECT, a file system that refuses it). */
static bool set_direct(ks__durable *d, bool on) {
#ifdef O_DIRECT
  if (!d->have_fd || !(ks_io_caps(d->io) & KS_IO_CAP_LOCAL)) return false;
  int fl = fcntl(d->fd, F_GETFL);
  if (fl < 0) return false;
  int want = on ? fl | O_DIRECT : fl & ~O_DIRECT;
  return want == fl || fcntl(d->fd, F_SETFL, want) == 0;
#else
  (void)d;
  (void)on;
  return false;
#endif
}

#define DIRECT_CHUNK ((size_t)8 << 20) /* a multiple of KS__DIRECT_ALIGN */

bool ks__durable_direct_begin(ks__durable *d) {
  d->direct = set_direct(d, true);
  return d->direct;
}

ks_status ks__durable_direct_end(ks__durable *d) {
  if (!d->direct) return KS_OK;
  d->direct = false;
  return set_direct(d, false) ? KS_OK : io_fail(d, EIO, "cannot end direct writes to temporary file");
}

ks_status ks__durable_write_blocks(ks__durable *d, const void *p, size_t n) {
  const uint8_t *b = p;
  size_t bulk = d->direct && (uintptr_t)p % KS__DIRECT_ALIGN == 0 ? n - n % KS__DIRECT_ALIGN : 0;
  while (bulk) {
    size_t w = 0, len = bulk < DIRECT_CHUNK ? bulk : DIRECT_CHUNK;
    int rc = d->io->write_fn(d->io->ctx, d->fd, b, len, &w);
    /* The file system took O_DIRECT but not these writes: the rest goes buffered. */
    if (rc == EINVAL || rc == ENOTSUP || rc == EOPNOTSUPP) break;
    if (!rc && (w == 0 || w > len)) rc = EIO; /* no progress and no error: never spin */
    if (rc) {
      d->direct = false;
      set_direct(d, false);
      return io_fail(d, rc, "cannot write temporary file");
    }
    b += w, n -= w, bulk -= w;
    if (w % KS__DIRECT_ALIGN) break; /* a short write left the offset unaligned */
  }
  ks_status st = n ? ks__durable_direct_end(d) : KS_OK; /* what is left goes through the page cache */
  return st ? st : ks__durable_write(d, b, n);
}

ks_status ks__durable_write_image(ks__durable *d, const void *p, size_t n) {
  if ((uintptr_t)p % KS__DIRECT_ALIGN == 0) (void)ks__durable_direct_begin(d); /* false: all buffered */
  ks_status st = ks__durable_write_blocks(d, p, n);
  return st ? st : ks__durable_direct_end(d);
}

bool ks__io_can_pwrite(const ks_io *io) {
  const ks_io *t = ks__io_v1(io);
  return t->version >= 5 && t->pwrite_fn != NULL;
}

ks_status ks__durable_pwrite(ks__durable *d, const void *p, size_t n, uint64_t off) {
  const uint8_t *b = p;
  if (!ks__io_can_pwrite(d->io)) return io_fail(d, ENOTSUP, "cannot write at an offset of temporary file");
  while (n > 0) {
    size_t w = 0;
    size_t len = n < MAX_WRITE ? n : MAX_WRITE;
    int rc = d->io->pwrite_fn(d->io->ctx, d->fd, b, len, off, &w);
    if (!rc && (w == 0 || w > len)) rc = EIO; /* no progress and no error: never spin */
    if (rc) return io_fail(d, rc, "cannot write temporary file");
    b += w;
    n -= w;
    off += w;
  }
  return KS_OK;
}

int ks__durable_pwrite_raw(ks__durable *d, const void *p, size_t n, uint64_t off) {
  const uint8_t *b = p;
  while (n > 0) {
    size_t w = 0, len = n < MAX_WRITE ? n : MAX_WRITE;
    int rc = d->io->pwrite_fn(d->io->ctx, d->fd, b, len, off, &w);
    if (!rc && (w == 0 || w > len)) rc = EIO; /* no progress and no error: never spin */
    if (rc) return rc;
    b += w, n -= w, off += w;
  }
  return 0;
}

ks_status ks__durable_fail(ks__durable *d, int rc) { return io_fail(d, rc, "cannot write temporary file"); }

bool ks__durable_reserve(ks__durable *d, uint64_t size) {
#if defined(__linux__)
  if (!d->have_fd || !(ks_io_caps(d->io) & KS_IO_CAP_LOCAL) || size > (uint64_t)INT64_MAX) return false;
  return fallocate(d->fd, 0, 0, (off_t)size) == 0;
#else
  (void)d;
  (void)size;
  return false;
#endif
}

ks_status ks__durable_commit(ks__durable *d) {
  int rc = d->io->fsync_fn(d->io->ctx, d->fd);
  if (rc) return io_fail(d, rc, "cannot fsync temporary file");
  d->have_fd = false;
  if ((rc = d->io->close_fn(d->io->ctx, d->fd)) != 0) return io_fail(d, rc, "cannot close temporary file");
  if ((rc = d->io->rename_fn(d->io->ctx, d->tmp, d->path)) != 0)
    return io_fail(d, rc, "cannot rename into place temporary file");
  d->have_tmp = false;
  if ((rc = d->io->fsync_dir_fn(d->io->ctx, d->dir)) != 0) {
    char why[KS__IO_WHY_MAX];
    return ks__err_at(d->err, KS_E_NOT_DURABLE, d->path, NULL, -1,
                      "file saved, but fsync of directory '%s' failed (%s): durability unknown", d->dir,
                      ks__io_why(d->io, rc, why, sizeof why));
  }
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
