/* Classification metrics: torchmetrics semantics, edge cases and rejected inputs. */
#include <stdio.h>

#include "metric_helpers.h"

/* ---- binary ---- */

static void binary_treats_floats_outside_unit_interval_as_logits(void **st) {
  (void)st;
  float probs[2] = {0.2f, 0.6f}, mixed[2] = {0.2f, 1.5f};
  int64_t t[2] = {0, 1};
  ks_metric *a = mt_make("BinaryAccuracy", NULL), *b = mt_make("BinaryAccuracy", NULL);
  mt_update2(a, F32V(probs), I64V(t));
  mt_update2(b, F32V(mixed), I64V(t)); /* sigmoid(0.2) = 0.55 > 0.5: a false positive */
  assert_true(mt_value(a, 0) == 1.0);
  assert_true(mt_close(mt_value(b, 0), 0.5));
  ks_metric_free(a);
  ks_metric_free(b);
}

static void binary_nan_prediction_is_negative(void **st) {
  (void)st;
  float p[2] = {NAN, 0.9f};
  int64_t t[2] = {1, 1};
  ks_metric *m = mt_make("BinaryRecall", NULL);
  mt_update2(m, F32V(p), I64V(t));
  assert_true(mt_close(mt_value(m, 0), 0.5));
  ks_metric_free(m);
}

static void binary_threshold_and_label_preds(void **st) {
  (void)st;
  float p[3] = {0.25f, 0.35f, 0.9f};
  int64_t t[3] = {0, 1, 1}, lp[3] = {0, 0, 1};
  ks_metric *m = mt_make("BinaryF1Score", "{\"threshold\":0.3}"), *l = mt_make("BinaryPrecision", NULL);
  mt_update2(m, F32V(p), I64V(t));
  mt_update2(l, I64V(lp), I64V(t));
  assert_true(mt_close(mt_value(m, 0), 1.0));
  assert_true(mt_close(mt_value(l, 0), 1.0));
  ks_metric_free(m);
  ks_metric_free(l);
}

static void binary_empty_update_counts_and_divides_to_zero(void **st) {
  (void)st;
  ks_metric *m = mt_make("BinaryPrecision", NULL);
  ks_tensor e = mt_tensor(KS_F32, NULL, 1, 0, 0), et = mt_tensor(KS_I64, NULL, 1, 0, 0);
  mt_update2(m, e, et);
  assert_int_equal(ks_metric_update_count(m), 1);
  assert_true(mt_value(m, 0) == 0.0);
  ks_metric_free(m);
}

static void binary_rejects_bad_inputs_unchanged(void **st) {
  (void)st;
  float p[2] = {0.1f, 0.7f}, p3[3] = {0, 0, 0}, tf[2] = {NAN, 1};
  int64_t t[2] = {0, 1}, t2[2] = {0, 2}, lp[2] = {0, 3};
  ks_metric *m = mt_make("BinaryAccuracy", "{\"ignore_index\":-1}");
  mt_update2(m, F32V(p), I64V(t));
  mt_rejects2(m, F32V(p3), I64V(t), KS_E_SHAPE);
  mt_rejects2(m, F32V(p), I64V(t2), KS_E_VALUE);
  mt_rejects2(m, F32V(p), F32V(tf), KS_E_VALUE);
  mt_rejects2(m, I64V(lp), I64V(t), KS_E_VALUE);
  ks_tensor one = F32V(p);
  mt_rejects(m, &one, 1, KS_E_INVALID);
  ks_tensor broken = F32V(p);
  broken.nbytes = 4;
  mt_rejects2(m, broken, I64V(t), KS_E_SHAPE);
  ks_metric_free(m);
}

static void binary_confusion_matrix_ignores_before_the_logit_test(void **st) {
  (void)st;
  /* The ignored 5.0 must not turn the others into logits (stat scores would). */
  float p[3] = {0.6f, 0.4f, 5.0f};
  int64_t t[3] = {1, 0, -1};
  ks_metric *cm = mt_make("BinaryConfusionMatrix", "{\"ignore_index\":-1}");
  ks_metric *acc = mt_make("BinaryAccuracy", "{\"ignore_index\":-1}");
  mt_update2(cm, F32V(p), I64V(t));
  mt_update2(acc, F32V(p), I64V(t));
  assert_true(mt_value(cm, 0) == 1 && mt_value(cm, 3) == 1 && mt_value(cm, 1) == 0);
  assert_true(mt_close(mt_value(acc, 0), 0.5)); /* sigmoid(0.4) > 0.5: a false positive */
  ks_metric_free(cm);
  ks_metric_free(acc);
}

/* ---- curves ---- */

static void auroc_orders_scores(void **st) {
  (void)st;
  float p[4] = {0.1f, 0.4f, 0.35f, 0.8f};
  int64_t t[4] = {0, 0, 1, 1};
  ks_metric *a = mt_make("BinaryAUROC", NULL), *ap = mt_make("BinaryAveragePrecision", NULL);
  ks_metric *binned = mt_make("BinaryAUROC", "{\"thresholds\":[0.0,0.2,0.38,0.5,1.0]}");
  mt_update2(a, F32V(p), I64V(t));
  mt_update2(ap, F32V(p), I64V(t));
  mt_update2(binned, F32V(p), I64V(t));
  assert_true(mt_close(mt_value(a, 0), 0.75));
  assert_true(mt_close(mt_value(ap, 0), (1.0 * 0.5 + 0.5 * (2.0 / 3.0))));
  assert_true(mt_close(mt_value(binned, 0), 0.75));
  ks_metric_free(a);
  ks_metric_free(ap);
  ks_metric_free(binned);
}

static void binned_counts_preds_at_or_above_each_threshold(void **st) {
  (void)st;
  float p[6] = {0.0f, 0.25f, 0.5f, 0.75f, 1.0f, 0.3f};
  int64_t t[6] = {1, 1, 1, 1, 1, 1}, want[5] = {6, 5, 3, 2, 1};
  ks_metric *a = mt_make("BinaryAUROC", "{\"thresholds\":5}");
  ks_metric *l = mt_make("BinaryAUROC", "{\"thresholds\":[0.0,0.25,0.5,0.75,1.0]}");
  mt_update2(a, F32V(p), I64V(t));
  mt_update2(l, F32V(p), I64V(t));
  ks_tensor ca, cl;
  assert_int_equal(ks_metric_state_info(a, 0, NULL, NULL, &ca), KS_OK);
  assert_int_equal(ks_metric_state_info(l, 0, NULL, NULL, &cl), KS_OK);
  for (int k = 0; k < 5; k++) {
    assert_int_equal(((int64_t *)ca.data)[k * 4 + 3], want[k]);
    assert_int_equal(((int64_t *)cl.data)[k * 4 + 3], want[k]);
  }
  ks_metric_free(a);
  ks_metric_free(l);
}

static void exact_curves_need_samples(void **st) {
  (void)st;
  ks_metric *a = mt_make("BinaryAUROC", NULL);
  const ks_tensor *out;
  assert_int_equal(ks_metric_compute(a, &out, NULL), KS_E_STATE);
  ks_metric_free(a);
}

static void auroc_without_positives_is_zero(void **st) {
  (void)st;
  float p[3] = {0.1f, 0.5f, 0.9f};
  int64_t t[3] = {0, 0, 0};
  ks_metric *a = mt_make("BinaryAUROC", NULL);
  mt_update2(a, F32V(p), I64V(t));
  assert_true(mt_value(a, 0) == 0.0);
  ks_metric_free(a);
}

static void curves_reject_integer_preds(void **st) {
  (void)st;
  int64_t p[2] = {0, 1}, t[2] = {0, 1};
  ks_metric *a = mt_make("BinaryAUROC", "{\"thresholds\":5}");
  mt_rejects2(a, I64V(p), I64V(t), KS_E_DTYPE);
  ks_metric_free(a);
}

static void multiclass_auroc_softmaxes_logits(void **st) {
  (void)st;
  float logits[3 * 3] = {5, 0, 0, 0, 5, 0, 0, 0, 5}, probs[3 * 3];
  for (int i = 0; i < 9; i++) probs[i] = logits[i] > 0 ? 0.98f : 0.01f;
  int64_t t[3] = {0, 1, 2};
  ks_metric *a = mt_make("MulticlassAUROC", "{\"num_classes\":3}"),
            *b = mt_make("MulticlassAUROC", "{\"num_classes\":3}");
  mt_update2(a, mt_tensor(KS_F32, logits, 2, 3, 3), I64V(t));
  mt_update2(b, mt_tensor(KS_F32, probs, 2, 3, 3), I64V(t));
  assert_true(mt_close(mt_value(a, 0), 1.0));
  ks_tensor cur;
  assert_int_equal(ks_metric_state_info(a, 0, NULL, NULL, &cur), KS_OK);
  assert_true(((float *)cur.data)[0] < 1.0f && ((float *)cur.data)[0] > 0.98f); /* stored softmaxed */
  assert_true(mt_close(mt_value(b, 0), 1.0));
  ks_metric_free(a);
  ks_metric_free(b);
}

/* ---- multiclass ---- */

static void multiclass_never_seen_class_is_zero_and_skipped_by_macro(void **st) {
  (void)st;
  int64_t p[4] = {0, 1, 0, 1}, t[4] = {0, 1, 0, 1};
  ks_metric *none = mt_make("MulticlassRecall", "{\"num_classes\":3,\"average\":\"none\"}");
  ks_metric *macro = mt_make("MulticlassRecall", "{\"num_classes\":3}");
  mt_update2(none, I64V(p), I64V(t));
  mt_update2(macro, I64V(p), I64V(t));
  assert_true(mt_value(none, 0) == 1 && mt_value(none, 1) == 1 && mt_value(none, 2) == 0);
  assert_true(mt_value(macro, 0) == 1.0);
  ks_metric_free(none);
  ks_metric_free(macro);
}

static void multiclass_all_one_class(void **st) {
  (void)st;
  int64_t p[3] = {2, 2, 2}, t[3] = {2, 2, 2};
  static const char *const avgs[] = {"micro", "macro", "weighted"};
  for (int i = 0; i < 3; i++) {
    char args[96];
    snprintf(args, sizeof args, "{\"num_classes\":3,\"average\":\"%s\"}", avgs[i]);
    ks_metric *m = mt_make("MulticlassF1Score", args);
    mt_update2(m, I64V(p), I64V(t));
    assert_true(mt_close(mt_value(m, 0), 1.0));
    ks_metric_free(m);
  }
}

static void multiclass_ignore_index_only_batch_changes_nothing(void **st) {
  (void)st;
  float logits[2 * 3] = {1, 2, 3, 3, 2, 1};
  int64_t t[2] = {-100, -100};
  ks_metric *m = mt_make("MulticlassAccuracy", "{\"num_classes\":3,\"ignore_index\":-100}");
  ks_statedict *before = mt_snapshot(m);
  mt_update2(m, mt_tensor(KS_F32, logits, 2, 2, 3), I64V(t));
  assert_true(mt_unchanged(m, before));
  assert_int_equal(ks_metric_update_count(m), 1);
  assert_true(mt_value(m, 0) == 0.0);
  ks_statedict_free(before);
  ks_metric_free(m);
}

static void multiclass_argmax_prefers_nan_and_first_tie(void **st) {
  (void)st;
  float logits[3 * 3] = {0.1f, NAN, 0.5f, 0.7f, 0.7f, 0.1f, 0, 0, 1};
  int64_t t[3] = {1, 0, 2};
  ks_metric *m = mt_make("MulticlassAccuracy", "{\"num_classes\":3,\"average\":\"micro\"}");
  mt_update2(m, mt_tensor(KS_F32, logits, 2, 3, 3), I64V(t));
  assert_true(mt_value(m, 0) == 1.0);
  ks_metric_free(m);
}

static void multiclass_top_k_counts_hits_in_the_k_best(void **st) {
  (void)st;
  float logits[2 * 4] = {0.1f, 0.2f, 0.3f, 0.4f, 0.4f, 0.3f, 0.2f, 0.1f};
  int64_t t[2] = {2, 3};
  ks_metric *m = mt_make("MulticlassAccuracy", "{\"num_classes\":4,\"top_k\":2,\"average\":\"micro\"}");
  mt_update2(m, mt_tensor(KS_F32, logits, 2, 2, 4), I64V(t));
  assert_true(mt_close(mt_value(m, 0), 0.5));
  ks_metric_free(m);
}

static void multiclass_rejects_bad_inputs_unchanged(void **st) {
  (void)st;
  float logits[2 * 3] = {1, 2, 3, 3, 2, 1}, wide[2 * 4] = {0}, tf[2] = {NAN, 1};
  int64_t t[2] = {0, 1}, t3[3] = {0, 1, 2}, bad[2] = {0, 3}, neg[2] = {-1, 0}, ilog[6] = {0};
  ks_metric *m = mt_make("MulticlassPrecision", "{\"num_classes\":3}");
  ks_tensor lg = mt_tensor(KS_F32, logits, 2, 2, 3);
  mt_update2(m, lg, I64V(t));
  mt_rejects2(m, lg, I64V(bad), KS_E_VALUE);
  mt_rejects2(m, lg, I64V(neg), KS_E_VALUE);
  mt_rejects2(m, lg, F32V(tf), KS_E_VALUE);
  mt_rejects2(m, lg, I64V(t3), KS_E_SHAPE);
  mt_rejects2(m, mt_tensor(KS_F32, wide, 2, 2, 4), I64V(t), KS_E_SHAPE);
  mt_rejects2(m, mt_tensor(KS_I64, ilog, 2, 2, 3), I64V(t), KS_E_DTYPE);
  mt_rejects2(m, I64V(bad), I64V(t), KS_E_VALUE);
  ks_metric_free(m);
}

static void multiclass_accepts_other_label_dtypes(void **st) {
  (void)st;
  int32_t p[3] = {0, 1, 2};
  uint8_t t[3] = {0, 1, 1};
  ks_metric *m = mt_make("MulticlassAccuracy", "{\"num_classes\":3,\"average\":\"micro\"}");
  mt_update2(m, mt_tensor(KS_I32, p, 1, 3, 0), mt_tensor(KS_U8, t, 1, 3, 0));
  assert_true(mt_close(mt_value(m, 0), 2.0 / 3.0));
  ks_metric_free(m);
}

static void confusion_matrix_normalizes_nan_rows_to_zero(void **st) {
  (void)st;
  int64_t p[3] = {0, 1, 1}, t[3] = {0, 0, 1};
  ks_metric *m = mt_make("MulticlassConfusionMatrix", "{\"num_classes\":3,\"normalize\":\"true\"}");
  mt_update2(m, I64V(p), I64V(t));
  assert_true(mt_close(mt_value(m, 0), 0.5) && mt_close(mt_value(m, 1), 0.5) && mt_value(m, 4) == 1.0);
  assert_true(mt_value(m, 6) == 0.0 && mt_value(m, 8) == 0.0); /* class 2 never a target */
  ks_metric_free(m);
}

static void jaccard_averages_seen_classes(void **st) {
  (void)st;
  int64_t p[4] = {0, 0, 1, 1}, t[4] = {0, 1, 1, 1};
  ks_metric *m = mt_make("MulticlassJaccardIndex", "{\"num_classes\":3}");
  ks_metric *none = mt_make("MulticlassJaccardIndex", "{\"num_classes\":3,\"average\":\"none\"}");
  mt_update2(m, I64V(p), I64V(t));
  mt_update2(none, I64V(p), I64V(t));
  assert_true(mt_close(mt_value(none, 0), 0.5) && mt_close(mt_value(none, 1), 2.0 / 3.0) && mt_value(none, 2) == 0);
  assert_true(mt_close(mt_value(m, 0), (0.5 + 2.0 / 3.0) / 2));
  ks_metric_free(m);
  ks_metric_free(none);
}

/* ---- multilabel ---- */

static void multilabel_scores_labels_independently(void **st) {
  (void)st;
  float p[2 * 2] = {0.9f, 0.1f, 0.8f, 0.7f};
  int64_t t[2 * 2] = {1, 0, 1, 0}, bad[4] = {1, 2, 0, 0};
  ks_metric *acc = mt_make("MultilabelAccuracy", "{\"num_labels\":2}");
  ks_metric *f1 = mt_make("MultilabelF1Score", "{\"num_labels\":2,\"average\":\"micro\"}");
  ks_tensor tp = mt_tensor(KS_F32, p, 2, 2, 2), tt = mt_tensor(KS_I64, t, 2, 2, 2);
  mt_update2(acc, tp, tt);
  mt_update2(f1, tp, tt);
  assert_true(mt_close(mt_value(acc, 0), (1.0 + 0.5) / 2));
  assert_true(mt_close(mt_value(f1, 0), 2.0 * 2 / (2.0 * 2 + 1)));
  mt_rejects2(acc, tp, mt_tensor(KS_I64, bad, 2, 2, 2), KS_E_VALUE);
  mt_rejects2(acc, mt_tensor(KS_F32, p, 2, 1, 4), mt_tensor(KS_I64, t, 2, 1, 4), KS_E_SHAPE);
  ks_metric_free(acc);
  ks_metric_free(f1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(binary_treats_floats_outside_unit_interval_as_logits),
      cmocka_unit_test(binary_nan_prediction_is_negative),
      cmocka_unit_test(binary_threshold_and_label_preds),
      cmocka_unit_test(binary_empty_update_counts_and_divides_to_zero),
      cmocka_unit_test(binary_rejects_bad_inputs_unchanged),
      cmocka_unit_test(binary_confusion_matrix_ignores_before_the_logit_test),
      cmocka_unit_test(auroc_orders_scores),
      cmocka_unit_test(binned_counts_preds_at_or_above_each_threshold),
      cmocka_unit_test(exact_curves_need_samples),
      cmocka_unit_test(auroc_without_positives_is_zero),
      cmocka_unit_test(curves_reject_integer_preds),
      cmocka_unit_test(multiclass_auroc_softmaxes_logits),
      cmocka_unit_test(multiclass_never_seen_class_is_zero_and_skipped_by_macro),
      cmocka_unit_test(multiclass_all_one_class),
      cmocka_unit_test(multiclass_ignore_index_only_batch_changes_nothing),
      cmocka_unit_test(multiclass_argmax_prefers_nan_and_first_tie),
      cmocka_unit_test(multiclass_top_k_counts_hits_in_the_k_best),
      cmocka_unit_test(multiclass_rejects_bad_inputs_unchanged),
      cmocka_unit_test(multiclass_accepts_other_label_dtypes),
      cmocka_unit_test(confusion_matrix_normalizes_nan_rows_to_zero),
      cmocka_unit_test(jaccard_averages_seen_classes),
      cmocka_unit_test(multilabel_scores_labels_independently),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
