/* The POSIX implementation of ks_io, the layer all file system work of the library goes through. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/nosync/io_nosync.h"
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

static int posix_pwrite(void *ctx, int fd, const void *buf, size_t n, uint64_t off, size_t *written) {
  (void)ctx;
  if (off > (uint64_t)INT64_MAX) return EINVAL;
  ssize_t w;
  do {
    w = pwrite(fd, buf, n, (off_t)off);
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

/* O_NONBLOCK: opening a FIFO must not wait for a writer before it is refused (ENODEV) as not a file. */
static int posix_open(void *ctx, const char *path, int *fd, uint64_t *size) {
  (void)ctx;
  int f = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (f < 0) return errno_or_io();
  struct stat sb;
  int e = fstat(f, &sb) != 0 ? errno_or_io() : S_ISDIR(sb.st_mode) ? EISDIR : !S_ISREG(sb.st_mode) ? ENODEV : 0;
  if (e) {
    close(f);
    return e;
  }
  *fd = f;
  *size = (uint64_t)sb.st_size;
  return 0;
}

static int posix_read(void *ctx, int fd, void *buf, size_t n, uint64_t off, size_t *got) {
  (void)ctx;
  size_t done = 0;
  while (done < n) {
    ssize_t r = pread(fd, (char *)buf + done, n - done, (off_t)(off + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return errno_or_io();
    if (r == 0) break; /* end of file */
    done += (size_t)r;
  }
  *got = done;
  return 0;
}

static int posix_map(void *ctx, int fd, uint64_t size, const void **addr) {
  (void)ctx;
  if (size == 0 || size > (uint64_t)SIZE_MAX) return ENOTSUP;
  void *p = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (p == MAP_FAILED) return errno_or_io();
  *addr = p;
  return 0;
}

static int posix_unmap(void *ctx, const void *addr, uint64_t size) {
  (void)ctx;
  return munmap((void *)(uintptr_t)addr, (size_t)size) == 0 ? 0 : errno_or_io();
}

static ks_io_kind kind_of(mode_t m) {
  if (S_ISREG(m)) return KS_IO_FILE;
  if (S_ISDIR(m)) return KS_IO_DIR;
  return S_ISLNK(m) ? KS_IO_LINK : KS_IO_OTHER;
}

static int posix_stat(void *ctx, const char *path, ks_io_stat *st) {
  (void)ctx;
  struct stat sb;
  if (lstat(path, &sb) != 0) return errno_or_io();
  st->kind = kind_of(sb.st_mode);
  st->size = (uint64_t)sb.st_size;
  return 0;
}

/* d_type when the file system gives it, else lstat (DT_UNKNOWN on some file systems). */
static ks_io_kind entry_kind(const char *dir, const struct dirent *de) {
  switch (de->d_type) {
  case DT_REG: return KS_IO_FILE;
  case DT_DIR: return KS_IO_DIR;
  case DT_LNK: return KS_IO_LINK;
  case DT_UNKNOWN: break;
  default: return KS_IO_OTHER;
  }
  char path[4096];
  ks_io_stat st;
  if (snprintf(path, sizeof path, "%s/%s", dir, de->d_name) >= (int)sizeof path) return KS_IO_OTHER;
  return posix_stat(NULL, path, &st) == 0 ? st.kind : KS_IO_OTHER;
}

static int posix_list(void *ctx, const char *dir, const char *prefix, ks_io_list_cb cb, void *cb_ctx) {
  (void)ctx;
  DIR *d = opendir(dir);
  if (!d) return errno_or_io();
  size_t plen = prefix ? strlen(prefix) : 0;
  int rc = 0;
  for (;;) {
    errno = 0;
    struct dirent *de = readdir(d);
    if (!de) {
      rc = errno; /* 0 at the end, else the read error */
      break;
    }
    if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") || strncmp(de->d_name, prefix ? prefix : "", plen))
      continue;
    if ((rc = cb(cb_ctx, de->d_name, entry_kind(dir, de))) != 0) break;
  }
  closedir(d);
  return rc;
}

static int posix_mkdir(void *ctx, const char *path) {
  (void)ctx;
  return mkdir(path, 0777) == 0 ? 0 : errno_or_io();
}

static int posix_symlink(void *ctx, const char *target, const char *path) {
  (void)ctx;
  return symlink(target, path) == 0 ? 0 : errno_or_io();
}

static int posix_readlink(void *ctx, const char *path, char *buf, size_t cap, size_t *len) {
  (void)ctx;
  if (cap == 0) return ENAMETOOLONG;
  ssize_t n = readlink(path, buf, cap);
  if (n < 0) return errno_or_io();
  if ((size_t)n >= cap) return ENAMETOOLONG;
  buf[n] = '\0';
  *len = (size_t)n;
  return 0;
}

static int posix_rmdir(void *ctx, const char *path) {
  (void)ctx;
  return rmdir(path) == 0 ? 0 : errno_or_io();
}

/* Reads what the holder recorded (best effort: a holder may be writing it right now). */
static void read_holder(int fd, char *holder, size_t cap) {
  if (!holder || !cap) return;
  ssize_t n = pread(fd, holder, cap - 1, 0);
  size_t len = n > 0 ? (size_t)n : 0;
  while (len && (holder[len - 1] == '\n' || holder[len - 1] == '\0')) len--;
  holder[len] = '\0';
}

/* An flock on a lock file that is never removed: unlinking would let a third process lock a
 * fresh inode while the second still holds the old one. The kernel drops the lock with the
 * holder, so a killed run never blocks the next. */
static int posix_lock(void *ctx, const char *path, const char *owner, int *handle, char *holder, size_t cap) {
  (void)ctx;
  if (holder && cap) holder[0] = '\0';
  int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0666);
  if (fd < 0) return errno_or_io();
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int e = errno == EWOULDBLOCK ? EWOULDBLOCK : errno_or_io();
    if (e == EWOULDBLOCK) read_holder(fd, holder, cap);
    close(fd);
    return e;
  }
  size_t n = owner ? strlen(owner) : 0;
  if (ftruncate(fd, 0) != 0 || (n && pwrite(fd, owner, n, 0) != (ssize_t)n)) {
    int e = errno_or_io();
    close(fd);
    return e;
  }
  *handle = fd;
  return 0;
}

static int posix_unlock(void *ctx, int handle) {
  (void)ctx;
  return close(handle) == 0 ? 0 : errno_or_io();
}

unsigned ks_io_caps(const ks_io *io) {
  if (!io) io = ks_io_posix();
  return io->version >= 4 ? io->caps : 0;
}

const ks_io *ks_io_posix(void) {
  static const ks_io io = {.version = KS_IO_VERSION, .ctx = NULL, .create_fn = posix_create,
                           .write_fn = posix_write, .fsync_fn = posix_fsync, .close_fn = posix_close,
                           .rename_fn = posix_rename, .unlink_fn = posix_unlink, .fsync_dir_fn = posix_fsync_dir,
                           .open_fn = posix_open, .read_fn = posix_read, .map_fn = posix_map,
                           .unmap_fn = posix_unmap, .stat_fn = posix_stat, .list_fn = posix_list,
                           .mkdir_fn = posix_mkdir, .symlink_fn = posix_symlink, .readlink_fn = posix_readlink,
                           .rmdir_fn = posix_rmdir, .caps = KS_IO_CAP_LOCAL | KS_IO_CAP_LOCK | KS_IO_CAP_MAP,
                           .lock_fn = posix_lock, .unlock_fn = posix_unlock, .pwrite_fn = posix_pwrite};
  return &io;
}

static int nosync_fsync(void *ctx, int fd) {
  (void)ctx;
  (void)fd;
  return 0;
}

static int nosync_fsync_dir(void *ctx, const char *dir) {
  (void)ctx;
  (void)dir;
  return 0;
}

/* A constant table, so it needs no initialisation and is safe from any thread. */
const ks_io *ks__io_posix_nosync(void) {
  static const ks_io io = {.version = KS_IO_VERSION, .ctx = NULL, .create_fn = posix_create,
                           .write_fn = posix_write, .fsync_fn = nosync_fsync, .close_fn = posix_close,
                           .rename_fn = posix_rename, .unlink_fn = posix_unlink, .fsync_dir_fn = nosync_fsync_dir,
                           .open_fn = posix_open, .read_fn = posix_read, .map_fn = posix_map,
                           .unmap_fn = posix_unmap, .stat_fn = posix_stat, .list_fn = posix_list,
                           .mkdir_fn = posix_mkdir, .symlink_fn = posix_symlink, .readlink_fn = posix_readlink,
                           .rmdir_fn = posix_rmdir,
                           .caps = KS_IO_CAP_LOCAL | KS_IO_CAP_LOCK | KS_IO_CAP_MAP | KS__IO_CAP_NO_FSYNC,
                           .lock_fn = posix_lock, .unlock_fn = posix_unlock, .pwrite_fn = posix_pwrite};
  return &io;
}
