/* Whole-file mapping or copy through a ks_io table, with one failure classification (fmap.h). */
#include "core/fmap.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>

#include "core/io_ops.h"

static KS_NODISCARD ks_status io_err(const ks_io *io, const char *path, const char *what, int rc, ks_error *err) {
  char why[KS__IO_WHY_MAX];
  return ks__err_at(err, KS_E_IO, path, NULL, -1, "%s: %s", what, ks__io_why(io, rc, why, sizeof why));
}

/*
 * A large copy is dominated by first-touch page faults, not by read(): asking
 * for transparent huge pages over the buffer cuts the faults 512-fold where the
 * kernel allows it (a hint only; harmless where it does not).
 */
void ks__advise_huge(void *p, size_t size) {
#ifdef MADV_HUGEPAGE
  const uintptr_t huge = (uintptr_t)2 << 20;
  uintptr_t begin = ((uintptr_t)p + huge - 1) & ~(huge - 1), end = ((uintptr_t)p + size) & ~(huge - 1);
  if (end > begin) madvise((void *)begin, end - begin, MADV_HUGEPAGE);
#else
  (void)p;
  (void)size;
#endif
}

static KS_NODISCARD ks_status read_whole(ks__fmap *m, const char *path, int fd, size_t size, const ks_allocator *a,
                            ks_error *err) {
  m->copy = ks__malloc(a, size ? size : 1);
  if (!m->copy) return ks__err_at(err, KS_E_NOMEM, path, NULL, -1, "out of memory for %zu bytes", size);
  ks__advise_huge(m->copy, size);
  size_t got = 0;
  while (got < size) {
    size_t want = size - got < ((size_t)1 << 30) ? size - got : ((size_t)1 << 30), n = 0;
    int rc = m->io->read_fn(m->io->ctx, fd, m->copy + got, want, got, &n);
    if (rc) return io_err(m->io, path, "cannot read file", rc, err);
    if (n == 0) return ks__err_at(err, KS_E_IO, path, NULL, (int64_t)got, "file shrank while being read");
    got += n;
  }
  m->bytes = m->copy;
  m->size = size;
  return KS_OK;
}

/* A mapping when the table can map; ENOTSUP (or no map_fn) falls back to one copy. */
static KS_NODISCARD ks_status map_whole(ks__fmap *m, const char *path, int fd, size_t size, const ks_allocator *a,
                           ks_error *err) {
  const void *p = NULL;
  int rc = m->io->map_fn ? m->io->map_fn(m->io->ctx, fd, size, &p) : ENOTSUP;
  if (rc == ENOTSUP) return read_whole(m, path, fd, size, a, err);
  if (rc) return io_err(m->io, path, "cannot map file", rc, err);
  m->map = (void *)(uintptr_t)p;
  m->map_len = size;
  m->bytes = p;
  m->size = size;
  return KS_OK;
}

ks_status ks__fmap_open(ks__fmap *m, const char *path, const ks_io *io, bool copy, size_t min_map,
                        const ks_allocator *a, ks_error *err) {
  memset(m, 0, sizeof *m);
  ks_status s = ks_io_check(io, err);
  if (s) return s;
  m->io = ks__io_v2(io);
  int fd = -1;
  uint64_t size = 0;
  int rc = ks__io_open_follow(m->io, path, &fd, &size); /* a run's `latest` moving on is followed */
  if (rc == EISDIR || rc == ENODEV) return ks__err_at(err, KS_E_IO, path, NULL, -1, "not a regular file");
  if (rc) return io_err(m->io, path, "cannot open file", rc, err);
  if (size > SIZE_MAX)
    s = ks__err_at(err, KS_E_LIMIT, path, NULL, -1, "file too large for this platform");
  else if (!copy && (size_t)size >= min_map && size > 0)
    s = map_whole(m, path, fd, (size_t)size, a, err);
  else
    s = read_whole(m, path, fd, (size_t)size, a, err);
  m->io->close_fn(m->io->ctx, fd); /* read-only: nothing a failed close could lose */
  if (s) ks__fmap_close(m, a);
  return s;
}

void ks__fmap_close(ks__fmap *m, const ks_allocator *a) {
  if (m->map) m->io->unmap_fn(m->io->ctx, m->map, m->map_len); /* a failed unmap leaves nothing to do */
  ks__free(a, m->copy);
  memset(m, 0, sizeof *m);
}
