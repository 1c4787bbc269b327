/*
 * Malformed inputs: each is rejected with a specific status and a location, in
 * both reader modes, without a crash. With KS_WRITE_CORPUS=<dir> set, every
 * case is also written there as a seed for the safetensors fuzz corpus.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/internal.h"
#include "format/fmt_internal.h"
#include "test_format_helpers.h"

static char *tmp_dir;

static int setup(void **state) {
  (void)state;
  tmp_dir = ks_test_tmpdir("fmt-bad");
  return tmp_dir ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  ks_test_rmtree(tmp_dir);
  free(tmp_dir);
  return 0;
}

static void save_corpus(const char *name, const uint8_t *b, size_t len) {
  const char *dir = getenv("KS_WRITE_CORPUS");
  if (!dir || !*dir) return;
  char *p = ks_test_path(dir, name);
  ks_test_write_file(p, b, len);
  free(p);
}

/* Opens `b` in every mode (lazy through a table over the bytes); each must fail with `want`, naming `key` (or no key)
 * and containing `msg`. */
static void expect_reject(const char *name, const uint8_t *b, size_t len, ks_status want, const char *key,
                          const char *msg) {
  save_corpus(name, b, len);
  for (int mode = 0; mode <= KS_READ_LAZY; mode++) {
    ks_error err;
    ks_status st = fmt_open_status(b, len, (ks_read_mode)mode, &err);
    if (st != want) fail_msg("%s: got %s (%s), want %s", name, ks_status_name(st), err.message, ks_status_name(want));
    assert_string_equal(err.file, "<buffer>");
    if (key) assert_string_equal(err.key, key);
    if (msg && !strstr(err.message, msg)) fail_msg("%s: message '%s' lacks '%s'", name, err.message, msg);
    assert_true(err.offset >= 0 && (size_t)err.offset <= len);
  }
}

static void expect_reject_header(const char *name, const char *header, size_t dlen, ks_status want, const char *key,
                                 const char *msg) {
  uint8_t data[64] = {0};
  size_t len;
  uint8_t *b = fmt_build(header, data, dlen, &len);
  expect_reject(name, b, len, want, key, msg);
  free(b);
}

static void expect_accept(const char *name, const char *header, size_t dlen, size_t ntensors) {
  uint8_t data[64] = {0};
  size_t len;
  uint8_t *b = fmt_build(header, data, dlen, &len);
  save_corpus(name, b, len);
  ks_reader *r;
  ks_error err;
  if (ks_reader_open_buffer(b, len, NULL, &r, &err)) fail_msg("%s: rejected: %s", name, err.message);
  assert_int_equal(ks_reader_count(r), ntensors);
  assert_int_equal(ks_reader_verify(r, NULL, NULL, NULL), KS_OK);
  ks_reader_free(r);
  free(b);
}

#define T(name, dt, shape, b, e)                                                                                       \
  "\"" name "\":{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":[" #b "," #e "]}"

static void reader_rejects_header_length_past_eof(void **state) {
  (void)state;
  size_t len;
  uint8_t *b = fmt_build("{" T("a", "F32", "[2]", 0, 8) "}", "12345678", 8, &len);
  ks__put_le64(b, 1000);
  expect_reject("header_past_eof", b, len, KS_E_FORMAT, NULL, "past the end of the file");
  expect_reject("shorter_than_prefix", b, 5, KS_E_FORMAT, NULL, "too short");
  free(b);
}

static void reader_rejects_header_over_100mb(void **state) {
  (void)state;
  uint8_t b[16] = {0};
  ks__put_le64(b, 100000001);
  expect_reject("header_100mb", b, sizeof b, KS_E_LIMIT, NULL, "exceeds the limit");
}

static void reader_rejects_overlapping_offsets(void **state) {
  (void)state;
  expect_reject_header("overlap", "{" T("a", "F32", "[2]", 0, 8) "," T("b", "F32", "[2]", 4, 12) "}", 12,
                       KS_E_FORMAT, "b", "overlap");
}

static void reader_rejects_holed_offsets(void **state) {
  (void)state;
  expect_reject_header("hole", "{" T("a", "F32", "[2]", 0, 8) "," T("b", "F32", "[2]", 12, 20) "}", 20,
                       KS_E_FORMAT, "b", "hole");
  expect_reject_header("hole_at_start", "{" T("a", "F32", "[2]", 4, 12) "}", 12, KS_E_FORMAT, "a", "hole");
}

static void reader_rejects_reversed_offsets(void **state) {
  (void)state;
  expect_reject_header("reversed", "{" T("a", "U8", "[0]", 8, 0) "}", 8, KS_E_FORMAT, "a", "end before");
}

static void reader_accepts_header_order_unlike_data_order(void **state) {
  (void)state;
  expect_accept("valid_unordered", "{" T("b", "F32", "[2]", 8, 16) "," T("a", "F32", "[2]", 0, 8) "}", 16, 2);
}

static void reader_rejects_trailing_bytes(void **state) {
  (void)state;
  expect_reject_header("trailing", "{" T("a", "F32", "[2]", 0, 8) "}", 12, KS_E_FORMAT, NULL, "trailing");
  expect_reject_header("trailing_no_tensors", "{}", 1, KS_E_FORMAT, NULL, "trailing");
}

static void reader_rejects_data_past_eof(void **state) {
  (void)state;
  expect_reject_header("data_past_eof", "{" T("a", "F32", "[2]", 0, 8) "}", 4, KS_E_FORMAT, "a", "past the end");
}

static void reader_rejects_shape_product_overflow(void **state) {
  (void)state;
  expect_reject_header("shape_overflow", "{" T("a", "F32", "[4294967296,4294967296,16]", 0, 0) "}", 0, KS_E_LIMIT,
                       "a", "overflows");
  expect_reject_header("shape_wraps_to_zero", "{" T("a", "U8", "[4294967296,4294967296]", 0, 0) "}", 0, KS_E_LIMIT,
                       "a", "overflows");
}

static void reader_rejects_size_unlike_shape(void **state) {
  (void)state;
  expect_reject_header("size_mismatch", "{" T("a", "F32", "[3]", 0, 8) "}", 8, KS_E_SHAPE, "a", "needs 12");
}

static void reader_rejects_unknown_dtype(void **state) {
  (void)state;
  expect_reject_header("unknown_dtype", "{" T("a", "F128", "[1]", 0, 16) "}", 16, KS_E_DTYPE, "a", "F128");
  expect_reject_header("lowercase_dtype", "{" T("a", "f32", "[1]", 0, 4) "}", 4, KS_E_DTYPE, "a", "f32");
}

static void reader_rejects_duplicate_keys(void **state) {
  (void)state;
  expect_reject_header("duplicate_tensor", "{" T("a", "F32", "[1]", 0, 4) "," T("a", "F32", "[1]", 4, 8) "}", 8,
                       KS_E_EXISTS, "a", "duplicate");
  expect_reject_header("duplicate_field",
                       "{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                       KS_E_EXISTS, "a", "duplicate");
  expect_reject_header("duplicate_meta", "{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0, KS_E_EXISTS, NULL,
                       "duplicate");
  expect_reject_header("duplicate_meta_object", "{\"__metadata__\":{},\"__metadata__\":{}}", 0, KS_E_EXISTS, NULL,
                       "duplicate");
}

static void reader_rejects_non_utf8_header(void **state) {
  (void)state;
  const char *h = "{\"a\xff\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}";
  size_t len;
  uint8_t *b = fmt_build(h, NULL, 0, &len);
  expect_reject("non_utf8", b, len, KS_E_FORMAT, NULL, "UTF-8");
  ks_error err;
  fmt_open_status(b, len, KS_READ_MMAP, &err);
  assert_int_equal(err.offset, 8 + 3); /* the 0xff byte */
  free(b);
  expect_reject_header("overlong_utf8", "{\"\xc0\xaf\":{}}", 0, KS_E_FORMAT, NULL, "UTF-8");
  expect_reject_header("lone_surrogate", "{\"\\ud800\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0,
                       KS_E_FORMAT, NULL, "surrogate");
}

static void reader_rejects_invalid_json(void **state) {
  (void)state;
  expect_reject_header("not_json", "{\"a\": ", 0, KS_E_FORMAT, NULL, "JSON");
  expect_reject_header("top_level_array", "[]", 0, KS_E_FORMAT, NULL, "not a JSON object");
  expect_reject_header("garbage_after", "{} x", 0, KS_E_FORMAT, NULL, "after the object");
  expect_reject_header("raw_newline_in_string", "{\"a\nb\":{}}", 0, KS_E_FORMAT, NULL, "control");
  expect_reject_header("nul_escape", "{\"a\\u0000\":{}}", 0, KS_E_FORMAT, NULL, "u0000");
  expect_reject_header("bad_number", "{\"a\":{\"x\":01,\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0,
                       KS_E_FORMAT, NULL, "number");
  char deep[400] = "{\"a\":{\"x\":"; /* levels 1 and 2, then 130 more: past the limit of 127 */
  for (int i = 0; i < 130; i++) strcat(deep, "[");
  expect_reject_header("deep_nesting", deep, 0, KS_E_LIMIT, NULL, "deeper");
}

static void reader_rejects_bad_tensor_entries(void **state) {
  (void)state;
  expect_reject_header("entry_not_object", "{\"a\":[1]}", 0, KS_E_FORMAT, "a", "not an object");
  expect_reject_header("missing_offsets", "{\"a\":{\"dtype\":\"U8\",\"shape\":[0]}}", 0, KS_E_FORMAT, "a",
                       "data_offsets");
  expect_reject_header("negative_offset", "{" T("a", "U8", "[0]", -1, 0) "}", 0, KS_E_FORMAT, "a", "non-negative");
  expect_reject_header("float_offset", "{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0.0,0]}}", 0,
                       KS_E_FORMAT, "a", "non-negative");
  expect_reject_header("three_offsets", "{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0,0]}}", 0,
                       KS_E_FORMAT, "a", "exactly");
  expect_reject_header("huge_offset", "{" T("a", "U8", "[0]", 0, 99999999999999999999999) "}", 0, KS_E_LIMIT, "a",
                       "64 bits");
  expect_reject_header("rank_9", "{" T("a", "U8", "[1,1,1,1,1,1,1,1,1]", 0, 1) "}", 1, KS_E_LIMIT, "a", "rank");
  expect_reject_header("meta_not_string", "{\"__metadata__\":{\"k\":1}}", 0, KS_E_FORMAT, "__metadata__",
                       "not a string");
  char longname[1100 + 100];
  memset(longname, 0, sizeof longname);
  strcpy(longname, "{\"");
  memset(longname + 2, 'n', KS_MAX_NAME + 1);
  strcat(longname, "\":{}}");
  expect_reject_header("name_too_long", longname, 0, KS_E_LIMIT, NULL, "exceeds the limit");
}

static void reader_accepts_edge_cases_of_the_spec(void **state) {
  (void)state;
  expect_accept("valid_empty", "{}", 0, 0);
  expect_accept("valid_meta_null", "{\"__metadata__\":null}", 0, 0);
  expect_accept("valid_empty_and_0d",
                "{" T("e", "F32", "[0,3]", 0, 0) "," T("s", "F64", "[]", 0, 8) "," T("e2", "U8", "[5,0]", 8, 8) "}",
                8, 3);
  expect_accept(
      "valid_unknown_fields",
      "{\"a\":{\"x\":{\"y\":[1,-2.5e3,true,null,\"s\"]},\"dtype\":\"I8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2, 1);
  expect_accept("valid_escaped_name",
                "{\"caf\\u00e9\\ud83d\\ude00\\n\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, 1);
  size_t len;
  uint8_t *b = fmt_build("{\"caf\\u00e9\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", "x", 1, &len);
  ks_reader *r;
  assert_int_equal(ks_reader_open_buffer(b, len, NULL, &r, NULL), KS_OK);
  assert_int_equal(ks_reader_find(r, "caf\xc3\xa9"), 0);
  ks_reader_free(r);
  free(b);
}

static void reader_rejects_newer_format_version(void **state) {
  (void)state;
  expect_reject_header("version_2",
                       "{\"__metadata__\":{\"keepsake.format\":\"keepsake\",\"keepsake.format_version\":\"2\"}}", 0,
                       KS_E_VERSION, KS_META_FORMAT_VERSION, "version 2");
  expect_reject_header("version_garbage",
                       "{\"__metadata__\":{\"keepsake.format\":\"keepsake\",\"keepsake.format_version\":\"x1\"}}", 0,
                       KS_E_FORMAT, KS_META_FORMAT_VERSION, "version");
}

/* A small keepsake file, as bytes. */
static uint8_t *small_file(size_t *len) {
  ks_statedict *sd = fmt_small_dict(5);
  char *path = ks_test_path(tmp_dir, "small.ks");
  assert_int_equal(ks_save(path, sd, NULL, NULL, NULL), KS_OK);
  uint8_t *b = ks_test_read_file(path, len);
  ks_statedict_free(sd);
  free(path);
  return b;
}

static void reader_rejects_truncation_at_every_byte(void **state) {
  (void)state;
  size_t len;
  uint8_t *b = small_file(&len);
  save_corpus("valid_keepsake", b, len);
  char *path = ks_test_path(tmp_dir, "cut.ks");
  for (size_t cut = 0; cut < len; cut++) {
    for (int mode = 0; mode <= KS_READ_LAZY; mode++) {
      ks_error err;
      ks_status st = fmt_open_status(b, cut, (ks_read_mode)mode, &err);
      if (st != KS_E_FORMAT) fail_msg("cut at %zu: %s (%s)", cut, ks_status_name(st), err.message);
    }
    ks_test_write_file(path, b, cut);
    ks_reader *r = NULL;
    assert_int_equal(ks_reader_open(path, NULL, &r, NULL), KS_E_FORMAT);
    assert_null(r);
  }
  save_corpus("truncated_in_header", b, len / 3);
  save_corpus("truncated_in_data", b, len - 3);
  free(path);
  free(b);
}

static void verify_catches_a_flipped_data_bit(void **state) {
  (void)state;
  size_t len;
  uint8_t *b = small_file(&len);
  b[len - 1] ^= 0x10; /* last byte of the last tensor ("step") */
  save_corpus("flipped_bit", b, len);
  ks_reader *r;
  assert_int_equal(ks_reader_open_buffer(b, len, NULL, &r, NULL), KS_OK); /* structure is fine */
  ks_error err;
  assert_int_equal(ks_reader_verify(r, NULL, NULL, &err), KS_E_CHECKSUM);
  assert_string_equal(err.key, "step");
  assert_int_equal(err.offset, (int64_t)len - 8);
  assert_int_equal(ks__reader_verify_tensor(r, 0, NULL), KS_OK);
  assert_int_equal(ks__reader_verify_tensor(r, 1, NULL), KS_E_CHECKSUM);
  ks_reader_free(r);
  ks_read_opts o = {.alloc = NULL, .mode = KS_READ_COPY, .verify_checksums = 1};
  assert_int_equal(ks_reader_open_buffer(b, len, &o, &r, &err), KS_E_CHECKSUM);
  assert_string_equal(err.key, "step");
  free(b);
}

static int count_problem(void *ctx, const ks_error *e) {
  (void)e;
  (*(int *)ctx)++;
  return 0;
}

static void verify_reports_every_problem(void **state) {
  (void)state;
  size_t len;
  uint8_t *b = small_file(&len);
  ks_reader *r;
  assert_int_equal(ks_reader_open_buffer(b, len, NULL, &r, NULL), KS_OK);
  ks_tensor_info info;
  assert_int_equal(ks_reader_tensor_info(r, 0, &info), KS_OK);
  ks_reader_free(r);
  b[info.begin] ^= 1;
  b[len - 1] ^= 1;
  assert_int_equal(ks_reader_open_buffer(b, len, NULL, &r, NULL), KS_OK);
  int problems = 0;
  ks_error err;
  assert_int_equal(ks_reader_verify(r, count_problem, &problems, &err), KS_E_CHECKSUM);
  assert_int_equal(problems, 2);
  assert_string_equal(err.key, "model/w");
  ks_reader_free(r);
  free(b);
}

static void verify_rejects_a_tampered_checksum_table(void **state) {
  (void)state;
  const char *h = "{\"__metadata__\":{\"keepsake.format\":\"keepsake\",\"keepsake.format_version\":\"1\","
                  "\"keepsake.scalars\":\"{}\",\"keepsake.checksums\":\"{\\\"ghost\\\":\\\"0000000000000000\\\"}\"},"
                  T("a", "U8", "[1]", 0, 1) "}";
  size_t len;
  uint8_t *b = fmt_build(h, "x", 1, &len);
  save_corpus("checksum_table_tampered", b, len);
  ks_reader *r;
  assert_int_equal(ks_reader_open_buffer(b, len, NULL, &r, NULL), KS_OK);
  int problems = 0;
  ks_error err;
  assert_int_equal(ks_reader_verify(r, count_problem, &problems, &err), KS_E_FORMAT);
  assert_int_equal(problems, 2); /* "ghost" is not a tensor; "a" has no checksum */
  assert_string_equal(err.key, "ghost");
  ks_reader_free(r);
  free(b);
}

static void reader_loads_a_file_with_every_scalar_kind(void **state) {
  (void)state;
  ks_statedict *sd = fmt_small_dict(6);
  assert_int_equal(ks_statedict_set_int(sd, "i", -42, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_float(sd, "f", 0.1, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_float(sd, "inf", 1.0 / 0.0, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_bool(sd, "b", 1, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_null(sd, "n", NULL), KS_OK);
  int64_t shape[2] = {2, 0};
  assert_int_equal(ks_statedict_new_tensor(sd, "empty", KS_BF16, 2, shape, NULL, NULL), KS_OK);
  char *path = ks_test_path(tmp_dir, "scalars.ks");
  assert_int_equal(ks_save(path, sd, NULL, NULL, NULL), KS_OK);
  size_t len;
  uint8_t *b = ks_test_read_file(path, &len);
  save_corpus("valid_scalars", b, len);
  ks_statedict *got;
  assert_int_equal(ks_load_buffer(b, len, NULL, &got, NULL, NULL), KS_OK);
  assert_int_equal(ks_statedict_count(got), ks_statedict_count(sd));
  ks_statedict_free(got);
  free(b);
  free(path);
  ks_statedict_free(sd);
}

static void reader_open_survives_every_allocation_failure(void **state) {
  (void)state;
  size_t len;
  uint8_t *b = small_file(&len);
  char *path = ks_test_path(tmp_dir, "small.ks");
  for (int mode = 0; mode <= KS_READ_LAZY; mode++) {
    for (long n = 1;; n++) {
      ks_test_alloc ta;
      ks_test_alloc_init(&ta, n);
      ks_read_opts o = {.alloc = &ta.a, .mode = (ks_read_mode)mode, .verify_checksums = 1};
      ks_statedict *sd = NULL;
      ks_meta *meta = NULL;
      ks_status st = ks_load(path, &o, &sd, &meta, NULL);
      if (st) {
        assert_int_equal(st, KS_E_NOMEM);
        assert_null(sd);
      }
      ks_statedict_free(sd);
      ks_meta_free(meta);
      assert_int_equal(ta.live, 0);
      if (!st) break;
    }
  }
  free(path);
  free(b);
}

static void reader_refuses_a_fifo_without_waiting_for_a_writer(void **state) {
  (void)state;
  char *path = ks_test_path(tmp_dir, "fifo");
  assert_int_equal(mkfifo(path, 0600), 0);
  alarm(10); /* a blocking open would wait forever: let the alarm fail the test instead */
  ks_reader *r = NULL;
  ks_error err;
  assert_int_equal(ks_reader_open(path, NULL, &r, &err), KS_E_IO);
  alarm(0);
  assert_null(r);
  assert_non_null(strstr(err.message, "not a regular file"));
  unlink(path);
  free(path);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(reader_rejects_header_length_past_eof),
      cmocka_unit_test(reader_rejects_header_over_100mb),
      cmocka_unit_test(reader_rejects_overlapping_offsets),
      cmocka_unit_test(reader_rejects_holed_offsets),
      cmocka_unit_test(reader_rejects_reversed_offsets),
      cmocka_unit_test(reader_accepts_header_order_unlike_data_order),
      cmocka_unit_test(reader_rejects_trailing_bytes),
      cmocka_unit_test(reader_rejects_data_past_eof),
      cmocka_unit_test(reader_rejects_shape_product_overflow),
      cmocka_unit_test(reader_rejects_size_unlike_shape),
      cmocka_unit_test(reader_rejects_unknown_dtype),
      cmocka_unit_test(reader_rejects_duplicate_keys),
      cmocka_unit_test(reader_rejects_non_utf8_header),
      cmocka_unit_test(reader_rejects_invalid_json),
      cmocka_unit_test(reader_rejects_bad_tensor_entries),
      cmocka_unit_test(reader_accepts_edge_cases_of_the_spec),
      cmocka_unit_test(reader_rejects_newer_format_version),
      cmocka_unit_test(reader_rejects_truncation_at_every_byte),
      cmocka_unit_test(verify_catches_a_flipped_data_bit),
      cmocka_unit_test(verify_reports_every_problem),
      cmocka_unit_test(verify_rejects_a_tampered_checksum_table),
      cmocka_unit_test(reader_loads_a_file_with_every_scalar_kind),
      cmocka_unit_test(reader_open_survives_every_allocation_failure),
      cmocka_unit_test(reader_refuses_a_fifo_without_waiting_for_a_writer),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
