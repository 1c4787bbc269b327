/* Aggregation, regression and language-model metrics: values, NaN/inf handling, rejected inputs. */
#include "metric_helpers.h"

/* ---- aggregation ---- */

static void mean_weights_broadcast_and_nan_is_dropped(void **st) {
  (void)st;
  float v[3] = {1, NAN, 3}, w = 2.0f, wv[3] = {1, 1, 3};
  ks_metric *m = mt_make("MeanMetric", NULL);
  ks_tensor in[2] = {F32V(v), mt_tensor(KS_F32, &w, 0, 0, 0)};
  mt_update(m, in, 2);
  assert_true(mt_close(mt_value(m, 0), 2.0));
  in[1] = F32V(wv);
  mt_update(m, in, 2); /* + (1*1 + 3*3) / (1 + 3) */
  assert_true(mt_close(mt_value(m, 0), (8.0 + 10.0) / (4.0 + 4.0)));
  float w2[2] = {1, 1};
  in[1] = F32V(w2);
  mt_rejects(m, in, 2, KS_E_SHAPE);
  ks_metric_free(m);
}

static void nan_strategy_error_rejects_and_number_replaces(void **st) {
  (void)st;
  float v[2] = {1, NAN};
  ks_tensor t = F32V(v);
  ks_metric *e = mt_make("SumMetric", "{\"nan_strategy\":\"error\"}"),
            *r = mt_make("SumMetric", "{\"nan_strategy\":5}");
  mt_rejects(e, &t, 1, KS_E_VALUE);
  mt_update(r, &t, 1);
  assert_true(mt_value(r, 0) == 6.0);
  ks_metric_free(e);
  ks_metric_free(r);
}

static void max_and_min_start_infinite_and_keep_inf(void **st) {
  (void)st;
  ks_metric *mx = mt_make("MaxMetric", NULL), *mn = mt_make("MinMetric", NULL);
  assert_true(isinf(mt_value(mx, 0)) && mt_value(mx, 0) < 0);
  assert_true(isinf(mt_value(mn, 0)) && mt_value(mn, 0) > 0);
  float v[3] = {2, INFINITY, NAN};
  ks_tensor t = F32V(v), empty = mt_tensor(KS_F32, NULL, 1, 0, 0);
  mt_update(mx, &empty, 1);
  assert_true(mt_value(mx, 0) < 0);
  mt_update(mx, &t, 1);
  mt_update(mn, &t, 1);
  assert_true(isinf(mt_value(mx, 0)) && mt_value(mx, 0) > 0);
  assert_true(mt_value(mn, 0) == 2.0);
  ks_metric_free(mx);
  ks_metric_free(mn);
}

static void cat_keeps_rows_and_refuses_other_row_shapes(void **st) {
  (void)st;
  float a[2 * 3] = {1, 2, 3, 4, 5, 6}, b[4] = {7, 8, 9, 10};
  ks_metric *m = mt_make("CatMetric", NULL);
  ks_tensor ta = mt_tensor(KS_F32, a, 2, 2, 3), tb = mt_tensor(KS_F32, b, 2, 2, 2);
  mt_update(m, &ta, 1);
  mt_update(m, &ta, 1);
  mt_rejects(m, &tb, 1, KS_E_SHAPE);
  const ks_tensor *out;
  assert_int_equal(ks_metric_compute(m, &out, NULL), KS_OK);
  assert_int_equal(out->rank, 2);
  assert_int_equal(out->shape[0], 4);
  assert_true(((float *)out->data)[9] == 4.0f);
  ks_metric_reset(m);
  mt_update(m, &tb, 1); /* after reset any row shape is fine again */
  ks_metric_free(m);
}

/* ---- regression ---- */

static void mse_rmse_and_mae_values(void **st) {
  (void)st;
  float p[4] = {1, 2, 3, 4}, t[4] = {1, 0, 3, 8};
  ks_metric *mse = mt_make("MeanSquaredError", NULL), *rmse = mt_make("MeanSquaredError", "{\"squared\":false}");
  ks_metric *mae = mt_make("MeanAbsoluteError", NULL);
  mt_update2(mse, F32V(p), F32V(t));
  mt_update2(rmse, F32V(p), F32V(t));
  mt_update2(mae, F32V(p), F32V(t));
  assert_true(mt_close(mt_value(mse, 0), 5.0));
  assert_true(mt_close(mt_value(rmse, 0), sqrt(5.0)));
  assert_true(mt_close(mt_value(mae, 0), 1.5));
  ks_metric_free(mse);
  ks_metric_free(rmse);
  ks_metric_free(mae);
}

static void mse_with_outputs_sums_per_column(void **st) {
  (void)st;
  double p[2 * 2] = {1, 2, 3, 4}, t[2 * 2] = {0, 2, 3, 2};
  ks_metric *m = mt_make("MeanSquaredError", "{\"num_outputs\":2}");
  mt_update2(m, mt_tensor(KS_F64, p, 2, 2, 2), mt_tensor(KS_F64, t, 2, 2, 2));
  assert_true(mt_close(mt_value(m, 0), 0.5) && mt_close(mt_value(m, 1), 2.0));
  mt_rejects2(m, mt_tensor(KS_F64, p, 1, 4, 0), mt_tensor(KS_F64, t, 1, 4, 0), KS_E_SHAPE);
  ks_metric_free(m);
}

static void mse_propagates_nan_and_rejects_shape_mismatch(void **st) {
  (void)st;
  float p[2] = {NAN, 1}, t[2] = {0, 1}, t3[3] = {0, 0, 0};
  ks_metric *m = mt_make("MeanSquaredError", NULL);
  mt_rejects2(m, F32V(p), F32V(t3), KS_E_SHAPE);
  mt_update2(m, F32V(p), F32V(t));
  assert_true(isnan(mt_value(m, 0)));
  ks_metric_free(m);
}

static void r2_needs_two_samples_and_handles_constant_targets(void **st) {
  (void)st;
  float p[3] = {1, 2, 3}, t[3] = {1, 2, 4}, c[2] = {5, 5}, pc[2] = {4, 6};
  ks_metric *m = mt_make("R2Score", NULL), *k = mt_make("R2Score", NULL);
  const ks_tensor *out;
  assert_int_equal(ks_metric_compute(m, &out, NULL), KS_E_STATE);
  mt_update2(m, F32V(p), F32V(t));
  assert_true(mt_close(mt_value(m, 0), 1.0 - 1.0 / (21.0 - 49.0 / 3.0)));
  mt_update2(k, F32V(pc), F32V(c)); /* tss = 0, rss != 0: score 0 */
  assert_true(mt_value(k, 0) == 0.0);
  ks_metric_free(m);
  ks_metric_free(k);
}

/* ---- language ---- */

static void cross_entropy_of_uniform_logits_is_log_vocab(void **st) {
  (void)st;
  float logits[3 * 4] = {0};
  int64_t t[3] = {1, -100, 3};
  ks_metric *ce = mt_make("LanguageCrossEntropy", NULL), *ppl = mt_make("LanguagePerplexity", NULL);
  mt_update2(ce, mt_tensor(KS_F32, logits, 2, 3, 4), I64V(t));
  mt_update2(ppl, mt_tensor(KS_F32, logits, 2, 3, 4), I64V(t));
  assert_true(mt_close(mt_value(ce, 0), log(4.0)));
  assert_true(mt_close(mt_value(ppl, 0), 4.0));
  ks_tensor cur;
  assert_int_equal(ks_metric_state_info(ce, 1, NULL, NULL, &cur), KS_OK);
  assert_int_equal(*(int64_t *)cur.data, 2);
  ks_metric_free(ce);
  ks_metric_free(ppl);
}

static void cross_entropy_is_stable_for_large_logits(void **st) {
  (void)st;
  float logits[2] = {1000.0f, 0.0f};
  int64_t t[1] = {1};
  ks_metric *ce = mt_make("LanguageCrossEntropy", NULL);
  mt_update2(ce, mt_tensor(KS_F32, logits, 2, 1, 2), I64V(t));
  assert_true(mt_close(mt_value(ce, 0), 1000.0));
  ks_metric_free(ce);
}

static void cross_entropy_accepts_batch_by_sequence(void **st) {
  (void)st;
  float logits[2 * 2 * 3] = {0};
  int64_t t[4] = {0, 1, 2, -100};
  ks_tensor lg, tt;
  int64_t ls[3] = {2, 2, 3}, ts[2] = {2, 2};
  assert_int_equal(ks_tensor_init(&lg, KS_F32, 3, ls, logits), KS_OK);
  assert_int_equal(ks_tensor_init(&tt, KS_I64, 2, ts, t), KS_OK);
  ks_metric *ce = mt_make("LanguageCrossEntropy", NULL);
  mt_update2(ce, lg, tt);
  assert_true(mt_close(mt_value(ce, 0), log(3.0)));
  ks_metric_free(ce);
}

static void cross_entropy_rejects_bad_targets_unchanged(void **st) {
  (void)st;
  float logits[2 * 3] = {0}, tf[2] = {0, 1};
  int64_t out_of_vocab[2] = {0, 3}, t1[1] = {0};
  ks_metric *ce = mt_make("LanguageCrossEntropy", NULL);
  ks_tensor lg = mt_tensor(KS_F32, logits, 2, 2, 3);
  mt_rejects2(ce, lg, I64V(out_of_vocab), KS_E_VALUE);
  mt_rejects2(ce, lg, F32V(tf), KS_E_DTYPE);
  mt_rejects2(ce, lg, I64V(t1), KS_E_SHAPE);
  ks_metric_free(ce);
}

static void cross_entropy_with_only_ignored_tokens_is_nan(void **st) {
  (void)st;
  float logits[3] = {1, 2, 3};
  int64_t t[1] = {-100};
  ks_metric *ce = mt_make("LanguageCrossEntropy", NULL);
  mt_update2(ce, mt_tensor(KS_F32, logits, 2, 1, 3), I64V(t));
  assert_true(isnan(mt_value(ce, 0))); /* 0 / 0, as Composer */
  ks_metric_free(ce);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(mean_weights_broadcast_and_nan_is_dropped),
      cmocka_unit_test(nan_strategy_error_rejects_and_number_replaces),
      cmocka_unit_test(max_and_min_start_infinite_and_keep_inf),
      cmocka_unit_test(cat_keeps_rows_and_refuses_other_row_shapes),
      cmocka_unit_test(mse_rmse_and_mae_values),
      cmocka_unit_test(mse_with_outputs_sums_per_column),
      cmocka_unit_test(mse_propagates_nan_and_rejects_shape_mismatch),
      cmocka_unit_test(r2_needs_two_samples_and_handles_constant_targets),
      cmocka_unit_test(cross_entropy_of_uniform_logits_is_log_vocab),
      cmocka_unit_test(cross_entropy_is_stable_for_large_logits),
      cmocka_unit_test(cross_entropy_accepts_batch_by_sequence),
      cmocka_unit_test(cross_entropy_rejects_bad_targets_unchanged),
      cmocka_unit_test(cross_entropy_with_only_ignored_tokens_is_nan),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
