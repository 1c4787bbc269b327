#include <stdio.h>
#include <string.h>

#include "core/internal.h"
#include "keepsake/tensor.h"

ks_status ks_shape_size(ks_dtype dtype, int rank, const int64_t *shape, uint64_t *out_numel,
                        size_t *out_nbytes) {
  size_t esize = ks_dtype_size(dtype);
  if (esize == 0) return KS_E_DTYPE;
  if (rank < 0 || rank > KS_MAX_RANK) return KS_E_LIMIT;
  uint64_t numel = 1;
  for (int i = 0; i < rank; i++) {
    if (shape[i] < 0) return KS_E_SHAPE;
    if (!ks__mul_u64(numel, (uint64_t)shape[i], &numel)) return KS_E_LIMIT;
  }
  uint64_t nbytes;
  if (!ks__mul_u64(numel, esize, &nbytes) || nbytes > SIZE_MAX) return KS_E_LIMIT;
  if (out_numel) *out_numel = numel;
  if (out_nbytes) *out_nbytes = (size_t)nbytes;
  return KS_OK;
}

ks_status ks_tensor_init(ks_tensor *t, ks_dtype dtype, int rank, const int64_t *shape, void *data) {
  size_t nbytes;
  ks_status st = ks_shape_size(dtype, rank, shape, NULL, &nbytes);
  if (st) return st;
  memset(t, 0, sizeof *t);
  t->dtype = dtype;
  t->rank = rank;
  for (int i = 0; i < rank; i++) t->shape[i] = shape[i];
  t->data = data;
  t->nbytes = nbytes;
  t->ownership = KS_BORROWED;
  return KS_OK;
}

uint64_t ks_tensor_numel(const ks_tensor *t) {
  uint64_t n = 1;
  for (int i = 0; i < t->rank; i++) n *= (uint64_t)t->shape[i];
  return n;
}

int ks_tensor_same_shape(const ks_tensor *a, const ks_tensor *b) {
  if (a->rank != b->rank) return 0;
  for (int i = 0; i < a->rank; i++)
    if (a->shape[i] != b->shape[i]) return 0;
  return 1;
}

char *ks_shape_format(int rank, const int64_t *shape, char *buf, size_t cap) {
  if (cap == 0) return buf;
  size_t used = 0;
  buf[0] = '\0';
  int n = snprintf(buf, cap, "[");
  for (int i = 0; i < rank && n >= 0 && (used += (size_t)n) < cap; i++)
    n = snprintf(buf + used, cap - used, i ? ", %lld" : "%lld", (long long)shape[i]);
  if (n >= 0 && (used += (size_t)n) < cap) snprintf(buf + used, cap - used, "]");
  return buf;
}
