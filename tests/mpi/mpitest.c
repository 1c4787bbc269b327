#include "mpitest.h"

#include <math.h>
#include <string.h>

int mt_rank, mt_size;

void mt_init(int *argc, char ***argv) {
  MPI_Init(argc, argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &mt_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &mt_size);
}

int mt_same_on_all(uint64_t v) {
  unsigned long long lo = v, hi = v, mine = v;
  MPI_Allreduce(&mine, &lo, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&mine, &hi, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
  return lo == hi;
}

int mt_close_enough(double a, double b) {
  if (a == b || (isnan(a) && isnan(b))) return 1;
  return fabs(a - b) <= 1e-5 * fmax(1.0, fmax(fabs(a), fabs(b)));
}

/* Integer and cat states exactly (cat rows in the same order); float sums up to association. */
void mt_expect_same_states(const char *name, const ks_metric *got, const ks_metric *want) {
  MT_CHECK(ks_metric_update_count(got) == ks_metric_update_count(want), "%s: update count %lld, want %lld", name,
           (long long)ks_metric_update_count(got), (long long)ks_metric_update_count(want));
  for (size_t i = 0; i < ks_metric_state_count(want); i++) {
    const char *sname;
    ks_reduce red;
    ks_tensor a, b;
    MT_CHECK(ks_metric_state_info(got, i, &sname, &red, &a) == KS_OK, "setup");
    MT_CHECK(ks_metric_state_info(want, i, NULL, NULL, &b) == KS_OK, "setup");
    MT_CHECK(a.dtype == b.dtype && a.rank == b.rank && a.nbytes == b.nbytes, "%s/%s: layout differs", name, sname);
    for (int d = 0; d < a.rank; d++) MT_CHECK(a.shape[d] == b.shape[d], "%s/%s: shape differs", name, sname);
    if (!ks_dtype_is_float(a.dtype) || red == KS_REDUCE_CAT) {
      MT_CHECK(a.nbytes == 0 || memcmp(a.data, b.data, a.nbytes) == 0, "%s/%s: bytes differ", name, sname);
      continue;
    }
    size_t n = a.nbytes / ks_dtype_size(a.dtype);
    for (size_t k = 0; k < n; k++)
      MT_CHECK(mt_close_enough(ks_dtype_get_f64(a.dtype, a.data, k), ks_dtype_get_f64(b.dtype, b.data, k)),
               "%s/%s[%zu]: %.9g, want %.9g", name, sname, k, ks_dtype_get_f64(a.dtype, a.data, k),
               ks_dtype_get_f64(b.dtype, b.data, k));
  }
}

void mt_expect_same_compute(const char *name, ks_metric *got, ks_metric *want) {
  const ks_tensor *a, *b;
  ks_error e1, e2;
  ks_status s1 = ks_metric_compute(got, &a, &e1), s2 = ks_metric_compute(want, &b, &e2);
  MT_CHECK(s1 == s2, "%s: compute status %d, want %d", name, s1, s2);
  if (s1) return;
  MT_CHECK(a->dtype == b->dtype && a->nbytes == b->nbytes, "%s: result layout differs", name);
  size_t n = a->nbytes / ks_dtype_size(a->dtype);
  for (size_t k = 0; k < n; k++)
    MT_CHECK(mt_close_enough(ks_dtype_get_f64(a->dtype, a->data, k), ks_dtype_get_f64(b->dtype, b->data, k)),
             "%s: compute()[%zu] = %.9g, want %.9g", name, k, ks_dtype_get_f64(a->dtype, a->data, k),
             ks_dtype_get_f64(b->dtype, b->data, k));
}

/* A hash of every state's bytes and the update counts. */
uint64_t mt_states_hash(const ks_metric_collection *c) {
  uint64_t h = 0;
  for (size_t i = 0; i < ks_metric_collection_count(c); i++) {
    const ks_metric *m = ks_metric_collection_at(c, i, NULL);
    h = h * 1000003u + (uint64_t)ks_metric_update_count(m);
    for (size_t s = 0; s < ks_metric_state_count(m); s++) {
      ks_tensor t;
      MT_CHECK(ks_metric_state_info(m, s, NULL, NULL, &t) == KS_OK, "setup");
      h = h * 1000003u + ks_checksum(t.data, t.nbytes) + (uint64_t)t.shape[0];
    }
  }
  return h;
}


int mt_same_on(MPI_Comm comm, uint64_t v) {
  unsigned long long lo = v, hi = v, mine = v;
  MPI_Allreduce(&mine, &lo, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, comm);
  MPI_Allreduce(&mine, &hi, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, comm);
  return lo == hi;
}
