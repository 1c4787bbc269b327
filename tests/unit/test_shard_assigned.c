/*
 * Per-rank state at another world size: ks_shard_assigned is the rule ks_shard_load_rank applies
 * (every rank of every M from 1 to 6 loads the metric fold and the RNG the rule names, from a
 * checkpoint of 4 saved ranks whose metrics identify them), its bounds, and the metric fold of
 * ranks whose list states are empty (a binding writes an empty list with a dtype of its choosing:
 * it neither blocks a load nor decides the merged dtype).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "keepsake/keepsake.h"
#include "testutil.h"

#define SAVED 4

/* Saved rank s: a SumMetric holding 2^s after one update, and an RNG seeded s + 1. */
static void write_rank(const char *dir, int s, ks_shard_file_info *info) {
  ks_statedict *sd;
  ks_meta *meta;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  assert_int_equal(ks_meta_create(NULL, &meta, NULL), KS_OK);
  static const char *const ts[4] = {"epoch", "batch", "sample", "token"};
  for (int i = 0; i < 4; i++) {
    char k[64];
    snprintf(k, sizeof k, "state/timestamp/Timestamp/%s", ts[i]);
    assert_int_equal(ks_statedict_set_int(sd, k, i + 1, NULL), KS_OK);
  }
  ks_rng rng;
  ks_rng_seed(&rng, (uint64_t)s + 1);
  assert_int_equal(ks_test_save(ks_rng_stateful(&rng), sd, "rng/0/", NULL), KS_OK);
  ks_metric *m;
  assert_int_equal(ks_metric_create("SumMetric", NULL, NULL, &m, NULL), KS_OK);
  float v = (float)(1 << s);
  ks_tensor t;
  assert_int_equal(ks_tensor_init(&t, KS_F32, 0, NULL, &v), KS_OK);
  assert_int_equal(ks_metric_update(m, &t, 1, NULL), KS_OK);
  assert_int_equal(ks_metric_to_state_dict(m, sd, "state/train_metrics/S/state_dict/", NULL), KS_OK);
  assert_int_equal(ks_statedict_set_null(sd, "state/train_metrics/S/_computed", NULL), KS_OK);
  char json[256];
  snprintf(json, sizeof json,
           "{\"state/train_metrics/S\":{\"class\":\"SumMetric\",\"args\":%s,\"schema_version\":2,\"update_count\":1}}",
           ks_metric_args_json(m));
  assert_int_equal(ks_meta_set(meta, "keepsake.metrics", json, NULL), KS_OK);
  ks_metric_free(m);
  ks_save_opts so = {.io = ks_test_io_nosync()};
  ks_error err;
  assert_int_equal(ks_shard_write_rank(dir, s, SAVED, sd, meta, NULL, NULL, 0, &so, info, &err), KS_OK);
  ks_statedict_free(sd);
  ks_meta_free(meta);
}

static void the_loader_follows_the_rule(void **state) {
  (void)state;
  char *root = ks_test_tmpdir("assigned");
  char *dir = ks_test_path(root, "ep1-ba2");
  assert_int_equal(mkdir(dir, 0777), 0);
  ks_shard_file_info infos[SAVED];
  for (int s = 0; s < SAVED; s++) write_rank(dir, s, &infos[s]);
  ks_save_opts so = {.io = ks_test_io_nosync()};
  ks_error err;
  assert_int_equal(ks_shard_write_index(dir, SAVED, infos, &so, &err), KS_OK);
  ks_shard_index *idx;
  assert_int_equal(ks_shard_index_read(dir, NULL, NULL, &idx, &err), KS_OK);
  for (int m = 1; m <= 6; m++) {
    int covered = 0, next = 0;
    for (int r = 0; r < m; r++) {
      int lo = -1, hi = -1, first = -1;
      assert_int_equal(ks_shard_assigned(SAVED, m, r, &lo, &hi, &first, &err), KS_OK);
      /* Contiguous blocks in rank order covering every saved rank once; floor(s*M/N) == r. */
      assert_int_equal(lo, next);
      assert_true(hi >= lo);
      next = hi;
      for (int s = lo; s < hi; s++) assert_int_equal(s * m / SAVED, r);
      assert_int_equal(first, lo < hi ? lo : r % SAVED);
      if (m == SAVED) assert_true(lo == r && hi == r + 1);
      ks_statedict *sd;
      ks_meta *meta;
      assert_int_equal(ks_shard_load_rank(dir, idx, r, m, NULL, NULL, &sd, &meta, &err), KS_OK);
      const ks_tensor *t = ks_statedict_tensor(sd, "state/train_metrics/S/state_dict/sum_value");
      assert_non_null(t);
      int want = 0; /* the saved ranks folded here, as a bit mask; none: the default, 0 */
      for (int s = lo; s < hi; s++) want |= 1 << s;
      assert_true(*(const float *)t->data == (float)want);
      covered |= want;
      ks_rng got, exp;
      assert_int_equal(ks_test_load(ks_rng_stateful(&got), sd, "rng/0/", &err), KS_OK);
      ks_rng_seed(&exp, (uint64_t)first + 1);
      assert_true(ks_rng_next(&got) == ks_rng_next(&exp));
      ks_statedict_free(sd);
      ks_meta_free(meta);
    }
    assert_int_equal(next, SAVED);
    assert_int_equal(covered, (1 << SAVED) - 1);
  }
  ks_shard_index_free(idx);
  ks_test_rmtree(root);
  free(dir);
  free(root);
}

static void bounds_are_checked(void **state) {
  (void)state;
  int lo, hi, first;
  ks_error err;
  assert_int_equal(ks_shard_assigned(2, 4, 1, &lo, &hi, &first, &err), KS_OK);
  assert_true(lo == 1 && hi == 1 && first == 1); /* 2 -> 4: saved 0 -> 0, saved 1 -> 2; rank 1 has none */
  assert_int_equal(ks_shard_assigned(4, 3, 0, &lo, &hi, &first, &err), KS_OK);
  assert_true(lo == 0 && hi == 2 && first == 0);
  assert_int_equal(ks_shard_assigned(0, 1, 0, &lo, &hi, &first, &err), KS_E_INVALID);
  assert_int_equal(ks_shard_assigned(2, 0, 0, &lo, &hi, &first, &err), KS_E_INVALID);
  assert_int_equal(ks_shard_assigned(2, 2, 2, &lo, &hi, &first, &err), KS_E_INVALID);
  assert_int_equal(ks_shard_assigned(2, 2, -1, &lo, &hi, &first, &err), KS_E_INVALID);
  assert_int_equal(ks_shard_assigned(KS_SHARD_MAX_WORLD + 1, 2, 0, &lo, &hi, &first, &err), KS_E_INVALID);
  assert_int_equal(ks_shard_assigned(2, 2, 0, NULL, &hi, &first, &err), KS_E_INVALID);
}

/* A described metric with one list state of any dtype. */
static ks_metric *listed(void) {
  ks_metric *m;
  assert_int_equal(ks_metric_describe("Seen", NULL, NULL, &m, NULL), KS_OK);
  int64_t row[1] = {0};
  assert_int_equal(ks_metric_describe_state(m, "seen", KS_REDUCE_CAT, KS_F32, 1, row, KS_STATE_ANY_DTYPE, NULL),
                   KS_OK);
  return m;
}

static void fill(ks_metric *m, const char *state, ks_dtype dt, int64_t rows, int64_t base) {
  ks_statedict *sd;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  void *p;
  int64_t shape[1] = {rows};
  assert_int_equal(ks_statedict_new_tensor(sd, state, dt, 1, shape, &p, NULL), KS_OK);
  for (int64_t i = 0; i < rows; i++) ks_dtype_set_f64(dt, p, (size_t)i, (double)(base + i));
  ks_error err;
  assert_int_equal(ks_metric_load_state_dict(m, sd, "", KS_METRIC_SCHEMA_VERSION, 0, NULL, NULL, &err), KS_OK);
  ks_statedict_free(sd);
}

static void empty_lists_take_the_rows_dtype(void **state) {
  (void)state;
  /* Ranks 0 and 2 hold I64 rows, ranks 1 and 3 none (stored as empty F32): any order of the fold. */
  ks_metric *parts[4];
  for (int q = 0; q < 4; q++) {
    parts[q] = listed();
    if (q % 2 == 0) fill(parts[q], "seen", KS_I64, 2, 10 * q);
    else fill(parts[q], "seen", KS_F32, 0, 0);
  }
  ks_metric *acc = NULL;
  ks_error err;
  assert_int_equal(ks_metric_fold((const ks_metric *const *)parts, 4, NULL, &acc, &err), KS_OK);
  ks_tensor t;
  assert_int_equal(ks_metric_state_info(acc, 0, NULL, NULL, &t), KS_OK);
  assert_int_equal(t.dtype, KS_I64);
  assert_int_equal(t.shape[0], 4);
  const int64_t want[4] = {0, 1, 20, 21};
  assert_memory_equal(t.data, want, sizeof want);
  ks_metric_free(acc);
  /* Rows of two dtypes cannot be concatenated. */
  fill(parts[1], "seen", KS_F32, 1, 5);
  assert_int_equal(ks_metric_fold((const ks_metric *const *)parts, 2, NULL, &acc, &err), KS_E_MISMATCH);
  for (int q = 0; q < 4; q++) ks_metric_free(parts[q]);

  /* A catalogue list state of a fixed dtype (MulticlassAUROC's I64 target) takes an empty F32 list,
     but still refuses F32 rows (narrowing). */
  ks_metric *auroc;
  assert_int_equal(ks_metric_create("MulticlassAUROC", "{\"num_classes\":3}", NULL, &auroc, &err), KS_OK);
  ks_statedict *sd;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  void *p;
  int64_t none[1] = {0}, preds[2] = {0, 3};
  assert_int_equal(ks_statedict_new_tensor(sd, "preds", KS_F32, 2, preds, &p, NULL), KS_OK);
  assert_int_equal(ks_statedict_new_tensor(sd, "target", KS_F32, 1, none, &p, NULL), KS_OK);
  assert_int_equal(ks_metric_load_state_dict(auroc, sd, "", KS_METRIC_SCHEMA_VERSION, 0, NULL, NULL, &err), KS_OK);
  const char *name;
  for (size_t i = 0; i < ks_metric_state_count(auroc); i++) {
    assert_int_equal(ks_metric_state_info(auroc, i, &name, NULL, &t), KS_OK);
    if (!strcmp(name, "target")) assert_true(t.dtype == KS_I64 && t.shape[0] == 0);
  }
  ks_statedict_free(sd);
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  int64_t one_row[2] = {1, 3}, one[1] = {1};
  assert_int_equal(ks_statedict_new_tensor(sd, "preds", KS_F32, 2, one_row, &p, NULL), KS_OK);
  memset(p, 0, 3 * sizeof(float));
  assert_int_equal(ks_statedict_new_tensor(sd, "target", KS_F32, 1, one, &p, NULL), KS_OK);
  memset(p, 0, sizeof(float));
  assert_int_equal(ks_metric_load_state_dict(auroc, sd, "", KS_METRIC_SCHEMA_VERSION, 0, NULL, NULL, &err),
                   KS_E_DTYPE);
  ks_statedict_free(sd);
  ks_metric_free(auroc);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(the_loader_follows_the_rule),
      cmocka_unit_test(bounds_are_checked),
      cmocka_unit_test(empty_lists_take_the_rows_dtype),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
