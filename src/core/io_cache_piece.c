/*
 * Piece files of the caching table (layout in io_cache.h). They live on the
 * local disk and go through ks_io_posix(); new ones are written with the
 * durable replace, so a crash leaves either no piece or a whole one, and any
 * other damage is caught by the checks before a byte of a piece is used.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/durable.h"
#include "core/io_cache.h"
#include "core/xxh.h"


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
  if (len > s->max_len) s->max_len = len;
  return 0;
}

static int by_range(const void *a, const void *b) {
  const ks__cache_piece *x = a, *y = b;
  if (x->off != y->off) return x->off < y->off ? -1 : 1;
  return x->len < y->len ? -1 : x->len > y->len;
}

/* The index of the first piece of s not before (off, len) in the list's order. */
static size_t lower_bound(const ks__cache_slot *s, uint64_t off, uint64_t len) {
  size_t lo = 0, hi = s->n_pieces;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    const ks__cache_piece *p = &s->pieces[mid];
    if (p->off < off || (p->off == off && p->len < len)) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* The slot of a handle open for reading, or NULL; call with the lock held. */
static ks__cache_slot *reading_slot(ks__cache *c, int h) {
  ks__cache_slot *s = h >= 0 && (size_t)h < c->n_slots && c->slots[h].used ? &c->slots[h] : NULL;
  return s && s->reading ? s : NULL;
}

/* The folder is listed once per handle (one directory read, then pieces are
   found in memory); a missing folder (nothing cached yet) is an empty list. */
static void list_pieces(ks__cache *c, ks__cache_slot *s) {
  list_ctx l = {c, s};
  local()->list_fn(local()->ctx, s->dir, "", on_piece, &l);
  if (s->n_pieces > 1) qsort(s->pieces, s->n_pieces, sizeof *s->pieces, by_range); /* NULL when none */
  s->listed = true;
}

/* Of the pieces from *i on that start at or before cur, the one holding cur
   that ends last (NULL when none does); *i moves past them. Pieces passed
   over end before it, so later steps never need them. */
static const ks__cache_piece *best_cover(const ks__cache_slot *s, size_t *i, uint64_t cur) {
  const ks__cache_piece *best = NULL;
  for (; *i < s->n_pieces && s->pieces[*i].off <= cur; (*i)++) {
    const ks__cache_piece *p = &s->pieces[*i];
    if (p->len > cur - p->off && (!best || p->off + p->len > best->off + best->len)) best = p;
  }
  return best;
}

/* Cuts [off, off + want) into parts, greedily taking the piece that reaches
   furthest. One pass over the pieces that start between off - max_len (no
   earlier piece reaches off) and the end of the read. */
static void plan(const ks__cache_slot *s, ks__cache_read *q) {
  uint64_t cur = q->off, end = q->off + q->want;
  size_t i = lower_bound(s, cur > s->max_len ? cur - s->max_len : 0, 0);
  while (cur < end) {
    if (q->n_parts == KS__CACHE_MAX_PARTS) { /* too fragmented: one read of the whole range */
      q->n_parts = 1;
      q->parts[0] = (ks__cache_part){.off = q->off, .len = q->want};
      return;
    }
    const ks__cache_piece *p = best_cover(s, &i, cur);
    uint64_t stop = p ? p->off + p->len : i < s->n_pieces ? s->pieces[i].off : end;
    if (stop > end) stop = end;
    ks__cache_part *part = &q->parts[q->n_parts++];
    *part = (ks__cache_part){.off = cur, .len = (size_t)(stop - cur), .cached = p != NULL};
    if (p) part->piece = *p;
    cur = stop;
  }
}

int ks__cache_lookup(ks__cache *c, int h, size_t n, uint64_t off, ks__cache_read *q) {
  pthread_mutex_lock(&c->lock);
  ks__cache_slot *s = reading_slot(c, h);
  if (!s) {
    pthread_mutex_unlock(&c->lock);
    return EBADF;
  }
  if (!s->listed) list_pieces(c, s);
  q->h = h;
  q->fd = s->fd;
  q->path = s->path;
  q->dir = s->dir;
  q->ident = s->ident;
  q->ident_len = s->ident_len;
  q->size = s->size;
  q->off = off;
  q->want = off >= s->size ? 0 : s->size - off < n ? (size_t)(s->size - off) : n;
  q->n_parts = 0;
  plan(s, q);
  pthread_mutex_unlock(&c->lock);
  return 0;
}

static int read_all(int fd, void *buf, size_t n, uint64_t off) {
  size_t got = 0;
  int rc = local()->read_fn(local()->ctx, fd, buf, n, off, &got);
  return rc ? rc : got == n ? 0 : EIO;
}

/* The header and identity (path, validator) of an open piece file match the piece, the file and its length. */
static bool header_ok(const ks__cache_read *q, const ks__cache_piece *pc, int fd, uint64_t fsize, uint64_t *hash) {
  size_t plen = q->ident_len;
  uint8_t h[HDR];
  char ident[4096 + KS__CACHE_VALIDATOR_MAX];
  if (plen > sizeof ident || fsize != HDR + plen + pc->len || read_all(fd, h, HDR, 0) ||
      read_all(fd, ident, plen, HDR))
    return false;
  *hash = ks__le64(h + 32);
  return !memcmp(h, MAGIC, 8) && ks__le64(h + 8) == q->size && ks__le64(h + 16) == pc->off &&
         ks__le64(h + 24) == pc->len && ks__le64(h + 40) == plen && !memcmp(ident, q->ident, plen);
}

/* Reads the part out of its piece; an unverified piece is read whole and
   hashed first. 0, -1 when the piece is bad, ENOMEM when it could not be
   checked (the piece is not at fault and stays). */
static int read_piece(ks__cache *c, const ks__cache_read *q, const ks__cache_part *p, int fd, uint64_t hash,
                      void *buf) {
  const ks__cache_piece *pc = &p->piece;
  uint64_t data = HDR + q->ident_len, skip = p->off - pc->off;
  if (pc->verified) return read_all(fd, buf, p->len, data + skip) ? -1 : 0;
  bool whole = skip == 0 && p->len == pc->len;
  uint8_t *tmp = whole ? buf : ks__malloc(&c->alloc, (size_t)pc->len);
  if (!tmp) return ENOMEM;
  bool ok = read_all(fd, tmp, (size_t)pc->len, data) == 0 && ks__xxh3(tmp, (size_t)pc->len) == hash;
  if (ok && !whole) memcpy(buf, tmp + skip, p->len);
  if (!whole) ks__free(&c->alloc, tmp);
  return ok ? 0 : -1;
}

/* Marks the piece verified, or takes it out of the handle's list (keeping the order). */
static void settle(ks__cache *c, const ks__cache_read *q, const ks__cache_piece *pc, bool good) {
  pthread_mutex_lock(&c->lock);
  ks__cache_slot *s = reading_slot(c, q->h);
  size_t i = s ? lower_bound(s, pc->off, pc->len) : 0;
  if (s && i < s->n_pieces && s->pieces[i].off == pc->off && s->pieces[i].len == pc->len) {
    if (good) s->pieces[i].verified = true;
    else {
      s->n_pieces--;
      memmove(&s->pieces[i], &s->pieces[i + 1], (s->n_pieces - i) * sizeof *s->pieces);
    }
  }
  pthread_mutex_unlock(&c->lock);
}

int ks__cache_serve(ks__cache *c, const ks__cache_read *q, const ks__cache_part *p, void *buf) {
  const ks__cache_piece *pc = &p->piece;
  char path[4096];
  if (!piece_path(q->dir, pc->off, pc->len, path, sizeof path)) return -1;
  int fd;
  uint64_t fsize, hash = 0;
  if (local()->open_fn(local()->ctx, path, &fd, &fsize)) {
    settle(c, q, pc, false);
    return -1;
  }
  int rc = header_ok(q, pc, fd, fsize, &hash) ? read_piece(c, q, p, fd, hash, buf) : -1;
  local()->close_fn(local()->ctx, fd);
  if (rc == ENOMEM) return -1; /* not served, but not bad either */
  if (rc) { /* torn, truncated or corrupted: never used, read again from inner */
    local()->unlink_fn(local()->ctx, path);
    atomic_fetch_add(&c->rejected, 1);
  }
  if ((rc == 0) != pc->verified) settle(c, q, pc, rc == 0);
  return rc ? -1 : 0;
}

static KS_NODISCARD ks_status write_piece(ks__cache *c, const ks__cache_read *q, const ks__cache_part *p,
                                          const void *buf, const char *path) {
  ks_error e;
  size_t plen = q->ident_len;
  uint8_t h[HDR];
  memcpy(h, MAGIC, 8);
  ks__put_le64(h + 8, q->size);
  ks__put_le64(h + 16, p->off);
  ks__put_le64(h + 24, p->len);
  ks__put_le64(h + 32, ks__xxh3(buf, p->len));
  ks__put_le64(h + 40, plen);
  ks__durable d;
  ks_status s = ks__io_mkdir_p(local(), q->dir, &e);
  if (!s) s = ks__durable_prepare(&d, path, local(), &c->alloc, &e);
  if (!s) s = ks__durable_open(&d);
  if (!s) s = ks__durable_write(&d, h, HDR);
  if (!s) s = ks__durable_write(&d, q->ident, plen);
  if (!s) s = ks__durable_write(&d, buf, p->len);
  if (!s) s = ks__durable_commit(&d);
  ks__durable_abort(&d);
  return s;
}

/* Adds a piece just written to the handle's list, in order; one already there
   (another thread kept the same range) is only marked verified. Without memory
   it stays out of the list, which costs a later read from inner, nothing else. */
static void add_piece(ks__cache *c, int h, uint64_t off, uint64_t len) {
  pthread_mutex_lock(&c->lock);
  ks__cache_slot *s = reading_slot(c, h);
  size_t i = s ? lower_bound(s, off, len) : 0;
  if (s && i < s->n_pieces && s->pieces[i].off == off && s->pieces[i].len == len) {
    s->pieces[i].verified = true;
  } else if (s && !ks__grow(&c->alloc, &s->pieces, &s->cap_pieces, s->n_pieces + 1, sizeof *s->pieces)) {
    memmove(&s->pieces[i + 1], &s->pieces[i], (s->n_pieces - i) * sizeof *s->pieces);
    s->pieces[i] = (ks__cache_piece){off, len, true};
    s->n_pieces++;
    if (len > s->max_len) s->max_len = len;
  }
  pthread_mutex_unlock(&c->lock);
}

void ks__cache_store(ks__cache *c, const ks__cache_read *q, const ks__cache_part *p, const void *buf) {
  char path[4096];
  if (!piece_path(q->dir, p->off, p->len, path, sizeof path) || write_piece(c, q, p, buf, path)) {
    atomic_fetch_add(&c->store_failures, 1);
    return;
  }
  atomic_fetch_add(&c->stored, 1);
  add_piece(c, q->h, p->off, p->len);
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

typedef struct other_ctx {
  ks__cache *c;
  const char *keep;
} other_ctx;

/* A folder of another version: its pieces, then the folder itself. */
static int drop_other(void *ctx, const char *name, ks_io_kind kind) {
  other_ctx *o = ctx;
  char dir[4096];
  if (kind != KS_IO_DIR || !strcmp(name, o->keep) ||
      snprintf(dir, sizeof dir, "%s/%s", o->c->dir, name) >= (int)sizeof dir)
    return 0;
  local()->list_fn(local()->ctx, dir, "", unlink_piece, dir);
  (void)ks__io_rmdir(local(), dir); /* fails harmlessly when another writer just added a piece */
  return 0;
}

void ks__cache_forget_others(ks__cache *c, const char *path, const char *keep) {
  char prefix[24];
  snprintf(prefix, sizeof prefix, "%016" PRIx64 "-", ks__hash(path, strlen(path)));
  other_ctx o = {c, keep};
  local()->list_fn(local()->ctx, c->dir, prefix, drop_other, &o);
}

void ks__cache_forget(ks__cache *c, const char *path) {
  char prefix[24];
  snprintf(prefix, sizeof prefix, "%016" PRIx64 "-", ks__hash(path, strlen(path)));
  local()->list_fn(local()->ctx, c->dir, prefix, empty_folder, c); /* every size the path had */
  pthread_mutex_lock(&c->lock);
  for (size_t i = 0; i < c->n_slots; i++) {
    ks__cache_slot *s = &c->slots[i];
    if (s->used && s->reading && !strcmp(s->path, path)) {
      s->n_pieces = 0;
      s->max_len = 0;
    }
  }
  pthread_mutex_unlock(&c->lock);
}
