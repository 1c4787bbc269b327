/*
 * A C program's training state, saved through the C state layer for
 * tests/interop/state_header.py, which saves the same components from Python and compares the
 * two files' headers: a 4 -> 2 linear model ("fc.weight", "fc.bias"), AdamW stepped once, the
 * warmup-cosine scheduler stepped once, a timestamp after one batch, a dataset position, the
 * RNG, train metrics (MulticlassAccuracy "acc", computed) and eval metrics under "val"
 * (MeanSquaredError "mse"), run name "run-1", seed 42.
 *
 * usage: state_header_c OUT.keepsake
 */
#include <stdio.h>

#include "keepsake/keepsake.h"

static float weight[8] = {0.1f, -0.2f, 0.3f, 0.4f, -0.5f, 0.6f, 0.7f, -0.8f}, bias[2] = {0.01f, -0.02f};
static const float gweight[8] = {1, 2, 3, 4, 5, 6, 7, 8}, gbias[2] = {0.5f, -0.5f};

static ks_status metrics(void *ctx, const char *label, const ks_allocator *alloc, ks_metric_collection **out,
                         ks_error *err) {
  (void)ctx;
  ks_metric *m = NULL;
  ks_status s = ks_metric_collection_create(alloc, out, err);
  if (!s && !label) s = ks_metric_create("MulticlassAccuracy", "{\"num_classes\":2}", alloc, &m, err);
  if (!s && label) s = ks_metric_create("MeanSquaredError", "{}", alloc, &m, err);
  if (!s) s = ks_metric_collection_add(*out, label ? "mse" : "acc", m, err);
  else ks_metric_free(m);
  return s;
}

/* One update of each metric (and a compute of the train one, so its _computed is a tensor). */
static ks_status update_metrics(ks_state *st, ks_error *err) {
  float preds[6] = {0.9f, 0.1f, 0.2f, 0.8f, 0.6f, 0.4f}, p1[3] = {0.5f, 1.0f, 2.0f}, t1[3] = {0.0f, 1.0f, 2.5f};
  int64_t target[3] = {0, 1, 1}, s2[2] = {3, 2}, s1[1] = {3};
  ks_tensor in[2];
  ks_status s = ks_tensor_init(&in[0], KS_F32, 2, s2, preds);
  if (!s) s = ks_tensor_init(&in[1], KS_I64, 1, s1, target);
  ks_metric *acc = ks_metric_collection_get(ks_state_train_metrics(st), "acc");
  ks_metric *mse = ks_metric_collection_get(ks_state_eval_metrics(st, "val"), "mse");
  const ks_tensor *r;
  if (!s) s = ks_metric_update(acc, in, 2, err);
  if (!s) s = ks_metric_compute(acc, &r, err);
  if (!s) s = ks_tensor_init(&in[0], KS_F32, 1, s1, p1);
  if (!s) s = ks_tensor_init(&in[1], KS_F32, 1, s1, t1);
  if (!s) s = ks_metric_update(mse, in, 2, err);
  return s;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: state_header_c OUT.keepsake\n");
    return 2;
  }
  ks_error err = {0};
  ks_state *st = NULL;
  ks_optimizer *opt = NULL;
  static ks_scheduler sched;
  static ks_timestamp ts;
  static ks_rng rng;
  static ks_dataset_state ds = {1, 5, 7};
  const int64_t ws[2] = {2, 4}, bs[1] = {2};
  ks_tensor w, b;
  const char *labels[] = {"val"};
  ks_adamw_opts ao = {0.01, 0.9, 0.999, 1e-8, 0.01};
  ks_status s = ks_state_create("run-1", 42, NULL, &st, &err);
  if (!s) s = ks_tensor_init(&w, KS_F32, 2, ws, weight);
  if (!s) s = ks_tensor_init(&b, KS_F32, 1, bs, bias);
  if (!s) s = ks_state_add_tensor(st, "fc.weight", &w, &err);
  if (!s) s = ks_state_add_tensor(st, "fc.bias", &b, &err);
  if (!s) s = ks_optimizer_create_adamw(&ao, NULL, &opt, &err);
  if (!s) s = ks_optimizer_add_param(opt, weight, gweight, 2, ws, &err);
  if (!s) s = ks_optimizer_add_param(opt, bias, gbias, 1, bs, &err);
  if (!s) {
    ks_optimizer_step(opt);
    ks_scheduler_init(&sched, opt, 0.01, 2, 10, 0.0);
    ks_scheduler_step(&sched, opt);
    ks_timestamp_init(&ts);
    ks_timestamp_batch_done(&ts, 3, 0, 0.5);
    ks_rng_seed(&rng, 7);
    ks_state_set_timestamp(st, &ts);
    ks_state_set_rng(st, &rng);
    s = ks_state_add_optimizer(st, "AdamW", opt, &err);
  }
  if (!s) s = ks_state_add_scheduler(st, "Sched", &sched, &err);
  if (!s) s = ks_state_add_dataset(st, "loader", &ds, &err);
  if (!s) s = ks_state_build_metrics(st, metrics, NULL, labels, 1, &err);
  if (!s) s = update_metrics(st, &err);
  if (!s) s = ks_state_save(st, argv[1], NULL, &err);
  if (s) fprintf(stderr, "state_header_c: %s: %s\n", ks_strerror(s), err.message);
  ks_state_free(st);
  ks_optimizer_free(opt);
  return s ? 1 : 0;
}
