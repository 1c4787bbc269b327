/*
 * The C MPI metric sync against the Python one, bit for bit (run by
 * tests/distributed/sync_same_bits.py, which documents the whole check):
 *
 *   mpirun -np N sync_bits DIR
 *
 * DIR holds what the Python job (torchrun, the same N ranks) wrote: for each rank r and metric
 * <name>, local-<r>-<name>.keepsake (that rank's torchmetrics states before the sync: state_dict/
 * <state> and update_count, as keepsake.distributed.sync encodes them) and synced-<r>-<name>.keepsake
 * (the same after keepsake.distributed.sync). Each rank loads its local states into catalogue
 * metrics, runs ks_dist_sync, and checks every state has the dtype, shape and bytes, and the
 * metric the update count, of Python's synced file.
 */
#include <stdio.h>
#include <string.h>

#include "keepsake/dist.h"
#include "mpitest.h"

/* Keep in step with METRICS in tests/distributed/sync_same_bits.py. */
static const struct {
  const char *name, *cls, *args;
} metrics[] = {
    {"acc", "MulticlassAccuracy", "{\"num_classes\":5}"},
    {"mse", "MeanSquaredError", NULL},
    {"auroc", "MulticlassAUROC", "{\"num_classes\":5}"},
    {"cat", "CatMetric", NULL},
    {"mean", "MeanMetric", NULL},
    {"max", "MaxMetric", NULL},
};
#define N_METRICS (sizeof metrics / sizeof metrics[0])

static ks_statedict *load(const char *dir, const char *what, const char *name) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s-%d-%s.keepsake", dir, what, mt_rank, name);
  ks_statedict *sd = NULL;
  ks_meta *meta = NULL;
  ks_error err;
  MT_OK(ks_load(path, NULL, &sd, &meta, &err), &err);
  ks_meta_free(meta);
  return sd;
}

static int64_t update_count(const ks_statedict *sd) {
  ks_entry e;
  MT_CHECK(ks_statedict_get(sd, "update_count", &e) == KS_OK && e.kind == KS_VAL_INT, "no update_count");
  return e.i;
}

int main(int argc, char **argv) {
  mt_init(&argc, &argv);
  MT_CHECK(argc == 2, "usage: sync_bits DIR");
  ks_error err;
  ks_metric_collection *c;
  MT_OK(ks_metric_collection_create(NULL, &c, &err), &err);
  for (size_t i = 0; i < N_METRICS; i++) {
    ks_metric *m;
    MT_OK(ks_metric_create(metrics[i].cls, metrics[i].args, NULL, &m, &err), &err);
    ks_statedict *sd = load(argv[1], "local", metrics[i].name);
    MT_OK(ks_metric_load_state_dict(m, sd, "state_dict/", KS_METRIC_SCHEMA_VERSION, 0, NULL, NULL, &err), &err);
    MT_OK(ks_metric_restore_computed(m, NULL, update_count(sd), &err), &err);
    ks_statedict_free(sd);
    MT_OK(ks_metric_collection_add(c, metrics[i].name, m, &err), &err);
  }
  MT_OK(ks_dist_sync(c, MPI_COMM_WORLD, NULL, NULL, &err), &err);
  size_t n_states = 0, n_bytes = 0;
  for (size_t i = 0; i < N_METRICS; i++) {
    const char *name;
    const ks_metric *m = ks_metric_collection_at(c, i, &name);
    ks_statedict *want = load(argv[1], "synced", name);
    MT_CHECK(ks_metric_update_count(m) == update_count(want), "%s: update count %lld, Python's %lld", name,
             (long long)ks_metric_update_count(m), (long long)update_count(want));
    for (size_t k = 0; k < ks_metric_state_count(m); k++) {
      const char *state;
      ks_tensor got;
      MT_OK(ks_metric_state_info(m, k, &state, NULL, &got), &err);
      char key[256];
      snprintf(key, sizeof key, "state_dict/%s", state);
      ks_entry e;
      MT_CHECK(ks_statedict_get(want, key, &e) == KS_OK && e.kind == KS_VAL_TENSOR, "%s: Python has no %s", name,
               key);
      const ks_tensor *w = &e.tensor;
      MT_CHECK(got.dtype == w->dtype, "%s.%s: dtype %s, Python's %s", name, state, ks_dtype_name(got.dtype),
               ks_dtype_name(w->dtype));
      MT_CHECK(got.rank == w->rank && !memcmp(got.shape, w->shape, (size_t)got.rank * sizeof got.shape[0]),
               "%s.%s: rank %d shape[0] %lld, Python's rank %d shape[0] %lld", name, state, got.rank,
               (long long)(got.rank ? got.shape[0] : -1), w->rank, (long long)(w->rank ? w->shape[0] : -1));
      MT_CHECK(got.nbytes == w->nbytes && (!got.nbytes || !memcmp(got.data, w->data, got.nbytes)),
               "%s.%s: the synced bytes differ from Python's", name, state);
      n_states++;
      n_bytes += got.nbytes;
    }
    ks_statedict_free(want);
  }
  MT_CHECK(mt_same_on_all(mt_states_hash(c)), "ranks hold different states after the C sync");
  if (mt_rank == 0)
    printf("sync_bits: %zu metrics, %zu states (%zu bytes on rank 0): the C MPI sync and the Python sync agree bit "
           "for bit at %d ranks\n",
           N_METRICS, n_states, n_bytes, mt_size);
  ks_metric_collection_free(c);
  MPI_Finalize();
  return 0;
}
