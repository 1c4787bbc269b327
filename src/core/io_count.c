/* The counting table (io_cache.h): every operation forwarded, reads counted atomically. */
#include <errno.h>
#include <stdatomic.h>

#include "core/durable.h"
#include "core/internal.h"
#include "core/io_ops.h"
#include "keepsake/binding.h"
#include "keepsake/io_cache.h"

typedef struct counter {
  ks_io io; /* first: the table handed out */
  ks_allocator alloc;
  const ks_io *v1, *v2; /* inner's tables of each version's operations */
  atomic_uint_least64_t open_calls, read_calls, read_bytes, map_calls;
} counter;

#define C(ctx) ((counter *)(ctx))

static int c_create(void *ctx, const char *path, int *fd) { return C(ctx)->v1->create_fn(C(ctx)->v1->ctx, path, fd); }
static int c_write(void *ctx, int fd, const void *b, size_t n, size_t *w) {
  return C(ctx)->v1->write_fn(C(ctx)->v1->ctx, fd, b, n, w);
}
/* Set only when the inner table has a pwrite (ks_io_counter_create). */
static int c_pwrite(void *ctx, int fd, const void *b, size_t n, uint64_t off, size_t *w) {
  return C(ctx)->v1->pwrite_fn(C(ctx)->v1->ctx, fd, b, n, off, w);
}
static int c_fsync(void *ctx, int fd) { return C(ctx)->v1->fsync_fn(C(ctx)->v1->ctx, fd); }
static int c_close(void *ctx, int fd) { return C(ctx)->v1->close_fn(C(ctx)->v1->ctx, fd); }
static int c_rename(void *ctx, const char *a, const char *b) { return C(ctx)->v1->rename_fn(C(ctx)->v1->ctx, a, b); }
static int c_unlink(void *ctx, const char *p) { return C(ctx)->v1->unlink_fn(C(ctx)->v1->ctx, p); }
static int c_fsync_dir(void *ctx, const char *d) { return C(ctx)->v1->fsync_dir_fn(C(ctx)->v1->ctx, d); }

static int c_open(void *ctx, const char *path, int *fd, uint64_t *size) {
  atomic_fetch_add(&C(ctx)->open_calls, 1);
  return C(ctx)->v2->open_fn(C(ctx)->v2->ctx, path, fd, size);
}

static int c_read(void *ctx, int fd, void *buf, size_t n, uint64_t off, size_t *got) {
  int rc = C(ctx)->v2->read_fn(C(ctx)->v2->ctx, fd, buf, n, off, got);
  atomic_fetch_add(&C(ctx)->read_calls, 1);
  if (!rc) atomic_fetch_add(&C(ctx)->read_bytes, *got);
  return rc;
}

static int c_map(void *ctx, int fd, uint64_t size, const void **addr) {
  const ks_io *in = C(ctx)->v2;
  int rc = in->map_fn ? in->map_fn(in->ctx, fd, size, addr) : ENOTSUP;
  if (!rc) atomic_fetch_add(&C(ctx)->map_calls, 1);
  return rc;
}

static int c_unmap(void *ctx, const void *addr, uint64_t size) {
  return C(ctx)->v2->unmap_fn(C(ctx)->v2->ctx, addr, size);
}
static int c_stat(void *ctx, const char *p, ks_io_stat *st) { return C(ctx)->v2->stat_fn(C(ctx)->v2->ctx, p, st); }
static int c_list(void *ctx, const char *d, const char *pre, ks_io_list_cb cb, void *cc) {
  return C(ctx)->v2->list_fn(C(ctx)->v2->ctx, d, pre, cb, cc);
}
static int c_mkdir(void *ctx, const char *p) { return C(ctx)->v2->mkdir_fn(C(ctx)->v2->ctx, p); }
static int c_symlink(void *ctx, const char *t, const char *p) { return C(ctx)->v2->symlink_fn(C(ctx)->v2->ctx, t, p); }
static int c_readlink(void *ctx, const char *p, char *b, size_t cap, size_t *len) {
  return C(ctx)->v2->readlink_fn(C(ctx)->v2->ctx, p, b, cap, len);
}

static int c_validator(void *ctx, int fd, char *buf, size_t cap) {
  return ks__io_validator(C(ctx)->v1, fd, buf, cap);
}
static size_t c_detail(void *ctx, int rc, char *buf, size_t cap) { return ks__io_detail(C(ctx)->v1, rc, buf, cap); }

ks_status ks_io_counter_create(const ks_io *inner, int no_map, const ks_allocator *a, ks_io **out, ks_error *err) {
  if (!out) return ks__err(err, KS_E_INVALID, "ks_io_counter_create: out is required");
  ks_status s = ks_io_check(inner, err);
  if (s) return s;
  counter *c = ks__calloc(a, 1, sizeof *c);
  if (!c) return ks__err(err, KS_E_NOMEM, "out of memory");
  c->alloc = *ks__alloc_or_default(a);
  c->v1 = ks__io_v1(inner);
  c->v2 = ks__io_v2(inner);
  c->io = (ks_io){.version = KS_IO_VERSION, .ctx = c, .create_fn = c_create, .write_fn = c_write, .fsync_fn = c_fsync,
                  .close_fn = c_close, .rename_fn = c_rename, .unlink_fn = c_unlink, .fsync_dir_fn = c_fsync_dir,
                  .open_fn = c_open, .read_fn = c_read, .stat_fn = c_stat, .list_fn = c_list, .mkdir_fn = c_mkdir,
                  .symlink_fn = c_symlink, .readlink_fn = c_readlink, .validator_fn = c_validator,
                  .detail_fn = c_detail};
  if (ks__io_can_pwrite(inner)) c->io.pwrite_fn = c_pwrite;
  if (!no_map && c->v2->map_fn) {
    c->io.map_fn = c_map;
    c->io.unmap_fn = c_unmap;
  }
  atomic_init(&c->open_calls, 0);
  atomic_init(&c->read_calls, 0);
  atomic_init(&c->read_bytes, 0);
  atomic_init(&c->map_calls, 0);
  *out = &c->io;
  return KS_OK;
}

static counter *as_counter(const ks_io *io) { return io && io->open_fn == c_open ? io->ctx : NULL; }

void ks_io_counter_get(const ks_io *io, ks_io_counts *out) {
  counter *c = as_counter(io);
  if (!out) return;
  *out = (ks_io_counts){0};
  if (!c) return;
  out->open_calls = atomic_load(&c->open_calls);
  out->read_calls = atomic_load(&c->read_calls);
  out->read_bytes = atomic_load(&c->read_bytes);
  out->map_calls = atomic_load(&c->map_calls);
}

void ks_io_counter_reset(const ks_io *io) {
  counter *c = as_counter(io);
  if (!c) return;
  atomic_store(&c->open_calls, 0);
  atomic_store(&c->read_calls, 0);
  atomic_store(&c->read_bytes, 0);
  atomic_store(&c->map_calls, 0);
}

void ks_io_counter_free(ks_io *io) {
  counter *c = as_counter(io);
  if (!c) return;
  ks_allocator a = c->alloc;
  ks__free(&a, c);
}
