/*
 * Crash simulation of the checkpoint manager (tests/common/crashio.h): six
 * saves with keep-2 and keep-best-1 retention, synchronous and in the
 * background, crashed before every step of every save, of every `latest`
 * update and of every retention pass (and of creating the run directory).
 * After each crash six images are rebuilt: only what was made durable, the
 * names of the running process with only durable data, everything, and three
 * drawn in between (a prefix of each directory's unsynced changes, torn
 * unsynced file tails). In
 * each: every checkpoint left verifies, every committed checkpoint that
 * retention had not started deleting is there, `latest` names a checkpoint
 * that is there, and autoresume skips nothing, removes every temporary file
 * and loads the newest committed checkpoint (or a newer complete one).
 * The same steps are also made to fail with EIO or ENOSPC: the error reaches
 * the caller, nothing committed is lost, and the next save succeeds.
 *
 * "Committed" comes from the steps of an uncrashed run: a checkpoint is
 * committed once the fsync of the run directory that follows its rename is
 * done, the point where the durable commit returns.
 */
#include <errno.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "crashio.h"
#include "keepsake/manager.h"
#include "keepsake/state.h"
#include "testprog.h"
#include "testutil.h"

#define NSAVES 6
static const double k_vals[NSAVES] = {0.5, 0.9, 0.3, 0.4, 0.2, 0.1};

typedef ks_test_prog prog;

static void prog_init(prog *p) { assert_int_equal(ks_test_prog_init(p), KS_OK); }

static void prog_step(prog *p, int64_t b, double v) {
  p->ts.batch = b;
  p->ts.epoch = b / 10;
  p->ts.total_wct = (double)b;
  for (int i = 0; i < 4; i++) p->w[i] = (float)(b * 4 + i);
  assert_int_equal(ks_test_prog_set_metric(p, v), KS_OK);
}

static FILE *g_null;

static ks_ckpt_manager *open_mgr(const char *run_dir, const ks_io *io, ks_status *s) {
  ks_ckpt_opts co = {.run_dir = run_dir, .save_interval = "10ba", .keep = 2, .keep_best = 1,
                     .best_metric = "eval/MeanMetric", .best_mode = KS_BEST_MAX, .io = io, .log = g_null};
  ks_ckpt_manager *m = NULL;
  *s = ks_ckpt_manager_create(&co, &m, NULL);
  return m;
}

typedef struct run_result {
  ks_status first_error;
  int acked;              /* saves acknowledged (returned KS_OK) */
  long ack_step[NSAVES];  /* sync saves: steps done when save i returned KS_OK */
} run_result;

static int skip_fsync(void *ctx, int fd) {
  (void)ctx;
  (void)fd;
  return 0;
}

static int skip_fsync_dir(void *ctx, const char *dir) {
  (void)ctx;
  (void)dir;
  return 0;
}

/* The six saves through io (its fsyncs skipped when no_fsync); stops at the first error, as a
 * run that stops on save errors does. */
static void run_saves(const char *run_dir, const ks_io *io, int async, int no_fsync, run_result *r) {
  const ks_crash_io *c = io ? io->ctx : NULL;
  ks_io nosync;
  if (io && no_fsync) {
    nosync = *io;
    nosync.fsync_fn = skip_fsync;
    nosync.fsync_dir_fn = skip_fsync_dir;
    io = &nosync;
  }
  *r = (run_result){0};
  prog p;
  prog_init(&p);
  ks_status s;
  ks_ckpt_manager *m = open_mgr(run_dir, io, &s);
  for (int i = 0; !s && i < NSAVES; i++) {
    prog_step(&p, (i + 1) * 10, k_vals[i]);
    s = async ? ks_ckpt_manager_save_async(m, p.st, NULL, NULL) : ks_ckpt_manager_save(m, p.st, NULL, NULL);
    if (!s && !async) r->acked = i + 1, r->ack_step[i] = c ? c->steps : 0;
    if (!s && async) r->acked = i; /* starting save i means save i-1 finished */
  }
  if (!s && m) s = ks_ckpt_manager_wait(m, NULL);
  if (!s) r->acked = NSAVES;
  r->first_error = s;
  ks_ckpt_manager_free(m);
  ks_state_free(p.st);
}

/* When each checkpoint was committed and when its deletion began, in steps of the reference run. */
typedef struct oracle {
  long commit[NSAVES], del[NSAVES];
  long steps;
} oracle;

static void ckpt_name(int i, char *buf, size_t cap) {
  int64_t b = (i + 1) * 10;
  snprintf(buf, cap, "ep%lld-ba%lld.keepsake", (long long)(b / 10), (long long)b);
}

static void build_oracle(const ks_crash_io *c, oracle *o) {
  o->steps = c->steps;
  for (int i = 0; i < NSAVES; i++) {
    char name[64], rel[80];
    ckpt_name(i, name, sizeof name);
    snprintf(rel, sizeof rel, "run/%s", name);
    o->commit[i] = o->del[i] = LONG_MAX;
    int renamed = 0;
    for (size_t k = 0; k < c->n_log; k++) {
      const ks_crash_step *st = &c->log[k];
      if (st->op == KS_CRASH_OP_RENAME && !strcmp(st->path2, rel)) renamed = 1;
      if (renamed && o->commit[i] == LONG_MAX && st->op == KS_CRASH_OP_FSYNC_DIR && !strcmp(st->path, "run"))
        o->commit[i] = (long)k + 1;
      if (st->op == KS_CRASH_OP_UNLINK && !strcmp(st->path, rel) && o->del[i] == LONG_MAX) o->del[i] = (long)k + 1;
    }
    assert_true(o->commit[i] != LONG_MAX); /* every save of the reference run commits */
  }
}

/* Index of a checkpoint name, or -1 for any other name. */
static int ckpt_index(const char *name) {
  for (int i = 0; i < NSAVES; i++) {
    char n[64];
    ckpt_name(i, n, sizeof n);
    if (!strcmp(n, name)) return i;
  }
  return -1;
}

typedef struct tally {
  long images, lost, unreadable, resumed_older, temp_files;
} tally;

static int verifies(const char *path) {
  ks_read_opts ro = {.verify_checksums = 1};
  ks_statedict *sd = NULL;
  ks_meta *meta = NULL;
  ks_status s = ks_load(path, &ro, &sd, &meta, NULL);
  ks_statedict_free(sd);
  ks_meta_free(meta);
  return s == KS_OK;
}

/*
 * Checks one image of the run directory after a crash (or a failure) before step k.
 * `strict_names`: no unexpected names may be present.
 */
static void check_image(const char *run, const oracle *o, long k, tally *t) {
  t->images++;
  int present[NSAVES] = {0}, newest_committed = -1, newest_present = -1;
  for (int i = 0; i < NSAVES; i++)
    if (o->commit[i] < k) newest_committed = i;
  DIR *d = opendir(run);
  if (!d) {
    if (newest_committed >= 0) t->lost++;
    return;
  }
  char latest[256] = "";
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
    char *path = ks_test_path(run, de->d_name);
    int i = ckpt_index(de->d_name);
    if (i >= 0) {
      present[i] = verifies(path);
      if (!present[i]) {
        t->unreadable++;
        fprintf(stderr, "crash before step %ld: %s does not verify\n", k, path);
      } else if (i > newest_present) newest_present = i;
    } else if (!strcmp(de->d_name, "latest")) {
      ssize_t n = readlink(path, latest, sizeof latest - 1);
      assert_true(n > 0);
      latest[n] = '\0';
    } else if (de->d_name[0] == '.' && strstr(de->d_name, ".tmp")) {
      t->temp_files++;
    } else {
      fail_msg("crash before step %ld: unexpected file %s", k, path);
    }
    free(path);
  }
  closedir(d);
  for (int i = 0; i < NSAVES; i++)
    if (o->commit[i] < k && o->del[i] >= k && !present[i]) {
      t->lost++;
      fprintf(stderr, "crash before step %ld: committed checkpoint %d lost in %s\n", k, i, run);
    }
  if (latest[0]) {
    int li = ckpt_index(latest);
    assert_true(li >= 0);
    if (!present[li]) fail_msg("crash before step %ld: latest names %s, which is not there", k, latest);
  }
  /* Autoresume, as the restarted program does it (POSIX, the real directory). */
  prog q;
  prog_init(&q);
  ks_status s;
  ks_ckpt_manager *m = open_mgr(run, ks_test_io_nosync(), &s);
  assert_int_equal(s, KS_OK);
  int resumed = 0;
  assert_int_equal(ks_ckpt_manager_autoresume(m, q.st, NULL, NULL, &resumed, NULL, NULL), KS_OK);
  assert_int_equal(ks_ckpt_manager_skipped(m), 0);
  assert_int_equal(resumed, newest_present >= 0);
  if (resumed) {
    assert_int_equal(q.ts.batch, (newest_present + 1) * 10); /* the newest that is there ... */
    assert_true(q.w[3] == (float)((newest_present + 1) * 40 + 3));
  }
  if (newest_present < newest_committed) t->resumed_older++; /* ... and never older than the newest committed */
  ks_ckpt_manager_free(m);
  ks_state_free(q.st);
  d = opendir(run);
  assert_non_null(d);
  while ((de = readdir(d)) != NULL)
    if (strstr(de->d_name, ".tmp")) fail_msg("crash before step %ld: %s/%s left after autoresume", k, run, de->d_name);
  closedir(d);
}

#define PREFIX_DRAWS 3

/* Rebuilds each image of c into root/<image> (and PREFIX_DRAWS in-between images) and checks it. */
static void check_images(ks_crash_io *c, const char *root, const oracle *o, long k, int n_images, tally *t) {
  for (int im = 0; im < n_images; im++) {
    char name[32];
    snprintf(name, sizeof name, "image%d", im);
    char *out = ks_test_path(root, name);
    assert_int_equal(mkdir(out, 0777), 0);
    c->seed = (uint64_t)(k * 16 + im);
    assert_int_equal(ks_crash_io_materialise(c, im < 3 ? (ks_crash_image)im : KS_CRASH_PREFIX, out), 0);
    char *run = ks_test_path(out, "run");
    check_image(run, o, k, t);
    free(run);
    free(out);
  }
}

/* The uncrashed run, recorded; also checks that the model's volatile image is the real directory. */
static void reference(int async, oracle *o) {
  char *root = ks_test_tmpdir("crash-ref");
  char *live = ks_test_path(root, "live");
  assert_int_equal(mkdir(live, 0777), 0);
  ks_crash_io c;
  ks_crash_io_init(&c, live, 1);
  char *run = ks_test_path(live, "run");
  run_result r;
  run_saves(run, &c.io, async, 0, &r);
  assert_int_equal(r.first_error, KS_OK);
  assert_int_equal(c.model_error, 0);
  build_oracle(&c, o);
  /* The commit point the oracle uses is never later than the library's acknowledgement. */
  for (int i = 0; !async && i < NSAVES; i++) assert_true(o->commit[i] <= r.ack_step[i]);
  char *vol = ks_test_path(root, "vol");
  assert_int_equal(mkdir(vol, 0777), 0);
  assert_int_equal(ks_crash_io_materialise(&c, KS_CRASH_VOLATILE, vol), 0);
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "diff -r --no-dereference '%s' '%s/run'", run, vol);
  assert_int_equal(ks_test_run(cmd, NULL), 0);
  ks_crash_io_free(&c);
  ks_test_rmtree(root);
  free(root);
  free(live);
  free(run);
  free(vol);
}

static void crash_every_step(int async) {
  oracle o;
  reference(async, &o);
  tally t = {0};
  long crash_points = 0;
  for (long k = 1; k <= o.steps; k++) {
    char *root = ks_test_tmpdir("crash");
    char *live = ks_test_path(root, "live");
    assert_int_equal(mkdir(live, 0777), 0);
    ks_crash_io c;
    ks_crash_io_init(&c, live, 0);
    c.crash_at = k;
    char *run = ks_test_path(live, "run");
    run_result r;
    run_saves(run, &c.io, async, 0, &r);
    assert_true(c.crashed);
    assert_int_not_equal(r.first_error, KS_OK); /* the crash is seen by the caller */
    assert_int_equal(c.model_error, 0);
    check_images(&c, root, &o, k, 3 + PREFIX_DRAWS, &t);
    crash_points++;
    ks_crash_io_free(&c);
    ks_test_rmtree(root);
    free(root);
    free(live);
    free(run);
  }
  printf("crash simulation (%s saves): %ld crash points, %ld images checked, %ld lost committed, %ld unreadable, "
         "%ld resumed older than committed, %ld temp files removed by autoresume\n",
         async ? "async" : "sync", crash_points, t.images, t.lost, t.unreadable, t.resumed_older, t.temp_files);
  assert_true(crash_points > NSAVES * 10);
  assert_int_equal(t.lost, 0);
  assert_int_equal(t.unreadable, 0);
  assert_int_equal(t.resumed_older, 0);
}

static void crash_at_every_step_of_sync_saves(void **state) {
  (void)state;
  crash_every_step(0);
}

static void crash_at_every_step_of_async_saves(void **state) {
  (void)state;
  crash_every_step(1);
}

/* Fails step k with EIO or ENOSPC; the error must surface, nothing committed be lost, and a retry succeed. */
static void fail_every_step(int async) {
  oracle o;
  reference(async, &o);
  tally t = {0};
  int seen[KS_CRASH_OP_COUNT] = {0};
  for (long k = 1; k <= o.steps; k++) {
    char *root = ks_test_tmpdir("fail");
    char *live = ks_test_path(root, "live");
    assert_int_equal(mkdir(live, 0777), 0);
    ks_crash_io c;
    ks_crash_io_init(&c, live, 0);
    c.fail_at = k;
    c.fail_errno = k % 2 ? EIO : ENOSPC;
    char *run = ks_test_path(live, "run");
    run_result r;
    run_saves(run, &c.io, async, 0, &r);
    assert_true(c.failed_op >= 0);
    seen[c.failed_op]++;
    if (r.first_error == KS_OK)
      fail_msg("step %ld (op %d) failed with errno %d, but no call reported it", k, c.failed_op, c.fail_errno);
    assert_int_equal(c.model_error, 0);
    check_images(&c, root, &o, k, 1, &t); /* what a crash right after the failure would leave (durable image) */
    /* The process goes on: the live directory, then one more save, which must succeed. */
    check_image(run, &o, k, &t);
    prog p;
    prog_init(&p);
    ks_status s;
    ks_ckpt_manager *m = open_mgr(run, &c.io, &s);
    assert_int_equal(s, KS_OK);
    prog_step(&p, 70, 0.05);
    assert_int_equal(ks_ckpt_manager_save(m, p.st, NULL, NULL), KS_OK);
    char *saved = ks_test_path(run, "ep7-ba70.keepsake");
    assert_true(verifies(saved));
    free(saved);
    /* ... and durably so, even when the failed step had left the run directory's own entry unsynced. */
    char *after = ks_test_path(root, "after");
    assert_int_equal(mkdir(after, 0777), 0);
    assert_int_equal(ks_crash_io_materialise(&c, KS_CRASH_DURABLE, after), 0);
    char *durable = ks_test_path(after, "run/ep7-ba70.keepsake");
    if (!verifies(durable)) fail_msg("step %ld failed: the retried save is not durable", k);
    free(durable);
    free(after);
    ks_ckpt_manager_free(m);
    ks_state_free(p.st);
    ks_crash_io_free(&c);
    ks_test_rmtree(root);
    free(root);
    free(live);
    free(run);
  }
  printf("fault injection (%s saves): %ld steps failed (create %d, write %d, fsync %d, close %d, rename %d, "
         "unlink %d, fsync_dir %d, mkdir %d, symlink %d), %ld images checked, %ld lost committed, %ld unreadable\n",
         async ? "async" : "sync", o.steps, seen[0], seen[1], seen[2], seen[3], seen[4], seen[5], seen[6], seen[7],
         seen[8], t.images, t.lost, t.unreadable);
  for (int op = 0; op < KS_CRASH_OP_COUNT; op++) assert_true(seen[op] > 0); /* every kind of step failed */
  assert_int_equal(t.lost, 0);
  assert_int_equal(t.unreadable, 0);
  assert_int_equal(t.resumed_older, 0);
}

static void fail_at_every_step_of_sync_saves(void **state) {
  (void)state;
  fail_every_step(0);
}

static void fail_at_every_step_of_async_saves(void **state) {
  (void)state;
  fail_every_step(1);
}

/* The model itself: without fsync, acknowledged saves are lost from the durable image (the test can fail). */
static void model_drops_what_was_not_synced(void **state) {
  (void)state;
  char *root = ks_test_tmpdir("crash-nosync");
  char *live = ks_test_path(root, "live");
  assert_int_equal(mkdir(live, 0777), 0);
  ks_crash_io c;
  ks_crash_io_init(&c, live, 0);
  char *run = ks_test_path(live, "run");
  run_result r;
  run_saves(run, &c.io, 0, 1, &r);
  assert_int_equal(r.first_error, KS_OK);
  assert_int_equal(r.acked, NSAVES);
  char *dur = ks_test_path(root, "durable"), *names = ks_test_path(root, "names");
  assert_int_equal(mkdir(dur, 0777), 0);
  assert_int_equal(mkdir(names, 0777), 0);
  assert_int_equal(ks_crash_io_materialise(&c, KS_CRASH_DURABLE, dur), 0);
  assert_int_equal(ks_crash_io_materialise(&c, KS_CRASH_NAMES, names), 0);
  assert_int_equal(ks_test_dir_entries(dur), 0); /* not even the run directory's entry was made durable */
  char *nrun = ks_test_path(names, "run"), *newest = ks_test_path(nrun, "ep6-ba60.keepsake");
  assert_true(ks_test_exists(newest));
  assert_false(verifies(newest)); /* the name survived, its unsynced data did not */
  ks_crash_io_free(&c);
  ks_test_rmtree(root);
  free(root);
  free(live);
  free(run);
  free(dur);
  free(names);
  free(nrun);
  free(newest);
}

static int load_batch(const char *path, int64_t *batch) {
  prog q;
  prog_init(&q);
  ks_status s = ks_state_load(q.st, path, NULL, NULL, NULL);
  *batch = q.ts.batch;
  ks_state_free(q.st);
  return s == KS_OK;
}

/*
 * ks_state_save on its own (no manager to fsync after it): replacing a file,
 * crashed before every step. Until the first save returns the file may be
 * missing; after it, the durable image holds a verifying old or new version;
 * once the second returns, the new one.
 */
static void durable_replace_survives_a_crash_at_every_step(void **state) {
  (void)state;
  long ack[2] = {0, 0}, total = 0, points = 0;
  for (long k = 0;; k++) {
    char *root = ks_test_tmpdir("crash-replace");
    char *live = ks_test_path(root, "live"), *file = ks_test_path(live, "ckpt.keepsake");
    assert_int_equal(mkdir(live, 0777), 0);
    ks_crash_io c;
    ks_crash_io_init(&c, live, 0);
    c.crash_at = k;
    prog p;
    prog_init(&p);
    ks_save_opts so = {.io = &c.io};
    ks_status s = KS_OK;
    for (int i = 0; i < 2 && !s; i++) {
      prog_step(&p, (i + 1) * 10, 0.5);
      s = ks_state_save(p.st, file, &so, NULL);
      if (!s && k == 0) ack[i] = c.steps;
    }
    ks_state_free(p.st);
    if (k == 0) {
      assert_int_equal(s, KS_OK);
      total = c.steps;
    } else {
      assert_int_not_equal(s, KS_OK);
      char *out = ks_test_path(root, "durable"), *img = ks_test_path(out, "ckpt.keepsake");
      assert_int_equal(mkdir(out, 0777), 0);
      assert_int_equal(ks_crash_io_materialise(&c, KS_CRASH_DURABLE, out), 0);
      int64_t b = -1;
      int ok = ks_test_exists(img) && verifies(img) && load_batch(img, &b);
      if (k > ack[1]) assert_true(ok && b == 20);
      else if (k > ack[0]) {
        if (!ok || (b != 10 && b != 20)) fail_msg("crash before step %ld: the saved file was lost", k);
      } else if (ks_test_exists(img)) assert_true(ok);
      points++;
      free(out);
      free(img);
    }
    ks_crash_io_free(&c);
    ks_test_rmtree(root);
    free(root);
    free(live);
    free(file);
    if (k == total) break;
  }
  printf("crash simulation (ks_state_save replacing a file): %ld crash points, 0 lost\n", points);
  assert_true(points >= 10);
}

/* Writes a durable file through the table, as a killed save or a damaged copy would have left it. */
static void put_file(const ks_io *io, const char *dir, const char *name, const char *bytes) {
  char *path = ks_test_path(dir, name);
  int fd = -1;
  size_t w = 0;
  assert_int_equal(io->create_fn(io->ctx, path, &fd), 0);
  assert_int_equal(io->write_fn(io->ctx, fd, bytes, strlen(bytes), &w), 0);
  assert_int_equal(io->fsync_fn(io->ctx, fd), 0);
  assert_int_equal(io->close_fn(io->ctx, fd), 0);
  assert_int_equal(io->fsync_dir_fn(io->ctx, dir), 0);
  free(path);
}

/*
 * Autoresume writes too: it removes temporary files and moves damaged
 * checkpoints aside. Crashed before each of those steps, the next autoresume
 * still loads the newest good checkpoint and nothing good is lost.
 */
static void crash_during_autoresume(void **state) {
  (void)state;
  long total = -1, points = 0;
  for (long k = 0; k <= total || total < 0; k++) {
    char *root = ks_test_tmpdir("crash-resume");
    char *live = ks_test_path(root, "live"), *run = ks_test_path(live, "run");
    assert_int_equal(mkdir(live, 0777), 0);
    ks_crash_io c;
    ks_crash_io_init(&c, live, 0);
    prog p;
    prog_init(&p);
    ks_status s;
    ks_ckpt_manager *m = open_mgr(run, &c.io, &s);
    assert_int_equal(s, KS_OK);
    for (int i = 0; i < 3; i++) {
      prog_step(&p, (i + 1) * 10, k_vals[i]);
      assert_int_equal(ks_ckpt_manager_save(m, p.st, NULL, NULL), KS_OK);
    }
    put_file(&c.io, run, ".ep4-ba40.keepsake.tmp-AbCdEf", "partial");
    put_file(&c.io, run, "ep5-ba50.keepsake", "damaged copy");
    long before = c.steps;
    c.crash_at = k ? before + k : 0;
    int resumed = 0;
    s = ks_ckpt_manager_autoresume(m, p.st, NULL, NULL, &resumed, NULL, NULL);
    ks_ckpt_manager_free(m);
    ks_state_free(p.st);
    if (k == 0) {
      assert_int_equal(s, KS_OK);
      assert_int_equal(resumed, 1);
      total = c.steps - before; /* the writes autoresume made */
      assert_true(total >= 2);
    } else {
      for (int im = 0; im < 2; im++) {
        char name[16];
        snprintf(name, sizeof name, "image%d", im);
        char *out = ks_test_path(root, name), *irun = ks_test_path(out, "run");
        assert_int_equal(mkdir(out, 0777), 0);
        c.seed = (uint64_t)k;
        assert_int_equal(ks_crash_io_materialise(&c, im ? KS_CRASH_PREFIX : KS_CRASH_DURABLE, out), 0);
        prog q;
        prog_init(&q);
        ks_ckpt_manager *r = open_mgr(irun, ks_test_io_nosync(), &s);
        assert_int_equal(s, KS_OK);
        assert_int_equal(ks_ckpt_manager_autoresume(r, q.st, NULL, NULL, &resumed, NULL, NULL), KS_OK);
        assert_int_equal(resumed, 1);
        assert_int_equal(q.ts.batch, 30);
        for (int i = 0; i < 3; i++) { /* batch 10 was deleted by retention before; 20 (best) and 30 stay */
          char n[64];
          ckpt_name(i, n, sizeof n);
          char *f = ks_test_path(irun, n);
          if (i > 0 && !verifies(f)) fail_msg("crash before autoresume step %ld: %s lost", k, n);
          free(f);
        }
        ks_ckpt_manager_free(r);
        ks_state_free(q.st);
        free(out);
        free(irun);
      }
      points++;
    }
    ks_crash_io_free(&c);
    ks_test_rmtree(root);
    free(root);
    free(live);
    free(run);
  }
  printf("crash simulation (autoresume's own writes): %ld crash points, 0 lost\n", points);
  assert_true(points >= 2);
}

int main(void) {
  g_null = fopen("/dev/null", "w");
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(model_drops_what_was_not_synced),
    cmocka_unit_test(durable_replace_survives_a_crash_at_every_step),
    cmocka_unit_test(crash_at_every_step_of_sync_saves),
    cmocka_unit_test(crash_at_every_step_of_async_saves),
    cmocka_unit_test(fail_at_every_step_of_sync_saves),
    cmocka_unit_test(fail_at_every_step_of_async_saves),
    cmocka_unit_test(crash_during_autoresume),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  fclose(g_null);
  return rc;
}
