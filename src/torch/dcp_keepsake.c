/*
 * A checkpoint directory that keepsake's own DCP StorageWriter
 * (keepsake.distributed.KeepsakeWriter) wrote, as the state dict it holds: the
 * same names and values as the import of a torch DCP directory of the same
 * state (docs/FORMAT.md 9.1 and 12). The directory is checked and loaded as
 * one rank by src/shard (every file against the index, every tensor against its
 * checksum); then each stored item becomes an entry of ks__dcp_finish: a
 * tensor under its DCP key, a `keepsake.dcp.object/<key>` tensor as the value
 * its typed JSON holds, and rank 0's planner_data (the `keepsake.dcp` record)
 * gives the path of each key in the nested state dict. Entries that are no DCP
 * item (keepsake scalars, tensors that planner_data does not name: what the
 * distributed manager adds beside DCP's items) keep their names.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "keepsake/binding/dcpvalue.h"
#include "keepsake/format.h"
#include "keepsake/shard.h"
#include "torch/dcp_internal.h"

#define OBJECT_PREFIX "keepsake.dcp.object/"
#define DCP_RECORD "keepsake.dcp"
#define DCP_RECORD_VERSION 1

static KS_NODISCARD ks_status nomem(ks_error *err) { return ks__err(err, KS_E_NOMEM, "dcp: out of memory"); }

/* The decoded typed JSON as an inert value of the pickle machine's tree, so that the torch import's own
   rules (what is plain data, how it is named and flattened) apply to it unchanged. */
static KS_NODISCARD ks_status to_node(ks__pk_arena *ar, const ks_dcp_value *v, ks__pk_node **out) {
  ks__pk_node *n = NULL;
  switch (v->kind) {
    case KS_DCP_NONE: n = ks__pk_new_none(ar); break;
    case KS_DCP_BOOL: n = ks__pk_new_bool(ar, v->i != 0); break;
    case KS_DCP_INT: n = ks__pk_new_int(ar, v->i); break;
    case KS_DCP_FLOAT:
      if ((n = ks__pk_new(ar, PK_FLOAT)) != NULL) n->u.f = v->f;
      break;
    case KS_DCP_BIGINT: n = ks__pk_new_str(ar, PK_BIGINT, v->s, v->len); break;
    case KS_DCP_STR: n = ks__pk_new_str(ar, PK_STR, v->s, v->len); break;
    case KS_DCP_BYTES: n = ks__pk_new_str(ar, PK_BYTES, v->s, v->len); break;
    case KS_DCP_BYTESIO: { /* what torch.save pickles an io.BytesIO as: an object of class _io.BytesIO */
      ks__pk_node *cls = ks__pk_new_global(ar, "_io", 3, "BytesIO", 7);
      n = cls ? ks__pk_new_object(ar, cls, NULL) : NULL;
      break;
    }
    case KS_DCP_LIST:
    case KS_DCP_TUPLE:
    case KS_DCP_DICT: {
      size_t k = v->kind == KS_DCP_DICT ? 2 * v->count : v->count, bytes;
      ks__pk_node **items = ks__mul_size(k ? k : 1, sizeof *items, &bytes) ? ks__malloc(&ar->alloc, bytes) : NULL;
      if (!items) return KS_E_NOMEM;
      ks_status st = KS_OK;
      for (size_t i = 0; i < k && !st; i++) st = to_node(ar, &v->items[i], &items[i]);
      ks__pk_kind kind = v->kind == KS_DCP_LIST ? PK_LIST : v->kind == KS_DCP_TUPLE ? PK_TUPLE : PK_DICT;
      if (!st) n = ks__pk_new_seq(ar, kind, items, k);
      ks__free(&ar->alloc, items);
      if (st) return st;
      break;
    }
    default: return KS_E_FORMAT; /* never: the decoder makes no other kind */
  }
  if (!n) return KS_E_NOMEM;
  *out = n;
  return KS_OK;
}

/* Typed JSON bytes (untrusted) as a value of the tree; err names `key`. */
static KS_NODISCARD ks_status decode(ks__dcp_rd *r, const void *p, size_t n, const char *key, ks__pk_node **out) {
  ks_dcp_doc *doc = NULL;
  ks_status st = ks_dcp_doc_parse(p, n, r->a, &doc, r->err);
  if (st) {
    if (r->err) ks__err_set_key(r->err, key);
    return st;
  }
  st = to_node(r->ar, ks_dcp_doc_root(doc), out);
  ks_dcp_doc_free(doc);
  return st == KS_E_NOMEM ? nomem(r->err) : st;
}

/* Rank 0's `keepsake.dcp` record: planner_data as a PK_DICT (NULL when the writer kept none). */
static KS_NODISCARD ks_status planner_data(ks__dcp_rd *r, const char *record, ks__pk_node **pd) {
  ks__jv *j = NULL;
  ks_status st = ks__jv_parse(r->a, record, strlen(record), DCP_RECORD, &j, r->err);
  if (st) return st;
  int64_t version = 0;
  const ks__jv *p = ks__jv_get(j, "planner_data");
  if (!ks__jv_is(j, KS__JV_OBJECT) || !ks__jv_is_int(ks__jv_get(j, "version"), &version) || version < 1 ||
      (p && !ks__jv_is(p, KS__JV_NULL) && !ks__jv_is(p, KS__JV_STRING)))
    st = ks__err_at(r->err, KS_E_FORMAT, r->path, DCP_RECORD, -1,
                    "dcp: the %s record is not {\"version\": n, \"planner_data\": string or null}", DCP_RECORD);
  else if (version > DCP_RECORD_VERSION)
    st = ks__err_at(r->err, KS_E_VERSION, r->path, DCP_RECORD, -1,
                    "dcp: the %s record has version %lld; this library reads version %d: upgrade keepsake",
                    DCP_RECORD, (long long)version, DCP_RECORD_VERSION);
  else if (ks__jv_is(p, KS__JV_STRING))
    st = decode(r, p->s, p->len, DCP_RECORD, pd);
  ks__jv_free(r->a, j);
  return st;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* planner_data's keys (a PK_DICT), sorted: the DCP items of the directory. */
static KS_NODISCARD ks_status planned_keys(ks__dcp_rd *r, const ks__pk_node *pd, const char ***keys, size_t *n) {
  size_t bytes, k = 0;
  const char **v = ks__mul_size(pd->u.seq.n / 2 + 1, sizeof *v, &bytes) ? ks__malloc(r->a, bytes) : NULL;
  if (!v) return nomem(r->err);
  for (size_t i = 0; i + 1 < pd->u.seq.n; i += 2)
    if (pd->u.seq.v[i]->kind == PK_STR) v[k++] = pd->u.seq.v[i]->u.s.p;
  qsort(v, k, sizeof *v, cmp_str);
  *keys = v;
  *n = k;
  return KS_OK;
}

typedef struct loaded {
  ks_shard_index *idx;
  const char **keys; /* planner_data's keys, sorted (NULL: the writer kept no planner_data) */
  size_t nkeys;
  ks_statedict *sd; /* the directory as one rank loads it: DCP keys, objects, keepsake's own entries */
  ks_meta *meta;    /* rank 0's caller metadata: the keepsake.dcp record */
  bool *extra;      /* per entry of sd: kept under its own name */
} loaded;

static KS_NODISCARD ks_status load(ks__dcp_rd *r, loaded *L) {
  ks_status st = ks_shard_index_read(r->dir, r->a, r->io, &L->idx, r->err);
  if (!st) st = ks_shard_check(r->dir, L->idx, r->io, KS_SHARD_CHECK_HEADERS, NULL, NULL, r->err);
  if (st) return st;
  ks_shard_index_info ix = {.size = sizeof ix};
  ks_shard_index_get(L->idx, &ix);
  for (int f = 0; f < ix.world_size; f++) {
    ks_shard_file_info info;
    if (ks_shard_index_file(L->idx, f, &info) && !ks__add_u64(r->input_bytes, info.size, &r->input_bytes))
      r->input_bytes = UINT64_MAX;
  }
  /* Not a DCP directory (the C library's sharded checkpoints have per-rank state): refused before any data is read. */
  if ((st = ks__dcp_set_path(r, ks_shard_index_file(L->idx, 0, NULL))) != KS_OK) return st;
  ks_read_opts ro = {.alloc = r->a, .mode = KS_READ_LAZY, .io = r->io};
  ks_reader *head = NULL;
  if ((st = ks_reader_open(r->path, &ro, &head, r->err)) != KS_OK) return st;
  bool dcp = ks_meta_get(ks_reader_meta(head), DCP_RECORD) != NULL;
  ks_reader_free(head);
  if (!dcp)
    return ks__err_at(r->err, KS_E_UNSUPPORTED, r->dir, NULL, -1,
                      "dcp: a keepsake sharded checkpoint without the %s record (written by the C library, with "
                      "per-rank state): load it with ks_shard_load_rank, or 'keepsake reshard DIR --world-size 1 OUT'",
                      DCP_RECORD);
  ks_shard_load_opts lo = {.alloc = r->a, .no_verify = !(r->opts && r->opts->verify_crc), .io = r->io};
  return ks_shard_load_rank(r->dir, L->idx, 0, 1, NULL, &lo, &L->sd, &L->meta, r->err);
}

/* One entry of the loaded directory as an entry of r (or marked extra). */
static KS_NODISCARD ks_status add_entry(ks__dcp_rd *r, loaded *L, size_t i, size_t visits) {
  ks_entry e;
  if (ks_statedict_at(L->sd, i, &e)) return KS_OK; /* index in range: cannot fail */
  bool object = e.kind == KS_VAL_TENSOR && !strncmp(e.name, OBJECT_PREFIX, strlen(OBJECT_PREFIX));
  if (!object &&
      (e.kind != KS_VAL_TENSOR || (L->keys && !bsearch(&e.name, L->keys, L->nkeys, sizeof *L->keys, cmp_str)))) {
    L->extra[i] = true;
    return KS_OK;
  }
  ks__dcp_entry *d = &r->d.entries[r->d.nentries++];
  d->fqn = object ? e.name + strlen(OBJECT_PREFIX) : e.name;
  if (!object) {
    d->tensor = true;
    d->dtype = e.tensor.dtype;
    d->rank = e.tensor.rank;
    memcpy(d->shape, e.tensor.shape, sizeof d->shape);
    ks__pk_node *n = ks__pk_new_tensor(r->ar);
    if (!n) return nomem(r->err);
    *n->u.t = e.tensor;
    n->u.t->ownership = KS_OWNED; /* a view: the state dict it is in is attached to the result */
    d->value = n;
    return KS_OK;
  }
  if (e.tensor.dtype != KS_U8 || e.tensor.rank != 1)
    return ks__err_at(r->err, KS_E_FORMAT, r->dir, e.name, -1, "dcp: an object is not a 1-d U8 tensor");
  ks__pk_node *v = NULL;
  ks_status st = decode(r, e.tensor.data, e.tensor.nbytes, e.name, &v);
  if (st) return st;
  char why[512];
  const char *reason = ks__dcp_not_plain(v, visits, why, sizeof why);
  r->nobjects++;
  if (!reason) {
    d->value = v;
    return KS_OK;
  }
  ks__pk_node *s = ks__pk_new_str(r->ar, PK_STR, reason, strlen(reason));
  if (!s) return nomem(r->err);
  d->skipped = s->u.s.p;
  r->nskipped++;
  return KS_OK;
}

/* Chunks read: one per whole tensor, the index's count for each sharded one (objects are not tensors). */
static size_t chunk_count(const ks_shard_index *idx, const ks__dcp *d) {
  size_t tensors = 0, chunks = 0, sharded = 0;
  for (size_t i = 0; i < d->nentries; i++) tensors += d->entries[i].tensor;
  ks_shard_index_info ix = {.size = sizeof ix};
  ks_shard_index_get(idx, &ix);
  for (size_t j = 0; j < ix.n_sharded; j++) {
    ks_shard_chunk whole;
    ks_dtype dt;
    size_t nc;
    if (ks_shard_index_sharded_at(idx, j, &whole, &dt, &nc) ||
        !strncmp(whole.name, OBJECT_PREFIX, strlen(OBJECT_PREFIX)))
      continue;
    chunks += nc;
    sharded++;
  }
  return chunks + (tensors > sharded ? tensors - sharded : 0);
}

/* The entries keepsake keeps beside DCP's items, under their own names (views: the loaded dict is attached). */
static KS_NODISCARD ks_status add_extras(ks__dcp_rd *r, const ks_statedict *src, const bool *extra,
                                         ks_statedict *out) {
  for (size_t i = 0; i < ks_statedict_count(src); i++) {
    ks_entry e, had;
    if (!extra[i] || ks_statedict_at(src, i, &e)) continue;
    if (ks_statedict_get(out, e.name, &had) == KS_OK)
      return ks__err_at(r->err, KS_E_EXISTS, r->dir, e.name, -1,
                        "dcp: a DCP item and an entry keepsake keeps beside them have one name");
    ks_status st = ks_statedict_set_entry(out, e.name, &e, KS_MAPPED_VIEW, r->err);
    if (st) return st;
  }
  return KS_OK;
}

static void release_dict(void *p) { ks_statedict_free(p); }

ks_status ks__dcp_keepsake_load(ks__dcp_rd *r, ks_statedict **out, char **structure, char **info) {
  loaded L = {0};
  ks__pk_node *pd = NULL;
  ks_status st = load(r, &L);
  const char *record = st ? NULL : ks_meta_get(L.meta, DCP_RECORD);
  if (!st && record) st = planner_data(r, record, &pd);
  if (pd && pd->kind != PK_DICT) pd = NULL; /* not a flattening map: entries are named by their keys */
  if (!st && pd) st = planned_keys(r, pd, &L.keys, &L.nkeys);
  size_t n = st ? 0 : ks_statedict_count(L.sd), bytes;
  if (!st && (!ks__mul_size(n ? n : 1, sizeof *r->d.entries, &bytes) ||
              !(r->d.entries = ks__calloc(r->a, 1, bytes)) || !(L.extra = ks__calloc(r->a, n ? n : 1, 1))))
    st = nomem(r->err);
  uint64_t visits = r->input_bytes * 8 + 4096;
  for (size_t i = 0; !st && i < n; i++) st = add_entry(r, &L, i, visits > SIZE_MAX ? SIZE_MAX : (size_t)visits);
  if (!st) st = ks__dcp_read_paths(&r->d, pd, r->err);
  if (!st) {
    r->d.version = "1"; /* the keepsake.dcp record's */
    r->d.nchunks = chunk_count(L.idx, &r->d);
    r->format = "keepsake.distributed";
    ks_shard_index_info ix = {.size = sizeof ix};
    ks_shard_index_get(L.idx, &ix);
    r->nfiles = r->nchecksummed = (size_t)ix.world_size;
    st = ks__dcp_check_budget(r);
  }
  ks_statedict *sd = NULL, *src = L.sd;
  char *text = NULL, *doc = NULL;
  if (!st) st = ks__dcp_finish(r, &sd, structure ? &text : NULL, info ? &doc : NULL);
  if (!st && (st = ks__statedict_attach(sd, src, release_dict, r->err)) != KS_OK) st = nomem(r->err);
  if (!st) {
    L.sd = NULL; /* sd owns it now */
    st = add_extras(r, src, L.extra, sd);
  }
  if (st) {
    ks_statedict_free(sd);
    ks_torch_free(r->a, text);
    ks_torch_free(r->a, doc);
  } else {
    *out = sd;
    if (structure) *structure = text;
    if (info) *info = doc;
  }
  ks__free(r->a, L.keys);
  ks__free(r->a, L.extra);
  ks_statedict_free(L.sd);
  ks_meta_free(L.meta);
  ks_shard_index_free(L.idx);
  return st;
}
