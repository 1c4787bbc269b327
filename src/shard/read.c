/* Reading and validating the index, and checking a rank file against it. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <xxhash.h>

#include "core/io_ops.h"
#include "shard/shard_internal.h"

#define KS__MAX_INDEX (256u << 20) /* bytes of index JSON accepted */

void ks_shard_index_free(ks_shard_index *idx) {
  if (!idx) return;
  const ks_allocator *a = &idx->alloc;
  for (size_t i = 0; idx->per_rank && i < idx->n_per_rank; i++) ks__free(a, idx->per_rank[i]);
  for (int i = 0; idx->files && i < idx->world_size; i++) ks__free(a, idx->files[i]);
  for (size_t i = 0; idx->sharded && i < idx->n_sharded; i++) {
    ks__free(a, idx->sharded[i].name);
    ks__free(a, idx->sharded[i].chunks);
  }
  ks__free(a, idx->per_rank);
  ks__free(a, idx->files);
  ks__free(a, idx->infos);
  ks__free(a, idx->sharded);
  ks_allocator copy = idx->alloc;
  ks__free(&copy, idx);
}

int ks_shard_index_world_size(const ks_shard_index *idx) { return idx ? idx->world_size : 0; }
int64_t ks_shard_index_epoch(const ks_shard_index *idx) { return idx ? idx->ts.epoch : -1; }
int64_t ks_shard_index_batch(const ks_shard_index *idx) { return idx ? idx->ts.batch : -1; }

const char *ks_shard_index_file(const ks_shard_index *idx, int rank, ks_shard_file_info *info) {
  if (!idx || rank < 0 || rank >= idx->world_size) return NULL;
  if (info) *info = idx->infos[rank];
  return idx->files[rank];
}

size_t ks_shard_index_sharded_count(const ks_shard_index *idx) { return idx ? idx->n_sharded : 0; }

ks_status ks_shard_index_sharded_at(const ks_shard_index *idx, size_t i, ks_shard_chunk *whole, ks_dtype *dtype,
                                    size_t *n_chunks) {
  if (!idx || i >= idx->n_sharded) return KS_E_NOTFOUND;
  const ks__sharded *s = &idx->sharded[i];
  if (whole) {
    memset(whole, 0, sizeof *whole);
    whole->name = s->name;
    whole->rank = s->rank;
    memcpy(whole->global_shape, s->global_shape, sizeof whole->global_shape);
    memcpy(whole->shape, s->global_shape, sizeof whole->shape);
  }
  if (dtype) *dtype = s->dtype;
  if (n_chunks) *n_chunks = s->n_chunks;
  return KS_OK;
}

ks_status ks_shard_index_chunk(const ks_shard_index *idx, size_t i, size_t j, ks_shard_chunk *chunk, int *file) {
  if (!idx || i >= idx->n_sharded || j >= idx->sharded[i].n_chunks) return KS_E_NOTFOUND;
  const ks__sharded *s = &idx->sharded[i];
  const ks__saved_chunk *k = &s->chunks[j];
  if (chunk) {
    memset(chunk, 0, sizeof *chunk);
    chunk->name = s->name;
    chunk->rank = s->rank;
    memcpy(chunk->global_shape, s->global_shape, sizeof chunk->global_shape);
    memcpy(chunk->offsets, k->offsets, sizeof chunk->offsets);
    memcpy(chunk->shape, k->shape, sizeof chunk->shape);
  }
  if (file) *file = k->file;
  return KS_OK;
}

const char *const *ks_shard_index_per_rank(const ks_shard_index *idx, size_t *n) {
  if (n) *n = idx ? idx->n_per_rank : 0;
  return idx ? (const char *const *)idx->per_rank : NULL;
}

static ks_status bad(ks_error *err, const char *path, const char *key, const char *what) {
  return ks__err_at(err, KS_E_FORMAT, path, key, -1, "index: %s", what);
}

static ks_status parse_files(ks_shard_index *idx, const ks__jv *files, const char *path, ks_error *err) {
  if (!ks__jv_is(files, KS__JV_ARRAY) || files->len != (size_t)idx->world_size)
    return bad(err, path, "keepsake.files", "'files' must list one file per rank");
  idx->files = ks__calloc(&idx->alloc, (size_t)idx->world_size, sizeof *idx->files);
  idx->infos = ks__calloc(&idx->alloc, (size_t)idx->world_size, sizeof *idx->infos);
  if (!idx->files || !idx->infos) return ks__err(err, KS_E_NOMEM, "out of memory reading the index");
  for (int r = 0; r < idx->world_size; r++) {
    const ks__jv *f = files->items[r];
    const char *name = ks__jv_string(ks__jv_get(f, "file"));
    const char *hex = ks__jv_string(ks__jv_get(f, "xxh3"));
    int64_t fr = -1, size = -1;
    char want[64];
    uint64_t h;
    if (ks_shard_file_name(r, idx->world_size, want, sizeof want)) return bad(err, path, NULL, "bad world size");
    if (!ks__jv_is_int(ks__jv_get(f, "rank"), &fr) || fr != r || !name || strcmp(name, want) ||
        !ks__jv_is_int(ks__jv_get(f, "size"), &size) || size < 0 || !hex || !ks__parse_hex64(hex, strlen(hex), &h))
      return bad(err, path, want, "a file entry is malformed (rank, file, size, xxh3)");
    idx->infos[r].size = (uint64_t)size;
    idx->infos[r].checksum = h;
    if (!(idx->files[r] = ks__strdup(&idx->alloc, name))) return ks__err(err, KS_E_NOMEM, "out of memory");
  }
  return KS_OK;
}

static ks_status parse_chunks(ks_shard_index *idx, ks__sharded *s, const ks__jv *chunks, const char *path,
                              ks_error *err) {
  if (!ks__jv_is(chunks, KS__JV_ARRAY) || chunks->len > (size_t)idx->world_size * 64u)
    return bad(err, path, s->name, "'chunks' must be an array");
  s->n_chunks = chunks->len;
  s->chunks = ks__calloc(&idx->alloc, s->n_chunks ? s->n_chunks : 1, sizeof *s->chunks);
  if (!s->chunks) return ks__err(err, KS_E_NOMEM, "out of memory");
  uint64_t covered = 0, whole = 1;
  for (int d = 0; d < s->rank; d++) whole *= (uint64_t)s->global_shape[d];
  for (size_t i = 0; i < s->n_chunks; i++) {
    const ks__jv *c = chunks->items[i];
    ks__saved_chunk *k = &s->chunks[i];
    int64_t fr = -1;
    k->file = ks__jv_is_int(ks__jv_get(c, "rank"), &fr) && fr >= 0 && fr < idx->world_size ? (int)fr : -1;
    if (k->file < 0 || ks__shard_dims(ks__jv_get(c, "offsets"), k->offsets) != s->rank ||
        ks__shard_dims(ks__jv_get(c, "shape"), k->shape) != s->rank)
      return bad(err, path, s->name, "a chunk is malformed (rank, offsets, shape)");
    uint64_t n = 1;
    for (int d = 0; d < s->rank; d++) {
      if (k->offsets[d] > s->global_shape[d] || k->shape[d] > s->global_shape[d] - k->offsets[d])
        return bad(err, path, s->name, "a chunk lies outside the global shape");
      n *= (uint64_t)k->shape[d];
    }
    covered += n;
  }
  if (covered != whole) return bad(err, path, s->name, "the chunks do not cover the tensor exactly");
  return KS_OK;
}

static ks_status parse_sharded(ks_shard_index *idx, const ks__jv *sharded, const char *path, ks_error *err) {
  if (!ks__jv_is(sharded, KS__JV_OBJECT)) return bad(err, path, "keepsake.sharded", "'sharded' must be an object");
  idx->n_sharded = sharded->len;
  idx->sharded = ks__calloc(&idx->alloc, idx->n_sharded ? idx->n_sharded : 1, sizeof *idx->sharded);
  if (!idx->sharded) return ks__err(err, KS_E_NOMEM, "out of memory");
  for (size_t i = 0; i < sharded->len; i++) {
    const char *key = sharded->keys[i];
    const ks__jv *v = sharded->items[i];
    ks__sharded *s = &idx->sharded[i];
    if (!(s->name = ks__strdup(&idx->alloc, key))) return ks__err(err, KS_E_NOMEM, "out of memory");
    const char *dn = ks__jv_string(ks__jv_get(v, "dtype"));
    if (!dn || ks_dtype_parse(dn, strlen(dn), &s->dtype) ||
        (s->rank = ks__shard_dims(ks__jv_get(v, "global_shape"), s->global_shape)) < 0)
      return bad(err, path, key, "a sharded tensor needs a dtype and a global shape");
    ks_status st = parse_chunks(idx, s, ks__jv_get(v, "chunks"), path, err);
    if (st) return st;
  }
  return KS_OK;
}

static ks_status parse_per_rank(ks_shard_index *idx, const ks__jv *pr, const char *path, ks_error *err) {
  if (!ks__jv_is(pr, KS__JV_ARRAY) || pr->len > 4096) return bad(err, path, "keepsake.per_rank", "'per_rank' must be an array");
  idx->n_per_rank = pr->len;
  idx->per_rank = ks__calloc(&idx->alloc, idx->n_per_rank ? idx->n_per_rank : 1, sizeof(char *));
  if (!idx->per_rank) return ks__err(err, KS_E_NOMEM, "out of memory");
  for (size_t i = 0; i < idx->n_per_rank; i++) {
    const char *g = ks__jv_string(pr->items[i]);
    if (!g) return bad(err, path, "keepsake.per_rank", "'per_rank' must hold strings");
    if (!(idx->per_rank[i] = ks__strdup(&idx->alloc, g))) return ks__err(err, KS_E_NOMEM, "out of memory");
  }
  return KS_OK;
}

static ks_status parse(ks_shard_index *idx, const ks__jv *root, const char *path, ks_error *err) {
  const ks__jv *ks = ks__jv_get(root, "keepsake");
  if (!ks__jv_is(ks__jv_get(root, "weight_map"), KS__JV_OBJECT) || !ks__jv_is(ks, KS__JV_OBJECT))
    return bad(err, path, NULL, "not a keepsake sharded index (no weight_map / keepsake object)");
  const char *format = ks__jv_string(ks__jv_get(ks, "format"));
  if (!format || strcmp(format, "keepsake-sharded")) return bad(err, path, "keepsake.format", "format is not 'keepsake-sharded'");
  int64_t version, ws;
  if (!ks__jv_is_int(ks__jv_get(ks, "version"), &version)) return bad(err, path, "keepsake.version", "no version");
  if (version > KS_SHARD_INDEX_VERSION || version < 1)
    return ks__err_at(err, KS_E_VERSION, path, "keepsake.version", -1,
                      "index version %lld; this library reads versions 1 to %d: upgrade keepsake", (long long)version,
                      KS_SHARD_INDEX_VERSION);
  if (!ks__jv_is_int(ks__jv_get(ks, "world_size"), &ws) || ws < 1 || ws > KS_SHARD_MAX_WORLD)
    return bad(err, path, "keepsake.world_size", "world_size must be 1 to 99999");
  idx->world_size = (int)ws;
  if (!ks__shard_ts_parse(ks__jv_get(ks, "timestamp"), &idx->ts))
    return bad(err, path, "keepsake.timestamp", "malformed timestamp");
  ks_status st = parse_files(idx, ks__jv_get(ks, "files"), path, err);
  if (!st) st = parse_per_rank(idx, ks__jv_get(ks, "per_rank"), path, err);
  if (!st) st = parse_sharded(idx, ks__jv_get(ks, "sharded"), path, err);
  return st;
}

/* The whole of `path` (at most cap bytes) through io; *buf is NUL-terminated. errno-style result. */
static int read_all(const ks_io *io, const ks_allocator *a, const char *path, uint64_t cap, char **buf, size_t *len,
                    int *too_big) {
  int fd, rc;
  uint64_t size;
  *buf = NULL;
  *too_big = 0;
  if ((rc = io->open_fn(io->ctx, path, &fd, &size)) != 0) return rc;
  if (size > cap) {
    *too_big = 1;
    io->close_fn(io->ctx, fd);
    return 0;
  }
  char *p = ks__malloc(a, (size_t)size + 1);
  size_t done = 0, got = 0;
  rc = p ? 0 : ENOMEM;
  while (!rc && done < size && !(rc = io->read_fn(io->ctx, fd, p + done, (size_t)size - done, done, &got)) && got)
    done += got;
  io->close_fn(io->ctx, fd);
  if (rc) {
    ks__free(a, p);
    return rc;
  }
  p[done] = '\0';
  *buf = p;
  *len = done;
  return 0;
}

ks_status ks_shard_index_read_io(const char *dir, const ks_allocator *alloc, const ks_io *io, ks_shard_index **out,
                                  ks_error *err) {
  if (!dir || !out) return ks__err(err, KS_E_INVALID, "ks_shard_index_read: NULL argument");
  io = ks__io_v2(io);
  char *path = ks__shard_join(alloc, dir, KS_SHARD_INDEX_NAME), *text = NULL;
  if (!path) return ks__err(err, KS_E_NOMEM, "out of memory");
  size_t len = 0;
  int too_big = 0, rc = read_all(io, alloc, path, KS__MAX_INDEX, &text, &len, &too_big);
  ks_status st = KS_OK;
  if (rc == ENOENT) st = ks__err_at(err, KS_E_NOTFOUND, path, NULL, -1, "no index: not a complete sharded checkpoint");
  else if (rc == ENOMEM) st = ks__err(err, KS_E_NOMEM, "out of memory reading the index");
  else if (rc) st = ks__err_at(err, KS_E_IO, path, NULL, -1, "cannot read the index: %s", strerror(rc));
  else if (too_big) st = ks__err_at(err, KS_E_LIMIT, path, NULL, -1, "index is larger than %u bytes", KS__MAX_INDEX);
  ks__jv *root = NULL;
  if (!st && (st = ks__jv_parse(alloc, text, len, NULL, &root, err)) && err) {
    ks__err_set_file(err, path);
    if (st == KS_E_FORMAT) {
      char why[sizeof err->message];
      snprintf(why, sizeof why, "%s", err->message);
      ks__err_at(err, st, path, NULL, err->offset, "index is not JSON: %s", why);
    }
  }
  ks_shard_index *idx = st ? NULL : ks__calloc(alloc, 1, sizeof *idx);
  if (!st && !idx) st = ks__err(err, KS_E_NOMEM, "out of memory");
  if (!st) {
    idx->alloc = *ks__alloc_or_default(alloc);
    st = parse(idx, root, path, err);
  }
  ks__jv_free(alloc, root);
  ks__free(alloc, text);
  ks__free(alloc, path);
  if (st) {
    ks_shard_index_free(idx);
    return st;
  }
  *out = idx;
  return KS_OK;
}

ks_status ks_shard_index_read(const char *dir, const ks_allocator *alloc, ks_shard_index **out, ks_error *err) {
  return ks_shard_index_read_io(dir, alloc, NULL, out, err);
}

/* XXH3-64 of an open file: mapped when the table can map, else read in blocks. errno-style result. */
static int hash_fd(const ks_io *io, const ks_allocator *a, int fd, uint64_t size, uint64_t *hash) {
  const void *p = NULL;
  if (io->map_fn && size && io->map_fn(io->ctx, fd, size, &p) == 0) {
    *hash = ks_checksum(p, (size_t)size);
    io->unmap_fn(io->ctx, p, size);
    return 0;
  }
  if (!size) return (*hash = ks_checksum("", 0)), 0;
  XXH3_state_t *xx = XXH3_createState();
  size_t cap = 1u << 20;
  uint8_t *buf = ks__malloc(a, cap);
  int rc = xx && buf ? 0 : ENOMEM;
  if (!rc) XXH3_64bits_reset(xx);
  for (uint64_t off = 0; !rc && off < size;) {
    size_t want = size - off < cap ? (size_t)(size - off) : cap, got = 0;
    if (!(rc = io->read_fn(io->ctx, fd, buf, want, off, &got)) && !got) rc = EIO; /* shrank meanwhile */
    if (!rc) XXH3_64bits_update(xx, buf, got), off += got;
  }
  if (!rc) *hash = XXH3_64bits_digest(xx);
  XXH3_freeState(xx);
  ks__free(a, buf);
  return rc;
}

ks_status ks_shard_verify_file_io(const char *dir, const ks_shard_index *idx, int rank, const ks_io *io,
                                   ks_error *err) {
  if (!dir || !idx || rank < 0 || rank >= idx->world_size) return ks__err(err, KS_E_INVALID, "ks_shard_verify_file: bad argument");
  io = ks__io_v2(io);
  char *path = ks__shard_join(&idx->alloc, dir, idx->files[rank]);
  if (!path) return ks__err(err, KS_E_NOMEM, "out of memory");
  const ks_shard_file_info *want = &idx->infos[rank];
  const char *name = idx->files[rank];
  int fd = -1;
  uint64_t size = 0, hash = 0;
  ks_status st = KS_OK;
  int rc = io->open_fn(io->ctx, path, &fd, &size);
  if (rc == ENOENT) st = ks__err_at(err, KS_E_NOTFOUND, path, NULL, -1, "rank %d: shard file %s is missing", rank, name);
  else if (rc) st = ks__err_at(err, KS_E_IO, path, NULL, -1, "rank %d: cannot open %s: %s", rank, name, strerror(rc));
  else if (size != want->size)
    st = ks__err_at(err, KS_E_FORMAT, path, NULL, (int64_t)size, "rank %d: shard file %s is %s: %llu bytes, the index says %llu",
                    rank, name, size < want->size ? "truncated" : "longer than recorded", (unsigned long long)size,
                    (unsigned long long)want->size);
  else if ((rc = hash_fd(io, &idx->alloc, fd, size, &hash)) != 0)
    st = rc == ENOMEM ? ks__err(err, KS_E_NOMEM, "out of memory hashing %s", name)
                      : ks__err_at(err, KS_E_IO, path, NULL, -1, "rank %d: cannot read %s: %s", rank, name, strerror(rc));
  else if (hash != want->checksum)
    st = ks__err_at(err, KS_E_CHECKSUM, path, NULL, -1,
                    "rank %d: shard file %s is corrupt: XXH3 %016llx, the index says %016llx", rank, name,
                    (unsigned long long)hash, (unsigned long long)want->checksum);
  if (fd >= 0) io->close_fn(io->ctx, fd);
  ks__free(&idx->alloc, path);
  return st;
}

ks_status ks_shard_verify_file(const char *dir, const ks_shard_index *idx, int rank, ks_error *err) {
  return ks_shard_verify_file_io(dir, idx, rank, NULL, err);
}
