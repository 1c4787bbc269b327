/*
 * The C half of tests/distributed/cross_layout.py's same-components check:
 *
 *   mpirun -np 2 same_components DIR
 *
 * Rank r saves with ks_dist_save (ks_state_to_state_dict) the components tests/interop/state_header_c.c
 * describes, replicated ones the same on every rank: the 4 -> 2 linear model ("fc.weight", "fc.bias"),
 * AdamW stepped once, the warmup-cosine scheduler stepped once, run name "cross" and seed 0, a timestamp
 * (epoch 1, batch 5, sample 50); and its own: the data position "loader" (epoch 1, sample_in_epoch 100
 * + r, shuffle_seed 7), the generators a Python program has (Python's and numpy's Mersenne Twisters
 * seeded with 100 + r as CPython and numpy seed them, and a torch CPU generator state: a component
 * under rng/0/, as tests/interop/state_header_c.c registers them), the train metrics "mean" (a
 * MeanMetric fed r + 1 and r + 2), "cat" (a CatMetric fed 10r and 10r + 1) and "minmax" (torchmetrics'
 * MinMaxMetric over a MeanMetric, fed r + 1 and r + 2) and the eval metric "mse" under "val" (a
 * MeanSquaredError fed r + {0.5, 1, 2} against r + {0, 1, 2.5}): what the Python half saves through
 * torchrun, so the two directories can be compared.
 */
#include <stdio.h>
#include <string.h>

#include "keepsake/dist.h"
#include "mpitest.h"
#include "../interop/py_generators.h" /* the generators of a Python program */

static float weight[8] = {0.1f, -0.2f, 0.3f, 0.4f, -0.5f, 0.6f, 0.7f, -0.8f}, bias[2] = {0.01f, -0.02f};
static const float gweight[8] = {1, 1, 1, 1, 1, 1, 1, 1}, gbias[2] = {1, 1};

static ks_tensor vec(float *v, int64_t *n) {
  ks_tensor t;
  MT_CHECK(ks_tensor_init(&t, KS_F32, 1, n, v) == KS_OK, "setup");
  return t;
}

static void add_metric(ks_metric_collection *c, const char *name, const char *cls, const char *args, float a,
                       float b) {
  ks_metric *m;
  ks_error err;
  MT_OK(ks_metric_create(cls, args, NULL, &m, &err), &err);
  float v[2] = {a, b};
  int64_t two = 2;
  ks_tensor t = vec(v, &two);
  MT_OK(ks_metric_update(m, &t, 1, &err), &err);
  MT_OK(ks_metric_collection_add(c, name, m, &err), &err);
}

/* The eval metric under "val": one update of (preds, target). */
static void add_mse(ks_metric_collection *c) {
  ks_metric *m;
  ks_error err;
  MT_OK(ks_metric_create("MeanSquaredError", "{}", NULL, &m, &err), &err);
  float r = (float)mt_rank, p[3] = {r + 0.5f, r + 1.0f, r + 2.0f}, t[3] = {r, r + 1.0f, r + 2.5f};
  int64_t three = 3;
  ks_tensor in[2] = {vec(p, &three), vec(t, &three)};
  MT_OK(ks_metric_update(m, in, 2, &err), &err);
  MT_OK(ks_metric_collection_add(c, "mse", m, &err), &err);
}

/* The metric collections (train: label NULL; eval: "val"): empty, filled below. */
static ks_status factory(void *ctx, const char *label, const ks_allocator *alloc, ks_metric_collection **out,
                         ks_error *err) {
  (void)ctx;
  (void)label;
  return ks_metric_collection_create(alloc, out, err);
}

/* The replicated components: the model, AdamW stepped once with lr 0.01, then the scheduler
   (warmup 2, t_max 10) stepped once, which sets the optimizer's lr to 0.005. */
static ks_optimizer *add_model(ks_state *st, ks_scheduler *sched) {
  ks_error err;
  ks_optimizer *opt;
  const int64_t ws[2] = {2, 4}, bs[1] = {2};
  ks_tensor w, b;
  ks_adamw_opts ao = {0.01, 0.9, 0.999, 1e-8, 0.01};
  MT_CHECK(ks_tensor_init(&w, KS_F32, 2, ws, weight) == KS_OK && ks_tensor_init(&b, KS_F32, 1, bs, bias) == KS_OK,
           "setup");
  MT_OK(ks_state_add_tensor(st, "fc.weight", &w, &err), &err);
  MT_OK(ks_state_add_tensor(st, "fc.bias", &b, &err), &err);
  MT_OK(ks_optimizer_create_adamw(&ao, NULL, &opt, &err), &err);
  MT_OK(ks_optimizer_add_param(opt, weight, gweight, 2, ws, &err), &err);
  MT_OK(ks_optimizer_add_param(opt, bias, gbias, 1, bs, &err), &err);
  ks_optimizer_step(opt);
  ks_scheduler_init(sched, opt, 0.01, 2, 10, 0.0);
  ks_scheduler_step(sched, opt);
  MT_OK(ks_state_add_optimizer(st, "AdamW", opt, &err), &err);
  MT_OK(ks_state_add_scheduler(st, "Sched", sched, &err), &err);
  return opt;
}

int main(int argc, char **argv) {
  mt_init(&argc, &argv);
  MT_CHECK(argc == 2, "usage: same_components DIR");
  ks_error err;
  ks_error_clear(&err);
  ks_state *st;
  MT_OK(ks_state_create("cross", 0, NULL, &st, &err), &err);
  static ks_scheduler sched;
  ks_optimizer *opt = add_model(st, &sched);
  ks_timestamp ts;
  ks_timestamp_init(&ts);
  ts.epoch = 1, ts.batch = 5, ts.sample = 50;
  ks_state_set_timestamp(st, &ts);
  static py_generators gens;
  py_generators_seed(&gens, 100 + (uint32_t)mt_rank);
  ks_stateful rng = {&gens, py_generators_save, py_generators_load};
  MT_OK(ks_state_add_component(st, KS_ROOT_RNG, "0", &rng, &err), &err);
  ks_dataset_state ds = {.epoch = 1, .sample_in_epoch = 100 + mt_rank, .shuffle_seed = 7};
  MT_OK(ks_state_add_dataset(st, "loader", &ds, &err), &err);
  const char *labels[] = {"val"};
  MT_OK(ks_state_build_metrics(st, factory, NULL, labels, 1, &err), &err);
  ks_metric_collection *c = ks_state_train_metrics(st);
  MT_CHECK(c != NULL && ks_state_eval_metrics(st, "val") != NULL, "no metrics collections");
  add_metric(c, "mean", "MeanMetric", NULL, (float)mt_rank + 1, (float)mt_rank + 2);
  add_metric(c, "cat", "CatMetric", NULL, (float)mt_rank * 10, (float)mt_rank * 10 + 1);
  add_metric(c, "minmax", "MinMaxMetric", "{\"base_metric\":{\"class\":\"MeanMetric\",\"args\":{}}}",
             (float)mt_rank + 1, (float)mt_rank + 2);
  add_mse(ks_state_eval_metrics(st, "val"));
  ks_statedict *sd;
  ks_meta *meta;
  MT_OK(ks_statedict_create(NULL, &sd, &err), &err);
  MT_OK(ks_meta_create(NULL, &meta, &err), &err);
  MT_OK(ks_state_to_state_dict(st, sd, meta, &err), &err);
  MT_OK(ks_dist_save(MPI_COMM_WORLD, argv[1], sd, meta, NULL, NULL, &err), &err);
  ks_meta_free(meta);
  ks_statedict_free(sd);
  ks_state_free(st);
  ks_optimizer_free(opt);
  MPI_Finalize();
  return 0;
}
