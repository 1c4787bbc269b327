/*
 * The read side of the value tree (ks_structure_plan, include/keepsake/binding.h): folders from
 * the structure document and from keepsake 0.1.0's `keepsake.pytree` table, typed keys, the
 * inverse of ks_key_text, empty containers, leaf kinds, a prefix, files with neither record,
 * refused records, the depth bound, and every allocation failure leaking nothing.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "keepsake/binding.h"
#include "testutil.h"

typedef struct fixture {
  const char *names[16];
  size_t lens[16];
  size_t n;
} fixture;

static fixture names_of(const char *const *names) {
  fixture f = {.n = 0};
  for (; names[f.n]; f.n++) f.names[f.n] = names[f.n], f.lens[f.n] = strlen(names[f.n]);
  return f;
}

static ks_status plan(const char *doc, const char *table, const fixture *f, const char *prefix,
                      const ks_allocator *a, ks_plan **out) {
  return ks_structure_plan(doc, doc ? strlen(doc) : 0, table, table ? strlen(table) : 0, f->names, f->lens, f->n,
                           prefix, a, out, NULL);
}

/* Child i of node `at`. */
static const ks_plan_node *kid(const ks_plan *p, const ks_plan_node *at, size_t i) {
  assert_true(i < at->n);
  return ks_plan_at(p, ks_plan_child(p, at->first + i));
}

static void str_is(const ks_key *k, const char *want) {
  assert_int_equal(k->type, KS_KEY_STR);
  assert_int_equal(k->len, strlen(want));
  assert_memory_equal(k->str, want, k->len);
}

static void int_is(const ks_key *k, int64_t want) {
  assert_int_equal(k->type, KS_KEY_INT);
  assert_int_equal(k->i, want);
}

static const char DOC[] =
    "{\"version\":1,\"containers\":{"
    "\"opt/state\":{\"kind\":\"dict\",\"keys\":{\"0\":0,\"True\":true,\"None\":null,\"1.5\":1.5}},"
    "\"opt/betas\":{\"kind\":\"tuple\",\"len\":2},\"opt/empty\":{\"kind\":\"list\",\"len\":0},"
    "\"opt/d\":{\"kind\":\"dict\"}},"
    "\"leaves\":{\"opt/big\":\"bigint\",\"opt/raw\":\"bytes\"}}";

static void documents_type_every_folder(void **state) {
  (void)state;
  const char *const names[] = {"opt/state/0", "opt/state/True", "opt/state/None", "opt/state/1.5", "opt/betas/1",
                               "opt/betas/0", "opt/a%2Fb%25c", "opt/big", "opt/raw", "other/x", NULL};
  fixture f = names_of(names);
  ks_plan *p = NULL;
  assert_int_equal(plan(DOC, NULL, &f, "opt/", NULL, &p), KS_OK);
  const ks_plan_node *root = ks_plan_at(p, 0);
  assert_int_equal(root->tag, KS_PLAN_GUESS); /* no record for "opt": a str-keyed dict */
  assert_false(root->int_keys);
  assert_int_equal(root->n, 7); /* state, betas, a/b%c, big, raw, then the recorded empty, d */
  const ks_plan_node *st = kid(p, root, 0), *betas = kid(p, root, 1), *esc = kid(p, root, 2);
  str_is(&st->key, "state");
  assert_int_equal(st->tag, KS_PLAN_KEYED);
  int_is(&kid(p, st, 0)->key, 0);
  assert_int_equal(kid(p, st, 1)->key.type, KS_KEY_BOOL);
  assert_int_equal(kid(p, st, 2)->key.type, KS_KEY_NONE);
  assert_int_equal(kid(p, st, 3)->key.type, KS_KEY_FLOAT);
  assert_true(kid(p, st, 3)->key.f == 1.5);
  assert_int_equal(betas->tag, KS_PLAN_TUPLE); /* items in index order, not entry order */
  assert_int_equal(betas->n, 2);
  int_is(&kid(p, betas, 0)->key, 0);
  assert_int_equal(kid(p, betas, 0)->name, 5);
  str_is(&esc->key, "a/b%c"); /* the inverse of ks_key_text */
  str_is(&esc->text, "a/b%c");
  assert_int_equal(esc->tag, KS_PLAN_LEAF);
  assert_int_equal(esc->name, 6);
  assert_int_equal(kid(p, root, 3)->leaf_kind, KS_LEAF_BIGINT);
  assert_int_equal(kid(p, root, 4)->leaf_kind, KS_LEAF_BYTES);
  assert_int_equal(kid(p, root, 5)->tag, KS_PLAN_LIST);
  assert_int_equal(kid(p, root, 5)->n, 0);
  assert_int_equal(kid(p, root, 6)->tag, KS_PLAN_DICT);
  ks_plan_free(p);
}

static void pytree_tables_of_010_still_read(void **state) {
  (void)state;
  const char *table = "{\"s\":\"intdict\",\"k\":{\"keys\":[[\"i\",\"7\"],[\"b\",1],[\"n\",null],[\"f\",2],[\"s\",3]]},"
                      "\"e\":\"dict\",\"l\":\"set\",\"x\":\"ndarray\"}";
  const char *const names[] = {"s/-3", "s/4", "k/0", "k/1", "k/2", "k/3", "k/4", "k/9", "l/1", "l/0", "x",
                               "g/1", "g/0", "a%2Fb", NULL};
  fixture f = names_of(names);
  ks_plan *p = NULL;
  assert_int_equal(plan(NULL, table, &f, "", NULL, &p), KS_OK);
  const ks_plan_node *root = ks_plan_at(p, 0), *s = kid(p, root, 0), *k = kid(p, root, 1);
  assert_int_equal(s->tag, KS_PLAN_DICT);
  int_is(&kid(p, s, 0)->key, -3);
  int_is(&kid(p, s, 1)->key, 4);
  assert_int_equal(k->tag, KS_PLAN_KEYED);
  assert_int_equal(k->n, 5); /* "9" has no key: left out, as before */
  int_is(&kid(p, k, 0)->key, 7);
  assert_int_equal(kid(p, k, 1)->key.type, KS_KEY_BOOL);
  assert_int_equal(kid(p, k, 2)->key.type, KS_KEY_NONE);
  assert_int_equal(kid(p, k, 3)->key.type, KS_KEY_FLOAT);
  str_is(&kid(p, k, 4)->key, "3");
  assert_int_equal(kid(p, root, 2)->tag, KS_PLAN_SET);
  assert_int_equal(kid(p, root, 3)->leaf_kind, KS_LEAF_NDARRAY);
  const ks_plan_node *g = kid(p, root, 4), *esc = kid(p, root, 5);
  assert_int_equal(g->tag, KS_PLAN_GUESS); /* no document: decimal names default to int keys */
  assert_true(g->int_keys);
  int_is(&kid(p, g, 0)->key, 1);
  assert_int_equal(kid(p, g, 0)->index, 1);
  str_is(&kid(p, g, 0)->text, "1");
  str_is(&esc->key, "a%2Fb"); /* files without a document did not escape */
  assert_int_equal(kid(p, root, 6)->tag, KS_PLAN_DICT); /* the empty dict the table lists */
  ks_plan_free(p);
}

static void bad_records_are_refused(void **state) {
  (void)state;
  const char *const names[] = {"s/x", "k/0", NULL};
  fixture f = names_of(names);
  ks_plan *p = NULL;
  assert_int_equal(plan(NULL, "{\"s\":\"intdict\"}", &f, "", NULL, &p), KS_E_FORMAT);
  assert_null(p);
  assert_int_equal(plan(NULL, "{\"k\":{\"keys\":[\"iz\"]}}", &f, "", NULL, &p), KS_E_FORMAT);
  assert_int_equal(plan(NULL, "{\"k\":{\"keys\":[[\"i\",\"z\"]]}}", &f, "", NULL, &p), KS_E_FORMAT);
  assert_int_equal(plan("{\"containers\":{\"k\":{\"kind\":\"dict\",\"keys\":{\"0\":[1]}}}}", NULL, &f, "", NULL, &p),
                   KS_E_FORMAT);
  /* records that are not JSON are no records: the names decide */
  assert_int_equal(plan("{oops", NULL, &f, "", NULL, &p), KS_OK);
  assert_int_equal(ks_plan_at(p, 0)->tag, KS_PLAN_GUESS);
  ks_plan_free(p);
  assert_int_equal(ks_structure_plan(NULL, 0, NULL, 0, NULL, NULL, 0, NULL, NULL, &p, NULL), KS_E_INVALID);
  char deep[2 * (KS_PLAN_MAX_DEPTH + 1)];
  for (size_t i = 0; i < sizeof deep; i += 2) deep[i] = 'a', deep[i + 1] = '/';
  deep[sizeof deep - 1] = 0;
  const char *const deep_names[] = {deep, NULL};
  f = names_of(deep_names);
  assert_int_equal(plan(NULL, NULL, &f, "", NULL, &p), KS_E_LIMIT);
}

static void bare_values_and_many_names(void **state) {
  (void)state;
  const char *const names[] = {"value", NULL};
  fixture f = names_of(names);
  ks_plan *p = NULL;
  assert_int_equal(plan("{\"containers\":{\"\":{\"kind\":\"value\"}}}", NULL, &f, "", NULL, &p), KS_OK);
  assert_int_equal(ks_plan_at(p, 0)->tag, KS_PLAN_LEAF);
  ks_plan_free(p);
  f.n = 0;
  assert_int_equal(plan("{\"containers\":{\"\":{\"kind\":\"value\"}}}", NULL, &f, "", NULL, &p), KS_OK);
  assert_int_equal(ks_plan_at(p, 0)->tag, KS_PLAN_NONE);
  ks_plan_free(p);
  enum { N = 20000 }; /* the trie's table grows past its first sizes */
  char(*buf)[16] = malloc(N * sizeof *buf);
  const char **many = malloc(N * sizeof *many);
  size_t *lens = malloc(N * sizeof *lens);
  for (size_t i = 0; i < N; i++) {
    lens[i] = (size_t)snprintf(buf[i], sizeof buf[i], "t/%zu", N - 1 - i);
    many[i] = buf[i];
  }
  assert_int_equal(ks_structure_plan(NULL, 0, NULL, 0, many, lens, N, "", NULL, &p, NULL), KS_OK);
  const ks_plan_node *t = kid(p, ks_plan_at(p, 0), 0);
  assert_int_equal(t->n, N);
  int_is(&kid(p, t, 0)->key, N - 1);
  assert_int_equal(kid(p, t, N - 1)->name, N - 1);
  ks_plan_free(p);
  free(buf);
  free(many);
  free(lens);
}

static void allocation_failures_leak_nothing(void **state) {
  (void)state;
  const char *const names[] = {"opt/state/0", "opt/state/True", "opt/betas/1", "opt/betas/0", "opt/a%2Fb",
                               "opt/big", "x/0", NULL};
  fixture f = names_of(names);
  const char *table = "{\"k\":{\"keys\":[[\"s\",3]]},\"e\":\"dict\"}";
  const char *const tnames[] = {"k/0", NULL};
  fixture tf = names_of(tnames);
  int completed = 0;
  for (long fail = 1; fail < 400 && !completed; fail++) {
    ks_test_alloc ta;
    ks_test_alloc_init(&ta, fail);
    ks_plan *p = NULL, *q = NULL;
    ks_status st = plan(DOC, NULL, &f, "", &ta.a, &p);
    if (!st) st = plan(NULL, table, &tf, "", &ta.a, &q);
    if (!st) completed = 1;
    else assert_int_equal(st, KS_E_NOMEM);
    ks_plan_free(p);
    ks_plan_free(q);
    assert_int_equal(ta.live, 0);
  }
  assert_true(completed);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(documents_type_every_folder),
      cmocka_unit_test(pytree_tables_of_010_still_read),
      cmocka_unit_test(bad_records_are_refused),
      cmocka_unit_test(bare_values_and_many_names),
      cmocka_unit_test(allocation_failures_leak_nothing),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
