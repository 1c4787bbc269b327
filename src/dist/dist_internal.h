/* Private to the dist module: a growable byte buffer for the wire encoding. */
#ifndef KS_DIST_INTERNAL_H
#define KS_DIST_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "core/internal.h"
#include "keepsake/dist.h"

typedef struct ks__wbuf {
  const ks_allocator *a;
  uint8_t *p;
  size_t len, cap;
  int failed; /* an append ran out of memory or past the limit */
} ks__wbuf;

void ks__wbuf_put(ks__wbuf *b, const void *data, size_t n);
void ks__wbuf_i64(ks__wbuf *b, int64_t v);
void ks__wbuf_free(ks__wbuf *b);

/* The MPI error of a call as a ks_status (KS_E_IO naming the call). */
KS_NODISCARD ks_status ks__mpi_check(int rc, const char *call, ks_error *err);

#endif
