/*
 * Agreement: every collective of this module ends here, so a failure on one
 * rank is the failure of every rank, with the same status and message, and no
 * rank waits for a peer that gave up.
 */
#include <stdio.h>
#include <string.h>

#include "dist/dist_internal.h"

ks_status ks__mpi_check(int rc, const char *call, ks_error *err) {
  if (rc == MPI_SUCCESS) return KS_OK;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) text[0] = '\0';
  return ks__err(err, KS_E_IO, "%s failed: %s", call, text);
}

ks_status ks_dist_agree(MPI_Comm comm, ks_status local, ks_error *err) {
  int rank, size;
  ks_status st = ks__mpi_check(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank", err);
  if (!st) st = ks__mpi_check(MPI_Comm_size(comm, &size), "MPI_Comm_size", err);
  if (st) return st;
  /* The lowest failing rank wins; `size` stands for "nobody failed". */
  int mine = local ? rank : size, first = size;
  st = ks__mpi_check(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm), "MPI_Allreduce", err);
  if (st || first == size) return st;
  ks_error e;
  ks_error_clear(&e);
  if (rank == first) {
    if (err) e = *err;
    e.code = local;
    if (!e.message[0]) snprintf(e.message, sizeof e.message, "%s", ks_strerror(local));
  }
  st = ks__mpi_check(MPI_Bcast(&e, (int)sizeof e, MPI_BYTE, first, comm), "MPI_Bcast", err);
  if (st) return st;
  if (err) *err = e;
  return e.code ? e.code : KS_E_IO;
}

void ks__wbuf_put(ks__wbuf *b, const void *data, size_t n) {
  if (b->failed || n == 0) return;
  size_t need;
  if (!ks__add_size(b->len, n, &need) || need > (size_t)INT32_MAX) {
    b->failed = KS_E_LIMIT;
    return;
  }
  if (need > b->cap) {
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < need) cap *= 2;
    uint8_t *p = ks__realloc(b->a, b->p, cap);
    if (!p) {
      b->failed = KS_E_NOMEM;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->len, data, n);
  b->len = need;
}

void ks__wbuf_i64(ks__wbuf *b, int64_t v) { ks__wbuf_put(b, &v, sizeof v); }

void ks__wbuf_free(ks__wbuf *b) {
  ks__free(b->a, b->p);
  b->p = NULL;
  b->len = b->cap = 0;
}
