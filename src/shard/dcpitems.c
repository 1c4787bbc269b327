/*
 * torch.distributed.checkpoint (DCP) saves in the sharded layout (docs/FORMAT.md 9.1): which of a
 * rank's plan items are replicated entries and which are chunks, how a non-tensor value is named,
 * the names a DCP key may not take, the keepsake.dcp record with DCP's planner data, and what a
 * DCP load of a directory can ask for. A binding's StorageWriter and StorageReader only map DCP's
 * objects onto these calls; the entries a binding keeps beside DCP's items (its state under the names
 * a C program gives it) go through ks_shard_write_rank's rules with them, so a DCP save and an MPI
 * save of the same state are one layout.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shard/shard_internal.h"

#define DCP_RECORD_VERSION 1

static int has_prefix(const char *s, const char *p) { return !strncmp(s, p, strlen(p)); }

/* ---- planner data (rank 0's keepsake.dcp record) ---- */

static int cmp_key(const void *a, const void *b) {
  return strcmp(((const ks__planner_key *)a)->key, ((const ks__planner_key *)b)->key);
}

void ks__planner_free(const ks_allocator *a, ks__planner *p) {
  if (!p) return;
  ks__free(a, p->keys);
  ks_dcp_doc_free(p->doc);
  ks__free(a, p->text);
  memset(p, 0, sizeof *p);
}

ks_status ks__planner_read(const ks_allocator *a, const ks_meta *meta, const char *path, ks__planner *out,
                           ks_error *err) {
  memset(out, 0, sizeof *out);
  const char *record = meta ? ks_meta_get(meta, KS_SHARD_DCP_RECORD) : NULL;
  if (!record) return KS_OK;
  out->recorded = 1;
  ks__jv *j = NULL;
  ks_status st = ks__shard_parse_meta(a, record, KS_SHARD_DCP_RECORD, &j, err);
  const ks__jv *pd = st ? NULL : ks__jv_get(j, "planner_data");
  if (!st && (!ks__jv_is(j, KS__JV_OBJECT) || (pd && !ks__jv_is(pd, KS__JV_NULL) && !ks__jv_string(pd))))
    st = ks__err_at(err, KS_E_FORMAT, path, KS_SHARD_DCP_RECORD, -1,
                    "the %s record is not {\"version\": n, \"planner_data\": string or null}", KS_SHARD_DCP_RECORD);
  const char *text = st ? NULL : ks__jv_string(pd);
  if (text && !(out->text = ks__strdup(a, text))) st = ks__err(err, KS_E_NOMEM, "out of memory");
  ks__jv_free(a, j);
  if (!st && out->text) st = ks_dcp_doc_parse(out->text, strlen(out->text), a, &out->doc, err);
  if (st && err) ks__err_set_file(err, path);
  const ks_dcp_value *root = st ? NULL : ks_dcp_doc_root(out->doc);
  /* A custom planner's data that is no flattening map names nothing: every item keeps its key. */
  if (root && root->kind == KS_DCP_DICT && root->count) {
    if (!(out->keys = ks__calloc(a, root->count, sizeof *out->keys))) st = ks__err(err, KS_E_NOMEM, "out of memory");
    for (size_t i = 0; !st && i < root->count; i++) {
      const ks_dcp_value *k = &root->items[2 * i];
      if (k->kind != KS_DCP_STR) continue;
      out->keys[out->n].key = k->s;
      out->keys[out->n++].path = &root->items[2 * i + 1];
    }
    if (!st) qsort(out->keys, out->n, sizeof *out->keys, cmp_key);
  }
  if (st) ks__planner_free(a, out);
  return st;
}

const ks_dcp_value *ks__planner_path(const ks__planner *p, const char *fqn) {
  if (!p || !p->n) return NULL;
  ks__planner_key k = {fqn, NULL};
  const ks__planner_key *hit = bsearch(&k, p->keys, p->n, sizeof *p->keys, cmp_key);
  return hit ? hit->path : NULL;
}

int ks__shard_dcp_item(const ks__planner *p, const char *name) {
  return has_prefix(name, KS_SHARD_DCP_OBJECT) || ks__planner_path(p, name) != NULL;
}

/* ---- writing ---- */

static KS_NODISCARD ks_status check_key(const ks_shard_dcp_rank *r, const char *fqn, ks_error *err) {
  size_t n = 0;
  const char *const *globs = ks_shard_default_per_rank(&n);
  if (!fqn || !*fqn) return ks__err(err, KS_E_INVALID, "a DCP item without a key");
  if (has_prefix(fqn, KS_SHARD_DCP_OBJECT) || has_prefix(fqn, KS_SHARD_DCP_LOCAL))
    return ks__err_at(err, KS_E_INVALID, NULL, fqn, -1, "%s: names starting with '%s' or '%s' are keepsake's", fqn,
                      KS_SHARD_DCP_OBJECT, KS_SHARD_DCP_LOCAL);
  if (r->per_rank && ks__shard_matches(fqn, globs, n))
    return ks__err_at(err, KS_E_INVALID, NULL, fqn, -1,
                      "%s: a DCP item named as a per-rank entry (rng, state/dataset_state, state/train_metrics, "
                      "state/eval_metrics) in a save that has per-rank entries",
                      fqn);
  return KS_OK;
}

/* One plan item into the file's state dict (and the map when it is a chunk). */
static KS_NODISCARD ks_status add_item(const ks_shard_dcp_rank *r, const ks_shard_dcp_item *it, ks_statedict *sd,
                                       ks_shard_map *map, ks_error *err) {
  ks_status st = check_key(r, it->fqn, err);
  if (st) return st;
  char name[KS__KEY_MAX + 1];
  if (it->object ? ks__key(name, KS_SHARD_DCP_OBJECT, it->fqn) : ks__key(name, "", it->fqn))
    return ks__key_limit(err, it->object ? KS_SHARD_DCP_OBJECT : "", it->fqn);
  if (it->object && (it->data.dtype != KS_U8 || it->data.rank != 1))
    return ks__err_at(err, KS_E_INVALID, NULL, it->fqn, -1, "%s: a non-tensor value's bytes are a 1-d U8 tensor",
                      it->fqn);
  ks_entry had;
  if (ks_statedict_get(sd, name, &had) == KS_OK)
    return ks__err_at(err, KS_E_UNSUPPORTED, NULL, it->fqn, -1,
                      "%s: more than one chunk of a tensor on one rank (keepsake files hold at most one)", it->fqn);
  if ((st = ks_statedict_set_tensor(sd, name, &it->data, KS_BORROW, err)) != KS_OK) return st;
  int whole = it->object || it->whole;
  if (whole && r->rank == 0) return KS_OK; /* a replicated entry (the index's weight_map) */
  static const int64_t zeros[KS_MAX_RANK] = {0};
  return ks_shard_map_add(map, name, it->data.rank, whole ? it->data.shape : it->global_shape,
                          whole ? zeros : it->offsets, it->data.shape, err);
}

/* The keepsake.dcp record: {"planner_data": text | null, "version": 1}, compact with sorted keys. */
static KS_NODISCARD ks_status put_record(const ks_allocator *a, const ks_shard_dcp_rank *r, ks_meta *m, ks_error *err) {
  ks_status st = KS_OK;
  ks__jv *o = ks__jv_object(a);
  ks__shard_put(a, o, "planner_data", r->planner_data ? ks__jv_str(a, r->planner_data) : ks__jv_null(a), &st);
  ks__shard_put(a, o, "version", ks__jv_int(a, DCP_RECORD_VERSION), &st);
  char *text = st ? NULL : ks__jv_dump(a, o, true);
  ks__jv_free(a, o);
  if (!text) return ks__err(err, KS_E_NOMEM, "out of memory building the %s record", KS_SHARD_DCP_RECORD);
  st = ks_meta_set(m, KS_SHARD_DCP_RECORD, text, err);
  ks__free(a, text);
  return st;
}

ks_status ks_shard_dcp_write_rank(const char *dir, const ks_shard_dcp_rank *r, const ks_save_opts *opts,
                                  ks_shard_file_info *info, ks_error *err) {
  if (!dir || !r || !info || (r->n_items && !r->items))
    return ks__err(err, KS_E_INVALID, "ks_shard_dcp_write_rank: NULL argument");
  const ks_allocator *a = ks__alloc_or_default(opts ? opts->alloc : NULL);
  ks_statedict *sd = NULL;
  ks_shard_map *map = NULL;
  ks_meta *m = NULL;
  ks_status st = ks_statedict_create(a, &sd, err);
  if (!st) st = ks_shard_map_create(a, &map, err);
  if (!st) st = ks_meta_create(a, &m, err);
  for (size_t i = 0; !st && i < r->n_items; i++) st = add_item(r, &r->items[i], sd, map, err);
  for (size_t i = 0; !st && r->entries && i < ks_statedict_count(r->entries); i++) {
    ks_entry e, had;
    if (ks_statedict_at(r->entries, i, &e)) continue; /* index in range: cannot fail */
    if (ks_statedict_get(sd, e.name, &had) == KS_OK)
      st = ks__err_at(err, KS_E_INVALID, NULL, e.name, -1, "%s: a DCP item has the name of a keepsake entry", e.name);
    else st = ks_statedict_set_entry(sd, e.name, &e, KS_BORROW, err);
  }
  for (size_t i = 0; !st && r->meta && i < ks_meta_count(r->meta); i++) {
    const char *k, *v;
    if (!ks_meta_at(r->meta, i, &k, &v)) st = ks_meta_set(m, k, v, err);
  }
  if (!st && r->dcp) st = put_record(a, r, m, err);
  size_t n = 0;
  static const char *const none[1] = {NULL};
  const char *const *globs = r->per_rank ? ks_shard_default_per_rank(&n) : none;
  if (!st) st = ks_shard_write_rank(dir, r->rank, r->world_size, sd, m, map, globs, n, opts, info, err);
  ks_meta_free(m);
  ks_shard_map_free(map);
  ks_statedict_free(sd);
  return st;
}

/* ---- what a DCP load can ask for ---- */

static KS_NODISCARD ks_status visit(ks_shard_dcp_visit_fn fn, void *ctx, const ks_shard_dcp_entry *e, ks_error *err) {
  if (!fn(ctx, e)) return KS_OK;
  return ks__err_at(err, KS_E_STATE, NULL, e->name, -1, "listing stopped at '%s'", e->name);
}

static KS_NODISCARD ks_status list_sharded(const ks_shard_index *idx, const char *dir, ks_shard_dcp_visit_fn fn,
                                           void *ctx, ks_error *err) {
  for (size_t i = 0; i < idx->n_sharded; i++) {
    const ks__sharded *s = &idx->sharded[i];
    ks_shard_dcp_entry e = {.fqn = s->name, .name = s->name, .kind = KS_SHARD_DCP_TENSOR, .dtype = s->dtype,
                            .rank = s->rank, .sharded = (long)i};
    memcpy(e.global_shape, s->global_shape, sizeof e.global_shape);
    if (has_prefix(s->name, KS_SHARD_DCP_OBJECT)) {
      int ok = s->n_chunks == 1 && s->dtype == KS_U8 && s->rank == 1 && s->chunks[0].offsets[0] == 0;
      if (!ok)
        return ks__err_at(err, KS_E_FORMAT, dir, s->name, -1, "%s: an object is one whole 1-d U8 tensor", s->name);
      e.fqn = s->name + strlen(KS_SHARD_DCP_OBJECT);
      e.kind = KS_SHARD_DCP_OBJECT_VALUE;
    }
    ks_status st = visit(fn, ctx, &e, err);
    if (st) return st;
  }
  return KS_OK;
}

static int is_sharded(const ks_shard_index *idx, const char *name) {
  for (size_t i = 0; i < idx->n_sharded; i++)
    if (!strcmp(idx->sharded[i].name, name)) return 1;
  return 0;
}

/* Rank 0's tensors and scalars that a DCP load sees: neither sharded nor per-rank. */
static KS_NODISCARD ks_status list_rank0(const ks_shard_index *idx, const ks_reader *r, const ks_statedict *scalars,
                                         const char *path, ks_shard_dcp_visit_fn fn, void *ctx, ks_error *err) {
  const char *const *globs = (const char *const *)idx->per_rank;
  for (size_t i = 0; i < ks_reader_count(r); i++) {
    const char *name;
    ks_tensor t;
    /* Descriptors only: a lazy reader would read and verify the bytes, and a damaged tensor must still be
       listed (its load reports the checksum error; a load that does not ask for it succeeds). */
    if (ks_reader_tensor_at(r, i, &name, NULL) || ks_reader_tensor_desc(r, i, &t)) continue; /* index in range */
    if (is_sharded(idx, name) || ks__shard_matches(name, globs, idx->n_per_rank)) continue;
    ks_shard_dcp_entry e = {.fqn = name, .name = name, .kind = KS_SHARD_DCP_TENSOR, .dtype = t.dtype, .rank = t.rank,
                            .sharded = -1};
    memcpy(e.global_shape, t.shape, sizeof e.global_shape);
    if (has_prefix(name, KS_SHARD_DCP_OBJECT)) {
      if (t.dtype != KS_U8 || t.rank != 1)
        return ks__err_at(err, KS_E_FORMAT, path, name, -1, "%s: an object is one whole 1-d U8 tensor", name);
      e.fqn = name + strlen(KS_SHARD_DCP_OBJECT);
      e.kind = KS_SHARD_DCP_OBJECT_VALUE;
    }
    ks_status st = visit(fn, ctx, &e, err);
    if (st) return st;
  }
  for (size_t i = 0; i < ks_statedict_count(scalars); i++) {
    ks_entry v;
    if (ks_statedict_at(scalars, i, &v) || v.kind == KS_VAL_TENSOR) continue;
    if (is_sharded(idx, v.name) || ks__shard_matches(v.name, globs, idx->n_per_rank)) continue;
    ks_shard_dcp_entry e = {.fqn = v.name, .name = v.name, .kind = KS_SHARD_DCP_SCALAR, .sharded = -1, .scalar = &v};
    ks_status st = visit(fn, ctx, &e, err);
    if (st) return st;
  }
  return KS_OK;
}

ks_status ks_shard_dcp_list(const char *dir, const ks_shard_index *idx, const ks_io *io, const ks_allocator *alloc,
                            ks_shard_dcp_visit_fn fn, void *ctx, char **planner_data, ks_error *err) {
  if (planner_data) *planner_data = NULL;
  if (!dir || !idx || !fn) return ks__err(err, KS_E_INVALID, "ks_shard_dcp_list: NULL argument");
  const ks_allocator *a = ks__alloc_or_default(alloc);
  ks_status st = list_sharded(idx, dir, fn, ctx, err);
  char *path = st ? NULL : ks__shard_join(a, dir, idx->files[0]);
  if (!st && !path) st = ks__err(err, KS_E_NOMEM, "out of memory");
  ks_reader *r = NULL;
  ks_statedict *scalars = NULL;
  ks_read_opts ro = {.alloc = a, .mode = KS_READ_LAZY, .io = io}; /* the header only */
  if (!st) st = ks_reader_open(path, &ro, &r, err);
  if (!st) st = ks_statedict_create(a, &scalars, err);
  if (!st) st = ks_reader_scalars(r, scalars, err);
  if (!st) st = list_rank0(idx, r, scalars, path, fn, ctx, err);
  ks__planner p;
  if (!st && planner_data) st = ks__planner_read(a, ks_reader_meta(r), path, &p, err);
  if (!st && planner_data) {
    *planner_data = p.text; /* taken */
    p.text = NULL;
    ks__planner_free(a, &p);
  }
  ks_statedict_free(scalars);
  ks_reader_free(r);
  ks__free(a, path);
  return st;
}
