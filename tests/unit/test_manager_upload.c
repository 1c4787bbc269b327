/*
 * The checkpoint manager's "save locally, then upload" mode and autoresume from
 * the uploaded copies, with a second local directory standing for the remote
 * store (tests/remote runs the same against S3): every committed checkpoint is
 * copied whole before the upload side's `latest` moves; retention there only
 * when asked; a failed upload is the save's error and names no partial object;
 * autoresume from an empty run directory downloads the newest copy that
 * verifies, skipping truncated and corrupt ones; a failed download is an error,
 * never a fresh start; every allocation failure is a clean error.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "keepsake/manager.h"
#include "keepsake/state.h"
#include "testutil.h"

typedef struct prog {
  float w[4];
  int64_t shape[1];
  ks_timestamp ts;
  ks_state *st;
} prog;

static void prog_init(prog *p) {
  memset(p, 0, sizeof *p);
  p->shape[0] = 4;
  ks_tensor t;
  assert_int_equal(ks_state_create("run", 1, NULL, &p->st, NULL), KS_OK);
  assert_int_equal(ks_tensor_init(&t, KS_F32, 1, p->shape, p->w), KS_OK);
  assert_int_equal(ks_state_add_tensor(p->st, "w", &t, NULL), KS_OK);
  ks_timestamp_init(&p->ts);
  ks_state_set_timestamp(p->st, &p->ts);
}

static void prog_step(prog *p, int64_t b) {
  p->ts.batch = b;
  p->ts.epoch = b / 10;
  p->ts.batch_in_epoch = b % 10;
  for (int i = 0; i < 4; i++) p->w[i] = (float)(b * 4 + i);
}

static void prog_free(prog *p) { ks_state_free(p->st); }

static char *ckpt_path(const char *dir, int64_t b) {
  char n[64];
  snprintf(n, sizeof n, "ep%lld-ba%lld.keepsake", (long long)(b / 10), (long long)b);
  return ks_test_path(dir, n);
}

static int has(const char *dir, int64_t b) {
  char *p = ckpt_path(dir, b);
  int e = ks_test_exists(p);
  free(p);
  return e;
}

/* The target of dir/latest, or "" (static buffer). */
static const char *latest_of(const char *dir) {
  static char buf[256];
  char *p = ks_test_path(dir, "latest");
  ssize_t n = readlink(p, buf, sizeof buf - 1);
  free(p);
  buf[n > 0 ? n : 0] = '\0';
  return buf;
}

static int same_bytes(const char *a, const char *b) {
  size_t la = 0, lb = 0;
  uint8_t *x = ks_test_read_file(a, &la), *y = ks_test_read_file(b, &lb);
  int same = x && y && la == lb && memcmp(x, y, la) == 0;
  free(x);
  free(y);
  return same;
}

/*
 * The upload side's table: POSIX (no-op fsyncs) that can be told to refuse the rename that
 * commits an object (`fail_commit`), the `latest` link (`fail_latest`), or every open for
 * reading (`fail_open`, a store that cannot be reached), and that counts commits.
 */
typedef struct side_io {
  ks_io io;
  int fail_commit, fail_latest, fail_open;
  int fail_open_from; /* > 0: the opens for reading from this one on fail (1-based) */
  int commits, opens;
} side_io;

static side_io *side_of(void *ctx) { return ctx; }

static int s_rename(void *ctx, const char *from, const char *to) {
  side_io *s = side_of(ctx);
  const ks_io *p = ks_test_io_nosync();
  size_t n = strlen(to);
  int is_latest = n >= 6 && !strcmp(to + n - 6, "latest");
  if (is_latest ? s->fail_latest : s->fail_commit) return EIO;
  int rc = p->rename_fn(p->ctx, from, to);
  if (!rc && !is_latest) s->commits++;
  return rc;
}

static int s_symlink(void *ctx, const char *target, const char *path) {
  const ks_io *p = ks_test_io_nosync();
  return side_of(ctx)->fail_latest ? EIO : p->symlink_fn(p->ctx, target, path);
}

static int s_open(void *ctx, const char *path, int *fd, uint64_t *size) {
  const ks_io *p = ks_test_io_nosync();
  side_io *s = side_of(ctx);
  s->opens++;
  int fail = s->fail_open || (s->fail_open_from > 0 && s->opens >= s->fail_open_from);
  return fail ? ECONNRESET : p->open_fn(p->ctx, path, fd, size);
}

static void side_init(side_io *s) {
  memset(s, 0, sizeof *s);
  s->io = *ks_test_io_nosync();
  s->io.ctx = s;
  s->io.rename_fn = s_rename;
  s->io.symlink_fn = s_symlink;
  s->io.open_fn = s_open;
}

typedef struct fixture {
  char *local, *remote;
  side_io side;
  prog p;
  FILE *log;
} fixture;

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  f->local = ks_test_tmpdir("up-local");
  f->remote = ks_test_tmpdir("up-remote");
  side_init(&f->side);
  prog_init(&f->p);
  f->log = tmpfile();
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  prog_free(&f->p);
  ks_test_rmtree(f->local);
  ks_test_rmtree(f->remote);
  free(f->local);
  free(f->remote);
  fclose(f->log);
  free(f);
  return 0;
}

static ks_ckpt_opts opts_of(fixture *f, int keep, int upload_retention) {
  return (ks_ckpt_opts){.run_dir = f->local, .save_interval = "10ba", .keep = keep, .io = ks_test_io_nosync(),
                        .log = f->log, .upload_io = &f->side.io, .upload_dir = f->remote,
                        .upload_retention = upload_retention};
}

static ks_ckpt_manager *make(fixture *f, int keep, int upload_retention) {
  ks_ckpt_opts co = opts_of(f, keep, upload_retention);
  ks_ckpt_manager *m = NULL;
  assert_int_equal(ks_ckpt_manager_create(&co, &m, NULL), KS_OK);
  return m;
}

static void save_batches(fixture *f, ks_ckpt_manager *m, int64_t from, int64_t to) {
  for (int64_t b = from; b <= to; b += 10) {
    prog_step(&f->p, b);
    ks_error e;
    ks_error_clear(&e);
    if (ks_ckpt_manager_save(m, f->p.st, NULL, &e)) fail_msg("save of batch %lld: %s", (long long)b, e.message);
  }
}

static void uploads_every_checkpoint_whole_and_never_deletes_by_default(void **state) {
  fixture *f = *state;
  ks_ckpt_manager *m = make(f, 2, 0);
  save_batches(f, m, 10, 50);
  assert_int_equal(f->side.commits, 5);
  for (int64_t b = 10; b <= 50; b += 10) assert_true(has(f->remote, b)); /* keep=2 is local only */
  assert_false(has(f->local, 10) || has(f->local, 20) || has(f->local, 30));
  assert_true(has(f->local, 40) && has(f->local, 50));
  char *l50 = ckpt_path(f->local, 50), *r50 = ckpt_path(f->remote, 50);
  assert_true(same_bytes(l50, r50));
  assert_string_equal(latest_of(f->remote), "ep5-ba50.keepsake");
  assert_string_equal(latest_of(f->local), "ep5-ba50.keepsake");
  assert_int_equal(ks_test_dir_entries(f->remote), 6); /* five checkpoints and latest: no temp file */
  free(l50);
  free(r50);
  ks_ckpt_manager_free(m);
}

static void upload_retention_applies_the_policies_there_when_asked(void **state) {
  fixture *f = *state;
  FILE *rlog = tmpfile();
  ks_ckpt_opts co = opts_of(f, 2, 1);
  co.retention_log = rlog;
  ks_ckpt_manager *m = NULL;
  assert_int_equal(ks_ckpt_manager_create(&co, &m, NULL), KS_OK);
  save_batches(f, m, 10, 40);
  assert_false(has(f->remote, 10) || has(f->remote, 20));
  assert_true(has(f->remote, 30) && has(f->remote, 40));
  assert_string_equal(latest_of(f->remote), "ep4-ba40.keepsake");
  char buf[8192] = {0};
  rewind(rlog);
  size_t n = fread(buf, 1, sizeof buf - 1, rlog);
  buf[n] = '\0';
  assert_non_null(strstr(buf, "keepsake: deleted uploaded ep2-ba20.keepsake"));
  assert_non_null(strstr(buf, "keepsake: kept uploaded ep4-ba40.keepsake"));
  fclose(rlog);
  ks_ckpt_manager_free(m);
}

static void a_failed_upload_is_the_error_and_names_no_partial_object(void **state) {
  fixture *f = *state;
  ks_ckpt_manager *m = make(f, 0, 0);
  save_batches(f, m, 10, 10);
  /* The object's commit fails: the save says so, the local checkpoint is in place, and the
   * upload side has neither the object nor a temp file, and its latest is unchanged. */
  f->side.fail_commit = 1;
  prog_step(&f->p, 20);
  ks_error e;
  ks_error_clear(&e);
  assert_int_equal(ks_ckpt_manager_save(m, f->p.st, NULL, &e), KS_E_IO);
  assert_non_null(strstr(e.message, "upload of"));
  assert_non_null(strstr(e.message, "copying the checkpoint"));
  assert_true(has(f->local, 20));
  assert_string_equal(latest_of(f->local), "ep2-ba20.keepsake");
  assert_false(has(f->remote, 20));
  assert_string_equal(latest_of(f->remote), "ep1-ba10.keepsake");
  assert_int_equal(ks_test_dir_entries(f->remote), 2);
  /* The object lands but `latest` cannot move: it still names the previous, complete one. */
  f->side.fail_commit = 0;
  f->side.fail_latest = 1;
  prog_step(&f->p, 30);
  ks_error_clear(&e);
  assert_int_equal(ks_ckpt_manager_save(m, f->p.st, NULL, &e), KS_E_IO);
  assert_non_null(strstr(e.message, "pointing latest at it"));
  assert_true(has(f->remote, 30));
  assert_string_equal(latest_of(f->remote), "ep1-ba10.keepsake");
  /* Fixed: the next save uploads its checkpoint and moves latest. */
  f->side.fail_latest = 0;
  save_batches(f, m, 40, 40);
  assert_string_equal(latest_of(f->remote), "ep4-ba40.keepsake");
  ks_ckpt_manager_free(m);
}

static void async_saves_upload_on_the_background_thread(void **state) {
  fixture *f = *state;
  ks_ckpt_manager *m = make(f, 1, 0);
  prog_step(&f->p, 10);
  assert_int_equal(ks_ckpt_manager_save_async(m, f->p.st, NULL, NULL), KS_OK);
  assert_int_equal(ks_ckpt_manager_wait(m, NULL), KS_OK);
  assert_true(has(f->remote, 10));
  f->side.fail_commit = 1;
  prog_step(&f->p, 20);
  assert_int_equal(ks_ckpt_manager_save_async(m, f->p.st, NULL, NULL), KS_OK);
  ks_error e;
  ks_error_clear(&e);
  assert_int_equal(ks_ckpt_manager_wait(m, &e), KS_E_IO); /* the upload's error surfaces, once */
  assert_non_null(strstr(e.message, "upload of"));
  assert_int_equal(ks_ckpt_manager_wait(m, NULL), KS_OK);
  assert_true(has(f->local, 20));
  assert_false(has(f->remote, 20));
  ks_ckpt_manager_free(m);
}

static void resume_into(fixture *f, int64_t expect_batch, size_t expect_skipped) {
  ks_ckpt_manager *m = make(f, 0, 0);
  prog q;
  prog_init(&q);
  int resumed = 0;
  const char *path = NULL;
  ks_error e;
  ks_error_clear(&e);
  if (ks_ckpt_manager_autoresume(m, q.st, NULL, NULL, &resumed, &path, &e)) fail_msg("autoresume: %s", e.message);
  assert_int_equal(resumed, 1);
  assert_int_equal(q.ts.batch, expect_batch);
  assert_true(q.w[3] == (float)(expect_batch * 4 + 3));
  assert_int_equal(ks_ckpt_manager_skipped(m), expect_skipped);
  char *want = ckpt_path(f->local, expect_batch);
  assert_string_equal(path, want);
  assert_true(ks_test_exists(want)); /* downloaded into the run directory */
  free(want);
  prog_free(&q);
  ks_ckpt_manager_free(m);
}

static void autoresume_downloads_the_newest_upload_into_an_empty_run_dir(void **state) {
  fixture *f = *state;
  ks_ckpt_manager *m = make(f, 1, 0);
  save_batches(f, m, 10, 30);
  ks_ckpt_manager_free(m);
  ks_test_rmtree(f->local); /* the machine is gone */
  resume_into(f, 30, 0);
  assert_false(has(f->local, 10) || has(f->local, 20)); /* only what it needed */
  assert_string_equal(latest_of(f->local), "ep3-ba30.keepsake");
}

static void autoresume_skips_truncated_and_corrupt_uploads(void **state) {
  fixture *f = *state;
  ks_ckpt_manager *m = make(f, 0, 0);
  save_batches(f, m, 10, 40);
  ks_ckpt_manager_free(m);
  /* Newest truncated to half, the one before with a flipped data byte. */
  char *p40 = ckpt_path(f->remote, 40), *p30 = ckpt_path(f->remote, 30);
  size_t len;
  uint8_t *b = ks_test_read_file(p40, &len);
  assert_int_equal(ks_test_write_file(p40, b, len / 2), 0);
  free(b);
  b = ks_test_read_file(p30, &len);
  b[len - 1] ^= 0x5a;
  assert_int_equal(ks_test_write_file(p30, b, len), 0);
  free(b);
  ks_test_rmtree(f->local);
  resume_into(f, 20, 2);
  assert_true(ks_test_exists(p40) && ks_test_exists(p30)); /* the uploaded copies are never deleted */
  char *l30 = ckpt_path(f->local, 30);
  char corrupt[4200];
  snprintf(corrupt, sizeof corrupt, "%s.corrupt", l30);
  assert_true(ks_test_exists(corrupt)); /* the downloaded bad copy is set aside, not under its name */
  assert_false(ks_test_exists(l30));
  free(l30);
  free(p40);
  free(p30);
}

static void a_failed_download_is_an_error_never_a_fresh_start(void **state) {
  fixture *f = *state;
  ks_ckpt_manager *m = make(f, 0, 0);
  save_batches(f, m, 10, 20);
  ks_ckpt_manager_free(m);
  ks_test_rmtree(f->local);
  f->side.fail_open = 1;
  m = make(f, 0, 0);
  prog q;
  prog_init(&q);
  int resumed = 0;
  ks_error e;
  ks_error_clear(&e);
  assert_int_equal(ks_ckpt_manager_autoresume(m, q.st, NULL, NULL, &resumed, NULL, &e), KS_E_IO);
  assert_int_equal(resumed, 0);
  assert_non_null(strstr(e.message, "cannot read checkpoint")); /* its header, while ordering them */
  ks_ckpt_manager_free(m);
  /* The headers read, the download of the newest fails: an error too, not the older one. */
  f->side.fail_open = 0;
  f->side.opens = 0;
  f->side.fail_open_from = 3; /* two probes, then the download */
  m = make(f, 0, 0);
  ks_error_clear(&e);
  assert_int_equal(ks_ckpt_manager_autoresume(m, q.st, NULL, NULL, &resumed, NULL, &e), KS_E_IO);
  assert_int_equal(resumed, 0);
  assert_non_null(strstr(e.message, "cannot download ep2-ba20.keepsake"));
  assert_false(has(f->local, 20) || has(f->local, 10));
  prog_free(&q);
  ks_ckpt_manager_free(m);
}

static void a_local_checkpoint_wins_over_the_uploads(void **state) {
  fixture *f = *state;
  ks_ckpt_manager *m = make(f, 0, 0);
  save_batches(f, m, 10, 20);
  f->side.fail_commit = 1; /* batch 30 is saved locally only */
  prog_step(&f->p, 30);
  assert_int_equal(ks_ckpt_manager_save(m, f->p.st, NULL, NULL), KS_E_IO);
  ks_ckpt_manager_free(m);
  f->side.fail_commit = 0;
  f->side.fail_open = 1; /* and the upload side is not even asked */
  resume_into(f, 30, 0);
}

static void bad_upload_options_are_refused(void **state) {
  fixture *f = *state;
  ks_ckpt_opts co = opts_of(f, 0, 0);
  co.upload_dir = NULL;
  ks_ckpt_manager *m = NULL;
  ks_error e;
  ks_error_clear(&e);
  assert_int_equal(ks_ckpt_manager_create(&co, &m, &e), KS_E_INVALID);
  assert_non_null(strstr(e.message, "upload_dir"));
  assert_null(m);
  ks_io bad = f->side.io;
  bad.version = 0;
  co = opts_of(f, 0, 0);
  co.upload_io = &bad;
  assert_int_equal(ks_ckpt_manager_create(&co, &m, NULL), KS_E_INVALID);
}

/* Every allocation of a save with upload, then of an autoresume that downloads, fails in turn. */
static void every_allocation_failure_is_a_clean_error(void **state) {
  fixture *f = *state;
  int saved_ok = 0;
  for (long n = 1; n < 5000 && !saved_ok; n++) {
    ks_test_alloc ta;
    ks_test_alloc_init(&ta, n);
    ks_ckpt_opts co = opts_of(f, 0, 1);
    co.alloc = &ta.a;
    ks_ckpt_manager *m = NULL;
    ks_status s = ks_ckpt_manager_create(&co, &m, NULL);
    if (!s) {
      prog_step(&f->p, 10);
      s = ks_ckpt_manager_save(m, f->p.st, NULL, NULL);
      saved_ok = !s;
    }
    assert_true(s == KS_OK || s == KS_E_NOMEM);
    if (has(f->remote, 10)) { /* whatever is under the name upstream is the whole checkpoint */
      char *l = ckpt_path(f->local, 10), *r = ckpt_path(f->remote, 10);
      assert_true(same_bytes(l, r));
      free(l);
      free(r);
    }
    assert_true(ks_test_dir_entries(f->remote) <= 2); /* the checkpoint and latest, never a temp file */
    ks_ckpt_manager_free(m);
    assert_int_equal(ta.live, 0);
  }
  assert_true(saved_ok);
  assert_true(has(f->remote, 10));
  int resumed_ok = 0;
  for (long n = 1; n < 5000 && !resumed_ok; n++) {
    ks_test_rmtree(f->local);
    ks_test_alloc ta;
    ks_test_alloc_init(&ta, n);
    ks_ckpt_opts co = opts_of(f, 0, 0);
    co.alloc = &ta.a;
    ks_ckpt_manager *m = NULL;
    prog q;
    prog_init(&q);
    int resumed = 0;
    ks_status s = ks_ckpt_manager_create(&co, &m, NULL);
    if (!s) s = ks_ckpt_manager_autoresume(m, q.st, NULL, NULL, &resumed, NULL, NULL);
    assert_true(s == KS_OK || s == KS_E_NOMEM);
    if (!s) {
      /* an allocation failure while loading may skip nothing and start nothing: it resumes or errs */
      assert_int_equal(resumed, 1);
      assert_int_equal(q.ts.batch, 10);
      resumed_ok = 1;
    }
    prog_free(&q);
    ks_ckpt_manager_free(m);
    assert_int_equal(ta.live, 0);
  }
  assert_true(resumed_ok);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(uploads_every_checkpoint_whole_and_never_deletes_by_default, setup, teardown),
      cmocka_unit_test_setup_teardown(upload_retention_applies_the_policies_there_when_asked, setup, teardown),
      cmocka_unit_test_setup_teardown(a_failed_upload_is_the_error_and_names_no_partial_object, setup, teardown),
      cmocka_unit_test_setup_teardown(async_saves_upload_on_the_background_thread, setup, teardown),
      cmocka_unit_test_setup_teardown(autoresume_downloads_the_newest_upload_into_an_empty_run_dir, setup, teardown),
      cmocka_unit_test_setup_teardown(autoresume_skips_truncated_and_corrupt_uploads, setup, teardown),
      cmocka_unit_test_setup_teardown(a_failed_download_is_an_error_never_a_fresh_start, setup, teardown),
      cmocka_unit_test_setup_teardown(a_local_checkpoint_wins_over_the_uploads, setup, teardown),
      cmocka_unit_test_setup_teardown(bad_upload_options_are_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(every_allocation_failure_is_a_clean_error, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
