/*
 * Hostile pickles as families, not single inputs (issue 9): nesting of any depth,
 * sizes near 2^64, big integers referenced many times, copies that cost more than
 * the program's size. Each test generates its inputs over a range of parameters.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "keepsake/keepsake.h"
#include "keepsake/torch.h"
#include "testutil.h"
#include "torch/torch_internal.h"

/* ---- a growable pickle program ---- */
typedef struct prog {
  uint8_t *p;
  size_t n, cap;
} prog;

static void emit(prog *g, const void *b, size_t n) {
  if (g->n + n > g->cap) {
    g->cap = (g->n + n) * 2;
    g->p = realloc(g->p, g->cap);
    assert_non_null(g->p);
  }
  memcpy(g->p + g->n, b, n);
  g->n += n;
}
static void op(prog *g, const char *s) { emit(g, s, strlen(s)); }
static void op1(prog *g, uint8_t c) { emit(g, &c, 1); }
static void u32(prog *g, uint32_t v) {
  uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
  emit(g, b, 4);
}
static void str(prog *g, const char *s) { op1(g, 'X'), u32(g, (uint32_t)strlen(s)), op(g, s); }
static void int64(prog *g, int64_t v) { /* LONG1 of 8 bytes */
  op1(g, 0x8a), op1(g, 8);
  for (int i = 0; i < 8; i++) op1(g, (uint8_t)((uint64_t)v >> (8 * i)));
}
static void put(prog *g, uint32_t i) { op1(g, 'r'), u32(g, i); }
static void get(prog *g, uint32_t i) { op1(g, 'j'), u32(g, i); }

/* Storage "0": 6 floats. */
static const float storage0[6] = {0, 1, 2, 3, 4, 5};
static ks_status fake_storage(void *ctx, const char *key, const uint8_t **data, size_t *len, ks_error *err) {
  (void)ctx;
  if (strcmp(key, "data/0")) return ks__err(err, KS_E_NOTFOUND, "no %s", key);
  *data = (const uint8_t *)storage0;
  *len = sizeof storage0;
  return KS_OK;
}

/* _rebuild_tensor_v2(storage "0" of `numel` `cls`, 0, shape, stride, False, {}) */
static void tensor(prog *g, const char *cls, int64_t numel, int rank, const int64_t *shape, const int64_t *stride) {
  op(g, "ctorch._utils\n_rebuild_tensor_v2\n(");
  op(g, "("), str(g, "storage"), op(g, "ctorch\n"), op(g, cls), op(g, "\n"), str(g, "0"), str(g, "cpu"),
      int64(g, numel);
  op(g, "tQ"), int64(g, 0);
  op(g, "(");
  for (int i = 0; i < rank; i++) int64(g, shape[i]);
  op(g, "t(");
  for (int i = 0; i < rank; i++) int64(g, stride[i]);
  op(g, "t\x89}tR");
}

/* Runs g with the default limits, except the machine's memory when max_mem is not 0. */
static ks_status run_mem(const prog *g, uint64_t max_mem, ks_statedict **out, ks_error *err) {
  ks__pk_arena ar;
  ks__pk_limits lim;
  ks__pk_arena_init(&ar, NULL);
  ks__pk_limits_from_opts(NULL, g->n, &lim);
  lim.max_entries = g->n * 8 + 4096;
  if (max_mem) lim.max_mem = max_mem;
  ks__pk_node *root = NULL;
  ks_statedict *sd = NULL;
  ks_status st = ks__pk_run(g->p, g->n, &ar, &lim, fake_storage, NULL, &root, err);
  if (!st) st = ks_statedict_create(NULL, &sd, NULL);
  if (!st) st = ks__pk_flatten(root, &ar, &lim, sd, err);
  if (!st && out) {
    ks_statedict *copy;
    assert_int_equal(ks_statedict_create(NULL, &copy, NULL), KS_OK);
    assert_int_equal(ks__statedict_copy_prefix(copy, sd, "", "", NULL), KS_OK);
    *out = copy;
  }
  ks_statedict_free(sd);
  ks__pk_arena_release(&ar);
  return st;
}

static ks_status run(const prog *g, ks_statedict **out, ks_error *err) { return run_mem(g, 0, out, err); }

/* ---- big integers ---- */

/* Reference: byte-wise repeated division by 10 (the old, quadratic conversion). */
static void reference_decimal(const uint8_t *le, size_t n, char *out) {
  uint8_t *mag = malloc(n);
  char *d = malloc(n * 3 + 2);
  int neg = (le[n - 1] & 0x80) != 0;
  unsigned carry = 1;
  for (size_t i = 0; i < n; i++) {
    unsigned b = le[i];
    if (neg) b = (~b & 0xFF) + carry, carry = b >> 8, b &= 0xFF;
    mag[n - 1 - i] = (uint8_t)b;
  }
  size_t nd = 0, start = 0;
  while (start < n && mag[start] == 0) start++;
  while (start < n) {
    unsigned rem = 0;
    for (size_t i = start; i < n; i++) {
      unsigned cur = rem * 256 + mag[i];
      mag[i] = (uint8_t)(cur / 10), rem = cur % 10;
    }
    d[nd++] = (char)('0' + rem);
    while (start < n && mag[start] == 0) start++;
  }
  size_t k = 0;
  if (neg) out[k++] = '-';
  if (!nd) out[k++] = '0';
  while (nd) out[k++] = d[--nd];
  out[k] = 0;
  free(mag), free(d);
}

static void big_integers_match_a_reference_at_every_length(void **s) {
  (void)s;
  ks__pk_arena ar;
  ks__pk_arena_init(&ar, NULL);
  uint64_t seed = 9;
  uint8_t le[KS__PK_BIGINT_MAX];
  char *want = malloc(KS__PK_BIGINT_MAX * 3 + 2);
  for (int trial = 0; trial < 208; trial++) { /* every length 9..208, then 8 up to the cap (the reference is slow) */
    size_t n = trial < 200 ? 9 + (size_t)trial : 9 + (size_t)((seed = seed * 6364136223846793005u + 1) >> 33) % 4088;
    if (trial == 207) n = KS__PK_BIGINT_MAX;
    for (size_t i = 0; i < n; i++) le[i] = (uint8_t)((seed = seed * 6364136223846793005u + 1442695040888963407u) >> 56);
    if (trial % 7 == 1) memset(le, 0xFF, n);       /* -1 */
    if (trial % 7 == 2) memset(le, 0, n);          /* 0 */
    if (trial % 7 == 3) memset(le, 0, n), le[n - 1] = 0x80; /* most negative */
    ks__pk_node *b = ks__pk_new_bigint(&ar, le, n);
    assert_non_null(b);
    assert_non_null(b->u.s.p);
    reference_decimal(le, n, want);
    assert_string_equal(b->u.s.p, want);
    assert_int_equal(b->u.s.n, strlen(want));
  }
  ks__pk_node *toolong = ks__pk_new_bigint(&ar, le, KS__PK_BIGINT_MAX); /* the cap itself converts */
  assert_non_null(toolong->u.s.p);
  uint8_t *huge = calloc(1, KS__PK_BIGINT_MAX + 1);
  toolong = ks__pk_new_bigint(&ar, huge, KS__PK_BIGINT_MAX + 1);
  assert_null(toolong->u.s.p);
  assert_int_equal(toolong->u.s.n, KS__PK_BIGINT_MAX + 1);
  free(huge), free(want);
  ks__pk_arena_release(&ar);
}

/* A 4 KiB integer referenced thousands of times: converted once, every entry the same text. */
static void memoised_big_integer_is_converted_once(void **s) {
  (void)s;
  for (uint32_t refs = 1; refs <= 4096; refs *= 8) {
    prog g = {0};
    op(&g, "\x80\x02](\x8b"), u32(&g, 4096);
    for (int i = 0; i < 4095; i++) op1(&g, (uint8_t)(i * 31 + 7));
    op1(&g, 0x12);
    put(&g, 1);
    for (uint32_t r = 1; r < refs; r++) get(&g, 1);
    op(&g, "e.");
    ks_statedict *sd = NULL;
    ks_error err;
    assert_int_equal(run(&g, &sd, &err), KS_OK);
    assert_int_equal(ks_statedict_count(sd), refs);
    ks_entry first, last;
    assert_int_equal(ks_statedict_at(sd, 0, &first), KS_OK);
    assert_int_equal(ks_statedict_at(sd, refs - 1, &last), KS_OK);
    assert_int_equal(first.kind, KS_VAL_STRING);
    assert_true(strlen(first.s) > 9800);
    assert_string_equal(first.s, last.s);
    ks_statedict_free(sd);
    free(g.p);
  }
}

/* ---- nesting ---- */

/* from_type(from_type, None, (from_type, None, ... (_rebuild_tensor_v2, None, args, None) ...)) */
static void nested_rebuild_from_type_of_any_depth_gives_the_tensor(void **s) {
  (void)s;
  static const size_t depths[] = {0, 1, 2, 64, 65, 1000, 10000, 100000};
  for (size_t d = 0; d < sizeof depths / sizeof depths[0]; d++) {
    prog g = {0};
    op(&g, "\x80\x02" "ctorch._tensor\n_rebuild_from_type_v2\n");
    put(&g, 0);
    for (size_t i = 0; i < depths[d]; i++) op(&g, "("), get(&g, 0), op(&g, "N");
    op(&g, "(ctorch._utils\n_rebuild_tensor_v2\nN(");
    op(&g, "("), str(&g, "storage"), op(&g, "ctorch\nFloatStorage\n"), str(&g, "0"), str(&g, "cpu"), int64(&g, 6);
    op(&g, "tQ"), int64(&g, 0), op(&g, "("), int64(&g, 6), op(&g, "t("), int64(&g, 1), op(&g, "t\x89}tNt");
    for (size_t i = 0; i < depths[d]; i++) op(&g, "Nt");
    op(&g, "R.");
    ks_statedict *sd = NULL;
    ks_error err;
    assert_int_equal(run(&g, &sd, &err), KS_OK);
    const ks_tensor *t = ks_statedict_tensor(sd, "value");
    assert_non_null(t);
    assert_int_equal(t->shape[0], 6);
    assert_memory_equal(t->data, storage0, sizeof storage0);
    ks_statedict_free(sd);
    free(g.p);
  }
}

/* Nested dicts: fine up to 64 levels, a clear limit error when too deep for any name, at any depth. */
static void nested_dicts_past_the_depth_limit_are_refused_at_any_depth(void **s) {
  (void)s;
  static const size_t depths[] = {1, 10, 63, 64, 65, 1000, 10000, 200000};
  for (size_t d = 0; d < sizeof depths / sizeof depths[0]; d++) {
    prog g = {0};
    op(&g, "\x80\x02");
    for (size_t i = 0; i < depths[d]; i++) op(&g, "}"), str(&g, "k");
    op(&g, "N");
    for (size_t i = 0; i < depths[d]; i++) op(&g, "s");
    op(&g, ".");
    ks_error err;
    ks_status st = run(&g, NULL, &err);
    if (depths[d] <= 64) {
      assert_int_equal(st, KS_OK);
    } else if (depths[d] >= 1000) { /* too deep for any name: whichever limit comes first */
      assert_int_equal(st, KS_E_LIMIT);
      assert_true(strstr(err.message, "nesting deeper than") || strstr(err.message, "key longer than") ||
                  strstr(err.message, "bytes of memory"));
    }
    free(g.p);
  }
}

/* ---- sizes near 2^64 ---- */

/* 24 bytes already materialised, then a stride-0 view of 2^64 - k bytes: a limit, never a wrapped request. */
static void view_budget_never_wraps(void **s) {
  (void)s;
  static const uint64_t ks_[] = {16, 32, 48, 64, 1u << 20, (uint64_t)1 << 40};
  for (size_t i = 0; i < sizeof ks_ / sizeof ks_[0]; i++) {
    prog g = {0};
    int64_t shape1[2] = {2, 3}, stride1[2] = {1, 2}; /* transposed: materialised, 24 bytes */
    int64_t rows = (int64_t)((UINT64_MAX - ks_[i] + 1) / 16), shape2[2] = {rows, 4}, stride2[2] = {0, 0};
    op(&g, "\x80\x02}"), str(&g, "a"), tensor(&g, "FloatStorage", 6, 2, shape1, stride1), op(&g, "s");
    str(&g, "b"), tensor(&g, "FloatStorage", 6, 2, shape2, stride2), op(&g, "s.");
    ks_error err;
    assert_int_equal(run(&g, NULL, &err), KS_E_LIMIT);
    assert_non_null(strstr(err.message, "materialised views exceed"));
    free(g.p);
  }
}

/* Storage byte counts that overflow say so, never "needs 0 bytes". */
static void storage_sizes_that_overflow_are_named(void **s) {
  (void)s;
  static const struct {
    const char *cls;
    int64_t numel;
  } cases[] = {{"FloatStorage", (int64_t)1 << 62}, {"DoubleStorage", ((int64_t)1 << 61) + 1},
               {"LongStorage", INT64_MAX}, {"IntStorage", (int64_t)1 << 62}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    prog g = {0};
    int64_t one = 1;
    op(&g, "\x80\x02"), tensor(&g, cases[i].cls, cases[i].numel, 1, &one, &one), op(&g, ".");
    ks_error err;
    assert_int_equal(run(&g, NULL, &err), KS_E_LIMIT);
    assert_non_null(strstr(err.message, "overflows"));
    assert_null(strstr(err.message, "needs 0 bytes"));
    free(g.p);
  }
}

/* ---- cost ---- */

/* set(L) of one memoised list of m items, c times: m*c copies from 8c bytes of program. The copies take
   memory too, and the memory budget (16 bytes per byte) stops them first by default: here it is lifted, so
   that the work budget is what the test sees. */
static void copies_are_counted_against_the_work_budget(void **s) {
  (void)s;
  static const struct {
    uint32_t m, c;
  } cases[] = {{10, 10}, {100, 100}, {1000, 50}, {1000, 2000}, {20000, 300}, {100000, 100}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    prog g = {0};
    op(&g, "\x80\x02(");
    for (uint32_t k = 0; k < cases[i].m; k++) op(&g, "N");
    op(&g, "l"), put(&g, 0), op(&g, "0");
    for (uint32_t k = 0; k < cases[i].c; k++) op(&g, "cbuiltins\nset\n("), get(&g, 0), op(&g, "tR0");
    op(&g, "N.");
    uint64_t work = (uint64_t)cases[i].m * cases[i].c, budget = (uint64_t)g.n * 32 + ((uint64_t)1 << 20);
    ks_error err;
    ks_status st = run_mem(&g, UINT64_MAX, NULL, &err);
    if (work * 2 < budget) {
      assert_int_equal(st, KS_OK);
    } else if (work > budget * 2) {
      assert_int_equal(st, KS_E_LIMIT);
      assert_non_null(strstr(err.message, "program costs more than"));
    }
    free(g.p);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(big_integers_match_a_reference_at_every_length),
      cmocka_unit_test(memoised_big_integer_is_converted_once),
      cmocka_unit_test(nested_rebuild_from_type_of_any_depth_gives_the_tensor),
      cmocka_unit_test(nested_dicts_past_the_depth_limit_are_refused_at_any_depth),
      cmocka_unit_test(view_budget_never_wraps),
      cmocka_unit_test(storage_sizes_that_overflow_are_named),
      cmocka_unit_test(copies_are_counted_against_the_work_budget),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
