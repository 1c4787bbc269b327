/*
 * Parsing the index (untrusted) into a ks_shard_index with the streaming JSON
 * reader: no tree of the whole document is built, so memory follows what the
 * index describes (file entries, per-rank globs, chunks), each checked and
 * capped before it is stored, never the document's bytes times the cost of a
 * tree node. Members the reader does not use (metadata, weight_map's entries,
 * unknown keys) are skipped. Small values (a file entry, a chunk, a shape, the
 * timestamp) are parsed as small trees of at most KS__INDEX_SMALL bytes.
 *
 * Keys may come in any order (the writer sorts them: "sharded" comes before
 * "world_size"), so a first pass records where "files", "per_rank" and
 * "sharded" are, and they are read once the world size is known.
 */
#include <stdlib.h>
#include <string.h>

#include "shard/shard_internal.h"

#define KS__INDEX_SMALL 4096u /* bytes of text of one small value */
#define KS__INDEX_MAX_GLOBS 4096u

/* Where a member's value lies in the text. */
typedef struct span {
  size_t at, len;
  bool set;
} span;

/* What the first pass finds. */
typedef struct doc {
  const ks_allocator *a;
  const char *path;
  ks_error *err;
  const char *text;
  bool weight_map, keepsake;      /* seen, as objects */
  ks__jv *format, *version, *world_size, *timestamp;
  span files, per_rank, sharded;
} doc;

KS_NODISCARD static ks_status bad(ks_error *err, const char *path, const char *key, const char *what) {
  return ks__err_at(err, KS_E_FORMAT, path, key, -1, "index: %s", what);
}

static bool key_is(const char *key, size_t n, const char *want) { return n == strlen(want) && !memcmp(key, want, n); }

/* The next value as a small tree; longer values are refused before any is built. */
KS_NODISCARD static ks_status small_value(ks__json *j, const ks_allocator *a, const char *key, ks__jv **out) {
  ks__json_ws(j);
  size_t at = j->pos;
  ks_status st = ks__json_skip(j, 2);
  if (!st && j->pos - at > KS__INDEX_SMALL)
    st = ks__err_at(j->err, KS_E_LIMIT, j->file, key, j->base + (int64_t)at,
                    "index: the value of '%s' is longer than %u bytes", key, KS__INDEX_SMALL);
  if (!st && (st = ks__jv_parse(a, (const char *)j->s + at, j->pos - at, key, out, j->err)) != KS_OK)
    ks__err_set_file(j->err, j->file);
  return st;
}

KS_NODISCARD static ks_status take_span(ks__json *j, span *sp, const char *key) {
  if (sp->set) return ks__json_fail(j, KS_E_FORMAT, key, "index: '%s' appears twice", key);
  ks__json_ws(j);
  size_t at = j->pos;
  ks_status st = ks__json_skip(j, 2);
  sp->at = (size_t)j->base + at; /* absolute: j may itself read a span */
  sp->len = j->pos - at;
  sp->set = true;
  return st;
}

KS_NODISCARD static ks_status take_small(ks__json *j, doc *d, ks__jv **slot, const char *key) {
  if (*slot) return ks__json_fail(j, KS_E_FORMAT, key, "index: '%s' appears twice", key);
  return small_value(j, d->a, key, slot);
}

KS_NODISCARD static ks_status scan_keepsake(ks__json *j, doc *d) {
  bool first = true, done = false;
  const char *k;
  size_t kn;
  ks_status st = KS_OK;
  while (!st && !(st = ks__json_next_key(j, &first, &done, &k, &kn)) && !done) {
    if (key_is(k, kn, "format")) st = take_small(j, d, &d->format, "keepsake.format");
    else if (key_is(k, kn, "version")) st = take_small(j, d, &d->version, "keepsake.version");
    else if (key_is(k, kn, "world_size")) st = take_small(j, d, &d->world_size, "keepsake.world_size");
    else if (key_is(k, kn, "timestamp")) st = take_small(j, d, &d->timestamp, "keepsake.timestamp");
    else if (key_is(k, kn, "files")) st = take_span(j, &d->files, "keepsake.files");
    else if (key_is(k, kn, "per_rank")) st = take_span(j, &d->per_rank, "keepsake.per_rank");
    else if (key_is(k, kn, "sharded")) st = take_span(j, &d->sharded, "keepsake.sharded");
    else st = ks__json_skip(j, 3);
  }
  return st;
}

KS_NODISCARD static ks_status scan_root(ks__json *j, doc *d) {
  bool first = true, done = false, seen_ks = false, seen_wm = false;
  const char *k;
  size_t kn;
  ks_status st = KS_OK;
  while (!st && !(st = ks__json_next_key(j, &first, &done, &k, &kn)) && !done) {
    bool is_ks = key_is(k, kn, "keepsake"), is_wm = key_is(k, kn, "weight_map");
    if ((is_ks && seen_ks) || (is_wm && seen_wm))
      return ks__json_fail(j, KS_E_FORMAT, NULL, "index: a member appears twice");
    seen_ks |= is_ks;
    seen_wm |= is_wm;
    if (is_ks && (d->keepsake = ks__json_peek(j, '{'))) st = scan_keepsake(j, d);
    else if (is_wm && (d->weight_map = ks__json_peek(j, '{'))) st = ks__json_skip(j, 2);
    else st = ks__json_skip(j, 2);
  }
  return st ? st : ks__json_end(j);
}

/* A reader over one recorded member. */
static void sub(ks__json *s, const doc *d, const span *sp) {
  ks__json_init(s, d->text + sp->at, sp->len, (int64_t)sp->at, d->path, d->a, d->err);
}

/* Array iteration: *done at the closing bracket. */
KS_NODISCARD static ks_status next_item(ks__json *j, bool *first, bool *done) {
  ks_status st;
  if (*first) {
    *first = false;
    if ((st = ks__json_expect(j, '[')) != KS_OK) return st;
  } else if (!ks__json_peek(j, ']') && (st = ks__json_expect(j, ',')) != KS_OK)
    return st;
  *done = ks__json_peek(j, ']');
  if (*done) j->pos++;
  return KS_OK;
}

KS_NODISCARD static ks_status file_entry(ks_shard_index *idx, int r, const ks__jv *f, const char *path, ks_error *err) {
  const char *name = ks__jv_string(ks__jv_get(f, "file"));
  /* version 1 records the whole file's hash, version 2 its header's (docs/FORMAT.md 9.3) */
  const char *hex = ks__jv_string(ks__jv_get(f, idx->version >= 2 ? "header_xxh3" : "xxh3"));
  int64_t fr = -1, size = -1;
  char want[64];
  uint64_t h;
  if (ks_shard_file_name(r, idx->world_size, want, sizeof want)) return bad(err, path, NULL, "bad world size");
  if (!ks__jv_is_int(ks__jv_get(f, "rank"), &fr) || fr != r || !name || strcmp(name, want) ||
      !ks__jv_is_int(ks__jv_get(f, "size"), &size) || size < 0 || !hex || !ks__parse_hex64(hex, strlen(hex), &h))
    return bad(err, path, want,
               idx->version >= 2 ? "a file entry is malformed (rank, file, size, header_xxh3)"
                                 : "a file entry is malformed (rank, file, size, xxh3)");
  idx->infos[r].size = (uint64_t)size;
  idx->infos[r].checksum = h;
  if (!(idx->files[r] = ks__strdup(&idx->alloc, name))) return ks__err(err, KS_E_NOMEM, "out of memory");
  return KS_OK;
}

KS_NODISCARD static ks_status parse_files(ks_shard_index *idx, const doc *d) {
  static const char *const why = "'files' must list one file per rank";
  ks__json j;
  if (!d->files.set) return bad(d->err, d->path, "keepsake.files", why);
  sub(&j, d, &d->files);
  idx->files = ks__calloc(&idx->alloc, (size_t)idx->world_size, sizeof *idx->files);
  idx->infos = ks__calloc(&idx->alloc, (size_t)idx->world_size, sizeof *idx->infos);
  ks_status st = idx->files && idx->infos ? KS_OK : ks__err(d->err, KS_E_NOMEM, "out of memory reading the index");
  if (!st && !ks__json_peek(&j, '[')) st = bad(d->err, d->path, "keepsake.files", why);
  bool first = true, done = false;
  int r = 0;
  while (!st && !(st = next_item(&j, &first, &done)) && !done) {
    ks__jv *f = NULL;
    if (r == idx->world_size) st = bad(d->err, d->path, "keepsake.files", why);
    if (!st) st = small_value(&j, d->a, "keepsake.files", &f);
    if (!st) st = file_entry(idx, r++, f, d->path, d->err);
    ks__jv_free(d->a, f);
  }
  if (!st && r != idx->world_size) st = bad(d->err, d->path, "keepsake.files", why);
  ks__json_free(&j);
  return st;
}

/* A string value copied; NULL (with st set) when it is not one or holds a NUL. */
static char *string_copy(ks__json *j, const ks_allocator *a, const char *key, ks_status *st) {
  const char *s;
  size_t n;
  if (!ks__json_peek(j, '"'))
    return (*st = ks__json_fail(j, KS_E_FORMAT, key, "index: '%s' must hold strings", key)), NULL;
  if ((*st = ks__json_string(j, &j->vbuf, &s, &n)) != KS_OK) return NULL;
  if (memchr(s, 0, n))
    return (*st = ks__json_fail(j, KS_E_FORMAT, key, "index: a string in '%s' holds a NUL", key)), NULL;
  char *c = ks__malloc(a, n + 1);
  if (!c) return (*st = ks__err(j->err, KS_E_NOMEM, "out of memory reading the index")), NULL;
  memcpy(c, s, n);
  c[n] = '\0';
  return c;
}

KS_NODISCARD static ks_status parse_per_rank(ks_shard_index *idx, const doc *d) {
  static const char *const key = "keepsake.per_rank";
  ks__json j;
  if (!d->per_rank.set) return bad(d->err, d->path, key, "'per_rank' must be an array");
  sub(&j, d, &d->per_rank);
  idx->per_rank = ks__calloc(&idx->alloc, KS__INDEX_MAX_GLOBS, sizeof(char *));
  ks_status st = idx->per_rank ? KS_OK : ks__err(d->err, KS_E_NOMEM, "out of memory");
  if (!st && !ks__json_peek(&j, '[')) st = bad(d->err, d->path, key, "'per_rank' must be an array");
  bool first = true, done = false;
  while (!st && !(st = next_item(&j, &first, &done)) && !done) {
    if (idx->n_per_rank == KS__INDEX_MAX_GLOBS) st = bad(d->err, d->path, key, "'per_rank' holds more than 4096 globs");
    char *g = st ? NULL : string_copy(&j, d->a, key, &st);
    if (g) idx->per_rank[idx->n_per_rank++] = g;
  }
  ks__json_free(&j);
  return st;
}

/* ---- the sharded section ---- */

/* One chunk's fields: a rank file of the index, and offsets and shape inside the global shape. */
KS_NODISCARD static ks_status parse_chunk(const ks_shard_index *idx, const ks__sharded *s, size_t j, const ks__jv *c,
                             ks__saved_chunk *k, const char *path, ks_error *err) {
  int64_t fr = -1, off[KS_MAX_RANK], shape[KS_MAX_RANK];
  k->file = ks__jv_is_int(ks__jv_get(c, "rank"), &fr) && fr >= 0 && fr < idx->world_size ? (int)fr : -1;
  if (k->file < 0 || ks__shard_dims(ks__jv_get(c, "offsets"), off) != s->rank ||
      ks__shard_dims(ks__jv_get(c, "shape"), shape) != s->rank)
    return ks__err_at(err, KS_E_FORMAT, path, s->name, -1,
                      "index: '%s' chunk %zu is malformed (rank of a file 0 to %d; offsets and shape of %d "
                      "non-negative integers)",
                      s->name, j, idx->world_size - 1, s->rank);
  for (int d = 0; d < s->rank; d++) {
    k->offsets[d] = off[d];
    k->shape[d] = shape[d];
  }
  for (int d = 0; d < s->rank; d++)
    if (k->offsets[d] > s->global_shape[d] || k->shape[d] > s->global_shape[d] - k->offsets[d])
      return ks__err_at(err, KS_E_FORMAT, path, s->name, -1,
                        "index: '%s' chunk %zu (rank %d) lies outside the global shape in dimension %d", s->name, j,
                        k->file, d);
  return KS_OK;
}

/* Counts the chunks (a first pass that stores nothing), refusing more than the files can hold. */
KS_NODISCARD static ks_status count_chunks(const ks_shard_index *idx, const doc *d, const ks__sharded *s,
                                           const span *sp, const ks__shard_tally *t, size_t *n) {
  ks__json j;
  sub(&j, d, sp);
  ks_status st = ks__json_peek(&j, '[') ? KS_OK : bad(d->err, d->path, s->name, "'chunks' must be an array");
  bool first = true, done = false;
  *n = 0;
  while (!st && !(st = next_item(&j, &first, &done)) && !done) {
    /* A rank file holds one chunk of a tensor at most: more chunks than files cannot tile it. */
    if (*n == (size_t)idx->world_size || t->chunks + *n == KS__SHARD_MAX_CHUNKS)
      st = ks__err_at(d->err, KS_E_FORMAT, d->path, s->name, (int64_t)sp->at,
                      "index: '%s' lists more chunks than its %d rank files (or than %u in all) can hold", s->name,
                      idx->world_size, KS__SHARD_MAX_CHUNKS);
    else if (!(st = ks__json_skip(&j, 2)))
      (*n)++;
  }
  ks__json_free(&j);
  return st;
}

KS_NODISCARD static ks_status parse_chunks(ks_shard_index *idx, const doc *d, size_t ti, const span *sp,
                                           ks__shard_tally *t) {
  ks__sharded *s = &idx->sharded[ti];
  size_t n = 0;
  ks_status st =
      sp->set ? count_chunks(idx, d, s, sp, t, &n) : bad(d->err, d->path, s->name, "'chunks' must be an array");
  if (st) return st;
  t->chunks += n;
  s->n_chunks = n;
  size_t per = 2 * (size_t)s->rank, n_dims;
  if (!ks__mul_size(n, per, &n_dims)) return ks__err(d->err, KS_E_LIMIT, "too many chunks");
  s->chunks = ks__calloc(&idx->alloc, n ? n : 1, sizeof *s->chunks);
  s->dims = ks__calloc(&idx->alloc, n_dims ? n_dims : 1, sizeof *s->dims);
  if (!s->chunks || !s->dims) return ks__err(d->err, KS_E_NOMEM, "out of memory");
  for (size_t i = 0; i < n; i++) {
    s->chunks[i].offsets = s->dims + i * per;
    s->chunks[i].shape = s->dims + i * per + s->rank;
  }
  ks__json j;
  sub(&j, d, sp);
  bool first = true, done = false;
  for (size_t i = 0; !st && !(st = next_item(&j, &first, &done)) && !done; i++) {
    ks__jv *c = NULL;
    st = small_value(&j, d->a, s->name, &c);
    if (!st) st = parse_chunk(idx, s, i, c, &s->chunks[i], d->path, d->err);
    ks__jv_free(d->a, c);
  }
  ks__json_free(&j);
  return st ? st : ks__shard_check_tiling(idx, ti, t, d->path, d->err);
}

/* A tensor's members: dtype and global shape as small values, the chunks as a span read after them. */
KS_NODISCARD static ks_status parse_tensor(ks_shard_index *idx, const doc *d, ks__json *j, size_t ti,
                                           ks__shard_tally *t) {
  ks__sharded *s = &idx->sharded[ti];
  if (!ks__json_peek(j, '{')) return bad(d->err, d->path, s->name, "a sharded tensor must be an object");
  ks__jv *dtype = NULL, *shape = NULL;
  span chunks = {0, 0, false};
  bool first = true, done = false;
  const char *k;
  size_t kn;
  ks_status st = KS_OK;
  while (!st && !(st = ks__json_next_key(j, &first, &done, &k, &kn)) && !done) {
    if (key_is(k, kn, "dtype"))
      st = dtype ? bad(d->err, d->path, s->name, "'dtype' appears twice") : small_value(j, d->a, s->name, &dtype);
    else if (key_is(k, kn, "global_shape"))
      st =
          shape ? bad(d->err, d->path, s->name, "'global_shape' appears twice") : small_value(j, d->a, s->name, &shape);
    else if (key_is(k, kn, "chunks")) st = take_span(j, &chunks, s->name);
    else st = ks__json_skip(j, 4);
  }
  const char *dn = ks__jv_string(dtype);
  if (!st && (!dn || ks_dtype_parse(dn, strlen(dn), &s->dtype)))
    st = bad(d->err, d->path, s->name, "a sharded tensor needs a known dtype");
  if (!st && (s->rank = ks__shard_dims(shape, s->global_shape)) < 0)
    st = bad(d->err, d->path, s->name, "a sharded tensor needs a global shape of at most 8 non-negative integers");
  ks__jv_free(d->a, dtype);
  ks__jv_free(d->a, shape);
  return st ? st : parse_chunks(idx, d, ti, &chunks, t);
}

KS_NODISCARD static ks_status grow_sharded(ks_shard_index *idx, size_t *cap, ks_error *err) {
  if (idx->n_sharded < *cap) return KS_OK;
  size_t n = *cap ? *cap * 2 : 16;
  ks__sharded *p = ks__realloc(&idx->alloc, idx->sharded, n * sizeof *p);
  if (!p) return ks__err(err, KS_E_NOMEM, "out of memory reading the index");
  memset(p + *cap, 0, (n - *cap) * sizeof *p);
  idx->sharded = p;
  *cap = n;
  return KS_OK;
}

static int by_name(const void *x, const void *y) {
  return strcmp(*(const char *const *)x, *(const char *const *)y);
}

/* Tensor names are unique (a tree would have refused a duplicate key): sorted, neighbours differ. */
KS_NODISCARD static ks_status unique_names(const ks_shard_index *idx, const doc *d) {
  const char **names = ks__calloc(&idx->alloc, idx->n_sharded ? idx->n_sharded : 1, sizeof *names);
  if (!names) return ks__err(d->err, KS_E_NOMEM, "out of memory");
  for (size_t i = 0; i < idx->n_sharded; i++) names[i] = idx->sharded[i].name;
  qsort(names, idx->n_sharded, sizeof *names, by_name);
  ks_status st = KS_OK;
  for (size_t i = 1; !st && i < idx->n_sharded; i++)
    if (!strcmp(names[i - 1], names[i])) st = bad(d->err, d->path, names[i], "a sharded tensor is listed twice");
  ks__free(&idx->alloc, (void *)names);
  return st;
}

KS_NODISCARD static ks_status parse_sharded(ks_shard_index *idx, const doc *d) {
  static const char *const key = "keepsake.sharded";
  if (!d->sharded.set) return bad(d->err, d->path, key, "'sharded' must be an object");
  ks__json j;
  sub(&j, d, &d->sharded);
  ks__shard_tally t = {ks__calloc(&idx->alloc, (size_t)idx->world_size, sizeof *t.bytes),
                       ks__calloc(&idx->alloc, (size_t)idx->world_size, sizeof *t.seen), 0};
  ks_status st = t.bytes && t.seen ? KS_OK : ks__err(d->err, KS_E_NOMEM, "out of memory");
  if (!st && !ks__json_peek(&j, '{')) st = bad(d->err, d->path, key, "'sharded' must be an object");
  bool first = true, done = false;
  size_t cap = 0;
  while (!st && !(st = grow_sharded(idx, &cap, d->err))) {
    const char *k;
    size_t kn;
    if ((st = ks__json_next_key(&j, &first, &done, &k, &kn)) || done) break;
    if (!kn || kn > KS_MAX_NAME || memchr(k, 0, kn)) {
      st = bad(d->err, d->path, key, "a sharded tensor's name is not a valid name (1 to 1024 bytes, no NUL)");
      break;
    }
    ks__sharded *s = &idx->sharded[idx->n_sharded++];
    if (!(s->name = ks__malloc(&idx->alloc, kn + 1))) {
      st = ks__err(d->err, KS_E_NOMEM, "out of memory");
      break;
    }
    memcpy(s->name, k, kn);
    s->name[kn] = '\0';
    st = parse_tensor(idx, d, &j, idx->n_sharded - 1, &t);
  }
  if (!st) st = unique_names(idx, d);
  ks__free(&idx->alloc, t.bytes);
  ks__free(&idx->alloc, t.seen);
  ks__json_free(&j);
  return st;
}

/* The checks of the small members, in the order a reader needs them. */
KS_NODISCARD static ks_status check_head(ks_shard_index *idx, const doc *d) {
  const char *path = d->path;
  if (d->weight_map && !d->keepsake) /* a Hugging Face layout: the import reads it (docs/FORMAT.md 12) */
    return ks__err_at(d->err, KS_E_UNSUPPORTED, path, NULL, -1,
                      "index: a Hugging Face index (a weight_map, no keepsake object): a safetensors layout, not a "
                      "keepsake sharded checkpoint; 'keepsake convert' and ks_dcp_import read it");
  if (!d->weight_map || !d->keepsake)
    return bad(d->err, path, NULL, "not a keepsake sharded index (no weight_map / keepsake object)");
  const char *format = ks__jv_string(d->format);
  if (!format || strcmp(format, "keepsake-sharded"))
    return bad(d->err, path, "keepsake.format", "format is not 'keepsake-sharded'");
  int64_t version, ws;
  if (!ks__jv_is_int(d->version, &version)) return bad(d->err, path, "keepsake.version", "no version");
  if (version > KS_SHARD_INDEX_VERSION || version < 1)
    return ks__err_at(d->err, KS_E_VERSION, path, "keepsake.version", -1,
                      "index version %lld; this library reads versions 1 to %d: upgrade keepsake", (long long)version,
                      KS_SHARD_INDEX_VERSION);
  idx->version = (int)version;
  if (!ks__jv_is_int(d->world_size, &ws) || ws < 1 || ws > KS_SHARD_MAX_WORLD)
    return bad(d->err, path, "keepsake.world_size", "world_size must be 1 to 99999");
  idx->world_size = (int)ws;
  if (!ks__shard_ts_parse(d->timestamp, &idx->ts))
    return bad(d->err, path, "keepsake.timestamp", "malformed timestamp");
  return KS_OK;
}

ks_status ks__shard_index_parse(ks_shard_index *idx, const char *text, size_t len, const char *path, ks_error *err) {
  doc d;
  memset(&d, 0, sizeof d);
  d.a = &idx->alloc;
  d.path = path;
  d.err = err;
  d.text = text;
  ks__json j;
  ks__json_init(&j, text, len, 0, path, d.a, err);
  ks_status st = scan_root(&j, &d);
  ks__json_free(&j);
  if (!st) st = check_head(idx, &d);
  if (!st) st = parse_files(idx, &d);
  if (!st) st = parse_per_rank(idx, &d);
  if (!st) st = parse_sharded(idx, &d);
  ks__jv_free(d.a, d.format);
  ks__jv_free(d.a, d.version);
  ks__jv_free(d.a, d.world_size);
  ks__jv_free(d.a, d.timestamp);
  return st;
}
