/*
 * The `.metadata` of a torch.distributed.checkpoint directory: a plain pickle of
 * torch.distributed.checkpoint.metadata.Metadata (dataclasses rebuilt by NEWOBJ
 * + BUILD, torch.Size, dtypes and layouts named by GLOBAL). It runs on the
 * non-executing pickle machine like any torch file, and is then held to a
 * stricter rule: every global it names must be one DCP's metadata is made of
 * (the list below), so a `.metadata` that asks for anything else (os.system,
 * builtins.exec, ...) is refused as a whole, with nothing run. The node tree is
 * then read into entries, chunks and storage items, every number checked.
 */
#include <stdio.h>
#include <stdlib.h>

#include "torch/dcp_internal.h"

static KS_NODISCARD ks_status bad(ks_error *err, const char *key, const char *msg) {
  return ks__err_at(err, KS_E_FORMAT, NULL, key, -1, "dcp: %s", msg);
}

static KS_NODISCARD ks_status nomem(ks_error *err) { return ks__err(err, KS_E_NOMEM, "dcp: out of memory"); }

/* ---- the globals a DCP `.metadata` may name: described, never imported or called ---- */

static const char *const meta_modules[] = {
    "torch.distributed.checkpoint.metadata", "torch.distributed._shard.checkpoint.metadata",
    "torch.distributed.checkpoint.filesystem", "torch.distributed._shard.checkpoint.filesystem"};

static const char *const meta_classes[] = {
    "Metadata",      "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata", "TensorProperties",
    "MetadataIndex", "StorageMeta",           "_MEM_FORMAT_ENCODING", "_StorageInfo",         "_StoragePrefix"};

/* torch.<name>: Size, dtypes (also those keepsake has none for: refused later by name), layouts, memory formats. */
static const char *const torch_names[] = {
    "Size", "float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool", "uint16",
    "uint32", "uint64", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
    "float4_e2m1fn_x2", "complex32", "complex64", "complex128", "qint8", "quint8", "qint32", "quint4x2", "quint2x4",
    "strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc", "_mkldnn", "jagged",
    "contiguous_format", "channels_last", "channels_last_3d", "preserve_format"};

static const char *const path_classes[] = {"PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath", "Path"};

static int in_list(const char *s, const char *const *list, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!strcmp(s, list[i])) return 1;
  return 0;
}

#define IN(s, list) in_list((s), (list), sizeof(list) / sizeof *(list))

static int allowed_global(const char *m, const char *n) {
  if (IN(m, meta_modules)) return IN(n, meta_classes);
  if (!strcmp(m, "torch")) return IN(n, torch_names);
  if (!strcmp(m, "torch.serialization")) return !strcmp(n, "_get_layout");
  if (!strcmp(m, "pathlib") || !strcmp(m, "pathlib._local")) return IN(n, path_classes);
  if (!strcmp(m, "collections")) return !strcmp(n, "OrderedDict");
  return 0;
}

static bool refused_global(const ks__pk_node *n) {
  return n->kind == PK_GLOBAL && !allowed_global(n->u.g.module, n->u.g.name);
}

/* Every GLOBAL the program made (each one is a node of the arena, reachable or not); the first is named. */
static KS_NODISCARD ks_status check_globals(const ks__pk_arena *ar, ks_error *err) {
  const ks__pk_node *first = ks__pk_find_node(ar, refused_global);
  if (first)
    return ks__err(err, KS_E_UNSAFE,
                   "dcp: .metadata names %.200s.%.200s, which is not part of DCP metadata: refused (nothing was "
                   "imported or run)",
                   first->u.g.module, first->u.g.name);
  return KS_OK;
}

/* ---- reading the dataclasses ---- */

static int is_class(const ks__pk_node *o, const char *name) {
  if (!o || o->kind != PK_OBJECT || !o->u.obj->cls || o->u.obj->cls->kind != PK_GLOBAL) return 0;
  const ks__pk_node *g = o->u.obj->cls;
  return IN(g->u.g.module, meta_modules) && !strcmp(g->u.g.name, name);
}

/* Attributes of a DCP dataclass: a handful. A larger dict is not one, and refusing it keeps every look-up cheap
   (one object can be shared by every entry of the pickle). */
#define MAX_ATTRS 16

static const ks__pk_node *dict_get(const ks__pk_node *d, const char *key) {
  if (!d || d->kind != PK_DICT || d->u.seq.n > 2 * MAX_ATTRS) return NULL;
  for (size_t i = 0; i + 1 < d->u.seq.n; i += 2) {
    const ks__pk_node *k = d->u.seq.v[i];
    if (k->kind == PK_STR && !strcmp(k->u.s.p, key)) return d->u.seq.v[i + 1];
  }
  return NULL;
}

/* An attribute from the BUILD state: a dict, or (dict, slots) for dataclasses with __slots__. */
static const ks__pk_node *field(const ks__pk_node *o, const char *name) {
  const ks__pk_node *s = o && o->kind == PK_OBJECT ? o->u.obj->state : NULL;
  if (!s) return NULL;
  if (s->kind == PK_DICT) return dict_get(s, name);
  if (s->kind != PK_TUPLE) return NULL;
  for (size_t i = 0; i < s->u.seq.n; i++) {
    const ks__pk_node *v = dict_get(s->u.seq.v[i], name);
    if (v) return v;
  }
  return NULL;
}

static int is_none(const ks__pk_node *n) { return !n || n->kind == PK_NONE; }

/* A torch.Size (the machine turns torch.Size(t) into t) or a tuple/list of ints >= 0. */
static KS_NODISCARD ks_status read_dims(const ks__pk_node *n, const char *key, const char *what, int64_t *dims,
                                        int *rank, ks_error *err) {
  if (!n || (n->kind != PK_TUPLE && n->kind != PK_LIST))
    return ks__err_at(err, KS_E_FORMAT, NULL, key, -1, "dcp: %s is not a torch.Size", what);
  if (n->u.seq.n > KS_MAX_RANK)
    return ks__err_at(err, KS_E_LIMIT, NULL, key, -1, "dcp: %s has %zu dimensions, more than %d", what, n->u.seq.n,
                      KS_MAX_RANK);
  for (size_t i = 0; i < n->u.seq.n; i++) {
    const ks__pk_node *v = n->u.seq.v[i];
    if (v->kind != PK_INT || v->u.i < 0)
      return ks__err_at(err, KS_E_FORMAT, NULL, key, -1, "dcp: %s holds something else than ints >= 0", what);
    dims[i] = v->u.i;
  }
  *rank = (int)n->u.seq.n;
  return KS_OK;
}

static KS_NODISCARD ks_status read_dtype(const ks__pk_node *props, const char *key, ks_dtype *dt, ks_error *err) {
  if (!is_class(props, "TensorProperties")) return bad(err, key, "properties is not a TensorProperties");
  const ks__pk_node *s = props->u.obj->state, *g = NULL;
  if (s && s->kind == PK_TUPLE && s->u.seq.n) g = s->u.seq.v[0]; /* __getstate__: (dtype, layout, ...) */
  else g = field(props, "dtype");                                   /* older torch: the attribute dict */
  if (!g || g->kind != PK_GLOBAL || strcmp(g->u.g.module, "torch"))
    return bad(err, key, "TensorProperties names no torch dtype");
  for (int i = 0; i < KS_DTYPE_COUNT; i++)
    if (!strcmp(ks__pk_torch_dtype_name((ks_dtype)i), g->u.g.name)) {
      *dt = (ks_dtype)i;
      return KS_OK;
    }
  return ks__err_at(err, KS_E_DTYPE, NULL, key, -1, "dcp: tensor of dtype torch.%.100s: keepsake has no such dtype",
                    g->u.g.name);
}

static KS_NODISCARD ks_status str_of(const ks__pk_node *n, const char *key, const char *what, const char **out,
                                     ks_error *err) {
  if (!n || n->kind != PK_STR || strlen(n->u.s.p) != n->u.s.n)
    return ks__err_at(err, KS_E_FORMAT, NULL, key, -1, "dcp: %s is not a string", what);
  *out = n->u.s.p;
  return KS_OK;
}

/* ---- entries (state_dict_metadata) ---- */

static KS_NODISCARD ks_status read_chunk(const ks__pk_node *c, ks__dcp_entry *e, ks__dcp_chunk *k, ks_error *err) {
  int r1 = 0, r2 = 0;
  if (!is_class(c, "ChunkStorageMetadata")) return bad(err, e->fqn, "chunk is not a ChunkStorageMetadata");
  ks_status st = read_dims(field(c, "offsets"), e->fqn, "chunk offsets", k->off, &r1, err);
  if (!st) st = read_dims(field(c, "sizes"), e->fqn, "chunk sizes", k->size, &r2, err);
  if (st) return st;
  if (r1 != e->rank || r2 != e->rank)
    return ks__err_at(err, KS_E_FORMAT, NULL, e->fqn, -1, "dcp: a chunk of rank %d/%d in a tensor of rank %d", r1, r2,
                      e->rank);
  for (int i = 0; i < e->rank; i++)
    if (k->size[i] > e->shape[i] || k->off[i] > e->shape[i] - k->size[i])
      return ks__err_at(err, KS_E_FORMAT, NULL, e->fqn, -1,
                        "dcp: chunk at offset %lld of size %lld in dimension %d passes the tensor's %lld",
                        (long long)k->off[i], (long long)k->size[i], i, (long long)e->shape[i]);
  return KS_OK;
}

static KS_NODISCARD ks_status read_tensor(ks__dcp *d, const ks__pk_node *v, ks__dcp_entry *e, ks_error *err) {
  e->tensor = true;
  ks_status st = read_dtype(field(v, "properties"), e->fqn, &e->dtype, err);
  if (!st) st = read_dims(field(v, "size"), e->fqn, "size", e->shape, &e->rank, err);
  if (st) return st;
  const ks__pk_node *chunks = field(v, "chunks");
  if (!chunks || chunks->kind != PK_LIST) return bad(err, e->fqn, "chunks is not a list");
  e->chunk0 = d->nchunks;
  e->nchunks = chunks->u.seq.n;
  uint64_t numel = 0, sum = 0, vol = 0;
  if (!ks__dcp_volume(e->rank, e->shape, &numel))
    return ks__err_at(err, KS_E_LIMIT, NULL, e->fqn, -1, "dcp: tensor size overflows");
  for (size_t i = 0; i < chunks->u.seq.n; i++) {
    ks__dcp_chunk *k = &d->chunks[d->nchunks++];
    if ((st = read_chunk(chunks->u.seq.v[i], e, k, err)) != KS_OK) return st;
    if (!ks__dcp_volume(e->rank, k->size, &vol) || !ks__add_u64(sum, vol, &sum))
      return ks__err_at(err, KS_E_FORMAT, NULL, e->fqn, -1, "dcp: chunk volumes overflow");
  }
  if (sum != numel)
    return ks__err_at(err, KS_E_FORMAT, NULL, e->fqn, -1,
                      "dcp: the chunks hold %llu elements, the tensor %llu: they do not cover it exactly once",
                      (unsigned long long)sum, (unsigned long long)numel);
  return KS_OK;
}

/* Every chunk costs its own pickle bytes, so a list of chunks shared by many entries (references cost 2 bytes
   each) cannot multiply them: at most one chunk per byte of `.metadata`. */
static KS_NODISCARD ks_status read_entries(ks__dcp *d, const ks__pk_node *sdm, size_t pickle_len, ks_error *err) {
  if (!sdm || sdm->kind != PK_DICT) return bad(err, NULL, "state_dict_metadata is not a dict");
  size_t n = sdm->u.seq.n / 2, nchunks = 0, bytes;
  for (size_t i = 0; i < n; i++) {
    const ks__pk_node *c = field(sdm->u.seq.v[2 * i + 1], "chunks");
    if (c && c->kind == PK_LIST && (!ks__add_size(nchunks, c->u.seq.n, &nchunks) || nchunks > pickle_len))
      return ks__err(err, KS_E_LIMIT, "dcp: more chunks than bytes of .metadata (lists of chunks shared)");
  }
  if (!ks__mul_size(n ? n : 1, sizeof *d->entries, &bytes) || !(d->entries = ks__calloc(d->alloc, 1, bytes)))
    return nomem(err);
  if (!ks__mul_size(nchunks ? nchunks : 1, sizeof *d->chunks, &bytes) ||
      !(d->chunks = ks__calloc(d->alloc, 1, bytes)))
    return nomem(err);
  for (size_t i = 0; i < n; i++) {
    const ks__pk_node *k = sdm->u.seq.v[2 * i], *v = sdm->u.seq.v[2 * i + 1];
    ks__dcp_entry *e = &d->entries[d->nentries++];
    ks_status st = str_of(k, NULL, "a state_dict_metadata key", &e->fqn, err);
    if (st) return st;
    if (is_class(v, "TensorStorageMetadata")) st = read_tensor(d, v, e, err);
    else if (!is_class(v, "BytesStorageMetadata"))
      st = bad(err, e->fqn, "the entry is neither TensorStorageMetadata nor BytesStorageMetadata");
    if (st) return st;
  }
  return KS_OK;
}

/* ---- storage items (storage_data) ---- */

/* A name of a file inside the checkpoint directory: no separators, not "." or "..". */
int ks__dcp_plain_file_name(const char *s) {
  size_t n = strlen(s);
  return n > 0 && n <= 255 && !strchr(s, '/') && !strchr(s, '\\') && strcmp(s, ".") && strcmp(s, "..");
}

static KS_NODISCARD ks_status read_item(const ks__pk_node *k, const ks__pk_node *v, ks__dcp_item *it, ks_error *err) {
  if (!is_class(k, "MetadataIndex")) return bad(err, NULL, "a storage_data key is not a MetadataIndex");
  ks_status st = str_of(field(k, "fqn"), NULL, "MetadataIndex.fqn", &it->fqn, err);
  if (st) return st;
  const ks__pk_node *off = field(k, "offset");
  if (!is_none(off)) {
    it->has_off = true;
    if ((st = read_dims(off, it->fqn, "MetadataIndex.offset", it->off, &it->rank, err)) != KS_OK) return st;
  }
  if (!is_class(v, "_StorageInfo")) return bad(err, it->fqn, "a storage_data value is not a _StorageInfo");
  if ((st = str_of(field(v, "relative_path"), it->fqn, "_StorageInfo.relative_path", &it->file, err)) != KS_OK)
    return st;
  if (!ks__dcp_plain_file_name(it->file))
    return ks__err_at(err, KS_E_FORMAT, NULL, it->fqn, -1,
                      "dcp: relative_path '%.200s' is not a file name inside the checkpoint directory", it->file);
  const ks__pk_node *o = field(v, "offset"), *l = field(v, "length"), *t = field(v, "transform_descriptors");
  if (!o || o->kind != PK_INT || o->u.i < 0 || !l || l->kind != PK_INT || l->u.i < 0)
    return bad(err, it->fqn, "_StorageInfo offset or length is not an int >= 0");
  it->offset = (uint64_t)o->u.i;
  it->length = (uint64_t)l->u.i;
  if (!is_none(t) && ((t->kind != PK_LIST && t->kind != PK_TUPLE) || t->u.seq.n))
    return ks__err_at(err, KS_E_UNSUPPORTED, NULL, it->fqn, -1,
                      "dcp: the item is stored through transform extensions (transform_descriptors, e.g. "
                      "compression), which are not read");
  return KS_OK;
}

static int cmp_key(const ks__dcp_item *a, const ks__dcp_item *b) {
  int c = strcmp(a->fqn, b->fqn);
  if (c) return c;
  if (a->has_off != b->has_off) return a->has_off ? 1 : -1;
  if (a->rank != b->rank) return a->rank < b->rank ? -1 : 1;
  for (int i = 0; i < a->rank; i++)
    if (a->off[i] != b->off[i]) return a->off[i] < b->off[i] ? -1 : 1;
  return 0;
}

static int cmp_item(const void *a, const void *b) { return cmp_key(a, b); }

static KS_NODISCARD ks_status read_items(ks__dcp *d, const ks__pk_node *sd, ks_error *err) {
  if (!sd || sd->kind != PK_DICT) return bad(err, NULL, "storage_data is not a dict");
  size_t n = sd->u.seq.n / 2, bytes;
  if (!ks__mul_size(n ? n : 1, sizeof *d->items, &bytes) || !(d->items = ks__calloc(d->alloc, 1, bytes)))
    return nomem(err);
  for (size_t i = 0; i < n; i++) {
    ks_status st = read_item(sd->u.seq.v[2 * i], sd->u.seq.v[2 * i + 1], &d->items[i], err);
    if (st) return st;
    d->nitems++;
  }
  qsort(d->items, d->nitems, sizeof *d->items, cmp_item);
  for (size_t i = 0; i + 1 < d->nitems; i++)
    if (!cmp_key(&d->items[i], &d->items[i + 1]))
      return bad(err, d->items[i].fqn, "storage_data holds one chunk twice");
  return KS_OK;
}

/* The item of (fqn, offsets), or of (fqn) for an object; it must serve no one else. */
static KS_NODISCARD ks_status claim(ks__dcp *d, size_t entry, const ks__dcp_chunk *k, size_t *out, ks_error *err) {
  const ks__dcp_entry *e = &d->entries[entry];
  ks__dcp_item key = {0};
  key.fqn = e->fqn;
  key.has_off = k != NULL;
  key.rank = k ? e->rank : 0;
  if (k && e->rank) memcpy(key.off, k->off, (size_t)e->rank * sizeof *key.off);
  ks__dcp_item *it = bsearch(&key, d->items, d->nitems, sizeof *d->items, cmp_item);
  if (!it)
    return bad(err, e->fqn,
               k ? "storage_data has no item for a chunk of this entry" : "storage_data has no item for this entry");
  if (it->used) return bad(err, e->fqn, "a storage item serves two entries");
  it->used = true;
  it->entry = entry;
  *out = (size_t)(it - d->items);
  if (k) it->chunk = (size_t)(k - d->chunks);
  return KS_OK;
}

static KS_NODISCARD ks_status match(ks__dcp *d, ks_error *err) {
  for (size_t i = 0; i < d->nentries; i++) {
    ks__dcp_entry *e = &d->entries[i];
    ks_status st = KS_OK;
    if (!e->tensor) st = claim(d, i, NULL, &e->item, err);
    for (size_t j = 0; !st && e->tensor && j < e->nchunks; j++) {
      ks__dcp_chunk *k = &d->chunks[e->chunk0 + j];
      st = claim(d, i, k, &k->item, err);
    }
    if (st) return st;
  }
  return KS_OK;
}

/* planner_data: {fqn: (path components)}, the nesting of the state dict before DCP flattened it. */
static int cmp_entry_ptr(const void *a, const void *b) {
  return strcmp((*(ks__dcp_entry *const *)a)->fqn, (*(ks__dcp_entry *const *)b)->fqn);
}

ks_status ks__dcp_read_paths(ks__dcp *d, const ks__pk_node *pd, ks_error *err) {
  if (!pd || pd->kind != PK_DICT || !d->nentries) return KS_OK; /* absent: entries are named by fqn */
  size_t bytes;
  ks__dcp_entry **by = ks__mul_size(d->nentries, sizeof *by, &bytes) ? ks__malloc(d->alloc, bytes) : NULL;
  if (!by) return nomem(err);
  for (size_t i = 0; i < d->nentries; i++) by[i] = &d->entries[i];
  qsort(by, d->nentries, sizeof *by, cmp_entry_ptr);
  for (size_t i = 0; i + 1 < pd->u.seq.n; i += 2) {
    const ks__pk_node *k = pd->u.seq.v[i];
    if (k->kind != PK_STR) continue;
    ks__dcp_entry key = {0}, *kp = &key, **hit;
    key.fqn = k->u.s.p;
    if ((hit = bsearch(&kp, by, d->nentries, sizeof *by, cmp_entry_ptr)) != NULL) (*hit)->path = pd->u.seq.v[i + 1];
  }
  ks__free(d->alloc, by);
  return KS_OK;
}

ks_status ks__dcp_parse(const uint8_t *p, size_t n, ks__pk_arena *ar, const ks__pk_limits *lim, ks__dcp *d,
                        ks_error *err) {
  ks__pk_node *root = NULL;
  const ks_allocator *a = d->alloc ? d->alloc : &ar->alloc;
  memset(d, 0, sizeof *d);
  d->alloc = a;
  ks_status st = ks__pk_run(p, n, ar, lim, NULL, NULL, &root, err);
  if (!st) st = check_globals(ar, err);
  if (st) return st;
  if (!is_class(root, "Metadata")) return bad(err, NULL, ".metadata holds no Metadata object");
  const ks__pk_node *ver = field(root, "version");
  if (ver && ver->kind == PK_STR) d->version = ver->u.s.p;
  if (!(st = read_entries(d, field(root, "state_dict_metadata"), n, err)) &&
      !(st = read_items(d, field(root, "storage_data"), err)) && !(st = match(d, err)))
    st = ks__dcp_read_paths(d, field(root, "planner_data"), err);
  return st;
}

void ks__dcp_free(ks__dcp *d) {
  ks__free(d->alloc, d->entries);
  ks__free(d->alloc, d->chunks);
  ks__free(d->alloc, d->items);
  d->entries = NULL;
  d->chunks = NULL;
  d->items = NULL;
}

bool ks__dcp_volume(int rank, const int64_t *size, uint64_t *out) {
  uint64_t n = 1;
  for (int i = 0; i < rank; i++)
    if (size[i] == 0) return (*out = 0), true;
  for (int i = 0; i < rank; i++)
    if (!ks__mul_u64(n, (uint64_t)size[i], &n)) return false;
  *out = n;
  return true;
}

int ks__dcp_for_rows(int rank, const int64_t *shape, const int64_t *off, const int64_t *size, ks__dcp_row_fn fn,
                     void *ctx) {
  uint64_t vol;
  if (!ks__dcp_volume(rank, size, &vol) || vol == 0) return 0;
  if (rank == 0) return fn(ctx, 0, 0, 1);
  int64_t idx[KS_MAX_RANK] = {0};
  uint64_t len = (uint64_t)size[rank - 1], rows = vol / len;
  for (uint64_t r = 0; r < rows; r++) {
    uint64_t start = 0; /* the row's first element in the tensor; in range since the box is inside it */
    for (int i = 0; i < rank; i++)
      start = start * (uint64_t)shape[i] + (uint64_t)(off[i] + (i + 1 < rank ? idx[i] : 0));
    int rc = fn(ctx, start, r, len);
    if (rc) return rc;
    for (int i = rank - 2; i >= 0; i--) {
      if (++idx[i] < size[i]) break;
      idx[i] = 0;
    }
  }
  return 0;
}
