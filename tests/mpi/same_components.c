/*
 * The C half of tests/distributed/cross_layout.py's same-components check:
 *
 *   mpirun -np 2 same_components DIR
 *
 * Rank r saves with ks_dist_save a state of: run name "cross" and seed 0, a timestamp (epoch 1, batch
 * 5, sample 50), the data position "loader" (epoch 1, sample_in_epoch 100 + r, shuffle_seed 7) and
 * the train metrics "mean" (a MeanMetric fed r + 1 and r + 2) and "cat" (a CatMetric fed 10r and
 * 10r + 1): what the Python half saves through torchrun, so the two directories can be compared.
 */
#include <stdio.h>

#include "keepsake/dist.h"
#include "mpitest.h"

static void add_metric(ks_metric_collection *c, const char *name, const char *cls, float a, float b) {
  ks_metric *m;
  ks_error err;
  MT_OK(ks_metric_create(cls, NULL, NULL, &m, &err), &err);
  float v[2] = {a, b};
  int64_t two = 2;
  ks_tensor t;
  MT_CHECK(ks_tensor_init(&t, KS_F32, 1, &two, v) == KS_OK, "setup");
  MT_OK(ks_metric_update(m, &t, 1, &err), &err);
  MT_OK(ks_metric_collection_add(c, name, m, &err), &err);
}

/* The train metrics (label NULL): empty, filled below. */
static ks_status factory(void *ctx, const char *label, const ks_allocator *alloc, ks_metric_collection **out,
                         ks_error *err) {
  (void)ctx;
  (void)label;
  return ks_metric_collection_create(alloc, out, err);
}

int main(int argc, char **argv) {
  mt_init(&argc, &argv);
  MT_CHECK(argc == 2, "usage: same_components DIR");
  ks_error err;
  ks_error_clear(&err);
  ks_state *st;
  MT_OK(ks_state_create("cross", 0, NULL, &st, &err), &err);
  ks_timestamp ts;
  ks_timestamp_init(&ts);
  ts.epoch = 1, ts.batch = 5, ts.sample = 50;
  ks_state_set_timestamp(st, &ts);
  ks_dataset_state ds = {.epoch = 1, .sample_in_epoch = 100 + mt_rank, .shuffle_seed = 7};
  MT_OK(ks_state_add_dataset(st, "loader", &ds, &err), &err);
  MT_OK(ks_state_build_metrics(st, factory, NULL, NULL, 0, &err), &err);
  ks_metric_collection *c = ks_state_train_metrics(st);
  MT_CHECK(c != NULL, "no train metrics collection");
  add_metric(c, "mean", "MeanMetric", (float)mt_rank + 1, (float)mt_rank + 2);
  add_metric(c, "cat", "CatMetric", (float)mt_rank * 10, (float)mt_rank * 10 + 1);
  ks_statedict *sd;
  ks_meta *meta;
  MT_OK(ks_statedict_create(NULL, &sd, &err), &err);
  MT_OK(ks_meta_create(NULL, &meta, &err), &err);
  MT_OK(ks_state_to_state_dict(st, sd, meta, &err), &err);
  MT_OK(ks_dist_save(MPI_COMM_WORLD, argv[1], sd, meta, NULL, NULL, &err), &err);
  ks_meta_free(meta);
  ks_statedict_free(sd);
  ks_state_free(st);
  MPI_Finalize();
  return 0;
}
