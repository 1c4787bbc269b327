/*
 * The one way the library gets a whole file into memory: open read-only (a
 * FIFO is refused, never waited on), check it is a regular file whose size fits
 * size_t, then map it or read it into memory from the caller's allocator. Every
 * reader of files (format, torch) classifies failures the same way:
 *   KS_E_IO     cannot open, stat, read or map; not a regular file;
 *   KS_E_LIMIT  the file is larger than the address space;
 *   KS_E_NOMEM  no memory for a copy.
 */
#ifndef KS_CORE_FMAP_H
#define KS_CORE_FMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/internal.h"

typedef struct ks__fmap {
  const uint8_t *bytes; /* the file's bytes: the mapping or the copy */
  size_t size;
  void *map; /* non-NULL for a mapping of map_len bytes */
  size_t map_len;
  uint8_t *copy; /* non-NULL for a copy (allocator memory) */
} ks__fmap;

/*
 * Fills m with the whole file at path: mapped, unless `copy` or the file is
 * shorter than `min_map` bytes (an empty mapping is an error), then read.
 * Errors name path as the file. m is all zeros on failure.
 */
KS_NODISCARD ks_status ks__fmap_open(ks__fmap *m, const char *path, bool copy, size_t min_map, const ks_allocator *a,
                        ks_error *err);
/* Unmaps or frees; m is all zeros afterwards. */
void ks__fmap_close(ks__fmap *m, const ks_allocator *a);

#endif
