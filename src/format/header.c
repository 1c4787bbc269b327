/*
 * The header parser: every rule of the reference safetensors reader, plus
 * keepsake's caps and version check. Input is untrusted; sizes are checked
 * before use and every failure names the file, key and byte offset.
 */
#include <stdlib.h>
#include <string.h>

#include "format/fmt_internal.h"

#define DATA_ERR(r, code, key, off, ...) ks__err_at(err, code, (r)->path, key, (int64_t)(off), __VA_ARGS__)

int64_t ks__fmt_key_offset(const ks_reader *r, const char *name) {
  size_t n = strlen(name), hlen = (size_t)r->header_len;
  const uint8_t *h = r->bytes + 8;
  for (const uint8_t *p = h; (p = memchr(p, '"', hlen - (size_t)(p - h))) != NULL; p++) {
    size_t left = hlen - (size_t)(p - h);
    if (left >= n + 2 && memcmp(p + 1, name, n) == 0 && p[n + 1] == '"') return 8 + (int64_t)(p - h);
  }
  return 8;
}

ks_status ks__fmt_read_prefix(ks_reader *r, ks_error *err) {
  if (r->size < 8)
    return DATA_ERR(r, KS_E_FORMAT, NULL, r->size, "file is %zu bytes, too short for the 8-byte header length",
                    r->size);
  uint64_t n = ks__le64(r->bytes);
  if (n > KS_MAX_HEADER)
    return DATA_ERR(r, KS_E_LIMIT, NULL, 0, "header length %llu exceeds the limit of %u bytes",
                    (unsigned long long)n, KS_MAX_HEADER);
  if (n > r->size - 8)
    return DATA_ERR(r, KS_E_FORMAT, NULL, 0, "header length %llu runs past the end of the file (%zu bytes)",
                    (unsigned long long)n, r->size);
  r->header_len = n;
  r->data_off = 8 + n;
  return KS_OK;
}

/* Headers are nearly always ASCII: check 8 bytes at a time before the full UTF-8 check. */
static bool all_ascii(const uint8_t *p, size_t n) {
  uint64_t acc = 0, w;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    memcpy(&w, p + i, 8);
    acc |= w;
  }
  for (; i < n; i++) acc |= p[i];
  return (acc & 0x8080808080808080ull) == 0;
}

/* Length of the UTF-8 sequence a lead byte announces (1 for bytes that cannot lead: they fail alone). */
static size_t lead_len(uint8_t b) { return b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 1; }

ks_status ks__fmt_check_utf8(const ks_reader *r, ks_error *err) {
  const uint8_t *h = r->bytes + 8;
  size_t n = (size_t)r->header_len;
  if (all_ascii(h, n) || ks__utf8_valid(h, n)) return KS_OK;
  size_t i = 0;
  while (i < n) {
    size_t len = lead_len(h[i]);
    if (len > n - i || !ks__utf8_valid(h + i, len)) break;
    i += len;
  }
  return DATA_ERR(r, KS_E_FORMAT, NULL, 8 + i, "header is not valid UTF-8 (byte 0x%02x)", i < n ? h[i] : 0);
}


/* Reading the JSON: one pass, no tree. Names are gathered in a growing arena. */
typedef struct hdr_parse {
  ks_reader *r;
  ks__json j;
  size_t cap;       /* entries allocated */
  size_t arena_len, arena_cap;
  bool seen_meta;
} hdr_parse;

static bool key_is(const char *k, size_t n, const char *lit) { return strlen(lit) == n && !memcmp(k, lit, n); }

static KS_NODISCARD ks_status read_meta(hdr_parse *p) {
  ks__json *j = &p->j;
  if (p->seen_meta) return ks__json_fail(j, KS_E_EXISTS, "__metadata__", "duplicate key '__metadata__'");
  p->seen_meta = true;
  if (ks__json_peek(j, 'n')) return ks__json_skip(j, 0); /* null: no metadata */
  if (!ks__json_peek(j, '{')) return ks__json_fail(j, KS_E_FORMAT, "__metadata__", "__metadata__ is not an object");
  bool first = true, done = false;
  const char *k, *v;
  size_t kn, vn;
  ks_status st;
  while (!(st = ks__json_next_key(j, &first, &done, &k, &kn)) && !done) {
    if (!ks__json_peek(j, '"'))
      return ks__json_fail(j, KS_E_FORMAT, "__metadata__", "metadata value of '%.*s' is not a string",
                           (int)(kn < 200 ? kn : 200), k);
    if (ks__meta_has(p->r->meta, k, kn))
      return ks__json_fail(j, KS_E_EXISTS, "__metadata__", "duplicate metadata key '%.*s'", (int)(kn < 200 ? kn : 200),
                           k);
    if ((st = ks__json_string(j, &j->vbuf, &v, &vn)) != KS_OK) return st;
    if (ks__meta_append(p->r->meta, k, kn, v, vn)) return ks__err(j->err, KS_E_NOMEM, "out of memory reading metadata");
  }
  return st;
}

static KS_NODISCARD ks_status read_dtype(ks__json *j, const char *name, fmt_entry *e) {
  const char *v;
  size_t vn;
  ks_status st = ks__json_string(j, &j->vbuf, &v, &vn);
  if (st) return st;
  if (ks_dtype_parse(v, vn, &e->dtype) == KS_OK) return KS_OK;
  return ks__json_fail(j, KS_E_DTYPE, name, "unknown dtype '%.*s'", (int)(vn < 64 ? vn : 64), v);
}

static KS_NODISCARD ks_status read_dim(ks__json *j, const char *name, fmt_entry *e) {
  if (e->rank == KS_MAX_RANK) return ks__json_fail(j, KS_E_LIMIT, name, "rank exceeds the limit of %d", KS_MAX_RANK);
  uint64_t dim;
  ks_status st = ks__json_u64(j, name, "shape dimension", &dim);
  if (st) return st;
  if (dim > (uint64_t)INT64_MAX) return ks__json_fail(j, KS_E_LIMIT, name, "shape dimension %llu is too large",
                                                    (unsigned long long)dim);
  e->shape[e->rank++] = (int64_t)dim;
  return KS_OK;
}

static KS_NODISCARD ks_status read_shape(ks__json *j, const char *name, fmt_entry *e) {
  ks_status st = ks__json_expect(j, '[');
  if (st || ks__json_peek(j, ']')) return st ? st : (j->pos++, KS_OK);
  for (;;) {
    if ((st = read_dim(j, name, e)) != KS_OK) return st;
    if (ks__json_peek(j, ']')) return j->pos++, KS_OK;
    if ((st = ks__json_expect(j, ',')) != KS_OK) return st;
  }
}

static KS_NODISCARD ks_status read_offsets(ks__json *j, const char *name, fmt_entry *e) {
  ks_status st = ks__json_expect(j, '[');
  if (!st) st = ks__json_u64(j, name, "data_offsets[0]", &e->begin);
  if (!st) st = ks__json_expect(j, ',');
  if (!st) st = ks__json_u64(j, name, "data_offsets[1]", &e->end);
  if (!st && !ks__json_peek(j, ']'))
    return ks__json_fail(j, KS_E_FORMAT, name, "data_offsets must be exactly [begin, end]");
  if (!st) j->pos++;
  return st;
}

/* Offsets must be ordered and span exactly the bytes dtype x shape needs. */
static KS_NODISCARD ks_status check_size(ks__json *j, size_t at, const char *name, const fmt_entry *e) {
  size_t nbytes, save = j->pos;
  char shp[160];
  ks_status st = KS_OK;
  j->pos = at;
  if (e->end < e->begin)
    st = ks__json_fail(j, KS_E_FORMAT, name, "data_offsets [%llu, %llu) end before they begin",
                       (unsigned long long)e->begin, (unsigned long long)e->end);
  else if (ks_shape_size(e->dtype, e->rank, e->shape, NULL, &nbytes))
    st = ks__json_fail(j, KS_E_LIMIT, name, "shape %s of %s overflows the addressable size",
                       ks_shape_format(e->rank, e->shape, shp, sizeof shp), ks_dtype_name(e->dtype));
  else if (e->end - e->begin != nbytes)
    st = ks__json_fail(j, KS_E_SHAPE, name, "data_offsets [%llu, %llu) span %llu bytes but %s %s needs %zu",
                       (unsigned long long)e->begin, (unsigned long long)e->end,
                       (unsigned long long)(e->end - e->begin), ks_dtype_name(e->dtype),
                       ks_shape_format(e->rank, e->shape, shp, sizeof shp), nbytes);
  j->pos = save;
  return st;
}

/* Index of a tensor-entry field (0 dtype, 1 shape, 2 data_offsets), or -1; literal
   lengths let the compiler inline the compares, which run three times per tensor. */
static int field_index(const char *k, size_t kn) {
  if (kn == 5 && !memcmp(k, "dtype", 5)) return 0;
  if (kn == 5 && !memcmp(k, "shape", 5)) return 1;
  if (kn == 12 && !memcmp(k, "data_offsets", 12)) return 2;
  return -1;
}

static KS_NODISCARD ks_status read_field(ks__json *j, const char *name, const char *k, size_t kn, fmt_entry *e,
                                         unsigned *seen) {
  static const char *const fields[] = {"dtype", "shape", "data_offsets"};
  int f = field_index(k, kn);
  if (f < 0) { /* unknown fields are ignored, as the reference reader does; the value sits at depth 3 */
    j->skipping = true;
    ks_status st = ks__json_skip(j, 3);
    j->skipping = false;
    return st;
  }
  if (*seen & (1u << f)) return ks__json_fail(j, KS_E_EXISTS, name, "duplicate key \"%s\"", fields[f]);
  *seen |= 1u << f;
  return f == 0 ? read_dtype(j, name, e) : f == 1 ? read_shape(j, name, e) : read_offsets(j, name, e);
}

static KS_NODISCARD ks_status read_tensor(ks__json *j, const char *name, fmt_entry *e) {
  size_t at = j->pos;
  if (!ks__json_peek(j, '{'))
    return ks__json_fail(j, KS_E_FORMAT, name, j->pos < j->n ? "tensor entry is not an object"
                                                               : "header JSON ends before the tensor entry");
  bool first = true, done = false;
  unsigned seen = 0;
  const char *k;
  size_t kn;
  ks_status st;
  while (!(st = ks__json_next_key(j, &first, &done, &k, &kn)) && !done)
    if ((st = read_field(j, name, k, kn, e, &seen)) != KS_OK) return st;
  if (st) return st;
  if (seen != 7) {
    j->pos = at;
    return ks__json_fail(j, KS_E_FORMAT, name, "tensor entry lacks \"%s\"",
                         !(seen & 1) ? "dtype" : !(seen & 2) ? "shape" : "data_offsets");
  }
  return check_size(j, at, name, e);
}

static KS_NODISCARD ks_status grow(hdr_parse *p, size_t name_len) {
  ks_reader *r = p->r;
  if (ks__grow(&r->alloc, &r->entries, &p->cap, r->count + 1, sizeof *r->entries))
    return ks__err(p->j.err, KS_E_NOMEM, "out of memory for %zu tensors", r->count + 1);
  if (ks__grow(&r->alloc, &r->names, &p->arena_cap, p->arena_len + name_len + 1, 1))
    return ks__err(p->j.err, KS_E_NOMEM, "out of memory for tensor names");
  return KS_OK;
}

static KS_NODISCARD ks_status add_tensor(hdr_parse *p, const char *k, size_t kn) {
  ks_reader *r = p->r;
  if (kn == 0) return ks__json_fail(&p->j, KS_E_FORMAT, NULL, "empty tensor name (a state dict entry needs a name)");
  if (kn > KS_MAX_NAME)
    return ks__json_fail(&p->j, KS_E_LIMIT, NULL, "tensor name of %zu bytes exceeds the limit of %d", kn, KS_MAX_NAME);
  if (r->count >= KS_MAX_TENSORS) return ks__json_fail(&p->j, KS_E_LIMIT, NULL, "more than %u tensors", KS_MAX_TENSORS);
  ks_status st = grow(p, kn);
  if (st) return st;
  fmt_entry *e = &r->entries[r->count++];
  memset(e, 0, sizeof *e);
  char *name = r->names + p->arena_len;
  memcpy(name, k, kn);
  name[kn] = '\0';
  e->name_off = p->arena_len;
  e->name_len = kn;
  e->hash = ks__hash(name, kn);
  p->arena_len += kn + 1;
  return read_tensor(&p->j, name, e);
}

ks_status ks__fmt_read_header(ks_reader *r, ks_error *err) {
  hdr_parse p = {0};
  p.r = r;
  ks__json_init(&p.j, r->bytes + 8, (size_t)r->header_len, 8, r->path, &r->alloc, err);
  if (!ks__json_peek(&p.j, '{')) {
    ks__json_free(&p.j);
    return DATA_ERR(r, KS_E_FORMAT, NULL, 8, "header is not a JSON object");
  }
  bool first = true, done = false;
  const char *k;
  size_t kn;
  ks_status st;
  while (!(st = ks__json_next_key(&p.j, &first, &done, &k, &kn)) && !done) {
    st = key_is(k, kn, "__metadata__") ? read_meta(&p) : add_tensor(&p, k, kn);
    if (st) break;
  }
  if (!st) st = ks__json_end(&p.j);
  ks__json_free(&p.j);
  for (size_t i = 0; i < r->count; i++) r->entries[i].name = r->names + r->entries[i].name_off;
  return st;
}
