/*
 * The one name rule (KS_MAX_NAME, ks__name_check): a name or key of exactly the
 * limit is accepted and one byte more is KS_E_LIMIT naming it, wherever a name
 * enters: the state dict, the metric collection, the state registry, the keys a
 * state save builds from metric names, a file's header on load, and a torch
 * import. Never a silent truncation.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/internal.h"
#include "keepsake/keepsake.h"
#include "testutil.h"

/* A malloc'd name of n bytes: prefix, then 'a's. */
static char *name_of(const char *prefix, size_t n) {
  size_t p = strlen(prefix);
  assert_true(n >= p);
  char *s = malloc(n + 1);
  assert_non_null(s);
  memcpy(s, prefix, p);
  memset(s + p, 'a', n - p);
  s[n] = '\0';
  return s;
}

static void name_check_takes_exactly_the_limit(void **s) {
  (void)s;
  char *ok = name_of("", KS_MAX_NAME), *over = name_of("", KS_MAX_NAME + 1);
  ks_error err;
  assert_int_equal(ks__name_check(ok, &err), KS_OK);
  assert_int_equal(ks__name_check(over, &err), KS_E_LIMIT);
  assert_int_equal(err.code, KS_E_LIMIT);
  assert_non_null(strstr(err.message, "1025 bytes"));
  assert_int_equal(strncmp(err.key, over, 16), 0); /* names the key (its start: the field is short) */
  assert_int_equal(ks__name_check("", &err), KS_E_INVALID);
  assert_int_equal(ks__name_check(NULL, NULL), KS_E_INVALID);
  free(ok);
  free(over);
}

static void the_state_dict_and_collection_use_it(void **s) {
  (void)s;
  char *ok = name_of("", KS_MAX_NAME), *over = name_of("", KS_MAX_NAME + 1);
  ks_statedict *sd;
  ks_error err;
  assert_int_equal(ks_statedict_create(NULL, &sd, &err), KS_OK);
  assert_int_equal(ks_statedict_set_int(sd, ok, 1, &err), KS_OK);
  assert_int_equal(ks_statedict_set_int(sd, over, 1, &err), KS_E_LIMIT);
  assert_int_equal(err.code, KS_E_LIMIT);
  int64_t shape[1] = {2};
  assert_int_equal(ks_statedict_new_tensor(sd, over, KS_F32, 1, shape, NULL, &err), KS_E_LIMIT);
  assert_int_equal(ks_statedict_count(sd), 1); /* unchanged by the refusals */
  /* A prefix rename that would pass the limit is refused, not cut. */
  ks_statedict *dst;
  assert_int_equal(ks_statedict_create(NULL, &dst, NULL), KS_OK);
  assert_int_equal(ks__statedict_copy_prefix(dst, sd, "", "x", &err), KS_E_LIMIT);
  assert_non_null(strstr(err.message, "1025 bytes"));
  ks_statedict_free(dst);
  ks_statedict_free(sd);

  ks_metric_collection *c;
  assert_int_equal(ks_metric_collection_create(NULL, &c, &err), KS_OK);
  ks_metric *m1, *m2;
  assert_int_equal(ks_metric_create("SumMetric", NULL, NULL, &m1, NULL), KS_OK);
  assert_int_equal(ks_metric_create("SumMetric", NULL, NULL, &m2, NULL), KS_OK);
  assert_int_equal(ks_metric_collection_add(c, ok, m1, &err), KS_OK);
  assert_int_equal(ks_metric_collection_add(c, over, m2, &err), KS_E_LIMIT);
  assert_int_equal(err.code, KS_E_LIMIT);
  ks_metric_free(m2); /* not taken on failure */
  ks_metric_collection_free(c);
  free(ok);
  free(over);
}

static void the_registry_checks_the_keys_it_builds(void **s) {
  (void)s;
  const size_t room = KS_MAX_NAME - strlen("state/model/");
  char *ok = name_of("", room), *over = name_of("", room + 1);
  ks_state *st;
  ks_error err;
  assert_int_equal(ks_state_create("names", 0, NULL, &st, &err), KS_OK);
  float v[2] = {1, 2};
  int64_t shape[1] = {2};
  ks_tensor t;
  assert_int_equal(ks_tensor_init(&t, KS_F32, 1, shape, v), KS_OK);
  assert_int_equal(ks_state_add_tensor(st, ok, &t, &err), KS_OK);
  assert_int_equal(ks_state_add_tensor(st, over, &t, &err), KS_E_LIMIT);
  assert_int_equal(strncmp(err.key, over, 16), 0);
  assert_int_equal(ks_state_add_tensor(st, "a//b", &t, &err), KS_E_INVALID);
  assert_non_null(strstr(err.message, "empty path segment"));
  assert_int_equal(ks_state_add_tensor(st, ok, &t, &err), KS_E_EXISTS);
  ks_state_free(st);
  free(ok);
  free(over);
}

/* The train metric whose name is in ctx, as the program's factory. */
static ks_status one_metric(void *ctx, const char *label, const ks_allocator *a, ks_metric_collection **out,
                            ks_error *err) {
  (void)label;
  ks_metric *m = NULL;
  ks_status st = ks_metric_collection_create(a, out, err);
  if (!st) st = ks_metric_create("SumMetric", NULL, a, &m, err);
  if (!st) st = ks_metric_collection_add(*out, ctx, m, err);
  if (st) {
    ks_metric_free(m);
    ks_metric_collection_free(*out);
  }
  return st;
}

/* A state with one SumMetric named name; saves to path. */
static ks_status save_with_metric(const char *name, const char *path, ks_error *err) {
  ks_state *st;
  ks_status s = ks_state_create("names", 0, NULL, &st, err);
  if (!s) s = ks_state_build_metrics(st, one_metric, (void *)name, NULL, 0, err);
  ks_save_opts so = {.io = ks_test_io_nosync()};
  if (!s) s = ks_state_save(st, path, &so, err);
  ks_state_free(st);
  return s;
}

/* Metric names are checked whole, as the keys the save builds from them: the longest is
   state/train_metrics/<name>/state_dict/sum_value. Before, such keys were cut at the buffer. */
static void a_metric_name_at_the_limit_saves_and_loads(void **s) {
  (void)s;
  const size_t room = KS_MAX_NAME - strlen("state/train_metrics/") - strlen("/state_dict/sum_value");
  char *ok = name_of("", room), *over = name_of("", room + 1);
  char *root = ks_test_tmpdir("names");
  char *path = ks_test_path(root, "m.keepsake");
  ks_error err;
  assert_int_equal(save_with_metric(ok, path, &err), KS_OK);
  /* It loads back under its full name. */
  ks_state *st;
  assert_int_equal(ks_state_create("names", 0, NULL, &st, NULL), KS_OK);
  assert_int_equal(ks_state_build_metrics(st, one_metric, ok, NULL, 0, NULL), KS_OK);
  ks_load_report *rep;
  assert_int_equal(ks_load_report_create(NULL, &rep, NULL), KS_OK);
  assert_int_equal(ks_state_load(st, path, NULL, rep, &err), KS_OK);
  char *key = name_of("state/train_metrics/", strlen("state/train_metrics/") + room);
  const ks_load_item *it = ks_load_report_find(rep, key);
  assert_non_null(it);
  assert_int_equal(it->kind, KS_LOAD_LOADED);
  free(key);
  ks_load_report_free(rep);
  ks_state_free(st);
  /* One byte more: refused with the key named, and the file already saved is untouched. */
  size_t before_len;
  uint8_t *before = ks_test_read_file(path, &before_len);
  assert_non_null(before);
  ks_status over_st = save_with_metric(over, path, &err);
  if (over_st != KS_E_LIMIT) fail_msg("%s: %s", ks_status_name(over_st), err.message);
  assert_non_null(strstr(err.message, "KS_MAX_NAME"));
  size_t after_len;
  uint8_t *after = ks_test_read_file(path, &after_len);
  assert_non_null(after);
  assert_int_equal(after_len, before_len);
  assert_memory_equal(after, before, before_len);
  free(before);
  free(after);
  ks_test_rmtree(root);
  free(path);
  free(root);
  free(ok);
  free(over);
}

/* A safetensors file with one empty F32 tensor named `name`. */
static uint8_t *file_with_key(const char *name, size_t *len) {
  char *json = malloc(strlen(name) + 128);
  assert_non_null(json);
  int n = sprintf(json, "{\"%s\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}", name);
  uint8_t *buf = malloc(8 + (size_t)n);
  assert_non_null(buf);
  for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)n >> (8 * i));
  memcpy(buf + 8, json, (size_t)n);
  free(json);
  *len = 8 + (size_t)n;
  return buf;
}

static void a_file_key_over_the_limit_is_refused_on_load(void **s) {
  (void)s;
  char *ok = name_of("", KS_MAX_NAME), *over = name_of("", KS_MAX_NAME + 1);
  size_t n;
  uint8_t *good = file_with_key(ok, &n);
  ks_statedict *sd = NULL;
  ks_meta *meta = NULL;
  ks_error err;
  assert_int_equal(ks_load_buffer(good, n, NULL, &sd, &meta, &err), KS_OK);
  assert_non_null(ks_statedict_tensor(sd, ok));
  ks_statedict_free(sd);
  ks_meta_free(meta);
  uint8_t *bad = file_with_key(over, &n);
  sd = NULL;
  meta = NULL;
  assert_int_equal(ks_load_buffer(bad, n, NULL, &sd, &meta, &err), KS_E_LIMIT);
  assert_null(sd);
  free(good);
  free(bad);
  free(ok);
  free(over);
}

/* Import: a .pt whose flattened key is exactly KS_MAX_NAME bytes comes back whole. */
static void an_imported_key_at_the_limit_comes_back_whole(void **s) {
  (void)s;
  char *ok = name_of("state/model/", KS_MAX_NAME);
  char *root = ks_test_tmpdir("names");
  char *path = ks_test_path(root, "m.pt");
  ks_statedict *sd;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  float *w;
  int64_t shape[1] = {3};
  assert_int_equal(ks_statedict_new_tensor(sd, ok, KS_F32, 1, shape, (void **)&w, NULL), KS_OK);
  for (int i = 0; i < 3; i++) w[i] = (float)i;
  ks_error err;
  ks_torch_write_opts wo = {0};
  wo.io = ks_test_io_nosync();
  assert_int_equal(ks_torch_save(path, sd, &wo, &err), KS_OK);
  ks_statedict_free(sd);
  ks_statedict *in = NULL;
  ks_meta *meta = NULL;
  assert_int_equal(ks_torch_import(path, NULL, &in, &meta, &err), KS_OK);
  const ks_tensor *t = ks_statedict_tensor(in, ok);
  assert_non_null(t);
  assert_true(((const float *)t->data)[2] == 2.0f);
  ks_statedict_free(in);
  ks_meta_free(meta);
  ks_test_rmtree(root);
  free(path);
  free(root);
  free(ok);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(name_check_takes_exactly_the_limit),
      cmocka_unit_test(the_state_dict_and_collection_use_it),
      cmocka_unit_test(the_registry_checks_the_keys_it_builds),
      cmocka_unit_test(a_metric_name_at_the_limit_saves_and_loads),
      cmocka_unit_test(a_file_key_over_the_limit_is_refused_on_load),
      cmocka_unit_test(an_imported_key_at_the_limit_comes_back_whole),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
