/*
 * Opening files and buffers, and the read-only accessors. The bytes come from
 * an mmap (zero copy, open cost independent of the data size), one heap copy,
 * or the caller's buffer; ks__fmt_parse then validates them the same way.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fmap.h"
#include "format/fmt_internal.h"

static ks_status reader_new(const ks_allocator *a, const char *path, ks_reader **out, ks_error *err) {
  ks_reader *r = ks__calloc(a, 1, sizeof *r);
  if (!r) return ks__err_at(err, KS_E_NOMEM, path, NULL, -1, "out of memory");
  r->alloc = *ks__alloc_or_default(a);
  r->path = ks__strdup(&r->alloc, path);
  if (!r->path || ks_meta_create(&r->alloc, &r->meta)) {
    ks_reader_free(r);
    return ks__err_at(err, KS_E_NOMEM, path, NULL, -1, "out of memory");
  }
  *out = r;
  return KS_OK;
}

void ks_reader_free(ks_reader *r) {
  if (!r) return;
  if (r->map) munmap(r->map, r->map_len);
  ks__free(&r->alloc, r->copy);
  ks__free(&r->alloc, r->entries);
  ks__free(&r->alloc, r->names);
  ks__hindex_free(&r->index, &r->alloc);
  ks_meta_free(r->meta);
  ks__free(&r->alloc, r->path);
  ks__free(&r->alloc, r);
}

/* The whole file through the core mapper; the reader keeps (and later releases) what it returns. */
static ks_status load_file(ks_reader *r, ks_read_mode mode, ks_error *err) {
  ks__fmap m;
  ks_status s = ks__fmap_open(&m, r->path, mode != KS_READ_MMAP, 8, &r->alloc, err);
  if (s) return s;
  r->bytes = m.bytes;
  r->size = m.size;
  r->map = m.map;
  r->map_len = m.map_len;
  r->copy = m.copy;
  return KS_OK;
}

static ks_status finish_open(ks_reader *r, const ks_read_opts *opts, ks_reader **out, ks_error *err) {
  ks_status st = ks__fmt_parse(r, err);
  if (!st && opts && opts->verify_checksums) st = ks_reader_verify(r, err);
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
  if ((st = load_file(r, opts ? opts->mode : KS_READ_MMAP, err)) != KS_OK) {
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

static void fill_view(const ks_reader *r, const fmt_entry *e, ks_tensor *v) {
  memset(v, 0, sizeof *v);
  v->dtype = e->dtype;
  v->rank = e->rank;
  memcpy(v->shape, e->shape, sizeof v->shape);
  v->data = (void *)(uintptr_t)(r->bytes + r->data_off + e->begin);
  v->nbytes = (size_t)(e->end - e->begin);
  v->ownership = KS_MAPPED;
}

ks_status ks_reader_tensor_at(const ks_reader *r, size_t i, const char **name, ks_tensor *view) {
  if (!r || i >= r->count) return KS_E_NOTFOUND;
  if (name) *name = r->entries[i].name;
  if (view) fill_view(r, &r->entries[i], view);
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
  if (view) fill_view(r, &r->entries[i], view);
  return KS_OK;
}

ks_status ks_reader_tensor_info(const ks_reader *r, size_t i, ks_tensor_info *info) {
  if (!r || i >= r->count || !info) return KS_E_NOTFOUND;
  info->name = r->entries[i].name;
  info->begin = r->data_off + r->entries[i].begin;
  info->end = r->data_off + r->entries[i].end;
  return KS_OK;
}

const ks_meta *ks_reader_meta(const ks_reader *r) { return r ? r->meta : NULL; }
int ks_reader_is_keepsake(const ks_reader *r) { return r && r->version > 0; }
int ks_reader_format_version(const ks_reader *r) { return r ? r->version : 0; }
const char *ks_reader_path(const ks_reader *r) { return r ? r->path : NULL; }
uint64_t ks_reader_file_size(const ks_reader *r) { return r ? (uint64_t)r->size : 0; }
uint64_t ks_reader_data_offset(const ks_reader *r) { return r ? r->data_off : 0; }
