/**
 * @file tensor.h
 * Tensor descriptors: dtype, shape (rank <= 8) and contiguous row-major data.
 *
 * A ks_tensor is a plain value type that *describes* data; it never frees it.
 * Who owns `data` is recorded in `ownership` for the benefit of containers:
 * a state dict frees KS_OWNED data with its allocator, leaves KS_BORROWED and
 * KS_MAPPED data alone (the mapping belongs to the reader that produced it).
 */
#ifndef KEEPSAKE_TENSOR_H
#define KEEPSAKE_TENSOR_H

#include "keepsake/export.h"

#include <stddef.h>
#include <stdint.h>

#include "keepsake/dtype.h"
#include "keepsake/status.h"

KS_BEGIN_DECLS

#define KS_MAX_RANK 8

typedef enum ks_ownership {
  KS_OWNED = 0,    /**< allocated by the owning container's allocator */
  KS_BORROWED = 1, /**< caller's memory; must outlive the container */
  KS_MAPPED = 2    /**< points into a memory-mapped file held by a reader */
} ks_ownership;

typedef struct ks_tensor {
  ks_dtype dtype;
  int rank;                     /**< 0..KS_MAX_RANK; 0 is a scalar with one element */
  int64_t shape[KS_MAX_RANK];   /**< each >= 0 */
  void *data;                   /**< little-endian, row-major; may be NULL when nbytes is 0 */
  size_t nbytes;                /**< numel * dtype size */
  ks_ownership ownership;
} ks_tensor;

/**
 * Fills a descriptor for borrowed data, checking rank, dims and size overflow.
 * @param t     receives the descriptor; untouched on failure.
 * @param shape `rank` dims (may be NULL when rank is 0).
 * @param data  borrowed; must hold numel * dtype size bytes.
 * @return KS_OK, KS_E_DTYPE, KS_E_LIMIT (rank > 8 or size overflow) or KS_E_SHAPE (negative dim).
 */
KS_NODISCARD ks_status ks_tensor_init(ks_tensor *t, ks_dtype dtype, int rank, const int64_t *shape, void *data);

/**
 * Element count of a shape, checked for overflow: the byte size must also fit in size_t.
 * @param out_numel receives numel; @param out_nbytes receives numel*size (either may be NULL).
 * @return KS_OK, KS_E_SHAPE for negative dims, KS_E_LIMIT for rank > 8 or overflow.
 */
KS_NODISCARD ks_status ks_shape_size(ks_dtype dtype, int rank, const int64_t *shape, uint64_t *out_numel,
                        size_t *out_nbytes);

/** Number of elements of a valid descriptor (1 for rank 0). */
uint64_t ks_tensor_numel(const ks_tensor *t);

/** Nonzero when a and b have the same rank and dims. */
int ks_tensor_same_shape(const ks_tensor *a, const ks_tensor *b);

/** Writes a shape as "[2, 3]" into buf (NUL-terminated). @return buf. */
char *ks_shape_format(int rank, const int64_t *shape, char *buf, size_t cap);

KS_END_DECLS
#endif
