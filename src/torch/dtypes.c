/*
 * torch dtypes beyond the typed storages of torch 1.x. torch >= 2.3 saves
 * tensors of the newer dtypes (uint16/32/64, float8) with _rebuild_tensor_v3
 * over an UntypedStorage and names the dtype (a `torch.<dtype>` global) as the
 * last argument. Dtypes keepsake cannot hold are refused by name.
 */
#include <stdio.h>

#include "torch/torch_internal.h"

static const struct {
  const char *name;
  ks_dtype dt;
} torch_dtypes[] = {
    {"float32", KS_F32},  {"float", KS_F32},   {"float64", KS_F64},   {"double", KS_F64},
    {"float16", KS_F16},  {"half", KS_F16},    {"bfloat16", KS_BF16}, {"int64", KS_I64},
    {"long", KS_I64},     {"int32", KS_I32},   {"int", KS_I32},       {"int16", KS_I16},
    {"short", KS_I16},    {"int8", KS_I8},     {"uint8", KS_U8},      {"bool", KS_BOOL},
    {"uint16", KS_U16},   {"uint32", KS_U32},  {"uint64", KS_U64},    {"float8_e4m3fn", KS_F8_E4M3},
    {"float8_e5m2", KS_F8_E5M2},
};

/* Typed storage classes of dtypes keepsake has no counterpart for, by the dtype they hold. */
static const struct {
  const char *storage, *dtype;
} unsupported_storages[] = {
    {"ComplexFloatStorage", "complex64"}, {"ComplexDoubleStorage", "complex128"},
    {"ComplexHalfStorage", "complex32"},  {"QInt8Storage", "qint8"},
    {"QUInt8Storage", "quint8"},          {"QInt32Storage", "qint32"},
    {"QUInt4x2Storage", "quint4x2"},      {"QUInt2x4Storage", "quint2x4"},
};

/* torch dtypes (dtypes.c): `torch.<name>` globals, _rebuild_tensor_v3, and the dtype an
 * unsupported typed storage holds ("complex64" for ComplexFloatStorage; NULL if none). */
static int torch_dtype_of(const char *name, ks_dtype *dt) {
  for (size_t i = 0; i < sizeof torch_dtypes / sizeof torch_dtypes[0]; i++)
    if (!strcmp(name, torch_dtypes[i].name)) {
      *dt = torch_dtypes[i].dt;
      return 1;
    }
  return 0;
}

const char *ks__pk_torch_dtype_name(ks_dtype dt) {
  for (size_t i = 0; i < sizeof torch_dtypes / sizeof torch_dtypes[0]; i++)
    if (torch_dtypes[i].dt == dt) return torch_dtypes[i].name;
  return "?";
}

const char *ks__pk_storage_dtype_text(const char *storage_class) {
  for (size_t i = 0; i < sizeof unsupported_storages / sizeof unsupported_storages[0]; i++)
    if (!strcmp(storage_class, unsupported_storages[i].storage)) return unsupported_storages[i].dtype;
  return NULL;
}

static KS_NODISCARD ks_status dims(const ks__pk_node *seq, int64_t *d, int *rank, int64_t off, ks_error *err) {
  if (!seq || (seq->kind != PK_TUPLE && seq->kind != PK_LIST))
    return ks__err_at(err, KS_E_FORMAT, NULL, NULL, off, "pickle: tensor size/stride is not a tuple");
  if (seq->u.seq.n > KS_MAX_RANK)
    return ks__err_at(err, KS_E_LIMIT, NULL, NULL, off, "pickle: tensor rank %zu exceeds %d", seq->u.seq.n,
                      KS_MAX_RANK);
  for (size_t i = 0; i < seq->u.seq.n; i++) {
    if (seq->u.seq.v[i]->kind != PK_INT || seq->u.seq.v[i]->u.i < 0)
      return ks__err_at(err, KS_E_FORMAT, NULL, NULL, off,
                        "pickle: tensor size/stride entries must be non-negative ints");
    d[i] = seq->u.seq.v[i]->u.i;
  }
  *rank = (int)seq->u.seq.n;
  return KS_OK;
}

static KS_NODISCARD ks_status unsupported(ks_error *err, int64_t off, const char *name) {
  return ks__err_at(err, KS_E_DTYPE, NULL, NULL, off,
                    "pickle: tensor of dtype torch.%s: keepsake has no such dtype (it holds bool, "
                    "(u)int8-64, float16/32/64, bfloat16, float8_e4m3fn and float8_e5m2)", name);
}

/* _rebuild_tensor_v3(storage, offset, size, stride, requires_grad, hooks, dtype[, metadata]) */
ks_status ks__pk_ctor_tensor_v3(ks__pk_arena *ar, const ks__pk_limits *lim, ks__pk_node *args, int64_t off,
                                ks__pk_node **out, ks_error *err) {
  if (!args || args->kind != PK_TUPLE || args->u.seq.n < 7 || args->u.seq.v[0]->kind != PK_STORAGE ||
      args->u.seq.v[1]->kind != PK_INT || args->u.seq.v[1]->u.i < 0 || args->u.seq.v[6]->kind != PK_GLOBAL)
    return ks__err_at(err, KS_E_FORMAT, NULL, NULL, off,
                      "pickle: _rebuild_tensor_v3 arguments are not (storage, offset, size, stride, "
                      "requires_grad, hooks, dtype)");
  const ks__pk_node *stor = args->u.seq.v[0], *dtn = args->u.seq.v[6];
  ks_dtype dt;
  if (strcmp(dtn->u.g.module, "torch") || !torch_dtype_of(dtn->u.g.name, &dt))
    return unsupported(err, off, dtn->u.g.name);
  /* An UntypedStorage counts bytes; a typed one (older writers) its own elements. */
  uint64_t bytes = stor->u.st.numel * ks_dtype_size(stor->u.st.dtype);
  int64_t shape[KS_MAX_RANK], stride[KS_MAX_RANK];
  int rank, srank;
  ks_status st = dims(args->u.seq.v[2], shape, &rank, off, err);
  if (!st) st = dims(args->u.seq.v[3], stride, &srank, off, err);
  if (st) return st;
  if (rank != srank)
    return ks__err_at(err, KS_E_FORMAT, NULL, NULL, off, "pickle: tensor size and stride differ in length");
  ks__pk_node *n = ks__pk_new_tensor(ar);
  if (!n) return ks__pk_nomem(ar, off, err);
  *out = n;
  return ks__pk_view(ar, lim, dt, stor->u.st.data, bytes / ks_dtype_size(dt), (uint64_t)args->u.seq.v[1]->u.i, rank,
                     shape, stride, off, n->u.t, err);
}
