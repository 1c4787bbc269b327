/* The checkpoint manager's run directory lock (ks_ckpt_opts.lock), and ks_io capabilities:
   a copy of ks_io_posix() locks and cleans stale temporary files exactly as the original. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "keepsake/keepsake.h"
#include "testprog.h"
#include "testutil.h"

static ks_status make(const char *dir, const ks_io *io, ks_ckpt_lock lock, ks_ckpt_manager **m, ks_error *e) {
  ks_ckpt_opts co = {.run_dir = dir, .save_interval = "10ba", .keep = 2, .io = io, .lock = lock};
  *m = NULL;
  return ks_ckpt_manager_create(&co, m, e);
}

static size_t count_checkpoints(const char *dir) {
  char cmd[4300];
  snprintf(cmd, sizeof cmd, "ls '%s' | grep -c '\\.keepsake$'", dir);
  char *out = NULL;
  (void)ks_test_run(cmd, &out);
  size_t n = out ? (size_t)strtoul(out, NULL, 10) : 0;
  free(out);
  return n;
}

static void save_at(ks_ckpt_manager *m, ks_test_prog *p, int64_t batch) {
  p->ts.batch = batch;
  p->w[0] = (float)batch;
  ks_error e;
  if (ks_ckpt_manager_save(m, p->st, NULL, &e)) fail_msg("save: %s", e.message);
}

/* A second manager on the same run directory is refused, names the holder, and deletes nothing. */
static void a_second_manager_is_refused_and_nothing_is_deleted(void **s) {
  (void)s;
  char *dir = ks_test_tmpdir("mgr-lock");
  ks_test_prog p;
  assert_int_equal(ks_test_prog_init(&p), KS_OK);
  ks_ckpt_manager *a = NULL, *b = NULL;
  ks_error e;
  assert_int_equal(make(dir, ks_test_io_nosync(), KS_CKPT_LOCK_AUTO, &a, &e), KS_OK);
  for (int64_t i = 1; i <= 2; i++) save_at(a, &p, i * 10);
  assert_int_equal(count_checkpoints(dir), 2);
  assert_int_equal(make(dir, NULL, KS_CKPT_LOCK_AUTO, &b, &e), KS_E_LOCKED);
  assert_null(b);
  char pid[32];
  snprintf(pid, sizeof pid, "pid %ld on host ", (long)getpid());
  if (!strstr(e.message, pid)) fail_msg("message does not name the holder: %s", e.message);
  assert_int_equal(count_checkpoints(dir), 2);
  /* Another spelling of the same directory is the same lock. */
  char other[4200];
  snprintf(other, sizeof other, "%s/./", dir);
  assert_int_equal(make(other, NULL, KS_CKPT_LOCK_AUTO, &b, &e), KS_E_LOCKED);
  ks_ckpt_manager_free(a);
  assert_int_equal(make(dir, NULL, KS_CKPT_LOCK_AUTO, &b, &e), KS_OK); /* released by free */
  ks_ckpt_manager_free(b);
  ks_state_free(p.st);
  ks_test_rmtree(dir);
  free(dir);
}

/* A holder in another process: refused while it lives, free once it is SIGKILLed. */
static void a_killed_holder_does_not_block_the_next_run(void **s) {
  (void)s;
  char *dir = ks_test_tmpdir("mgr-lock-kill");
  int ready[2];
  assert_int_equal(pipe(ready), 0);
  pid_t child = fork();
  assert_true(child >= 0);
  if (child == 0) {
    ks_ckpt_manager *m = NULL;
    char c = make(dir, NULL, KS_CKPT_LOCK_AUTO, &m, NULL) == KS_OK ? 'y' : 'n';
    if (write(ready[1], &c, 1) != 1) _exit(2);
    for (;;) pause(); /* holds the lock until killed */
  }
  char c = 0;
  assert_int_equal(read(ready[0], &c, 1), 1);
  assert_int_equal(c, 'y');
  ks_ckpt_manager *m = NULL;
  ks_error e;
  assert_int_equal(make(dir, NULL, KS_CKPT_LOCK_AUTO, &m, &e), KS_E_LOCKED);
  char pid[32];
  snprintf(pid, sizeof pid, "pid %ld on host ", (long)child);
  if (!strstr(e.message, pid)) fail_msg("message does not name the child: %s", e.message);
  kill(child, SIGKILL);
  int status;
  assert_int_equal(waitpid(child, &status, 0), child);
  assert_int_equal(make(dir, NULL, KS_CKPT_LOCK_AUTO, &m, &e), KS_OK);
  ks_ckpt_manager_free(m);
  close(ready[0]), close(ready[1]);
  ks_test_rmtree(dir);
  free(dir);
}

/* Decided by capabilities, not by address: a copied table locks like the original. */
static void a_copied_posix_table_locks(void **s) {
  (void)s;
  char *dir = ks_test_tmpdir("mgr-lock-copy");
  ks_io copy = *ks_io_posix();
  assert_true(ks_io_caps(&copy) & KS_IO_CAP_LOCK);
  ks_ckpt_manager *a = NULL, *b = NULL;
  ks_error e;
  assert_int_equal(make(dir, &copy, KS_CKPT_LOCK_AUTO, &a, &e), KS_OK);
  assert_int_equal(make(dir, NULL, KS_CKPT_LOCK_AUTO, &b, &e), KS_E_LOCKED);
  ks_ckpt_manager_free(a);
  ks_test_rmtree(dir);
  free(dir);
}

/* The lock policy: OFF never locks; REQUIRE refuses a table without locks; AUTO runs unlocked there. */
static void lock_policies(void **s) {
  (void)s;
  char *dir = ks_test_tmpdir("mgr-lock-policy");
  ks_io nolock = *ks_io_posix();
  nolock.caps = 0, nolock.lock_fn = NULL, nolock.unlock_fn = NULL;
  ks_ckpt_manager *a = NULL, *b = NULL, *c = NULL;
  ks_error e;
  assert_int_equal(make(dir, NULL, KS_CKPT_LOCK_AUTO, &a, &e), KS_OK);
  assert_int_equal(make(dir, NULL, KS_CKPT_LOCK_OFF, &b, &e), KS_OK);
  assert_int_equal(make(dir, &nolock, KS_CKPT_LOCK_AUTO, &c, &e), KS_OK);
  ks_ckpt_manager_free(c);
  assert_int_equal(make(dir, &nolock, KS_CKPT_LOCK_REQUIRE, &c, &e), KS_E_UNSUPPORTED);
  assert_int_equal(make(dir, NULL, (ks_ckpt_lock)7, &c, &e), KS_E_INVALID);
  ks_ckpt_manager_free(b);
  ks_ckpt_manager_free(a);
  /* A table claiming locks without lock_fn is refused by ks_io_check. */
  nolock.caps = KS_IO_CAP_LOCK;
  assert_int_equal(ks_io_check(&nolock, &e), KS_E_INVALID);
  ks_test_rmtree(dir);
  free(dir);
}

/* A killed writer's temporary file is removed by the next save through a copied table (it was
   left forever when the table was not ks_io_posix() itself). */
static void a_copied_posix_table_cleans_stale_temporary_files(void **s) {
  (void)s;
  char *dir = ks_test_tmpdir("io-copy-stale");
  char *stale = ks_test_path(dir, ".x.keepsake.tmp-AbC123");
  char *young = ks_test_path(dir, ".x.keepsake.tmp-Young1");
  char *dest = ks_test_path(dir, "x.keepsake");
  assert_int_equal(ks_test_write_file(stale, "partial", 7), 0);
  assert_int_equal(ks_test_write_file(young, "partial", 7), 0);
  struct timeval old[2] = {{time(NULL) - 3600, 0}, {time(NULL) - 3600, 0}};
  assert_int_equal(utimes(stale, old), 0);
  ks_io copy = *ks_io_posix();
  ks_statedict *sd;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  int64_t shape[1] = {1};
  void *data;
  assert_int_equal(ks_statedict_new_tensor(sd, "w", KS_F32, 1, shape, &data, NULL), KS_OK);
  ks_save_opts so = {.io = &copy};
  ks_error e;
  if (ks_save(dest, sd, NULL, &so, &e)) fail_msg("%s", e.message);
  assert_int_not_equal(access(stale, F_OK), 0); /* abandoned an hour ago, nobody holds it: removed */
  assert_int_equal(access(young, F_OK), 0);     /* may belong to a live writer without a lock: kept */
  ks_statedict_free(sd);
  free(stale), free(young), free(dest);
  ks_test_rmtree(dir);
  free(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(a_second_manager_is_refused_and_nothing_is_deleted),
      cmocka_unit_test(a_killed_holder_does_not_block_the_next_run),
      cmocka_unit_test(a_copied_posix_table_locks),
      cmocka_unit_test(lock_policies),
      cmocka_unit_test(a_copied_posix_table_cleans_stale_temporary_files),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
