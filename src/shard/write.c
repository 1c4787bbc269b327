/*
 * One rank's file: its chunks of the sharded tensors, its per-rank entries and
 * (rank 0 only) the replicated entries, with the chunk offsets in torch DCP's
 * DCP_SHARDING_INFO and keepsake's own keepsake.shard record; then its size and
 * the hash of its header (which holds every tensor's checksum) for the index.
 */
#include <stdio.h>
#include <string.h>

#include "shard/shard_internal.h"

/* ks_save in its one-pass mode (each tensor hashed just before it is written, its checksum digits
   patched into the header after), then the size and header hash for the index, from the header
   read back: the data is not read again. */
KS_NODISCARD static ks_status save_summed(const char *path, const ks_statedict *sd, const ks_meta *m,
                                          const ks_save_opts *opts, ks_shard_file_info *info, ks_error *err) {
  ks_status st = ks_save(path, sd, m, opts, err);
  if (!st || st == KS_E_NOT_DURABLE) { /* the file is in place either way: the index can list it */
    ks_error e2;
    ks_status s2 = ks__shard_file_facts(opts ? opts->io : NULL, opts ? opts->alloc : NULL, path, info, &e2);
    if (s2) {
      if (err) *err = e2;
      st = s2;
    }
  }
  return st;
}

/* Where an entry goes: 0 skipped (replicated, not rank 0), 1 written. */
static int wanted(const ks_entry *e, int rank, const ks_shard_map *shards, const char *const *per_rank,
                  size_t n_per_rank) {
  ks_shard_chunk c;
  if (e->kind == KS_VAL_TENSOR && ks_shard_map_get(shards, e->name, &c) == KS_OK) return 1;
  if (ks__shard_matches(e->name, per_rank, n_per_rank)) return 1;
  return rank == 0;
}

KS_NODISCARD static ks_status check_chunk(const ks_statedict *sd, const ks_shard_chunk *c, ks_error *err) {
  const ks_tensor *t = ks_statedict_tensor(sd, c->name);
  if (!t) return ks__err_at(err, KS_E_INVALID, NULL, c->name, -1, "sharded tensor '%s' is not in the state", c->name);
  int same = t->rank == c->rank;
  for (int d = 0; same && d < c->rank; d++) same = t->shape[d] == c->shape[d];
  if (!same) {
    char a[128], b[128];
    return ks__err_at(err, KS_E_INVALID, NULL, c->name, -1, "sharded tensor '%s' has shape %s but its chunk is %s",
                      c->name, ks_shape_format(t->rank, t->shape, a, sizeof a),
                      ks_shape_format(c->rank, c->shape, b, sizeof b));
  }
  return KS_OK;
}

/* torch DCP's record of every tensor of the file: chunks at their offsets, whole tensors at zero. */
static ks__jv *dcp_info(const ks_allocator *a, const ks_statedict *fsd, const ks_shard_map *shards) {
  ks__jv *o = ks__jv_object(a);
  static const int64_t zeros[KS_MAX_RANK] = {0};
  ks_status st = KS_OK;
  for (size_t i = 0; !st && i < ks_statedict_count(fsd); i++) {
    ks_entry e;
    if (ks_statedict_at(fsd, i, &e)) continue; /* index in range: cannot fail */
    if (e.kind != KS_VAL_TENSOR) continue;
    ks_shard_chunk c;
    ks__jv *x = ks__jv_object(a);
    if (ks_shard_map_get(shards, e.name, &c) == KS_OK) {
      ks__shard_put(a, x, "saved_offsets", ks__shard_dims_json(a, c.rank, c.offsets), &st);
      ks__shard_put(a, x, "global_shape", ks__shard_dims_json(a, c.rank, c.global_shape), &st);
    } else {
      ks__shard_put(a, x, "saved_offsets", ks__shard_dims_json(a, e.tensor.rank, zeros), &st);
    }
    ks__shard_put(a, o, e.name, x, &st);
  }
  if (st) {
    ks__jv_free(a, o);
    return NULL;
  }
  return o;
}

static ks__jv *shard_record(const ks_allocator *a, int rank, int world_size, const ks_statedict *sd,
                            const char *const *per_rank, size_t n_per_rank) {
  ks__shard_ts ts;
  ks__shard_ts_of(sd, &ts);
  ks_status st = KS_OK;
  ks__jv *globs = ks__jv_array(a), *o = ks__jv_object(a);
  for (size_t i = 0; i < n_per_rank; i++) ks__shard_push(a, globs, ks__jv_str(a, per_rank[i]), &st);
  ks__shard_put(a, o, "rank", ks__jv_int(a, rank), &st);
  ks__shard_put(a, o, "world_size", ks__jv_int(a, world_size), &st);
  ks__shard_put(a, o, "per_rank", globs, &st);
  ks__shard_put(a, o, "timestamp", ks__shard_ts_json(a, &ts), &st);
  if (st) {
    ks__jv_free(a, o);
    return NULL;
  }
  return o;
}

/* Sets m[key] to j as compact JSON with sorted keys; takes j. */
KS_NODISCARD static ks_status set_json(const ks_allocator *a, ks_meta *m, const char *key, ks__jv *j, ks_error *err) {
  char *s = j ? ks__jv_dump(a, j, true) : NULL;
  ks__jv_free(a, j);
  ks_status st = s ? ks_meta_set(m, key, s, err) : KS_E_NOMEM;
  ks__free(a, s);
  return st ? ks__err(err, st, "cannot build the %s metadata", key) : KS_OK;
}

KS_NODISCARD static ks_status build_meta(int rank, int world_size, const ks_statedict *sd, const ks_statedict *fsd,
                                         const ks_meta *meta, const ks_shard_map *shards, const char *const *per_rank,
                                         size_t n_per_rank, const ks_allocator *a, ks_meta **out, ks_error *err) {
  ks_meta *m;
  if (ks_meta_create(a, &m, err)) return ks__err(err, KS_E_NOMEM, "out of memory building metadata");
  ks_status st = KS_OK;
  for (size_t i = 0; !st && meta && i < ks_meta_count(meta); i++) {
    const char *k, *v;
    st = ks_meta_at(meta, i, &k, &v);
    if (!st) st = ks_meta_set(m, k, v, err);
  }
  if (st) st = ks__err(err, st, "cannot copy the metadata");
  if (!st) st = set_json(a, m, KS__SHARD_META, shard_record(a, rank, world_size, sd, per_rank, n_per_rank), err);
  if (!st) {
    st = set_json(a, m, KS__DCP_INFO, dcp_info(a, fsd, shards), err);
    if (!st && (ks_meta_set(m, KS__DCP_VERSION, "1.0", err) || ks_meta_set(m, "format", "pt", err)))
      st = ks__err(err, KS_E_NOMEM, "out of memory building metadata");
  }
  if (st) {
    ks_meta_free(m);
    return st;
  }
  *out = m;
  return KS_OK;
}

KS_NODISCARD static ks_status select_entries(const ks_statedict *sd, int rank, const ks_shard_map *shards,
                                const char *const *per_rank, size_t n_per_rank, ks_statedict *out, ks_error *err) {
  for (size_t i = 0; i < ks_shard_map_count(shards); i++) {
    ks_shard_chunk c;
    if (ks_shard_map_at(shards, i, &c)) continue; /* index in range: cannot fail */
    ks_status st = check_chunk(sd, &c, err);
    if (st) return st;
  }
  for (size_t i = 0; i < ks_statedict_count(sd); i++) {
    ks_entry e;
    if (ks_statedict_at(sd, i, &e)) continue; /* index in range: cannot fail */
    if (!wanted(&e, rank, shards, per_rank, n_per_rank)) continue;
    ks_status st = ks_statedict_set_entry(out, e.name, &e, KS_BORROW, err);
    if (st) return ks__err_at(err, st, NULL, e.name, -1, "cannot select entry: %s", ks_strerror(st));
  }
  return KS_OK;
}

ks_status ks_shard_write_rank(const char *dir, int rank, int world_size, const ks_statedict *sd,
                              const ks_meta *meta, const ks_shard_map *shards, const char *const *per_rank,
                              size_t n_per_rank, const ks_save_opts *opts, ks_shard_file_info *info,
                              ks_error *err) {
  char name[64];
  if (!dir || !sd || !info || ks_shard_file_name(rank, world_size, name, sizeof name))
    return ks__err(err, KS_E_INVALID, "ks_shard_write_rank: bad argument (rank %d of %d)", rank, world_size);
  if (!per_rank) per_rank = ks_shard_default_per_rank(&n_per_rank);
  const ks_allocator *a = ks__alloc_or_default(opts ? opts->alloc : NULL);
  char *path = ks__shard_join(a, dir, name);
  ks_statedict *fsd = NULL;
  ks_meta *m = NULL;
  ks_status st = path && !ks_statedict_create(a, &fsd, err) ? KS_OK : ks__err(err, KS_E_NOMEM, "out of memory");
  if (!st) st = select_entries(sd, rank, shards, per_rank, n_per_rank, fsd, err);
  if (!st) st = build_meta(rank, world_size, sd, fsd, meta, shards, per_rank, n_per_rank, a, &m, err);
  if (!st) st = save_summed(path, fsd, m, opts, info, err);
  if (st && err) ks__err_set_file(err, path);
  ks_meta_free(m);
  ks_statedict_free(fsd);
  ks__free(a, path);
  return st;
}
