/*
 * Writer of torch.save-compatible files. The '/'-joined names of a state dict
 * are rebuilt into nested containers (str-keyed dicts, or what a structure
 * document records: lists, tuples, sets, typed keys, empty containers) and
 * pickled (protocol 2) with only the opcodes and globals torch's weights_only
 * loader accepts; tensors reference storages stored as zip entries data/<n>.
 */
#include <stdio.h>
#include <stdlib.h>

#include "core/json.h"
#include "torch/torch_internal.h"

/* Items per MARK, as pickle itself batches: the reader's stack stays shallow. */
#define BATCH 1000

typedef struct wnode {
  const char *name; /* escaped component; points into an entry name or the structure */
  size_t nlen;
  long entry;         /* index in the dict, or -1 for a folder */
  const ks__jv *spec; /* the structure's record of this folder, or NULL */
  struct wnode **kids;
  size_t n, cap;
} wnode;

typedef struct wstorage {
  const ks_tensor *t; /* NULL for a float scalar */
  double f;
  ks_dtype dtype;     /* dtype written (after widening) */
} wstorage;

typedef struct writer {
  const ks_allocator *a;
  const ks_statedict *sd;
  ks_error *err;
  int compat;         /* KS_TORCH_COMPAT_1_13 or 0 */
  ks__jv *structure;  /* parsed opts->structure, or NULL */
  const ks__jv *containers;
  uint8_t *p;         /* the pickle */
  size_t n, cap;
  int oom;
  wstorage *st;
  size_t nst, capst;
  wnode **slots;      /* open-addressing table of every node by (parent, component) */
  size_t nslots, used;
  /* Sequence items that no entry or record backs (written as None), left for the whole file:
   * one budget for all lists, so the pickle stays linear in the input however many lists
   * the structure document records. */
  size_t holes_left;
} writer;

static KS_NODISCARD ks_status nomem(writer *wr) { return ks__err(wr->err, KS_E_NOMEM, "torch: out of memory"); }

/* ---- name tree ---- */

static void tree_free(const ks_allocator *a, wnode *w) {
  if (!w) return;
  for (size_t i = 0; i < w->n; i++) tree_free(a, w->kids[i]);
  ks__free(a, w->kids);
  ks__free(a, w);
}

static uint64_t slot_hash(const wnode *parent, const char *name, size_t nlen) {
  uint64_t h = 1469598103934665603ull ^ (uint64_t)(uintptr_t)parent;
  for (size_t i = 0; i < nlen; i++) h = (h ^ (uint8_t)name[i]) * 1099511628211ull;
  return h ^ (h >> 29);
}

typedef struct wslot_key {
  const wnode *parent;
  const char *name;
  size_t nlen;
} wslot_key;

/* Nodes carry no parent pointer, so the table stores (parent, node) pairs side by side. */
static size_t find_slot(const writer *wr, const wslot_key *k) {
  size_t mask = wr->nslots - 1, i = (size_t)slot_hash(k->parent, k->name, k->nlen) & mask & ~(size_t)1;
  for (;; i = (i + 2) & mask) {
    const wnode *w = wr->slots[i + 1];
    if (!w || (wr->slots[i] == k->parent && w->nlen == k->nlen && !memcmp(w->name, k->name, k->nlen))) return i;
  }
}

static bool grow_slots(writer *wr) {
  size_t n = wr->nslots ? wr->nslots * 2 : 256, bytes;
  if (!ks__mul_size(n, sizeof(wnode *), &bytes)) return false;
  wnode **old = wr->slots, **nw = ks__calloc(wr->a, n, sizeof(wnode *));
  if (!nw) return false;
  size_t oldn = wr->nslots;
  wr->slots = nw;
  wr->nslots = n;
  for (size_t i = 0; i < oldn; i += 2)
    if (old[i + 1]) {
      wslot_key k = {old[i], old[i + 1]->name, old[i + 1]->nlen};
      size_t j = find_slot(wr, &k);
      wr->slots[j] = old[i], wr->slots[j + 1] = old[i + 1];
    }
  ks__free(wr->a, old);
  return true;
}

/* The child of parent named name[0..nlen), created when asked; a hash lookup, so that a dict of
   n entries costs O(n), not O(n^2). */
static wnode *child(writer *wr, wnode *parent, const char *name, size_t nlen, int create) {
  if ((wr->used + 1) * 4 > wr->nslots && !grow_slots(wr)) return NULL; /* two slots per node, half full */
  wslot_key k = {parent, name, nlen};
  size_t at = find_slot(wr, &k);
  if (wr->slots[at + 1] || !create) return wr->slots[at + 1];
  if (parent->n == parent->cap) {
    size_t ncap = parent->cap ? parent->cap * 2 : 4;
    wnode **kids = ks__realloc(wr->a, parent->kids, ncap * sizeof *kids);
    if (!kids) return NULL;
    parent->kids = kids;
    parent->cap = ncap;
  }
  wnode *w = ks__calloc(wr->a, 1, sizeof *w);
  if (!w) return NULL;
  w->name = name;
  w->nlen = nlen;
  w->entry = -1;
  parent->kids[parent->n++] = w;
  wr->slots[at] = parent;
  wr->slots[at + 1] = w;
  wr->used++;
  return w;
}

/* What the reader will call this component when it reads the file back. */
static size_t reread_len(const writer *wr, const char *s, size_t n) {
  return wr->structure ? ks__key_reread_len(s, n) : ks__key_escaped_len(s, n);
}

/* The file must never hold what ks_torch_load refuses by default. */
static KS_NODISCARD ks_status reader_limits(writer *wr, const char *name, size_t depth, size_t len) {
  if (depth > KS__TORCH_MAX_DEPTH) {
    depth = 1;
    for (const char *c = name; *c; c++) depth += *c == '/';
  }
  if (depth > KS__TORCH_MAX_DEPTH)
    return ks__err_at(wr->err, KS_E_LIMIT, NULL, name, -1,
                      "torch: '%.60s...' nests %zu levels; a torch file keepsake reads nests at most %d", name, depth,
                      KS__TORCH_MAX_DEPTH);
  if (len > KS_MAX_NAME)
    return ks__err_at(wr->err, KS_E_LIMIT, NULL, name, -1,
                      "torch: '%.60s...' would be read back as a name longer than %d bytes", name, KS_MAX_NAME);
  return KS_OK;
}

/* Inserts a value (idx >= 0) or a folder (idx < 0) at name; "" is the root folder. */
static KS_NODISCARD ks_status insert(writer *wr, wnode *root, const char *name, long idx, const ks__jv *spec) {
  wnode *cur = root;
  size_t depth = 0, len = 0;
  for (const char *s = name; *name;) {
    const char *slash = strchr(s, '/');
    size_t n = slash ? (size_t)(slash - s) : strlen(s);
    len += (depth ? 1 : 0) + reread_len(wr, s, n);
    ks_status st = reader_limits(wr, name, ++depth, len);
    if (st) return st;
    wnode *w = child(wr, cur, s, n, 1);
    if (!w) return nomem(wr);
    if ((slash || idx < 0) && w->entry >= 0)
      return ks__err_at(wr->err, KS_E_INVALID, NULL, name, -1, "torch: '%.*s' is both a value and a folder",
                        (int)(s + n - name), name);
    if (!slash && idx >= 0 && (w->entry >= 0 || w->n || w->spec))
      return ks__err_at(wr->err, KS_E_INVALID, NULL, name, -1, "torch: '%s' is both a value and a folder", name);
    cur = w;
    if (!slash) break;
    s = slash + 1;
  }
  if (idx >= 0) cur->entry = idx;
  else cur->spec = spec;
  return KS_OK;
}

/* ---- pickle bytes ---- */

static void put(writer *wr, const void *p, size_t n) {
  if (wr->oom) return;
  size_t need;
  if (!ks__add_size(wr->n, n, &need) || ks__grow(wr->a, &wr->p, &wr->cap, need, 1)) {
    wr->oom = 1;
    return;
  }
  memcpy(wr->p + wr->n, p, n);
  wr->n += n;
}

static void op(writer *wr, uint8_t o) { put(wr, &o, 1); }

static void put_int(writer *wr, int64_t v) {
  uint8_t b[9];
  if (v >= 0 && v < 256) {
    b[0] = 'K', b[1] = (uint8_t)v;
    put(wr, b, 2);
  } else if (v >= 0 && v < 65536) {
    b[0] = 'M', ks__put_le16(b + 1, (uint16_t)v);
    put(wr, b, 3);
  } else if (v >= INT32_MIN && v <= INT32_MAX) {
    b[0] = 'J', ks__put_le32(b + 1, (uint32_t)(int32_t)v);
    put(wr, b, 5);
  } else {
    b[0] = 0x8a, b[1] = 8; /* LONG1, 8-byte two's complement */
    put(wr, b, 2);
    ks__put_le64(b, (uint64_t)v);
    put(wr, b, 8);
  }
}

static void put_binfloat(writer *wr, double f) {
  uint8_t b[9] = {'G'};
  uint64_t u;
  memcpy(&u, &f, sizeof u);
  for (int i = 0; i < 8; i++) b[1 + i] = (uint8_t)(u >> (56 - 8 * i)); /* big-endian */
  put(wr, b, 9);
}

static void put_str(writer *wr, const char *s, size_t n) {
  uint8_t b[5] = {'X'};
  ks__put_le32(b + 1, (uint32_t)n);
  put(wr, b, 5);
  put(wr, s, n);
}

static void put_global(writer *wr, const char *module_nl_name) {
  op(wr, 'c');
  put(wr, module_nl_name, strlen(module_nl_name));
}

static void put_dims(writer *wr, int rank, const int64_t *d) {
  if (rank > 3) op(wr, '(');
  for (int i = 0; i < rank; i++) put_int(wr, d[i]);
  op(wr, rank == 0 ? ')' : rank == 1 ? 0x85 : rank == 2 ? 0x86 : rank == 3 ? 0x87 : 't');
}

/* ---- values ---- */

static KS_NODISCARD ks_status storage_dtype(writer *wr, const char *name, ks_dtype dt, ks_dtype *out) {
  *out = dt;
  if (!strcmp(ks__pk_torch_dtype_name(dt), "?")) /* C64, F8_*FNUZ: no torch.save mapping (yet) */
    return ks__err_at(wr->err, KS_E_DTYPE, NULL, name, -1, "torch: %s tensors are not exported to torch.save files",
                      ks_dtype_name(dt));
  if (wr->compat != KS_TORCH_COMPAT_1_13) return KS_OK;
  switch (dt) {
    case KS_U16: *out = KS_I32; return KS_OK;
    case KS_U32:
    case KS_U64: *out = KS_I64; return KS_OK;
    case KS_F8_E4M3:
    case KS_F8_E5M2:
      return ks__err_at(wr->err, KS_E_DTYPE, NULL, name, -1, "torch: %s has no storage type in torch 1.13",
                        ks_dtype_name(dt));
    default: return KS_OK;
  }
}

static KS_NODISCARD ks_status add_storage(writer *wr, const ks_tensor *t, double f, ks_dtype dt) {
  if (ks__grow(wr->a, &wr->st, &wr->capst, wr->nst + 1, sizeof *wr->st))
    return ks__err(wr->err, KS_E_NOMEM, "torch: out of memory");
  wr->st[wr->nst++] = (wstorage){t, f, dt};
  return KS_OK;
}

static KS_NODISCARD ks_status put_tensor(writer *wr, const char *name, const ks_tensor *t, double f) {
  ks_dtype dt = KS_F64;
  int rank = t ? t->rank : 0;
  const int64_t *shape = t ? t->shape : NULL;
  int64_t stride[KS_MAX_RANK], s = 1;
  ks_status st = t ? storage_dtype(wr, name, t->dtype, &dt) : KS_OK;
  if (st || (st = add_storage(wr, t, f, dt))) return st;
  for (int i = rank - 1; i >= 0; i--) stride[i] = s, s *= shape[i] ? shape[i] : 1;
  const char *typed = ks__pk_storage_name(dt); /* NULL: a dtype only an UntypedStorage carries */
  char key[24], cls[64], dtype_global[64];
  int klen = snprintf(key, sizeof key, "%zu", wr->nst - 1);
  if (typed) snprintf(cls, sizeof cls, "torch\n%s\n", typed);
  else snprintf(cls, sizeof cls, "torch.storage\nUntypedStorage\n");
  snprintf(dtype_global, sizeof dtype_global, "torch\n%s\n", ks__pk_torch_dtype_name(dt));
  uint64_t numel = t ? ks_tensor_numel(t) : 1;
  put_global(wr, typed ? "torch._utils\n_rebuild_tensor_v2\n" : "torch._utils\n_rebuild_tensor_v3\n");
  op(wr, '(');
  op(wr, '(');
  put_str(wr, "storage", 7);
  put_global(wr, cls);
  put_str(wr, key, (size_t)klen);
  put_str(wr, "cpu", 3);
  put_int(wr, (int64_t)(typed ? numel : numel * ks_dtype_size(dt))); /* untyped storages count bytes */
  op(wr, 't');
  op(wr, 'Q');
  put_int(wr, 0);
  put_dims(wr, rank, shape);
  put_dims(wr, rank, stride);
  op(wr, 0x89);
  put_global(wr, "collections\nOrderedDict\n");
  op(wr, ')');
  op(wr, 'R');
  if (!typed) put_global(wr, dtype_global);
  op(wr, 't');
  op(wr, 'R');
  return KS_OK;
}

static KS_NODISCARD ks_status put_leaf(writer *wr, long idx) {
  ks_entry e;
  if (ks_statedict_at(wr->sd, (size_t)idx, &e)) return ks__err(wr->err, KS_E_NOTFOUND, "torch: entry %ld is gone", idx);
  switch (e.kind) {
    case KS_VAL_TENSOR: return put_tensor(wr, e.name, ks_statedict_tensor(wr->sd, e.name), 0);
    case KS_VAL_FLOAT:
      if (wr->compat == KS_TORCH_COMPAT_1_13) return put_tensor(wr, e.name, NULL, e.f); /* 1.13 lacks BINFLOAT */
      put_binfloat(wr, e.f);
      return KS_OK;
    case KS_VAL_INT: put_int(wr, e.i); return KS_OK;
    case KS_VAL_BOOL: op(wr, e.i ? 0x88 : 0x89); return KS_OK;
    case KS_VAL_NULL: op(wr, 'N'); return KS_OK;
    case KS_VAL_STRING:
      if (!ks__utf8_valid((const uint8_t *)e.s, strlen(e.s)))
        return ks__err_at(wr->err, KS_E_INVALID, NULL, e.name, -1, "torch: string is not valid UTF-8");
      if (strlen(e.s) > UINT32_MAX) return ks__err_at(wr->err, KS_E_LIMIT, NULL, e.name, -1, "torch: string too long");
      put_str(wr, e.s, strlen(e.s));
      return KS_OK;
  }
  return KS_OK;
}

static KS_NODISCARD ks_status put_node(writer *wr, const wnode *w);

/* A str key: the component itself, unescaped when the names come from a torch import. */
static void put_key(writer *wr, const wnode *w, const ks__jv *keys) {
  char comp[KS_MAX_NAME + 1];
  size_t n = w->nlen < KS_MAX_NAME ? w->nlen : KS_MAX_NAME;
  memcpy(comp, w->name, n);
  comp[n] = 0;
  const ks__jv *k = keys ? ks__jv_get(keys, comp) : NULL;
  if (ks__jv_is(k, KS__JV_INT)) put_int(wr, k->i);
  else if (ks__jv_is(k, KS__JV_BOOL)) op(wr, k->b ? 0x88 : 0x89);
  else if (ks__jv_is(k, KS__JV_NULL)) op(wr, 'N');
  else if (ks__jv_is(k, KS__JV_REAL) && wr->compat != KS_TORCH_COMPAT_1_13) put_binfloat(wr, k->d);
  else if (wr->structure) {
    char raw[KS_MAX_NAME + 1];
    put_str(wr, raw, ks__key_unescape(comp, n, raw));
  } else {
    put_str(wr, w->name, w->nlen);
  }
}

static KS_NODISCARD ks_status put_dict(writer *wr, const wnode *w) {
  const ks__jv *keys = w->spec ? ks__jv_get(w->spec, "keys") : NULL;
  op(wr, '}');
  for (size_t i = 0; i < w->n; i++) {
    if (i % BATCH == 0) op(wr, '(');
    put_key(wr, w->kids[i], keys);
    ks_status st = put_node(wr, w->kids[i]);
    if (st) return st;
    if (i % BATCH == BATCH - 1 || i + 1 == w->n) op(wr, 'u');
  }
  return KS_OK;
}

/* Items of a list, tuple or set folder by index; indices it lacks (ignored entries) are None. */
static KS_NODISCARD ks_status seq_items(writer *wr, const wnode *w, const char *kind, wnode ***out, size_t *len) {
  int64_t rec_len = 0;
  size_t n = ks__jv_is_int(ks__jv_get(w->spec, "len"), &rec_len) && rec_len >= 0 ? (size_t)rec_len : 0;
  /* Every item is an entry, a recorded container, or a value that flattened to nothing. */
  if (n > ks_statedict_count(wr->sd) + (wr->containers ? wr->containers->len : 0) + ((size_t)1 << 16))
    return ks__err_at(wr->err, KS_E_INVALID, NULL, w->name, -1, "torch: structure gives a %s of %zu items", kind, n);
  for (size_t i = 0; i < w->n; i++) { /* items must be named 0..len-1 */
    char *end;
    char comp[24];
    size_t cl = w->kids[i]->nlen < sizeof comp - 1 ? w->kids[i]->nlen : sizeof comp - 1;
    memcpy(comp, w->kids[i]->name, cl);
    comp[cl] = 0;
    unsigned long long ix = strtoull(comp, &end, 10);
    if (!cl || *end || cl != w->kids[i]->nlen || (comp[0] == '0' && cl > 1) || comp[0] == '-' || ix >= (1ull << 40))
      return ks__err_at(wr->err, KS_E_INVALID, NULL, w->name, -1,
                        "torch: '%.*s' is a %s but holds '%.*s', not an index", (int)w->nlen, w->name, kind,
                        (int)w->kids[i]->nlen, w->kids[i]->name);
    if ((size_t)ix >= n) n = (size_t)ix + 1;
  }
  if (n - w->n > wr->holes_left)
    return ks__err_at(wr->err, KS_E_LIMIT, NULL, w->name, -1,
                      "torch: the structure's lists hold more empty items than the file's %zu entries and %zu records "
                      "allow (%zu left, '%.*s' asks for %zu)",
                      ks_statedict_count(wr->sd), wr->containers ? wr->containers->len : 0, wr->holes_left,
                      (int)(w->nlen > 200 ? 200 : w->nlen), w->name, n - w->n);
  wr->holes_left -= n - w->n;
  wnode **items = ks__calloc(wr->a, n ? n : 1, sizeof *items);
  if (!items) return nomem(wr);
  for (size_t i = 0; i < w->n; i++) items[strtoull(w->kids[i]->name, NULL, 10)] = w->kids[i];
  *out = items;
  *len = n;
  return KS_OK;
}

static KS_NODISCARD ks_status put_seq(writer *wr, const wnode *w, const char *kind) {
  wnode **items = NULL;
  size_t n = 0;
  ks_status st = seq_items(wr, w, kind, &items, &n);
  if (st) return st;
  int tuple = !strcmp(kind, "tuple"), set = !strcmp(kind, "set") && wr->compat != KS_TORCH_COMPAT_1_13;
  if (set) put_global(wr, "builtins\nset\n"), op(wr, '(');
  if (tuple) op(wr, '(');
  else op(wr, ']');
  for (size_t i = 0; !st && i < n; i++) {
    if (!tuple && i % BATCH == 0) op(wr, '(');
    if (items[i]) st = put_node(wr, items[i]);
    else op(wr, 'N');
    if (!tuple && (i % BATCH == BATCH - 1 || i + 1 == n)) op(wr, 'e');
  }
  if (tuple) op(wr, 't');
  if (set) op(wr, 't'), op(wr, 'R');
  ks__free(wr->a, items);
  return st;
}

static KS_NODISCARD ks_status put_node(writer *wr, const wnode *w) {
  if (w->entry >= 0) return put_leaf(wr, w->entry);
  const char *kind = w->spec ? ks__jv_string(ks__jv_get(w->spec, "kind")) : NULL;
  if (kind && !strcmp(kind, "value") && w->n == 1 && w->kids[0]->entry >= 0 && w->kids[0]->nlen == 5 &&
      !memcmp(w->kids[0]->name, "value", 5))
    return put_leaf(wr, w->kids[0]->entry); /* torch.save(tensor): the file is the value itself */
  if (kind && (!strcmp(kind, "list") || !strcmp(kind, "tuple") || !strcmp(kind, "set"))) return put_seq(wr, w, kind);
  return put_dict(wr, w);
}

/* Folders the structure document records; those without entries (empty containers) are created. */
static KS_NODISCARD ks_status insert_structure(writer *wr, wnode *root) {
  for (size_t i = 0; wr->containers && i < wr->containers->len; i++) {
    const char *path = wr->containers->keys[i];
    const ks__jv *spec = wr->containers->items[i];
    if (!ks__jv_is(spec, KS__JV_OBJECT))
      return ks__err_at(wr->err, KS_E_INVALID, NULL, path, -1, "torch: structure record is not an object");
    ks_status st = insert(wr, root, path, -1, spec);
    if (st) return st;
  }
  return KS_OK;
}

static KS_NODISCARD ks_status parse_structure(writer *wr, const char *text) {
  if (!text) return KS_OK;
  ks_error jerr;
  ks_status s = ks__jv_parse(wr->a, text, strlen(text), "structure", &wr->structure, &jerr);
  if (s == KS_E_NOMEM) return nomem(wr);
  int64_t v = 0;
  wr->containers = ks__jv_get(wr->structure, "containers");
  if (s || !ks__jv_is_int(ks__jv_get(wr->structure, "version"), &v) || v != 1 ||
      !ks__jv_is(wr->containers, KS__JV_OBJECT))
    return ks__err(wr->err, KS_E_INVALID, "torch: structure document is not {\"version\": 1, \"containers\": {...}}");
  return KS_OK;
}

static KS_NODISCARD ks_status build_pickle(writer *wr) {
  wnode *root = ks__calloc(wr->a, 1, sizeof *root);
  if (!root) return nomem(wr);
  root->entry = -1;
  ks_status st = KS_OK;
  ks_entry e;
  for (size_t i = 0; !st && ks_statedict_at(wr->sd, i, &e) == KS_OK; i++) st = insert(wr, root, e.name, (long)i, NULL);
  if (!st && wr->containers) st = insert_structure(wr, root);
  wr->holes_left = ks_statedict_count(wr->sd) + (wr->containers ? wr->containers->len : 0) + ((size_t)1 << 16);
  if (!st) {
    op(wr, 0x80);
    op(wr, 2);
    st = put_node(wr, root);
    op(wr, '.');
  }
  tree_free(wr->a, root);
  if (!st && wr->oom) st = nomem(wr);
  return st;
}

/* ---- archive ---- */

/* Storage bytes as torch expects them, widening U16/U32/U64 (U64 must fit in I64). */
static KS_NODISCARD ks_status storage_bytes(writer *wr, const wstorage *s, const void **data, size_t *n, void **owned) {
  *owned = NULL;
  if (!s->t) {
    *data = &s->f;
    *n = sizeof s->f;
    return KS_OK;
  }
  *data = s->t->data;
  *n = s->t->nbytes;
  if (s->dtype == s->t->dtype) return KS_OK;
  uint64_t numel = ks_tensor_numel(s->t);
  size_t bytes;
  if (!ks__mul_size((size_t)numel, ks_dtype_size(s->dtype), &bytes))
    return ks__err(wr->err, KS_E_LIMIT, "torch: tensor too large");
  for (uint64_t i = 0; s->t->dtype == KS_U64 && i < numel; i++)
    if (((const uint64_t *)s->t->data)[i] > (uint64_t)INT64_MAX)
      return ks__err(wr->err, KS_E_DTYPE, "torch: U64 value does not fit in torch's int64");
  if (!(*owned = ks__malloc(wr->a, bytes ? bytes : 1))) return nomem(wr);
  if (ks_dtype_convert(s->dtype, *owned, s->t->dtype, s->t->data, (size_t)numel))
    return ks__err(wr->err, KS_E_DTYPE, "torch: cannot convert %s to %s", ks_dtype_name(s->t->dtype),
                   ks_dtype_name(s->dtype));
  *data = *owned;
  *n = bytes;
  return KS_OK;
}

static KS_NODISCARD ks_status add_record(writer *wr, ks__zw *z, const char *root, const char *rel, const void *p,
                                         size_t n) {
  char name[512];
  int w = snprintf(name, sizeof name, "%s/%s", root, rel);
  if (w < 0 || (size_t)w >= sizeof name)
    return ks__err_at(wr->err, KS_E_LIMIT, NULL, rel, -1, "torch: archive entry '%s/%s' is longer than %zu bytes", root,
                      rel, sizeof name - 1);
  return ks__zw_add(z, name, p, n, wr->err);
}

static KS_NODISCARD ks_status write_archive(writer *wr, const char *root, ks__zw *z) {
  ks_status st = add_record(wr, z, root, "data.pkl", wr->p, wr->n);
  if (!st) st = add_record(wr, z, root, ".format_version", "1", 1);
  if (!st) st = add_record(wr, z, root, ".storage_alignment", "64", 2);
  if (!st) st = add_record(wr, z, root, "byteorder", "little", 6);
  for (size_t i = 0; i < wr->nst && !st; i++) {
    const void *data;
    size_t n;
    void *owned;
    char rel[32];
    if ((st = storage_bytes(wr, &wr->st[i], &data, &n, &owned))) return st;
    snprintf(rel, sizeof rel, "data/%zu", i);
    st = add_record(wr, z, root, rel, data, n);
    ks__free(wr->a, owned);
  }
  if (!st) st = add_record(wr, z, root, "version", "3\n", 2);
  return st ? st : ks__zw_finish(z, wr->err);
}

ks_status ks__pt_write(const ks_statedict *sd, const ks_torch_write_opts *opts, int force_zip64, ks__zw_write_fn fn,
                       void *ctx, ks_error *err) {
  const char *root = opts && opts->root ? opts->root : "archive";
  if (!*root || strlen(root) > 200 || strchr(root, '/'))
    return ks__err(err, KS_E_INVALID, "torch: bad archive folder name");
  writer wr = {0};
  wr.a = ks__alloc_or_default(opts ? opts->alloc : NULL);
  wr.sd = sd;
  wr.err = err;
  wr.compat = opts ? opts->torch_compat : 0;
  ks__zw *z = NULL;
  ks_status st = parse_structure(&wr, opts ? opts->structure : NULL);
  if (!st) st = build_pickle(&wr);
  if (!st && ks__zw_create(wr.a, fn, ctx, force_zip64, &z)) st = nomem(&wr);
  if (!st) st = write_archive(&wr, root, z);
  ks__zw_free(z);
  ks__jv_free(wr.a, wr.structure);
  ks__free(wr.a, wr.slots);
  ks__free(wr.a, wr.p);
  ks__free(wr.a, wr.st);
  return st;
}
