/*
 * The durable replace behind ks_save and ks_torch_save against hostile
 * destinations and leftovers: devices, FIFOs and directories are refused;
 * stale temporary files of killed writers are removed, live ones never.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <fcntl.h>
#include <unistd.h>

#include <cmocka.h>

#include "keepsake/keepsake.h"
#include "keepsake/torch.h"
#include "testutil.h"

static ks_statedict *one_entry(void) {
  ks_statedict *sd;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_int(sd, "step", 7, NULL), KS_OK);
  return sd;
}

static void save_both(const char *path, ks_status want_keepsake, ks_status want_pt, const char *text) {
  ks_statedict *sd = one_entry();
  ks_save_opts so = {0}; /* POSIX: every save here is refused before it writes */
  ks_error err;
  assert_int_equal(ks_save(path, sd, NULL, &so, &err), want_keepsake);
  if (text) assert_non_null(strstr(err.message, text));
  ks_torch_write_opts wo = {0};
  assert_int_equal(ks_torch_save(path, sd, &wo, &err), want_pt);
  if (text) assert_non_null(strstr(err.message, text));
  ks_statedict_free(sd);
}

static void non_regular_destinations_are_refused(void **s) {
  (void)s;
  char *dir = ks_test_tmpdir("durable-dest");
  char *fifo = ks_test_path(dir, "out.fifo"), *sub = ks_test_path(dir, "out.dir");
  assert_int_equal(mkfifo(fifo, 0600), 0);
  assert_int_equal(mkdir(sub, 0700), 0);
  save_both(fifo, KS_E_INVALID, KS_E_INVALID, "a FIFO");
  save_both(sub, KS_E_INVALID, KS_E_INVALID, "a directory");
  struct stat sb;
  assert_int_equal(lstat(fifo, &sb), 0);
  assert_true(S_ISFIFO(sb.st_mode));
  assert_int_equal(lstat(sub, &sb), 0);
  assert_true(S_ISDIR(sb.st_mode));
  assert_int_equal(ks_test_dir_entries(dir), 2); /* no temporary file left behind */
  ks_test_rmtree(dir);
  free(fifo), free(sub), free(dir);
}

static void age(const char *path, int seconds) {
  struct timeval tv[2];
  gettimeofday(&tv[0], NULL);
  tv[0].tv_sec -= seconds;
  tv[1] = tv[0];
  assert_int_equal(utimes(path, tv), 0);
}

/* Old unlocked temp files go; fresh, locked and foreign-looking ones stay, whatever their number. */
static void stale_temporary_files_are_removed_live_ones_kept(void **s) {
  (void)s;
  for (int n = 1; n <= 64; n *= 4) {
    char *dir = ks_test_tmpdir("durable-stale");
    char name[64];
    for (int i = 0; i < n; i++) {
      snprintf(name, sizeof name, ".old%d.keepsake.tmp-Ab%04d", i, i);
      char *p = ks_test_path(dir, name);
      assert_int_equal(ks_test_write_file(p, "x", 1), 0);
      age(p, 3600);
      free(p);
    }
    static const char *const keep[] = {".out.keepsake.tmp-Fresh1", ".out.keepsake.tmp-LOCKED",
                                       ".out.keepsake.tmp-seven77", "out.keepsake.tmp-NODOT1", ".tmp-AAAAAA"};
    int locked = -1;
    for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++) {
      char *p = ks_test_path(dir, keep[i]);
      assert_int_equal(ks_test_write_file(p, "x", 1), 0);
      if (i) age(p, 3600);
      if (i == 1) {
        locked = open(p, O_RDONLY);
        assert_int_equal(flock(locked, LOCK_EX), 0);
      }
      free(p);
    }
    char *out = ks_test_path(dir, "out.keepsake");
    save_both(out, KS_OK, KS_OK, NULL);
    assert_int_equal(ks_test_dir_entries(dir), 1 + (int)(sizeof keep / sizeof keep[0]));
    for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++) {
      char *p = ks_test_path(dir, keep[i]);
      assert_true(ks_test_exists(p));
      free(p);
    }
    close(locked);
    ks_test_rmtree(dir);
    free(out), free(dir);
  }
}

/* "cannot create temporary file" names the temporary file. */
static void temp_file_errors_name_the_temp_file(void **s) {
  (void)s;
  char *dir = ks_test_tmpdir("durable-name");
  char *out = ks_test_path(dir, "missing/out.keepsake");
  ks_statedict *sd = one_entry();
  ks_error err;
  assert_int_equal(ks_save(out, sd, NULL, NULL, &err), KS_E_IO);
  assert_non_null(strstr(err.message, "cannot create temporary file"));
  assert_non_null(strstr(err.message, "missing/.out.keepsake.tmp-"));
  ks_statedict_free(sd);
  ks_test_rmtree(dir);
  free(out), free(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(non_regular_destinations_are_refused),
      cmocka_unit_test(stale_temporary_files_are_removed_live_ones_kept),
      cmocka_unit_test(temp_file_errors_name_the_temp_file),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
