/*
 * Known constructors. A REDUCE/NEWOBJ whose callable is one of the names below
 * is interpreted as data (tensor, storage, dict, set, device string, bytes);
 * anything else becomes an inert PK_OBJECT that records the name and arguments.
 * Nothing is ever imported or called.
 */
#include <stdio.h>

#include "torch/torch_internal.h"

typedef ks_status (*ctor_fn)(ks__pk_arena *ar, const ks__pk_limits *lim, ks__pk_node *args,
                             int64_t off, ks__pk_node **out, ks_error *err);

static KS_NODISCARD ks_status bad(ks_error *err, int64_t off, const char *what) {
  return ks__err_at(err, KS_E_FORMAT, NULL, NULL, off, "pickle: %s", what);
}


static ks__pk_node *arg(const ks__pk_node *args, size_t i, ks__pk_kind kind) {
  if (!args || (args->kind != PK_TUPLE && args->kind != PK_LIST) || i >= args->u.seq.n) return NULL;
  ks__pk_node *a = args->u.seq.v[i];
  return a->kind == kind ? a : NULL;
}

static size_t nargs(const ks__pk_node *args) {
  return args && (args->kind == PK_TUPLE || args->kind == PK_LIST) ? args->u.seq.n : 0;
}

static const struct {
  const char *name;
  ks_dtype dt;
} storages[] = {
    {"DoubleStorage", KS_F64}, {"FloatStorage", KS_F32}, {"HalfStorage", KS_F16},
    {"BFloat16Storage", KS_BF16}, {"LongStorage", KS_I64}, {"IntStorage", KS_I32},
    {"ShortStorage", KS_I16}, {"CharStorage", KS_I8}, {"ByteStorage", KS_U8},
    {"BoolStorage", KS_BOOL}, {"UntypedStorage", KS_U8},
};

/* torch.<X>Storage class name -> dtype. */
static int storage_dtype(const char *name, ks_dtype *dt) {
  for (size_t i = 0; i < sizeof storages / sizeof storages[0]; i++)
    if (!strcmp(name, storages[i].name)) {
      *dt = storages[i].dt;
      return 1;
    }
  return 0;
}

const char *ks__pk_storage_name(ks_dtype dt) {
  for (size_t i = 0; i < sizeof storages / sizeof storages[0] - 1; i++)
    if (storages[i].dt == dt) return storages[i].name;
  return NULL;
}

ks_status ks__pk_persid(ks__pk_arena *ar, ks__pk_node *pid, ks__pk_storage_fn storage, void *ctx,
                        int64_t off, ks__pk_node **out, ks_error *err) {
  ks__pk_node *tag = arg(pid, 0, PK_STR), *cls = arg(pid, 1, PK_GLOBAL), *key = arg(pid, 2, PK_STR),
              *numel = arg(pid, 4, PK_INT);
  ks_dtype dt;
  if (!tag || strcmp(tag->u.s.p, "storage") || !cls || !key || !numel || numel->u.i < 0)
    return bad(err, off, "persistent id is not ('storage', class, key, location, numel)");
  const char *dtype_text = strcmp(cls->u.g.module, "torch") ? NULL : ks__pk_storage_dtype_text(cls->u.g.name);
  if (dtype_text)
    return ks__err_at(err, KS_E_DTYPE, NULL, key->u.s.p, off,
                      "pickle: tensor of dtype torch.%s (torch.%s): keepsake has no such dtype", dtype_text,
                      cls->u.g.name);
  bool untyped = !strcmp(cls->u.g.module, "torch.storage") && !strcmp(cls->u.g.name, "UntypedStorage");
  if (untyped) dt = KS_U8; /* torch >= 2.3, for the dtypes _rebuild_tensor_v3 names */
  else if (strcmp(cls->u.g.module, "torch") || !storage_dtype(cls->u.g.name, &dt))
    return ks__err_at(err, KS_E_DTYPE, NULL, key->u.s.p, off, "pickle: unknown storage class %s.%s",
                      cls->u.g.module, cls->u.g.name);
  if (!storage) return bad(err, off, "storage reference outside a torch archive");
  char rel[KS_MAX_NAME];
  if (key->u.s.n + 6 >= sizeof rel || strchr(key->u.s.p, '/')) return bad(err, off, "malformed storage key");
  memcpy(rel, "data/", 5);
  memcpy(rel + 5, key->u.s.p, key->u.s.n + 1);
  const uint8_t *data = NULL;
  size_t len = 0;
  uint64_t need = 0;
  ks_status st = storage(ctx, rel, &data, &len, err);
  if (st) return st;
  if (!ks__mul_u64((uint64_t)numel->u.i, ks_dtype_size(dt), &need))
    return ks__err_at(err, KS_E_LIMIT, NULL, rel, off, "pickle: storage of %lld %s elements overflows 64-bit bytes",
                      (long long)numel->u.i, ks_dtype_name(dt));
  if (need > len)
    return ks__err_at(err, KS_E_FORMAT, NULL, rel, off,
                      "pickle: storage of %lld elements needs %llu bytes, entry has %zu", (long long)numel->u.i,
                      (unsigned long long)need, len);
  ks__pk_node *n = ks__pk_new(ar, PK_STORAGE);
  if (!n) return ks__pk_nomem(ar, off, err);
  n->u.st.dtype = dt;
  n->u.st.data = data;
  n->u.st.numel = (uint64_t)numel->u.i;
  *out = n;
  return KS_OK;
}

static KS_NODISCARD ks_status read_dims(const ks__pk_node *seq, int64_t *dims, int *rank, int64_t off, ks_error *err) {
  if (!seq || (seq->kind != PK_TUPLE && seq->kind != PK_LIST))
    return bad(err, off, "tensor size/stride is not a tuple");
  if (seq->u.seq.n > KS_MAX_RANK)
    return ks__err_at(err, KS_E_LIMIT, NULL, NULL, off, "pickle: tensor rank %zu exceeds %d", seq->u.seq.n,
                      KS_MAX_RANK);
  for (size_t i = 0; i < seq->u.seq.n; i++) {
    const ks__pk_node *d = seq->u.seq.v[i];
    if (d->kind != PK_INT || d->u.i < 0) return bad(err, off, "tensor size/stride entries must be non-negative ints");
    dims[i] = d->u.i;
  }
  *rank = (int)seq->u.seq.n;
  return KS_OK;
}

static void strided_copy(uint8_t *dst, const uint8_t *src, size_t esize, int rank, const int64_t *shape,
                         const int64_t *stride) {
  int64_t idx[KS_MAX_RANK] = {0};
  uint64_t numel = 1, pos = 0;
  for (int i = 0; i < rank; i++) numel *= (uint64_t)shape[i];
  for (uint64_t k = 0; k < numel; k++) {
    memcpy(dst + k * esize, src + pos * esize, esize);
    for (int d = rank - 1; d >= 0; d--) {
      pos += (uint64_t)stride[d];
      if (++idx[d] < shape[d]) break;
      pos -= (uint64_t)stride[d] * (uint64_t)shape[d];
      idx[d] = 0;
    }
  }
}

/* Highest element index a view reaches, checked for overflow. */
static bool view_reach(int rank, const int64_t *shape, const int64_t *stride, uint64_t offset, uint64_t *hi) {
  uint64_t r = offset, term;
  for (int i = 0; i < rank; i++)
    if (!ks__mul_u64((uint64_t)shape[i] - 1, (uint64_t)stride[i], &term) || !ks__add_u64(r, term, &r)) return false;
  *hi = r;
  return true;
}

static bool row_major(int rank, const int64_t *shape, const int64_t *stride) {
  int64_t expect = 1;
  for (int i = rank - 1; i >= 0; i--) {
    if (shape[i] != 1 && stride[i] != expect) return false;
    expect *= shape[i];
  }
  return true;
}

ks_status ks__pk_view(ks__pk_arena *ar, const ks__pk_limits *lim, ks_dtype dt, const uint8_t *base,
                      uint64_t base_numel, uint64_t offset, int rank, const int64_t *shape,
                      const int64_t *stride, int64_t off, ks_tensor *t, ks_error *err) {
  uint64_t numel, hi;
  size_t nbytes, esize = ks_dtype_size(dt);
  ks_status st = ks_shape_size(dt, rank, shape, &numel, &nbytes);
  if (st) return ks__err_at(err, st, NULL, NULL, off, "pickle: tensor shape overflows");
  memset(t, 0, sizeof *t);
  t->dtype = dt;
  t->rank = rank;
  if (rank) memcpy(t->shape, shape, (size_t)rank * sizeof *shape);
  t->nbytes = nbytes;
  t->ownership = KS_OWNED;
  if (numel == 0) return KS_OK;
  if (!view_reach(rank, shape, stride, offset, &hi) || hi >= base_numel)
    return bad(err, off, "tensor view reaches past the end of its storage");
  const uint8_t *src = base + offset * esize;
  if (row_major(rank, shape, stride) && (uintptr_t)src % esize == 0) {
    t->data = (void *)(uintptr_t)src;
    t->ownership = ar->zip && ks__zip_owns_data(ar->zip) ? KS_MAPPED : KS_BORROWED;
    return KS_OK;
  }
  /* Written as a subtraction: buf_bytes + nbytes can wrap for a huge stride-0 view. */
  if (nbytes > lim->max_view_bytes || ar->buf_bytes > lim->max_view_bytes - nbytes)
    return ks__err_at(err, KS_E_LIMIT, NULL, NULL, off,
                      "pickle: materialised views exceed %llu bytes (a view of %zu bytes after %llu)",
                      (unsigned long long)lim->max_view_bytes, nbytes, (unsigned long long)ar->buf_bytes);
  uint8_t *dst = ks__pk_buffer(ar, nbytes);
  if (!dst) return ks__pk_nomem(ar, off, err);
  strided_copy(dst, src, esize, rank, shape, stride);
  t->data = dst;
  return KS_OK;
}

static KS_NODISCARD ks_status ctor_tensor(ks__pk_arena *ar, const ks__pk_limits *lim, ks__pk_node *args, int64_t off,
                             ks__pk_node **out, ks_error *err) {
  ks__pk_node *stor = arg(args, 0, PK_STORAGE), *offset = arg(args, 1, PK_INT);
  int64_t shape[KS_MAX_RANK], stride[KS_MAX_RANK];
  int rank, srank;
  if (!stor || !offset || offset->u.i < 0 || nargs(args) < 4)
    return bad(err, off, "_rebuild_tensor arguments are not (storage, offset, size, stride, ...)");
  ks_status st = read_dims(args->u.seq.v[2], shape, &rank, off, err);
  if (!st) st = read_dims(args->u.seq.v[3], stride, &srank, off, err);
  if (st) return st;
  if (rank != srank) return bad(err, off, "tensor size and stride differ in length");
  ks__pk_node *n = ks__pk_new_tensor(ar);
  if (!n) return ks__pk_nomem(ar, off, err);
  *out = n;
  return ks__pk_view(ar, lim, stor->u.st.dtype, stor->u.st.data, stor->u.st.numel, (uint64_t)offset->u.i,
                     rank, shape, stride, off, n->u.t, err);
}

static KS_NODISCARD ks_status ctor_parameter(ks__pk_arena *ar, const ks__pk_limits *lim, ks__pk_node *args,
                                int64_t off, ks__pk_node **out, ks_error *err) {
  (void)ar, (void)lim;
  if (!(*out = arg(args, 0, PK_TENSOR))) return bad(err, off, "_rebuild_parameter without a tensor");
  return KS_OK;
}

/* _rebuild_from_type_v2(func, type, args, state) = func(*args). Nested ones (func is
 * _rebuild_from_type_v2 again) are unwrapped in a loop: a pickle can nest them
 * arbitrarily deep, and recursing once per level would overflow the C stack. */
static KS_NODISCARD ks_status ctor_from_type(ks__pk_arena *ar, const ks__pk_limits *lim, ks__pk_node *args,
                                int64_t off, ks__pk_node **out, ks_error *err) {
  ks__pk_node *fn = arg(args, 0, PK_GLOBAL), *inner = arg(args, 2, PK_TUPLE);
  if (!fn || !inner) return KS_OK; /* leave inert */
  while (ks__pk_is_global(fn, "torch._tensor", "_rebuild_from_type_v2")) {
    ks__pk_node *f2 = arg(inner, 0, PK_GLOBAL), *a2 = arg(inner, 2, PK_TUPLE);
    ar->work++; /* each level was built by opcodes, so this is bounded by the program's size */
    if (!f2 || !a2) break; /* the innermost one is inert: an object of fn(inner) */
    fn = f2, inner = a2;
  }
  if (ks__pk_is_global(fn, "torch._tensor", "_rebuild_from_type_v2")) {
    ks__pk_node *o = ks__pk_new_object(ar, fn, inner);
    if (!o) return ks__pk_nomem(ar, off, err);
    *out = o;
    return KS_OK;
  }
  return ks__pk_reduce(ar, lim, fn, inner, off, out, err);
}

static KS_NODISCARD ks_status ctor_odict(ks__pk_arena *ar, const ks__pk_limits *lim, ks__pk_node *args, int64_t off,
                            ks__pk_node **out, ks_error *err) {
  (void)lim;
  ks__pk_node *pairs = nargs(args) ? args->u.seq.v[0] : NULL;
  if (pairs && pairs->kind != PK_LIST && pairs->kind != PK_TUPLE) return KS_OK;
  ks__pk_node *d = ks__pk_new(ar, PK_DICT);
  if (!d) return ks__pk_nomem(ar, off, err);
  for (size_t i = 0; pairs && i < pairs->u.seq.n; i++) {
    ks__pk_node *kv = pairs->u.seq.v[i];
    if ((kv->kind != PK_TUPLE && kv->kind != PK_LIST) || kv->u.seq.n != 2) return KS_OK;
    if (!ks__pk_push_n(ar, &d->u.seq, kv->u.seq.v, 2)) return ks__pk_nomem(ar, off, err);
  }
  *out = d;
  return KS_OK;
}

static KS_NODISCARD ks_status ctor_set(ks__pk_arena *ar, const ks__pk_limits *lim, ks__pk_node *args, int64_t off,
                          ks__pk_node **out, ks_error *err) {
  (void)lim;
  ks__pk_node *items = nargs(args) ? args->u.seq.v[0] : NULL;
  if (items && items->kind != PK_LIST && items->kind != PK_TUPLE && items->kind != PK_SET) return KS_OK;
  ks__pk_node *s = ks__pk_new(ar, PK_SET);
  if (!s) return ks__pk_nomem(ar, off, err);
  if (items && !ks__pk_push_n(ar, &s->u.seq, items->u.seq.v, items->u.seq.n)) return ks__pk_nomem(ar, off, err);
  *out = s;
  return KS_OK;
}

static KS_NODISCARD ks_status ctor_device(ks__pk_arena *ar, const ks__pk_limits *lim, ks__pk_node *args, int64_t off,
                             ks__pk_node **out, ks_error *err) {
  (void)lim;
  ks__pk_node *type = arg(args, 0, PK_STR), *index = arg(args, 1, PK_INT);
  if (!type || type->u.s.n > 64) return KS_OK;
  char buf[96];
  int n = index ? snprintf(buf, sizeof buf, "%s:%lld", type->u.s.p, (long long)index->u.i)
                : snprintf(buf, sizeof buf, "%s", type->u.s.p);
  if (!(*out = ks__pk_new_str(ar, PK_STR, buf, (size_t)n))) return ks__pk_nomem(ar, off, err);
  return KS_OK;
}

/* _codecs.encode(text, 'latin1'): how protocol 2 carries Python 3 bytes. */
static KS_NODISCARD ks_status ctor_encode(ks__pk_arena *ar, const ks__pk_limits *lim, ks__pk_node *args, int64_t off,
                             ks__pk_node **out, ks_error *err) {
  (void)lim;
  ks__pk_node *text = arg(args, 0, PK_STR), *enc = arg(args, 1, PK_STR);
  if (!text || !enc) return KS_OK;
  if (strcmp(enc->u.s.p, "latin1") && strcmp(enc->u.s.p, "latin-1") && strcmp(enc->u.s.p, "iso-8859-1"))
    return KS_OK;
  uint8_t *dst = ks__pk_bytes(ar, text->u.s.n + 1); /* a copy per call: counted in the arena's memory */
  if (!dst) return ks__pk_nomem(ar, off, err);
  size_t n = 0;
  const uint8_t *s = (const uint8_t *)text->u.s.p;
  for (size_t i = 0; i < text->u.s.n; n++) {
    if (s[i] < 0x80) {
      dst[n] = s[i++];
    } else if ((s[i] & 0xFE) == 0xC2 && i + 1 < text->u.s.n) {
      dst[n] = (uint8_t)((s[i] & 3) << 6 | (s[i + 1] & 0x3F));
      i += 2;
    } else {
      return bad(err, off, "_codecs.encode: text has characters beyond latin-1");
    }
  }
  ks__pk_node *b = ks__pk_new(ar, PK_BYTES);
  if (!b) return ks__pk_nomem(ar, off, err);
  dst[n] = 0;
  b->u.s.p = (char *)dst;
  b->u.s.n = n;
  *out = b;
  return KS_OK;
}

static KS_NODISCARD ks_status ctor_size(ks__pk_arena *ar, const ks__pk_limits *lim, ks__pk_node *args, int64_t off,
                           ks__pk_node **out, ks_error *err) {
  (void)lim, (void)off, (void)err, (void)ar;
  ks__pk_node *dims = nargs(args) ? args->u.seq.v[0] : NULL;
  if (dims && (dims->kind == PK_TUPLE || dims->kind == PK_LIST)) *out = dims;
  return KS_OK;
}

static const struct {
  const char *module, *name;
  ctor_fn fn;
} ctors[] = {
    {"torch._utils", "_rebuild_tensor_v2", ctor_tensor},
    {"torch._utils", "_rebuild_tensor", ctor_tensor},
    {"torch._utils", "_rebuild_tensor_v3", ks__pk_ctor_tensor_v3},
    {"torch._utils", "_rebuild_parameter", ctor_parameter},
    {"torch._utils", "_rebuild_parameter_with_state", ctor_parameter},
    {"torch._tensor", "_rebuild_from_type_v2", ctor_from_type},
    {"collections", "OrderedDict", ctor_odict},
    {"builtins", "set", ctor_set},
    {"builtins", "frozenset", ctor_set},
    {"torch", "device", ctor_device},
    {"torch", "Size", ctor_size},
    {"_codecs", "encode", ctor_encode},
    {"numpy", "dtype", ks__pk_np_dtype},
    {"numpy.core.multiarray", "scalar", ks__pk_np_scalar},
    {"numpy._core.multiarray", "scalar", ks__pk_np_scalar},
};

static ctor_fn find_ctor(const ks__pk_node *g) {
  const char *m = strcmp(g->u.g.module, "__builtin__") ? g->u.g.module : "builtins";
  for (size_t i = 0; i < sizeof ctors / sizeof ctors[0]; i++)
    if (!strcmp(m, ctors[i].module) && !strcmp(g->u.g.name, ctors[i].name)) return ctors[i].fn;
  return NULL;
}

ks_status ks__pk_reduce(ks__pk_arena *ar, const ks__pk_limits *lim, ks__pk_node *callable,
                        ks__pk_node *args, int64_t off, ks__pk_node **out, ks_error *err) {
  *out = NULL;
  ctor_fn fn = callable->kind == PK_GLOBAL ? find_ctor(callable) : NULL;
  if (fn) {
    ks_status st = fn(ar, lim, args, off, out, err);
    if (st || *out) return st;
  }
  ks__pk_node *o = ks__pk_new_object(ar, callable, args);
  if (!o) return ks__pk_nomem(ar, off, err);
  *out = o;
  return KS_OK;
}

static KS_NODISCARD ks_status merge_state(ks__pk_arena *ar, ks__pk_node *obj, ks__pk_node *state, int64_t off,
                                          ks_error *err) {
  ks__pk_node *old = obj->u.obj->state;
  if (!old || old->kind != PK_DICT || state->kind != PK_DICT) {
    obj->u.obj->state = state;
    obj->u.obj->state_owned = false;
    return KS_OK;
  }
  /* A dict of our own is extended in place: copying it on every BUILD would make a
     program of n BUILDs cost n^2 time and memory. Other dicts may be shared (memo). */
  ks__pk_node *d = old;
  if (!obj->u.obj->state_owned) {
    if (!(d = ks__pk_new(ar, PK_DICT))) return ks__pk_nomem(ar, off, err);
    if (!ks__pk_push_n(ar, &d->u.seq, old->u.seq.v, old->u.seq.n)) return ks__pk_nomem(ar, off, err);
    obj->u.obj->state = d;
    obj->u.obj->state_owned = true;
  }
  if (!ks__pk_push_n(ar, &d->u.seq, state->u.seq.v, state->u.seq.n)) return ks__pk_nomem(ar, off, err);
  return KS_OK;
}

ks_status ks__pk_build(ks__pk_arena *ar, const ks__pk_limits *lim, ks__pk_node *obj,
                       ks__pk_node *state, int64_t off, ks_error *err) {
  if (obj->kind == PK_NPDTYPE) return ks__pk_np_dtype_build(obj, state, off, err);
  if (obj->kind != PK_OBJECT) return KS_OK; /* e.g. OrderedDict._metadata: not data */
  const ks__pk_node *cls = obj->u.obj->cls;
  if (ks__pk_is_global(cls, "numpy.core.multiarray", "_reconstruct") ||
      ks__pk_is_global(cls, "numpy._core.multiarray", "_reconstruct"))
    return ks__pk_np_array_build(ar, lim, obj, state, off, err);
  return merge_state(ar, obj, state, off, err);
}
