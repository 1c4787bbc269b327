/*
 * Piece files of the caching table (layout in io_cache.h). They live on the
 * local disk and go through ks_io_posix(); new ones are written with the
 * durable replace, so a crash leaves either no piece or a whole one, and any
 * other damage is caught by the checks before a byte of a piece is used.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "core/durable.h"
#include "core/io_cache.h"

#include <xxhash.h>

#define MAGIC "KSCACHE1"
#define HDR 48u
#define NAME_LEN 33u /* 16 hex digits, '-', 16 hex digits */

static const ks_io *local(void) { return ks_io_posix(); }

/* dir/<off>-<len> into out (PATH cap 4096); false when too long. */
static bool piece_path(const char *dir, uint64_t off, uint64_t len, char *out, size_t cap) {
  int n = snprintf(out, cap, "%s/%016" PRIx64 "-%016" PRIx64, dir, off, len);
  return n > 0 && (size_t)n < cap;
}

static int hexval(char ch) {
  if (ch >= '0' && ch <= '9') return ch - '0';
  if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
  return -1;
}

static bool parse_hex16(const char *s, uint64_t *v) {
  *v = 0;
  for (int i = 0; i < 16; i++) {
    int d = hexval(s[i]);
    if (d < 0) return false;
    *v = *v << 4 | (uint64_t)d;
  }
  return true;
}

typedef struct list_ctx {
  ks__cache *c;
  ks__cache_slot *s;
} list_ctx;

/* One name of a piece folder: "<off>-<len>" becomes a piece (unverified); others are ignored. */
static int on_piece(void *ctx, const char *name, ks_io_kind kind) {
  list_ctx *l = ctx;
  uint64_t off, len;
  if (kind != KS_IO_FILE || strlen(name) != NAME_LEN || name[16] != '-' || !parse_hex16(name, &off) ||
      !parse_hex16(name + 17, &len) || len == 0 || off > l->s->size || len > l->s->size - off)
    return 0;
  ks__cache_slot *s = l->s;
  if (ks__grow(&l->c->alloc, &s->pieces, &s->cap_pieces, s->n_pieces + 1, sizeof *s->pieces)) return 0;
  s->pieces[s->n_pieces++] = (ks__cache_piece){off, len, false};
  return 0;
}

int ks__cache_lookup(ks__cache *c, int h, size_t n, uint64_t off, ks__cache_read *q) {
  pthread_mutex_lock(&c->lock);
  ks__cache_slot *s = h >= 0 && (size_t)h < c->n_slots && c->slots[h].used ? &c->slots[h] : NULL;
  if (!s || !s->reading) {
    pthread_mutex_unlock(&c->lock);
    return EBADF;
  }
  if (!s->listed) { /* a missing folder (nothing cached yet) is an empty list */
    list_ctx l = {c, s};
    local()->list_fn(local()->ctx, s->dir, "", on_piece, &l);
    s->listed = true;
  }
  *q = (ks__cache_read){.h = h, .fd = s->fd, .path = s->path, .dir = s->dir, .size = s->size, .off = off};
  q->want = off >= s->size ? 0 : s->size - off < n ? (size_t)(s->size - off) : n;
  for (size_t i = 0; i < s->n_pieces && q->want && !q->found; i++) {
    const ks__cache_piece *p = &s->pieces[i];
    if (p->off <= off && off - p->off <= p->len && q->want <= p->len - (off - p->off)) {
      q->found = true;
      q->piece = *p;
    }
  }
  pthread_mutex_unlock(&c->lock);
  return 0;
}

static int read_all(int fd, void *buf, size_t n, uint64_t off) {
  size_t got = 0;
  int rc = local()->read_fn(local()->ctx, fd, buf, n, off, &got);
  return rc ? rc : got == n ? 0 : EIO;
}

/* The header and path of an open piece file match the piece, the file and its length. */
static bool header_ok(const ks__cache_read *q, int fd, uint64_t fsize, uint64_t *hash) {
  size_t plen = strlen(q->path);
  uint8_t h[HDR];
  char path[4096];
  if (plen >= sizeof path || fsize != HDR + plen + q->piece.len || read_all(fd, h, HDR, 0) ||
      read_all(fd, path, plen, HDR))
    return false;
  *hash = ks__le64(h + 32);
  return !memcmp(h, MAGIC, 8) && ks__le64(h + 8) == q->size && ks__le64(h + 16) == q->piece.off &&
         ks__le64(h + 24) == q->piece.len && ks__le64(h + 40) == plen && !memcmp(path, q->path, plen);
}

/* Reads the planned range; an unverified piece is read whole and hashed first. */
static bool read_piece(ks__cache *c, const ks__cache_read *q, int fd, uint64_t hash, void *buf) {
  uint64_t data = HDR + strlen(q->path), skip = q->off - q->piece.off;
  if (q->piece.verified) return read_all(fd, buf, q->want, data + skip) == 0;
  bool whole = skip == 0 && q->want == q->piece.len;
  uint8_t *tmp = whole ? buf : ks__malloc(&c->alloc, (size_t)q->piece.len);
  bool ok = tmp && read_all(fd, tmp, (size_t)q->piece.len, data) == 0 && XXH3_64bits(tmp, (size_t)q->piece.len) == hash;
  if (ok && !whole) memcpy(buf, tmp + skip, q->want);
  if (!whole) ks__free(&c->alloc, tmp);
  return ok;
}

/* Marks the piece verified, or removes it from the slot's list. */
static void settle(ks__cache *c, const ks__cache_read *q, bool good) {
  pthread_mutex_lock(&c->lock);
  ks__cache_slot *s = &c->slots[q->h];
  for (size_t i = 0; i < s->n_pieces; i++) {
    ks__cache_piece *p = &s->pieces[i];
    if (p->off != q->piece.off || p->len != q->piece.len) continue;
    if (good) p->verified = true;
    else s->pieces[i--] = s->pieces[--s->n_pieces];
  }
  pthread_mutex_unlock(&c->lock);
}

int ks__cache_serve(ks__cache *c, const ks__cache_read *q, void *buf) {
  char path[4096];
  if (!piece_path(q->dir, q->piece.off, q->piece.len, path, sizeof path)) return -1;
  int fd;
  uint64_t fsize, hash = 0;
  if (local()->open_fn(local()->ctx, path, &fd, &fsize)) {
    settle(c, q, false);
    return -1;
  }
  bool ok = header_ok(q, fd, fsize, &hash) && read_piece(c, q, fd, hash, buf);
  local()->close_fn(local()->ctx, fd);
  if (!ok) { /* torn, truncated or corrupted: never used, read again from inner */
    local()->unlink_fn(local()->ctx, path);
    atomic_fetch_add(&c->rejected, 1);
  }
  if (ok != q->piece.verified) settle(c, q, ok);
  return ok ? 0 : -1;
}

static KS_NODISCARD ks_status write_piece(ks__cache *c, const ks__cache_read *q, const void *buf, const char *path) {
  ks_error e;
  size_t plen = strlen(q->path);
  uint8_t h[HDR];
  memcpy(h, MAGIC, 8);
  ks__put_le64(h + 8, q->size);
  ks__put_le64(h + 16, q->off);
  ks__put_le64(h + 24, q->want);
  ks__put_le64(h + 32, XXH3_64bits(buf, q->want));
  ks__put_le64(h + 40, plen);
  ks__durable d;
  ks_status s = ks__io_mkdir_p(local(), q->dir, &e);
  if (!s) s = ks__durable_prepare(&d, path, local(), &c->alloc, &e);
  if (!s) s = ks__durable_open(&d);
  if (!s) s = ks__durable_write(&d, h, HDR);
  if (!s) s = ks__durable_write(&d, q->path, plen);
  if (!s) s = ks__durable_write(&d, buf, q->want);
  if (!s) s = ks__durable_commit(&d);
  ks__durable_abort(&d);
  return s;
}

void ks__cache_store(ks__cache *c, int h, const ks__cache_read *q, const void *buf) {
  char path[4096];
  if (!piece_path(q->dir, q->off, q->want, path, sizeof path) || write_piece(c, q, buf, path)) {
    atomic_fetch_add(&c->store_failures, 1);
    return;
  }
  atomic_fetch_add(&c->stored, 1);
  pthread_mutex_lock(&c->lock);
  ks__cache_slot *s = &c->slots[h];
  if (!ks__grow(&c->alloc, &s->pieces, &s->cap_pieces, s->n_pieces + 1, sizeof *s->pieces))
    s->pieces[s->n_pieces++] = (ks__cache_piece){q->off, q->want, true};
  pthread_mutex_unlock(&c->lock);
}

/* ---- forgetting a path ---- */

static int unlink_piece(void *ctx, const char *name, ks_io_kind kind) {
  char path[4096];
  if (kind == KS_IO_FILE && snprintf(path, sizeof path, "%s/%s", (const char *)ctx, name) < (int)sizeof path)
    local()->unlink_fn(local()->ctx, path);
  return 0;
}

static int empty_folder(void *ctx, const char *name, ks_io_kind kind) {
  char dir[4096];
  if (kind == KS_IO_DIR && snprintf(dir, sizeof dir, "%s/%s", ((ks__cache *)ctx)->dir, name) < (int)sizeof dir)
    local()->list_fn(local()->ctx, dir, "", unlink_piece, dir);
  return 0;
}

void ks__cache_forget(ks__cache *c, const char *path) {
  char prefix[24];
  snprintf(prefix, sizeof prefix, "%016" PRIx64 "-", ks__hash(path, strlen(path)));
  local()->list_fn(local()->ctx, c->dir, prefix, empty_folder, c); /* every size the path had */
  pthread_mutex_lock(&c->lock);
  for (size_t i = 0; i < c->n_slots; i++) {
    ks__cache_slot *s = &c->slots[i];
    if (s->used && s->reading && !strcmp(s->path, path)) s->n_pieces = 0;
  }
  pthread_mutex_unlock(&c->lock);
}
