/*
 * Writer of torch.save-compatible files. The '/'-joined names of a state dict
 * are rebuilt into nested dicts and pickled (protocol 2) with only the opcodes
 * and globals torch 1.13's weights_only loader accepts; tensors reference
 * storages stored as zip entries data/<n>.
 */
#include <stdio.h>

#include "torch/torch_internal.h"

typedef struct wnode {
  const char *name; /* points into an entry name */
  size_t nlen;
  long entry; /* index in the dict, or -1 for a folder */
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
  uint8_t *p; /* the pickle */
  size_t n, cap;
  int oom;
  wstorage *st;
  size_t nst, capst;
} writer;

/* ---- name tree ---- */

static void tree_free(const ks_allocator *a, wnode *w) {
  if (!w) return;
  for (size_t i = 0; i < w->n; i++) tree_free(a, w->kids[i]);
  ks__free(a, w->kids);
  ks__free(a, w);
}

static wnode *child(writer *wr, wnode *parent, const char *name, size_t nlen, int create) {
  for (size_t i = parent->n; i-- > 0;) /* newest first: siblings usually arrive together */
    if (parent->kids[i]->nlen == nlen && !memcmp(parent->kids[i]->name, name, nlen)) return parent->kids[i];
  if (!create) return NULL;
  if (ks__grow(wr->a, &parent->kids, &parent->cap, parent->n + 1, sizeof *parent->kids)) return NULL;
  wnode *w = ks__calloc(wr->a, 1, sizeof *w);
  if (!w) return NULL;
  w->name = name;
  w->nlen = nlen;
  w->entry = -1;
  parent->kids[parent->n++] = w;
  return w;
}

static ks_status insert(writer *wr, wnode *root, const char *name, long idx) {
  wnode *cur = root;
  for (const char *s = name;;) {
    const char *slash = strchr(s, '/');
    size_t len = slash ? (size_t)(slash - s) : strlen(s);
    wnode *w = child(wr, cur, s, len, 0);
    if (!w && !(w = child(wr, cur, s, len, 1))) return ks__err(wr->err, KS_E_NOMEM, "torch: out of memory");
    if ((slash && w->entry >= 0) || (!slash && (w->entry >= 0 || w->n)))
      return ks__err_at(wr->err, KS_E_INVALID, NULL, name, -1,
                        "torch: '%.*s' is both a value and a folder", (int)(s + len - name), name);
    if (!slash) {
      w->entry = idx;
      return KS_OK;
    }
    cur = w;
    s = slash + 1;
  }
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

static ks_status storage_dtype(writer *wr, const char *name, ks_dtype dt, ks_dtype *out) {
  switch (dt) {
    case KS_U16: *out = KS_I32; return KS_OK;
    case KS_U32:
    case KS_U64: *out = KS_I64; return KS_OK;
    case KS_F8_E4M3:
    case KS_F8_E5M2:
      return ks__err_at(wr->err, KS_E_DTYPE, NULL, name, -1, "torch: %s has no storage type in torch 1.13", ks_dtype_name(dt));
    default: *out = dt; return KS_OK;
  }
}

static ks_status add_storage(writer *wr, const ks_tensor *t, double f, ks_dtype dt) {
  if (ks__grow(wr->a, &wr->st, &wr->capst, wr->nst + 1, sizeof *wr->st))
    return ks__err(wr->err, KS_E_NOMEM, "torch: out of memory");
  wr->st[wr->nst++] = (wstorage){t, f, dt};
  return KS_OK;
}

static ks_status put_tensor(writer *wr, const char *name, const ks_tensor *t, double f) {
  ks_dtype dt = KS_F64;
  int rank = t ? t->rank : 0;
  const int64_t *shape = t ? t->shape : NULL;
  int64_t stride[KS_MAX_RANK], s = 1;
  ks_status st = t ? storage_dtype(wr, name, t->dtype, &dt) : KS_OK;
  if (st || (st = add_storage(wr, t, f, dt))) return st;
  for (int i = rank - 1; i >= 0; i--) stride[i] = s, s *= shape[i] ? shape[i] : 1;
  char key[24], cls[64];
  int klen = snprintf(key, sizeof key, "%zu", wr->nst - 1);
  snprintf(cls, sizeof cls, "torch\n%s\n", ks__pk_storage_name(dt));
  put_global(wr, "torch._utils\n_rebuild_tensor_v2\n");
  op(wr, '(');
  op(wr, '(');
  put_str(wr, "storage", 7);
  put_global(wr, cls);
  put_str(wr, key, (size_t)klen);
  put_str(wr, "cpu", 3);
  put_int(wr, t ? (int64_t)ks_tensor_numel(t) : 1);
  op(wr, 't');
  op(wr, 'Q');
  put_int(wr, 0);
  put_dims(wr, rank, shape);
  put_dims(wr, rank, stride);
  op(wr, 0x89);
  put_global(wr, "collections\nOrderedDict\n");
  op(wr, ')');
  op(wr, 'R');
  op(wr, 't');
  op(wr, 'R');
  return KS_OK;
}

static ks_status put_leaf(writer *wr, long idx) {
  ks_entry e;
  ks_statedict_at(wr->sd, (size_t)idx, &e);
  switch (e.kind) {
    case KS_VAL_TENSOR: return put_tensor(wr, e.name, ks_statedict_tensor(wr->sd, e.name), 0);
    case KS_VAL_FLOAT: return put_tensor(wr, e.name, NULL, e.f); /* 1.13's safe loader lacks BINFLOAT */
    case KS_VAL_INT: put_int(wr, e.i); return KS_OK;
    case KS_VAL_BOOL: op(wr, e.i ? 0x88 : 0x89); return KS_OK;
    case KS_VAL_NULL: op(wr, 'N'); return KS_OK;
    case KS_VAL_STRING:
      if (!ks__utf8_valid((const uint8_t *)e.s, strlen(e.s)))
        return ks__err_at(wr->err, KS_E_INVALID, NULL, e.name, -1, "torch: string is not valid UTF-8");
      put_str(wr, e.s, strlen(e.s));
      return KS_OK;
  }
  return KS_OK;
}

static ks_status put_dict(writer *wr, const wnode *w) {
  op(wr, '}');
  if (!w->n) return KS_OK;
  op(wr, '(');
  for (size_t i = 0; i < w->n; i++) {
    const wnode *k = w->kids[i];
    put_str(wr, k->name, k->nlen);
    ks_status st = k->entry >= 0 ? put_leaf(wr, k->entry) : put_dict(wr, k);
    if (st) return st;
  }
  op(wr, 'u');
  return KS_OK;
}

static ks_status build_pickle(writer *wr) {
  wnode *root = ks__calloc(wr->a, 1, sizeof *root);
  if (!root) return ks__err(wr->err, KS_E_NOMEM, "torch: out of memory");
  ks_status st = KS_OK;
  ks_entry e;
  for (size_t i = 0; !st && ks_statedict_at(wr->sd, i, &e) == KS_OK; i++) st = insert(wr, root, e.name, (long)i);
  if (!st) {
    op(wr, 0x80);
    op(wr, 2);
    st = put_dict(wr, root);
    op(wr, '.');
  }
  tree_free(wr->a, root);
  if (!st && wr->oom) st = ks__err(wr->err, KS_E_NOMEM, "torch: out of memory");
  return st;
}

/* ---- archive ---- */

/* Storage bytes as torch expects them, widening U16/U32/U64 (U64 must fit in I64). */
static ks_status storage_bytes(writer *wr, const wstorage *s, const void **data, size_t *n, void **owned) {
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
  if (!ks__mul_size((size_t)numel, ks_dtype_size(s->dtype), &bytes)) return ks__err(wr->err, KS_E_LIMIT, "torch: tensor too large");
  for (uint64_t i = 0; s->t->dtype == KS_U64 && i < numel; i++)
    if (((const uint64_t *)s->t->data)[i] > (uint64_t)INT64_MAX)
      return ks__err(wr->err, KS_E_DTYPE, "torch: U64 value does not fit in torch's int64");
  if (!(*owned = ks__malloc(wr->a, bytes ? bytes : 1))) return ks__err(wr->err, KS_E_NOMEM, "torch: out of memory");
  ks_dtype_convert(s->dtype, *owned, s->t->dtype, s->t->data, (size_t)numel);
  *data = *owned;
  *n = bytes;
  return KS_OK;
}

static ks_status write_archive(writer *wr, const char *root, ks__zw *z) {
  char name[512];
  ks_status st = KS_OK;
  snprintf(name, sizeof name, "%s/data.pkl", root);
  if ((st = ks__zw_add(z, name, wr->p, wr->n, wr->err))) return st;
  for (size_t i = 0; i < wr->nst && !st; i++) {
    const void *data;
    size_t n;
    void *owned;
    if ((st = storage_bytes(wr, &wr->st[i], &data, &n, &owned))) return st;
    snprintf(name, sizeof name, "%s/data/%zu", root, i);
    st = ks__zw_add(z, name, data, n, wr->err);
    ks__free(wr->a, owned);
  }
  snprintf(name, sizeof name, "%s/version", root);
  if (!st) st = ks__zw_add(z, name, "3\n", 2, wr->err);
  return st ? st : ks__zw_finish(z, wr->err);
}

ks_status ks__pt_write(const ks_statedict *sd, const ks_torch_write_opts *opts, int force_zip64, ks__zw_write_fn fn,
                       void *ctx, ks_error *err) {
  const char *root = opts && opts->root ? opts->root : "archive";
  if (!*root || strlen(root) > 200 || strchr(root, '/')) return ks__err(err, KS_E_INVALID, "torch: bad archive folder name");
  writer wr = {0};
  wr.a = ks__alloc_or_default(opts ? opts->alloc : NULL);
  wr.sd = sd;
  wr.err = err;
  ks__zw *z = NULL;
  ks_status st = build_pickle(&wr);
  if (!st && ks__zw_create(wr.a, fn, ctx, force_zip64, &z)) st = ks__err(err, KS_E_NOMEM, "torch: out of memory");
  if (!st) st = write_archive(&wr, root, z);
  ks__zw_free(z);
  ks__free(wr.a, wr.p);
  ks__free(wr.a, wr.st);
  return st;
}
