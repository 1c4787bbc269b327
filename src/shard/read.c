/* Reading and validating the index, and checking a rank file against it. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "core/io_ops.h"
#include "core/xxh.h"
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
    ks__free(a, idx->sharded[i].dims);
  }
  ks__free(a, idx->per_rank);
  ks__free(a, idx->files);
  ks__free(a, idx->infos);
  ks__free(a, idx->sharded);
  ks_allocator copy = idx->alloc;
  ks__free(&copy, idx);
}

void ks_shard_index_get(const ks_shard_index *idx, ks_shard_index_info *out) {
  if (!out) return;
  ks_shard_index_info in = {.size = out->size, .epoch = -1, .batch = -1};
  if (idx) {
    in.version = idx->version;
    in.world_size = idx->world_size;
    in.epoch = idx->ts.epoch;
    in.batch = idx->ts.batch;
    in.n_sharded = idx->n_sharded;
    in.per_rank = (const char *const *)idx->per_rank;
    in.n_per_rank = idx->n_per_rank;
  }
  /* The members the caller's layout has (size 0: this library's), as the option structs are read. */
  memcpy(out, &in, out->size && out->size < sizeof in ? out->size : sizeof in);
}

const char *ks_shard_index_file(const ks_shard_index *idx, int rank, ks_shard_file_info *info) {
  if (!idx || rank < 0 || rank >= idx->world_size) return NULL;
  if (info) *info = idx->infos[rank];
  return idx->files[rank];
}

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
    for (int d = 0; d < s->rank; d++) {
      chunk->offsets[d] = k->offsets[d];
      chunk->shape[d] = k->shape[d];
    }
  }
  if (file) *file = k->file;
  return KS_OK;
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

/* No index: not a complete sharded checkpoint. A torch DCP directory (its `.metadata`) is named as such, for the
   import reads it (docs/FORMAT.md 12); the status stays KS_E_NOTFOUND, which callers read as "no checkpoint". */
KS_NODISCARD static ks_status no_index(const char *dir, const ks_allocator *alloc, const ks_io *io, const char *path,
                                       ks_error *err) {
  char *md = ks__shard_join(alloc, dir, ".metadata");
  ks_io_stat s;
  bool torch_dcp = md && io->stat_fn(io->ctx, md, &s) == 0 && s.kind == KS_IO_FILE;
  ks__free(alloc, md);
  if (torch_dcp)
    return ks__err_at(err, KS_E_NOTFOUND, path, NULL, -1,
                      "no index: not a keepsake sharded checkpoint but a torch.distributed.checkpoint (.metadata), "
                      "which torch's FileSystemReader loads and 'keepsake convert' imports");
  return ks__err_at(err, KS_E_NOTFOUND, path, NULL, -1, "no index: not a complete sharded checkpoint");
}

ks_status ks_shard_index_read(const char *dir, const ks_allocator *alloc, const ks_io *io, ks_shard_index **out,
                               ks_error *err) {
  if (!dir || !out) return ks__err(err, KS_E_INVALID, "ks_shard_index_read: NULL argument");
  io = ks__io_v2(io);
  char *path = ks__shard_join(alloc, dir, KS_SHARD_INDEX_NAME), *text = NULL;
  if (!path) return ks__err(err, KS_E_NOMEM, "out of memory");
  size_t len = 0;
  int too_big = 0, rc = read_all(io, alloc, path, KS__MAX_INDEX, &text, &len, &too_big);
  ks_status st = KS_OK;
  if (rc == ENOENT) st = no_index(dir, alloc, io, path, err);
  else if (rc == ENOMEM) st = ks__err(err, KS_E_NOMEM, "out of memory reading the index");
  else if (rc) st = ks__err_at(err, KS_E_IO, path, NULL, -1, "cannot read the index: %s", strerror(rc));
  else if (too_big) st = ks__err_at(err, KS_E_LIMIT, path, NULL, -1, "index is larger than %u bytes", KS__MAX_INDEX);
  ks_shard_index *idx = st ? NULL : ks__calloc(alloc, 1, sizeof *idx);
  if (!st && !idx) st = ks__err(err, KS_E_NOMEM, "out of memory");
  if (!st) {
    idx->alloc = *ks__alloc_or_default(alloc);
    st = ks__shard_index_parse(idx, text, len, path, err);
    if (st == KS_E_FORMAT && err && !strncmp(err->message, "header JSON: ", 13)) {
      char why[sizeof err->message], key[sizeof err->key];
      snprintf(why, sizeof why, "%s", err->message + 13);
      snprintf(key, sizeof key, "%s", err->key);
      (void)ks__err_at(err, st, path, key[0] ? key : NULL, err->offset, "index is not JSON: %s", why);
    }
  }
  ks__free(alloc, text);
  ks__free(alloc, path);
  if (st) {
    ks_shard_index_free(idx);
    return st;
  }
  *out = idx;
  return KS_OK;
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
  ks__xxh3_state xx;
  size_t cap = 1u << 20;
  uint8_t *buf = ks__malloc(a, cap);
  int rc = buf ? 0 : ENOMEM;
  if (!rc) ks__xxh3_reset(&xx);
  for (uint64_t off = 0; !rc && off < size;) {
    size_t want = size - off < cap ? (size_t)(size - off) : cap, got = 0;
    if (!(rc = io->read_fn(io->ctx, fd, buf, want, off, &got)) && !got) rc = EIO; /* shrank meanwhile */
    if (!rc) ks__xxh3_update(&xx, buf, got), off += got;
  }
  if (!rc) *hash = ks__xxh3_digest(&xx);
  ks__free(a, buf);
  return rc;
}

/* Reads exactly n bytes at off; EIO when the file ends first. errno-style result. */
static int read_at(const ks_io *io, int fd, uint8_t *buf, size_t n, uint64_t off) {
  for (size_t done = 0; done < n;) {
    size_t got = 0;
    int rc = io->read_fn(io->ctx, fd, buf + done, n - done, off + done, &got);
    if (rc) return rc;
    if (!got || got > n - done) return EIO; /* shrank meanwhile, or a table that overreports */
    done += got;
  }
  return 0;
}

/* XXH3-64 of the first 8 + N bytes of an open file of `size` bytes: its length and header, which
 * holds every tensor's checksum. errno-style result; *bad set (and 0 returned) when the length
 * prefix is not one a valid file has (N past the end of the file, or above KS_MAX_HEADER). */
static int hash_header_fd(const ks_io *io, const ks_allocator *a, int fd, uint64_t size, uint64_t *hash, int *bad) {
  uint8_t len[8];
  *bad = 0;
  if (size < 8) return (*bad = 1), 0;
  int rc = read_at(io, fd, len, 8, 0);
  if (rc) return rc;
  uint64_t n = ks__le64(len);
  if (n > KS_MAX_HEADER || n > size - 8) return (*bad = 1), 0;
  size_t total = (size_t)n + 8;
  uint8_t *buf = ks__malloc(a, total);
  if (!buf) return ENOMEM;
  memcpy(buf, len, 8);
  rc = read_at(io, fd, buf + 8, (size_t)n, 8);
  if (!rc) *hash = ks_checksum(buf, total);
  ks__free(a, buf);
  return rc;
}

int ks__shard_header_hash(const ks_io *io, const ks_allocator *a, const char *path, uint64_t *size, uint64_t *hash,
                          int *bad, int *opened) {
  io = ks__io_v2(io);
  a = ks__alloc_or_default(a);
  int fd = -1;
  *bad = 0;
  *opened = 0;
  int rc = io->open_fn(io->ctx, path, &fd, size);
  if (rc) return rc;
  *opened = 1;
  rc = hash_header_fd(io, a, fd, *size, hash, bad);
  io->close_fn(io->ctx, fd); /* read-only: nothing a failed close could lose */
  return rc;
}

ks_status ks__shard_file_facts(const ks_io *io, const ks_allocator *a, const char *path, ks_shard_file_info *info,
                               ks_error *err) {
  int bad = 0, opened = 0;
  uint64_t size = 0, hash = 0;
  int rc = ks__shard_header_hash(io, a, path, &size, &hash, &bad, &opened);
  if (rc && !opened)
    return ks__err_at(err, rc == ENOMEM ? KS_E_NOMEM : KS_E_IO, path, NULL, -1, "cannot reopen the file: %s",
                      strerror(rc));
  if (rc == ENOMEM) return ks__err(err, KS_E_NOMEM, "out of memory hashing the header");
  if (rc) return ks__err_at(err, KS_E_IO, path, NULL, -1, "cannot read the header back: %s", strerror(rc));
  if (bad) return ks__err_at(err, KS_E_FORMAT, path, NULL, 0, "the file written has no valid header length");
  info->size = size;
  info->checksum = hash;
  return KS_OK;
}

/* Version 2: every byte of the file is in its header (hashed against the index) or in a tensor
 * (hashed against its checksum in that header), since the tensors tile the data section. */
KS_NODISCARD static ks_status verify_tensors(const char *path, const ks_io *io, const ks_allocator *a, int rank,
                                             const char *name, ks_error *err) {
  /* Mapped when the table maps (each byte hashed once, in place); else read forward in windows. */
  ks_read_opts o = {.size = sizeof o, .alloc = a, .mode = io->map_fn ? KS_READ_MMAP : KS_READ_LAZY,
                    .verify_checksums = 1, .io = io};
  ks_reader *r = NULL;
  ks_status st = ks_reader_open(path, &o, &r, err);
  ks_reader_free(r);
  if (!st || st == KS_E_NOMEM || st == KS_E_IO) return st;
  /* The header hashed as recorded, so the file was whole when written: anything else is damage. */
  if (!err) return KS_E_CHECKSUM;
  char why[sizeof err->message], key[sizeof err->key];
  snprintf(why, sizeof why, "%s", err->message);
  snprintf(key, sizeof key, "%s", err->key);
  return ks__err_at(err, KS_E_CHECKSUM, path, key[0] ? key : NULL, err->offset, "rank %d: shard file %s is corrupt: %s",
                    rank, name, why);
}

ks_status ks_shard_verify_file(const char *dir, const ks_shard_index *idx, int rank, const ks_io *io,
                               ks_error *err) {
  if (!dir || !idx || rank < 0 || rank >= idx->world_size)
    return ks__err(err, KS_E_INVALID, "ks_shard_verify_file: bad argument");
  io = ks__io_v2(io);
  char *path = ks__shard_join(&idx->alloc, dir, idx->files[rank]);
  if (!path) return ks__err(err, KS_E_NOMEM, "out of memory");
  const ks_shard_file_info *want = &idx->infos[rank];
  const char *name = idx->files[rank];
  int fd = -1, bad = 0;
  uint64_t size = 0, hash = 0;
  ks_status st = KS_OK;
  int rc = io->open_fn(io->ctx, path, &fd, &size);
  if (rc == ENOENT)
    st = ks__err_at(err, KS_E_NOTFOUND, path, NULL, -1, "rank %d: shard file %s is missing", rank, name);
  else if (rc) st = ks__err_at(err, KS_E_IO, path, NULL, -1, "rank %d: cannot open %s: %s", rank, name, strerror(rc));
  else if (size != want->size)
    st = ks__err_at(err, KS_E_FORMAT, path, NULL, (int64_t)size,
                    "rank %d: shard file %s is %s: %llu bytes, the index says %llu", rank, name,
                    size < want->size ? "truncated" : "longer than recorded", (unsigned long long)size,
                    (unsigned long long)want->size);
  else if ((rc = idx->version >= 2 ? hash_header_fd(io, &idx->alloc, fd, size, &hash, &bad)
                                     : hash_fd(io, &idx->alloc, fd, size, &hash)) != 0)
    st = rc == ENOMEM
             ? ks__err(err, KS_E_NOMEM, "out of memory hashing %s", name)
             : ks__err_at(err, KS_E_IO, path, NULL, -1, "rank %d: cannot read %s: %s", rank, name, strerror(rc));
  else if (bad)
    st = ks__err_at(err, KS_E_CHECKSUM, path, NULL, 0, "rank %d: shard file %s is corrupt: no valid header length",
                    rank, name);
  else if (hash != want->checksum)
    st = ks__err_at(err, KS_E_CHECKSUM, path, NULL, -1,
                    "rank %d: shard file %s is corrupt: %sXXH3 %016llx, the index says %016llx", rank, name,
                    idx->version >= 2 ? "header " : "", (unsigned long long)hash, (unsigned long long)want->checksum);
  if (fd >= 0) io->close_fn(io->ctx, fd);
  if (!st && idx->version >= 2) st = verify_tensors(path, io, &idx->alloc, rank, name, err);
  ks__free(&idx->alloc, path);
  return st;
}
