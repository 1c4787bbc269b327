/*
 * Checks for tests run under mpirun: a failed check prints the rank and the
 * line and aborts the whole job (MPI_Abort), so no rank is left waiting in a
 * collective and ctest sees the failure at once.
 */
#ifndef KS_MPITEST_H
#define KS_MPITEST_H

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include "keepsake/keepsake.h"

extern int mt_rank, mt_size;

#define MT_CHECK(cond, ...)                                                         \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      fprintf(stderr, "rank %d: %s:%d: check failed: %s: ", mt_rank, __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                                 \
      fprintf(stderr, "\n");                                                        \
      fflush(stderr);                                                               \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                 \
    }                                                                               \
  } while (0)

#define MT_OK(expr, errp)                                                           \
  do {                                                                              \
    ks_status mt_st_ = (expr);                                                      \
    char mt_buf_[1200];                                                             \
    MT_CHECK(mt_st_ == KS_OK, "%s", ks_error_format((errp), mt_buf_, sizeof mt_buf_)); \
  } while (0)

/* MPI_Init, rank and size. */
void mt_init(int *argc, char ***argv);
/* Nonzero when every rank passes the same value. */
int mt_same_on_all(uint64_t v);
/* The same over any communicator. */
int mt_same_on(MPI_Comm comm, uint64_t v);

/* |a - b| within 1e-5 relative (or both NaN, or equal infinities). */
int mt_close_enough(double a, double b);
/* Same update count; integer and cat states byte for byte; float states within mt_close_enough. */
void mt_expect_same_states(const char *name, const ks_metric *got, const ks_metric *want);
/* compute() of both: same status, results within mt_close_enough. */
void mt_expect_same_compute(const char *name, ks_metric *got, ks_metric *want);
/* A hash of every state's bytes and shape and of the update counts of a collection. */
uint64_t mt_states_hash(const ks_metric_collection *c);

#endif
