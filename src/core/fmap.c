/* Whole-file mapping or copy with one failure classification (fmap.h). */
#include "core/fmap.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static ks_status io_err(const char *path, const char *what, ks_error *err) {
  return ks__err_at(err, KS_E_IO, path, NULL, -1, "%s: %s", what, strerror(errno ? errno : EIO));
}

/*
 * A large copy is dominated by first-touch page faults, not by read(): asking
 * for transparent huge pages over the buffer cuts the faults 512-fold where the
 * kernel allows it (a hint only; harmless where it does not).
 */
static void advise_huge(void *p, size_t size) {
#ifdef MADV_HUGEPAGE
  const uintptr_t huge = (uintptr_t)2 << 20;
  uintptr_t begin = ((uintptr_t)p + huge - 1) & ~(huge - 1), end = ((uintptr_t)p + size) & ~(huge - 1);
  if (end > begin) madvise((void *)begin, end - begin, MADV_HUGEPAGE);
#else
  (void)p;
  (void)size;
#endif
}

static ks_status read_whole(ks__fmap *m, const char *path, int fd, size_t size, const ks_allocator *a,
                            ks_error *err) {
  m->copy = ks__malloc(a, size ? size : 1);
  if (!m->copy) return ks__err_at(err, KS_E_NOMEM, path, NULL, -1, "out of memory for %zu bytes", size);
  advise_huge(m->copy, size);
  size_t got = 0;
  while (got < size) {
    size_t want = size - got < ((size_t)1 << 30) ? size - got : ((size_t)1 << 30);
    ssize_t n = read(fd, m->copy + got, want);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return io_err(path, "cannot read file", err);
    if (n == 0) return ks__err_at(err, KS_E_IO, path, NULL, (int64_t)got, "file shrank while being read");
    got += (size_t)n;
  }
  m->bytes = m->copy;
  m->size = size;
  return KS_OK;
}

static ks_status map_whole(ks__fmap *m, const char *path, int fd, size_t size, ks_error *err) {
  void *p = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (p == MAP_FAILED) return io_err(path, "cannot map file", err);
  m->map = p;
  m->map_len = size;
  m->bytes = p;
  m->size = size;
  return KS_OK;
}

ks_status ks__fmap_open(ks__fmap *m, const char *path, bool copy, size_t min_map, const ks_allocator *a,
                        ks_error *err) {
  memset(m, 0, sizeof *m);
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return io_err(path, "cannot open file", err);
  struct stat st;
  ks_status s;
  if (fstat(fd, &st) != 0)
    s = io_err(path, "cannot stat file", err);
  else if (!S_ISREG(st.st_mode))
    s = ks__err_at(err, KS_E_IO, path, NULL, -1, "not a regular file");
  else if (st.st_size < 0 || (uint64_t)st.st_size > SIZE_MAX)
    s = ks__err_at(err, KS_E_LIMIT, path, NULL, -1, "file too large for this platform");
  else if (!copy && (size_t)st.st_size >= min_map && st.st_size > 0)
    s = map_whole(m, path, fd, (size_t)st.st_size, err);
  else
    s = read_whole(m, path, fd, (size_t)st.st_size, a, err);
  close(fd);
  if (s) ks__fmap_close(m, a);
  return s;
}

void ks__fmap_close(ks__fmap *m, const ks_allocator *a) {
  if (m->map) munmap(m->map, m->map_len);
  ks__free(a, m->copy);
  memset(m, 0, sizeof *m);
}
