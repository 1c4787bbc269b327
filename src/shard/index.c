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
  json_t *dcp; /* DCP_SHARDING_INFO or NULL */
} file_head;

static ks_status open_head(const char *dir, int rank, int n, file_head *h, ks_error *err) {
  char name[64];
  ks_shard_file_name(rank, n, name, sizeof name);
  char *path = ks__shard_join(NULL, dir, name);
  if (!path) return ks__err(err, KS_E_NOMEM, "out of memory");
  ks_status st = ks_reader_open(path, NULL, &h->r, err);
  const char *rec = st ? NULL : ks_meta_get(ks_reader_meta(h->r), KS__SHARD_META);
  json_t *j = rec ? json_loads(rec, JSON_REJECT_DUPLICATES, NULL) : NULL;
  json_t *jr = json_object_get(j, "rank"), *jw = json_object_get(j, "world_size");
  if (!st && (!j || json_integer_value(jr) != rank || json_integer_value(jw) != n ||
              !ks__shard_ts_parse(json_object_get(j, "timestamp"), &h->ts)))
    st = ks__err_at(err, KS_E_FORMAT, path, KS__SHARD_META, -1, "rank %d: missing or wrong keepsake.shard record", rank);
  json_decref(j);
  const char *dcp = st ? NULL : ks_meta_get(ks_reader_meta(h->r), KS__DCP_INFO);
  if (dcp && !(h->dcp = json_loads(dcp, JSON_REJECT_DUPLICATES, NULL)))
    st = ks__err_at(err, KS_E_FORMAT, path, KS__DCP_INFO, -1, "rank %d: malformed DCP_SHARDING_INFO", rank);
  ks__free(NULL, path);
  return st;
}

/* Adds file f's chunks to the "sharded" object, checking dtype and global shape agree. */
static ks_status add_chunks(json_t *sharded, const file_head *h, int f, const char *fname, ks_error *err) {
  const char *key;
  json_t *v;
  json_object_foreach(h->dcp, key, v) {
    if (!json_object_get(v, "global_shape")) continue; /* a whole tensor */
    ks_tensor t;
    int64_t off[KS_MAX_RANK], g[KS_MAX_RANK];
    if (ks_reader_tensor(h->r, key, &t, NULL) || ks__shard_dims(json_object_get(v, "saved_offsets"), off) != t.rank ||
        ks__shard_dims(json_object_get(v, "global_shape"), g) != t.rank)
      return ks__err_at(err, KS_E_FORMAT, fname, key, -1, "rank %d: chunk of '%s' is malformed", f, key);
    json_t *e = json_object_get(sharded, key);
    if (!e) {
      e = json_pack("{s:s, s:o, s:[]}", "dtype", ks_dtype_name(t.dtype), "global_shape", ks__shard_dims_json(t.rank, g),
                    "chunks");
      if (!e || json_object_set_new(sharded, key, e)) return ks__err(err, KS_E_NOMEM, "out of memory");
    } else {
      int64_t g0[KS_MAX_RANK];
      if (strcmp(json_string_value(json_object_get(e, "dtype")), ks_dtype_name(t.dtype)) ||
          ks__shard_dims(json_object_get(e, "global_shape"), g0) != t.rank || memcmp(g0, g, sizeof(int64_t) * (size_t)t.rank))
        return ks__err_at(err, KS_E_MISMATCH, fname, key, -1, "rank %d: '%s' has another dtype or global shape", f, key);
    }
    json_t *c = json_pack("{s:i, s:o, s:o}", "rank", f, "offsets", ks__shard_dims_json(t.rank, off), "shape",
                          ks__shard_dims_json(t.rank, t.shape));
    if (!c || json_array_append_new(json_object_get(e, "chunks"), c)) return ks__err(err, KS_E_NOMEM, "out of memory");
  }
  return KS_OK;
}

/* Whole replicated tensors go in the weight_map; per-rank ones differ by rank and stay out of it. */
static int is_per_rank(const json_t *per_rank, const char *name) {
  for (size_t i = 0; i < json_array_size(per_rank); i++) {
    const char *g = json_string_value(json_array_get(per_rank, i));
    if (g && ks_path_match(g, name)) return 1;
  }
  return 0;
}

static void add_whole(json_t *weight_map, const file_head *h, const json_t *per_rank, const char *fname,
                      uint64_t *total) {
  for (size_t i = 0; i < ks_reader_count(h->r); i++) {
    const char *name;
    ks_tensor t;
    ks_reader_tensor_at(h->r, i, &name, &t);
    if (json_object_get(json_object_get(h->dcp, name), "global_shape") || is_per_rank(per_rank, name)) continue;
    json_object_set_new(weight_map, name, json_string(fname));
    *total += t.nbytes;
  }
}

static json_t *build(int n, const ks_shard_file_info *infos, file_head *heads, json_t *per_rank, ks_error *err,
                     ks_status *st) {
  json_t *files = json_array(), *sharded = json_object(), *weight_map = json_object();
  uint64_t total = 0;
  for (int f = 0; !*st && f < n; f++) {
    char fname[64], hex[17];
    ks_shard_file_name(f, n, fname, sizeof fname);
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)infos[f].checksum);
    json_array_append_new(files, json_pack("{s:i, s:s, s:I, s:s}", "rank", f, "file", fname, "size",
                                           (json_int_t)infos[f].size, "xxh3", hex));
    if (!ks__shard_ts_equal(&heads[f].ts, &heads[0].ts)) {
      char a[160], b[160];
      ks__shard_ts_format(&heads[f].ts, a, sizeof a);
      ks__shard_ts_format(&heads[0].ts, b, sizeof b);
      *st = ks__err_at(err, KS_E_MISMATCH, fname, NULL, -1, "timestamps differ across ranks: rank %d has %s, rank 0 %s",
                       f, a, b);
    }
    if (!*st && heads[f].dcp) *st = add_chunks(sharded, &heads[f], f, fname, err);
    if (!*st && f == 0) add_whole(weight_map, &heads[f], per_rank, fname, &total);
  }
  const char *key;
  json_t *v;
  json_object_foreach(sharded, key, v) {
    int64_t g[KS_MAX_RANK];
    int r = ks__shard_dims(json_object_get(v, "global_shape"), g);
    uint64_t n_el = 1;
    for (int d = 0; d < r; d++) n_el *= (uint64_t)g[d];
    const char *dn = json_string_value(json_object_get(v, "dtype"));
    ks_dtype dt = KS_U8;
    if (dn) ks_dtype_parse(dn, strlen(dn), &dt);
    total += n_el * ks_dtype_size(dt);
  }
  json_t *ts = ks__shard_ts_json(&heads[0].ts);
  json_t *ks = json_pack("{s:s, s:i, s:i, s:o, s:O, s:o, s:o}", "format", "keepsake-sharded", "version",
                         KS_SHARD_INDEX_VERSION, "world_size", n, "timestamp", ts, "per_rank", per_rank, "files",
                         files, "sharded", sharded);
  return json_pack("{s:{s:I}, s:o, s:o}", "metadata", "total_size", (json_int_t)total, "weight_map", weight_map,
                   "keepsake", ks);
}

static ks_status write_durable(const char *path, const char *text, const ks_save_opts *opts, ks_error *err) {
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
  file_head *heads = ks__calloc(NULL, (size_t)world_size, sizeof *heads);
  if (!heads) return ks__err(err, KS_E_NOMEM, "out of memory");
  ks_status st = KS_OK;
  for (int f = 0; !st && f < world_size; f++) st = open_head(dir, f, world_size, &heads[f], err);
  json_t *per_rank = NULL;
  if (!st) {
    const char *rec = ks_meta_get(ks_reader_meta(heads[0].r), KS__SHARD_META);
    json_t *j = json_loads(rec, 0, NULL);
    per_rank = json_incref(json_object_get(j, "per_rank"));
    json_decref(j);
  }
  json_t *idx = st ? NULL : build(world_size, infos, heads, per_rank, err, &st);
  json_decref(per_rank);
  char *text = idx && !st ? json_dumps(idx, JSON_INDENT(1) | JSON_SORT_KEYS) : NULL;
  if (!st && !text) st = ks__err(err, KS_E_NOMEM, "out of memory building the index");
  char *path = st ? NULL : ks__shard_join(NULL, dir, KS_SHARD_INDEX_NAME);
  if (!st && !path) st = ks__err(err, KS_E_NOMEM, "out of memory");
  if (!st) st = write_durable(path, text, opts, err);
  free(text);
  json_decref(idx);
  ks__free(NULL, path);
  for (int f = 0; f < world_size; f++) {
    ks_reader_free(heads[f].r);
    json_decref(heads[f].dcp);
  }
  ks__free(NULL, heads);
  return st;
}
