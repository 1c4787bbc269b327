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
 *
 * Every allocation keepsake makes goes through the allocator of the object
 * doing the work (metadata and metric-argument JSON included); the library
 * never calls malloc directly when an allocator is given.
 *
 * Thread safety: the allocator must be thread safe whenever objects that use it
 * are used from more than one thread at the same time. That includes a single
 * object where its header allows concurrent use: one ks_reader may be read and
 * verified from several threads, and ks_reader_verify allocates. An allocator
 * used by one thread at a time needs no locking. The default (NULL: the C
 * library's malloc) is thread safe.
 */
typedef struct ks_allocator {
  void *(*malloc_fn)(void *ctx, size_t size);
  void *(*realloc_fn)(void *ctx, void *ptr, size_t size);
  void (*free_fn)(void *ctx, void *ptr);
  void *ctx;
} ks_allocator;

KS_END_DECLS
#endif
