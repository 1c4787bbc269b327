/*
 * Metric engine behaviour over the whole catalogue: registry and arguments,
 * state-dict round trips, schema migration, dtype policy, merge algebra,
 * clone/reset, the collection, and allocation-failure sweeps.
 */
#include <stdio.h>

#include "metric_helpers.h"

enum { K_AGG, K_BIN, K_MC, K_ML, K_REG, K_LM };

typedef struct spec {
  const char *cls;
  const char *args;
  int kind;
  int64_t width; /* classes, labels or vocabulary */
} spec;

static const spec k_specs[] = {
    {"MeanMetric", NULL, K_AGG, 0},
    {"SumMetric", NULL, K_AGG, 0},
    {"MaxMetric", NULL, K_AGG, 0},
    {"MinMetric", NULL, K_AGG, 0},
    {"CatMetric", NULL, K_AGG, 0},
    {"BinaryAccuracy", NULL, K_BIN, 0},
    {"BinaryPrecision", "{\"threshold\":0.3}", K_BIN, 0},
    {"BinaryRecall", NULL, K_BIN, 0},
    {"BinaryF1Score", NULL, K_BIN, 0},
    {"BinaryConfusionMatrix", "{\"normalize\":\"all\"}", K_BIN, 0},
    {"BinaryAUROC", NULL, K_BIN, 0},
    {"BinaryAUROC", "{\"thresholds\":7}", K_BIN, 0},
    {"BinaryAveragePrecision", NULL, K_BIN, 0},
    {"BinaryAveragePrecision", "{\"thresholds\":[0.1,0.5,0.9]}", K_BIN, 0},
    {"MulticlassAccuracy", "{\"num_classes\":4}", K_MC, 4},
    {"MulticlassAccuracy", "{\"num_classes\":4,\"average\":\"micro\"}", K_MC, 4},
    {"MulticlassPrecision", "{\"num_classes\":4,\"average\":\"weighted\",\"top_k\":2}", K_MC, 4},
    {"MulticlassF1Score", "{\"num_classes\":8,\"top_k\":3,\"ignore_index\":-1}", K_MC, 8},
    {"MulticlassRecall", "{\"num_classes\":4,\"average\":null}", K_MC, 4},
    {"MulticlassF1Score", "{\"num_classes\":4,\"ignore_index\":0}", K_MC, 4},
    {"MulticlassConfusionMatrix", "{\"num_classes\":4,\"normalize\":\"pred\"}", K_MC, 4},
    {"MulticlassAUROC", "{\"num_classes\":4}", K_MC, 4},
    {"MulticlassAUROC", "{\"num_classes\":4,\"thresholds\":5,\"average\":\"weighted\"}", K_MC, 4},
    {"MulticlassJaccardIndex", "{\"num_classes\":4}", K_MC, 4},
    {"MultilabelAccuracy", "{\"num_labels\":3}", K_ML, 3},
    {"MultilabelF1Score", "{\"num_labels\":3,\"average\":\"micro\"}", K_ML, 3},
    {"MeanSquaredError", NULL, K_REG, 0},
    {"MeanSquaredError", "{\"squared\":false}", K_REG, 0},
    {"MeanAbsoluteError", NULL, K_REG, 0},
    {"MeanMetric", "{\"nan_strategy\":2.5}", K_AGG, 0},
    {"MaxMetric", "{\"nan_strategy\":\"disable\"}", K_AGG, 0},
    {"R2Score", NULL, K_REG, 0},
    {"LanguageCrossEntropy", NULL, K_LM, 6},
    {"LanguagePerplexity", NULL, K_LM, 6},
};
#define N_SPECS (sizeof k_specs / sizeof k_specs[0])
#define ROWS 8

/* One batch of valid inputs for a spec; buffers live in the struct. */
typedef struct batch {
  float p[ROWS * 8];
  int64_t t[ROWS * 8];
  float tf[ROWS];
  ks_tensor in[2];
  size_t n;
} batch;

static void make_batch(const spec *s, uint64_t seed, batch *b) {
  uint64_t r = seed * 7919 + 17;
  for (size_t i = 0; i < ROWS * 8; i++) b->p[i] = mt_rand(&r) * 4 - 2;
  int64_t w = s->width;
  switch (s->kind) {
    case K_AGG:
      b->in[0] = mt_tensor(KS_F32, b->p, 1, ROWS, 0);
      b->n = 1;
      return;
    case K_BIN:
      for (size_t i = 0; i < ROWS; i++) b->p[i] = mt_rand(&r), b->t[i] = mt_rand(&r) < 0.5f;
      b->in[0] = mt_tensor(KS_F32, b->p, 1, ROWS, 0);
      b->in[1] = mt_tensor(KS_I64, b->t, 1, ROWS, 0);
      break;
    case K_MC:
    case K_LM:
      for (size_t i = 0; i < ROWS; i++) b->t[i] = (int64_t)(mt_rand(&r) * (float)w) % w;
      if (s->kind == K_LM) b->t[seed % ROWS] = -100;
      b->in[0] = mt_tensor(KS_F32, b->p, 2, ROWS, w);
      b->in[1] = mt_tensor(KS_I64, b->t, 1, ROWS, 0);
      break;
    case K_ML:
      for (size_t i = 0; i < (size_t)(ROWS * w); i++) b->t[i] = mt_rand(&r) < 0.5f;
      b->in[0] = mt_tensor(KS_F32, b->p, 2, ROWS, w);
      b->in[1] = mt_tensor(KS_I64, b->t, 2, ROWS, w);
      break;
    default:
      for (size_t i = 0; i < ROWS; i++) b->tf[i] = mt_rand(&r) * 3;
      b->in[0] = mt_tensor(KS_F32, b->p, 1, ROWS, 0);
      b->in[1] = mt_tensor(KS_F32, b->tf, 1, ROWS, 0);
  }
  b->n = 2;
}

static ks_metric *fed(const spec *s, uint64_t from, uint64_t to) {
  ks_metric *m = mt_make(s->cls, s->args);
  for (uint64_t k = from; k < to; k++) {
    batch b;
    make_batch(s, k, &b);
    mt_update(m, b.in, b.n);
  }
  return m;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Element i of a computed tensor; CatMetric results compare as multisets (merge order is not commutative). */
static double *sorted_values(const ks_tensor *t, int sort) {
  size_t n = ks_tensor_numel(t);
  double *v = malloc((n ? n : 1) * sizeof *v);
  for (size_t i = 0; i < n; i++) v[i] = ks_dtype_get_f64(t->dtype, t->data, i);
  if (sort) qsort(v, n, sizeof *v, cmp_double);
  return v;
}

static void assert_same_compute(ks_metric *a, ks_metric *b, const spec *s) {
  const ks_tensor *x, *y;
  assert_int_equal(ks_metric_compute(a, &x, NULL), KS_OK);
  assert_int_equal(ks_metric_compute(b, &y, NULL), KS_OK);
  assert_int_equal(x->dtype, y->dtype);
  assert_true(ks_tensor_same_shape(x, y));
  int multiset = !strcmp(s->cls, "CatMetric");
  double *u = sorted_values(x, multiset), *v = sorted_values(y, multiset);
  for (size_t i = 0; i < ks_tensor_numel(x); i++)
    if (!mt_close(u[i], v[i])) fail_msg("%s %s: compute differs at %zu", s->cls, s->args ? s->args : "", i);
  free(u);
  free(v);
}

/* ---- registry and arguments ---- */

static void registry_lists_every_class_and_builds_it(void **st) {
  (void)st;
  assert_true(ks_metric_class_count() >= 26);
  assert_null(ks_metric_class_name(ks_metric_class_count()));
  for (size_t i = 0; i < N_SPECS; i++) {
    ks_metric *m = mt_make(k_specs[i].cls, k_specs[i].args);
    assert_string_equal(ks_metric_class(m), k_specs[i].cls);
    ks_metric *again = mt_make(k_specs[i].cls, ks_metric_args_json(m)); /* canonical args rebuild it */
    assert_string_equal(ks_metric_args_json(again), ks_metric_args_json(m));
    ks_metric_free(again);
    ks_metric_free(m);
  }
}

static void create_rejects_bad_classes_and_arguments(void **st) {
  (void)st;
  static const struct {
    const char *cls, *args;
    ks_status code;
  } bad[] = {
      {"NoSuchMetric", NULL, KS_E_NOTFOUND},
      {"MulticlassAccuracy", NULL, KS_E_INVALID},
      {"MulticlassAccuracy", "{\"num_classes\":1}", KS_E_INVALID},
      {"MulticlassAccuracy", "{\"num_classes\":3,\"num_classes\":4}", KS_E_INVALID},
      {"MulticlassAccuracy", "{\"num_classes\":3,\"colour\":1}", KS_E_INVALID},
      {"MulticlassAccuracy", "{\"num_classes\":3,\"average\":\"median\"}", KS_E_INVALID},
      {"MulticlassAccuracy", "{\"num_classes\":3,\"top_k\":4}", KS_E_INVALID},
      {"MulticlassAccuracy", "{\"num_classes\":3,\"multidim_average\":\"samplewise\"}", KS_E_UNSUPPORTED},
      {"MulticlassAUROC", "{\"num_classes\":3,\"average\":\"micro\"}", KS_E_UNSUPPORTED},
      {"BinaryAccuracy", "{\"threshold\":1.5}", KS_E_INVALID},
      {"BinaryAccuracy", "[1]", KS_E_INVALID},
      {"BinaryAccuracy", "{\"threshold\":", KS_E_INVALID},
      {"BinaryAUROC", "{\"thresholds\":1}", KS_E_INVALID},
      {"BinaryAUROC", "{\"thresholds\":[0.5,2]}", KS_E_INVALID},
      {"MeanSquaredError", "{\"squared\":1}", KS_E_INVALID},
      {"MeanMetric", "{\"nan_strategy\":\"explode\"}", KS_E_INVALID},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ks_metric *m = (ks_metric *)1;
    ks_error e;
    ks_status s = ks_metric_create(bad[i].cls, bad[i].args, NULL, &m, &e);
    if (s != bad[i].code) fail_msg("%s %s: got %s", bad[i].cls, bad[i].args, ks_status_name(s));
    assert_ptr_equal(m, (ks_metric *)1);
  }
}

static void create_accepts_and_ignores_base_class_options(void **st) {
  (void)st;
  ks_metric *m =
      mt_make("MulticlassAccuracy", "{\"num_classes\":3,\"validate_args\":false,\"dist_sync_on_step\":true}");
  assert_string_equal(ks_metric_args_json(m),
                      "{\"average\":\"macro\",\"ignore_index\":null,\"multidim_average\":\"global\",\"num_classes\":3,"
                      "\"top_k\":1}");
  ks_metric_free(m);
}

/* ---- state dicts ---- */

static void state_dict_round_trip_preserves_compute(void **st) {
  (void)st;
  for (size_t i = 0; i < N_SPECS; i++) {
    ks_metric *a = fed(&k_specs[i], 0, 3), *b = mt_make(k_specs[i].cls, k_specs[i].args);
    ks_statedict *sd = mt_snapshot(a);
    int mig = -1, conv = -1;
    assert_int_equal(ks_metric_load_state_dict(b, sd, "", 2, 0, &mig, &conv, NULL), KS_OK);
    assert_int_equal(mig, 0);
    assert_int_equal(conv, 0);
    assert_true(mt_unchanged(b, sd));
    assert_same_compute(a, b, &k_specs[i]);
    ks_statedict_free(sd);
    ks_metric_free(a);
    ks_metric_free(b);
  }
}

static void load_migrates_pre_1_1_aggregation_names(void **st) {
  (void)st;
  static const char *const cls[] = {"MeanMetric", "SumMetric", "MaxMetric", "MinMetric"};
  static const char *const now[] = {"mean_value", "sum_value", "max_value", "min_value"};
  for (int i = 0; i < 4; i++) {
    ks_metric *m = mt_make(cls[i], NULL);
    ks_statedict *sd;
    float v = 6.0f, w = 3.0f;
    assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
    ks_tensor tv = mt_tensor(KS_F32, &v, 0, 0, 0), tw = mt_tensor(KS_F32, &w, 0, 0, 0);
    assert_int_equal(ks_statedict_set_tensor(sd, "m.value", &tv, KS_COPY, NULL), KS_OK);
    assert_int_equal(ks_statedict_set_tensor(sd, "m.weight", &tw, KS_COPY, NULL), KS_OK);
    int mig = 0;
    assert_int_equal(ks_metric_load_state_dict(m, sd, "m.", 1, 0, &mig, NULL, NULL), KS_OK);
    assert_int_equal(mig, 1);
    const char *name;
    ks_tensor cur;
    assert_int_equal(ks_metric_state_info(m, 0, &name, NULL, &cur), KS_OK);
    assert_string_equal(name, now[i]);
    assert_true(*(float *)cur.data == 6.0f);
    assert_true(mt_close(mt_value(m, 0), i == 0 ? 2.0 : 6.0));
    /* Version 2 does not know `value`. */
    ks_metric *fresh = mt_make(cls[i], NULL);
    assert_int_equal(ks_metric_load_state_dict(fresh, sd, "m.", 2, 0, NULL, NULL, NULL), KS_E_NOTFOUND);
    ks_metric_free(fresh);
    ks_statedict_free(sd);
    ks_metric_free(m);
  }
}

static void load_reshapes_mse_and_mae_sums(void **st) {
  (void)st;
  ks_metric *mse = mt_make("MeanSquaredError", NULL), *mae = mt_make("MeanAbsoluteError", NULL);
  float s = 8.0f;
  int64_t n = 4;
  ks_statedict *sd;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  ks_tensor old_sum = mt_tensor(KS_F32, &s, 0, 0, 0), vec_sum = mt_tensor(KS_F32, &s, 1, 1, 0);
  ks_tensor total = mt_tensor(KS_I64, &n, 0, 0, 0);
  assert_int_equal(ks_statedict_set_tensor(sd, "sum_squared_error", &old_sum, KS_COPY, NULL),
                   KS_OK); /* () before 1.x */
  assert_int_equal(ks_statedict_set_tensor(sd, "sum_abs_error", &old_sum, KS_COPY, NULL),
                   KS_OK); /* () before 1.5, (1,) since */
  assert_int_equal(ks_statedict_set_tensor(sd, "total", &total, KS_COPY, NULL), KS_OK);
  int mig = 0;
  assert_int_equal(ks_metric_load_state_dict(mse, sd, "", 1, 0, &mig, NULL, NULL), KS_OK);
  assert_int_equal(mig, 1);
  ks_tensor cur;
  assert_int_equal(ks_metric_state_info(mse, 0, NULL, NULL, &cur), KS_OK);
  assert_int_equal(cur.rank, 1);
  assert_int_equal(cur.shape[0], 1);
  assert_true(mt_close(mt_value(mse, 0), 2.0));
  mig = 0;
  assert_int_equal(ks_metric_load_state_dict(mae, sd, "", 2, 0, &mig, NULL, NULL), KS_OK);
  assert_int_equal(mig, 1);
  assert_int_equal(ks_metric_state_info(mae, 0, NULL, NULL, &cur), KS_OK);
  assert_int_equal(cur.rank, 1);
  assert_int_equal(cur.shape[0], 1);
  assert_true(mt_close(mt_value(mae, 0), 2.0));
  assert_int_equal(ks_statedict_set_tensor(sd, "sum_abs_error", &vec_sum, KS_COPY, NULL), KS_OK);
  assert_int_equal(ks_metric_load_state_dict(mae, sd, "", 2, 0, &mig, NULL, NULL), KS_OK);
  assert_int_equal(mig, 0);
  ks_statedict_free(sd);
  ks_metric_free(mse);
  ks_metric_free(mae);
}

static ks_status load_one_scalar(ks_metric *m, ks_dtype dt, const void *v, int allow, int *conv) {
  ks_statedict *sd;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  ks_tensor t = mt_tensor(dt, v, 0, 0, 0);
  assert_int_equal(ks_statedict_set_tensor(sd, "sum_value", &t, KS_COPY, NULL), KS_OK);
  ks_status s = ks_metric_load_state_dict(m, sd, "", 2, allow, NULL, conv, NULL);
  ks_statedict_free(sd);
  return s;
}

static void load_widens_but_refuses_narrowing_unless_allowed(void **st) {
  (void)st;
  ks_metric *m = mt_make("SumMetric", NULL);
  uint16_t h = (uint16_t)ks_test_to_bits(KS_F16, 1.5f);
  double d = 2.25;
  int conv = 0;
  assert_int_equal(load_one_scalar(m, KS_F16, &h, 0, &conv), KS_OK);
  assert_int_equal(conv, 1);
  assert_true(mt_value(m, 0) == 1.5);
  ks_statedict *before = mt_snapshot(m);
  assert_int_equal(load_one_scalar(m, KS_F64, &d, 0, &conv), KS_E_DTYPE);
  assert_true(mt_unchanged(m, before));
  assert_int_equal(load_one_scalar(m, KS_F64, &d, 1, &conv), KS_OK);
  assert_true(mt_value(m, 0) == 2.25);
  ks_statedict_free(before);
  ks_metric_free(m);
}

static void load_rejects_missing_misshapen_or_future_states_unchanged(void **st) {
  (void)st;
  ks_metric *src = fed(&k_specs[14], 0, 2), *m = fed(&k_specs[14], 5, 6);
  ks_statedict *good = mt_snapshot(src), *before = mt_snapshot(m);
  ks_error e;
  assert_int_equal(ks_metric_load_state_dict(m, good, "", 3, 0, NULL, NULL, &e), KS_E_VERSION);
  assert_int_equal(ks_metric_load_state_dict(m, good, "x/", 2, 0, NULL, NULL, &e), KS_E_NOTFOUND);
  assert_int_equal(ks_statedict_remove(good, "fn"), KS_OK);
  assert_int_equal(ks_metric_load_state_dict(m, good, "", 2, 0, NULL, NULL, &e), KS_E_NOTFOUND);
  assert_string_equal(e.key, "fn");
  int64_t wrong[3] = {0, 0, 0};
  ks_tensor t = mt_tensor(KS_I64, wrong, 1, 3, 0);
  assert_int_equal(ks_statedict_set_tensor(good, "fn", &t, KS_COPY, NULL), KS_OK);
  assert_int_equal(ks_metric_load_state_dict(m, good, "", 2, 0, NULL, NULL, &e), KS_E_SHAPE);
  assert_int_equal(ks_statedict_set_int(good, "fn", 3, NULL), KS_OK);
  assert_int_equal(ks_metric_load_state_dict(m, good, "", 2, 0, NULL, NULL, &e), KS_E_INVALID);
  assert_true(mt_unchanged(m, before));
  ks_statedict_free(good);
  ks_statedict_free(before);
  ks_metric_free(src);
  ks_metric_free(m);
}

static void load_rejects_curve_preds_and_target_of_different_lengths(void **st) {
  (void)st;
  float p[3] = {0.1f, 0.6f, 0.8f};
  int64_t y[3] = {0, 1, 1}, y5[5] = {0, 1, 1, 0, 1};
  ks_metric *src = mt_make("BinaryAUROC", NULL), *m = mt_make("BinaryAUROC", NULL);
  mt_update2(src, F32V(p), I64V(y));
  mt_update2(m, F32V(p), I64V(y));
  ks_statedict *sd = mt_snapshot(src), *before = mt_snapshot(m);
  ks_tensor t = I64V(y5);
  assert_int_equal(ks_statedict_set_tensor(sd, "target", &t, KS_COPY, NULL), KS_OK);
  ks_error e;
  assert_int_equal(ks_metric_load_state_dict(m, sd, "", 2, 0, NULL, NULL, &e), KS_E_SHAPE);
  assert_true(mt_unchanged(m, before));
  assert_true(mt_close(mt_value(m, 0), 1.0));
  ks_statedict_free(sd);
  ks_statedict_free(before);
  ks_metric_free(src);
  ks_metric_free(m);
}

static void restore_computed_sets_cache_and_count(void **st) {
  (void)st;
  ks_metric *m = mt_make("SumMetric", NULL);
  float v = 42.0f;
  ks_tensor t = mt_tensor(KS_F32, &v, 0, 0, 0);
  assert_null(ks_metric_computed(m));
  assert_int_equal(ks_metric_restore_computed(m, &t, 7, NULL), KS_OK);
  assert_int_equal(ks_metric_update_count(m), 7);
  assert_true(mt_value(m, 0) == 42.0); /* the cache, not the zero state */
  assert_int_equal(ks_metric_restore_computed(m, NULL, -1, NULL), KS_E_INVALID);
  assert_int_equal(ks_metric_restore_computed(m, NULL, 0, NULL), KS_OK);
  assert_null(ks_metric_computed(m));
  ks_metric_free(m);
}

/* ---- merge ---- */

static void merge_matches_updating_one_metric(void **st) {
  (void)st;
  for (size_t i = 0; i < N_SPECS; i++) {
    ks_metric *all = fed(&k_specs[i], 0, 4), *first = fed(&k_specs[i], 0, 2), *second = fed(&k_specs[i], 2, 4);
    assert_int_equal(ks_metric_merge(second, first, NULL), KS_OK);
    assert_int_equal(ks_metric_update_count(second), 4);
    assert_same_compute(all, second, &k_specs[i]);
    ks_metric_free(all);
    ks_metric_free(first);
    ks_metric_free(second);
  }
}

static void merge_is_associative_and_commutative(void **st) {
  (void)st;
  for (size_t i = 0; i < N_SPECS; i++) {
    const spec *s = &k_specs[i];
    ks_metric *a = fed(s, 0, 1), *b = fed(s, 1, 3), *c = fed(s, 3, 4);
    ks_metric *ab_c, *a_bc, *bc, *ba;
    assert_int_equal(ks_metric_clone(a, NULL, &ab_c, NULL), KS_OK);
    assert_int_equal(ks_metric_clone(b, NULL, &bc, NULL), KS_OK);
    assert_int_equal(ks_metric_clone(b, NULL, &ba, NULL), KS_OK);
    assert_int_equal(ks_metric_merge(ab_c, b, NULL), KS_OK);
    assert_int_equal(ks_metric_merge(ab_c, c, NULL), KS_OK);
    assert_int_equal(ks_metric_merge(bc, c, NULL), KS_OK);
    assert_int_equal(ks_metric_clone(a, NULL, &a_bc, NULL), KS_OK);
    assert_int_equal(ks_metric_merge(a_bc, bc, NULL), KS_OK);
    assert_same_compute(ab_c, a_bc, s);
    assert_int_equal(ks_metric_merge(ba, a, NULL), KS_OK);
    ks_metric *ab;
    assert_int_equal(ks_metric_clone(a, NULL, &ab, NULL), KS_OK);
    assert_int_equal(ks_metric_merge(ab, b, NULL), KS_OK);
    assert_same_compute(ab, ba, s);
    ks_metric *list[] = {a, b, c, ab_c, a_bc, bc, ba, ab};
    for (size_t k = 0; k < 8; k++) ks_metric_free(list[k]);
  }
}

static void merge_rejects_different_kinds_unchanged(void **st) {
  (void)st;
  ks_metric *a = fed(&k_specs[14], 0, 1), *b = fed(&k_specs[15], 0, 1), *c = fed(&k_specs[5], 0, 1);
  ks_statedict *before = mt_snapshot(a);
  assert_int_equal(ks_metric_merge(a, b, NULL), KS_E_MISMATCH);
  assert_int_equal(ks_metric_merge(a, c, NULL), KS_E_MISMATCH);
  assert_int_equal(ks_metric_merge(a, a, NULL), KS_E_INVALID);
  assert_true(mt_unchanged(a, before));
  ks_statedict_free(before);
  ks_metric_free(a);
  ks_metric_free(b);
  ks_metric_free(c);
}

static void merge_puts_incoming_cat_rows_first(void **st) {
  (void)st;
  float x[2] = {1, 2}, y[1] = {3};
  ks_metric *a = mt_make("CatMetric", NULL), *b = mt_make("CatMetric", NULL);
  ks_tensor tx = F32V(x), ty = F32V(y);
  mt_update(a, &tx, 1);
  mt_update(b, &ty, 1);
  assert_int_equal(ks_metric_merge(b, a, NULL), KS_OK);
  assert_true(mt_value(b, 0) == 1 && mt_value(b, 1) == 2 && mt_value(b, 2) == 3);
  ks_metric_free(a);
  ks_metric_free(b);
}

/* ---- lifecycle ---- */

static void reset_restores_defaults_and_clone_is_independent(void **st) {
  (void)st;
  for (size_t i = 0; i < N_SPECS; i++) {
    ks_metric *fresh = mt_make(k_specs[i].cls, k_specs[i].args), *m = fed(&k_specs[i], 0, 2), *c;
    assert_int_equal(ks_metric_clone(m, NULL, &c, NULL), KS_OK);
    ks_statedict *snap = mt_snapshot(c), *zero = mt_snapshot(fresh);
    ks_metric_reset(m);
    assert_int_equal(ks_metric_update_count(m), 0);
    assert_true(mt_unchanged(m, zero));
    assert_true(mt_unchanged(c, snap));
    ks_statedict_free(snap);
    ks_statedict_free(zero);
    ks_metric_free(fresh);
    ks_metric_free(m);
    ks_metric_free(c);
  }
}

static void compute_is_cached_until_update(void **st) {
  (void)st;
  ks_metric *m = fed(&k_specs[1], 0, 1);
  const ks_tensor *a, *b;
  assert_int_equal(ks_metric_compute(m, &a, NULL), KS_OK);
  assert_ptr_equal(ks_metric_computed(m), a);
  assert_int_equal(ks_metric_compute(m, &b, NULL), KS_OK);
  assert_ptr_equal(a, b);
  batch bt;
  make_batch(&k_specs[1], 9, &bt);
  mt_update(m, bt.in, bt.n);
  assert_null(ks_metric_computed(m));
  ks_metric_free(m);
}

static void collection_keeps_metrics_by_name_in_order(void **st) {
  (void)st;
  ks_metric_collection *c;
  assert_int_equal(ks_metric_collection_create(NULL, &c, NULL), KS_OK);
  ks_metric *a = mt_make("SumMetric", NULL), *b = mt_make("MaxMetric", NULL), *dup = mt_make("MinMetric", NULL);
  assert_int_equal(ks_metric_collection_add(c, "loss", a, NULL), KS_OK);
  assert_int_equal(ks_metric_collection_add(c, "peak", b, NULL), KS_OK);
  assert_int_equal(ks_metric_collection_add(c, "loss", dup, NULL), KS_E_EXISTS);
  assert_int_equal(ks_metric_collection_add(c, "", dup, NULL), KS_E_INVALID);
  assert_int_equal(ks_metric_collection_count(c), 2);
  assert_ptr_equal(ks_metric_collection_get(c, "peak"), b);
  assert_null(ks_metric_collection_get(c, "nope"));
  const char *name;
  assert_ptr_equal(ks_metric_collection_at(c, 0, &name), a);
  assert_string_equal(name, "loss");
  assert_null(ks_metric_collection_at(c, 2, &name));
  ks_metric_free(dup);
  ks_metric_collection_free(c);
}

/* ---- allocation failure ---- */

static void sweep_create(const spec *s) {
  for (long n = 1;; n++) {
    ks_test_alloc ta;
    ks_test_alloc_init(&ta, n);
    ks_metric *m = NULL;
    ks_status r = ks_metric_create(s->cls, s->args, &ta.a, &m, NULL);
    if (r == KS_OK) {
      ks_metric_free(m);
      assert_int_equal(ta.live, 0);
      return;
    }
    assert_int_equal(r, KS_E_NOMEM);
    assert_int_equal(ta.live, 0);
  }
}

/* Runs op on a metric built with a failing allocator until it succeeds. */
static void sweep_op(const spec *s, int op) {
  for (long n = 1;; n++) {
    ks_test_alloc ta;
    ks_test_alloc_init(&ta, 0);
    ks_metric *m, *src = fed(s, 0, 2);
    assert_int_equal(ks_metric_create(s->cls, s->args, &ta.a, &m, NULL), KS_OK);
    batch b;
    make_batch(s, 7, &b);
    mt_update(m, b.in, b.n);
    ks_statedict *before = mt_snapshot(m), *load = mt_snapshot(src);
    long live = ta.live;
    ta.calls = 0;
    ta.fail_at = n;
    const ks_tensor *out;
    ks_status r = op == 0 ? ks_metric_update(m, b.in, b.n, NULL)
                  : op == 1 ? ks_metric_merge(m, src, NULL)
                  : op == 2 ? ks_metric_load_state_dict(m, load, "", 2, 0, NULL, NULL, NULL)
                            : ks_metric_compute(m, &out, NULL);
    ta.fail_at = 0;
    int done = r == KS_OK;
    if (!done) {
      assert_int_equal(r, KS_E_NOMEM);
      assert_true(mt_unchanged(m, before));
      assert_int_equal(ta.live, live);
      mt_update(m, b.in, b.n); /* still usable */
    }
    ks_metric_free(m);
    ks_metric_free(src);
    ks_statedict_free(before);
    ks_statedict_free(load);
    assert_int_equal(ta.live, 0);
    if (done) return;
  }
}

static void allocation_failures_leave_metrics_unchanged(void **st) {
  (void)st;
  for (size_t i = 0; i < N_SPECS; i++) {
    sweep_create(&k_specs[i]);
    for (int op = 0; op < 4; op++) sweep_op(&k_specs[i], op);
  }
}

static void clone_and_collection_survive_allocation_failure(void **st) {
  (void)st;
  ks_metric *src = fed(&k_specs[21], 0, 2); /* MulticlassAUROC: cat states */
  for (long n = 1;; n++) {
    ks_test_alloc ta;
    ks_test_alloc_init(&ta, n);
    ks_metric *c = NULL;
    ks_status r = ks_metric_clone(src, &ta.a, &c, NULL);
    ks_metric_free(c);
    assert_int_equal(ta.live, 0);
    if (r == KS_OK) break;
    assert_int_equal(r, KS_E_NOMEM);
  }
  for (long n = 1;; n++) {
    ks_test_alloc ta;
    ks_test_alloc_init(&ta, n);
    ks_metric_collection *c = NULL;
    ks_status r = ks_metric_collection_create(&ta.a, &c, NULL);
    ks_metric *m;
    if (!r) {
      assert_int_equal(ks_metric_clone(src, NULL, &m, NULL), KS_OK);
      r = ks_metric_collection_add(c, "auroc", m, NULL);
      if (r) ks_metric_free(m);
    }
    ks_metric_collection_free(c);
    assert_int_equal(ta.live, 0);
    if (r == KS_OK) break;
    assert_int_equal(r, KS_E_NOMEM);
  }
  ks_metric_free(src);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(registry_lists_every_class_and_builds_it),
      cmocka_unit_test(create_rejects_bad_classes_and_arguments),
      cmocka_unit_test(create_accepts_and_ignores_base_class_options),
      cmocka_unit_test(state_dict_round_trip_preserves_compute),
      cmocka_unit_test(load_migrates_pre_1_1_aggregation_names),
      cmocka_unit_test(load_reshapes_mse_and_mae_sums),
      cmocka_unit_test(load_widens_but_refuses_narrowing_unless_allowed),
      cmocka_unit_test(load_rejects_missing_misshapen_or_future_states_unchanged),
      cmocka_unit_test(load_rejects_curve_preds_and_target_of_different_lengths),
      cmocka_unit_test(restore_computed_sets_cache_and_count),
      cmocka_unit_test(merge_matches_updating_one_metric),
      cmocka_unit_test(merge_is_associative_and_commutative),
      cmocka_unit_test(merge_rejects_different_kinds_unchanged),
      cmocka_unit_test(merge_puts_incoming_cat_rows_first),
      cmocka_unit_test(reset_restores_defaults_and_clone_is_independent),
      cmocka_unit_test(compute_is_cached_until_update),
      cmocka_unit_test(collection_keeps_metrics_by_name_in_order),
      cmocka_unit_test(allocation_failures_leave_metrics_unchanged),
      cmocka_unit_test(clone_and_collection_survive_allocation_failure),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
