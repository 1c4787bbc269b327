/*
 * KS_READ_LAZY: open reads the 8-byte length and the header through the table
 * (a first speculative chunk gets small headers in one ranged read), and tensor
 * bytes are read on demand, each verified against "keepsake.checksums" as it
 * arrives. Built for tables whose reads are expensive round trips (S3, HTTP).
 */
#include <inttypes.h>
#include <string.h>

#include "core/io_ops.h"
#include "format/fmt_internal.h"

/* The first read: most headers fit, so a small file opens in one round trip. */
#define LAZY_FIRST_CHUNK ((size_t)64 << 10)

/* Reads of a local file are cut into pieces of this size when they are hashed: each piece is
   hashed as soon as it lands, while it is in the cache. */
#define READ_PIECE ((size_t)512 << 10)

ks_status ks__reader_read(const ks_reader *r, uint64_t off, void *buf, size_t n, ks__xxh3_state *xx, ks_error *err) {
  /* Pieces only from a local file: a remote table's read is a round trip (a ranged GET). */
  size_t piece = xx && (ks_io_caps(r->io) & KS_IO_CAP_LOCAL) ? READ_PIECE : n, done = 0;
  while (done < n) {
    size_t got = 0, want = n - done > piece ? piece : n - done;
    int rc = r->io->read_fn(r->io->ctx, r->fd, (uint8_t *)buf + done, want, off + done, &got);
    char why[KS__IO_WHY_MAX];
    if (rc)
      return ks__err_at(err, KS_E_IO, r->path, NULL, (int64_t)(off + done), "cannot read %zu bytes: %s", n - done,
                        ks__io_why(r->io, rc, why, sizeof why));
    if (got == 0 || got > want)
      return ks__err_at(err, KS_E_IO, r->path, NULL, (int64_t)(off + done), "file shrank while being read");
    if (xx) ks__xxh3_update(xx, (uint8_t *)buf + done, got);
    done += got;
  }
  return KS_OK;
}

bool ks__reader_parallel(const ks_reader *r) { return r->lazy || (ks_io_caps(r->io) & KS_IO_CAP_LOCAL); }

static KS_NODISCARD ks_status read_at(const ks_reader *r, uint64_t off, void *buf, size_t n, ks_error *err) {
  return ks__reader_read(r, off, buf, n, NULL, err);
}

/* The rest of the header when the first chunk did not hold it all (a bad length is left to the parser). */
static KS_NODISCARD ks_status read_rest_of_header(ks_reader *r, ks_error *err) {
  if (r->have < 8) return KS_OK;
  uint64_t n = ks__le64(r->copy);
  if (n > KS_MAX_HEADER || n > (uint64_t)r->size - 8 || 8 + n <= r->have) return KS_OK;
  size_t need = (size_t)(8 + n);
  uint8_t *p = ks__realloc(&r->alloc, r->copy, need);
  if (!p) return ks__err_at(err, KS_E_NOMEM, r->path, NULL, -1, "out of memory for a header of %zu bytes", need);
  r->copy = p;
  r->bytes = p;
  ks_status st = read_at(r, r->have, p + r->have, need - r->have, err);
  if (!st) r->have = need;
  return st;
}

ks_status ks__lazy_open(ks_reader *r, int fd, uint64_t size, ks_error *err) {
  r->lazy = true;
  r->fd = fd;
  r->size = (size_t)size;
  size_t first = size < LAZY_FIRST_CHUNK ? (size_t)size : LAZY_FIRST_CHUNK;
  r->copy = ks__malloc(&r->alloc, first ? first : 1);
  if (!r->copy) return ks__err_at(err, KS_E_NOMEM, r->path, NULL, -1, "out of memory for %zu bytes", first);
  r->bytes = r->copy;
  ks_status st = read_at(r, 0, r->copy, first, err);
  if (st) return st;
  r->have = first;
  return read_rest_of_header(r, err);
}

ks_status ks__lazy_prepare(ks_reader *r, ks_error *err) {
  size_t n = r->count ? r->count : 1;
  r->fetched = ks__calloc(&r->alloc, n, sizeof *r->fetched);
  if (!r->fetched) return ks__err_at(err, KS_E_NOMEM, r->path, NULL, -1, "out of memory for %zu tensors", n);
  for (size_t i = 0; i < r->count; i++) atomic_init(&r->fetched[i], NULL);
  if (!r->version) return KS_OK; /* plain safetensors: nothing to verify against */
  r->sums = ks__calloc(&r->alloc, n, sizeof *r->sums);
  r->has_sum = ks__calloc(&r->alloc, n, 1);
  if (!r->sums || !r->has_sum)
    return ks__err_at(err, KS_E_NOMEM, r->path, NULL, -1, "out of memory for %zu checksums", n);
  ks_error_clear(&r->sums_err);
  r->sums_status = ks__fmt_sums(r, r->sums, r->has_sum, &r->sums_err);
  /* Out of memory is this open's failure; a malformed table is every fetch's (as ks_reader_verify's). */
  if (r->sums_status == KS_E_NOMEM) return ks__err(err, KS_E_NOMEM, "out of memory reading the checksum table");
  return KS_OK;
}

void ks__lazy_free(ks_reader *r) {
  if (!r->lazy) return;
  if (r->fd >= 0) r->io->close_fn(r->io->ctx, r->fd); /* read-only: nothing a failed close could lose */
  for (size_t i = 0; r->fetched && i < r->count; i++) ks__free(&r->alloc, atomic_load(&r->fetched[i]));
  ks__free(&r->alloc, r->fetched);
  ks__free(&r->alloc, r->data);
  ks__free(&r->alloc, r->sums);
  ks__free(&r->alloc, r->has_sum);
}

ks_status ks__lazy_check(const ks_reader *r, size_t i, const uint8_t *p, ks_error *err) {
  if (!r->version) return KS_OK;
  const fmt_entry *e = &r->entries[i];
  return ks__lazy_check_hash(r, i, ks_checksum(p, (size_t)(e->end - e->begin)), err);
}

ks_status ks__lazy_check_hash(const ks_reader *r, size_t i, uint64_t got, ks_error *err) {
  if (!r->version) return KS_OK;
  if (r->sums_status) {
    if (err) *err = r->sums_err;
    return r->sums_status;
  }
  const fmt_entry *e = &r->entries[i];
  if (!r->has_sum[i])
    return ks__err_at(err, KS_E_FORMAT, r->path, e->name, ks__fmt_key_offset(r, KS_META_CHECKSUMS),
                      "checksum table has no entry for this tensor");
  uint64_t at = r->data_off + e->begin;
  if (got == r->sums[i]) return KS_OK;
  return ks__err_at(err, KS_E_CHECKSUM, r->path, e->name, (int64_t)at,
                    "data of bytes [%" PRIu64 ", %" PRIu64 ") hashes to %016" PRIx64 ", stored checksum is %016" PRIx64,
                    at, r->data_off + e->end, got, r->sums[i]);
}

/* Reads tensor i's bytes into buf (nbytes of it) through io, adding them to xx (when not NULL)
   piece by piece as they land; verifies nothing. */
static KS_NODISCARD ks_status lazy_read(const ks_reader *r, size_t i, void *buf, ks__xxh3_state *xx, ks_error *err) {
  const fmt_entry *e = &r->entries[i];
  uint64_t off = r->data_off + e->begin;
  size_t n = (size_t)(e->end - e->begin);
  if (off + n <= r->have) { /* already in the first chunk */
    memcpy(buf, r->copy + off, n);
    if (xx) ks__xxh3_update(xx, buf, n);
    return KS_OK;
  }
  ks_status st = ks__reader_read(r, off, buf, n, xx, err);
  if (st) ks__err_set_key(err, e->name);
  return st;
}

/* Reads tensor i into buf and checks it against its checksum, hashing each piece as it lands. */
static KS_NODISCARD ks_status read_checked(const ks_reader *r, size_t i, void *buf, ks_error *err) {
  if (!r->version) return lazy_read(r, i, buf, NULL, err); /* plain safetensors: nothing to check */
  ks__xxh3_state xx;
  ks__xxh3_reset(&xx);
  ks_status st = lazy_read(r, i, buf, &xx, err);
  const fmt_entry *e = &r->entries[i];
  return st ? st : ks__lazy_check_hash(r, i, e->end > e->begin ? ks__xxh3_digest(&xx) : ks__xxh3(NULL, 0), err);
}

#define WINDOW_MIN ((size_t)8 << 20)

ks_status ks__lazy_window_get(const ks_reader *r, ks__lazy_window *w, size_t i, const uint8_t **p, ks_error *err) {
  const fmt_entry *e = &r->entries[i];
  uint64_t off = r->data_off + e->begin;
  size_t n = (size_t)(e->end - e->begin);
  if (off + n <= r->have) return *p = r->copy + off, KS_OK;
  if (w->buf && off >= w->off && off + n <= w->off + w->len) return *p = w->buf + (off - w->off), KS_OK;
  uint64_t left = (uint64_t)r->size - off; /* >= n: open checked the layout */
  size_t len = n > WINDOW_MIN ? n : left < WINDOW_MIN ? (size_t)left : WINDOW_MIN;
  if (len > w->cap) { /* nothing to keep: free first, so peak memory is one window */
    ks__free(&r->alloc, w->buf);
    w->len = w->cap = 0;
    if (!(w->buf = ks__malloc(&r->alloc, len ? len : 1)))
      return ks__err_at(err, KS_E_NOMEM, r->path, e->name, -1, "out of memory for %zu bytes", len);
    w->cap = len;
  }
  w->len = 0;
  ks_status st = read_at(r, off, w->buf, len, err);
  if (st) return ks__err_set_key(err, e->name), st;
  w->off = off;
  w->len = len;
  *p = w->buf;
  return KS_OK;
}

void ks__lazy_window_free(const ks_reader *r, ks__lazy_window *w) {
  ks__free(&r->alloc, w->buf);
  *w = (ks__lazy_window){0};
}

/* Lazy: fetches tensor i into reader memory once; racing threads may both read, one result is kept. */
static KS_NODISCARD ks_status fetch_once(const ks_reader *r, size_t i, const uint8_t **p, ks_error *err) {
  _Atomic(uint8_t *) *slot = &r->fetched[i];
  uint8_t *have = atomic_load(slot);
  if (have) return *p = have, KS_OK;
  const fmt_entry *e = &r->entries[i];
  size_t n = (size_t)(e->end - e->begin);
  uint8_t *buf = ks__malloc(&r->alloc, n ? n : 1);
  if (!buf) return ks__err_at(err, KS_E_NOMEM, r->path, e->name, -1, "out of memory for %zu bytes", n);
  ks_status st = read_checked(r, i, buf, err);
  if (st) {
    ks__free(&r->alloc, buf);
    return st;
  }
  uint8_t *expect = NULL;
  if (!atomic_compare_exchange_strong(slot, &expect, buf)) { /* another thread won: use its copy */
    ks__free(&r->alloc, buf);
    buf = expect;
  }
  *p = buf;
  return KS_OK;
}

ks_status ks__reader_bytes(const ks_reader *r, size_t i, const uint8_t **p, ks_error *err) {
  const fmt_entry *e = &r->entries[i];
  if (!r->lazy) return *p = r->bytes + r->data_off + e->begin, KS_OK;
  if (r->data) return *p = r->data + e->begin, KS_OK;
  return fetch_once(r, i, p, err);
}

/* A reader holding the file in memory: copies tensor i into buf piece by piece, hashing each piece
   from buf right after it is copied (one pass over the source), then checks the hash as
   ks__reader_verify_tensor does. */
static KS_NODISCARD ks_status copy_checked(const ks_reader *r, size_t i, uint8_t *buf, ks_error *err) {
  const fmt_entry *e = &r->entries[i];
  const uint8_t *src = r->bytes + r->data_off + e->begin;
  size_t n = (size_t)(e->end - e->begin);
  if (!r->version) { /* plain safetensors: nothing to check */
    if (n) memcpy(buf, src, n);
    return KS_OK;
  }
  ks__xxh3_state xx;
  ks__xxh3_reset(&xx);
  for (size_t done = 0; done < n;) {
    size_t len = n - done < READ_PIECE ? n - done : READ_PIECE;
    memcpy(buf + done, src + done, len);
    ks__xxh3_update(&xx, buf + done, len);
    done += len;
  }
  uint64_t got = n ? ks__xxh3_digest(&xx) : ks__xxh3(NULL, 0);
  return ks__reader_verify_with(r, i, i + 1, &got, false, err);
}

/* A lazy reader's tensor i checked without keeping its bytes: read piece by piece into one scratch
   piece (at most READ_PIECE bytes, so it stays in the cache) and hashed there. */
static KS_NODISCARD ks_status stream_checked(const ks_reader *r, size_t i, ks_error *err) {
  const fmt_entry *e = &r->entries[i];
  uint64_t off = r->data_off + e->begin;
  size_t n = (size_t)(e->end - e->begin);
  if (off + n <= r->have) return ks__lazy_check(r, i, r->copy + off, err); /* in the first chunk */
  size_t cap = n < READ_PIECE ? n : READ_PIECE;
  uint8_t *piece = ks__malloc(&r->alloc, cap ? cap : 1);
  if (!piece) return ks__err_at(err, KS_E_NOMEM, r->path, e->name, -1, "out of memory for %zu bytes", cap);
  ks__xxh3_state xx;
  ks__xxh3_reset(&xx);
  ks_status st = KS_OK;
  for (size_t done = 0; !st && done < n; done += cap < n - done ? cap : n - done)
    st = ks__reader_read(r, off + done, piece, cap < n - done ? cap : n - done, &xx, err);
  ks__free(&r->alloc, piece);
  if (st) return ks__err_set_key(err, e->name), st;
  return ks__lazy_check_hash(r, i, n ? ks__xxh3_digest(&xx) : ks__xxh3(NULL, 0), err);
}

ks_status ks__reader_check(const ks_reader *r, size_t i, ks_error *err) {
  ks_error_clear(err);
  if (!r || i >= r->count) return ks__err(err, KS_E_NOTFOUND, "no tensor %zu", i);
  if (!r->version) return KS_OK; /* plain safetensors: nothing to check against */
  if (!r->lazy || r->data) return ks__reader_verify_tensor(r, i, err); /* in memory: hashed where it is */
  if (atomic_load(&r->fetched[i])) return KS_OK; /* verified when it arrived */
  return stream_checked(r, i, err);
}

ks_status ks_reader_fetch(const ks_reader *r, size_t i, void *buf, size_t cap, ks_error *err) {
  ks_error_clear(err);
  if (!r || i >= r->count) return ks__err(err, KS_E_NOTFOUND, "ks_reader_fetch: no tensor %zu", i);
  const fmt_entry *e = &r->entries[i];
  size_t n = (size_t)(e->end - e->begin);
  if (n > cap || (!buf && n))
    return ks__err_at(err, KS_E_INVALID, r->path, e->name, -1, "ks_reader_fetch: buffer of %zu bytes, tensor has %zu",
                      buf ? cap : 0, n);
  if (!r->lazy) /* mapped or copied: the bytes are in memory, verified now */
    return copy_checked(r, i, buf, err);
  const uint8_t *have = r->data ? r->data + e->begin : atomic_load(&r->fetched[i]);
  if (have) { /* verified when it arrived */
    if (n) memcpy(buf, have, n);
    return KS_OK;
  }
  return read_checked(r, i, buf, err); /* straight into the caller's buffer, verified as it lands */
}
