/*
 * The index: written last, by one writer, once every rank's file is durable;
 * it is the commit marker of a sharded checkpoint. Writing reads each rank
 * file's header (never its data) to list its tensors and chunks. Reading
 * validates every field, and each file is checked against the recorded size
 * and whole-file checksum before it is used.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "core/durable.h"
#include "shard/shard_internal.h"

/* Per-file facts the index writer collects from a header. */
typedef struct file_head {
  ks_reader *r;
  ks__shard_ts ts;
  ks__jv *record; /* keepsake.shard */
  ks__jv *dcp;    /* DCP_SHARDING_INFO or NULL */
} file_head;

KS_NODISCARD static ks_status open_head(const char *dir, int rank, int n, const ks_allocator *a, const ks_io *io,
                                        file_head *h, ks_error *err) {
  char name[64];
  ks_status st = ks_shard_file_name(rank, n, name, sizeof name);
  char *path = st ? NULL : ks__shard_join(a, dir, name);
  if (!path) return ks__err(err, st ? st : KS_E_NOMEM, "out of memory");
  ks_read_opts ro = {.alloc = a, .io = io};
  st = ks_reader_open(path, &ro, &h->r, err);
  if (!st)
    st = ks__shard_parse_meta(a, ks_meta_get(ks_reader_meta(h->r), KS__SHARD_META), KS__SHARD_META, &h->record, err);
  int64_t jr = -1, jw = -1;
  if (!st && (!ks__jv_is_int(ks__jv_get(h->record, "rank"), &jr) || jr != rank ||
              !ks__jv_is_int(ks__jv_get(h->record, "world_size"), &jw) || jw != n ||
              !ks__shard_ts_parse(ks__jv_get(h->record, "timestamp"), &h->ts)))
    st =
        ks__err_at(err, KS_E_FORMAT, path, KS__SHARD_META, -1, "rank %d: missing or wrong keepsake.shard record", rank);
  if (!st) st = ks__shard_parse_meta(a, ks_meta_get(ks_reader_meta(h->r), KS__DCP_INFO), KS__DCP_INFO, &h->dcp, err);
  if (!st && h->dcp && !ks__jv_is(h->dcp, KS__JV_OBJECT))
    st = ks__err_at(err, KS_E_FORMAT, path, KS__DCP_INFO, -1, "rank %d: malformed DCP_SHARDING_INFO", rank);
  if (st && err) ks__err_set_file(err, path);
  ks__free(a, path);
  return st;
}

/* A new "sharded" entry: its dtype, global shape and an empty chunk list. */
static ks__jv *sharded_entry(const ks_allocator *a, ks_dtype dt, int rank, const int64_t *g) {
  ks__jv *e = ks__jv_object(a);
  ks_status st = KS_OK;
  ks__shard_put(a, e, "dtype", ks__jv_str(a, ks_dtype_name(dt)), &st);
  ks__shard_put(a, e, "global_shape", ks__shard_dims_json(a, rank, g), &st);
  ks__shard_put(a, e, "chunks", ks__jv_array(a), &st);
  if (st) {
    ks__jv_free(a, e);
    return NULL;
  }
  return e;
}

static ks__jv *chunk_entry(const ks_allocator *a, int f, int rank, const int64_t *off, const int64_t *shape) {
  ks__jv *c = ks__jv_object(a);
  ks_status st = KS_OK;
  ks__shard_put(a, c, "rank", ks__jv_int(a, f), &st);
  ks__shard_put(a, c, "offsets", ks__shard_dims_json(a, rank, off), &st);
  ks__shard_put(a, c, "shape", ks__shard_dims_json(a, rank, shape), &st);
  if (st) {
    ks__jv_free(a, c);
    return NULL;
  }
  return c;
}

/* Adds file f's chunks to the "sharded" object, checking dtype and global shape agree. */
KS_NODISCARD static ks_status add_chunks(const ks_allocator *a, ks__jv *sharded, const file_head *h, int f,
                                         const char *fname, ks_error *err) {
  for (size_t i = 0; i < h->dcp->len; i++) {
    const char *key = h->dcp->keys[i];
    const ks__jv *v = h->dcp->items[i];
    if (!ks__jv_get(v, "global_shape")) continue; /* a whole tensor */
    ks_tensor t;
    int64_t off[KS_MAX_RANK], g[KS_MAX_RANK];
    if (ks_reader_tensor(h->r, key, &t, NULL) || ks__shard_dims(ks__jv_get(v, "saved_offsets"), off) != t.rank ||
        ks__shard_dims(ks__jv_get(v, "global_shape"), g) != t.rank)
      return ks__err_at(err, KS_E_FORMAT, fname, key, -1, "rank %d: chunk of '%s' is malformed", f, key);
    ks__jv *e = (ks__jv *)ks__jv_get(sharded, key);
    ks_status st = KS_OK;
    if (!e) {
      e = sharded_entry(a, t.dtype, t.rank, g);
      ks__shard_put(a, sharded, key, e, &st);
      if (st) return ks__err(err, KS_E_NOMEM, "out of memory");
    } else {
      int64_t g0[KS_MAX_RANK];
      const char *dn = ks__jv_string(ks__jv_get(e, "dtype"));
      if (!dn || strcmp(dn, ks_dtype_name(t.dtype)) || ks__shard_dims(ks__jv_get(e, "global_shape"), g0) != t.rank ||
          memcmp(g0, g, sizeof(int64_t) * (size_t)t.rank))
        return ks__err_at(err, KS_E_MISMATCH, fname, key, -1, "rank %d: '%s' has another dtype or global shape", f,
                          key);
    }
    ks__shard_push(a, (ks__jv *)ks__jv_get(e, "chunks"), chunk_entry(a, f, t.rank, off, t.shape), &st);
    if (st) return ks__err(err, KS_E_NOMEM, "out of memory");
  }
  return KS_OK;
}

/* Whole replicated tensors go in the weight_map; per-rank ones differ by rank and stay out of it. */
static int is_per_rank(const ks__jv *per_rank, const char *name) {
  for (size_t i = 0; ks__jv_is(per_rank, KS__JV_ARRAY) && i < per_rank->len; i++) {
    const char *g = ks__jv_string(per_rank->items[i]);
    if (g && ks_path_match(g, name)) return 1;
  }
  return 0;
}

KS_NODISCARD static ks_status add_whole(const ks_allocator *a, ks__jv *weight_map, const file_head *h,
                                        const ks__jv *per_rank, const char *fname, uint64_t *total) {
  ks_status st = KS_OK;
  for (size_t i = 0; !st && i < ks_reader_count(h->r); i++) {
    const char *name;
    ks_tensor t;
    if (ks_reader_tensor_at(h->r, i, &name, &t)) continue; /* index in range: cannot fail */
    if (ks__jv_get(ks__jv_get(h->dcp, name), "global_shape") || is_per_rank(per_rank, name)) continue;
    ks__shard_put(a, weight_map, name, ks__jv_str(a, fname), &st);
    *total += t.nbytes;
  }
  return st;
}

static ks__jv *file_entry(const ks_allocator *a, int f, const char *fname, const ks_shard_file_info *info) {
  char hex[17];
  snprintf(hex, sizeof hex, "%016llx", (unsigned long long)info->checksum);
  ks__jv *o = ks__jv_object(a);
  ks_status st = KS_OK;
  ks__shard_put(a, o, "rank", ks__jv_int(a, f), &st);
  ks__shard_put(a, o, "file", ks__jv_str(a, fname), &st);
  ks__shard_put(a, o, "size", ks__jv_int(a, (int64_t)info->size), &st);
  ks__shard_put(a, o, "header_xxh3", ks__jv_str(a, hex), &st); /* version 2: the hash of the length and header */
  if (st) {
    ks__jv_free(a, o);
    return NULL;
  }
  return o;
}

/* Bytes of the sharded tensors at their global shapes. */
static uint64_t sharded_bytes(const ks__jv *sharded) {
  uint64_t total = 0;
  for (size_t i = 0; i < sharded->len; i++) {
    const ks__jv *v = sharded->items[i];
    int64_t g[KS_MAX_RANK];
    int r = ks__shard_dims(ks__jv_get(v, "global_shape"), g);
    uint64_t n_el = 1;
    for (int d = 0; d < r; d++) n_el *= (uint64_t)g[d];
    const char *dn = ks__jv_string(ks__jv_get(v, "dtype"));
    ks_dtype dt = KS_U8;
    if (dn && ks_dtype_parse(dn, strlen(dn), &dt)) dt = KS_U8; /* written above from a valid dtype */
    total += n_el * ks_dtype_size(dt);
  }
  return total;
}

KS_NODISCARD static ks_status check_timestamps(const file_head *heads, int f, const char *fname, ks_error *err) {
  if (ks__shard_ts_equal(&heads[f].ts, &heads[0].ts)) return KS_OK;
  char x[160], y[160];
  ks__shard_ts_format(&heads[f].ts, x, sizeof x);
  ks__shard_ts_format(&heads[0].ts, y, sizeof y);
  return ks__err_at(err, KS_E_MISMATCH, fname, NULL, -1, "timestamps differ across ranks: rank %d has %s, rank 0 %s", f,
                    x, y);
}

/* The whole index document; per_rank is copied. NULL with *st set on failure. */
static ks__jv *build(const ks_allocator *a, int n, const ks_shard_file_info *infos, file_head *heads,
                     const ks__jv *per_rank, ks_error *err, ks_status *st) {
  ks__jv *files = ks__jv_array(a), *sharded = ks__jv_object(a), *weight_map = ks__jv_object(a);
  ks__jv *ks = ks__jv_object(a), *root = ks__jv_object(a), *md = ks__jv_object(a);
  uint64_t total = 0;
  ks_status s = files && sharded && weight_map ? KS_OK : KS_E_NOMEM;
  for (int f = 0; !s && f < n; f++) {
    char fname[64];
    s = ks_shard_file_name(f, n, fname, sizeof fname);
    ks__shard_push(a, files, file_entry(a, f, fname, &infos[f]), &s);
    if (!s && (s = check_timestamps(heads, f, fname, err))) break;
    if (!s && heads[f].dcp && (s = add_chunks(a, sharded, &heads[f], f, fname, err))) break;
    if (!s && f == 0) s = add_whole(a, weight_map, &heads[f], per_rank, fname, &total);
  }
  if (!s) total += sharded_bytes(sharded);
  if (s == KS_E_NOMEM) s = ks__err(err, KS_E_NOMEM, "out of memory building the index");
  ks_status b = s;
  ks__shard_put(a, ks, "format", ks__jv_str(a, "keepsake-sharded"), &b);
  ks__shard_put(a, ks, "version", ks__jv_int(a, KS_SHARD_INDEX_VERSION), &b);
  ks__shard_put(a, ks, "world_size", ks__jv_int(a, n), &b);
  ks__shard_put(a, ks, "timestamp", ks__shard_ts_json(a, &heads[0].ts), &b);
  ks__shard_put(a, ks, "per_rank", per_rank ? ks__jv_copy(a, per_rank) : ks__jv_null(a), &b);
  ks__shard_put(a, ks, "files", files, &b);
  ks__shard_put(a, ks, "sharded", sharded, &b);
  ks__shard_put(a, md, "total_size", ks__jv_int(a, (int64_t)total), &b);
  ks__shard_put(a, root, "metadata", md, &b);
  ks__shard_put(a, root, "weight_map", weight_map, &b);
  ks__shard_put(a, root, "keepsake", ks, &b);
  if (b) {
    ks__jv_free(a, root);
    *st = s ? s : ks__err(err, KS_E_NOMEM, "out of memory building the index");
    return NULL;
  }
  return root;
}

KS_NODISCARD static ks_status write_durable(const char *path, const char *text, const ks_save_opts *opts,
                                            ks_error *err) {
  ks__durable d;
  ks_status st = ks__durable_prepare(&d, path, opts ? opts->io : NULL, opts ? opts->alloc : NULL, err);
  if (!st) st = ks__durable_open(&d);
  if (!st) st = ks__durable_write(&d, text, strlen(text));
  if (!st) st = ks__durable_commit(&d);
  ks__durable_abort(&d);
  return st;
}

ks_status ks_shard_write_index(const char *dir, int world_size, const ks_shard_file_info *infos,
                               const ks_save_opts *opts, ks_error *err) {
  if (!dir || !infos || world_size < 1 || world_size > KS_SHARD_MAX_WORLD)
    return ks__err(err, KS_E_INVALID, "ks_shard_write_index: bad argument");
  const ks_allocator *a = ks__alloc_or_default(opts ? opts->alloc : NULL);
  file_head *heads = ks__calloc(a, (size_t)world_size, sizeof *heads);
  if (!heads) return ks__err(err, KS_E_NOMEM, "out of memory");
  ks_status st = KS_OK;
  for (int f = 0; !st && f < world_size; f++)
    st = open_head(dir, f, world_size, a, opts ? opts->io : NULL, &heads[f], err);
  ks__jv *idx = st ? NULL : build(a, world_size, infos, heads, ks__jv_get(heads[0].record, "per_rank"), err, &st);
  /* One space per level and sorted keys: the layout indexes have always had (jansson's JSON_INDENT(1)). */
  char *text = idx && !st ? ks__jv_dump_indented(a, idx, true, 1) : NULL;
  if (!st && !text) st = ks__err(err, KS_E_NOMEM, "out of memory building the index");
  char *path = st ? NULL : ks__shard_join(a, dir, KS_SHARD_INDEX_NAME);
  if (!st && !path) st = ks__err(err, KS_E_NOMEM, "out of memory");
  if (!st) st = write_durable(path, text, opts, err);
  ks__free(a, text);
  ks__jv_free(a, idx);
  ks__free(a, path);
  for (int f = 0; f < world_size; f++) {
    ks_reader_free(heads[f].r);
    ks__jv_free(a, heads[f].record);
    ks__jv_free(a, heads[f].dcp);
  }
  ks__free(a, heads);
  return st;
}
