/*
 * The structure document and the key-text rule (include/keepsake/binding/structure.h): each key type's
 * text, escaping, refused keys (not UTF-8, not finite, two keys alike), what is recorded and
 * what is left out, the JSON written, and every allocation failure leaking nothing.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "keepsake/keepsake.h"
#include "testutil.h"

static ks_key str_key(const char *s) { return (ks_key){.type = KS_KEY_STR, .str = s, .len = strlen(s)}; }

static void text_of(const ks_key *k, const char *want) {
  char buf[64];
  size_t n = 99;
  assert_int_equal(ks_key_text(k, buf, sizeof buf, &n, NULL), KS_OK);
  assert_string_equal(buf, want);
  assert_int_equal(n, strlen(want));
}

static void key_texts_follow_one_rule(void **state) {
  (void)state;
  ks_key k = str_key("a/b%c");
  text_of(&k, "a%2Fb%25c");
  k = str_key("");
  text_of(&k, "");
  text_of(&(ks_key){.type = KS_KEY_INT, .i = -12}, "-12");
  text_of(&(ks_key){.type = KS_KEY_INT, .i = INT64_MIN}, "-9223372036854775808");
  text_of(&(ks_key){.type = KS_KEY_BOOL, .i = 1}, "True");
  text_of(&(ks_key){.type = KS_KEY_BOOL, .i = 0}, "False");
  text_of(&(ks_key){.type = KS_KEY_NONE}, "None");
  text_of(&(ks_key){.type = KS_KEY_FLOAT, .f = 0.1}, "0.10000000000000001");
  /* measure first: too small a buffer says how much is needed */
  size_t n = 0;
  k = str_key("x/y");
  assert_int_equal(ks_key_text(&k, NULL, 0, &n, NULL), KS_E_LIMIT);
  assert_int_equal(n, 5);
}

static void bad_keys_are_refused(void **state) {
  (void)state;
  char buf[64];
  size_t n;
  ks_error err;
  ks_key bad = {.type = KS_KEY_STR, .str = "\xff\xfe", .len = 2};
  assert_int_equal(ks_key_text(&bad, buf, sizeof buf, &n, &err), KS_E_VALUE);
  assert_int_equal(ks_key_text(&(ks_key){.type = KS_KEY_FLOAT, .f = NAN}, buf, sizeof buf, &n, &err), KS_E_VALUE);
  assert_int_equal(ks_key_text(&(ks_key){.type = KS_KEY_FLOAT, .f = INFINITY}, buf, sizeof buf, &n, &err), KS_E_VALUE);
  assert_int_equal(ks_key_text(&(ks_key){.type = (ks_key_type)9}, buf, sizeof buf, &n, &err), KS_E_INVALID);
  assert_int_equal(ks_key_text(NULL, buf, sizeof buf, &n, &err), KS_E_INVALID);
}

static char *dump(const ks_structure *s) {
  char *json = NULL;
  assert_int_equal(ks_structure_dump(s, &json, NULL), KS_OK);
  char *copy = strdup(json);
  ks_structure_text_free(s, json);
  return copy;
}

static void records_what_names_cannot_say(void **state) {
  (void)state;
  ks_structure *s;
  ks_error err;
  assert_int_equal(ks_structure_create(NULL, &s, NULL), KS_OK);
  assert_true(ks_structure_is_empty(s));
  ks_key plain[2] = {str_key("w"), str_key("b")};
  assert_int_equal(ks_structure_add_dict(s, "model", plain, 2, NULL), KS_OK); /* str keys: no record */
  assert_true(ks_structure_is_empty(s));
  ks_key ints[2] = {{.type = KS_KEY_INT, .i = 0}, {.type = KS_KEY_INT, .i = 7}};
  assert_int_equal(ks_structure_add_dict(s, "opt/state", ints, 2, NULL), KS_OK);
  assert_int_equal(ks_structure_add_dict(s, "empty", NULL, 0, NULL), KS_OK);
  assert_int_equal(ks_structure_add_sequence(s, "opt/param_groups", KS_CONTAINER_LIST, 1, NULL), KS_OK);
  assert_int_equal(ks_structure_add_sequence(s, "t", KS_CONTAINER_TUPLE, 0, NULL), KS_OK);
  assert_int_equal(ks_structure_add_sequence(s, "u", KS_CONTAINER_SET, 3, NULL), KS_OK);
  ks_key mixed[3] = {str_key("a/b"), {.type = KS_KEY_NONE}, {.type = KS_KEY_FLOAT, .f = 1.5}};
  assert_int_equal(ks_structure_add_dict(s, "mixed", mixed, 3, NULL), KS_OK);
  assert_int_equal(ks_structure_add_leaf(s, "big", KS_LEAF_BIGINT, NULL), KS_OK);
  assert_int_equal(ks_structure_add_leaf(s, "arr", KS_LEAF_NDARRAY, NULL), KS_OK);
  assert_false(ks_structure_is_empty(s));
  /* once per path, container or leaf */
  assert_int_equal(ks_structure_add_leaf(s, "t", KS_LEAF_BYTES, &err), KS_E_EXISTS);
  assert_string_equal(err.key, "t");
  assert_int_equal(ks_structure_add_sequence(s, "u", KS_CONTAINER_LIST, 1, &err), KS_E_EXISTS);
  assert_int_equal(ks_structure_add_sequence(s, "v", KS_CONTAINER_DICT, 1, &err), KS_E_INVALID);
  assert_int_equal(ks_structure_add_leaf(s, "w", (ks_leaf_kind)0, &err), KS_E_INVALID);
  char *json = dump(s);
  assert_string_equal(json,
                      "{\"version\":1,\"containers\":{"
                      "\"opt/state\":{\"kind\":\"dict\",\"keys\":{\"0\":0,\"7\":7}},"
                      "\"empty\":{\"kind\":\"dict\"},"
                      "\"opt/param_groups\":{\"kind\":\"list\",\"len\":1},"
                      "\"t\":{\"kind\":\"tuple\",\"len\":0},"
                      "\"u\":{\"kind\":\"set\",\"len\":3},"
                      "\"mixed\":{\"kind\":\"dict\",\"keys\":{\"None\":null,\"1.5\":1.5}}},"
                      "\"leaves\":{\"big\":\"bigint\",\"arr\":\"ndarray\"}}");
  free(json);
  ks_structure_free(s);
  ks_structure_free(NULL);
}

static void keys_that_print_alike_are_refused(void **state) {
  (void)state;
  ks_structure *s;
  ks_error err;
  assert_int_equal(ks_structure_create(NULL, &s, NULL), KS_OK);
  ks_key clash[3] = {str_key("x"), {.type = KS_KEY_INT, .i = 1}, str_key("1")};
  assert_int_equal(ks_structure_add_dict(s, "d", clash, 3, &err), KS_E_EXISTS);
  assert_string_equal(err.key, "d");
  assert_non_null(strstr(err.message, "'1'"));
  ks_key bools[2] = {{.type = KS_KEY_BOOL, .i = 1}, str_key("True")};
  assert_int_equal(ks_structure_add_dict(s, "e", bools, 2, &err), KS_E_EXISTS);
  /* escaping keeps "a/b" and "a%2Fb" apart */
  ks_key esc[2] = {str_key("a/b"), str_key("a%2Fb")};
  assert_int_equal(ks_structure_add_dict(s, "f", esc, 2, &err), KS_OK);
  ks_key nan[1] = {{.type = KS_KEY_FLOAT, .f = NAN}};
  assert_int_equal(ks_structure_add_dict(s, "g", nan, 1, &err), KS_E_VALUE);
  assert_non_null(strstr(err.message, "not finite"));
  ks_key badutf[1] = {{.type = KS_KEY_STR, .str = "\xc3", .len = 1}};
  assert_int_equal(ks_structure_add_dict(s, "h", badutf, 1, &err), KS_E_VALUE);
  assert_int_equal(ks_structure_add_sequence(s, "\xff", KS_CONTAINER_LIST, 1, &err), KS_E_VALUE);
  assert_true(ks_structure_is_empty(s)); /* nothing refused was recorded */
  ks_structure_free(s);
}

static void many_keys_are_checked_in_n_log_n(void **state) {
  (void)state;
  enum { N = 200000 };
  ks_key *keys = calloc(N, sizeof *keys);
  assert_non_null(keys);
  for (int i = 0; i < N; i++) keys[i] = (ks_key){.type = KS_KEY_INT, .i = N - i};
  ks_structure *s;
  assert_int_equal(ks_structure_create(NULL, &s, NULL), KS_OK);
  assert_int_equal(ks_structure_add_dict(s, "state", keys, N, NULL), KS_OK);
  keys[N - 1].i = 5; /* a repeat, last */
  assert_int_equal(ks_structure_add_dict(s, "state2", keys, N, NULL), KS_E_EXISTS);
  ks_structure_free(s);
  free(keys);
}

static void allocation_failures_leak_nothing(void **state) {
  (void)state;
  int completed = 0;
  for (long fail = 1; fail < 200 && !completed; fail++) {
    ks_test_alloc ta;
    ks_test_alloc_init(&ta, fail);
    ks_structure *s = NULL;
    ks_status st = ks_structure_create(&ta.a, &s, NULL);
    ks_key ints[2] = {{.type = KS_KEY_INT, .i = 0}, str_key("a/b")};
    if (!st) st = ks_structure_add_dict(s, "d", ints, 2, NULL);
    if (!st) st = ks_structure_add_sequence(s, "l", KS_CONTAINER_LIST, 2, NULL);
    if (!st) st = ks_structure_add_leaf(s, "b", KS_LEAF_BYTES, NULL);
    char *json = NULL;
    if (!st) st = ks_structure_dump(s, &json, NULL);
    if (!st) completed = 1;
    else assert_int_equal(st, KS_E_NOMEM);
    ks_structure_text_free(s, json);
    ks_structure_free(s);
    assert_int_equal(ta.live, 0);
  }
  assert_true(completed);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(key_texts_follow_one_rule),
      cmocka_unit_test(bad_keys_are_refused),
      cmocka_unit_test(records_what_names_cannot_say),
      cmocka_unit_test(keys_that_print_alike_are_refused),
      cmocka_unit_test(many_keys_are_checked_in_n_log_n),
      cmocka_unit_test(allocation_failures_leak_nothing),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
