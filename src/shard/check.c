/*
 * ks_shard_check: the index against its rank files. ks_shard_index_read has
 * checked that the `sharded` section is consistent in itself and that each
 * file's chunks fit in the file's recorded size; here the recorded sizes are
 * compared with the real ones (so nothing sized from the index can exceed the
 * files), and the headers with the index (their length and bytes hash to its
 * header_xxh3; the chunks it lists are there with its dtype, shape and
 * offsets, and nothing else is). Every problem is named
 * by the file and the key and handed to the caller's callback, so
 * `keepsake verify DIR` lists them all.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/io_ops.h"
#include "shard/shard_internal.h"

/* Problems reported per file at most: a hostile index can list millions of chunks. */
#define KS__CHECK_MAX_PER_FILE 32u
#define FILES_KEY "keepsake.files"

typedef struct chunk_ref {
  size_t tensor, chunk;
} chunk_ref;

typedef struct checker {
  const char *dir;
  const ks_shard_index *idx;
  const ks_io *io;
  ks_verify_fn on_problem;
  void *ctx;
  ks_error *err;
  ks_status first; /* status of the first problem */
  size_t problems;
  int stop;
  size_t *start;   /* per file f: its chunks are refs[start[f] .. start[f + 1]) */
  chunk_ref *refs;
  const unsigned char *only; /* per file: nonzero to check it; NULL = every file */
} checker;

/* Records a problem: the first goes to err, each to the callback (NULL: stop at the first). */
KS__PRINTF(5, 6)
static void problem(checker *c, ks_status code, const char *file, const char *key, const char *fmt, ...) {
  char msg[KS_ERROR_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  ks_error e;
  (void)ks__err_at(&e, code, file, key, -1, "%s", msg);
  c->problems++;
  if (!c->first) {
    c->first = code;
    if (c->err) *c->err = e;
  }
  c->stop = c->on_problem ? c->on_problem(c->ctx, &e) != 0 : 1;
}

/* The file's real size: stat through the table (a link is opened to get its target's size). */
static int real_size(const checker *c, const char *path, uint64_t *size, int *regular) {
  ks_io_stat sb;
  int rc = c->io->stat_fn(c->io->ctx, path, &sb);
  *regular = !rc && sb.kind == KS_IO_FILE;
  if (rc || sb.kind != KS_IO_LINK) return (*size = rc ? 0 : sb.size), rc;
  int fd;
  if ((rc = c->io->open_fn(c->io->ctx, path, &fd, size)) == 0) {
    *regular = 1;
    c->io->close_fn(c->io->ctx, fd);
  }
  return rc;
}

static int check_size(checker *c, int f, const char *path) {
  const char *name = c->idx->files[f];
  uint64_t want = c->idx->infos[f].size, size = 0;
  int regular = 0, rc = real_size(c, path, &size, &regular);
  /* The key is the index entry that names the file. */
  if (rc == ENOENT) problem(c, KS_E_NOTFOUND, path, FILES_KEY, "rank %d: shard file %s is missing", f, name);
  else if (rc) problem(c, KS_E_IO, path, FILES_KEY, "rank %d: cannot stat %s: %s", f, name, strerror(rc));
  else if (!regular) problem(c, KS_E_FORMAT, path, FILES_KEY, "rank %d: %s is not a regular file", f, name);
  else if (size != want)
    problem(c, KS_E_FORMAT, path, FILES_KEY, "rank %d: shard file %s is %s: %llu bytes, the index says %llu", f, name,
            size < want ? "truncated" : "longer than recorded", (unsigned long long)size, (unsigned long long)want);
  else return 0;
  return -1;
}

/* The file's keepsake.shard record: its rank, the world size and the index's timestamp. */
static void check_record(checker *c, int f, const char *path, const ks_reader *r) {
  ks__jv *j = NULL;
  const ks_allocator *a = &c->idx->alloc;
  ks__shard_ts ts;
  int64_t jr = -1, jw = -1;
  ks_status st = ks__shard_parse_meta(a, ks_meta_get(ks_reader_meta(r), KS__SHARD_META), KS__SHARD_META, &j, NULL);
  int ok = !st && ks__jv_is_int(ks__jv_get(j, "rank"), &jr) && ks__jv_is_int(ks__jv_get(j, "world_size"), &jw) &&
           ks__shard_ts_parse(ks__jv_get(j, "timestamp"), &ts);
  ks__jv_free(a, j);
  char x[160], y[160];
  if (st == KS_E_NOMEM) problem(c, st, path, KS__SHARD_META, "rank %d: out of memory", f);
  else if (!ok) problem(c, KS_E_FORMAT, path, KS__SHARD_META, "rank %d: missing or malformed keepsake.shard record", f);
  else if (jr != f || jw != c->idx->world_size)
    problem(c, KS_E_MISMATCH, path, KS__SHARD_META, "rank %d: the file says rank %lld of %lld, the index rank %d of %d",
            f, (long long)jr, (long long)jw, f, c->idx->world_size);
  else if (!ks__shard_ts_equal(&ts, &c->idx->ts)) {
    ks__shard_ts_format(&ts, x, sizeof x);
    ks__shard_ts_format(&c->idx->ts, y, sizeof y);
    problem(c, KS_E_MISMATCH, path, KS__SHARD_META, "rank %d: the file's timestamp is %s, the index's %s", f, x, y);
  }
}

static int same_dims(int rank, const int64_t *a, const int64_t *b) {
  return rank == 0 || memcmp(a, b, sizeof *a * (size_t)rank) == 0;
}

/* One chunk the index lists for file f: the tensor, its dtype and shape, and its DCP record. */
static void check_listed(checker *c, int f, const char *path, const ks_reader *r, const ks__jv *dcp,
                         const chunk_ref *ref) {
  const ks__sharded *s = &c->idx->sharded[ref->tensor];
  const ks__saved_chunk *k = &s->chunks[ref->chunk];
  ks_tensor t;
  int64_t off[KS_MAX_RANK], g[KS_MAX_RANK];
  const ks__jv *info = ks__jv_get(dcp, s->name);
  char x[128], y[128];
  long at = ks_reader_find(r, s->name);
  if (at < 0 || ks_reader_tensor_desc(r, (size_t)at, &t))
    problem(c, KS_E_NOTFOUND, path, s->name, "rank %d: the index lists a chunk of '%s' the file does not hold", f,
            s->name);
  else if (t.dtype != s->dtype || t.rank != s->rank || !same_dims(s->rank, t.shape, k->shape))
    problem(c, KS_E_MISMATCH, path, s->name, "rank %d: '%s' is %s %s in the file, the index says %s %s", f, s->name,
            ks_dtype_name(t.dtype), ks_shape_format(t.rank, t.shape, x, sizeof x), ks_dtype_name(s->dtype),
            ks_shape_format(s->rank, k->shape, y, sizeof y));
  else if (ks__shard_dims(ks__jv_get(info, "saved_offsets"), off) != s->rank ||
           ks__shard_dims(ks__jv_get(info, "global_shape"), g) != s->rank || !same_dims(s->rank, off, k->offsets) ||
           !same_dims(s->rank, g, s->global_shape))
    problem(c, KS_E_MISMATCH, path, s->name,
            "rank %d: the file's " KS__DCP_INFO " of '%s' does not give the index's offsets %s and global shape %s", f,
            s->name, ks_shape_format(s->rank, k->offsets, x, sizeof x),
            ks_shape_format(s->rank, s->global_shape, y, sizeof y));
}

/* Whether the index lists a chunk of `name` in file f. */
static int listed(const checker *c, int f, const char *name) {
  for (size_t i = c->start[f]; i < c->start[f + 1]; i++)
    if (!strcmp(c->idx->sharded[c->refs[i].tensor].name, name)) return 1;
  return 0;
}

/* The chunks the file holds (DCP entries with a global shape) that the index leaves out. Only
   searched when the counts differ, so a good file costs one pass. */
static void check_unlisted(checker *c, int f, const char *path, const ks__jv *dcp) {
  size_t held = 0;
  for (size_t i = 0; ks__jv_is(dcp, KS__JV_OBJECT) && i < dcp->len; i++)
    held += ks__jv_get(dcp->items[i], "global_shape") != NULL;
  if (held == c->start[f + 1] - c->start[f]) return;
  size_t told = 0;
  for (size_t i = 0; !c->stop && told < KS__CHECK_MAX_PER_FILE && i < dcp->len; i++) {
    if (!ks__jv_get(dcp->items[i], "global_shape") || listed(c, f, dcp->keys[i])) continue;
    problem(c, KS_E_MISMATCH, path, dcp->keys[i], "rank %d: the file holds a chunk of '%s' the index does not list", f,
            dcp->keys[i]);
    told++;
  }
}

/* The chunks the index lists for file f against the file's tensors and DCP records, and back. */
static void check_chunks(checker *c, int f, const char *path, const ks_reader *r) {
  const ks_allocator *a = &c->idx->alloc;
  ks__jv *dcp = NULL;
  ks_status st = ks__shard_parse_meta(a, ks_meta_get(ks_reader_meta(r), KS__DCP_INFO), KS__DCP_INFO, &dcp, NULL);
  if (st == KS_E_NOMEM) problem(c, st, path, KS__DCP_INFO, "rank %d: out of memory", f);
  else if (st || (dcp && !ks__jv_is(dcp, KS__JV_OBJECT)))
    problem(c, KS_E_FORMAT, path, KS__DCP_INFO, "rank %d: malformed " KS__DCP_INFO, f);
  else {
    size_t told = 0;
    for (size_t i = c->start[f]; !c->stop && told < KS__CHECK_MAX_PER_FILE && i < c->start[f + 1]; i++) {
      size_t before = c->problems;
      check_listed(c, f, path, r, dcp, &c->refs[i]);
      told += c->problems - before;
    }
    if (!c->stop) check_unlisted(c, f, path, dcp);
  }
  ks__jv_free(a, dcp);
}

/* Version 2 index: the file's length and header hash to the recorded header_xxh3 (FORMAT.md 9.3), so
   no header that differs from the one written (an edited scalar, a file swapped for another of the
   same size) is parsed, let alone loaded. The header only: one or two reads, never the data. A
   version 1 index records the whole file's hash, which only ks_shard_verify_file reads. */
static int check_header_hash(checker *c, int f, const char *path) {
  const ks_shard_file_info *want = &c->idx->infos[f];
  const char *name = c->idx->files[f];
  int bad = 0, opened = 0;
  uint64_t size = 0, hash = 0;
  if (c->idx->version < 2) return 0;
  int rc = ks__shard_header_hash(c->io, &c->idx->alloc, path, &size, &hash, &bad, &opened);
  if (rc == ENOMEM) problem(c, KS_E_NOMEM, path, NULL, "rank %d: out of memory hashing the header of %s", f, name);
  else if (rc) problem(c, KS_E_IO, path, NULL, "rank %d: cannot read %s: %s", f, name, strerror(rc));
  else if (size != want->size)
    problem(c, KS_E_FORMAT, path, FILES_KEY,
            "rank %d: shard file %s changed while checked: %llu bytes, the index says %llu", f, name,
            (unsigned long long)size, (unsigned long long)want->size);
  else if (bad)
    problem(c, KS_E_CHECKSUM, path, NULL, "rank %d: shard file %s is corrupt: no valid header length", f, name);
  else if (hash != want->checksum)
    problem(c, KS_E_CHECKSUM, path, NULL,
            "rank %d: shard file %s is corrupt: header XXH3 %016llx, the index says %016llx", f, name,
            (unsigned long long)hash, (unsigned long long)want->checksum);
  else return 0;
  return -1;
}

static void check_header(checker *c, int f, const char *path) {
  if (check_header_hash(c, f, path)) return;
  /* Lazy: the length and the header are read, never a tensor's bytes (tensors are described by
     ks_reader_tensor_desc), so a remote rank file costs one or two ranged reads, not its size. */
  ks_read_opts ro = {.alloc = &c->idx->alloc, .mode = KS_READ_LAZY, .io = c->io};
  ks_reader *r = NULL;
  ks_error e;
  if (ks_reader_open(path, &ro, &r, &e)) {
    ks__err_set_file(&e, path);
    problem(c, e.code, e.file, e.key[0] ? e.key : NULL, "rank %d: %s", f, e.message);
    return;
  }
  check_record(c, f, path, r);
  if (!c->stop) check_chunks(c, f, path, r);
  ks_reader_free(r);
}

/* Buckets every chunk by the file that holds it (counting sort: one pass, no search). */
KS_NODISCARD static ks_status bucket(checker *c) {
  const ks_shard_index *idx = c->idx;
  size_t total = 0;
  for (size_t i = 0; i < idx->n_sharded; i++) total += idx->sharded[i].n_chunks; /* capped at read */
  c->start = ks__calloc(&idx->alloc, (size_t)idx->world_size + 2, sizeof *c->start);
  c->refs = ks__calloc(&idx->alloc, total ? total : 1, sizeof *c->refs);
  if (!c->start || !c->refs) return ks__err(c->err, KS_E_NOMEM, "out of memory checking the index");
  for (size_t i = 0; i < idx->n_sharded; i++)
    for (size_t j = 0; j < idx->sharded[i].n_chunks; j++) c->start[idx->sharded[i].chunks[j].file + 2]++;
  for (int f = 0; f < idx->world_size; f++) c->start[f + 2] += c->start[f + 1];
  for (size_t i = 0; i < idx->n_sharded; i++)
    for (size_t j = 0; j < idx->sharded[i].n_chunks; j++) {
      size_t at = c->start[idx->sharded[i].chunks[j].file + 1]++;
      c->refs[at] = (chunk_ref){i, j};
    }
  return KS_OK;
}

KS_NODISCARD static ks_status run_check(checker *c, unsigned what) {
  const ks_shard_index *idx = c->idx;
  ks_status st = what & KS_SHARD_CHECK_HEADERS ? bucket(c) : KS_OK;
  for (int f = 0; !st && !c->stop && f < idx->world_size; f++) {
    if (c->only && !c->only[f]) continue;
    char *path = ks__shard_join(&idx->alloc, c->dir, idx->files[f]);
    if (!path) {
      st = ks__err(c->err, KS_E_NOMEM, "out of memory");
      break;
    }
    /* The headers are read only from files of the recorded size: they are what bounds them. */
    int bad = check_size(c, f, path);
    if (!bad && !c->stop && (what & KS_SHARD_CHECK_HEADERS)) check_header(c, f, path);
    ks__free(&idx->alloc, path);
  }
  ks__free(&idx->alloc, c->start);
  ks__free(&idx->alloc, c->refs);
  return st ? st : c->first;
}

ks_status ks_shard_check(const char *dir, const ks_shard_index *idx, const ks_io *io, unsigned what,
                         ks_verify_fn on_problem, void *ctx, ks_error *err) {
  if (!dir || !idx) return ks__err(err, KS_E_INVALID, "ks_shard_check: NULL argument");
  checker c = {dir, idx, ks__io_v2(io), on_problem, ctx, err, KS_OK, 0, 0, NULL, NULL, NULL};
  return what ? run_check(&c, what) : KS_OK;
}

ks_status ks__shard_check_sizes(const char *dir, const ks_shard_index *idx, const ks_io *io, const unsigned char *only,
                                ks_error *err) {
  checker c = {dir, idx, ks__io_v2(io), NULL, NULL, err, KS_OK, 0, 0, NULL, NULL, only};
  return run_check(&c, KS_SHARD_CHECK_SIZES);
}
