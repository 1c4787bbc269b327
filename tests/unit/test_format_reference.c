/*
 * The reader's rules that follow the reference safetensors reader exactly,
 * case by case at each boundary (the differential suite in tests/interop
 * compares whole files with the reference itself; this runs the boundaries
 * under the sanitizers too): JSON nesting to 127 levels, numbers refused as out
 * of range exactly where serde_json refuses them, \u0000 only inside ignored
 * values, and empty tensor names refused.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>

#include <cmocka.h>

#include "format/fmt_internal.h"
#include "test_format_helpers.h"

/* Opens `header` followed by dlen data bytes in both modes, which must agree; returns the status. */
static ks_status open_header(const char *header, size_t dlen, ks_error *err) {
  uint8_t data[8] = {1};
  size_t len;
  uint8_t *b = fmt_build(header, data, dlen, &len);
  ks_status st = fmt_open_status(b, len, KS_READ_MMAP, err);
  ks_error e2;
  assert_int_equal(fmt_open_status(b, len, KS_READ_COPY, &e2), st);
  assert_int_equal(fmt_open_status(b, len, KS_READ_LAZY, &e2), st);
  free(b);
  return st;
}

static const char head[] = "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"x\":";

/* A header whose tensor "a" carries an ignored field "x" with the given JSON value. */
static ks_status open_with_ignored(const char *value, ks_error *err) {
  size_t n = strlen(head) + strlen(value) + 3;
  char *h = malloc(n);
  snprintf(h, n, "%s%s}}", head, value);
  ks_status st = open_header(h, 1, err);
  free(h);
  return st;
}

static bool out_of_range(const char *s) { return ks__json_number_out_of_range((const uint8_t *)s, strlen(s)); }

static void numbers_out_of_range_where_serde_json_says(void **state) {
  (void)state;
  static const char *const in_range[] = {
      "0", "-0", "18446744073709551615", "-9223372036854775809", "123456789012345678901234567890",
      "1e308", "-1e308", "1.7976931348623157e308", "17976931348623157e292", "1e-999", "1e-2147483649",
      "0e2147483648", "0.0e99999999999", "1.5", "-2.5e-3", "10e307", "1844674407370955161.5e289"};
  static const char *const out[] = {
      "1e309", "-1e309", "1e999", "1.8e308", "1.7976931348623158e308", "17976931348623158e292",
      "1e2147483648", "-1e2147483648", "18446744073709551616.5e291", "1844674407370955161.5e290"};
  for (size_t i = 0; i < sizeof in_range / sizeof *in_range; i++)
    if (out_of_range(in_range[i])) fail_msg("%s: refused, the reference reads it", in_range[i]);
  for (size_t i = 0; i < sizeof out / sizeof *out; i++)
    if (!out_of_range(out[i])) fail_msg("%s: read, the reference refuses it", out[i]);
  /* 1 followed by 308 zeros fits; one more zero does not; 309 nines round up past the largest double. */
  char big[400];
  memset(big, '0', sizeof big);
  big[0] = '1';
  big[309] = '\0';
  assert_false(out_of_range(big));
  big[309] = '0';
  big[310] = '\0';
  assert_true(out_of_range(big));
  memset(big, '9', 309);
  big[309] = '\0';
  assert_true(out_of_range(big));
}

static void reader_refuses_out_of_range_numbers_in_ignored_fields(void **state) {
  (void)state;
  ks_error err;
  assert_int_equal(open_with_ignored("1.7976931348623157e308", &err), KS_OK);
  assert_int_equal(open_with_ignored("[1e309]", &err), KS_E_FORMAT);
  assert_non_null(strstr(err.message, "out of range"));
  assert_int_equal(err.offset, 8 + (int64_t)strlen(head) + 1); /* the number, after the '[' */
}

static void nesting_stops_at_level_127(void **state) {
  (void)state;
  char v[300];
  ks_error err;
  for (int levels = 124; levels <= 127; levels++) { /* the header object and the entry are levels 1 and 2 */
    int d = levels - 2, n = 0;
    for (int i = 0; i < d; i++) v[n++] = '[';
    v[n++] = '1'; /* scalars do not count as a level */
    for (int i = 0; i < d; i++) v[n++] = ']';
    v[n] = '\0';
    ks_status st = open_with_ignored(v, &err);
    if (st != KS_OK) fail_msg("%d levels refused: %s", levels, err.message);
  }
  memset(v, '[', 126);
  memset(v + 126, ']', 126);
  v[252] = '\0';
  assert_int_equal(open_with_ignored(v, &err), KS_E_LIMIT);
  assert_non_null(strstr(err.message, "127"));
}

static void nul_is_allowed_only_in_ignored_values(void **state) {
  (void)state;
  ks_error err;
  assert_int_equal(open_with_ignored("\"\\u0000\"", &err), KS_OK);
  assert_int_equal(open_with_ignored("{\"\\u0000\":[\"a\\u0000b\"]}", &err), KS_OK);
  assert_int_equal(open_header("{\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, &err),
                   KS_E_FORMAT);
  assert_non_null(strstr(err.message, "u0000"));
  assert_int_equal(open_header("{\"__metadata__\":{\"k\":\"v\\u0000\"}}", 0, &err), KS_E_FORMAT);
  assert_int_equal(open_header("{\"__metadata__\":{\"k\\u0000\":\"v\"}}", 0, &err), KS_E_FORMAT);
  /* After an ignored value, strings are strict again. */
  assert_int_equal(open_header("{\"a\":{\"x\":\"\\u0000\",\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                               "\"b\\u0000\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[1,1]}}",
                               1, &err),
                   KS_E_FORMAT);
}

static void reader_refuses_an_empty_tensor_name(void **state) {
  (void)state;
  ks_error err;
  assert_int_equal(open_header("{\"\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, &err), KS_E_FORMAT);
  assert_non_null(strstr(err.message, "empty tensor name"));
  assert_true(err.offset > 8 && err.offset < 8 + 12); /* at the name, before its entry */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(numbers_out_of_range_where_serde_json_says),
      cmocka_unit_test(reader_refuses_out_of_range_numbers_in_ignored_fields),
      cmocka_unit_test(nesting_stops_at_level_127),
      cmocka_unit_test(nul_is_allowed_only_in_ignored_values),
      cmocka_unit_test(reader_refuses_an_empty_tensor_name),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
