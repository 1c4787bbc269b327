/*
 * Opening files and buffers, and the read-only accessors. The bytes come from
 * an mmap (zero copy, open cost independent of the data size), one heap copy,
 * the caller's buffer, or (lazy mode, lazy.c) only the header, read through the
 * table; ks__fmt_parse then validates them the same way.
 */
#include <errno.h>
#include <string.h>

#include "core/fmap.h"
#include "core/io_ops.h"
#include "format/fmt_internal.h"

/* core/io_ops.c picks modes by number (core does not see format.h). */
_Static_assert(KS_READ_MMAP == 0 && KS_READ_LAZY == 2, "ks__io_read_mode returns these values");

static KS_NODISCARD ks_status reader_new(const ks_allocator *a, const char *path, ks_reader **out, ks_error *err) {
  ks_reader *r = ks__calloc(a, 1, sizeof *r);
  if (!r) return ks__err_at(err, KS_E_NOMEM, path, NULL, -1, "out of memory");
  r->alloc = *ks__alloc_or_default(a);
  r->fd = -1;
  r->path = ks__strdup(&r->alloc, path);
  if (!r->path || ks_meta_create(&r->alloc, &r->meta, err)) {
    ks_reader_free(r);
    return ks__err_at(err, KS_E_NOMEM, path, NULL, -1, "out of memory");
  }
  *out = r;
  return KS_OK;
}

void ks_reader_free(ks_reader *r) {
  if (!r) return;
  if (!r->lazy && r->fd >= 0) r->io->close_fn(r->io->ctx, r->fd); /* a copy whose data was never read */
  if (r->map) r->io->unmap_fn(r->io->ctx, r->map, r->map_len); /* a failed munmap leaves nothing to do */
  ks__lazy_free(r);
  ks__free(&r->alloc, r->copy);
  ks__free(&r->alloc, r->entries);
  ks__free(&r->alloc, r->names);
  ks__hindex_free(&r->index, &r->alloc);
  ks_meta_free(r->meta);
  ks__free(&r->alloc, r->path);
  ks__free(&r->alloc, r);
}

static KS_NODISCARD ks_status io_err(const ks_reader *r, const char *what, int rc, ks_error *err) {
  char why[KS__IO_WHY_MAX];
  return ks__err_at(err, KS_E_IO, r->path, NULL, -1, "%s: %s", what, ks__io_why(r->io, rc, why, sizeof why));
}

/* The first piece of a copy: most headers fit, and a small file is read in one call. */
#define HEAD_CHUNK ((size_t)64 << 10)

/*
 * A copy of the file in memory: here its start (the 8-byte length and the header, all of them
 * when the length says more than the first piece holds); the data section is read after the
 * header is parsed (ks__copy_load, copy_load.c), on a few threads, each tensor hashed as it lands
 * when the open verifies. fd stays open until then (r->fd).
 */
static KS_NODISCARD ks_status read_head(ks_reader *r, int fd, size_t size, ks_error *err) {
  r->copy = ks__malloc(&r->alloc, size ? size : 1);
  if (!r->copy) return ks__err_at(err, KS_E_NOMEM, r->path, NULL, -1, "out of memory for %zu bytes", size);
  ks__advise_huge(r->copy, size);
  r->bytes = r->copy;
  r->size = size;
  r->fd = fd;
  size_t first = size < HEAD_CHUNK ? size : HEAD_CHUNK;
  ks_status st = ks__reader_read(r, 0, r->copy, first, NULL, err);
  if (st) return st;
  r->have = first;
  if (size < 8) return KS_OK; /* too short: the parser's to report */
  uint64_t n = ks__le64(r->copy);
  if (n > size - 8 || 8 + n <= r->have) return KS_OK; /* a bad length is the parser's to report */
  st = ks__reader_read(r, r->have, r->copy + r->have, (size_t)(8 + n) - r->have, NULL, err);
  if (!st) r->have = (size_t)(8 + n);
  return st;
}

/* A mapping when the backend can map; ENOTSUP (or no map_fn) falls back to one copy. */
static KS_NODISCARD ks_status map_whole(ks_reader *r, int fd, size_t size, ks_error *err) {
  const void *p = NULL;
  int rc = r->io->map_fn ? r->io->map_fn(r->io->ctx, fd, size, &p) : ENOTSUP;
  if (rc == ENOTSUP) return read_head(r, fd, size, err);
  if (rc) return io_err(r, "cannot map file", rc, err);
  r->map = p;
  r->map_len = size;
  r->bytes = p;
  r->size = size;
  return KS_OK;
}

static KS_NODISCARD ks_status load_file(ks_reader *r, const ks_io *io, ks_read_mode mode, ks_error *err) {
  ks_status s = ks_io_check(io, err);
  if (s) return s;
  r->io = ks__io_v2(io);
  int fd = -1;
  uint64_t size = 0;
  int rc = ks__io_open_follow(r->io, r->path, &fd, &size); /* a run's `latest` moving on is followed */
  if (rc == EISDIR || rc == ENODEV) return ks__err_at(err, KS_E_IO, r->path, NULL, -1, "not a regular file");
  if (rc) return io_err(r, "cannot open file", rc, err);
  if (size > SIZE_MAX)
    s = ks__err_at(err, KS_E_LIMIT, r->path, NULL, -1, "file too large for this platform");
  else if (mode == KS_READ_LAZY)
    return ks__lazy_open(r, fd, size, err); /* the handle stays open: the reader closes it */
  else if (mode == KS_READ_MMAP && size >= 8) /* an empty mapping is an error: tiny files are read */
    s = map_whole(r, fd, (size_t)size, err);
  else
    s = read_head(r, fd, (size_t)size, err);
  if (r->fd != fd) r->io->close_fn(r->io->ctx, fd); /* read-only: nothing a failed close could lose */
  return s;
}

/* A copy read after its header (read_head): the data, then the verification with the hashes
   computed as the bytes came. */
static KS_NODISCARD ks_status finish_copy(ks_reader *r, bool verify, ks_error *err) {
  uint64_t *got = verify && r->version ? ks__calloc(&r->alloc, r->count ? r->count : 1, sizeof *got) : NULL;
  if (verify && r->version && !got) return ks__err_at(err, KS_E_NOMEM, r->path, NULL, -1, "out of memory");
  ks_status st = ks__copy_load(r, got, err);
  if (!st && verify) st = ks__reader_verify_with(r, 0, r->count, got, true, err);
  ks__free(&r->alloc, got);
  return st;
}

static KS_NODISCARD ks_status finish_open(ks_reader *r, const ks_read_opts *opts, ks_reader **out, ks_error *err) {
  ks_status st = ks__fmt_parse(r, err);
  bool verify = opts && opts->verify_checksums;
  if (!st && r->lazy) st = ks__lazy_prepare(r, err);
  if (!st && !r->lazy && r->fd >= 0) st = finish_copy(r, verify, err);
  else if (!st && verify) st = ks_reader_verify(r, NULL, NULL, err);
  if (st) {
    ks__err_set_file(err, r->path);
    ks_reader_free(r);
    return st;
  }
  *out = r;
  return KS_OK;
}

ks_status ks_reader_open(const char *path, const ks_read_opts *opts, ks_reader **out, ks_error *err) {
  ks_error_clear(err);
  if (!path || !out) return ks__err(err, KS_E_INVALID, "ks_reader_open: path and out are required");
  KS__TAKE_OPTS(ks_read_opts, opts, KS__V1_SIZE(ks_read_opts, verify_checksums), err);
  ks_reader *r;
  ks_status st = reader_new(opts ? opts->alloc : NULL, path, &r, err);
  if (st) return st;
  if ((st = load_file(r, opts ? opts->io : NULL, opts ? opts->mode : KS_READ_MMAP, err)) != KS_OK) {
    ks_reader_free(r);
    return st;
  }
  return finish_open(r, opts, out, err);
}

ks_status ks_reader_open_buffer(const void *buf, size_t len, const ks_read_opts *opts, ks_reader **out,
                                ks_error *err) {
  ks_error_clear(err);
  if ((!buf && len) || !out) return ks__err(err, KS_E_INVALID, "ks_reader_open_buffer: bad arguments");
  KS__TAKE_OPTS(ks_read_opts, opts, KS__V1_SIZE(ks_read_opts, verify_checksums), err);
  ks_reader *r;
  ks_status st = reader_new(opts ? opts->alloc : NULL, "<buffer>", &r, err);
  if (st) return st;
  r->bytes = buf ? buf : (const void *)"";
  r->size = len;
  if (opts && opts->mode == KS_READ_COPY) {
    r->copy = ks__malloc(&r->alloc, len ? len : 1);
    if (!r->copy) {
      ks_reader_free(r);
      return ks__err_at(err, KS_E_NOMEM, "<buffer>", NULL, -1, "out of memory for %zu bytes", len);
    }
    if (len) memcpy(r->copy, buf, len);
    r->bytes = r->copy;
  }
  return finish_open(r, opts, out, err);
}

size_t ks_reader_count(const ks_reader *r) { return r ? r->count : 0; }

/* The view of tensor i; in lazy mode its bytes are fetched (and verified) on first use. */
static KS_NODISCARD ks_status fill_view(const ks_reader *r, size_t i, ks_tensor *v, ks_error *err) {
  const fmt_entry *e = &r->entries[i];
  const uint8_t *p;
  ks_status st = ks__reader_bytes(r, i, &p, err);
  if (st) return st;
  memset(v, 0, sizeof *v);
  v->dtype = e->dtype;
  v->rank = e->rank;
  memcpy(v->shape, e->shape, sizeof v->shape);
  v->data = (void *)(uintptr_t)p;
  v->nbytes = (size_t)(e->end - e->begin);
  v->ownership = KS_MAPPED;
  return KS_OK;
}

ks_status ks_reader_tensor_at(const ks_reader *r, size_t i, const char **name, ks_tensor *view) {
  if (!r || i >= r->count) return KS_E_NOTFOUND;
  if (name) *name = r->entries[i].name;
  return view ? fill_view(r, i, view, NULL) : KS_OK;
}

ks_status ks_reader_memory(const ks_reader *r, const void **p, size_t *len, ks_error *err) {
  ks_error_clear(err);
  if (!r || !p || !len) return ks__err(err, KS_E_INVALID, "ks_reader_memory: NULL argument");
  if (r->lazy) return ks__err_at(err, KS_E_UNSUPPORTED, r->path, NULL, -1, "a lazy reader holds the header only");
  *p = r->bytes;
  *len = r->size;
  return KS_OK;
}

long ks_reader_find(const ks_reader *r, const char *name) {
  return name ? ks__reader_find_n(r, name, strlen(name)) : -1;
}

long ks__reader_find_n(const ks_reader *r, const char *name, size_t n) {
  return r ? ks__hindex_find(&r->index, name, n, ks__hash(name, n), &ks__fmt_entry_ops, r) : -1;
}

ks_status ks_reader_tensor(const ks_reader *r, const char *name, ks_tensor *view, ks_error *err) {
  long i = ks_reader_find(r, name);
  if (i < 0)
    return ks__err_at(err, KS_E_NOTFOUND, r ? r->path : NULL, name, -1, "no tensor named '%s'", name ? name : "");
  return view ? fill_view(r, (size_t)i, view, err) : KS_OK;
}

ks_status ks_reader_tensor_info(const ks_reader *r, size_t i, ks_tensor_info *info) {
  if (!r || i >= r->count || !info) return KS_E_NOTFOUND;
  info->name = r->entries[i].name;
  info->begin = r->data_off + r->entries[i].begin;
  info->end = r->data_off + r->entries[i].end;
  return KS_OK;
}

ks_status ks_reader_tensor_desc(const ks_reader *r, size_t i, ks_tensor *view) {
  if (!r || i >= r->count || !view) return KS_E_NOTFOUND;
  const fmt_entry *e = &r->entries[i];
  memset(view, 0, sizeof *view);
  view->dtype = e->dtype;
  view->rank = e->rank;
  memcpy(view->shape, e->shape, sizeof view->shape);
  view->nbytes = (size_t)(e->end - e->begin);
  view->ownership = KS_BORROWED;
  return KS_OK;
}

const ks_meta *ks_reader_meta(const ks_reader *r) { return r ? r->meta : NULL; }
int ks_reader_is_keepsake(const ks_reader *r) { return r && r->version > 0; }
int ks_reader_format_version(const ks_reader *r) { return r ? r->version : 0; }
const char *ks_reader_path(const ks_reader *r) { return r ? r->path : NULL; }
uint64_t ks_reader_file_size(const ks_reader *r) { return r ? (uint64_t)r->size : 0; }
uint64_t ks_reader_data_offset(const ks_reader *r) { return r ? r->data_off : 0; }
