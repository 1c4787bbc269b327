/*
 * ks_torch_save under failure: every I/O step and every allocation fails in
 * turn; the previous .pt must stay byte-identical and no temporary file may
 * remain. The durable replace is the one ks_save uses (core/durable.c).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "keepsake/keepsake.h"
#include "faultio.h"
#include "testutil.h"

/* Tensors (one widened U32 -> I64, which costs an allocation mid-write) and scalars, varying with seed. */
static ks_statedict *pt_dict(int seed) {
  ks_statedict *sd;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  int64_t s23[2] = {2, 3}, s4[1] = {4};
  float *w;
  assert_int_equal(ks_statedict_new_tensor(sd, "model/w", KS_F32, 2, s23, (void **)&w, NULL), KS_OK);
  for (int i = 0; i < 6; i++) w[i] = (float)(seed * 10 + i);
  uint32_t *u;
  assert_int_equal(ks_statedict_new_tensor(sd, "rng/numpy", KS_U32, 1, s4, (void **)&u, NULL), KS_OK);
  for (int i = 0; i < 4; i++) u[i] = (uint32_t)(seed + i);
  assert_int_equal(ks_statedict_set_int(sd, "step", seed * 100, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_float(sd, "opt/lr", 0.5 * seed, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_string(sd, "run_name", seed == 1 ? "old" : "new", NULL), KS_OK);
  return sd;
}

typedef struct fixture {
  char *dir, *path;
  uint8_t *old_bytes;
  void *new_bytes;
  size_t old_len, new_len;
  ks_statedict *next;
} fixture;

/* A directory holding ckpt.pt (the old file) and the bytes a save of `next` produces. */
static int setup(void **state) {
  fixture *fx = calloc(1, sizeof *fx);
  fx->dir = ks_test_tmpdir("pt-fault");
  fx->path = ks_test_path(fx->dir, "ckpt.pt");
  ks_statedict *old = pt_dict(1);
  fx->next = pt_dict(2);
  if (ks_torch_save(fx->path, old, NULL, NULL)) return -1;
  if (ks_torch_save_buffer(fx->next, NULL, &fx->new_bytes, &fx->new_len, NULL)) return -1;
  fx->old_bytes = ks_test_read_file(fx->path, &fx->old_len);
  ks_statedict_free(old);
  *state = fx;
  return fx->old_bytes ? 0 : -1;
}

static int teardown(void **state) {
  fixture *fx = *state;
  ks_test_rmtree(fx->dir);
  free(fx->dir);
  free(fx->path);
  free(fx->old_bytes);
  ks_torch_free(NULL, fx->new_bytes);
  ks_statedict_free(fx->next);
  free(fx);
  return 0;
}

static void assert_file_is(const char *path, const void *want, size_t want_len) {
  size_t len;
  uint8_t *got = ks_test_read_file(path, &len);
  assert_non_null(got);
  assert_int_equal(len, want_len);
  assert_memory_equal(got, want, len);
  free(got);
}

static void restore_old(fixture *fx) { assert_int_equal(ks_test_write_file(fx->path, fx->old_bytes, fx->old_len), 0); }

static void assert_io_error_names_step(const ks_error *err, int op) {
  static const char *const step[KS_FAULT_OP_COUNT] = {"cannot create temporary file", "cannot write temporary file",
                                             "cannot fsync temporary file", "cannot close temporary file",
                                             "cannot rename into place",     NULL,
                                             "durability unknown"};
  assert_non_null(step[op]);
  assert_non_null(strstr(err->message, step[op]));
}

static void pt_save_failing_at_each_io_step_keeps_old_file(void **state) {
  fixture *fx = *state;
  int seen[KS_FAULT_OP_COUNT] = {0};
  for (long n = 1;; n++) {
    ks_fault_io f;
    ks_fault_io_init(&f, n);
    ks_torch_write_opts o = {0};
    o.io = &f.io;
    ks_error err;
    ks_status st = ks_torch_save(fx->path, fx->next, &o, &err);
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
    assert_io_error_names_step(&err, f.failed_op);
    seen[f.failed_op] = 1;
    if (f.failed_op == KS_FAULT_FSYNC_DIR) {
      /* The rename already happened: the new file is in place, only its durability is unknown. */
      assert_file_is(fx->path, fx->new_bytes, fx->new_len);
      restore_old(fx);
    } else {
      assert_file_is(fx->path, fx->old_bytes, fx->old_len);
    }
  }
  for (int op = 0; op < KS_FAULT_OP_COUNT; op++)
    if (op != KS_FAULT_UNLINK) assert_true(seen[op]); /* every step was made to fail once */
}

static void pt_save_failing_at_each_allocation_keeps_old_file(void **state) {
  fixture *fx = *state;
  int failed_with_temp_open = 0;
  for (long n = 1;; n++) {
    ks_test_alloc ta;
    ks_test_alloc_init(&ta, n);
    ks_fault_io f;
    ks_fault_io_init(&f, 0);
    ks_torch_write_opts o = {0};
    o.alloc = &ta.a;
    o.io = &f.io;
    ks_status st = ks_torch_save(fx->path, fx->next, &o, NULL);
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
    if (f.op_count[KS_FAULT_CREATE]) {
      failed_with_temp_open = 1;
      assert_int_equal(f.op_count[KS_FAULT_UNLINK], 1); /* the partial temporary file was removed */
    }
  }
  assert_true(failed_with_temp_open); /* some allocations happen while streaming the archive */
}

static void pt_save_writes_temp_in_same_directory_and_syncs_it(void **state) {
  fixture *fx = *state;
  ks_fault_io f;
  ks_fault_io_init(&f, 0);
  ks_torch_write_opts o = {0};
  o.io = &f.io;
  assert_int_equal(ks_torch_save(fx->path, fx->next, &o, NULL), KS_OK);
  char prefix[512];
  snprintf(prefix, sizeof prefix, "%s/.ckpt.pt.tmp-", fx->dir);
  assert_int_equal(strncmp(f.created, prefix, strlen(prefix)), 0);
  assert_int_equal(strlen(f.created), strlen(prefix) + 6);
  assert_int_equal(f.op_count[KS_FAULT_FSYNC], 1);
  assert_int_equal(f.op_count[KS_FAULT_FSYNC_DIR], 1);
  assert_int_equal(f.op_count[KS_FAULT_RENAME], 1);
  assert_file_is(fx->path, fx->new_bytes, fx->new_len);
  restore_old(fx);
}

static void pt_save_handles_short_writes(void **state) {
  fixture *fx = *state;
  ks_fault_io f;
  ks_fault_io_init(&f, 0);
  f.max_write = 7;
  ks_torch_write_opts o = {0};
  o.io = &f.io;
  assert_int_equal(ks_torch_save(fx->path, fx->next, &o, NULL), KS_OK);
  assert_file_is(fx->path, fx->new_bytes, fx->new_len);
  assert_true(f.op_count[KS_FAULT_WRITE] >= (int)(fx->new_len / 7));
  restore_old(fx);
}

static void pt_save_of_invalid_dict_leaves_no_temp_file(void **state) {
  fixture *fx = *state;
  ks_statedict *bad;
  assert_int_equal(ks_statedict_create(NULL, &bad, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_int(bad, "a", 1, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_int(bad, "a/b", 2, NULL), KS_OK); /* "a" is both a value and a folder */
  ks_error err;
  assert_int_equal(ks_torch_save(fx->path, bad, NULL, &err), KS_E_INVALID);
  assert_string_equal(err.file, fx->path);
  assert_file_is(fx->path, fx->old_bytes, fx->old_len);
  assert_int_equal(ks_test_dir_entries(fx->dir), 1);
  ks_statedict_free(bad);
}

static void pt_save_after_failures_writes_a_loadable_file(void **state) {
  fixture *fx = *state;
  ks_fault_io f;
  ks_fault_io_init(&f, 2); /* the first write fails */
  ks_torch_write_opts o = {0};
  o.io = &f.io;
  assert_int_equal(ks_torch_save(fx->path, fx->next, &o, NULL), KS_E_IO);
  assert_int_equal(ks_torch_save(fx->path, fx->next, NULL, NULL), KS_OK);
  assert_file_is(fx->path, fx->new_bytes, fx->new_len);
  ks_statedict *back;
  assert_int_equal(ks_torch_load(fx->path, NULL, &back, NULL, NULL), KS_OK);
  ks_entry e;
  assert_int_equal(ks_statedict_get(back, "step", &e), KS_OK);
  assert_int_equal(e.i, 200);
  const ks_tensor *w = ks_statedict_tensor(back, "model/w");
  assert_non_null(w);
  assert_memory_equal(w->data, ks_statedict_tensor(fx->next, "model/w")->data, 24);
  ks_statedict_free(back);
  assert_int_equal(ks_test_dir_entries(fx->dir), 1);
  restore_old(fx);
}

static void pt_save_to_directory_path_is_invalid(void **state) {
  fixture *fx = *state;
  char *p = ks_test_path(fx->dir, "");
  ks_error err;
  assert_int_equal(ks_torch_save(p, fx->next, NULL, &err), KS_E_INVALID);
  assert_non_null(strstr(err.message, "directory"));
  assert_int_equal(ks_test_dir_entries(fx->dir), 1);
  free(p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(pt_save_failing_at_each_io_step_keeps_old_file),
      cmocka_unit_test(pt_save_failing_at_each_allocation_keeps_old_file),
      cmocka_unit_test(pt_save_writes_temp_in_same_directory_and_syncs_it),
      cmocka_unit_test(pt_save_handles_short_writes),
      cmocka_unit_test(pt_save_of_invalid_dict_leaves_no_temp_file),
      cmocka_unit_test(pt_save_after_failures_writes_a_loadable_file),
      cmocka_unit_test(pt_save_to_directory_path_is_invalid),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
