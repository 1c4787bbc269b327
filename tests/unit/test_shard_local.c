/*
 * One sharded layout (docs/FORMAT.md 9.2). A DCP save whose ranks hand ks_shard_dcp_write_rank
 * their own entries keeps each rank's in its own file under the names a C program gives them,
 * so the MPI loader (ks_shard_load_rank) reads them; ks_shard_load_local gives a rank its own at
 * the saved world size and the first saved rank's (metrics folded) at another, without DCP's
 * items; and a directory keepsake 0.2 wrote (rank<r>/ DCP items, tests/fixtures/dcp/manager_v02)
 * is read under the same names. Every allocation failure of ks_shard_load_local leaks nothing.
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

#define FIXTURE_02 KS_SOURCE_DIR "/tests/fixtures/dcp/manager_v02/plain"

static int64_t int_of(const ks_statedict *sd, const char *name) {
  ks_entry e;
  assert_int_equal(ks_statedict_get(sd, name, &e), KS_OK);
  assert_int_equal(e.kind, KS_VAL_INT);
  return e.i;
}

static float f32_of(const ks_statedict *sd, const char *name) {
  ks_entry e;
  assert_int_equal(ks_statedict_get(sd, name, &e), KS_OK);
  assert_int_equal(e.kind, KS_VAL_TENSOR);
  assert_int_equal(e.tensor.dtype, KS_F32);
  float v;
  memcpy(&v, e.tensor.data, sizeof v);
  return v;
}

static int has(const ks_statedict *sd, const char *name) {
  ks_entry e;
  return ks_statedict_get(sd, name, &e) == KS_OK;
}

static int any_prefixed(const ks_statedict *sd, const char *prefix) {
  for (size_t i = 0; i < ks_statedict_count(sd); i++) {
    ks_entry e;
    if (!ks_statedict_at(sd, i, &e) && !strncmp(e.name, prefix, strlen(prefix))) return 1;
  }
  return 0;
}

/* Rank r of 2 of a DCP save: the DCP item "model.w" (rank 0 writes it), and its own state: the timestamp,
   a data position 10 + r, an RNG tensor and a MeanMetric holding r + 1 (weight 1). */
static void write_dcp_rank(const char *dir, int r, ks_shard_file_info *info) {
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
  assert_int_equal(ks_statedict_set_int(sd, "state/dataset_state/loader/pos", 10 + r, NULL), KS_OK);
  int64_t rng[2] = {100 + r, 200 + r};
  ks_tensor t;
  int64_t two = 2;
  assert_int_equal(ks_tensor_init(&t, KS_I64, 1, &two, rng), KS_OK);
  assert_int_equal(ks_statedict_set_tensor(sd, "rng/0/state", &t, KS_COPY, NULL), KS_OK);
  ks_metric *m;
  assert_int_equal(ks_metric_create("MeanMetric", NULL, NULL, &m, NULL), KS_OK);
  float v = (float)(r + 1);
  assert_int_equal(ks_tensor_init(&t, KS_F32, 0, NULL, &v), KS_OK);
  assert_int_equal(ks_metric_update(m, &t, 1, NULL), KS_OK);
  assert_int_equal(ks_metric_to_state_dict(m, sd, "state/train_metrics/mean/state_dict/", NULL), KS_OK);
  assert_int_equal(ks_statedict_set_null(sd, "state/train_metrics/mean/_computed", NULL), KS_OK);
  char json[256];
  snprintf(json, sizeof json,
           "{\"state/train_metrics/mean\":{\"class\":\"MeanMetric\",\"args\":%s,\"schema_version\":2,"
           "\"update_count\":1}}",
           ks_metric_args_json(m));
  assert_int_equal(ks_meta_set(meta, "keepsake.metrics", json, NULL), KS_OK);
  ks_metric_free(m);
  float w[3] = {1, 2, 3};
  ks_shard_dcp_item item = {.fqn = "model.w", .whole = 1,
                            .data = {.dtype = KS_F32, .rank = 1, .shape = {3}, .data = w, .nbytes = sizeof w},
                            .global_shape = {3}};
  ks_shard_dcp_rank rk = {.rank = r, .world_size = 2, .items = &item, .n_items = r == 0, .entries = sd,
                          .meta = meta, .per_rank = 1, .dcp = 1,
                          .planner_data = r == 0 ? "{\"dict\":[[\"model.w\",{\"tuple\":[\"model\",\"w\"]}]]}" : NULL};
  ks_save_opts so = {.io = ks_test_io_nosync()};
  ks_error err;
  ks_status st = ks_shard_dcp_write_rank(dir, &rk, &so, info, &err);
  if (st) fail_msg("rank %d: %s", r, err.message);
  ks_meta_free(meta);
  ks_statedict_free(sd);
}

static char *write_dcp_dir(char **root) {
  *root = ks_test_tmpdir("shard_local");
  char *dir = ks_test_path(*root, "ckpt");
  assert_int_equal(mkdir(dir, 0755), 0);
  ks_shard_file_info infos[2];
  for (int r = 0; r < 2; r++) write_dcp_rank(dir, r, &infos[r]);
  ks_save_opts so = {.io = ks_test_io_nosync()};
  assert_int_equal(ks_shard_write_index(dir, 2, infos, &so, NULL), KS_OK);
  return dir;
}

static void the_mpi_loader_reads_a_dcp_save(void **state) {
  (void)state;
  char *root, *dir = write_dcp_dir(&root);
  ks_shard_index *idx;
  assert_int_equal(ks_shard_index_read(dir, NULL, NULL, &idx, NULL), KS_OK);
  for (int r = 0; r < 2; r++) { /* at the saved world size: each rank its own, under the C names */
    ks_statedict *sd;
    ks_meta *meta;
    assert_int_equal(ks_shard_load_rank(dir, idx, r, 2, NULL, NULL, &sd, &meta, NULL), KS_OK);
    assert_int_equal(int_of(sd, "state/dataset_state/loader/pos"), 10 + r);
    assert_true(f32_of(sd, "state/train_metrics/mean/state_dict/mean_value") == (float)(r + 1));
    assert_true(has(sd, "rng/0/state") && has(sd, "model.w"));
    assert_int_equal(int_of(sd, "state/timestamp/Timestamp/batch"), 2);
    ks_statedict_free(sd);
    ks_meta_free(meta);
  }
  ks_shard_index_free(idx);
  ks_test_rmtree(root);
  free(dir);
  free(root);
}

static void load_local_gives_a_ranks_own_without_dcp_items(void **state) {
  (void)state;
  char *root, *dir = write_dcp_dir(&root);
  ks_shard_index *idx;
  assert_int_equal(ks_shard_index_read(dir, NULL, NULL, &idx, NULL), KS_OK);
  ks_shard_local_kind kind = KS_SHARD_LOCAL_DCP02;
  assert_int_equal(ks_shard_local_layout(dir, idx, NULL, &kind, NULL), KS_OK);
  assert_int_equal(kind, KS_SHARD_LOCAL_NAMED);
  ks_statedict *sd;
  ks_meta *meta;
  assert_int_equal(ks_shard_load_local(dir, idx, 1, 2, NULL, &sd, &meta, NULL), KS_OK);
  assert_int_equal(int_of(sd, "state/dataset_state/loader/pos"), 11);
  assert_true(f32_of(sd, "state/train_metrics/mean/state_dict/mean_value") == 2.0f);
  ks_statedict_free(sd);
  ks_meta_free(meta);
  /* one rank: both folded (1 + 2), saved rank 0's data position; every allocation failure leaks nothing */
  ks_status st = KS_E_NOMEM;
  long n = 1;
  for (; st == KS_E_NOMEM && n < 20000; n++) {
    ks_test_alloc ta;
    ks_test_alloc_init(&ta, n);
    ks_shard_local_opts o = {.alloc = &ta.a, .verify = 1};
    st = ks_shard_load_local(dir, idx, 0, 1, &o, &sd, &meta, NULL);
    if (!st) {
      assert_int_equal(int_of(sd, "state/dataset_state/loader/pos"), 10);
      assert_true(f32_of(sd, "state/train_metrics/mean/state_dict/mean_value") == 3.0f);
      assert_true(f32_of(sd, "state/train_metrics/mean/state_dict/weight") == 2.0f);
      assert_false(has(sd, "model.w")); /* DCP's item: dcp.load reads it */
      ks_statedict_free(sd);
      ks_meta_free(meta);
    }
    assert_int_equal(ta.live, 0);
  }
  assert_int_equal(st, KS_OK);
  assert_true(n > 20);
  ks_shard_index_free(idx);
  ks_test_rmtree(root);
  free(dir);
  free(root);
}

static void a_02_directory_reads_under_the_same_names(void **state) {
  (void)state;
  ks_shard_index *idx;
  assert_int_equal(ks_shard_index_read(FIXTURE_02, NULL, NULL, &idx, NULL), KS_OK);
  ks_shard_local_kind kind = KS_SHARD_LOCAL_NAMED;
  assert_int_equal(ks_shard_local_layout(FIXTURE_02, idx, NULL, &kind, NULL), KS_OK);
  assert_int_equal(kind, KS_SHARD_LOCAL_DCP02);
  for (int r = 0; r < 2; r++) {
    ks_statedict *sd;
    ks_meta *meta;
    ks_error err;
    ks_status st = ks_shard_load_local(FIXTURE_02, idx, r, 2, NULL, &sd, &meta, &err);
    if (st) fail_msg("rank %d: %s", r, err.message);
    assert_int_equal(int_of(sd, "state/dataset_state/loader/pos"), r ? 13 : 10); /* expected.json's loader_pos */
    assert_true(has(sd, "rng/0/torch") && has(sd, "rng/0/python/state"));
    assert_true(has(sd, "state/train_metrics/mean/state_dict/mean_value"));
    assert_false(any_prefixed(sd, "rank"));
    assert_false(any_prefixed(sd, "keepsake.dcp.object/"));
    ks_statedict_free(sd);
    ks_meta_free(meta);
  }
  ks_status st = KS_E_NOMEM;
  for (long n = 1; st == KS_E_NOMEM && n < 20000; n++) {
    ks_test_alloc ta;
    ks_test_alloc_init(&ta, n);
    ks_shard_local_opts o = {.alloc = &ta.a};
    ks_statedict *sd;
    ks_meta *meta;
    st = ks_shard_load_local(FIXTURE_02, idx, 1, 2, &o, &sd, &meta, NULL);
    if (!st) {
      ks_statedict_free(sd);
      ks_meta_free(meta);
    }
    assert_int_equal(ta.live, 0);
  }
  assert_int_equal(st, KS_OK);
  ks_shard_index_free(idx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(the_mpi_loader_reads_a_dcp_save),
      cmocka_unit_test(load_local_gives_a_ranks_own_without_dcp_items),
      cmocka_unit_test(a_02_directory_reads_under_the_same_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
