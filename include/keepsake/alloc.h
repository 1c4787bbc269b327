/**
 * @file alloc.h
 * Per-object allocator hook.
 *
 * Every keepsake object is created with an optional allocator and remembers it;
 * NULL means the C library's malloc/realloc/free. There is no global allocator.
 */
#ifndef KEEPSAKE_ALLOC_H
#define KEEPSAKE_ALLOC_H

#include "keepsake/export.h"

#include <stddef.h>

KS_BEGIN_DECLS

/**
 * An allocator. All three functions receive `ctx`. `realloc_fn` must behave like
 * realloc (NULL ptr allocates). `free_fn` must accept NULL.
 * The struct is copied into objects that use it; `ctx` must outlive them.
 */
typedef struct ks_allocator {
  void *(*malloc_fn)(void *ctx, size_t size);
  void *(*realloc_fn)(void *ctx, void *ptr, size_t size);
  void (*free_fn)(void *ctx, void *ptr);
  void *ctx;
} ks_allocator;

KS_END_DECLS
#endif
