/* Save/load round trips: every dtype, 0-d, empty and non-finite tensors, every scalar kind. */
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>

#include <cmocka.h>

#include "test_format_helpers.h"

static char *tmp_dir;

static int setup(void **state) {
  (void)state;
  tmp_dir = ks_test_tmpdir("fmt-rt");
  return tmp_dir ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  ks_test_rmtree(tmp_dir);
  free(tmp_dir);
  return 0;
}

/* Fills n bytes deterministically, including NaN/inf bit patterns for floats. */
static void fill_bytes(uint8_t *p, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    p[i] = (uint8_t)(seed >> 24);
  }
}

static ks_statedict *every_kind_dict(void) {
  ks_statedict *sd;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  char name[64];
  for (int dt = 0; dt < KS_DTYPE_COUNT; dt++) {
    int64_t shape[3] = {3, 1, 5};
    void *data;
    snprintf(name, sizeof name, "dtypes/%s", ks_dtype_name((ks_dtype)dt));
    assert_int_equal(ks_statedict_new_tensor(sd, name, (ks_dtype)dt, 3, shape, &data, NULL), KS_OK);
    fill_bytes(data, 15 * ks_dtype_size((ks_dtype)dt), (uint32_t)dt + 1);
    snprintf(name, sizeof name, "scalar0d/%s", ks_dtype_name((ks_dtype)dt));
    assert_int_equal(ks_statedict_new_tensor(sd, name, (ks_dtype)dt, 0, NULL, &data, NULL), KS_OK);
    fill_bytes(data, ks_dtype_size((ks_dtype)dt), (uint32_t)dt + 100);
  }
  int64_t empty[2] = {0, 4};
  assert_int_equal(ks_statedict_new_tensor(sd, "empty", KS_F32, 2, empty, NULL, NULL), KS_OK);
  int64_t four = 4;
  double *nf;
  assert_int_equal(ks_statedict_new_tensor(sd, "nonfinite", KS_F64, 1, &four, (void **)&nf, NULL), KS_OK);
  nf[0] = NAN, nf[1] = INFINITY, nf[2] = -INFINITY, nf[3] = -0.0;
  uint64_t payload_nan = 0xfff0000000000123ull;
  double pn;
  memcpy(&pn, &payload_nan, 8);
  assert_int_equal(ks_statedict_set_int(sd, "s/int_min", INT64_MIN, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_int(sd, "s/int_max", INT64_MAX, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_float(sd, "s/tenth", 0.1, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_float(sd, "s/neg_zero", -0.0, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_float(sd, "s/denormal", 4.9406564584124654e-324, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_float(sd, "s/big", 1.7976931348623157e308, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_float(sd, "s/integral", 3.0, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_float(sd, "s/nan", NAN, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_float(sd, "s/nan_payload", pn, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_float(sd, "s/inf", INFINITY, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_float(sd, "s/ninf", -INFINITY, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_bool(sd, "s/yes", 1, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_bool(sd, "s/no", 0, NULL), KS_OK);
  assert_int_equal(
      ks_statedict_set_string(sd, "s/str", "quote\" backslash\\ newline\n tab\t ctl\x01 \xc3\xa9\xe2\x82\xac", NULL),
      KS_OK);
  assert_int_equal(ks_statedict_set_string(sd, "s/empty_str", "", NULL), KS_OK);
  assert_int_equal(ks_statedict_set_null(sd, "s/none", NULL), KS_OK);
  return sd;
}

static void assert_same_entry(const ks_entry *a, const ks_entry *b) {
  assert_string_equal(a->name, b->name);
  assert_int_equal(a->kind, b->kind);
  if (a->kind == KS_VAL_TENSOR) {
    assert_int_equal(a->tensor.dtype, b->tensor.dtype);
    assert_true(ks_tensor_same_shape(&a->tensor, &b->tensor));
    assert_int_equal(a->tensor.nbytes, b->tensor.nbytes);
    if (a->tensor.nbytes) assert_memory_equal(a->tensor.data, b->tensor.data, a->tensor.nbytes);
  } else if (a->kind == KS_VAL_FLOAT) {
    assert_memory_equal(&a->f, &b->f, sizeof a->f); /* bit-exact, NaN payloads and -0 included */
  } else if (a->kind == KS_VAL_STRING) {
    assert_string_equal(a->s, b->s);
  } else {
    assert_int_equal(a->i, b->i);
  }
}

/* Tensors come back in file order, then scalars in saved order. */
static void assert_same_dict(const ks_statedict *want, const ks_statedict *got) {
  assert_int_equal(ks_statedict_count(want), ks_statedict_count(got));
  for (size_t i = 0; i < ks_statedict_count(want); i++) {
    ks_entry a, b;
    assert_int_equal(ks_statedict_at(want, i, &a), KS_OK);
    assert_int_equal(ks_statedict_get(got, a.name, &b), KS_OK);
    assert_same_entry(&a, &b);
  }
}

static void roundtrip_preserves_every_dtype_and_scalar_kind(void **state) {
  (void)state;
  ks_statedict *sd = every_kind_dict();
  char *path = ks_test_path(tmp_dir, "all.ks");
  ks_meta *extra;
  assert_int_equal(ks_meta_create(NULL, &extra, NULL), KS_OK);
  assert_int_equal(ks_meta_set(extra, "keepsake.metrics", "{\"acc\":{\"class\":\"MeanMetric\"}}", NULL), KS_OK);
  ks_error err;
  assert_int_equal(ks_save(path, sd, extra, NULL, &err), KS_OK);
  for (int mode = 0; mode < 2; mode++) {
    ks_read_opts o = {.alloc = NULL, .mode = (ks_read_mode)mode, .verify_checksums = 1};
    ks_statedict *got;
    ks_meta *meta;
    assert_int_equal(ks_load(path, &o, &got, &meta, &err), KS_OK);
    assert_same_dict(sd, got);
    assert_string_equal(ks_meta_get(meta, "keepsake.metrics"), "{\"acc\":{\"class\":\"MeanMetric\"}}");
    assert_string_equal(ks_meta_get(meta, KS_META_FORMAT), "keepsake");
    assert_string_equal(ks_meta_get(meta, KS_META_FORMAT_VERSION), "1");
    ks_statedict_free(got);
    ks_meta_free(meta);
  }
  size_t len;
  uint8_t *bytes = ks_test_read_file(path, &len);
  for (int mode = 0; mode < 2; mode++) {
    ks_read_opts o = {.alloc = NULL, .mode = (ks_read_mode)mode, .verify_checksums = 1};
    ks_statedict *got;
    assert_int_equal(ks_load_buffer(bytes, len, &o, &got, NULL, &err), KS_OK);
    assert_same_dict(sd, got);
    ks_statedict_free(got);
  }
  free(bytes);
  ks_meta_free(extra);
  ks_statedict_free(sd);
  free(path);
}

static void copy_mode_outlives_the_file(void **state) {
  (void)state;
  ks_statedict *sd = fmt_small_dict(3);
  char *path = ks_test_path(tmp_dir, "copy.ks");
  assert_int_equal(ks_save(path, sd, NULL, NULL, NULL), KS_OK);
  ks_read_opts o = {.alloc = NULL, .mode = KS_READ_COPY, .verify_checksums = 0};
  ks_reader *r;
  assert_int_equal(ks_reader_open(path, &o, &r, NULL), KS_OK);
  ks_statedict *other = fmt_small_dict(9);
  assert_int_equal(ks_save(path, other, NULL, NULL, NULL), KS_OK); /* replace the file underneath */
  ks_tensor v;
  assert_int_equal(ks_reader_tensor(r, "model/w", &v, NULL), KS_OK);
  assert_memory_equal(v.data, ks_statedict_tensor(sd, "model/w")->data, v.nbytes);
  ks_reader_free(r);
  ks_statedict_free(other);
  ks_statedict_free(sd);
  free(path);
}

static void writer_aligns_data_and_keeps_insertion_order(void **state) {
  (void)state;
  ks_statedict *sd;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  const char *names[] = {"z", "a", "m/1", "b"};
  for (int i = 0; i < 4; i++) {
    int64_t n = i + 1;
    assert_int_equal(ks_statedict_new_tensor(sd, names[i], KS_U8, 1, &n, NULL, NULL), KS_OK);
  }
  char *path = ks_test_path(tmp_dir, "order.ks");
  assert_int_equal(ks_save(path, sd, NULL, NULL, NULL), KS_OK);
  ks_reader *r;
  assert_int_equal(ks_reader_open(path, NULL, &r, NULL), KS_OK);
  assert_int_equal(ks_reader_data_offset(r) % KS_DATA_ALIGN, 0);
  uint64_t expect_begin = ks_reader_data_offset(r);
  for (size_t i = 0; i < 4; i++) {
    ks_tensor_info info;
    assert_int_equal(ks_reader_tensor_info(r, i, &info), KS_OK);
    assert_string_equal(info.name, names[i]);
    assert_int_equal(info.begin, expect_begin);
    expect_begin = info.end;
  }
  assert_true(ks_reader_is_keepsake(r));
  assert_int_equal(ks_reader_find(r, "m/1"), 2);
  assert_int_equal(ks_reader_find(r, "nope"), -1);
  ks_error err;
  assert_int_equal(ks_reader_tensor(r, "nope", NULL, &err), KS_E_NOTFOUND);
  assert_string_equal(err.key, "nope");
  ks_reader_free(r);
  ks_statedict_free(sd);
  free(path);
}

static void save_refuses_reserved_names(void **state) {
  (void)state;
  ks_statedict *sd = fmt_small_dict(1);
  char *path = ks_test_path(tmp_dir, "reserved.ks");
  ks_meta *extra;
  assert_int_equal(ks_meta_create(NULL, &extra, NULL), KS_OK);
  assert_int_equal(ks_meta_set(extra, KS_META_CHECKSUMS, "{}", NULL), KS_OK);
  ks_error err;
  assert_int_equal(ks_save(path, sd, extra, NULL, &err), KS_E_INVALID);
  assert_string_equal(err.key, KS_META_CHECKSUMS);
  assert_int_equal(ks_statedict_set_int(sd, "__metadata__", 1, NULL), KS_OK);
  assert_int_equal(ks_save(path, sd, NULL, NULL, &err), KS_E_INVALID);
  assert_false(ks_test_exists(path));
  ks_meta_free(extra);
  ks_statedict_free(sd);
  free(path);
}

static void empty_dict_roundtrips(void **state) {
  (void)state;
  ks_statedict *sd, *got;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  char *path = ks_test_path(tmp_dir, "empty.ks");
  assert_int_equal(ks_save(path, sd, NULL, NULL, NULL), KS_OK);
  assert_int_equal(ks_load(path, NULL, &got, NULL, NULL), KS_OK);
  assert_int_equal(ks_statedict_count(got), 0);
  ks_statedict_free(got);
  ks_statedict_free(sd);
  free(path);
}

/* Correctness at 100k entries; how fast that is belongs to `make bench` (bench_io). */
static void hundred_thousand_tensors_roundtrip(void **state) {
  (void)state;
  ks_statedict *sd;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  char name[64];
  for (int i = 0; i < 100000; i++) {
    int64_t n = 4;
    float *d;
    snprintf(name, sizeof name, "model/layers.%d/block.%d/weight", i / 100, i % 100);
    assert_int_equal(ks_statedict_new_tensor(sd, name, KS_F32, 1, &n, (void **)&d, NULL), KS_OK);
    d[0] = (float)i;
  }
  char *path = ks_test_path(tmp_dir, "many.ks");
  ks_save_opts so = {.io = ks_test_io_nosync()};
  assert_int_equal(ks_save(path, sd, NULL, &so, NULL), KS_OK);
  ks_reader *r;
  assert_int_equal(ks_reader_open(path, NULL, &r, NULL), KS_OK);
  assert_int_equal(ks_reader_count(r), 100000);
  ks_tensor v;
  assert_int_equal(ks_reader_tensor(r, "model/layers.999/block.99/weight", &v, NULL), KS_OK);
  float last;
  memcpy(&last, v.data, 4);
  assert_true(last == 99999.0f);
  assert_int_equal(ks_reader_verify(r, NULL, NULL, NULL), KS_OK);
  ks_reader_free(r);
  ks_statedict_free(sd);
  free(path);
}

static void meta_keeps_order_and_replaces_in_place(void **state) {
  (void)state;
  ks_meta *m;
  assert_int_equal(ks_meta_create(NULL, &m, NULL), KS_OK);
  assert_int_equal(ks_meta_set(m, "b", "1", NULL), KS_OK);
  assert_int_equal(ks_meta_set(m, "a", "2", NULL), KS_OK);
  assert_int_equal(ks_meta_set(m, "b", "3", NULL), KS_OK);
  assert_int_equal(ks_meta_count(m), 2);
  const char *k, *v;
  assert_int_equal(ks_meta_at(m, 0, &k, &v), KS_OK);
  assert_string_equal(k, "b");
  assert_string_equal(v, "3");
  assert_null(ks_meta_get(m, "c"));
  assert_int_equal(ks_meta_at(m, 2, &k, &v), KS_E_NOTFOUND);
  assert_int_equal(ks_meta_set(m, "bad", "\xff", NULL), KS_E_INVALID);
  for (int i = 0; i < 1000; i++) {
    char key[16];
    snprintf(key, sizeof key, "k%d", i);
    assert_int_equal(ks_meta_set(m, key, key, NULL), KS_OK);
  }
  assert_string_equal(ks_meta_get(m, "k777"), "k777");
  ks_meta_free(m);
}

static void meta_survives_every_allocation_failure(void **state) {
  (void)state;
  for (long n = 1;; n++) {
    ks_test_alloc ta;
    ks_test_alloc_init(&ta, n);
    ks_meta *m = NULL;
    ks_status st = ks_meta_create(&ta.a, &m, NULL);
    for (int i = 0; !st && i < 40; i++) {
      char key[16];
      snprintf(key, sizeof key, "key%d", i);
      size_t before = ks_meta_count(m);
      st = ks_meta_set(m, key, "value", NULL);
      if (st) assert_int_equal(ks_meta_count(m), before);
    }
    if (st) assert_int_equal(st, KS_E_NOMEM);
    ks_meta_free(m);
    assert_int_equal(ta.live, 0);
    if (!st) break;
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(roundtrip_preserves_every_dtype_and_scalar_kind),
      cmocka_unit_test(copy_mode_outlives_the_file),
      cmocka_unit_test(writer_aligns_data_and_keeps_insertion_order),
      cmocka_unit_test(save_refuses_reserved_names),
      cmocka_unit_test(empty_dict_roundtrips),
      cmocka_unit_test(hundred_thousand_tensors_roundtrip),
      cmocka_unit_test(meta_keeps_order_and_replaces_in_place),
      cmocka_unit_test(meta_survives_every_allocation_failure),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
