/* Core: status codes, dtype conversions, tensors and the ordered state dict. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "core/internal.h"
#include "core/pcopy.h"
#include "keepsake/keepsake.h"
#include "testutil.h"

static void strerror_covers_every_code(void **s) {
  (void)s;
  for (int c = 0; c < KS__STATUS_END; c++) assert_string_not_equal(ks_strerror(c), "unknown status");
  assert_string_equal(ks_strerror(9999), "unknown status");
  assert_string_equal(ks_status_name(KS_E_FORMAT), "KS_E_FORMAT");
  assert_int_equal(KS_E_FORMAT, 3); /* codes are frozen */
  assert_int_equal(KS_E_NET, 17);
}

static void error_format_names_file_key_and_offset(void **s) {
  (void)s;
  ks_error e;
  ks__err_at(&e, KS_E_FORMAT, "a.ks", "w", 42, "expected %s", "'{'");
  char buf[256];
  ks_error_format(&e, buf, sizeof buf);
  assert_string_equal(buf, "a.ks: 'w': at byte 42: expected '{' (KS_E_FORMAT)");
}

static void dtype_names_round_trip(void **s) {
  (void)s;
  for (int d = 0; d < KS_DTYPE_COUNT; d++) {
    ks_dtype out;
    const char *n = ks_dtype_name((ks_dtype)d);
    assert_int_equal(ks_dtype_parse(n, strlen(n), &out), KS_OK);
    assert_int_equal(out, d);
  }
  ks_dtype out = KS_U8;
  assert_int_equal(ks_dtype_parse("F31", 3, &out), KS_E_DTYPE);
  assert_int_equal(ks_dtype_parse("f32", 3, &out), KS_E_DTYPE);
  assert_int_equal(out, KS_U8);
}

static void f16_rounds_to_nearest_even(void **s) {
  (void)s;
  assert_int_equal(ks_test_to_bits(KS_F16, 1.0f), 0x3C00);
  assert_int_equal(ks_test_to_bits(KS_F16, 65504.0f), 0x7BFF);
  assert_int_equal(ks_test_to_bits(KS_F16, 65520.0f), 0x7C00); /* halfway to inf rounds up */
  assert_int_equal(ks_test_to_bits(KS_F16, -INFINITY), 0xFC00);
  assert_true(isnan(ks_test_from_bits(KS_F16, ks_test_to_bits(KS_F16, NAN))));
  /* 1 + 2^-11 is exactly halfway between 1 and 1+2^-10: ties to even (1.0). */
  assert_int_equal(ks_test_to_bits(KS_F16, 1.0f + 0x1p-11f), 0x3C00);
  assert_int_equal(ks_test_to_bits(KS_F16, 1.0f + 3 * 0x1p-11f), 0x3C02);
  assert_int_equal(ks_test_to_bits(KS_F16, 0x1p-24f), 0x0001); /* smallest subnormal */
  assert_int_equal(ks_test_to_bits(KS_F16, 0x1p-25f), 0x0000); /* tie to even: 0 */
  assert_int_equal(ks_test_to_bits(KS_F16, -0.0f), 0x8000);
  for (uint32_t h = 0; h < 0x10000; h++) {
    float f = ks_test_from_bits(KS_F16, (uint16_t)h);
    if (!isnan(f)) assert_int_equal(ks_test_to_bits(KS_F16, f), h);
  }
}

static void bf16_rounds_to_nearest_even(void **s) {
  (void)s;
  assert_int_equal(ks_test_to_bits(KS_BF16, 1.0f), 0x3F80);
  assert_int_equal(ks_test_to_bits(KS_BF16, 1.0f + 0x1p-8f), 0x3F80); /* tie to even */
  assert_int_equal(ks_test_to_bits(KS_BF16, 1.0f + 3 * 0x1p-8f), 0x3F82);
  assert_true(isnan(ks_test_from_bits(KS_BF16, ks_test_to_bits(KS_BF16, NAN))));
  for (uint32_t b = 0; b < 0x10000; b++) {
    float f = ks_test_from_bits(KS_BF16, (uint16_t)b);
    if (!isnan(f)) assert_int_equal(ks_test_to_bits(KS_BF16, f), b);
  }
}

static void f8_formats_match_their_definitions(void **s) {
  (void)s;
  assert_true(ks_test_from_bits(KS_F8_E4M3, 0x7E) == 448.0f);
  assert_true(isnan(ks_test_from_bits(KS_F8_E4M3, 0x7F)));
  assert_int_equal(ks_test_to_bits(KS_F8_E4M3, 448.0f), 0x7E);
  assert_int_equal(ks_test_to_bits(KS_F8_E4M3, 1000.0f), 0x7F); /* overflow is NaN */
  assert_true(ks_test_from_bits(KS_F8_E4M3, 0x01) == 0x1p-9f);
  assert_true(ks_test_from_bits(KS_F8_E5M2, 0x7B) == 57344.0f);
  assert_int_equal(ks_test_to_bits(KS_F8_E5M2, INFINITY), 0x7C);
  assert_int_equal(ks_test_to_bits(KS_F8_E5M2, 1.0f), 0x3C);
  for (uint32_t v = 0; v < 256; v++) {
    float a = ks_test_from_bits(KS_F8_E4M3, (uint8_t)v), b = ks_test_from_bits(KS_F8_E5M2, (uint8_t)v);
    if (!isnan(a)) assert_int_equal(ks_test_to_bits(KS_F8_E4M3, a), v);
    if (!isnan(b)) assert_int_equal(ks_test_to_bits(KS_F8_E5M2, b), v);
  }
}

static void convert_saturates_and_keeps_integers_exact(void **s) {
  (void)s;
  int64_t big[2] = {INT64_MAX, -5};
  int64_t back[2];
  int32_t narrow[2];
  assert_int_equal(ks_dtype_convert(KS_I64, back, KS_I64, big, 2), KS_OK);
  assert_true(back[0] == INT64_MAX);
  double d[3] = {NAN, 1e300, -3.7};
  assert_int_equal(ks_dtype_convert(KS_I32, narrow, KS_F64, d, 2), KS_OK);
  assert_int_equal(narrow[0], 0);
  assert_int_equal(narrow[1], INT32_MAX);
  assert_true(ks_dtype_widens_to(KS_F16, KS_F32));
  assert_true(ks_dtype_widens_to(KS_I32, KS_I64));
  assert_false(ks_dtype_widens_to(KS_F32, KS_F16));
  assert_false(ks_dtype_widens_to(KS_I64, KS_F64));
  assert_int_equal(ks_dtype_convert((ks_dtype)99, back, KS_I64, big, 1), KS_E_DTYPE);
}

static void shape_size_rejects_overflow(void **s) {
  (void)s;
  int64_t shape[3] = {INT64_MAX, 2, 1};
  assert_int_equal(ks_shape_size(KS_F32, 3, shape, NULL, NULL), KS_E_LIMIT);
  int64_t neg[1] = {-1};
  assert_int_equal(ks_shape_size(KS_F32, 1, neg, NULL, NULL), KS_E_SHAPE);
  assert_int_equal(ks_shape_size(KS_F32, 9, shape, NULL, NULL), KS_E_LIMIT);
  uint64_t n;
  size_t b;
  int64_t ok[2] = {0, 5};
  assert_int_equal(ks_shape_size(KS_F64, 2, ok, &n, &b), KS_OK);
  assert_int_equal(n, 0);
  assert_int_equal(ks_shape_size(KS_F64, 0, NULL, &n, &b), KS_OK);
  assert_int_equal(n, 1);
  assert_int_equal(b, 8);
}

static void statedict_keeps_order_and_replaces(void **s) {
  (void)s;
  ks_statedict *sd;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  float v[3] = {1, 2, 3};
  int64_t shape[1] = {3};
  ks_tensor t;
  assert_int_equal(ks_tensor_init(&t, KS_F32, 1, shape, v), KS_OK);
  assert_int_equal(ks_statedict_set_tensor(sd, "b/w", &t, KS_COPY, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_int(sd, "a/step", 7, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_string(sd, "run", "x", NULL), KS_OK);
  assert_int_equal(ks_statedict_set_int(sd, "a/step", 8, NULL), KS_OK);
  assert_int_equal(ks_statedict_count(sd), 3);
  ks_entry e;
  assert_int_equal(ks_statedict_at(sd, 1, &e), KS_OK);
  assert_string_equal(e.name, "a/step");
  assert_int_equal(e.i, 8);
  v[0] = 99; /* copied: the dict must not see this */
  assert_true(((float *)ks_statedict_tensor(sd, "b/w")->data)[0] == 1.0f);
  assert_int_equal(ks_statedict_remove(sd, "b/w"), KS_OK);
  assert_int_equal(ks_statedict_get(sd, "b/w", &e), KS_E_NOTFOUND);
  assert_int_equal(ks_statedict_get(sd, "run", &e), KS_OK);
  assert_string_equal(e.s, "x");
  assert_int_equal(ks_statedict_set_int(sd, "", 1, NULL), KS_E_INVALID);
  ks_statedict_free(sd);
  ks_statedict_free(NULL);
}

static void statedict_handles_many_entries(void **s) {
  (void)s;
  ks_statedict *sd;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  char name[32];
  for (int i = 0; i < 20000; i++) {
    snprintf(name, sizeof name, "t/%d", i);
    assert_int_equal(ks_statedict_set_int(sd, name, i, NULL), KS_OK);
  }
  ks_entry e;
  assert_int_equal(ks_statedict_get(sd, "t/12345", &e), KS_OK);
  assert_int_equal(e.i, 12345);
  ks_statedict_free(sd);
}

static ks_status build_dict(const ks_allocator *a) {
  ks_statedict *sd;
  ks_status st = ks_statedict_create(a, &sd, NULL);
  if (st) return st;
  char name[32];
  int64_t shape[1] = {4};
  for (int i = 0; i < 40 && !st; i++) {
    snprintf(name, sizeof name, "k/%d", i);
    st = i % 2 ? ks_statedict_set_string(sd, name, "v", NULL)
               : ks_statedict_new_tensor(sd, name, KS_F32, 1, shape, NULL, NULL);
  }
  if (!st) st = ks_statedict_remove(sd, "k/3");
  if (!st) st = ks_statedict_set_int(sd, "k/0", 1, NULL); /* replaces a tensor */
  ks_statedict_free(sd);
  return st;
}

static void statedict_survives_every_allocation_failure(void **s) {
  (void)s;
  for (long n = 1;; n++) {
    ks_test_alloc ta;
    ks_test_alloc_init(&ta, n);
    ks_status st = build_dict(&ta.a);
    assert_int_equal(ta.live, 0);
    if (st == KS_OK) break;
    assert_int_equal(st, KS_E_NOMEM);
  }
}

static void glob_matches_paths(void **s) {
  (void)s;
  assert_true(ks_path_match("state/optimizers/*", "state/optimizers/AdamW/state/0/exp_avg"));
  assert_true(ks_path_match("*_wct", "state/timestamp/total_wct"));
  assert_true(ks_path_match("a?c", "abc"));
  assert_false(ks_path_match("a?c", "abbc"));
  assert_false(ks_path_match("rng/1", "rng/0"));
}

static void path_match_also_matches_slash_prefixes(void **s) {
  (void)s;
  assert_true(ks_path_match("rng", "rng/0/xoshiro256starstar"));
  assert_false(ks_path_match("rng", "rngx/0"));
  assert_true(ks_path_match("state/optimizers/*", "state/optimizers/AdamW/state/0/step"));
  assert_true(ks_path_match("*_wct", "state/timestamp/Timestamp/total_wct"));
  assert_false(ks_path_match("*_wct", "state/timestamp/Timestamp/batch"));
  assert_true(ks_path_match("state/*/AdamW", "state/optimizers/AdamW/param_groups/0/lr"));
  assert_false(ks_path_match("state/model", "state/model_ema/w"));
  assert_false(ks_path_match(NULL, "a"));
}

/* The matcher before it ran in one pass, kept as the reference of the semantics (DESIGN.md "Ignore
   globs"): the glob over the whole path, then again over every '/'-prefix. */
static bool old_glob_n(const char *p, const char *t, size_t n) {
  const char *star = NULL;
  size_t i = 0, resume = 0;
  while (i < n) {
    if (*p == '*') {
      star = p++;
      resume = i;
    } else if (*p && (*p == '?' || *p == t[i])) {
      p++;
      i++;
    } else if (star) {
      p = star + 1;
      i = ++resume;
    } else {
      return false;
    }
  }
  while (*p == '*') p++;
  return *p == '\0';
}

static int old_path_match(const char *glob, const char *path) {
  size_t n = strlen(path);
  if (old_glob_n(glob, path, n)) return 1;
  for (size_t j = 1; j < n; j++)
    if (path[j] == '/' && old_glob_n(glob, path, j)) return 1;
  return 0;
}

static uint64_t xorshift(uint64_t *x) {
  *x ^= *x << 13;
  *x ^= *x >> 7;
  *x ^= *x << 17;
  return *x;
}

static void random_text(uint64_t *x, const char *alphabet, size_t max, char *out) {
  size_t n = (size_t)(xorshift(x) % (max + 1)), k = strlen(alphabet);
  for (size_t i = 0; i < n; i++) out[i] = alphabet[xorshift(x) % k];
  out[n] = '\0';
}

/* The one-pass matcher gives the old matcher's answer on 400,000 random globs and paths over small
   alphabets (so that '/' boundaries, repeats and near misses are frequent). */
static void path_match_agrees_with_the_old_matcher(void **s) {
  (void)s;
  uint64_t x = 0x9e3779b97f4a7c15ull;
  char glob[16], path[24];
  size_t matches = 0;
  for (int i = 0; i < 400000; i++) {
    random_text(&x, i % 2 ? "ab/*?" : "a/**?", i % 3 ? 8 : 14, glob);
    random_text(&x, i % 2 ? "ab/" : "a/", i % 3 ? 12 : 22, path);
    int want = old_path_match(glob, path), got = ks_path_match(glob, path);
    if (!want != !got) fail_msg("glob '%s', path '%s': %d, the old matcher %d", glob, path, got, want);
    matches += want != 0;
  }
  assert_true(matches > 40000 && matches < 360000); /* both answers were exercised */
  static const char *const edge[][2] = {{"", ""}, {"", "a"}, {"*", ""}, {"/", "/"}, {"/", "//"}, {"a", "a/"},
                                        {"a/", "a//b"}, {"*/", "/a"}, {"?", "/"}, {"a*", "a"}, {"**a**", "ba/c"}};
  for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++)
    if (!old_path_match(edge[i][0], edge[i][1]) != !ks_path_match(edge[i][0], edge[i][1]))
      fail_msg("glob '%s', path '%s'", edge[i][0], edge[i][1]);
}

/* A hostile case: 4,096 globs against a 4,096-byte name with 2,047 '/' boundaries. The old matcher
   ran each glob over every '/'-prefix (about 5e10 steps here: minutes); one pass is about 1e8. */
static void path_match_is_linear_in_the_name(void **s) {
  (void)s;
  char *path = malloc(4097);
  assert_non_null(path);
  for (size_t i = 0; i < 4096; i += 2) path[i] = 'a', path[i + 1] = '/';
  path[4095] = 'z';
  path[4096] = '\0';
  static const char *const shapes[][2] = {{"*a/b", ""}, {"a*?/b", ""}, {"*a/a/a/", "*q"}, {"a/*a?b", ""}, {"*/", ""}};
  clock_t t0 = clock();
  size_t hits = 0;
  for (int g = 0; g < 4096; g++) {
    char glob[64];
    snprintf(glob, sizeof glob, "%s%d%s", shapes[g % 5][0], g, shapes[g % 5][1]);
    hits += ks_path_match(glob, path) != 0;
  }
  double secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
  free(path);
  assert_int_equal(hits, 0);
  if (secs > 5.0) fail_msg("4096 globs over one 4 KiB name took %.2f s of CPU", secs);
}

static void utf8_validation_rejects_bad_sequences(void **s) {
  (void)s;
  assert_true(ks__utf8_valid((const uint8_t *)"h\xc3\xa9", 3));
  assert_false(ks__utf8_valid((const uint8_t *)"\xc0\xaf", 2));     /* overlong */
  assert_false(ks__utf8_valid((const uint8_t *)"\xed\xa0\x80", 3)); /* surrogate */
  assert_false(ks__utf8_valid((const uint8_t *)"\xe2\x82", 2));     /* truncated */
  assert_false(ks__utf8_valid((const uint8_t *)"\xff", 1));
}

/* Every byte of many pieces (odd sizes, one crossing each share boundary) lands once, with one
   thread and with several, below and above the threshold. */
static void parallel_copy_copies_every_byte(void **state) {
  (void)state;
  enum { N = 7 };
  size_t sizes[N] = {1, 3 << 20, 0, 17 << 20, 4093, 25 << 20, 12345};
  for (int big = 0; big < 2; big++) {
    for (size_t threads = 1; threads <= 5; threads += 2) {
      ks__copy pieces[N];
      unsigned char *src[N], *dst[N];
      for (int i = 0; i < N; i++) {
        size_t n = big ? sizes[i] : sizes[i] / 64;
        src[i] = malloc(n + 1), dst[i] = calloc(n + 1, 1);
        assert_true(src[i] && dst[i]);
        for (size_t b = 0; b < n; b++) src[i][b] = (unsigned char)(b * 131 + (size_t)i * 7 + 1);
        dst[i][n] = 0xAB; /* nothing past the end */
        pieces[i] = (ks__copy){dst[i], src[i], n};
      }
      ks__copy_parallel(pieces, N, threads);
      for (int i = 0; i < N; i++) {
        assert_memory_equal(dst[i], src[i], pieces[i].n);
        assert_int_equal(dst[i][pieces[i].n], 0xAB);
        free(src[i]), free(dst[i]);
      }
    }
  }
  ks__copy_parallel(NULL, 0, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(parallel_copy_copies_every_byte),
      cmocka_unit_test(strerror_covers_every_code),
      cmocka_unit_test(error_format_names_file_key_and_offset),
      cmocka_unit_test(dtype_names_round_trip),
      cmocka_unit_test(f16_rounds_to_nearest_even),
      cmocka_unit_test(bf16_rounds_to_nearest_even),
      cmocka_unit_test(f8_formats_match_their_definitions),
      cmocka_unit_test(convert_saturates_and_keeps_integers_exact),
      cmocka_unit_test(shape_size_rejects_overflow),
      cmocka_unit_test(statedict_keeps_order_and_replaces),
      cmocka_unit_test(statedict_handles_many_entries),
      cmocka_unit_test(statedict_survives_every_allocation_failure),
      cmocka_unit_test(glob_matches_paths),
      cmocka_unit_test(path_match_also_matches_slash_prefixes),
      cmocka_unit_test(path_match_agrees_with_the_old_matcher),
      cmocka_unit_test(path_match_is_linear_in_the_name),
      cmocka_unit_test(utf8_validation_rejects_bad_sequences),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
