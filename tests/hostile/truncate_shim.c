/*
 * LD_PRELOAD shim of tests/hostile/shard_truncate.py: "another process" truncates a file at the
 * worst moment, deterministically. The file is the one whose path is $KS_SHIM_TRUNCATE; it is cut
 * to 4096 bytes once, either
 *   - right after a program maps it (mmap of its descriptor): touching the mapping past the new
 *     end then raises SIGBUS, what a reader that maps an input risks; or
 *   - right before a read (pread) that reaches past its first 64 KiB: a reader that reads gets a
 *     short read, which it must report as an error.
 * Each truncation is logged as a line to $KS_SHIM_LOG ("mmap" or "pread").
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>

#define CUT 4096
#define READ_LIMIT (64 << 10)

typedef void *(*mmap_fn)(void *, size_t, int, int, int, off_t);
typedef ssize_t (*pread_fn)(int, void *, size_t, off_t);

static int done;

/* The next definition of `name` after this shim (dlsym returns an object pointer; ISO C has no cast). */
static void next(const char *name, void *fn, size_t size) {
  void *p = dlsym(RTLD_NEXT, name);
  if (!p) abort();
  memcpy(fn, &p, size);
}

static int is_target(int fd) {
  const char *want = getenv("KS_SHIM_TRUNCATE");
  char link[64], path[PATH_MAX];
  if (done || fd < 0 || !want) return 0;
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, path, sizeof path - 1);
  if (n <= 0) return 0;
  path[n] = '\0';
  return !strcmp(path, want);
}

static void cut(const char *how) {
  const char *want = getenv("KS_SHIM_TRUNCATE"), *log = getenv("KS_SHIM_LOG");
  done = 1;
  if (truncate(want, CUT)) abort();
  FILE *f = log ? fopen(log, "a") : NULL;
  if (f) {
    fprintf(f, "%s\n", how);
    fclose(f);
  }
}

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
  static mmap_fn real;
  if (!real) next("mmap", &real, sizeof real);
  void *p = real(addr, len, prot, flags, fd, off);
  if (p != MAP_FAILED && is_target(fd)) cut("mmap");
  return p;
}

void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
  return mmap(addr, len, prot, flags, fd, off);
}

ssize_t pread(int fd, void *buf, size_t n, off_t off) {
  static pread_fn real;
  if (!real) next("pread", &real, sizeof real);
  if (off >= 0 && (size_t)off + n > READ_LIMIT && is_target(fd)) cut("pread");
  return real(fd, buf, n, off);
}

ssize_t pread64(int fd, void *buf, size_t n, off_t off) { return pread(fd, buf, n, off); }
