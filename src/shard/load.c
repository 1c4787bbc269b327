/*
 * Loading one rank's part of a sharded checkpoint at any world size: the
 * replicated entries from rank 0's file, the wanted region of every sharded
 * tensor read by offset (the io table's read_fn) from the saved chunks that overlap it, only
 * the bytes needed, and the per-rank entries: this
 * rank's own at the same world size, else the metrics of the saved ranks
 * assigned here folded with ks_metric_fold. ks_shard_load_local (a binding's
 * per-rank and keepsake entries) is the same load without what DCP reads, with
 * the program's own metrics to fold, and reads keepsake 0.2's DCP per-rank items too.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "keepsake/metric.h"
#include "core/io_ops.h"
#include "shard/shard_internal.h"

typedef struct src_file {
  ks_reader *r;    /* mapped: only the pages of what is touched are read */
  ks_statedict *sd; /* views into r, and r's scalars (a 0.2 file's: with its per-rank items renamed) */
  ks_statedict *raw; /* a 0.2 file's own entries, which sd borrows from (NULL otherwise) */
  const ks_meta *meta;
  ks__jv *metrics; /* keepsake.metrics, an object (possibly empty) */
  ks__jv *dcp;     /* DCP_SHARDING_INFO: where the file says its chunks sit (NULL when absent) */
  int fd;          /* for chunk reads by offset (through io); -1 until needed */
  char *path;
} src_file;

typedef struct loader {
  const char *dir;
  const ks_shard_index *idx;
  int rank, m, n;
  const ks_allocator *a;
  const ks_io *io; /* every read goes through it */
  src_file *files;
  ks_statedict *out;
  ks_error *err;
  /* ks_shard_load_local: */
  int local;                    /* no sharded tensors, no DCP items */
  int dcp02;                    /* per-rank items as keepsake 0.2's Python front end wrote them (dcp02.c) */
  ks__planner planner;          /* rank 0's planner data */
  ks_shard_metric_fn metric;    /* the program's metrics */
  void *metric_ctx;
  const char *const *globs;     /* the per-rank globs (the defaults for a 0.2 directory) */
  size_t n_globs;
} loader;

KS_NODISCARD static ks_status check_record(loader *L, int f, const char *path) {
  ks__jv *j = NULL;
  ks_status st = ks__shard_parse_meta(L->a, ks_meta_get(L->files[f].meta, KS__SHARD_META), KS__SHARD_META, &j, L->err);
  if (st) return st;
  ks__shard_ts ts;
  int64_t jr = -1, jw = -1;
  int ok = ks__jv_is_int(ks__jv_get(j, "rank"), &jr) && jr == f && ks__jv_is_int(ks__jv_get(j, "world_size"), &jw) &&
           jw == L->n && ks__shard_ts_parse(ks__jv_get(j, "timestamp"), &ts);
  ks__jv_free(L->a, j);
  if (!ok)
    return ks__err_at(L->err, KS_E_FORMAT, path, KS__SHARD_META, -1, "rank %d: missing or wrong keepsake.shard record",
                      f);
  if (!ks__shard_ts_equal(&ts, &L->idx->ts)) {
    char a[160], b[160];
    ks__shard_ts_format(&ts, a, sizeof a);
    ks__shard_ts_format(&L->idx->ts, b, sizeof b);
    return ks__err_at(L->err, KS_E_MISMATCH, path, NULL, -1,
                      "rank %d: timestamps disagree: the file has %s, the index %s", f, a, b);
  }
  return KS_OK;
}

/* The file's entries as views (tensors) and values (scalars), without reading tensor data. */
KS_NODISCARD static ks_status views_of(loader *L, src_file *s) {
  s->meta = ks_reader_meta(s->r);
  if (ks_statedict_create(L->a, &s->sd, NULL)) return ks__err(L->err, KS_E_NOMEM, "out of memory");
  for (size_t i = 0; i < ks_reader_count(s->r); i++) {
    const char *name;
    ks_tensor v;
    if (ks_reader_tensor_at(s->r, i, &name, &v)) continue; /* index in range: cannot fail */
    if (ks_statedict_set_tensor(s->sd, name, &v, KS_BORROW, NULL)) return ks__err(L->err, KS_E_NOMEM, "out of memory");
  }
  return ks_reader_scalars(s->r, s->sd, L->err);
}

/* A 0.2 file: its per-rank items renamed (dcp02.c) beside its other entries, and their metric records. */
KS_NODISCARD static ks_status rename_dcp02(loader *L, int f, src_file *s, const char *path) {
  if (f == 0) {
    ks_status st = ks__planner_read(L->a, s->meta, path, &L->planner, L->err);
    if (st) return st;
  }
  ks_statedict *sd = NULL;
  ks_status st = ks_statedict_create(L->a, &sd, L->err);
  for (size_t i = 0; !st && i < ks_statedict_count(s->sd); i++) {
    ks_entry e;
    if (ks_statedict_at(s->sd, i, &e) || ks__shard_dcp02_item(e.name, f)) continue; /* index in range */
    st = ks_statedict_set_entry(sd, e.name, &e, KS_BORROW, L->err);
  }
  if (!st)
    st = ks__shard_dcp02_convert(L->a, s->sd, f, &L->planner, L->metric, L->metric_ctx, path, sd, s->metrics, L->err);
  if (st) {
    ks_statedict_free(sd);
    return st;
  }
  s->raw = s->sd;
  s->sd = sd;
  return KS_OK;
}

KS_NODISCARD static ks_status open_file(loader *L, int f, src_file **out) {
  src_file *s = &L->files[f];
  if (!s->sd) {
    char *path = ks__shard_join(L->a, L->dir, L->idx->files[f]);
    if (!path) return ks__err(L->err, KS_E_NOMEM, "out of memory");
    ks_read_opts ro = {.alloc = L->a, .mode = KS_READ_MMAP, .io = L->io};
    s->path = path;
    ks_status st = ks_reader_open(path, &ro, &s->r, L->err);
    if (!st) st = views_of(L, s);
    if (!st) st = check_record(L, f, path);
    const char *mj = st ? NULL : ks_meta_get(s->meta, KS__METRICS_META);
    if (!st && mj) st = ks__shard_parse_meta(L->a, mj, KS__METRICS_META, &s->metrics, L->err);
    else if (!st && !(s->metrics = ks__jv_object(L->a))) st = ks__err(L->err, KS_E_NOMEM, "out of memory");
    if (!st && !ks__jv_is(s->metrics, KS__JV_OBJECT))
      st = ks__err_at(L->err, KS_E_FORMAT, path, KS__METRICS_META, -1, "rank %d: malformed keepsake.metrics", f);
    if (!st) st = ks__shard_parse_meta(L->a, ks_meta_get(s->meta, KS__DCP_INFO), KS__DCP_INFO, &s->dcp, L->err);
    if (!st && s->dcp && !ks__jv_is(s->dcp, KS__JV_OBJECT))
      st = ks__err_at(L->err, KS_E_FORMAT, path, KS__DCP_INFO, -1, "rank %d: malformed " KS__DCP_INFO, f);
    if (!st && L->local && f == 0 && !L->dcp02) st = ks__planner_read(L->a, s->meta, path, &L->planner, L->err);
    if (!st && L->dcp02) st = rename_dcp02(L, f, s, path);
    if (st && L->err) ks__err_set_file(L->err, path);
    if (st) return st;
  }
  *out = s;
  return KS_OK;
}

static const ks__sharded *sharded_of(const ks_shard_index *idx, const char *name) {
  for (size_t i = 0; i < idx->n_sharded; i++)
    if (!strcmp(idx->sharded[i].name, name)) return &idx->sharded[i];
  return NULL;
}

static int per_rank(const loader *L, const char *name) { return ks__shard_matches(name, L->globs, L->n_globs); }

/* ks_shard_load_local leaves DCP's items to DCP. */
static int dcp_item(const loader *L, const char *name) { return L->local && ks__shard_dcp_item(&L->planner, name); }

/* ---- sharded tensors ---- */

typedef struct box {
  int rank;
  int64_t off[KS_MAX_RANK], shape[KS_MAX_RANK];
} box;

/* Consecutive runs are merged into one read: a row-sharded region is a single pread. */
typedef struct reads {
  const ks_io *io;
  int fd;
  uint64_t base; /* file offset of the chunk's first byte */
  uint64_t src;  /* pending read: chunk byte offset, destination, length */
  uint8_t *dst;
  size_t len;
  int failed;
} reads;

static void flush(reads *q) {
  size_t done = 0;
  while (!q->failed && done < q->len) {
    size_t n = 0;
    int rc = q->io->read_fn(q->io->ctx, q->fd, q->dst + done, q->len - done, q->base + q->src + done, &n);
    if (rc || !n) q->failed = rc ? rc : EIO;
    else done += n;
  }
  q->len = 0;
}

static void want_run(reads *q, uint64_t src, uint8_t *dst, size_t len) {
  if (q->len && q->src + q->len == src && q->dst + q->len == dst) {
    q->len += len;
    return;
  }
  if (q->len) flush(q);
  q->src = src;
  q->dst = dst;
  q->len = len;
}

/* Reads the elements of [lo, hi) of a chunk laid out as `src` into a region laid out as `dst`. */
static int copy_box(reads *q, uint8_t *dp, const box *dst, const box *src, const int64_t *lo, const int64_t *hi,
                    size_t es) {
  int r = dst->rank;
  if (r == 0) {
    want_run(q, 0, dp, es);
    flush(q);
    return q->failed;
  }
  int64_t idx[KS_MAX_RANK];
  for (int d = 0; d < r; d++) idx[d] = lo[d];
  size_t run = (size_t)(hi[r - 1] - lo[r - 1]) * es;
  for (;;) {
    int64_t so = 0, doff = 0;
    for (int d = 0; d < r; d++) {
      so = so * src->shape[d] + (idx[d] - src->off[d]);
      doff = doff * dst->shape[d] + (idx[d] - dst->off[d]);
    }
    want_run(q, (uint64_t)so * es, dp + (size_t)doff * es, run);
    int d = r - 2;
    while (d >= 0) {
      if (++idx[d] < hi[d]) break;
      idx[d] = lo[d];
      d--;
    }
    if (d < 0) break;
  }
  flush(q);
  return q->failed;
}

KS_NODISCARD static ks_status region_of(loader *L, const ks__sharded *s, const ks_shard_map *want, box *b) {
  ks_shard_chunk c;
  b->rank = s->rank;
  if (ks_shard_map_get(want, s->name, &c) != KS_OK) {
    for (int d = 0; d < s->rank; d++) {
      b->off[d] = 0;
      b->shape[d] = s->global_shape[d];
    }
    return KS_OK;
  }
  int same = c.rank == s->rank;
  for (int d = 0; same && d < s->rank; d++) same = c.global_shape[d] == s->global_shape[d];
  if (!same) {
    char x[128], y[128];
    return ks__err_at(
        L->err, KS_E_SHAPE, NULL, s->name, -1, "'%s': the program's global shape is %s, the checkpoint's %s", s->name,
        ks_shape_format(c.rank, c.global_shape, x, sizeof x), ks_shape_format(s->rank, s->global_shape, y, sizeof y));
  }
  for (int d = 0; d < s->rank; d++) {
    b->off[d] = c.offsets[d];
    b->shape[d] = c.shape[d];
  }
  return KS_OK;
}

/* Whether chunk k shares an element with the region. */
static int overlaps(const ks__sharded *s, const ks__saved_chunk *k, const box *reg) {
  for (int d = 0; d < s->rank; d++)
    if (reg->off[d] >= k->offsets[d] + k->shape[d] || k->offsets[d] >= reg->off[d] + reg->shape[d]) return 0;
  return 1;
}

KS_NODISCARD static ks_status fill_from_chunk(loader *L, const ks__sharded *s, const ks__saved_chunk *k, const box *reg,
                                 uint8_t *data) {
  int64_t lo[KS_MAX_RANK], hi[KS_MAX_RANK];
  for (int d = 0; d < s->rank; d++) {
    lo[d] = reg->off[d] > k->offsets[d] ? reg->off[d] : k->offsets[d];
    int64_t a = reg->off[d] + reg->shape[d], b = k->offsets[d] + k->shape[d];
    hi[d] = a < b ? a : b;
    if (lo[d] >= hi[d]) return KS_OK; /* no overlap */
  }
  src_file *f;
  ks_status st = open_file(L, k->file, &f);
  if (st) return st;
  const ks_tensor *t = ks_statedict_tensor(f->sd, s->name);
  long at = ks_reader_find(f->r, s->name);
  ks_tensor_info ti;
  int ok = t && at >= 0 && !ks_reader_tensor_info(f->r, (size_t)at, &ti) && t->dtype == s->dtype && t->rank == s->rank;
  for (int d = 0; ok && d < s->rank; d++) ok = t->shape[d] == k->shape[d];
  /* The file's own record of where the chunk sits: an index that moved it would load it elsewhere. */
  int64_t off[KS_MAX_RANK], g[KS_MAX_RANK];
  const ks__jv *info = ks__jv_get(f->dcp, s->name);
  ok = ok && ks__shard_dims(ks__jv_get(info, "saved_offsets"), off) == s->rank &&
       ks__shard_dims(ks__jv_get(info, "global_shape"), g) == s->rank;
  for (int d = 0; ok && d < s->rank; d++) ok = off[d] == k->offsets[d] && g[d] == s->global_shape[d];
  if (!ok)
    return ks__err_at(L->err, KS_E_FORMAT, L->idx->files[k->file], s->name, -1,
                      "rank %d: the chunk of '%s' is not what the index records", k->file, s->name);
  uint64_t size;
  int rc = f->fd < 0 ? L->io->open_fn(L->io->ctx, f->path, &f->fd, &size) : 0;
  if (rc) {
    f->fd = -1;
    return ks__err_at(L->err, KS_E_IO, f->path, NULL, -1, "rank %d: cannot open: %s", k->file, strerror(rc));
  }
  box src = {s->rank, {0}, {0}};
  for (int d = 0; d < s->rank; d++) {
    src.off[d] = k->offsets[d];
    src.shape[d] = k->shape[d];
  }
  reads q = {L->io, f->fd, ti.begin, 0, NULL, 0, 0};
  int e = copy_box(&q, data, reg, &src, lo, hi, ks_dtype_size(s->dtype));
  if (e)
    return ks__err_at(L->err, KS_E_IO, f->path, s->name, (int64_t)ti.begin,
                      "rank %d: cannot read the chunk of '%s': %s", k->file, s->name, strerror(e));
  return KS_OK;
}

KS_NODISCARD static ks_status load_sharded(loader *L, const ks_shard_map *want) {
  for (size_t i = 0; !L->local && i < L->idx->n_sharded; i++) {
    const ks__sharded *s = &L->idx->sharded[i];
    box reg;
    ks_status st = region_of(L, s, want, &reg);
    void *data = NULL;
    if (!st && ks_statedict_new_tensor(L->out, s->name, s->dtype, s->rank, reg.shape, &data, NULL))
      st = ks__err_at(L->err, KS_E_NOMEM, NULL, s->name, -1, "out of memory for '%s'", s->name);
    for (size_t k = 0; !st && k < s->n_chunks; k++) st = fill_from_chunk(L, s, &s->chunks[k], &reg, data);
    if (st) return st;
  }
  return KS_OK;
}

/* ---- replicated and per-rank entries ---- */

/* Copies the entries of file f that `pick` selects. */
KS_NODISCARD static ks_status copy_entries(loader *L, int f,
                                           int (*pick)(const loader *, const src_file *, const char *)) {
  src_file *s;
  ks_status st = open_file(L, f, &s);
  for (size_t i = 0; !st && i < ks_statedict_count(s->sd); i++) {
    ks_entry e;
    if (ks_statedict_at(s->sd, i, &e)) continue; /* index in range: cannot fail */
    if (!pick(L, s, e.name)) continue;
    if ((st = ks_statedict_set_entry(L->out, e.name, &e, KS_COPY, NULL)))
      st = ks__err_at(L->err, st, NULL, e.name, -1, "cannot copy entry: %s", ks_strerror(st));
  }
  return st;
}

static int pick_replicated(const loader *L, const src_file *s, const char *name) {
  (void)s;
  return !sharded_of(L->idx, name) && !per_rank(L, name) && !dcp_item(L, name);
}

static int pick_per_rank(const loader *L, const src_file *s, const char *name) {
  (void)s;
  return !sharded_of(L->idx, name) && per_rank(L, name) && !dcp_item(L, name);
}

/* Whether `name` lies under metric `path`'s kept attributes (`<path>/attrs/`, `<path>/inner/<x>/attrs/`). */
static int under_attrs(const char *name, const char *path) {
  size_t n = strlen(path);
  if (strncmp(name, path, n) || name[n] != '/') return 0;
  const char *rest = name + n + 1;
  if (!strncmp(rest, "attrs/", 6)) return 1;
  if (strncmp(rest, "inner/", 6)) return 0;
  const char *slash = strchr(rest + 6, '/');
  return slash && !strncmp(slash + 1, "attrs/", 6);
}

/* A metric's kept attributes (a wrapper's): not folded, taken with the other per-rank entries. */
static int pick_metric_attrs(const loader *L, const src_file *s, const char *name) {
  if (!pick_per_rank(L, s, name)) return 0;
  for (size_t i = 0; i < s->metrics->len; i++)
    if (under_attrs(name, s->metrics->keys[i])) return 1;
  return 0;
}

/* Per-rank entries that belong to no metric (RNG, data positions). */
static int pick_per_rank_plain(const loader *L, const src_file *s, const char *name) {
  if (!pick_per_rank(L, s, name)) return 0;
  for (size_t i = 0; i < s->metrics->len; i++) {
    const char *path = s->metrics->keys[i];
    size_t n = strlen(path);
    if (!strncmp(name, path, n) && name[n] == '/') return 0;
  }
  return 1;
}

/* ---- metrics at another world size ---- */

KS_NODISCARD static ks_status metric_of(loader *L, const char *path, const ks__jv *def, ks_metric **out) {
  const ks_metric *mine = L->metric ? L->metric(L->metric_ctx, path) : NULL;
  if (mine) { /* the program's metric (a described one): a clone of its definition, at its defaults */
    ks_status st = ks_metric_clone(mine, L->a, out, L->err);
    if (!st) ks_metric_reset(*out);
    return st;
  }
  const char *cls = ks__jv_string(ks__jv_get(def, "class"));
  const ks__jv *jargs = ks__jv_get(def, "args");
  char *args = jargs ? ks__jv_dump(L->a, jargs, true) : NULL;
  ks_status st = !cls
                     ? ks__err_at(L->err, KS_E_FORMAT, NULL, path, -1, "keepsake.metrics entry '%s' has no class", path)
                 : jargs && !args ? ks__err(L->err, KS_E_NOMEM, "out of memory")
                                  : ks_metric_create(cls, args, L->a, out, L->err);
  ks__free(L->a, args);
  if (st && L->err) ks__err_set_key(L->err, path);
  return st;
}

/* Saved rank f's value of metric `path`, or NULL in *out when that file does not hold it. */
KS_NODISCARD static ks_status saved_metric(loader *L, int f, const char *path, ks_metric **out) {
  src_file *s;
  ks_status st = open_file(L, f, &s);
  if (st) return st;
  const ks__jv *def = ks__jv_get(s->metrics, path);
  if (!def) return ks__err_at(L->err, KS_E_MISMATCH, L->idx->files[f], path, -1, "rank %d lacks metric '%s'", f, path);
  if ((st = metric_of(L, path, def, out))) return st;
  char prefix[KS__KEY_MAX + 1];
  if (ks__key(prefix, path, "/state_dict/")) {
    st = ks__key_limit(L->err, path, "/state_dict/");
    ks_metric_free(*out);
    *out = NULL;
    return st;
  }
  int64_t sv = 1, uc = 1;
  if (!ks__jv_is_int(ks__jv_get(def, "schema_version"), &sv) || sv < 0 || sv > INT32_MAX) sv = 1;
  if (!ks__jv_is_int(ks__jv_get(def, "update_count"), &uc)) uc = 1;
  st = ks_metric_load_state_dict(*out, s->sd, prefix, (int)sv, 0, NULL, NULL, L->err);
  if (!st) st = ks_metric_restore_computed(*out, NULL, uc, L->err);
  for (size_t i = 0; !st && i < ks_metric_inner_count(*out); i++) { /* a wrapper's parts, as the file holds them */
    const char *name = NULL;
    ks_metric *in = ks_metric_inner_at(*out, i, &name);
    char ip[KS__KEY_MAX + 1];
    int64_t n = 1;
    if (ks__keyf(prefix, path, "/inner/%s/state_dict/", name) || ks__keyf(ip, path, "/inner/%s/update_count", name)) {
      st = ks__key_limit(L->err, path, name);
      break;
    }
    ks_entry e;
    if (ks_statedict_get(s->sd, ip, &e) == KS_OK && e.kind == KS_VAL_INT && e.i >= 0) n = e.i;
    st = ks_metric_load_state_dict(in, s->sd, prefix, (int)sv, 0, NULL, NULL, L->err);
    if (!st) st = ks_metric_restore_computed(in, NULL, n, L->err);
  }
  if (st) {
    ks__err_set_file(L->err, L->idx->files[f]);
    ks_metric_free(*out);
    *out = NULL;
  }
  return st;
}

/* Folds the saved ranks [lo, hi) of one metric (ks_metric_fold: last first, so cat rows stay in rank order). */
KS_NODISCARD static ks_status merged_metric(loader *L, const char *path, const ks__jv *def, int lo, int hi,
                                            ks_metric **out) {
  if (lo == hi) return metric_of(L, path, def, out);
  ks_metric **parts = ks__calloc(L->a, (size_t)(hi - lo), sizeof *parts);
  ks_status st = parts ? KS_OK : ks__err(L->err, KS_E_NOMEM, "out of memory");
  for (int f = lo; !st && f < hi; f++) st = saved_metric(L, f, path, &parts[f - lo]);
  if (!st) st = ks_metric_fold((const ks_metric *const *)parts, (size_t)(hi - lo), L->a, out, L->err);
  for (int f = lo; parts && f < hi; f++) ks_metric_free(parts[f - lo]);
  ks__free(L->a, parts);
  return st;
}

/* The keepsake.metrics entry of m: class, args, schema version and update count. */
static ks__jv *metric_def(const ks_allocator *a, const ks_metric *m) {
  ks__jv *args = NULL, *def = ks__jv_object(a);
  const char *aj = ks_metric_args_json(m);
  if (!aj || ks__jv_parse(a, aj, strlen(aj), NULL, &args, NULL)) args = ks__jv_object(a);
  ks_status st = KS_OK;
  ks__shard_put(a, def, "class", ks__jv_str(a, ks_metric_class(m)), &st);
  ks__shard_put(a, def, "args", args, &st);
  ks__shard_put(a, def, "schema_version", ks__jv_int(a, KS_METRIC_SCHEMA_VERSION), &st);
  ks__shard_put(a, def, "update_count", ks__jv_int(a, ks_metric_update_count(m)), &st);
  if (st) {
    ks__jv_free(a, def);
    return NULL;
  }
  return def;
}

/* One part of a folded metric: its states and `_computed` (null: the fold has none) under `path`. */
KS_NODISCARD static ks_status put_part(loader *L, const char *path, const ks_metric *m) {
  char prefix[KS__KEY_MAX + 1];
  if (ks__key(prefix, path, "/state_dict/")) return ks__key_limit(L->err, path, "/state_dict/");
  ks_status st = ks_metric_to_state_dict(m, L->out, prefix, L->err);
  if (!st && ks__key(prefix, path, "/_computed")) st = ks__key_limit(L->err, path, "/_computed");
  if (!st) st = ks_statedict_set_null(L->out, prefix, L->err);
  return st;
}

KS_NODISCARD static ks_status put_metric(loader *L, const char *path, const ks_metric *m, ks__jv *defs) {
  ks_status st = put_part(L, path, m);
  for (size_t i = 0; !st && i < ks_metric_inner_count(m); i++) { /* a wrapper's: as a binding saves them */
    const char *name = NULL;
    const ks_metric *in = ks_metric_inner_at(m, i, &name);
    char ip[KS__KEY_MAX + 1];
    if (ks__keyf(ip, path, "/inner/%s", name)) return ks__key_limit(L->err, path, name);
    st = put_part(L, ip, in);
    if (!st) st = ks__put_int(L->out, ip, "/update_count", ks_metric_update_count(in), L->err);
  }
  if (st) return st;
  ks__shard_put(L->a, defs, path, metric_def(L->a, m), &st);
  return st ? ks__err(L->err, KS_E_NOMEM, "out of memory") : KS_OK;
}

/* The saved ranks assigned to this rank, and the one its other per-rank entries come from: the
   public rule (ks_shard_assigned), which bindings restoring per-rank state ask too. The loader's
   world sizes and rank were checked when it was set up, so it cannot fail here. */
static void assigned(const loader *L, int *lo, int *hi, int *first) {
  if (ks_shard_assigned(L->n, L->m, L->rank, lo, hi, first, NULL)) *lo = *hi = *first = 0;
}

KS_NODISCARD static ks_status load_per_rank_merged(loader *L, ks__jv *defs) {
  int lo, hi, first;
  assigned(L, &lo, &hi, &first);
  src_file *s;
  ks_status st = copy_entries(L, first, pick_per_rank_plain);
  if (!st) st = copy_entries(L, first, pick_metric_attrs);
  if (!st) st = open_file(L, first, &s);
  for (size_t i = 0; !st && i < s->metrics->len; i++) {
      const char *path = s->metrics->keys[i];
      const ks__jv *def = s->metrics->items[i];
      /* No saved rank for this one: a program's own metric is left out (the engine reports it missing and the
         binding resets it to its defaults, which a description does not hold); a catalogue one is its defaults. */
      if (lo == hi && L->metric && L->metric(L->metric_ctx, path)) continue;
      ks_metric *m = NULL;
      st = merged_metric(L, path, def, lo, hi, &m);
      if (!st) st = put_metric(L, path, m, defs);
      ks_metric_free(m);
    }
  return st;
}

/* The metadata to load with: rank 0's caller metadata (no writer or shard records), with `metrics` as
   keepsake.metrics. */
KS_NODISCARD static ks_status out_meta(loader *L, const char *metrics, ks_meta **out) {
  ks_meta *m;
  if (ks_meta_create(L->a, &m, NULL)) return ks__err(L->err, KS_E_NOMEM, "out of memory");
  const ks_meta *src = L->files[0].meta;
  ks_status st = KS_OK;
  for (size_t i = 0; !st && i < ks_meta_count(src); i++) {
    const char *k, *v;
    if (ks_meta_at(src, i, &k, &v)) continue; /* index in range: cannot fail */
    static const char *const drop[] = {KS__SHARD_META, KS__DCP_INFO, KS__DCP_VERSION, "format", KS_META_FORMAT,
                                       KS_META_FORMAT_VERSION, KS_META_WRITER, KS_META_SCALARS, KS_META_CHECKSUMS};
    int skip = 0;
    for (size_t d = 0; d < sizeof drop / sizeof drop[0]; d++) skip |= !strcmp(k, drop[d]);
    if (skip) continue;
    st = ks_meta_set(m, k, v, NULL);
  }
  if (!st && metrics) st = ks_meta_set(m, KS__METRICS_META, metrics, NULL);
  if (st) {
    ks_meta_free(m);
    return ks__err(L->err, KS_E_NOMEM, "out of memory");
  }
  *out = m;
  return KS_OK;
}

/* Before anything is sized from the index (its own consistency was checked when it was read):
   the files this load reads have the recorded sizes, which bound their chunks, so each region
   allocated is bounded by the files' real sizes. Also with no_verify; only the files read, so a
   rank of a large job that loads its own chunk stats a few files, not all of them. */
KS_NODISCARD static ks_status check_reads(loader *L, const ks_shard_map *want, int verify) {
  unsigned char *read = ks__calloc(L->a, (size_t)L->n, 1);
  if (!read) return ks__err(L->err, KS_E_NOMEM, "out of memory");
  int lo, hi, first;
  assigned(L, &lo, &hi, &first);
  read[0] = 1; /* the replicated entries */
  read[L->m == L->n ? L->rank : first] = 1;
  for (int f = lo; L->m != L->n && f < hi; f++) read[f] = 1;
  ks_status st = KS_OK;
  for (size_t i = 0; !st && !L->local && i < L->idx->n_sharded; i++) {
    const ks__sharded *s = &L->idx->sharded[i];
    box reg;
    st = region_of(L, s, want, &reg);
    for (size_t k = 0; !st && k < s->n_chunks; k++)
      read[s->chunks[k].file] |= (unsigned char)overlaps(s, &s->chunks[k], &reg);
  }
  for (int f = 0; !st && verify && f < L->n; f++)
    if (read[f]) st = ks_shard_verify_file(L->dir, L->idx, f, L->io, L->err);
  if (!st) st = ks__shard_check_sizes(L->dir, L->idx, L->io, read, L->err);
  ks__free(L->a, read);
  return st;
}

/* A chunk in rank 0's file that the index does not list would pass for a replicated tensor. */
KS_NODISCARD static ks_status no_unlisted_chunks(loader *L) {
  src_file *s;
  ks_status st = open_file(L, 0, &s);
  for (size_t i = 0; !st && s->dcp && i < s->dcp->len; i++)
    if (ks__jv_get(s->dcp->items[i], "global_shape") && !sharded_of(L->idx, s->dcp->keys[i]))
      st = ks__err_at(L->err, KS_E_FORMAT, s->path, s->dcp->keys[i], -1,
                      "rank 0: the file holds a chunk of '%s' that the index does not list", s->dcp->keys[i]);
  return st;
}

KS_NODISCARD static ks_status run(loader *L, const ks_shard_map *want, ks_meta **meta) {
  ks_status st = no_unlisted_chunks(L);
  if (!st) st = copy_entries(L, 0, pick_replicated);
  if (!st) st = load_sharded(L, want);
  char *metrics = NULL;
  if (!st && L->m == L->n) {
    st = copy_entries(L, L->rank, pick_per_rank);
    const char *mj = st ? NULL : ks_meta_get(L->files[L->rank].meta, KS__METRICS_META);
    if (!st && L->dcp02) /* the records of its renamed metrics */
      st = (metrics = ks__jv_dump(L->a, L->files[L->rank].metrics, true)) ? KS_OK
                                                                         : ks__err(L->err, KS_E_NOMEM, "out of memory");
    else if (mj && !(metrics = ks__strdup(L->a, mj))) st = ks__err(L->err, KS_E_NOMEM, "out of memory");
  } else if (!st) {
    ks__jv *defs = ks__jv_object(L->a);
    st = defs ? load_per_rank_merged(L, defs) : ks__err(L->err, KS_E_NOMEM, "out of memory");
    if (!st && !(metrics = ks__jv_dump(L->a, defs, true))) st = ks__err(L->err, KS_E_NOMEM, "out of memory");
    ks__jv_free(L->a, defs);
  }
  if (!st) st = out_meta(L, metrics, meta);
  ks__free(L->a, metrics);
  return st;
}

/* The load of either entry point; frees what L holds. `verify`: the files read, before anything is allocated. */
KS_NODISCARD static ks_status load(loader *L, const ks_shard_map *want, int verify, ks_statedict **sd, ks_meta **meta) {
  ks_status st = KS_OK;
  ks_error *err = L->err;
  if (!(L->files = ks__calloc(L->a, (size_t)L->n, sizeof *L->files))) st = ks__err(err, KS_E_NOMEM, "out of memory");
  for (int f = 0; L->files && f < L->n; f++) L->files[f].fd = -1;
  if (!st && ks_statedict_create(L->a, &L->out, err)) st = ks__err(err, KS_E_NOMEM, "out of memory");
  ks_meta *m = NULL;
  if (!st) st = check_reads(L, want, verify);
  src_file *first;
  if (!st && L->local) st = open_file(L, 0, &first); /* rank 0's planner data, before any other file is renamed */
  if (!st) st = run(L, want, &m);
  for (int f = 0; L->files && f < L->n; f++) {
    ks_statedict_free(L->files[f].sd);
    ks_statedict_free(L->files[f].raw);
    ks_reader_free(L->files[f].r);
    ks__jv_free(L->a, L->files[f].metrics);
    ks__jv_free(L->a, L->files[f].dcp);
    if (L->files[f].fd >= 0) L->io->close_fn(L->io->ctx, L->files[f].fd);
    ks__free(L->a, L->files[f].path);
  }
  ks__free(L->a, L->files);
  ks__planner_free(L->a, &L->planner);
  if (st) {
    ks_statedict_free(L->out);
    return st;
  }
  *sd = L->out;
  *meta = m;
  return KS_OK;
}

ks_status ks_shard_load_rank(const char *dir, const ks_shard_index *idx, int rank, int world_size,
                             const ks_shard_map *want, const ks_shard_load_opts *opts, ks_statedict **sd,
                             ks_meta **meta, ks_error *err) {
  if (!dir || !idx || !sd || !meta || world_size < 1 || rank < 0 || rank >= world_size)
    return ks__err(err, KS_E_INVALID, "ks_shard_load_rank: bad argument (rank %d of %d)", rank, world_size);
  loader L = {.dir = dir, .idx = idx, .rank = rank, .m = world_size, .n = idx->world_size,
              .a = ks__alloc_or_default(opts ? opts->alloc : NULL), .io = ks__io_v2(opts ? opts->io : NULL),
              .err = err};
  L.globs = (const char *const *)idx->per_rank;
  L.n_globs = idx->n_per_rank;
  ks_status st = KS_OK;
  for (int f = 0; !st && !(opts && opts->no_verify) && f < idx->world_size; f++)
    st = ks_shard_verify_file(dir, idx, f, L.io, err);
  return st ? st : load(&L, want, 0, sd, meta);
}

/* Whether rank 0's file records a DCP save (KS_SHARD_DCP_RECORD); its header only. */
KS_NODISCARD static ks_status records_dcp(const char *dir, const ks_shard_index *idx, const ks_allocator *a,
                                          const ks_io *io, int *yes, ks_error *err) {
  char *path = ks__shard_join(a, dir, idx->files[0]);
  if (!path) return ks__err(err, KS_E_NOMEM, "out of memory");
  ks_read_opts ro = {.alloc = a, .mode = KS_READ_LAZY, .io = io};
  ks_reader *r = NULL;
  ks_status st = ks_reader_open(path, &ro, &r, err);
  if (!st) *yes = ks_meta_get(ks_reader_meta(r), KS_SHARD_DCP_RECORD) != NULL;
  ks_reader_free(r);
  ks__free(a, path);
  return st;
}

ks_status ks_shard_local_layout(const char *dir, const ks_shard_index *idx, const ks_io *io, ks_shard_local_kind *out,
                                ks_error *err) {
  if (!dir || !idx || !out) return ks__err(err, KS_E_INVALID, "ks_shard_local_layout: NULL argument");
  int dcp = 0;
  ks_status st = idx->n_per_rank ? KS_OK : records_dcp(dir, idx, &idx->alloc, io, &dcp, err);
  if (!st) *out = dcp ? KS_SHARD_LOCAL_DCP02 : KS_SHARD_LOCAL_NAMED;
  return st;
}

ks_status ks_shard_load_local(const char *dir, const ks_shard_index *idx, int rank, int world_size,
                              const ks_shard_local_opts *opts, ks_statedict **sd, ks_meta **meta, ks_error *err) {
  if (!dir || !idx || !sd || !meta || world_size < 1 || rank < 0 || rank >= world_size)
    return ks__err(err, KS_E_INVALID, "ks_shard_load_local: bad argument (rank %d of %d)", rank, world_size);
  loader L = {.dir = dir, .idx = idx, .rank = rank, .m = world_size, .n = idx->world_size,
              .a = ks__alloc_or_default(opts ? opts->alloc : NULL), .io = ks__io_v2(opts ? opts->io : NULL),
              .err = err};
  L.local = 1;
  L.metric = opts ? opts->metric : NULL;
  L.metric_ctx = opts ? opts->metric_ctx : NULL;
  ks_shard_local_kind kind = KS_SHARD_LOCAL_NAMED;
  ks_status st = ks_shard_local_layout(dir, idx, opts ? opts->io : NULL, &kind, err);
  if (st) return st;
  L.dcp02 = kind == KS_SHARD_LOCAL_DCP02;
  L.globs = (const char *const *)idx->per_rank;
  L.n_globs = idx->n_per_rank;
  if (L.dcp02) L.globs = ks_shard_default_per_rank(&L.n_globs);
  return load(&L, NULL, opts && opts->verify, sd, meta);
}
