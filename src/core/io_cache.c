/*
 * The caching table (io_cache.h): handles of the inner table are wrapped in
 * slots so a read knows the path and size it belongs to; a read is assembled
 * from the verified piece files (io_cache_piece.c) that cover it, and only the
 * gaps between them are forwarded and kept as new pieces.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "core/durable.h"
#include "core/io_cache.h"

#define CC(ctx) ((ks__cache *)(ctx))

/* ---- slots ---- */

static int new_slot(ks__cache *c, int fd, int *h) {
  pthread_mutex_lock(&c->lock);
  size_t i = 0;
  while (i < c->n_slots && c->slots[i].used) i++;
  if (i == c->n_slots && ks__grow(&c->alloc, &c->slots, &c->cap_slots, c->n_slots + 1, sizeof *c->slots)) {
    pthread_mutex_unlock(&c->lock);
    return ENOMEM;
  }
  if (i == c->n_slots) c->n_slots++;
  if (i > (size_t)INT32_MAX) {
    pthread_mutex_unlock(&c->lock);
    return EMFILE;
  }
  c->slots[i] = (ks__cache_slot){.used = true, .fd = fd};
  *h = (int)i;
  pthread_mutex_unlock(&c->lock);
  return 0;
}

/* The slot of handle h, or NULL; call with the lock held. */
static ks__cache_slot *slot_of(ks__cache *c, int h) {
  return h >= 0 && (size_t)h < c->n_slots && c->slots[h].used ? &c->slots[h] : NULL;
}

static void slot_clear(ks__cache *c, ks__cache_slot *s) {
  ks__free(&c->alloc, s->path);
  ks__free(&c->alloc, s->dir);
  ks__free(&c->alloc, s->ident);
  ks__free(&c->alloc, s->pieces);
  *s = (ks__cache_slot){0};
}

/* The inner handle of h (-1 when h is not open). */
static int inner_fd(ks__cache *c, int h) {
  pthread_mutex_lock(&c->lock);
  ks__cache_slot *s = slot_of(c, h);
  int fd = s ? s->fd : -1;
  pthread_mutex_unlock(&c->lock);
  return fd;
}

/* ---- forwarded operations ---- */

static int k_create(void *ctx, const char *path, int *h) {
  int fd, rc = CC(ctx)->v1->create_fn(CC(ctx)->v1->ctx, path, &fd);
  if (rc) return rc;
  if ((rc = new_slot(CC(ctx), fd, h)) != 0) CC(ctx)->v1->close_fn(CC(ctx)->v1->ctx, fd);
  return rc;
}

static int k_write(void *ctx, int h, const void *b, size_t n, size_t *w) {
  int fd = inner_fd(CC(ctx), h);
  return fd < 0 ? EBADF : CC(ctx)->v1->write_fn(CC(ctx)->v1->ctx, fd, b, n, w);
}

/* Set only when the inner table has a pwrite (ks_io_cache_create). */
static int k_pwrite(void *ctx, int h, const void *b, size_t n, uint64_t off, size_t *w) {
  int fd = inner_fd(CC(ctx), h);
  return fd < 0 ? EBADF : CC(ctx)->v1->pwrite_fn(CC(ctx)->v1->ctx, fd, b, n, off, w);
}

static int k_fsync(void *ctx, int h) {
  int fd = inner_fd(CC(ctx), h);
  return fd < 0 ? EBADF : CC(ctx)->v1->fsync_fn(CC(ctx)->v1->ctx, fd);
}

static int k_close(void *ctx, int h) {
  ks__cache *c = ctx;
  pthread_mutex_lock(&c->lock);
  ks__cache_slot *s = slot_of(c, h);
  int fd = s ? s->fd : -1;
  if (s) slot_clear(c, s);
  pthread_mutex_unlock(&c->lock);
  return fd < 0 ? EBADF : c->v1->close_fn(c->v1->ctx, fd);
}

static int k_rename(void *ctx, const char *from, const char *to) {
  int rc = CC(ctx)->v1->rename_fn(CC(ctx)->v1->ctx, from, to);
  if (!rc) ks__cache_forget(CC(ctx), to); /* `to` names other bytes now */
  return rc;
}

static int k_unlink(void *ctx, const char *path) {
  int rc = CC(ctx)->v1->unlink_fn(CC(ctx)->v1->ctx, path);
  if (!rc) ks__cache_forget(CC(ctx), path);
  return rc;
}

static int k_fsync_dir(void *ctx, const char *d) { return CC(ctx)->v1->fsync_dir_fn(CC(ctx)->v1->ctx, d); }
static int k_stat(void *ctx, const char *p, ks_io_stat *st) { return CC(ctx)->v2->stat_fn(CC(ctx)->v2->ctx, p, st); }
static int k_list(void *ctx, const char *d, const char *pre, ks_io_list_cb cb, void *cc) {
  return CC(ctx)->v2->list_fn(CC(ctx)->v2->ctx, d, pre, cb, cc);
}
static int k_mkdir(void *ctx, const char *p) { return CC(ctx)->v2->mkdir_fn(CC(ctx)->v2->ctx, p); }
static int k_symlink(void *ctx, const char *t, const char *p) {
  return CC(ctx)->v2->symlink_fn(CC(ctx)->v2->ctx, t, p);
}
static int k_readlink(void *ctx, const char *p, char *b, size_t cap, size_t *len) {
  return CC(ctx)->v2->readlink_fn(CC(ctx)->v2->ctx, p, b, cap, len);
}

/* ---- reading ---- */

/* cache_dir/<XXH3 of the path>-<size>[-<XXH3 of the validator>]: the folder of one version of a file. */
static char *file_dir(ks__cache *c, const char *path, uint64_t size, const char *validator) {
  char name[80];
  int w = snprintf(name, sizeof name, "/%016" PRIx64 "-%" PRIu64, ks__hash(path, strlen(path)), size);
  if (validator[0]) snprintf(name + w, sizeof name - (size_t)w, "-%016" PRIx64, ks__hash(validator, strlen(validator)));
  size_t n = strlen(c->dir), m = strlen(name);
  char *d = ks__malloc(&c->alloc, n + m + 1);
  if (d) {
    memcpy(d, c->dir, n);
    memcpy(d + n, name, m + 1);
  }
  return d;
}

/* What the pieces of a version carry: the path, then a NUL and the validator when there is one. */
static char *identity(ks__cache *c, const char *path, const char *validator, size_t *len) {
  size_t pl = strlen(path), vl = strlen(validator);
  *len = vl ? pl + 1 + vl : pl;
  char *id = ks__malloc(&c->alloc, *len + 1);
  if (id) {
    memcpy(id, path, pl + 1);
    if (vl) memcpy(id + pl + 1, validator, vl + 1);
  }
  return id;
}

/* A version seen for the first time (its folder does not exist yet): the pieces of the versions
 * it replaced are never used again, so they go now. */
static void first_sight(ks__cache *c, const char *path, const char *dir) {
  ks_io_stat st;
  if (!ks_io_posix()->stat_fn(NULL, dir, &st)) return;
  ks__cache_forget_others(c, path, strrchr(dir, '/') + 1);
}

/* Every open asks inner (open_fn, then validator_fn): the size and the validator of what the path
 * names now choose the folder of pieces, so an object replaced on the server is never served from
 * the pieces of the one before, whatever its size. */
static int k_open(void *ctx, const char *path, int *h, uint64_t *size) {
  ks__cache *c = ctx;
  int fd, rc = c->v2->open_fn(c->v2->ctx, path, &fd, size);
  if (rc) return rc;
  char validator[KS__CACHE_VALIDATOR_MAX];
  if (ks__io_validator(c->inner, fd, validator, sizeof validator)) validator[0] = '\0';
  size_t il = 0;
  char *p = ks__strdup(&c->alloc, path), *d = file_dir(c, path, *size, validator);
  char *id = identity(c, path, validator, &il);
  if (!p || !d || !id || (rc = new_slot(c, fd, h)) != 0) {
    ks__free(&c->alloc, p);
    ks__free(&c->alloc, d);
    ks__free(&c->alloc, id);
    c->v2->close_fn(c->v2->ctx, fd);
    return rc ? rc : ENOMEM;
  }
  first_sight(c, path, d);
  pthread_mutex_lock(&c->lock);
  ks__cache_slot *s = &c->slots[*h];
  s->reading = true;
  s->path = p;
  s->dir = d;
  s->ident = id;
  s->ident_len = il;
  s->size = *size;
  pthread_mutex_unlock(&c->lock);
  return 0;
}

/* The inner handle's validator: a cache is as good a validator source as the store behind it. */
static int k_validator(void *ctx, int h, char *buf, size_t cap) {
  int fd = inner_fd(CC(ctx), h);
  return fd < 0 ? EBADF : ks__io_validator(CC(ctx)->inner, fd, buf, cap);
}

static size_t k_detail(void *ctx, int rc, char *buf, size_t cap) {
  return ks__io_detail(CC(ctx)->inner, rc, buf, cap);
}

/* The run directory lock is inner's own (an S3 lease): the cache only reads through. */
static int k_lock(void *ctx, const char *path, const char *owner, int *handle, char *holder, size_t cap) {
  const ks_io *in = CC(ctx)->inner;
  return in->lock_fn(in->ctx, path, owner, handle, holder, cap);
}

static int k_unlock(void *ctx, int handle) { return CC(ctx)->inner->unlock_fn(CC(ctx)->inner->ctx, handle); }

/* Forwards a read of `want` bytes (all of them unless the file ended early). */
static int read_inner(ks__cache *c, int fd, uint8_t *buf, size_t want, uint64_t off, size_t *got) {
  size_t done = 0;
  while (done < want) {
    size_t n = 0;
    int rc = c->v2->read_fn(c->v2->ctx, fd, buf + done, want - done, off + done, &n);
    if (rc) return rc;
    if (n == 0) break;
    done += n;
  }
  *got = done;
  return 0;
}

/* Reads part p of q from inner into dst and keeps it as a piece; a short read
   (the file shrank) is returned but not kept. */
static int fill_gap(ks__cache *c, const ks__cache_read *q, const ks__cache_part *p, uint8_t *dst, size_t *got) {
  int rc = read_inner(c, q->fd, dst, p->len, p->off, got);
  if (!rc && *got == p->len) ks__cache_store(c, q, p, dst);
  return rc;
}

/* A read is a hit when no byte of it came from inner, else a miss; bytes are
   counted where they came from (io_cache.h). */
static void count(ks__cache *c, bool inner, uint64_t hit, uint64_t miss) {
  atomic_fetch_add(inner ? &c->miss_reads : &c->hit_reads, 1);
  atomic_fetch_add(&c->hit_bytes, hit);
  atomic_fetch_add(&c->miss_bytes, miss);
}

/* Assembles the read part by part: cached parts from their pieces, the gaps
   (and parts whose piece proved bad) from inner. */
static int k_read(void *ctx, int h, void *buf, size_t n, uint64_t off, size_t *got) {
  ks__cache *c = ctx;
  ks__cache_read q;
  int rc = ks__cache_lookup(c, h, n, off, &q);
  if (rc) return rc;
  *got = 0;
  if (q.want == 0) return 0;
  size_t hit = 0, miss = 0;
  bool inner = false;
  for (size_t i = 0; i < q.n_parts; i++) {
    const ks__cache_part *p = &q.parts[i];
    uint8_t *dst = (uint8_t *)buf + (p->off - off);
    if (p->cached && ks__cache_serve(c, &q, p, dst) == 0) {
      hit += p->len;
      continue;
    }
    size_t g = 0;
    inner = true;
    if ((rc = fill_gap(c, &q, p, dst, &g)) != 0) return rc;
    miss += g;
    if (g < p->len) break; /* the file ended early: what follows is not there */
  }
  count(c, inner, hit, miss);
  *got = hit + miss;
  return 0;
}

/* ---- the table ---- */

static KS_NODISCARD ks_status take_dir(ks__cache *c, const char *dir, ks_error *err) {
  size_t n = strlen(dir);
  while (n > 1 && dir[n - 1] == '/') n--;
  if (n == 0) return ks__err(err, KS_E_INVALID, "ks_io_cache_create: empty cache_dir");
  if (n > 3000) return ks__err(err, KS_E_LIMIT, "ks_io_cache_create: cache_dir path too long");
  if (!(c->dir = ks__strndup(&c->alloc, dir, n))) return ks__err(err, KS_E_NOMEM, "out of memory");
  return ks__io_mkdir_p(ks_io_posix(), c->dir, err);
}

ks_status ks_io_cache_create(const ks_io *inner, const char *cache_dir, const ks_allocator *a, ks_io **out,
                             ks_error *err) {
  ks_error_clear(err);
  if (!cache_dir || !out) return ks__err(err, KS_E_INVALID, "ks_io_cache_create: cache_dir and out are required");
  ks_status s = ks_io_check(inner, err);
  if (s) return s;
  ks__cache *c = ks__calloc(a, 1, sizeof *c);
  if (!c) return ks__err(err, KS_E_NOMEM, "out of memory");
  c->alloc = *ks__alloc_or_default(a);
  c->inner = ks__io_v1(inner);
  c->v1 = ks__io_v1(inner);
  c->v2 = ks__io_v2(inner);
  if ((s = take_dir(c, cache_dir, err)) != KS_OK) {
    ks__free(&c->alloc, c->dir);
    ks__free(&c->alloc, c);
    return s;
  }
  pthread_mutex_init(&c->lock, NULL);
  c->io = (ks_io){.version = KS_IO_VERSION, .ctx = c, .create_fn = k_create, .write_fn = k_write, .fsync_fn = k_fsync,
                  .close_fn = k_close, .rename_fn = k_rename, .unlink_fn = k_unlink, .fsync_dir_fn = k_fsync_dir,
                  .open_fn = k_open, .read_fn = k_read, .stat_fn = k_stat, .list_fn = k_list, .mkdir_fn = k_mkdir,
                  .symlink_fn = k_symlink, .readlink_fn = k_readlink, .validator_fn = k_validator,
                  .detail_fn = k_detail};
  if (ks__io_can_pwrite(inner)) c->io.pwrite_fn = k_pwrite;
  /* What inner is, less what the cache changes: its handles are not file descriptors and it cannot map. */
  unsigned caps = ks_io_caps(inner);
  c->io.caps = caps & KS_IO_CAP_READ_ONLY;
  if (caps & KS_IO_CAP_LOCK) {
    c->io.caps |= KS_IO_CAP_LOCK;
    c->io.lock_fn = k_lock;
    c->io.unlock_fn = k_unlock;
  }
  *out = &c->io;
  return KS_OK;
}

static ks__cache *as_cache(const ks_io *io) { return io && io->open_fn == k_open ? io->ctx : NULL; }

void ks_io_cache_free(ks_io *io) {
  ks__cache *c = as_cache(io);
  if (!c) return;
  for (size_t i = 0; i < c->n_slots; i++) {
    if (!c->slots[i].used) continue;
    c->v1->close_fn(c->v1->ctx, c->slots[i].fd); /* read-only or abandoned: nothing to report */
    slot_clear(c, &c->slots[i]);
  }
  pthread_mutex_destroy(&c->lock);
  ks__free(&c->alloc, c->slots);
  ks__free(&c->alloc, c->dir);
  ks_allocator al = c->alloc;
  ks__free(&al, c);
}

void ks_io_cache_get_stats(const ks_io *io, ks_io_cache_stats *out) {
  ks__cache *c = as_cache(io);
  if (!out) return;
  *out = (ks_io_cache_stats){0};
  if (!c) return;
  out->hit_reads = atomic_load(&c->hit_reads);
  out->hit_bytes = atomic_load(&c->hit_bytes);
  out->miss_reads = atomic_load(&c->miss_reads);
  out->miss_bytes = atomic_load(&c->miss_bytes);
  out->stored = atomic_load(&c->stored);
  out->store_failures = atomic_load(&c->store_failures);
  out->rejected = atomic_load(&c->rejected);
}
