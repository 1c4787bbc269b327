/*
 * numpy values as they appear in RNG state: numpy.dtype(...) + BUILD(byteorder),
 * and arrays made by _reconstruct(ndarray, (0,), b'b') + BUILD((1, shape, dtype,
 * fortran, raw bytes)). They become tensors; nothing from numpy is imported.
 */
#include "torch/torch_internal.h"

static KS_NODISCARD ks_status bad(ks_error *err, int64_t off, const char *what) {
  return ks__err_at(err, KS_E_FORMAT, NULL, NULL, off, "pickle: numpy: %s", what);
}

static const struct {
  const char *code;
  ks_dtype dt;
} np_types[] = {
    {"b1", KS_BOOL}, {"?", KS_BOOL},   {"u1", KS_U8},   {"i1", KS_I8},   {"u2", KS_U16},
    {"i2", KS_I16},  {"u4", KS_U32},   {"i4", KS_I32},  {"u8", KS_U64},  {"i8", KS_I64},
    {"f2", KS_F16},  {"f4", KS_F32},   {"f8", KS_F64},  {"bool", KS_BOOL}, {"uint8", KS_U8},
    {"int8", KS_I8}, {"uint16", KS_U16}, {"int16", KS_I16}, {"uint32", KS_U32}, {"int32", KS_I32},
    {"uint64", KS_U64}, {"int64", KS_I64}, {"float16", KS_F16}, {"float32", KS_F32}, {"float64", KS_F64},
};

static int parse_np_type(const char *s, ks_dtype *dt, int *swap) {
  *swap = 0;
  if (*s == '<' || *s == '|' || *s == '=') s++;
  else if (*s == '>') s++, *swap = 1;
  for (size_t i = 0; i < sizeof np_types / sizeof np_types[0]; i++)
    if (!strcmp(s, np_types[i].code)) {
      *dt = np_types[i].dt;
      if (ks_dtype_size(*dt) == 1) *swap = 0;
      return 1;
    }
  return 0;
}

static const ks__pk_node *item(const ks__pk_node *seq, size_t i, ks__pk_kind kind) {
  if (!seq || (seq->kind != PK_TUPLE && seq->kind != PK_LIST) || i >= seq->u.seq.n) return NULL;
  return seq->u.seq.v[i]->kind == kind ? seq->u.seq.v[i] : NULL;
}

ks_status ks__pk_np_dtype(ks__pk_arena *ar, const ks__pk_limits *lim, ks__pk_node *args, int64_t off,
                          ks__pk_node **out, ks_error *err) {
  (void)lim;
  const ks__pk_node *code = item(args, 0, PK_STR);
  ks_dtype dt;
  int swap;
  if (!code || !parse_np_type(code->u.s.p, &dt, &swap)) return KS_OK; /* structured etc.: inert */
  ks__pk_node *n = ks__pk_new(ar, PK_NPDTYPE);
  if (!n) return ks__pk_nomem(ar, off, err);
  n->u.npd.dtype = dt;
  n->u.npd.swap = swap;
  *out = n;
  return KS_OK;
}

ks_status ks__pk_np_dtype_build(ks__pk_node *dt, const ks__pk_node *state, int64_t off, ks_error *err) {
  const ks__pk_node *order = item(state, 1, PK_STR);
  if (!order) return bad(err, off, "dtype state without a byte order");
  dt->u.npd.swap = order->u.s.p[0] == '>' && ks_dtype_size(dt->u.npd.dtype) > 1;
  return KS_OK;
}

static void swap_bytes(uint8_t *p, size_t n, size_t esize) {
  for (size_t k = 0; k + esize <= n; k += esize)
    for (size_t i = 0; i < esize / 2; i++) {
      uint8_t t = p[k + i];
      p[k + i] = p[k + esize - 1 - i];
      p[k + esize - 1 - i] = t;
    }
}

/* Points t at raw little-endian row-major bytes, copying when they need reordering. */
static KS_NODISCARD ks_status fill(ks__pk_arena *ar, const ks__pk_limits *lim, const ks__pk_node *dtn,
                                   const ks__pk_node *raw, int fortran, int rank, const int64_t *shape, int64_t off,
                                   ks_tensor *t, ks_error *err) {
  ks_dtype dt = dtn->u.npd.dtype;
  int64_t stride[KS_MAX_RANK], s = 1;
  size_t nbytes;
  uint64_t numel;
  if (ks_shape_size(dt, rank, shape, &numel, &nbytes)) return bad(err, off, "array shape overflows");
  if (nbytes != raw->u.s.n) return bad(err, off, "array data size does not match its shape");
  for (int i = 0; i < rank; i++) stride[fortran ? i : rank - 1 - i] = s, s *= shape[fortran ? i : rank - 1 - i];
  const uint8_t *src = (const uint8_t *)raw->u.s.p;
  if (dtn->u.npd.swap) {
    /* A copy per array: a memoised bytes object swapped again and again counts against the views' budget. */
    if (nbytes > lim->max_view_bytes || ar->buf_bytes > lim->max_view_bytes - nbytes)
      return ks__err_at(err, KS_E_LIMIT, NULL, NULL, off,
                        "pickle: byte-swapped arrays exceed %llu bytes (an array of %zu bytes after %llu)",
                        (unsigned long long)lim->max_view_bytes, nbytes, (unsigned long long)ar->buf_bytes);
    uint8_t *tmp = ks__pk_buffer(ar, nbytes);
    if (!tmp) return ks__pk_nomem(ar, off, err);
    if (nbytes) memcpy(tmp, src, nbytes);
    swap_bytes(tmp, nbytes, ks_dtype_size(dt));
    src = tmp;
  }
  ks_status st = ks__pk_view(ar, lim, dt, src, numel, 0, rank, shape, stride, off, t, err);
  if (!st && t->data == src) t->ownership = KS_OWNED; /* the arena owns raw bytes and copies */
  return st;
}

ks_status ks__pk_np_array_build(ks__pk_arena *ar, const ks__pk_limits *lim, ks__pk_node *obj,
                                const ks__pk_node *state, int64_t off, ks_error *err) {
  const ks__pk_node *shape = item(state, 1, PK_TUPLE), *dtn = item(state, 2, PK_NPDTYPE),
                    *fortran = item(state, 3, PK_BOOL), *raw = item(state, 4, PK_BYTES);
  if (!shape || !dtn || !raw) return KS_OK; /* object arrays and the like stay inert */
  int64_t dims[KS_MAX_RANK];
  if (shape->u.seq.n > KS_MAX_RANK)
    return ks__err_at(err, KS_E_LIMIT, NULL, NULL, off, "pickle: numpy array rank too high");
  for (size_t i = 0; i < shape->u.seq.n; i++) {
    const ks__pk_node *d = shape->u.seq.v[i];
    if (d->kind != PK_INT || d->u.i < 0) return bad(err, off, "array shape must hold non-negative ints");
    dims[i] = d->u.i;
  }
  ks_tensor t;
  ks_status st = fill(ar, lim, dtn, raw, fortran && fortran->u.i, (int)shape->u.seq.n, dims, off, &t, err);
  if (st) return st;
  return ks__pk_make_tensor(ar, obj, &t) ? KS_OK : ks__pk_nomem(ar, off, err);
}

ks_status ks__pk_np_scalar(ks__pk_arena *ar, const ks__pk_limits *lim, ks__pk_node *args, int64_t off,
                           ks__pk_node **out, ks_error *err) {
  const ks__pk_node *dtn = item(args, 0, PK_NPDTYPE), *raw = item(args, 1, PK_BYTES);
  if (!dtn || !raw) return KS_OK;
  ks__pk_node *n = ks__pk_new_tensor(ar);
  if (!n) return ks__pk_nomem(ar, off, err);
  *out = n;
  return fill(ar, lim, dtn, raw, 0, 0, NULL, off, n->u.t, err);
}
