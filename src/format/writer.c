/*
 * ks_save: atomic, durable, streaming write of a state dict.
 *
 * Every allocation happens before the temporary file exists, so running out of
 * memory never touches the disk. Tensor bytes go straight from the state dict
 * to write(); only small tensors are gathered in a staging buffer so that a
 * file of 100,000 tiny tensors does not cost 100,000 system calls.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "format/fmt_internal.h"

#define STAGE_CAP ((size_t)1 << 20)
#define MAX_WRITE ((size_t)1 << 30)
#define TMP_ATTEMPTS 64

typedef struct save_ctx {
  const ks_allocator *alloc;
  const ks_io *io;
  const char *path;
  char *dir, *tmp;
  size_t tmp_suffix; /* where the random suffix of tmp starts */
  int fd;
  bool have_fd, have_tmp;
  uint8_t *stage;
  size_t stage_len, stage_cap;
  ks_error *err;
} save_ctx;

static ks_status io_fail(save_ctx *c, int rc, const char *what) {
  return ks__err_at(c->err, KS_E_IO, c->path, NULL, -1, "%s '%s': %s", what, c->have_tmp ? c->tmp : c->path,
                    strerror(rc));
}

/* Splits path into its directory and "<dir>/.<name>.tmp-<6 random characters>". */
static ks_status make_paths(save_ctx *c) {
  const char *slash = strrchr(c->path, '/');
  const char *base = slash ? slash + 1 : c->path;
  if (!*base) return ks__err_at(c->err, KS_E_INVALID, c->path, NULL, -1, "path names a directory, not a file");
  size_t dlen = slash ? (size_t)(slash - c->path) : 1;
  c->dir = slash ? ks__strndup(c->alloc, c->path, dlen ? dlen : 1) : ks__strdup(c->alloc, ".");
  size_t cap = dlen + strlen(base) + 16;
  c->tmp = ks__malloc(c->alloc, cap);
  if (!c->dir || !c->tmp) return ks__err(c->err, KS_E_NOMEM, "out of memory");
  int n = snprintf(c->tmp, cap, "%.*s/.%s.tmp-", (int)dlen, slash ? c->path : ".", base);
  c->tmp_suffix = (size_t)n;
  return KS_OK;
}

static uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

static void random_suffix(save_ctx *c, unsigned attempt) {
  static const char chars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  uint64_t r = splitmix64((uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ ((uint64_t)getpid() << 12) ^
                          (uint64_t)(uintptr_t)c ^ attempt);
  char *s = c->tmp + c->tmp_suffix;
  for (int i = 0; i < 6; i++, r /= 62) s[i] = chars[r % 62];
  s[6] = '\0';
}

static ks_status create_tmp(save_ctx *c) {
  for (unsigned attempt = 0; attempt < TMP_ATTEMPTS; attempt++) {
    random_suffix(c, attempt);
    int rc = c->io->create_fn(c->io->ctx, c->tmp, &c->fd);
    if (rc == EEXIST) continue;
    if (rc) return io_fail(c, rc, "cannot create temporary file");
    c->have_fd = c->have_tmp = true;
    return KS_OK;
  }
  return io_fail(c, EEXIST, "cannot find a free temporary name like");
}

static ks_status write_all(save_ctx *c, const void *p, size_t n) {
  const uint8_t *b = p;
  while (n > 0) {
    size_t w = 0;
    int rc = c->io->write_fn(c->io->ctx, c->fd, b, n < MAX_WRITE ? n : MAX_WRITE, &w);
    if (!rc && w == 0) rc = EIO; /* no progress and no error: never spin */
    if (rc) return io_fail(c, rc, "cannot write temporary file");
    b += w;
    n -= w;
  }
  return KS_OK;
}

static ks_status flush_stage(save_ctx *c) {
  ks_status st = write_all(c, c->stage, c->stage_len);
  c->stage_len = 0;
  return st;
}

static ks_status put_data(save_ctx *c, const void *p, size_t n) {
  ks_status st = KS_OK;
  if (c->stage_len + n > c->stage_cap && (st = flush_stage(c)) != KS_OK) return st;
  if (n >= c->stage_cap) return write_all(c, p, n);
  if (n) memcpy(c->stage + c->stage_len, p, n);
  c->stage_len += n;
  return KS_OK;
}

static ks_status write_body(save_ctx *c, const ks__sbuf *hdr, const ks_statedict *sd) {
  ks_status st = write_all(c, hdr->p, hdr->len);
  for (size_t i = 0; !st && i < ks_statedict_count(sd); i++) {
    ks_entry e;
    ks_statedict_at(sd, i, &e);
    if (e.kind == KS_VAL_TENSOR) st = put_data(c, e.tensor.data, e.tensor.nbytes);
  }
  return st ? st : flush_stage(c);
}

/* fsync, close and rename: after this the new file is in place. */
static ks_status commit(save_ctx *c, int no_fsync) {
  int rc = no_fsync ? 0 : c->io->fsync_fn(c->io->ctx, c->fd);
  if (rc) return io_fail(c, rc, "cannot fsync temporary file");
  c->have_fd = false;
  if ((rc = c->io->close_fn(c->io->ctx, c->fd)) != 0) return io_fail(c, rc, "cannot close temporary file");
  if ((rc = c->io->rename_fn(c->io->ctx, c->tmp, c->path)) != 0)
    return io_fail(c, rc, "cannot rename into place temporary file");
  c->have_tmp = false;
  if (!no_fsync && (rc = c->io->fsync_dir_fn(c->io->ctx, c->dir)) != 0)
    return ks__err_at(c->err, KS_E_IO, c->path, NULL, -1,
                      "file saved, but fsync of directory '%s' failed (%s): durability unknown", c->dir,
                      strerror(rc));
  return KS_OK;
}

static void cleanup(save_ctx *c) {
  if (c->have_fd) c->io->close_fn(c->io->ctx, c->fd);
  if (c->have_tmp) c->io->unlink_fn(c->io->ctx, c->tmp);
  ks__free(c->alloc, c->stage);
  ks__free(c->alloc, c->dir);
  ks__free(c->alloc, c->tmp);
}

ks_status ks_save(const char *path, const ks_statedict *sd, const ks_meta *extra, const ks_save_opts *opts,
                  ks_error *err) {
  ks_error_clear(err);
  if (!path || !*path || !sd) return ks__err(err, KS_E_INVALID, "ks_save: path and state dict are required");
  save_ctx c = {0};
  c.alloc = opts ? opts->alloc : NULL;
  c.io = opts && opts->io ? opts->io : ks_io_posix();
  c.path = path;
  c.err = err;
  ks__sbuf hdr;
  ks__sbuf_init(&hdr, c.alloc);
  uint64_t data_len = 0;
  ks_status st = ks__build_header(sd, extra, c.alloc, &hdr, &data_len, err);
  if (!st) st = make_paths(&c);
  c.stage_cap = data_len < STAGE_CAP ? (size_t)data_len + 1 : STAGE_CAP;
  if (!st && !(c.stage = ks__malloc(c.alloc, c.stage_cap))) st = ks__err(err, KS_E_NOMEM, "out of memory");
  if (!st) st = create_tmp(&c);
  if (!st) st = write_body(&c, &hdr, sd);
  if (!st) st = commit(&c, opts ? opts->no_fsync : 0);
  if (st) ks__err_set_file(err, path);
  cleanup(&c);
  ks__sbuf_free(&hdr);
  return st;
}
