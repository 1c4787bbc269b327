/*
 * ks_save under failure: every I/O step and every allocation fails in turn;
 * the previous file must stay byte-identical and no temporary file may remain.
 */
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "faultio.h"
#include "test_format_helpers.h"

typedef struct fixture {
  char *dir, *path;
  uint8_t *old_bytes, *new_bytes;
  size_t old_len, new_len;
  ks_statedict *next;
} fixture;

/* A directory holding ckpt.ks (the old file) and the bytes a successful save of `next` produces. */
static int setup(void **state) {
  fixture *fx = calloc(1, sizeof *fx);
  fx->dir = ks_test_tmpdir("fmt-fault");
  fx->path = ks_test_path(fx->dir, "ckpt.ks");
  ks_statedict *old = fmt_small_dict(1);
  fx->next = fmt_small_dict(2);
  char *ref = ks_test_path(fx->dir, "ref");
  char *refpath = ks_test_path(ref, "ckpt.ks");
  mkdir(ref, 0700);
  if (ks_save(fx->path, old, NULL, NULL, NULL) || ks_save(refpath, fx->next, NULL, NULL, NULL)) return -1;
  fx->old_bytes = ks_test_read_file(fx->path, &fx->old_len);
  fx->new_bytes = ks_test_read_file(refpath, &fx->new_len);
  ks_test_rmtree(ref);
  free(ref);
  free(refpath);
  ks_statedict_free(old);
  *state = fx;
  return 0;
}

static int teardown(void **state) {
  fixture *fx = *state;
  ks_test_rmtree(fx->dir);
  free(fx->dir);
  free(fx->path);
  free(fx->old_bytes);
  free(fx->new_bytes);
  ks_statedict_free(fx->next);
  free(fx);
  return 0;
}

static void assert_file_is(const char *path, const uint8_t *want, size_t want_len) {
  size_t len;
  uint8_t *got = ks_test_read_file(path, &len);
  assert_non_null(got);
  assert_int_equal(len, want_len);
  assert_memory_equal(got, want, len);
  free(got);
}

static void restore_old(fixture *fx) { ks_test_write_file(fx->path, fx->old_bytes, fx->old_len); }

static void save_failing_at_each_io_step_keeps_old_file(void **state) {
  fixture *fx = *state;
  int seen[7] = {0};
  for (long n = 1;; n++) {
    ks_fault_io f;
    ks_fault_io_init(&f, n);
    ks_save_opts o = {.io = &f.io};
    ks_error err;
    ks_status st = ks_save(fx->path, fx->next, NULL, &o, &err);
    assert_int_equal(ks_test_dir_entries(fx->dir), 1); /* no temporary file left behind */
    if (st == KS_OK) {
      assert_int_equal(f.failed_op, -1);
      assert_file_is(fx->path, fx->new_bytes, fx->new_len);
      restore_old(fx);
      break;
    }
    /* A failed directory fsync comes after the rename: its own status, the file is in place. */
    assert_int_equal(st, f.failed_op == KS_FAULT_FSYNC_DIR ? KS_E_NOT_DURABLE : KS_E_IO);
    assert_string_equal(err.file, fx->path);
    seen[f.failed_op] = 1;
    if (f.failed_op == KS_FAULT_FSYNC_DIR) {
      /* The rename already happened: the new file is in place, only its durability is unknown. */
      assert_non_null(strstr(err.message, "durability unknown"));
      assert_file_is(fx->path, fx->new_bytes, fx->new_len);
      restore_old(fx);
    } else {
      assert_file_is(fx->path, fx->old_bytes, fx->old_len);
    }
  }
  for (int op = 0; op < 7; op++)
    if (op != KS_FAULT_UNLINK) assert_true(seen[op]); /* every step was made to fail once */
}

static void save_failing_at_each_allocation_keeps_old_file(void **state) {
  fixture *fx = *state;
  for (long n = 1;; n++) {
    ks_test_alloc ta;
    ks_test_alloc_init(&ta, n);
    ks_save_opts o = {.alloc = &ta.a, .io = ks_test_io_nosync()};
    ks_status st = ks_save(fx->path, fx->next, NULL, &o, NULL);
    assert_int_equal(ta.live, 0);
    assert_int_equal(ks_test_dir_entries(fx->dir), 1);
    if (st == KS_OK) {
      assert_true(n > 3);
      assert_file_is(fx->path, fx->new_bytes, fx->new_len);
      restore_old(fx);
      break;
    }
    assert_int_equal(st, KS_E_NOMEM);
    assert_file_is(fx->path, fx->old_bytes, fx->old_len);
  }
}

static void save_handles_short_writes(void **state) {
  fixture *fx = *state;
  ks_fault_io f;
  ks_fault_io_init(&f, 0);
  f.max_write = 7;
  ks_save_opts o = {.io = &f.io};
  assert_int_equal(ks_save(fx->path, fx->next, NULL, &o, NULL), KS_OK);
  assert_file_is(fx->path, fx->new_bytes, fx->new_len);
  assert_true(f.op_count[KS_FAULT_WRITE] >= (int)(fx->new_len / 7));
  restore_old(fx);
}

static void save_fsyncs_file_and_directory_once(void **state) {
  fixture *fx = *state;
  ks_fault_io f;
  ks_fault_io_init(&f, 0);
  ks_save_opts o = {.io = &f.io};
  assert_int_equal(ks_save(fx->path, fx->next, NULL, &o, NULL), KS_OK);
  assert_int_equal(f.op_count[KS_FAULT_FSYNC], 1);
  assert_int_equal(f.op_count[KS_FAULT_FSYNC_DIR], 1);
  restore_old(fx);
}

static void save_into_read_only_dir_fails_cleanly(void **state) {
  fixture *fx = *state;
  if (geteuid() == 0) skip(); /* root ignores directory permissions */
  chmod(fx->dir, 0500);
  ks_error err;
  ks_status st = ks_save(fx->path, fx->next, NULL, NULL, &err);
  chmod(fx->dir, 0700);
  assert_int_equal(st, KS_E_IO);
  assert_non_null(strstr(err.message, "temporary"));
  assert_file_is(fx->path, fx->old_bytes, fx->old_len);
  assert_int_equal(ks_test_dir_entries(fx->dir), 1);
}

static void save_into_missing_dir_reports_io_error(void **state) {
  fixture *fx = *state;
  char *p = ks_test_path(fx->dir, "no/such/dir/ckpt.ks");
  ks_error err;
  assert_int_equal(ks_save(p, fx->next, NULL, NULL, &err), KS_E_IO);
  assert_string_equal(err.file, p);
  free(p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(save_failing_at_each_io_step_keeps_old_file),
      cmocka_unit_test(save_failing_at_each_allocation_keeps_old_file),
      cmocka_unit_test(save_handles_short_writes),
      cmocka_unit_test(save_fsyncs_file_and_directory_once),
      cmocka_unit_test(save_into_read_only_dir_fails_cleanly),
      cmocka_unit_test(save_into_missing_dir_reports_io_error),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
