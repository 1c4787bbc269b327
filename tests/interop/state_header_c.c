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

enum { MT_N = 624, TORCH_STATE_BYTES = 5056 };

static void mt_init(uint32_t *mt, uint32_t seed) { /* init_genrand */
  mt[0] = seed;
  for (uint32_t i = 1; i < MT_N; i++) mt[i] = 1812433253u * (mt[i - 1] ^ (mt[i - 1] >> 30)) + i;
}

static void mt_init_by_array(uint32_t *mt, const uint32_t *key, uint32_t n) { /* CPython's random.seed(int) */
  mt_init(mt, 19650218u);
  uint32_t i = 1, j = 0;
  for (uint32_t k = MT_N > n ? MT_N : n; k; k--) {
    mt[i] = (mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1664525u)) + key[j] + j;
    if (++i >= MT_N) mt[0] = mt[MT_N - 1], i = 1;
    if (++j >= n) j = 0;
  }
  for (uint32_t k = MT_N - 1; k; k--) {
    mt[i] = (mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1566083941u)) - i;
    if (++i >= MT_N) mt[0] = mt[MT_N - 1], i = 1;
  }
  mt[0] = 0x80000000u;
}

typedef struct generators {
  int64_t python[MT_N + 1]; /* random.getstate()[1]: the words, then the position */
  int64_t numpy[MT_N];      /* np.random.get_state()[1], widened to I64 as the Python package stores it */
  uint8_t torch[TORCH_STATE_BYTES];
} generators;

static void le_put(uint8_t *p, uint64_t v, int n) {
  for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void generators_seed(generators *g, uint32_t seed) {
  uint32_t mt[MT_N];
  mt_init_by_array(mt, &seed, 1);
  for (int i = 0; i < MT_N; i++) g->python[i] = mt[i];
  g->python[MT_N] = MT_N;
  mt_init(mt, seed);
  for (int i = 0; i < MT_N; i++) g->numpy[i] = mt[i];
  /* torch.manual_seed(seed)'s torch.get_rng_state(): its CPU generator's legacy state, little-endian:
   * u64 initial seed, i32 left = 1, i32 seeded = 1, u64 next = 0, u64 [624] the words, then the
   * normal-sample caches (40 zero bytes). */
  memset(g->torch, 0, sizeof g->torch);
  le_put(g->torch, seed, 8);
  le_put(g->torch + 8, 1, 4);
  le_put(g->torch + 12, 1, 4);
  for (int i = 0; i < MT_N; i++) le_put(g->torch + 24 + 8 * i, mt[i], 8);
}

static ks_status put_tensor(ks_statedict *dst, const char *prefix, const char *name, ks_dtype dt, int64_t n,
                            void *data, ks_error *err) {
  char k[256];
  ks_tensor t;
  snprintf(k, sizeof k, "%s%s", prefix, name);
  ks_status s = ks_tensor_init(&t, dt, 1, &n, data);
  return s ? s : ks_statedict_set_tensor(dst, k, &t, KS_COPY, err);
}

/* The entries the Python package writes for its generators (python/keepsake/_state/rng.py), in its order. */
static ks_status generators_save(void *ctx, ks_statedict *dst, const char *prefix, ks_error *err) {
  generators *g = ctx;
  char k[256];
#define KEY(name) (snprintf(k, sizeof k, "%s%s", prefix, name), k)
  ks_status s = ks_statedict_set_int(dst, KEY("python/version"), 3, err);
  if (!s) s = put_tensor(dst, prefix, "python/state", KS_I64, MT_N + 1, g->python, err);
  if (!s) s = ks_statedict_set_null(dst, KEY("python/gauss_next"), err);
  if (!s) s = ks_statedict_set_string(dst, KEY("numpy/kind"), "MT19937", err);
  if (!s) s = put_tensor(dst, prefix, "numpy/keys", KS_I64, MT_N, g->numpy, err);
  if (!s) s = ks_statedict_mark_leaf(dst, KEY("numpy/keys"), KS_LEAF_NDARRAY, err); /* an ndarray in Python */
  if (!s) s = ks_statedict_set_int(dst, KEY("numpy/pos"), MT_N, err);
  if (!s) s = ks_statedict_set_int(dst, KEY("numpy/has_gauss"), 0, err);
  if (!s) s = ks_statedict_set_float(dst, KEY("numpy/cached_gaussian"), 0.0, err);
  if (!s) s = put_tensor(dst, prefix, "torch", KS_U8, TORCH_STATE_BYTES, g->torch, err);
#undef KEY
  return s;
}

/* Reads one generator's words back: I64 [n] or U8 [n], as generators_save writes them. */
static ks_status get_tensor(const ks_statedict *src, const char *prefix, const char *name, ks_dtype dt, int64_t n,
                            void *out, ks_error *err) {
  char k[256];
  snprintf(k, sizeof k, "%s%s", prefix, name);
  const ks_tensor *t = ks_statedict_tensor(src, k);
  if (!t || t->dtype != dt || t->rank != 1 || t->shape[0] != n) {
    if (err) snprintf(err->message, sizeof err->message, "generator state '%s' is missing or of another shape", k);
    return KS_E_MISMATCH;
  }
  memcpy(out, t->data, t->nbytes);
  return KS_OK;
}

static ks_status generators_load(void *ctx, const ks_statedict *src, const char *prefix, ks_error *err) {
  generators *g = ctx, tmp;
  ks_status s = get_tensor(src, prefix, "python/state", KS_I64, MT_N + 1, tmp.python, err);
  if (!s) s = get_tensor(src, prefix, "numpy/keys", KS_I64, MT_N, tmp.numpy, err);
  if (!s) s = get_tensor(src, prefix, "torch", KS_U8, TORCH_STATE_BYTES, tmp.torch, err);
  if (!s) *g = tmp; /* all or nothing */
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
static ks_status resume_from(ks_state *st, generators *g, const char *path, ks_error *err) {
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
    generators seeded;
    generators_seed(&seeded, 7);
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
  static generators gens;
  ks_stateful rng = {&gens, generators_save, generators_load};
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
    generators_seed(&gens, 7);
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
