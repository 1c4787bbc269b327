/* Growing public structs (export.h): sizes the library accepts and refuses; the status codes stay put. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "keepsake/keepsake.h"
#include "testutil.h"

static ks_status save_with(const ks_save_opts *o, const char *path) {
  ks_statedict *sd;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_int(sd, "x", 1, NULL), KS_OK);
  ks_status s = ks_save(path, sd, NULL, o, NULL);
  ks_statedict_free(sd);
  return s;
}

/* A caller built against a newer header: the library's struct plus members it does not know. */
typedef struct newer_save_opts {
  ks_save_opts known;
  int future_flag;
} newer_save_opts;

static void option_sizes_zero_current_and_newer_with_unset_tail_are_read(void **s) {
  (void)s;
  char *dir = ks_test_tmpdir("abi"), *path = ks_test_path(dir, "a.keepsake");
  ks_save_opts o = {.io = ks_test_io_nosync()};
  assert_int_equal(save_with(&o, path), KS_OK); /* size 0: this library's layout */
  o.size = sizeof o;
  assert_int_equal(save_with(&o, path), KS_OK);
  newer_save_opts n;
  memset(&n, 0, sizeof n);
  n.known.size = sizeof n;
  n.known.io = ks_test_io_nosync();
  assert_int_equal(save_with(&n.known, path), KS_OK); /* unknown members left zero: fine */
  n.future_flag = 1;
  assert_int_equal(save_with(&n.known, path), KS_E_INVALID); /* a member this library cannot honour */
  o.size = 3;
  assert_int_equal(save_with(&o, path), KS_E_INVALID); /* smaller than any layout */
  ks_read_opts ro = {.size = 1};
  ks_reader *r = NULL;
  assert_int_equal(ks_reader_open(path, &ro, &r, NULL), KS_E_INVALID);
  ro.size = sizeof ro;
  assert_int_equal(ks_reader_open(path, &ro, &r, NULL), KS_OK);
  ks_reader_free(r);
  ks_test_rmtree(dir);
  free(path);
  free(dir);
}

/* ks_io carries a version, not a size (io.h): version 0 and missing members are refused. */
static void an_io_table_of_version_0_or_with_holes_is_refused(void **s) {
  (void)s;
  char *dir = ks_test_tmpdir("abi"), *path = ks_test_path(dir, "b.keepsake");
  ks_io io = *ks_test_io_nosync();
  ks_save_opts o = {.io = &io};
  io.version = 0;
  assert_int_equal(save_with(&o, path), KS_E_INVALID);
  io.version = KS_IO_VERSION;
  assert_int_equal(save_with(&o, path), KS_OK);
  io.open_fn = NULL; /* a version 2 member */
  assert_int_equal(save_with(&o, path), KS_E_INVALID);
  io.version = 1; /* the version 2 members are not read */
  assert_int_equal(save_with(&o, path), KS_OK);
  io.rename_fn = NULL;
  assert_int_equal(save_with(&o, path), KS_E_INVALID);
  assert_int_equal(ks_test_dir_entries(dir), 1); /* nothing was written by the refused saves */
  ks_test_rmtree(dir);
  free(path);
  free(dir);
}

/* Append-only codes: the numbers programs were built with never change. */
static void status_codes_keep_their_numbers(void **s) {
  (void)s;
  assert_int_equal(KS_E_IO, 2);
  assert_int_equal(KS_E_NET, 17);
  assert_int_equal(KS_E_NOT_DURABLE, 18);
  assert_string_equal(ks_status_name(KS_E_NOT_DURABLE), "KS_E_NOT_DURABLE");
  assert_non_null(strstr(ks_strerror(KS_E_NOT_DURABLE), "durability"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(option_sizes_zero_current_and_newer_with_unset_tail_are_read),
      cmocka_unit_test(an_io_table_of_version_0_or_with_holes_is_refused),
      cmocka_unit_test(status_codes_keep_their_numbers),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
