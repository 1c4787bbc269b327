/*
 * The checkpoint manager on its own: preservation policies after every save
 * (latest N, best N by a stored metric, every Nth, one per period), recomputed
 * from disk across a resume and another spelling of the run directory, a
 * corrupt newest checkpoint, background saves, and early stopping's component.
 */
#include <math.h>
#include <pthread.h>
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
#include "manager/manager_internal.h"
#include "testprog.h"
#include "testutil.h"

/* A small program: one weight tensor, a timestamp and an eval MeanMetric whose value we choose. */
typedef ks_test_prog prog;

static void prog_init(prog *p) { assert_int_equal(ks_test_prog_init(p), KS_OK); }

/* Advances to batch `b` with the eval metric at value v (computed, so `_computed` holds it). */
static void prog_step(prog *p, int64_t b, double v) {
  p->ts.batch = b;
  p->ts.epoch = b / 10;
  p->ts.batch_in_epoch = b % 10;
  p->ts.total_wct = (double)b;
  p->w[0] = (float)b;
  assert_int_equal(ks_test_prog_set_metric(p, v), KS_OK);
}

static void prog_free(prog *p) { ks_state_free(p->st); }

static void name_of(int64_t b, char *buf, size_t cap) {
  snprintf(buf, cap, "ep%lld-ba%lld.keepsake", (long long)(b / 10), (long long)b);
}

static int has(const char *dir, int64_t b) {
  char n[64];
  name_of(b, n, sizeof n);
  char *p = ks_test_path(dir, n);
  int e = ks_test_exists(p);
  free(p);
  return e;
}

/* The oracle: which of the batches saved so far (values vals[i] at batch (i+1)*10... ) to keep. */
typedef struct oracle {
  int keep_latest, keep_best;
  int64_t batches[64];
  double vals[64];
  size_t n;
} oracle;

static int oracle_keeps(const oracle *o, size_t i) {
  if (i + 1 == o->n) return 1;                            /* newest */
  if (o->n - i <= (size_t)o->keep_latest) return 1;       /* latest N */
  size_t better = 0;                                      /* rank by value, newer wins ties */
  for (size_t j = 0; j < o->n; j++)
    if (o->vals[j] > o->vals[i] || (o->vals[j] == o->vals[i] && j > i)) better++;
  return !isnan(o->vals[i]) && better < (size_t)o->keep_best;
}

static void check_oracle(const char *dir, const oracle *o) {
  for (size_t i = 0; i < o->n; i++) {
    if (has(dir, o->batches[i]) != oracle_keeps(o, i))
      fail_msg("after %zu saves: batch %lld (value %g) should be %s", o->n, (long long)o->batches[i], o->vals[i],
               oracle_keeps(o, i) ? "kept" : "deleted");
  }
}

static ks_ckpt_manager *make_mgr(const char *dir, int keep, int keep_best) {
  ks_ckpt_opts co = {.run_dir = dir,
                     .save_interval = "10ba",
                     .keep = keep,
                     .io = ks_test_io_nosync(),
                     .keep_best = keep_best,
                     .best_metric = "eval/MeanMetric",
                     .best_mode = KS_BEST_MAX};
  ks_ckpt_manager *m = NULL;
  assert_int_equal(ks_ckpt_manager_create(&co, &m, NULL), KS_OK);
  return m;
}

static const double VALUES[] = {0.5, 0.9, 0.2, 0.95, 0.1, 0.9, 0.3, 0.7, 0.99, 0.0, 0.4, 0.6};

static void keep_best_holds_after_every_save_and_across_resume(void **state) {
  (void)state;
  char *dir = ks_test_tmpdir("mgr-best");
  char other[4200];
  snprintf(other, sizeof other, "%s/./", dir); /* the same directory, spelled otherwise */
  prog p;
  prog_init(&p);
  oracle o = {.keep_latest = 1, .keep_best = 3};
  ks_ckpt_manager *m = make_mgr(dir, 1, 3);
  for (size_t i = 0; i < 12; i++) {
    if (i == 6) { /* a resume: a new manager on another spelling of the run dir, nothing else carried over */
      ks_ckpt_manager_free(m);
      m = make_mgr(other, 1, 3);
    }
    o.batches[o.n] = (int64_t)(i + 1) * 10;
    o.vals[o.n++] = VALUES[i];
    prog_step(&p, (int64_t)(i + 1) * 10, VALUES[i]);
    assert_int_equal(ks_ckpt_manager_save(m, p.st, NULL, NULL), KS_OK);
    check_oracle(dir, &o);
  }
  ks_ckpt_manager_free(m);
  prog_free(&p);
  ks_test_rmtree(dir);
  free(dir);
}

static void keep_best_ignores_a_corrupt_newest_after_autoresume(void **state) {
  (void)state;
  char *dir = ks_test_tmpdir("mgr-corrupt");
  prog p;
  prog_init(&p);
  ks_ckpt_manager *m = make_mgr(dir, 1, 2);
  const double vals[] = {0.3, 0.8, 0.5};
  for (int i = 0; i < 3; i++) {
    prog_step(&p, (i + 1) * 10, vals[i]);
    assert_int_equal(ks_ckpt_manager_save(m, p.st, NULL, NULL), KS_OK);
  }
  /* Damage the newest (batch 30): flip its last data byte. */
  char n[64];
  name_of(30, n, sizeof n);
  char *path = ks_test_path(dir, n);
  size_t len;
  uint8_t *bytes = ks_test_read_file(path, &len);
  assert_non_null(bytes);
  bytes[len - 1] ^= 0xff;
  assert_int_equal(ks_test_write_file(path, bytes, len), 0);
  free(bytes);
  ks_ckpt_manager_free(m);

  FILE *log = tmpfile();
  ks_ckpt_opts co = {.run_dir = dir, .save_interval = "10ba", .keep = 1, .io = ks_test_io_nosync(), .keep_best = 2,
                     .best_metric = "eval/MeanMetric", .log = log};
  assert_int_equal(ks_ckpt_manager_create(&co, &m, NULL), KS_OK);
  prog q;
  prog_init(&q);
  int resumed = 0;
  assert_int_equal(ks_ckpt_manager_autoresume(m, q.st, NULL, NULL, &resumed, NULL, NULL), KS_OK);
  assert_int_equal(resumed, 1);
  assert_int_equal(q.ts.batch, 20);
  assert_int_equal(ks_ckpt_manager_skipped(m), 1);
  assert_false(ks_test_exists(path)); /* moved aside, so it can never be ranked */
  char corrupt[4200];
  snprintf(corrupt, sizeof corrupt, "%s.corrupt", path);
  assert_true(ks_test_exists(corrupt));
  /* Continue: the next save ranks 0.8 (batch 20) and the new one; batch 10 (0.3) goes once 2 are better. */
  prog_step(&q, 30, 0.6);
  assert_int_equal(ks_ckpt_manager_save(m, q.st, NULL, NULL), KS_OK);
  assert_true(has(dir, 20) && has(dir, 30));
  assert_false(has(dir, 10));
  ks_ckpt_manager_free(m);
  fclose(log);
  free(path);
  prog_free(&q);
  prog_free(&p);
  ks_test_rmtree(dir);
  free(dir);
}

/* Pure policy checks on synthetic lists (newest first). */
static void retention_every_and_period_policies(void **state) {
  (void)state;
  ks__ckpt_info v[12];
  memset(v, 0, sizeof v);
  for (int i = 0; i < 12; i++) { /* batches 120, 110, ..., 10; 10 batches per epoch; 7 s per 10 batches */
    int64_t b = (12 - i) * 10;
    v[i] = (ks__ckpt_info){.name = "x", .batch = b, .epoch = b / 10, .batch_in_epoch = 0, .wct = (double)b * 0.7};
  }
  ks__retention every = {.every = 3, .every_epochs = 1};
  ks__retention_decide(&every, v, 12);
  for (int i = 0; i < 12; i++) assert_int_equal(v[i].keep, i == 0 || v[i].epoch % 3 == 0);
  ks__retention period = {.period_seconds = 20};
  ks__retention_decide(&period, v, 12);
  /* wct 7, 14 | 21, 28, 35 | 42, 49, 56 | 63, 70, 77 | 84: the first of each 20 s bucket, and the newest. */
  static const int64_t kept[] = {10, 30, 60, 90, 120};
  for (int i = 0; i < 12; i++) {
    int want = 0;
    for (size_t k = 0; k < sizeof kept / sizeof kept[0]; k++) want |= v[i].batch == kept[k];
    assert_int_equal(v[i].keep, want);
  }
  ks__retention none = {0};
  ks__retention_decide(&none, v, 12);
  for (int i = 0; i < 12; i++) assert_true(v[i].keep);
  ks__retention min = {.keep_best = 1, .best_min = 1};
  for (int i = 0; i < 12; i++) v[i].has_metric = i != 5, v[i].metric = i == 5 ? 0 : 10.0 - i * 0.5;
  ks__retention_decide(&min, v, 12);
  for (int i = 0; i < 12; i++) assert_int_equal(v[i].keep, i == 0 || i == 11); /* newest; lowest (i = 11) */
}

static void manager_refuses_bad_policies(void **state) {
  (void)state;
  char *dir = ks_test_tmpdir("mgr-bad");
  ks_ckpt_manager *m = NULL;
  ks_error e;
  ks_ckpt_opts a = {.run_dir = dir, .keep_best = 2};
  assert_int_equal(ks_ckpt_manager_create(&a, &m, &e), KS_E_INVALID);
  assert_non_null(strstr(e.message, "keep_best"));
  ks_ckpt_opts b = {.run_dir = dir, .keep_every = "3x"};
  assert_int_equal(ks_ckpt_manager_create(&b, &m, &e), KS_E_INVALID);
  ks_ckpt_opts c = {.run_dir = dir, .keep_period_seconds = -1};
  assert_int_equal(ks_ckpt_manager_create(&c, &m, &e), KS_E_INVALID);
  assert_null(m);
  ks_test_rmtree(dir);
  free(dir);
}

/* What a manager wrote on its log, read back from the temporary file it was given. */
static char *log_text(FILE *log) {
  static char buf[8192];
  fflush(log);
  rewind(log);
  size_t n = fread(buf, 1, sizeof buf - 1, log);
  buf[n] = '\0';
  return buf;
}

static size_t count_of(const char *text, const char *what) {
  size_t n = 0;
  for (const char *p = strstr(text, what); p; p = strstr(p + 1, what)) n++;
  return n;
}

static void keep_best_must_name_a_metric_of_the_program(void **state) {
  (void)state;
  char *dir = ks_test_tmpdir("mgr-best-name");
  char *run = ks_test_path(dir, "run");
  const char *mine[] = {"state/train_metrics/acc", "state/eval_metrics/val/loss"};
  ks_ckpt_opts co = {.run_dir = run, .keep_best = 1, .best_metric = "train_metrics/accuracy",
                     .metrics = mine, .n_metrics = 2};
  ks_ckpt_manager *m = NULL;
  ks_error e;
  assert_int_equal(ks_ckpt_manager_create(&co, &m, &e), KS_E_INVALID);
  assert_null(m);
  assert_non_null(strstr(e.message, "'train_metrics/accuracy'"));
  assert_non_null(strstr(e.message, "train_metrics/acc, eval_metrics/val/loss")); /* what it could name */
  assert_false(ks_test_exists(run)); /* refused before anything was made */
  co.n_metrics = 0; /* a program without metrics */
  assert_int_equal(ks_ckpt_manager_create(&co, &m, &e), KS_E_INVALID);
  assert_non_null(strstr(e.message, "no metrics"));
  const char *spellings[] = {"train_metrics/acc", "train/acc", "state/train_metrics/acc", "val/loss",
                             "eval_metrics/val/loss"};
  co.n_metrics = 2;
  for (size_t i = 0; i < sizeof spellings / sizeof *spellings; i++) {
    co.best_metric = spellings[i];
    assert_int_equal(ks_ckpt_manager_create(&co, &m, &e), KS_OK);
    ks_ckpt_manager_free(m);
    m = NULL;
  }
  co.metrics = NULL; /* not given: not checked (a C program with ks_state) */
  co.best_metric = "train_metrics/accuracy";
  assert_int_equal(ks_ckpt_manager_create(&co, &m, &e), KS_OK);
  ks_ckpt_manager_free(m);
  free(run);
  ks_test_rmtree(dir);
  free(dir);
}

static void a_save_keep_best_cannot_rank_is_warned_once(void **state) {
  (void)state;
  char *dir = ks_test_tmpdir("mgr-unranked");
  FILE *log = tmpfile();
  assert_non_null(log);
  prog p;
  prog_init(&p);
  ks_ckpt_opts co = {.run_dir = dir, .io = ks_test_io_nosync(), .keep_best = 1, .best_metric = "eval/MeanMetric",
                     .log = log};
  ks_ckpt_manager *m = NULL;
  assert_int_equal(ks_ckpt_manager_create(&co, &m, NULL), KS_OK);
  for (int64_t b = 1; b <= 3; b++) { /* the metric is never computed */
    p.ts.batch = b;
    assert_int_equal(ks_ckpt_manager_save(m, p.st, NULL, NULL), KS_OK);
  }
  const char *text = log_text(log);
  assert_int_equal(count_of(text, "keep_best cannot rank"), 1);
  assert_non_null(strstr(text, "ep0-ba1.keepsake by 'eval/MeanMetric': the metric was never computed"));
  ks_ckpt_manager_free(m);
  /* A run whose metric is computed before each save says nothing. */
  fclose(log);
  log = tmpfile();
  co.log = log;
  ks_test_rmtree(dir);
  assert_int_equal(ks_ckpt_manager_create(&co, &m, NULL), KS_OK);
  for (int64_t b = 1; b <= 3; b++) {
    prog_step(&p, b, 0.1 * (double)b);
    assert_int_equal(ks_ckpt_manager_save(m, p.st, NULL, NULL), KS_OK);
  }
  assert_string_equal(log_text(log), "");
  ks_ckpt_manager_free(m);
  fclose(log);
  prog_free(&p);
  ks_test_rmtree(dir);
  free(dir);
}

static void a_timestamp_that_never_advances_is_warned_once(void **state) {
  (void)state;
  char *dir = ks_test_tmpdir("mgr-stuck");
  FILE *log = tmpfile();
  assert_non_null(log);
  ks_ckpt_opts co = {.run_dir = dir, .save_interval = "2ba", .log = log};
  ks_ckpt_manager *m = NULL;
  assert_int_equal(ks_ckpt_manager_create(&co, &m, NULL), KS_OK);
  ks_timestamp ts;
  ks_timestamp_init(&ts);
  for (int i = 0; i < 4; i++) { /* a healthy loop: batch ends, then the epoch end at the same timestamp */
    ts.batch++;
    (void)ks_ckpt_manager_should_save(m, &ts, 0);
    if (i % 2) {
      ts.epoch++;
      (void)ks_ckpt_manager_should_save(m, &ts, 1);
    }
  }
  assert_string_equal(log_text(log), "");
  for (int i = 0; i < KS_CKPT_STUCK_CALLS - 1; i++) (void)ks_ckpt_manager_should_save(m, &ts, 0);
  assert_string_equal(log_text(log), ""); /* not yet */
  for (int i = 0; i < 5; i++) (void)ks_ckpt_manager_should_save(m, &ts, 0);
  const char *text = log_text(log);
  assert_int_equal(count_of(text, "saw the same timestamp"), 1);
  assert_non_null(strstr(text, "batch ends in a row saw the same timestamp (epoch 2, batch 4)"));
  ks_ckpt_manager_free(m);
  fclose(log);
  /* Epoch ends that never advance the epoch ("1ep" never comes due). */
  log = tmpfile();
  co.log = log;
  co.save_interval = "1ep";
  assert_int_equal(ks_ckpt_manager_create(&co, &m, NULL), KS_OK);
  ts.epoch = 0;
  for (int i = 0; i < KS_CKPT_STUCK_CALLS; i++) {
    ts.batch += 10; /* batches are counted, epochs are not */
    assert_int_equal(ks_ckpt_manager_should_save(m, &ts, 0), 0);
    assert_int_equal(ks_ckpt_manager_should_save(m, &ts, 1), 0);
  }
  assert_int_equal(count_of(log_text(log), "epoch ends in a row saw the same timestamp"), 1);
  ks_ckpt_manager_free(m);
  fclose(log);
  ks_test_rmtree(dir);
  free(dir);
}

/* ---- background saves ---- */

/* An io whose first write blocks until released, so a save can be held in flight. */
typedef struct gate_io {
  ks_io io;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int open, fail_writes, writes;
} gate_io;

static int gate_write(void *ctx, int fd, const void *buf, size_t n, size_t *written) {
  gate_io *g = ctx;
  pthread_mutex_lock(&g->mu);
  g->writes++;
  while (!g->open) pthread_cond_wait(&g->cv, &g->mu);
  int fail = g->fail_writes;
  pthread_mutex_unlock(&g->mu);
  if (fail) return 28; /* ENOSPC */
  return ks_io_posix()->write_fn(NULL, fd, buf, n, written);
}

static void gate_init(gate_io *g, int open, int fail) {
  memset(g, 0, sizeof *g);
  g->io = *ks_io_posix();
  g->io.ctx = g;
  g->io.write_fn = gate_write;
  pthread_mutex_init(&g->mu, NULL);
  pthread_cond_init(&g->cv, NULL);
  g->open = open;
  g->fail_writes = fail;
}

static void gate_open(gate_io *g) {
  pthread_mutex_lock(&g->mu);
  g->open = 1;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

static void gate_wait_for_write(gate_io *g) {
  for (;;) {
    pthread_mutex_lock(&g->mu);
    int w = g->writes;
    pthread_mutex_unlock(&g->mu);
    if (w) return;
    usleep(1000);
  }
}

static void gate_free(gate_io *g) {
  pthread_mutex_destroy(&g->mu);
  pthread_cond_destroy(&g->cv);
}

static void async_save_writes_the_snapshot_and_equals_sync(void **state) {
  (void)state;
  char *dir = ks_test_tmpdir("async-eq");
  char *a = ks_test_path(dir, "sync.keepsake"), *b = ks_test_path(dir, "async.keepsake");
  prog p;
  prog_init(&p);
  prog_step(&p, 10, 0.25);
  assert_int_equal(ks_state_save(p.st, a, NULL, NULL), KS_OK);
  gate_io g;
  gate_init(&g, 0, 0);
  ks_save_opts so = {.io = &g.io};
  ks_async_saver *sv = NULL;
  assert_int_equal(ks_async_saver_create(NULL, &sv, NULL), KS_OK);
  assert_int_equal(ks_state_save_async(sv, p.st, b, &so, NULL), KS_OK);
  gate_wait_for_write(&g);
  assert_true(ks_async_saver_busy(sv));
  prog_step(&p, 20, 0.75); /* the state moves on while the save is held in flight */
  gate_open(&g);
  assert_int_equal(ks_async_saver_wait(sv, NULL), KS_OK);
  assert_false(ks_async_saver_busy(sv));
  size_t la, lb;
  uint8_t *da = ks_test_read_file(a, &la), *db = ks_test_read_file(b, &lb);
  assert_non_null(da);
  assert_non_null(db);
  assert_int_equal(la, lb);
  assert_memory_equal(da, db, la); /* the snapshot, not the state as it is now */
  free(da);
  free(db);
  /* A second save reuses the staging buffer and writes the new state. */
  assert_int_equal(ks_state_save_async(sv, p.st, b, NULL, NULL), KS_OK);
  assert_int_equal(ks_async_saver_wait(sv, NULL), KS_OK);
  ks_statedict *sd = NULL;
  assert_int_equal(ks_load(b, NULL, &sd, NULL, NULL), KS_OK);
  assert_float_equal(((const float *)ks_statedict_tensor(sd, "state/model/w")->data)[0], 20.0f, 0);
  ks_statedict_free(sd);
  ks_async_saver_free(sv);
  gate_free(&g);
  prog_free(&p);
  free(a);
  free(b);
  ks_test_rmtree(dir);
  free(dir);
}

static void async_busy_mode_refuses_a_second_save(void **state) {
  (void)state;
  char *dir = ks_test_tmpdir("async-busy");
  char *a = ks_test_path(dir, "a.keepsake");
  prog p;
  prog_init(&p);
  gate_io g;
  gate_init(&g, 0, 0);
  ks_save_opts so = {.io = &g.io};
  ks_async_opts ao = {.busy = KS_ASYNC_FAIL_BUSY};
  ks_async_saver *sv = NULL;
  ks_error e;
  assert_int_equal(ks_async_saver_create(&ao, &sv, NULL), KS_OK);
  assert_int_equal(ks_state_save_async(sv, p.st, a, &so, NULL), KS_OK);
  gate_wait_for_write(&g);
  assert_int_equal(ks_state_save_async(sv, p.st, a, &so, &e), KS_E_STATE);
  assert_non_null(strstr(e.message, "in flight"));
  gate_open(&g);
  assert_int_equal(ks_async_saver_wait(sv, NULL), KS_OK);
  assert_true(ks_test_exists(a));
  ks_async_saver_free(sv);
  gate_free(&g);
  prog_free(&p);
  free(a);
  ks_test_rmtree(dir);
  free(dir);
}

static void async_errors_surface_once_and_leave_no_temp_file(void **state) {
  (void)state;
  char *dir = ks_test_tmpdir("async-err");
  char *a = ks_test_path(dir, "a.keepsake");
  prog p;
  prog_init(&p);
  gate_io g;
  gate_init(&g, 1, 1); /* every write fails with ENOSPC */
  ks_save_opts so = {.io = &g.io};
  ks_async_saver *sv = NULL;
  ks_error e;
  assert_int_equal(ks_async_saver_create(NULL, &sv, NULL), KS_OK);
  assert_int_equal(ks_state_save_async(sv, p.st, a, &so, NULL), KS_OK);
  /* The failure is returned by the next start, which then does not start... */
  assert_int_equal(ks_state_save_async(sv, p.st, a, &so, &e), KS_E_IO);
  assert_non_null(strstr(e.message, "No space"));
  /* ...and only once. */
  assert_int_equal(ks_async_saver_wait(sv, NULL), KS_OK);
  assert_false(ks_test_exists(a));
  assert_int_equal(ks_test_dir_entries(dir), 0);
  ks_async_saver_free(sv);
  gate_free(&g);
  prog_free(&p);
  free(a);
  ks_test_rmtree(dir);
  free(dir);
}

/* An allocator that remembers the largest request since it was last reset (thread-safe: the
   saver's thread allocates too). */
typedef struct big_alloc {
  pthread_mutex_t mu;
  size_t largest;
} big_alloc;

static void note_size(big_alloc *b, size_t n) {
  pthread_mutex_lock(&b->mu);
  if (n > b->largest) b->largest = n;
  pthread_mutex_unlock(&b->mu);
}
static void *big_malloc(void *ctx, size_t n) {
  note_size(ctx, n);
  return malloc(n);
}
static void *big_realloc(void *ctx, void *p, size_t n) {
  note_size(ctx, n);
  return realloc(p, n);
}
static void big_free(void *ctx, void *p) {
  (void)ctx;
  free(p);
}

/* Three 1 MiB float tensors of value v. */
static ks_statedict *three_tensors(float **data, float v) {
  ks_statedict *sd = NULL;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  int64_t shape[1] = {1 << 18};
  for (int i = 0; i < 3; i++) {
    if (!data[i]) data[i] = malloc((size_t)1 << 20);
    for (size_t k = 0; k < (size_t)1 << 18; k++) data[i][k] = v + (float)i;
    ks_tensor t;
    char name[16];
    snprintf(name, sizeof name, "w%d", i);
    assert_int_equal(ks_tensor_init(&t, KS_F32, 1, shape, data[i]), KS_OK);
    assert_int_equal(ks_statedict_set_tensor(sd, name, &t, KS_BORROW, NULL), KS_OK);
  }
  return sd;
}

/* Whether the file at a has the bytes ks_save writes for sd. */
static void assert_saved_as(const char *a, const ks_statedict *sd, const char *scratch) {
  assert_int_equal(ks_save(scratch, sd, NULL, NULL, NULL), KS_OK);
  size_t la, lb;
  uint8_t *da = ks_test_read_file(a, &la), *db = ks_test_read_file(scratch, &lb);
  assert_non_null(da);
  assert_non_null(db);
  assert_int_equal(la, lb);
  assert_memory_equal(da, db, la);
  free(da);
  free(db);
}

/* An image made before training takes its memory at once (touched then); background saves
   through it allocate nothing large, and write ks_save's file. While a save writes from the image,
   a caller asking to write into it waits, or is refused in busy mode. */
static void async_image_takes_its_memory_before_the_first_save(void **state) {
  (void)state;
  char *dir = ks_test_tmpdir("async-reserve");
  char *a = ks_test_path(dir, "a.keepsake"), *b = ks_test_path(dir, "b.keepsake");
  big_alloc ba = {.largest = 0};
  pthread_mutex_init(&ba.mu, NULL);
  ks_allocator al = {big_malloc, big_realloc, big_free, &ba};
  float *data[3] = {NULL, NULL, NULL};
  ks_statedict *sd = three_tensors(data, 1.0f);
  ks_image_opts io = {.size = sizeof io, .alloc = &al};
  ks_image *im = NULL;
  assert_int_equal(ks_image_create(sd, NULL, &io, &im, NULL), KS_OK);
  assert_true(ba.largest >= (size_t)3 << 20); /* the whole image, at once */
  ks_async_opts ao = {.alloc = &al, .busy = KS_ASYNC_FAIL_BUSY};
  ks_async_saver *sv = NULL;
  assert_int_equal(ks_async_saver_create(&ao, &sv, NULL), KS_OK);
  ba.largest = 0;
  gate_io g;
  gate_init(&g, 0, 0);
  ks_save_opts so = {.size = sizeof so, .io = &g.io};
  assert_int_equal(ks_async_saver_start_image(sv, im, sd, NULL, a, &so, NULL, NULL, NULL), KS_OK);
  gate_wait_for_write(&g);
  /* The save is held at its first write: the image is not the caller's to write into. */
  ks_error e;
  ks_image_info info = {.size = sizeof info};
  assert_int_equal(ks_image_get(im, sd, NULL, &info, &e), KS_E_STATE);
  assert_non_null(strstr(e.message, "still writing"));
  gate_open(&g);
  assert_int_equal(ks_async_saver_wait(sv, NULL), KS_OK);
  assert_true(ba.largest < (size_t)1 << 20); /* the save staged into the image's memory */
  assert_saved_as(a, sd, b);
  assert_int_equal(ks_image_get(im, sd, NULL, &info, NULL), KS_OK);
  assert_int_equal(info.count, 3);
  /* The manager's background save through the same image: the same file, nothing large taken. */
  ks_ckpt_manager *m = NULL;
  ks_ckpt_opts mo = {.run_dir = dir, .filename = "m.keepsake", .lock = KS_CKPT_LOCK_OFF};
  assert_int_equal(ks_ckpt_manager_create(&mo, &m, NULL), KS_OK);
  const char *saved = NULL;
  assert_int_equal(ks_ckpt_manager_save_image(m, im, sd, NULL, NULL, 1, &saved, NULL), KS_OK);
  assert_int_equal(ks_ckpt_manager_wait(m, NULL), KS_OK);
  assert_true(ba.largest < (size_t)1 << 20);
  assert_saved_as(saved, sd, b);
  assert_int_equal(ks_ckpt_manager_save_image(NULL, im, sd, NULL, NULL, 1, NULL, &e), KS_E_INVALID);
  ks_ckpt_manager_free(m);
  ks_ckpt_opts so_sh = {.run_dir = dir, .sharded = 1}; /* the ranks save a sharded manager's directories */
  assert_int_equal(ks_ckpt_manager_create(&so_sh, &m, NULL), KS_OK);
  assert_int_equal(ks_ckpt_manager_save_image(m, im, sd, NULL, NULL, 1, NULL, &e), KS_E_STATE);
  ks_ckpt_manager_free(m);
  ks_async_saver_free(sv);
  ks_image_free(im);
  gate_free(&g);
  ks_statedict_free(sd);
  for (int i = 0; i < 3; i++) free(data[i]);
  pthread_mutex_destroy(&ba.mu);
  free(a);
  free(b);
  ks_test_rmtree(dir);
  free(dir);
}

static void async_image_saves_from_the_callers_memory(void **state) {
  (void)state;
  char *dir = ks_test_tmpdir("async-into");
  char *a = ks_test_path(dir, "a.keepsake"), *b = ks_test_path(dir, "b.keepsake");
  big_alloc ba = {.largest = 0};
  pthread_mutex_init(&ba.mu, NULL);
  ks_allocator al = {big_malloc, big_realloc, big_free, &ba};
  float *data[3] = {NULL, NULL, NULL};
  ks_statedict *sd = three_tensors(data, 1.0f);
  ks_async_opts ao = {.alloc = &al};
  ks_async_saver *sv = NULL;
  assert_int_equal(ks_async_saver_create(&ao, &sv, NULL), KS_OK);
  /* A layout only says how much memory the image needs; memory too small is refused. */
  ks_image_opts lo = {.size = sizeof lo, .layout_only = 1};
  ks_image *lay = NULL;
  assert_int_equal(ks_image_create(sd, NULL, &lo, &lay, NULL), KS_OK);
  ks_image_info info = {.size = sizeof info};
  assert_int_equal(ks_image_get(lay, NULL, NULL, &info, NULL), KS_OK);
  size_t need = info.need;
  assert_true(need >= (size_t)3 << 20);
  ks_error e;
  assert_int_equal(ks_async_saver_start_image(sv, lay, sd, NULL, a, NULL, NULL, NULL, &e), KS_E_STATE);
  ks_image_free(lay);
  unsigned char *buf = aligned_alloc(KS_IMAGE_ALIGN, need);
  assert_non_null(buf);
  ks_image *im = NULL;
  ks_image_opts co = {.size = sizeof co, .alloc = &al, .buf = buf, .buf_size = KS_IMAGE_ALIGN};
  assert_int_equal(ks_image_create(sd, NULL, &co, &im, &e), KS_E_LIMIT);
  co.buf_size = need;
  assert_int_equal(ks_image_create(sd, NULL, &co, &im, NULL), KS_OK);
  assert_int_equal(ks_image_get(im, sd, NULL, &info, NULL), KS_OK);
  /* The caller puts the tensors at their offsets (as device-to-host copies would), then saves
     a state dict that points there: the saver copies nothing and allocates no staging. */
  ks_statedict *placed = NULL;
  assert_int_equal(ks_statedict_create(NULL, &placed, NULL), KS_OK);
  for (size_t i = 0; i < 3; i++) {
    ks_entry en;
    assert_int_equal(ks_statedict_at(sd, i, &en), KS_OK);
    assert_true(info.offsets[i] + en.tensor.nbytes <= need);
    memcpy(buf + info.offsets[i], en.tensor.data, en.tensor.nbytes);
    en.tensor.data = buf + info.offsets[i];
    assert_int_equal(ks_statedict_set_tensor(placed, en.name, &en.tensor, KS_BORROW, NULL), KS_OK);
  }
  ba.largest = 0;
  assert_int_equal(ks_async_saver_start_image(sv, im, placed, NULL, a, NULL, NULL, NULL, NULL), KS_OK);
  assert_int_equal(ks_async_saver_wait(sv, NULL), KS_OK);
  assert_true(ba.largest < (size_t)1 << 20);
  assert_saved_as(a, sd, b);
  /* Tensors that lie in the memory, but not where the image puts them, are not copied over each
     other: they are copied aside first, and the file is still right. */
  ks_statedict *moved = NULL;
  assert_int_equal(ks_statedict_create(NULL, &moved, NULL), KS_OK);
  for (size_t i = 0; i < 3; i++) {
    ks_entry en;
    assert_int_equal(ks_statedict_at(placed, (i + 1) % 3, &en), KS_OK);
    char name[16];
    snprintf(name, sizeof name, "w%zu", i);
    assert_int_equal(ks_statedict_set_tensor(moved, name, &en.tensor, KS_BORROW, NULL), KS_OK);
  }
  ks_statedict *ref = NULL; /* the same state, from memory outside the image */
  assert_int_equal(ks_statedict_create(NULL, &ref, NULL), KS_OK);
  for (size_t i = 0; i < 3; i++) {
    ks_entry en;
    assert_int_equal(ks_statedict_at(sd, (i + 1) % 3, &en), KS_OK);
    char name[16];
    snprintf(name, sizeof name, "w%zu", i);
    assert_int_equal(ks_statedict_set_tensor(ref, name, &en.tensor, KS_BORROW, NULL), KS_OK);
  }
  assert_int_equal(ks_async_saver_start_image(sv, im, moved, NULL, a, NULL, NULL, NULL, NULL), KS_OK);
  assert_int_equal(ks_async_saver_wait(sv, NULL), KS_OK);
  assert_saved_as(a, ref, b);
  /* A state that no longer fits the caller's memory is refused, the image unchanged. */
  float *more[3] = {NULL, NULL, NULL};
  ks_statedict *bigger = three_tensors(more, 2.0f);
  int64_t shape[1] = {(int64_t)1 << 20};
  void *p;
  assert_int_equal(ks_statedict_new_tensor(bigger, "extra", KS_F32, 1, shape, &p, NULL), KS_OK);
  assert_int_equal(ks_async_saver_start_image(sv, im, bigger, NULL, a, NULL, NULL, NULL, &e), KS_E_LIMIT);
  assert_int_equal(ks_async_saver_wait(sv, NULL), KS_OK);
  assert_saved_as(a, ref, b); /* the last file stands */
  ks_async_saver_free(sv);
  ks_image_free(im);
  free(buf);
  ks_statedict_free(bigger);
  ks_statedict_free(ref);
  ks_statedict_free(moved);
  ks_statedict_free(placed);
  ks_statedict_free(sd);
  for (int i = 0; i < 3; i++) free(data[i]), free(more[i]);
  pthread_mutex_destroy(&ba.mu);
  free(a);
  free(b);
  ks_test_rmtree(dir);
  free(dir);
}

static void *open_later(void *arg) {
  usleep(20000);
  gate_open(arg);
  return NULL;
}

static void manager_free_finishes_a_save_in_flight(void **state) {
  (void)state;
  char *dir = ks_test_tmpdir("async-free");
  prog p;
  prog_init(&p);
  gate_io g;
  gate_init(&g, 0, 0);
  ks_ckpt_opts co = {.run_dir = dir, .save_interval = "10ba", .keep = 2, .io = &g.io};
  ks_ckpt_manager *m = NULL;
  assert_int_equal(ks_ckpt_manager_create(&co, &m, NULL), KS_OK);
  prog_step(&p, 10, 0.5);
  const char *saved = NULL;
  assert_int_equal(ks_ckpt_manager_save_async(m, p.st, &saved, NULL), KS_OK);
  assert_non_null(strstr(saved, "ep1-ba10.keepsake"));
  gate_wait_for_write(&g);
  pthread_t t;
  pthread_create(&t, NULL, open_later, &g);
  ks_ckpt_manager_free(m); /* blocks until the background save has committed */
  pthread_join(t, NULL);
  assert_true(has(dir, 10));
  char *latest = ks_test_path(dir, "latest");
  char target[256] = {0};
  assert_true(readlink(latest, target, sizeof target - 1) > 0);
  assert_string_equal(target, "ep1-ba10.keepsake");
  /* the checkpoint, latest and the run directory's lock file (.keepsake.lock): no temp file */
  assert_int_equal(ks_test_dir_entries(dir), 3);
  free(latest);
  gate_free(&g);
  prog_free(&p);
  ks_test_rmtree(dir);
  free(dir);
}

/* ---- early stopping ---- */

static void early_stop_follows_patience_and_round_trips(void **state) {
  (void)state;
  ks_early_stop es, back;
  assert_int_equal(ks_early_stop_init(&es, "eval/Acc", KS_BEST_MAX, 2, 0.0, NULL), KS_OK);
  assert_int_equal(ks_early_stop_update(&es, 0.5, 0), 0);
  assert_int_equal(ks_early_stop_update(&es, 0.7, 1), 0);
  assert_int_equal(ks_early_stop_update(&es, 0.6, 2), 0); /* wait 1 */
  ks_statedict *sd = NULL;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  ks_stateful cb = ks_early_stop_stateful(&es);
  assert_int_equal(cb.to_state_dict(cb.ctx, sd, "state/callbacks/EarlyStopping/", NULL), KS_OK);
  assert_int_equal(ks_early_stop_init(&back, "eval/Acc", KS_BEST_MAX, 2, 0.0, NULL), KS_OK);
  ks_stateful cb2 = ks_early_stop_stateful(&back);
  assert_int_equal(cb2.load_state_dict(cb2.ctx, sd, "state/callbacks/EarlyStopping/", NULL), KS_OK);
  assert_int_equal(back.wait_count, 1);
  assert_float_equal(back.best_score, 0.7, 0);
  /* Both stop at the same epoch from here. */
  assert_int_equal(ks_early_stop_update(&back, 0.65, 3), 1);
  assert_int_equal(ks_early_stop_update(&es, 0.65, 3), 1);
  assert_int_equal(back.stopped_epoch, 3);
  assert_int_equal(es.stopped_epoch, 3);
  /* Another monitor is refused, with the component unchanged. */
  ks_early_stop other;
  assert_int_equal(ks_early_stop_init(&other, "eval/Loss", KS_BEST_MIN, 3, 0.0, NULL), KS_OK);
  ks_early_stop before = other;
  ks_stateful cb3 = ks_early_stop_stateful(&other);
  ks_error e;
  assert_int_equal(cb3.load_state_dict(cb3.ctx, sd, "state/callbacks/EarlyStopping/", &e), KS_E_MISMATCH);
  assert_memory_equal(&before, &other, sizeof other);
  assert_int_equal(ks_early_stop_update(&other, NAN, 0), 0); /* NaN never improves */
  assert_false(other.has_best);
  assert_int_equal(ks_early_stop_init(&other, "", KS_BEST_MAX, 1, 0, NULL), KS_E_INVALID);
  assert_int_equal(ks_early_stop_init(&other, "x", KS_BEST_MAX, 0, 0, NULL), KS_E_INVALID);
  ks_statedict_free(sd);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(keep_best_holds_after_every_save_and_across_resume),
    cmocka_unit_test(keep_best_ignores_a_corrupt_newest_after_autoresume),
    cmocka_unit_test(retention_every_and_period_policies),
    cmocka_unit_test(manager_refuses_bad_policies),
    cmocka_unit_test(keep_best_must_name_a_metric_of_the_program),
    cmocka_unit_test(a_save_keep_best_cannot_rank_is_warned_once),
    cmocka_unit_test(a_timestamp_that_never_advances_is_warned_once),
    cmocka_unit_test(async_save_writes_the_snapshot_and_equals_sync),
    cmocka_unit_test(async_busy_mode_refuses_a_second_save),
    cmocka_unit_test(async_errors_surface_once_and_leave_no_temp_file),
    cmocka_unit_test(manager_free_finishes_a_save_in_flight),
    cmocka_unit_test(async_image_takes_its_memory_before_the_first_save),
    cmocka_unit_test(async_image_saves_from_the_callers_memory),
    cmocka_unit_test(early_stop_follows_patience_and_round_trips),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
