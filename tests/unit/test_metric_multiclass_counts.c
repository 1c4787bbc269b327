/* Multiclass tp/fp/tn/fn from label inputs, checked against a direct count (small and large class counts). */
#include "metric_helpers.h"

enum { N_SAMPLES = 997 };

static const int64_t *state_i64(const ks_statedict *sd, const char *name) {
  ks_entry e;
  assert_int_equal(ks_statedict_get(sd, name, &e), KS_OK);
  assert_int_equal(e.tensor.dtype, KS_I64);
  return e.tensor.data;
}

/* Per-class counts the way torchmetrics defines them, ignoring targets equal to ign (when has_ign). */
static void expect_counts(ks_metric *m, const int64_t *p, const int64_t *t, size_t n, int64_t C, int has_ign,
                          int64_t ign) {
  ks_statedict *sd = mt_snapshot(m);
  const int64_t *tp = state_i64(sd, "tp"), *fp = state_i64(sd, "fp"), *tn = state_i64(sd, "tn"),
                *fn = state_i64(sd, "fn");
  for (int64_t c = 0; c < C; c++) {
    int64_t e[4] = {0, 0, 0, 0};
    for (size_t i = 0; i < n; i++) {
      if (has_ign && t[i] == ign) continue;
      int y = t[i] == c, q = p[i] == c;
      e[y ? (q ? 0 : 3) : (q ? 1 : 2)]++;
    }
    assert_int_equal(tp[c], e[0]);
    assert_int_equal(fp[c], e[1]);
    assert_int_equal(tn[c], e[2]);
    assert_int_equal(fn[c], e[3]);
  }
  ks_statedict_free(sd);
}

/* Random labels; about one target in 8 is ignore_index, whose pred may be anything. */
static void fill(int64_t *p, int64_t *t, size_t n, int64_t C, int has_ign, int64_t ign, uint64_t *seed) {
  for (size_t i = 0; i < n; i++) {
    t[i] = (int64_t)(mt_rand(seed) * (float)C) % C;
    p[i] = mt_rand(seed) < 0.3f ? t[i] : (int64_t)(mt_rand(seed) * (float)C) % C;
    if (has_ign && mt_rand(seed) < 0.125f) {
      t[i] = ign;
      p[i] = i % 2 ? 12345 : -7;
    }
  }
}

static void multiclass_label_counts_match_direct_count(void **st) {
  (void)st;
  static const int64_t classes[] = {5, 100};
  static const int64_t ignores[] = {-100, 3};
  int64_t p[N_SAMPLES], t[N_SAMPLES];
  uint64_t seed = 7;
  for (size_t ci = 0; ci < 2; ci++)
    for (int v = 0; v < 3; v++) {
      int has_ign = v > 0;
      int64_t C = classes[ci], ign = has_ign ? ignores[v - 1] : 0;
      char args[128];
      if (has_ign) snprintf(args, sizeof args, "{\"num_classes\":%lld,\"average\":\"none\",\"ignore_index\":%lld}",
                            (long long)C, (long long)ign);
      else snprintf(args, sizeof args, "{\"num_classes\":%lld,\"average\":\"none\"}", (long long)C);
      ks_metric *m = mt_make("MulticlassRecall", args);
      fill(p, t, N_SAMPLES, C, has_ign, ign, &seed);
      mt_update2(m, I64V(p), I64V(t));
      expect_counts(m, p, t, N_SAMPLES, C, has_ign, ign);
      ks_metric_free(m);
    }
}

static void multiclass_micro_label_counts_match_direct_count(void **st) {
  (void)st;
  int64_t p[N_SAMPLES], t[N_SAMPLES];
  uint64_t seed = 11;
  fill(p, t, N_SAMPLES, 200, 1, 17, &seed);
  ks_metric *m = mt_make("MulticlassAccuracy", "{\"num_classes\":200,\"average\":\"micro\",\"ignore_index\":17}");
  mt_update2(m, I64V(p), I64V(t));
  int64_t hits = 0, seen = 0;
  for (size_t i = 0; i < N_SAMPLES; i++) {
    if (t[i] == 17) continue;
    seen++;
    hits += p[i] == t[i];
  }
  assert_true(mt_close(mt_value(m, 0), (double)hits / (double)seen));
  ks_metric_free(m);
}

static void multiclass_rejects_late_bad_label_unchanged(void **st) {
  (void)st;
  static const int64_t classes[] = {5, 1000};
  int64_t p[N_SAMPLES], t[N_SAMPLES];
  uint64_t seed = 3;
  for (size_t ci = 0; ci < 2; ci++) {
    char args[96];
    snprintf(args, sizeof args, "{\"num_classes\":%lld,\"ignore_index\":-1}", (long long)classes[ci]);
    ks_metric *m = mt_make("MulticlassF1Score", args);
    fill(p, t, N_SAMPLES, classes[ci], 0, 0, &seed);
    mt_update2(m, I64V(p), I64V(t));
    p[900] = classes[ci];
    mt_rejects2(m, I64V(p), I64V(t), KS_E_VALUE);
    p[900] = 0;
    t[901] = -2;
    mt_rejects2(m, I64V(p), I64V(t), KS_E_VALUE);
    t[901] = -1; /* ignored target: its out-of-range pred is not looked at */
    p[901] = -5;
    ks_tensor in[2] = {I64V(p), I64V(t)};
    assert_int_equal(ks_metric_update(m, in, 2, NULL), KS_OK);
    ks_metric_free(m);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(multiclass_label_counts_match_direct_count),
      cmocka_unit_test(multiclass_micro_label_counts_match_direct_count),
      cmocka_unit_test(multiclass_rejects_late_bad_label_unchanged),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
