/* Destinations for the torch writer: memory, or a file replaced atomically and durably. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "torch/torch_internal.h"

typedef struct membuf {
  const ks_allocator *a;
  uint8_t *p;
  size_t n, cap;
} membuf;

static ks_status mem_write(void *ctx, const void *p, size_t n) {
  membuf *m = ctx;
  size_t need;
  if (!ks__add_size(m->n, n, &need)) return KS_E_LIMIT;
  if (need > m->cap) {
    size_t ncap = m->cap ? m->cap : 4096;
    while (ncap < need) ncap = ncap > SIZE_MAX / 2 ? need : ncap * 2;
    uint8_t *b = ks__realloc(m->a, m->p, ncap);
    if (!b) return KS_E_NOMEM;
    m->p = b;
    m->cap = ncap;
  }
  memcpy(m->p + m->n, p, n);
  m->n += n;
  return KS_OK;
}

ks_status ks_torch_save_buffer(const ks_statedict *sd, const ks_torch_write_opts *opts, void **out, size_t *out_len,
                               ks_error *err) {
  if (!sd || !out || !out_len) return ks__err(err, KS_E_INVALID, "torch: NULL argument");
  ks_error_clear(err);
  membuf m = {ks__alloc_or_default(opts ? opts->alloc : NULL), NULL, 0, 0};
  ks_status st = ks__pt_write(sd, opts, mem_write, &m, err);
  if (st) {
    ks__free(m.a, m.p);
    return st;
  }
  *out = m.p;
  *out_len = m.n;
  return KS_OK;
}

static ks_status fd_write(void *ctx, const void *p, size_t n) {
  int fd = *(int *)ctx;
  const uint8_t *b = p;
  while (n) {
    ssize_t w = write(fd, b, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return KS_E_IO;
    b += w;
    n -= (size_t)w;
  }
  return KS_OK;
}

static ks_status sync_dir(const char *path) {
  char dir[4096];
  const char *slash = strrchr(path, '/');
  if (!slash) snprintf(dir, sizeof dir, ".");
  else if (slash == path) snprintf(dir, sizeof dir, "/");
  else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return KS_E_IO;
  int rc = fsync(fd);
  close(fd);
  return rc ? KS_E_IO : KS_OK;
}

static ks_status finish_file(int fd, const char *tmp, const char *path, int no_fsync, ks_error *err) {
  if (!no_fsync && fsync(fd) != 0) {
    ks__err_at(err, KS_E_IO, tmp, NULL, -1, "fsync failed: %s", strerror(errno));
    close(fd);
    return KS_E_IO;
  }
  if (close(fd) != 0) return ks__err_at(err, KS_E_IO, tmp, NULL, -1, "close failed: %s", strerror(errno));
  if (rename(tmp, path) != 0) return ks__err_at(err, KS_E_IO, path, NULL, -1, "rename failed: %s", strerror(errno));
  if (!no_fsync && sync_dir(path)) return ks__err_at(err, KS_E_IO, path, NULL, -1, "fsync of the directory failed");
  return KS_OK;
}

/* Creates <dir>/.<name>.tmp-<pid>-<n> exclusively, with the mode a new file normally gets. */
static int create_temp(const char *path, char *tmp, size_t cap) {
  const char *slash = strrchr(path, '/');
  int dl = slash ? (int)(slash - path + 1) : 0;
  for (unsigned n = 0; n < 100; n++) {
    snprintf(tmp, cap, "%.*s.%s.tmp-%ld-%u", dl, path, path + dl, (long)getpid(), n);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  return -1;
}

ks_status ks_torch_save(const char *path, const ks_statedict *sd, const ks_torch_write_opts *opts, ks_error *err) {
  if (!path || !sd) return ks__err(err, KS_E_INVALID, "torch: NULL argument");
  ks_error_clear(err);
  char tmp[4200];
  if (strlen(path) > 4000) return ks__err(err, KS_E_INVALID, "torch: path too long");
  int fd = create_temp(path, tmp, sizeof tmp);
  if (fd < 0) return ks__err_at(err, KS_E_IO, path, NULL, -1, "cannot create a temporary file: %s", strerror(errno));
  ks_status st = ks__pt_write(sd, opts, fd_write, &fd, err);
  if (st) {
    close(fd);
  } else {
    st = finish_file(fd, tmp, path, opts && opts->no_fsync, err);
    if (st == KS_OK) return KS_OK;
  }
  unlink(tmp);
  ks__err_set_file(err, path);
  return st;
}
