/*
 * The one way the library gets a whole file into memory through a ks_io table:
 * open read-only (open_fn refuses a FIFO or directory, never waits on one), check
 * the size fits size_t, then map it (map_fn, where the table can) or read it into
 * memory from the caller's allocator (read_fn). Every reader of files (format,
 * torch) classifies failures the same way:
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
#include "keepsake/io.h"

typedef struct ks__fmap {
  const uint8_t *bytes; /* the file's bytes: the mapping or the copy */
  size_t size;
  void *map; /* non-NULL for a mapping of map_len bytes */
  size_t map_len;
  uint8_t *copy; /* non-NULL for a copy (allocator memory) */
  const ks_io *io; /* the (version 2) table that made the mapping */
} ks__fmap;

/*
 * Fills m with the whole file at path through io (NULL = POSIX): mapped, unless
 * `copy`, the file is shorter than `min_map` bytes (an empty mapping is an
 * error) or the table cannot map, then read. KS_E_INVALID when io fails
 * ks_io_check. Errors name path as the file. m is all zeros on failure.
 */
ks_status ks__fmap_open(ks__fmap *m, const char *path, const ks_io *io, bool copy, size_t min_map,
                        const ks_allocator *a, ks_error *err);
/* Asks for transparent huge pages over a large fresh buffer (a hint: first-touch page
 * faults dominate copying a big file into new memory; 512 times fewer with huge pages). */
void ks__advise_huge(void *p, size_t size);
/* Unmaps or frees; m is all zeros afterwards. */
void ks__fmap_close(ks__fmap *m, const ks_allocator *a);

#endif
