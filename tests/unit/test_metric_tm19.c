/*
 * torchmetrics 1.9.0 exactness: the behaviours where keepsake used to differ
 * from the current release. Expected values are torchmetrics 1.9.0 / torch
 * 2.13's own outputs for the same inputs (see tests/vectors/gen_vectors.py for
 * the full reference set), each derived by hand in the comment beside it.
 */
#include <stdio.h>

#include "metric_helpers.h"

/* ---- BinaryAveragePrecision without positive targets ---- */

static void average_precision_without_positives_is_zero_not_nan(void **st) {
  (void)st;
  float p[3] = {0.1f, 0.5f, 0.9f};
  int64_t t[3] = {0, 0, 0};
  ks_metric *m = mt_make("BinaryAveragePrecision", NULL);
  mt_update2(m, F32V(p), I64V(t));
  /* torchmetrics warns, sets recall to 1 everywhere; precision is 0 at every point: -sum(0) = -0.0 */
  double v = mt_value(m, 0);
  assert_true(v == v); /* not NaN */
  assert_true(v == 0.0);
  ks_metric_free(m);
}

/* ---- binned average precision: list order kept, 0/0 precision counts as 0 ---- */

static void binned_average_precision_keeps_list_order_and_zero_precision(void **st) {
  (void)st;
  float p[6] = {0.2f, 0.35f, 0.55f, 0.7f, 0.8f, 0.95f};
  int64_t t[6] = {0, 1, 0, 1, 1, 1};
  ks_metric *m = mt_make("BinaryAveragePrecision", "{\"thresholds\":[0.3,1.0,0.6,0.1]}");
  mt_update2(m, F32V(p), I64V(t));
  /*
   * Per threshold, in the given order: 0.3 -> P 4/5, R 1; 1.0 -> nothing predicted, P 0/0 -> 0, R 0;
   * 0.6 -> P 1, R 3/4; 0.1 -> P 4/6, R 1; then (P 1, R 0) is appended.
   * AP = -sum (R[i+1] - R[i]) P[i] = 0.8 - 0 - 0.25 + 2/3 = 1.2166667 (torchmetrics 1.9.0).
   */
  assert_true(mt_close(mt_value(m, 0), 0.8 - 0.25 + 4.0 / 6.0));
  ks_tensor cm;
  assert_int_equal(ks_metric_state_info(m, 0, NULL, NULL, &cm), KS_OK);
  const int64_t *q = cm.data; /* (T, 2, 2) = [[tn, fp], [fn, tp]] in list order */
  const int64_t want[16] = {1, 1, 0, 4, 2, 0, 4, 0, 2, 0, 1, 3, 0, 2, 0, 4};
  for (int i = 0; i < 16; i++) assert_int_equal(q[i], want[i]);
  ks_metric_free(m);
}

/* ---- torch.topk's tie order ---- */

/*
 * Feeds C copies of one score row with targets 0..C-1 to a top-k metric. With
 * 1.7+'s rule sample c counts a tp for c exactly when c is among torch.topk's
 * k, and every miss predicts topk's first index: so tp shows the chosen set
 * and fp the first of them.
 */
static void check_topk_row(const float *row, size_t C, size_t k, const size_t *want) {
  static float rows[200 * 200];
  static int64_t y[200];
  for (size_t c = 0; c < C; c++) {
    memcpy(rows + c * C, row, C * sizeof *row);
    y[c] = (int64_t)c;
  }
  char args[96];
  snprintf(args, sizeof args, "{\"num_classes\":%zu,\"top_k\":%zu,\"average\":\"none\"}", C, k);
  ks_metric *m = mt_make("MulticlassRecall", args);
  mt_update2(m, mt_tensor(KS_F32, rows, 2, (int64_t)C, (int64_t)C), mt_tensor(KS_I64, y, 1, (int64_t)C, 0));
  ks_tensor tp, fp;
  assert_int_equal(ks_metric_state_info(m, 0, NULL, NULL, &tp), KS_OK);
  assert_int_equal(ks_metric_state_info(m, 1, NULL, NULL, &fp), KS_OK);
  for (size_t c = 0; c < C; c++) {
    int in = 0;
    for (size_t j = 0; j < k; j++) in |= want[j] == c;
    if (((int64_t *)tp.data)[c] != in)
      fail_msg("C=%zu k=%zu: class %zu %s torch's top k", C, k, c, in ? "is in" : "is not in");
    int64_t misses = c == want[0] ? (int64_t)(C - k) : 0;
    if (((int64_t *)fp.data)[c] != misses) fail_msg("C=%zu k=%zu: torch's first index is %zu", C, k, want[0]);
  }
  ks_metric_free(m);
}

static void topk_picks_tied_indices_as_torch(void **st) {
  (void)st;
  /* torch.topk(torch.zeros(1, C), k).indices, torch 1.13 and 2.13 (nth_element + sort, or partial_sort). */
  static const struct {
    size_t C, k, idx[3];
  } want[] = {
      {4, 2, {2, 3}},      {4, 3, {2, 3, 0}},   {5, 2, {2, 4}},      {5, 3, {2, 4, 3}},
      {6, 2, {3, 5}},      {8, 2, {6, 5}},      {8, 3, {6, 5, 4}},   {10, 2, {8, 6}},
      {10, 3, {8, 6, 7}},  {16, 2, {10, 11}},   {20, 3, {12, 14, 13}}, {200, 2, {0, 1}},
      {200, 3, {0, 1, 2}},
  };
  static const float zeros[200] = {0};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) check_topk_row(zeros, want[i].C, want[i].k, want[i].idx);
  /* A distinct maximum among ties, and NaN ranked first: torch.topk(row, 2) = [1, 3] and [1, 2]. */
  const float r1[5] = {1, 2, 2, 2, 1}, r2[5] = {1, NAN, 3, 1, 1};
  const size_t w1[2] = {1, 3}, w2[2] = {1, 2};
  check_topk_row(r1, 5, 2, w1);
  check_topk_row(r2, 5, 2, w2);
}

static void multiclass_top2_micro_with_ties_matches_torchmetrics(void **st) {
  (void)st;
  float lg[4 * 5] = {1, 1, 1, 0, 0, 0, 2, 2, 2, 0, 3, 3, 0, 3, 3, 1, 1, 1, 1, 1};
  int64_t y[4] = {0, 3, 4, 2};
  /*
   * torch.topk(k=2) picks [1,2], [1,3], [1,4], [2,4]: rows 1..3 hit (3 is in [1,3], 4 in [1,4],
   * 2 in [2,4]), row 0 misses (0 is tied with 1 and 2 but not chosen). 1.7+'s rule predicts the
   * target on a hit and the top-1 (class 1) on a miss: tp = [0,0,1,1,1], fp = [0,1,0,0,0].
   */
  static const char *const cls[3] = {"MulticlassAccuracy", "MulticlassPrecision", "MulticlassF1Score"};
  for (int i = 0; i < 3; i++) {
    ks_metric *m = mt_make(cls[i], "{\"num_classes\":5,\"top_k\":2,\"average\":\"micro\"}");
    mt_update2(m, mt_tensor(KS_F32, lg, 2, 4, 5), I64V(y));
    assert_true(mt_close(mt_value(m, 0), 0.75));
    ks_tensor tp, fp, tn;
    assert_int_equal(ks_metric_state_info(m, 0, NULL, NULL, &tp), KS_OK);
    assert_int_equal(ks_metric_state_info(m, 1, NULL, NULL, &fp), KS_OK);
    assert_int_equal(ks_metric_state_info(m, 2, NULL, NULL, &tn), KS_OK);
    const int64_t want_tp[5] = {0, 0, 1, 1, 1}, want_fp[5] = {0, 1, 0, 0, 0};
    for (int c = 0; c < 5; c++) {
      assert_int_equal(((int64_t *)tp.data)[c], want_tp[c]);
      assert_int_equal(((int64_t *)fp.data)[c], want_fp[c]);
      assert_int_equal(((int64_t *)tn.data)[c], 3);
    }
    ks_metric_free(m);
  }
}

static void top_k_precision_counts_one_prediction_per_sample(void **st) {
  (void)st;
  /* Distinct scores: top-2 of row 0 is {3, 2} (target 2: hit), of row 1 {0, 1} (target 3: miss -> predicts 0). */
  float lg[2 * 4] = {0.1f, 0.2f, 0.3f, 0.4f, 0.4f, 0.3f, 0.2f, 0.1f};
  int64_t y[2] = {2, 3};
  ks_metric *m = mt_make("MulticlassPrecision", "{\"num_classes\":4,\"top_k\":2,\"average\":\"micro\"}");
  mt_update2(m, mt_tensor(KS_F32, lg, 2, 2, 4), I64V(y));
  /* tp = 1, fp = 1 (class 0 on row 1): micro precision 0.5; the older rule counted 3 fp (0.25). */
  assert_true(mt_close(mt_value(m, 0), 0.5));
  ks_metric_free(m);
}

static void top_k_rejects_bad_targets_unchanged(void **st) {
  (void)st;
  float lg[2 * 4] = {0};
  int64_t ok[2] = {0, 1}, bad[2] = {1, 4};
  ks_metric *m = mt_make("MulticlassF1Score", "{\"num_classes\":4,\"top_k\":3}");
  mt_update2(m, mt_tensor(KS_F32, lg, 2, 2, 4), I64V(ok));
  mt_rejects2(m, mt_tensor(KS_F32, lg, 2, 2, 4), I64V(bad), KS_E_VALUE);
  ks_metric_free(m);
}

/* ---- R2Score's ()-shaped sums (torchmetrics >= 1.5) and MeanAbsoluteError's (1,) sum ---- */

static ks_statedict *r2_states(int rank, int64_t n, const float *sq, const float *sum, const float *res,
                               int64_t total) {
  ks_statedict *sd;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  const float *v[3] = {sq, sum, res};
  static const char *const names[3] = {"sum_squared_error", "sum_error", "residual"};
  for (int i = 0; i < 3; i++) {
    ks_tensor t = mt_tensor(KS_F32, v[i], rank, n, 0);
    assert_int_equal(ks_statedict_set_tensor(sd, names[i], &t, KS_COPY, NULL), KS_OK);
  }
  ks_tensor t = mt_tensor(KS_I64, &total, 0, 0, 0);
  assert_int_equal(ks_statedict_set_tensor(sd, "total", &t, KS_COPY, NULL), KS_OK);
  return sd;
}

static void r2score_states_are_scalars_and_load_both_layouts(void **st) {
  (void)st;
  ks_metric *m = mt_make("R2Score", NULL);
  ks_tensor cur;
  assert_int_equal(ks_metric_state_info(m, 0, NULL, NULL, &cur), KS_OK);
  assert_int_equal(cur.rank, 0); /* torchmetrics 1.9.0: tensor(0.0) */
  /* targets 1, 2, 3 and preds 1, 2, 4: sum y^2 = 14, sum y = 6, rss = 1, tss = 14 - 12 = 2, R2 = 0.5 */
  float sq = 14, sum = 6, res = 1;
  int mig = -1;
  ks_statedict *now = r2_states(0, 0, &sq, &sum, &res, 3), *old = r2_states(1, 1, &sq, &sum, &res, 3);
  assert_int_equal(ks_metric_load_state_dict(m, now, "", KS_METRIC_SCHEMA_VERSION, 0, &mig, NULL, NULL), KS_OK);
  assert_int_equal(mig, 0);
  assert_true(mt_close(mt_value(m, 0), 0.5));
  assert_int_equal(ks_metric_load_state_dict(m, old, "", KS_METRIC_SCHEMA_VERSION, 0, &mig, NULL, NULL), KS_OK);
  assert_int_equal(mig, 1); /* torchmetrics 1.4's (1,) sums */
  assert_int_equal(ks_metric_state_info(m, 0, NULL, NULL, &cur), KS_OK);
  assert_int_equal(cur.rank, 0);
  assert_true(mt_close(mt_value(m, 0), 0.5));
  ks_statedict_free(now);
  ks_statedict_free(old);
  ks_metric_free(m);
}

static void r2score_outputs_broadcast_a_fresh_scalar_state(void **st) {
  (void)st;
  /* A torchmetrics >= 1.5 R2Score saved before any update holds () zeros; two outputs broadcast them. */
  ks_metric *m = mt_make("R2Score", "{\"num_outputs\":2}");
  float zero = 0, three[3] = {1, 2, 3};
  ks_statedict *fresh = r2_states(0, 0, &zero, &zero, &zero, 0), *wrong = r2_states(1, 3, three, three, three, 0);
  int mig = 0;
  assert_int_equal(ks_metric_load_state_dict(m, fresh, "", KS_METRIC_SCHEMA_VERSION, 0, &mig, NULL, NULL), KS_OK);
  assert_int_equal(mig, 1);
  ks_tensor cur;
  assert_int_equal(ks_metric_state_info(m, 0, NULL, NULL, &cur), KS_OK);
  assert_int_equal(cur.rank, 1);
  assert_int_equal(cur.shape[0], 2);
  float p[4] = {1, 2, 3, 4}, t[4] = {1, 1, 3, 3}; /* (2, 2): output 0 exact (R2 1), output 1 rss 2, tss 2 (R2 0) */
  mt_update2(m, mt_tensor(KS_F32, p, 2, 2, 2), mt_tensor(KS_F32, t, 2, 2, 2));
  assert_true(mt_close(mt_value(m, 0), 0.5));
  ks_statedict *before = mt_snapshot(m);
  assert_int_equal(ks_metric_load_state_dict(m, wrong, "", KS_METRIC_SCHEMA_VERSION, 0, NULL, NULL, NULL), KS_E_SHAPE);
  assert_true(mt_unchanged(m, before));
  ks_statedict_free(before);
  ks_statedict_free(fresh);
  ks_statedict_free(wrong);
  ks_metric_free(m);
}

static void r2score_load_survives_allocation_failure(void **st) {
  (void)st;
  float zero = 0;
  ks_statedict *fresh = r2_states(0, 0, &zero, &zero, &zero, 0);
  for (long n = 1;; n++) {
    ks_test_alloc ta;
    ks_test_alloc_init(&ta, 0);
    ks_metric *m;
    assert_int_equal(ks_metric_create("R2Score", "{\"num_outputs\":3}", &ta.a, &m, NULL), KS_OK);
    ks_statedict *before = mt_snapshot(m);
    ta.calls = 0;
    ta.fail_at = n;
    ks_status r = ks_metric_load_state_dict(m, fresh, "", KS_METRIC_SCHEMA_VERSION, 0, NULL, NULL, NULL);
    ta.fail_at = 0;
    if (r != KS_OK) {
      assert_int_equal(r, KS_E_NOMEM);
      assert_true(mt_unchanged(m, before));
    }
    ks_statedict_free(before);
    ks_metric_free(m);
    assert_int_equal(ta.live, 0);
    if (r == KS_OK) break;
  }
  ks_statedict_free(fresh);
}

static void mean_absolute_error_sum_has_one_element_per_output(void **st) {
  (void)st;
  ks_metric *m = mt_make("MeanAbsoluteError", NULL);
  ks_tensor cur;
  assert_int_equal(ks_metric_state_info(m, 0, NULL, NULL, &cur), KS_OK);
  assert_int_equal(cur.rank, 1); /* torchmetrics >= 1.5: torch.zeros(num_outputs) */
  assert_int_equal(cur.shape[0], 1);
  float p[2] = {1, 3}, t[2] = {2, 1};
  mt_update2(m, F32V(p), F32V(t));
  const ks_tensor *out;
  assert_int_equal(ks_metric_compute(m, &out, NULL), KS_OK);
  assert_int_equal(out->rank, 0); /* one-element results are squeezed, as torchmetrics */
  assert_true(mt_close(mt_value(m, 0), 1.5));
  ks_metric_free(m);
}

/* ---- MeanMetric's numeric nan_strategy and the float32 sums ---- */

static void mean_numeric_nan_strategy_gives_weight_one(void **st) {
  (void)st;
  ks_metric *a = mt_make("MeanMetric", "{\"nan_strategy\":5.0}"), *b = mt_make("MeanMetric", "{\"nan_strategy\":5.0}");
  float v1[2] = {1, NAN}, w1[2] = {1, 1}, v2[2] = {2, 4}, w2[2] = {1, NAN};
  mt_update2(a, F32V(v1), F32V(w1));
  mt_update2(b, F32V(v2), F32V(w2));
  /* NaN value: (1*1 + 5*1) / (1 + 1) = 3 (1.4 weighted it by 5: 26/6). NaN weight: (2*1 + 5*1) / 2 = 3.5. */
  assert_true(mt_close(mt_value(a, 0), 3.0));
  assert_true(mt_close(mt_value(b, 0), 3.5));
  ks_tensor w;
  assert_int_equal(ks_metric_state_info(a, 1, NULL, NULL, &w), KS_OK);
  assert_true(*(float *)w.data == 2.0f);
  ks_metric_free(a);
  ks_metric_free(b);
}

static void sum_adds_each_batch_sum_to_the_float32_state_once(void **st) {
  (void)st;
  ks_metric *m = mt_make("SumMetric", NULL);
  float big[1] = {1e8f}, ones[16], edge[3] = {16777216.0f, 1.0f, 1.0f};
  for (int i = 0; i < 16; i++) ones[i] = 1.0f;
  mt_update(m, (ks_tensor[]){F32V(big)}, 1);
  mt_update(m, (ks_tensor[]){F32V(ones)}, 1);
  /* state += batch.sum(): 1e8 + 16 (exact in float32; adding the ones one by one would stay at 1e8) */
  assert_true(mt_value(m, 0) == 100000016.0);
  ks_metric *e = mt_make("SumMetric", NULL);
  mt_update(e, (ks_tensor[]){F32V(edge)}, 1);
  /* Within a batch keepsake rounds the exact sum once: 2^24 + 2. torch's float32 adds give 2^24 here. */
  assert_true(mt_value(e, 0) == 16777218.0);
  ks_metric_free(m);
  ks_metric_free(e);
}

static void nan_strategy_disable_lets_nan_through_and_ignores_weights(void **st) {
  (void)st;
  ks_metric *mx = mt_make("MaxMetric", "{\"nan_strategy\":\"disable\"}");
  ks_metric *mean = mt_make("MeanMetric", "{\"nan_strategy\":\"disable\"}");
  assert_string_equal(ks_metric_args_json(mx), "{\"nan_strategy\":\"disable\"}");
  float v[3] = {1, NAN, 3}, after[1] = {9}, mv[2] = {1, 3}, mw[2] = {3, 1};
  mt_update(mx, (ks_tensor[]){F32V(v)}, 1);
  assert_true(isnan(mt_value(mx, 0))); /* torch.max propagates NaN, and it stays */
  mt_update(mx, (ks_tensor[]){F32V(after)}, 1);
  assert_true(isnan(mt_value(mx, 0)));
  mt_update2(mean, F32V(mv), F32V(mw));
  assert_true(mt_close(mt_value(mean, 0), 2.0)); /* torchmetrics 1.9 sets every weight to 1 here */
  ks_metric_free(mx);
  ks_metric_free(mean);
}

/* ---- one-element results are 0-d (torchmetrics' _squeeze_if_scalar) ---- */

static void cat_metric_with_one_value_computes_a_scalar(void **st) {
  (void)st;
  ks_metric *m = mt_make("CatMetric", NULL);
  float v = 1.5f;
  mt_update(m, (ks_tensor[]){mt_tensor(KS_F32, &v, 0, 0, 0)}, 1);
  const ks_tensor *out;
  assert_int_equal(ks_metric_compute(m, &out, NULL), KS_OK);
  assert_int_equal(out->rank, 0);
  assert_true(*(float *)out->data == 1.5f);
  mt_update(m, (ks_tensor[]){mt_tensor(KS_F32, &v, 0, 0, 0)}, 1);
  assert_int_equal(ks_metric_compute(m, &out, NULL), KS_OK);
  assert_int_equal(out->rank, 1);
  assert_int_equal(out->shape[0], 2);
  ks_metric_free(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(average_precision_without_positives_is_zero_not_nan),
      cmocka_unit_test(binned_average_precision_keeps_list_order_and_zero_precision),
      cmocka_unit_test(topk_picks_tied_indices_as_torch),
      cmocka_unit_test(multiclass_top2_micro_with_ties_matches_torchmetrics),
      cmocka_unit_test(top_k_precision_counts_one_prediction_per_sample),
      cmocka_unit_test(top_k_rejects_bad_targets_unchanged),
      cmocka_unit_test(r2score_states_are_scalars_and_load_both_layouts),
      cmocka_unit_test(r2score_outputs_broadcast_a_fresh_scalar_state),
      cmocka_unit_test(r2score_load_survives_allocation_failure),
      cmocka_unit_test(mean_absolute_error_sum_has_one_element_per_output),
      cmocka_unit_test(mean_numeric_nan_strategy_gives_weight_one),
      cmocka_unit_test(sum_adds_each_batch_sum_to_the_float32_state_once),
      cmocka_unit_test(nan_strategy_disable_lets_nan_through_and_ignores_weights),
      cmocka_unit_test(cat_metric_with_one_value_computes_a_scalar),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
