/* Private to the dist module: a growable byte buffer for the wire encoding. */
#ifndef KS_DIST_INTERNAL_H
#define KS_DIST_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "core/internal.h"
#include "keepsake/binding.h"
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

/*
 * ks_dist_save in its phases, so a rank's file can be written in between on another thread:
 * begin (collective: rank 0 prepares dir, the ranks agree, timestamps are compared), then each
 * rank writes its file (ks_shard_write_rank, no MPI), then commit (collective: agreement on
 * every rank's `local` result, barrier, gather of sizes and checksums, the index by rank 0).
 */
KS_NODISCARD ks_status ks__dist_save_begin(MPI_Comm comm, const char *dir, const ks_statedict *sd,
                                           const ks_dist_save_opts *opts, int *rank, int *size, ks_error *err);
KS_NODISCARD ks_status ks__dist_save_commit(MPI_Comm comm, const char *dir, ks_status local,
                                            const ks_shard_file_info *info, const ks_dist_save_opts *opts,
                                            ks_error *err);

#endif
