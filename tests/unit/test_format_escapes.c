/* Names that need JSON escaping, and integers at the ends of their range, survive the writer. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "format/fmt_internal.h"
#include "test_format_helpers.h"

static const char *const odd_names[] = {
    "quote\"d", "back\\slash", "ctl\x01\x1f end", "nl\n cr\r tab\t bs\b ff\f",
    "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", "\\\"\\u0000",
};
#define N_ODD (sizeof odd_names / sizeof odd_names[0])

static ks_statedict *odd_dict(float *data) {
  ks_statedict *sd;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  int64_t shape[1] = {2};
  for (size_t i = 0; i < N_ODD; i++) {
    ks_tensor t;
    data[2 * i] = (float)i;
    data[2 * i + 1] = -(float)i - 0.5f;
    assert_int_equal(ks_tensor_init(&t, KS_F32, 1, shape, data + 2 * i), KS_OK);
    assert_int_equal(ks_statedict_set_tensor(sd, odd_names[i], &t, KS_BORROW, NULL), KS_OK);
  }
  return sd;
}

static bool contains(const uint8_t *hay, size_t n, const char *needle) {
  size_t k = strlen(needle);
  for (size_t i = 0; i + k <= n; i++)
    if (!memcmp(hay + i, needle, k)) return true;
  return false;
}

static char *save_to_tmp(const ks_statedict *sd, char **dir) {
  *dir = ks_test_tmpdir("fmt-esc");
  assert_non_null(*dir);
  char *path = ks_test_path(*dir, "odd.ks");
  assert_int_equal(ks_save(path, sd, NULL, NULL, NULL), KS_OK);
  return path;
}

static void odd_names_roundtrip_and_verify(void **state) {
  (void)state;
  float data[2 * N_ODD];
  ks_statedict *sd = odd_dict(data);
  char *dir, *path = save_to_tmp(sd, &dir);
  ks_read_opts o = {.alloc = NULL, .mode = KS_READ_COPY, .verify_checksums = 1};
  ks_reader *r;
  ks_error err;
  assert_int_equal(ks_reader_open(path, &o, &r, &err), KS_OK);
  for (size_t i = 0; i < N_ODD; i++) {
    ks_tensor v;
    assert_int_equal(ks_reader_tensor(r, odd_names[i], &v, NULL), KS_OK);
    assert_memory_equal(v.data, data + 2 * i, 2 * sizeof(float));
    assert_int_equal(ks__reader_verify_tensor(r, i, NULL), KS_OK);
  }
  ks_reader_free(r);
  ks_test_rmtree(dir);
  free(dir);
  free(path);
  ks_statedict_free(sd);
}

/* The checksum table is JSON inside a JSON string: names are escaped twice there. */
static void checksum_table_escapes_names_twice(void **state) {
  (void)state;
  float data[2 * N_ODD];
  ks_statedict *sd = odd_dict(data);
  char *dir, *path = save_to_tmp(sd, &dir);
  size_t len;
  uint8_t *bytes = ks_test_read_file(path, &len);
  assert_non_null(bytes);
  const char *want[] = {"\\\"quote\\\\\\\"d\\\"", "\\\"back\\\\\\\\slash\\\"", "\\\"ctl\\\\u0001\\\\u001f end\\\"",
                        "\\\"nl\\\\n cr\\\\r tab\\\\t bs\\\\u0008 ff\\\\u000c\\\""};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
    assert_true(contains(bytes, len, want[i]));
  free(bytes);
  ks_test_rmtree(dir);
  free(dir);
  free(path);
  ks_statedict_free(sd);
}

static void int64_extremes_roundtrip(void **state) {
  (void)state;
  ks_statedict *sd, *back;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_int(sd, "min", INT64_MIN, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_int(sd, "max", INT64_MAX, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_int(sd, "ten", 10, NULL), KS_OK);
  char *dir, *path = save_to_tmp(sd, &dir);
  ks_reader *r;
  assert_int_equal(ks_reader_open(path, NULL, &r, NULL), KS_OK);
  assert_int_equal(ks_statedict_create(NULL, &back, NULL), KS_OK);
  assert_int_equal(ks_reader_scalars(r, back, NULL), KS_OK);
  ks_entry e;
  assert_int_equal(ks_statedict_get(back, "min", &e), KS_OK);
  assert_true(e.i == INT64_MIN);
  assert_int_equal(ks_statedict_get(back, "max", &e), KS_OK);
  assert_true(e.i == INT64_MAX);
  assert_int_equal(ks_statedict_get(back, "ten", &e), KS_OK);
  assert_true(e.i == 10);
  ks_reader_free(r);
  ks_statedict_free(back);
  ks_test_rmtree(dir);
  free(dir);
  free(path);
  ks_statedict_free(sd);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(odd_names_roundtrip_and_verify),
      cmocka_unit_test(checksum_table_escapes_names_twice),
      cmocka_unit_test(int64_extremes_roundtrip),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
