/*
 * Second half of opening a file: the data offsets must tile the data section
 * exactly (the reference rule), the names get a hash index, and the keepsake
 * metadata, when present, must be a version this library reads.
 */
#include <stdlib.h>
#include <string.h>

#include "format/fmt_internal.h"

#define DATA_ERR(r, code, key, off, ...) ks__err_at(err, code, (r)->path, key, (int64_t)(off), __VA_ARGS__)

typedef struct span {
  uint64_t begin, end;
  size_t idx;
} span;

static int span_cmp(const void *pa, const void *pb) {
  const span *a = pa, *b = pb;
  if (a->begin != b->begin) return a->begin < b->begin ? -1 : 1;
  if (a->end != b->end) return a->end < b->end ? -1 : 1;
  return a->idx < b->idx ? -1 : a->idx > b->idx;
}

static KS_NODISCARD ks_status check_bounds(const ks_reader *r, uint64_t data_len, ks_error *err) {
  for (size_t i = 0; i < r->count; i++) {
    const fmt_entry *e = &r->entries[i];
    if (e->end > data_len)
      return DATA_ERR(r, KS_E_FORMAT, e->name, r->data_off + e->begin,
                      "data_offsets [%llu, %llu) run past the end of the data section (%llu bytes; file truncated?)",
                      (unsigned long long)e->begin, (unsigned long long)e->end, (unsigned long long)data_len);
  }
  return KS_OK;
}

/* Spans in file order. NULL *out means the header order already is file order. */
static KS_NODISCARD ks_status sorted_spans(const ks_reader *r, span **out, ks_error *err) {
  *out = NULL;
  bool sorted = true;
  for (size_t i = 1; i < r->count && sorted; i++) {
    const fmt_entry *a = &r->entries[i - 1], *b = &r->entries[i];
    sorted = a->begin < b->begin || (a->begin == b->begin && a->end <= b->end);
  }
  if (sorted) return KS_OK;
  span *s = ks__calloc(&r->alloc, r->count, sizeof *s);
  if (!s) return ks__err(err, KS_E_NOMEM, "out of memory sorting %zu tensors", r->count);
  for (size_t i = 0; i < r->count; i++) s[i] = (span){r->entries[i].begin, r->entries[i].end, i};
  qsort(s, r->count, sizeof *s, span_cmp);
  *out = s;
  return KS_OK;
}

static KS_NODISCARD ks_status check_tiling(const ks_reader *r, const span *s, uint64_t data_len, ks_error *err) {
  uint64_t expect = 0;
  const char *prev = NULL;
  for (size_t k = 0; k < r->count; k++) {
    const fmt_entry *e = &r->entries[s ? s[k].idx : k];
    if (e->begin > expect)
      return DATA_ERR(r, KS_E_FORMAT, e->name, r->data_off + expect,
                      "hole of %llu bytes before this tensor: it begins at %llu but the data before ends at %llu",
                      (unsigned long long)(e->begin - expect), (unsigned long long)e->begin,
                      (unsigned long long)expect);
    if (e->begin < expect)
      return DATA_ERR(r, KS_E_FORMAT, e->name, r->data_off + e->begin,
                      "data_offsets [%llu, %llu) overlap tensor '%s', which ends at %llu",
                      (unsigned long long)e->begin, (unsigned long long)e->end, prev ? prev : "?",
                      (unsigned long long)expect);
    expect = e->end;
    prev = e->name;
  }
  if (expect != data_len)
    return DATA_ERR(r, KS_E_FORMAT, NULL, r->data_off + expect,
                    "%llu trailing bytes after the last tensor (data section is %llu bytes, tensors end at %llu)",
                    (unsigned long long)(data_len - expect), (unsigned long long)data_len,
                    (unsigned long long)expect);
  return KS_OK;
}

static KS_NODISCARD ks_status check_layout(const ks_reader *r, ks_error *err) {
  uint64_t data_len = (uint64_t)r->size - r->data_off;
  ks_status st = check_bounds(r, data_len, err);
  span *s = NULL;
  if (!st) st = sorted_spans(r, &s, err);
  if (!st) st = check_tiling(r, s, data_len, err);
  ks__free(&r->alloc, s);
  return st;
}

static uint64_t entry_hash(const void *ctx, size_t i) { return ((const ks_reader *)ctx)->entries[i].hash; }

static const char *entry_key(const void *ctx, size_t i, size_t *len) {
  const fmt_entry *e = &((const ks_reader *)ctx)->entries[i];
  *len = e->name_len;
  return e->name;
}

const ks__hindex_ops ks__fmt_entry_ops = {entry_hash, entry_key};

static KS_NODISCARD ks_status build_index(ks_reader *r, ks_error *err) {
  ks_status s = ks__hindex_reserve(&r->index, &r->alloc, r->count, 0, &ks__fmt_entry_ops, r);
  if (s) return ks__err(err, s, "cannot index %zu tensors", r->count);
  for (size_t i = 0; i < r->count; i++) {
    const fmt_entry *e = &r->entries[i];
    if (ks__hindex_find(&r->index, e->name, e->name_len, e->hash, &ks__fmt_entry_ops, r) >= 0)
      return DATA_ERR(r, KS_E_EXISTS, e->name, ks__fmt_key_offset(r, e->name), "duplicate tensor name");
    ks__hindex_insert(&r->index, i, e->hash);
  }
  return KS_OK;
}

/* Parses a format version: 1 to 9 decimal digits, no sign or spaces. */
static bool parse_version(const char *s, int *out) {
  size_t n = strlen(s);
  if (n == 0 || n > 9) return false;
  int v = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9') return false;
    v = v * 10 + (s[i] - '0');
  }
  *out = v;
  return true;
}

static KS_NODISCARD ks_status check_keepsake(ks_reader *r, ks_error *err) {
  const char *fmt = ks_meta_get(r->meta, KS_META_FORMAT);
  if (!fmt) return KS_OK;
  if (strcmp(fmt, KS_FORMAT_NAME) != 0)
    return DATA_ERR(r, KS_E_FORMAT, KS_META_FORMAT, ks__fmt_key_offset(r, KS_META_FORMAT),
                    "metadata says format '%s', expected '%s'", fmt, KS_FORMAT_NAME);
  const char *ver = ks_meta_get(r->meta, KS_META_FORMAT_VERSION);
  int64_t off = ks__fmt_key_offset(r, KS_META_FORMAT_VERSION);
  int v = 0;
  if (!ver || !parse_version(ver, &v) || v < 1)
    return DATA_ERR(r, KS_E_FORMAT, KS_META_FORMAT_VERSION, off,
                    "keepsake format version is %s%s%s, expected a positive integer", ver ? "'" : "",
                    ver ? ver : "missing", ver ? "'" : "");
  if (v > KS_FORMAT_VERSION)
    return DATA_ERR(r, KS_E_VERSION, KS_META_FORMAT_VERSION, off,
                    "file has keepsake format version %d; this library reads versions 1 to %d: upgrade keepsake", v,
                    KS_FORMAT_VERSION);
  r->version = v;
  return KS_OK;
}

ks_status ks__fmt_parse(ks_reader *r, ks_error *err) {
  ks_status st = ks__fmt_read_prefix(r, err);
  if (!st) st = ks__fmt_check_utf8(r, err);
  if (!st) st = ks__fmt_read_header(r, err);
  if (!st) st = build_index(r, err);
  if (!st) st = check_layout(r, err);
  if (!st) st = check_keepsake(r, err);
  return st;
}
