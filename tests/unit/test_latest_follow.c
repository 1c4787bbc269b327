/*
 * A reader of a run's newest checkpoint through `latest`, beside a manager whose retention
 * deletes what `latest` named a moment ago. A store that follows links in two steps (read the
 * pointer, then open its target, as S3 pointer objects are followed) opens a deleted file when
 * a save and its retention fall between the steps; the library's readers then follow `latest`
 * to the checkpoint that replaced it, and still fail on a `latest` that names nothing.
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

#include "keepsake/keepsake.h"
#include "testutil.h"

/* The writer beside the reader: a manager keeping only the newest checkpoint. */
typedef struct writer {
  ks_ckpt_manager *m;
  int64_t batch;
  float w[4];
} writer;

static void writer_save(writer *wr) {
  ks_statedict *sd;
  int64_t shape[1] = {4};
  ks_tensor t;
  wr->batch++;
  for (int i = 0; i < 4; i++) wr->w[i] = (float)wr->batch;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  assert_int_equal(ks_tensor_init(&t, KS_F32, 1, shape, wr->w), KS_OK);
  assert_int_equal(ks_statedict_set_tensor(sd, "state/model/w", &t, KS_BORROW, NULL), KS_OK);
  /* what retention orders checkpoints by */
  assert_int_equal(ks_statedict_set_int(sd, "state/timestamp/Timestamp/batch", wr->batch, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_int(sd, "state/timestamp/Timestamp/epoch", 0, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_int(sd, "state/timestamp/Timestamp/sample", wr->batch, NULL), KS_OK);
  ks_timestamp ts;
  ks_timestamp_init(&ts);
  ts.batch = wr->batch;
  assert_int_equal(ks_ckpt_manager_save_image(wr->m, NULL, sd, NULL, &ts, 0, NULL, NULL), KS_OK);
  ks_statedict_free(sd);
}

/* A table whose open follows a final link in two steps, with the writer's saves in between. */
typedef struct two_step {
  ks_io io;
  writer *wr;
  int saves_between; /* saves the writer makes between the steps of the next opens */
  int opens;
} two_step;

static int two_step_open(void *ctx, const char *path, int *fd, uint64_t *size) {
  two_step *t = ctx;
  const ks_io *px = ks_io_posix();
  char target[1024], resolved[4096];
  size_t len = 0;
  t->opens++;
  if (px->readlink_fn(px->ctx, path, target, sizeof target - 1, &len))
    return px->open_fn(px->ctx, path, fd, size); /* not a link */
  target[len] = '\0';
  const char *slash = strrchr(path, '/');
  snprintf(resolved, sizeof resolved, "%.*s/%s", slash ? (int)(slash - path) : 1, slash ? path : ".", target);
  for (; t->saves_between > 0; t->saves_between--) writer_save(t->wr); /* the race, made certain */
  return px->open_fn(px->ctx, resolved, fd, size);
}

static void two_step_init(two_step *t, writer *wr) {
  memset(t, 0, sizeof *t);
  t->io = *ks_io_posix();
  t->io.ctx = t;
  t->io.open_fn = two_step_open;
  t->wr = wr;
}

static float first_weight(ks_reader *r) {
  ks_tensor v;
  assert_int_equal(ks_reader_tensor(r, "state/model/w", &v, NULL), KS_OK);
  return ((const float *)v.data)[0];
}

static void a_reader_follows_latest_past_retention(void **state) {
  (void)state;
  char *dir = ks_test_tmpdir("latest-follow");
  writer wr = {0};
  ks_ckpt_opts co = {.run_dir = dir, .save_interval = "1ba", .keep = 1, .io = ks_test_io_nosync()};
  assert_int_equal(ks_ckpt_manager_create(&co, &wr.m, NULL), KS_OK);
  writer_save(&wr);
  writer_save(&wr);
  char first[64];
  snprintf(first, sizeof first, "ep0-ba1.keepsake");
  char *gone = ks_test_path(dir, first);
  assert_false(ks_test_exists(gone)); /* keep = 1: retention runs */
  free(gone);
  char *latest = ks_test_path(dir, "latest");
  two_step t;
  two_step_init(&t, &wr);
  const ks_read_mode modes[] = {KS_READ_MMAP, KS_READ_COPY, KS_READ_LAZY};
  for (size_t i = 0; i < sizeof modes / sizeof *modes; i++) {
    for (int between = 1; between <= 3; between++) {
      t.saves_between = between; /* the file `latest` named is deleted before it is opened */
      ks_read_opts o = {.size = sizeof o, .mode = modes[i], .io = &t.io, .verify_checksums = 1};
      ks_reader *r = NULL;
      ks_error e;
      ks_status s = ks_reader_open(latest, &o, &r, &e);
      if (s) fail_msg("mode %d, %d saves between: %s", (int)modes[i], between, e.message);
      float got = first_weight(r);
      if (got != (float)wr.batch)
        fail_msg("read batch %g's checkpoint, the newest is %lld", (double)got, (long long)wr.batch);
      ks_reader_free(r);
    }
  }
  /* ks_load (format) goes the same way. */
  t.saves_between = 1;
  ks_statedict *sd = NULL;
  ks_read_opts o = {.size = sizeof o, .io = &t.io};
  assert_int_equal(ks_load(latest, &o, &sd, NULL, NULL), KS_OK);
  ks_statedict_free(sd);
  /* A `latest` that names nothing fails, after a bounded number of tries. */
  ks_ckpt_manager_free(wr.m);
  char name[64];
  snprintf(name, sizeof name, "ep0-ba%lld.keepsake", (long long)wr.batch);
  char *ck = ks_test_path(dir, name);
  assert_int_equal(unlink(ck), 0);
  t.opens = 0;
  ks_reader *r = NULL;
  ks_error e;
  assert_int_equal(ks_reader_open(latest, &o, &r, &e), KS_E_IO);
  assert_non_null(strstr(e.message, "No such file"));
  assert_true(t.opens == 2); /* one more try, then the same dangling target is the answer */
  char *missing = ks_test_path(dir, "nothing.keepsake");
  t.opens = 0;
  assert_int_equal(ks_reader_open(missing, &o, &r, &e), KS_E_IO); /* no `latest` in it: no retry */
  assert_true(t.opens == 1);
  free(missing);
  free(ck);
  free(latest);
  ks_test_rmtree(dir);
  free(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(a_reader_follows_latest_past_retention),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
