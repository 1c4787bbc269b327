/*
 * A file the Python package wrote records its containers in `keepsake.pytree`; its .pt export
 * must still be a PyTorch checkpoint: lists, tuples and int-keyed dicts in the structure the .pt
 * writer reads, typed keys, empty containers, the leaf kinds exported as stored, a positional
 * str-keyed dict refused by name, and every allocation failure leaking nothing.
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
#include "testutil.h"

static const char *const k_table =
    "{\"opt/state\":\"intdict\",\"opt/param_groups\":\"list\",\"opt/param_groups/0/params\":\"list\","
    "\"opt/param_groups/0/betas\":\"tuple\",\"empty\":\"list\",\"none\":\"dict\",\"big\":\"bigint\","
    "\"typed\":{\"keys\":[[\"f\",1.5],[\"b\",true],[\"n\",null]]}}";

static char *write_python_file(const char *dir, const char *table) {
  ks_statedict *sd;
  ks_meta *meta;
  float one = 1.0f;
  ks_tensor t;
  assert_int_equal(ks_tensor_init(&t, KS_F32, 0, NULL, &one), KS_OK);
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  const char *tensors[] = {"opt/state/0/exp_avg", "opt/state/1/exp_avg", "typed/0", "typed/1", "typed/2"};
  for (size_t i = 0; i < sizeof tensors / sizeof *tensors; i++)
    assert_int_equal(ks_statedict_set_tensor(sd, tensors[i], &t, KS_COPY, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_int(sd, "opt/param_groups/0/params/0", 0, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_int(sd, "opt/param_groups/0/params/1", 1, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_float(sd, "opt/param_groups/0/betas/0", 0.9, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_float(sd, "opt/param_groups/0/betas/1", 0.999, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_string(sd, "big", "123456789012345678901234567890", NULL), KS_OK);
  assert_int_equal(ks_meta_create(NULL, &meta, NULL), KS_OK);
  assert_int_equal(ks_meta_set(meta, KS_META_PYTREE, table, NULL), KS_OK);
  char *path = ks_test_path(dir, "py.keepsake");
  ks_save_opts so = {.size = sizeof so, .io = ks_test_io_nosync()};
  assert_int_equal(ks_save(path, sd, meta, &so, NULL), KS_OK);
  ks_meta_free(meta);
  ks_statedict_free(sd);
  return path;
}

static void containers_come_back(void **unused) {
  (void)unused;
  char *dir = ks_test_tmpdir("pytree");
  char *in = write_python_file(dir, k_table), *out = ks_test_path(dir, "py.pt");
  ks_convert_opts o = {.size = sizeof o, .io = ks_test_io_nosync()};
  ks_error err;
  if (ks_convert(in, out, &o, NULL, &err)) fail_msg("convert: %s", err.message);
  ks_statedict *sd = NULL;
  char *doc = NULL;
  assert_int_equal(ks_torch_load(out, NULL, &sd, &doc, &err), KS_OK);
  assert_non_null(doc);
  if (getenv("KS_TEST_VERBOSE")) printf("%s\n", doc);
  /* What the reader found in the pickle, recorded again in its own structure document. */
  assert_non_null(strstr(doc, "\"opt/param_groups\":{\"kind\":\"list\",\"len\":1}"));
  assert_non_null(strstr(doc, "\"opt/param_groups/0/betas\":{\"kind\":\"tuple\",\"len\":2}"));
  assert_non_null(strstr(doc, "\"opt/param_groups/0/params\":{\"kind\":\"list\",\"len\":2}"));
  assert_non_null(strstr(doc, "\"empty\":{\"kind\":\"list\",\"len\":0}"));
  assert_non_null(strstr(doc, "\"kind\":\"dict\",\"keys\":{\"0\":0,\"1\":1}"));
  /* The typed keys came back as keys: the reader names them by their text. */
  assert_non_null(strstr(doc, "\"typed\":{\"kind\":\"dict\",\"keys\":{\"1.5\":1.5,\"True\":true,\"None\":null}}"));
  ks_entry e;
  assert_int_equal(ks_statedict_get(sd, "big", &e), KS_OK);
  assert_int_equal(e.kind, KS_VAL_STRING); /* a big int goes out as the text it was stored as */
  ks_torch_free(NULL, doc);
  ks_statedict_free(sd);
  free(out);
  free(in);
  free(dir);
}

static void positional_str_keys_are_refused(void **unused) {
  (void)unused;
  char *dir = ks_test_tmpdir("pytree-str");
  char *in = write_python_file(dir, "{\"typed\":{\"keys\":[[\"i\",1],[\"s\",\"a/b\"],[\"n\",null]]}}");
  char *out = ks_test_path(dir, "py.pt");
  ks_convert_opts o = {.size = sizeof o, .io = ks_test_io_nosync()};
  ks_error err;
  assert_int_equal(ks_convert(in, out, &o, NULL, &err), KS_E_UNSUPPORTED);
  assert_string_equal(err.key, "typed");
  ks_statedict *sd = NULL;
  assert_int_not_equal(ks_torch_load(out, NULL, &sd, NULL, NULL), KS_OK); /* nothing was written */
  /* To keepsake the file converts as it is (the table travels along). */
  char *copy = ks_test_path(dir, "copy.keepsake");
  assert_int_equal(ks_convert(in, copy, &o, NULL, &err), KS_OK);
  free(copy);
  free(out);
  free(in);
  free(dir);
}

static void every_allocation_failure_leaks_nothing(void **unused) {
  (void)unused;
  char *dir = ks_test_tmpdir("pytree-nomem");
  char *in = write_python_file(dir, k_table), *out = ks_test_path(dir, "py.pt");
  ks_status s = KS_E_NOMEM;
  for (long n = 1; s == KS_E_NOMEM && n < 20000; n++) {
    ks_test_alloc ta;
    ks_test_alloc_init(&ta, n);
    ks_convert_opts o = {.size = sizeof o, .io = ks_test_io_nosync(), .alloc = &ta.a};
    ks_error err;
    s = ks_convert(in, out, &o, NULL, &err);
    if (ta.live) fail_msg("allocation %ld failed: %ld blocks leaked (%s)", n, ta.live, err.message);
    if (s && s != KS_E_NOMEM) fail_msg("allocation %ld failed: %s (%s)", n, ks_status_name(s), err.message);
  }
  assert_int_equal(s, KS_OK);
  free(out);
  free(in);
  free(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(containers_come_back),
      cmocka_unit_test(positional_str_keys_are_refused),
      cmocka_unit_test(every_allocation_failure_leaks_nothing),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
