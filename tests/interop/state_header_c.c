/*
 * A C program's training state, saved through the C state layer for
 * tests/python/test_state_header_c.py, which saves the same components from Python and compares
 * the two files' headers: a 4 -> 2 linear model ("fc.weight", "fc.bias"), AdamW stepped once, the
 * warmup-cosine scheduler stepped once, a timestamp after one batch, a dataset position, train
 * metrics (MulticlassAccuracy "acc", computed; MinMaxMetric over a MeanMetric "minmax", updated
 * twice and computed after each) and eval metrics under "val" (MeanSquaredError "mse"), run name
 * "run-1", seed 42, and the generators a Python program has (Python's and numpy's Mersenne
 * Twisters, torch's CPU generator, each as seeding it with 7 leaves it), registered as a component
 * under rng/0/ as a C program that embeds CPython would hold them.
 *
 * usage: state_header_c OUT.keepsake       saves the state
 *        state_header_c --resume IN.keepsake   builds the same components, loads IN (the Python program's
 *                                               file) and prints the report, the wrapper and the generators
 */
#include <stdio.h>
#include <string.h>

#include "keepsake/binding.h" /* ks_metric_inner_at, ks_metric_attr_at: what the wrapper holds */
#include "keepsake/keepsake.h"
#include "py_generators.h"

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
  m = NULL;
  if (!s && !label) /* torchmetrics' MinMaxMetric(base_metric=MeanMetric()) */
    s = ks_metric_create("MinMaxMetric", "{\"base_metric\":{\"class\":\"MeanMetric\",\"args\":{}}}", alloc,
                         &m, err);
  if (!s && !label) s = ks_metric_collection_add(*out, "minmax", m, err);
  if (s) ks_metric_free(m);
  return s;
}

/* ---- the generators of a Python program: Mersenne Twister words as CPython and numpy seed them ---- */

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
  ks_metric *minmax = ks_metric_collection_get(ks_state_train_metrics(st), "minmax");
  float v[2] = {2.0f, 6.0f};
  for (int i = 0; i < 2 && !s; i++) {
    s = ks_tensor_init(&in[0], KS_F32, 0, NULL, &v[i]);
    if (!s) s = ks_metric_update(minmax, in, 1, err);
    if (!s) s = ks_metric_compute(minmax, &r, err);
  }
  return s;
}

static double value(const ks_tensor *t) { return t && t->data ? ks_dtype_get_f64(t->dtype, t->data, 0) : -1.0; }

/* --resume: loads a checkpoint of the same components (the Python program's) and prints what the C
 * program holds then: the report, the wrapper's bounds and base metric, whether the generators are
 * the seed-7 ones. */
static ks_status resume_from(ks_state *st, py_generators *g, const char *path, ks_error *err) {
  ks_load_report *rep = NULL;
  ks_status s = ks_load_report_create(NULL, &rep, err);
  if (!s) s = ks_state_load(st, path, NULL, rep, err);
  if (!s) {
    ks_load_report_print(rep, stdout);
    ks_metric *m = ks_metric_collection_get(ks_state_train_metrics(st), "minmax");
    ks_metric *base = ks_metric_inner_at(m, 0, NULL);
    ks_tensor mx, mn, mean, wsum;
    if (ks_metric_attr_at(m, 0, NULL, NULL, &mx) || ks_metric_attr_at(m, 1, NULL, NULL, &mn) ||
        ks_metric_state_info(base, 0, NULL, NULL, &mean) || ks_metric_state_info(base, 1, NULL, NULL, &wsum))
      return KS_E_STATE;
    py_generators seeded;
    py_generators_seed(&seeded, 7);
    printf("minmax max_val=%g min_val=%g mean_value=%g weight=%g update_count=%lld\n", value(&mx), value(&mn),
           value(&mean), value(&wsum), (long long)ks_metric_update_count(base));
    printf("generators seed7 python=%d numpy=%d torch=%d\n", !memcmp(g->python, seeded.python, sizeof seeded.python),
           !memcmp(g->numpy, seeded.numpy, sizeof seeded.numpy), !memcmp(g->torch, seeded.torch, sizeof seeded.torch));
  }
  ks_load_report_free(rep);
  return s;
}

int main(int argc, char **argv) {
  int resume = argc == 3 && !strcmp(argv[1], "--resume");
  if (argc != 2 && !resume) {
    fprintf(stderr, "usage: state_header_c OUT.keepsake | --resume IN.keepsake\n");
    return 2;
  }
  ks_error err = {0};
  ks_state *st = NULL;
  ks_optimizer *opt = NULL;
  static ks_scheduler sched;
  static ks_timestamp ts;
  static py_generators gens;
  ks_stateful rng = {&gens, py_generators_save, py_generators_load};
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
    py_generators_seed(&gens, 7);
    ks_state_set_timestamp(st, &ts);
    s = ks_state_add_optimizer(st, "AdamW", opt, &err);
  }
  if (!s) s = ks_state_add_scheduler(st, "Sched", &sched, &err);
  if (!s) s = ks_state_add_dataset(st, "loader", &ds, &err);
  if (!s) s = ks_state_add_component(st, KS_ROOT_RNG, "0", &rng, &err);
  if (!s) s = ks_state_build_metrics(st, metrics, NULL, labels, 1, &err);
  if (!s && !resume) s = update_metrics(st, &err);
  if (!s && !resume) s = ks_state_save(st, argv[1], NULL, &err);
  if (!s && resume) s = resume_from(st, &gens, argv[2], &err);
  if (s) fprintf(stderr, "state_header_c: %s: %s\n", ks_strerror(s), err.message);
  ks_state_free(st);
  ks_optimizer_free(opt);
  return s ? 1 : 0;
}
