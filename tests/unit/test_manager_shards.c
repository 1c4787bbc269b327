/*
 * The checkpoint manager over sharded directories, without MPI (the ranks'
 * files are written one after the other here): `latest`, retention (keep-N,
 * keep-best by rank 0's stored `_computed`), removal of the directories of dead
 * saves, the newest complete directory that verifies, and autoresume merged
 * onto one process. Every call goes through an I/O table that maps the
 * library's paths under a private root: the run directory's name exists only
 * there, so an operation that bypassed the table would not find it.
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

#define WORLD 2
#define RUN "ks-shards-run-b7e1" /* the library's name for the run directory; on disk under g_root */

static char g_root[512];
static long g_calls;

static const char *real(const char *p, char *buf) {
  g_calls++;
  snprintf(buf, 4096, "%s/%s", g_root, p);
  return buf;
}
#define P (ks_io_posix())
static int r_create(void *c, const char *p, int *fd) {
  char b[4096];
  (void)c;
  return P->create_fn(NULL, real(p, b), fd);
}
static int r_write(void *c, int fd, const void *buf, size_t n, size_t *w) {
  (void)c;
  return P->write_fn(NULL, fd, buf, n, w);
}
static int r_fsync(void *c, int fd) { (void)c, (void)fd; return 0; }
static int r_close(void *c, int fd) { (void)c; return P->close_fn(NULL, fd); }
static int r_rename(void *c, const char *a, const char *b) {
  char x[4096], y[4096];
  (void)c;
  return P->rename_fn(NULL, real(a, x), real(b, y));
}
static int r_unlink(void *c, const char *p) { char b[4096]; (void)c; return P->unlink_fn(NULL, real(p, b)); }
static int r_fsync_dir(void *c, const char *p) { (void)c, (void)p; return 0; }
static int r_open(void *c, const char *p, int *fd, uint64_t *n) {
  char b[4096];
  (void)c;
  return P->open_fn(NULL, real(p, b), fd, n);
}
static int r_read(void *c, int fd, void *buf, size_t n, uint64_t off, size_t *got) {
  (void)c;
  return P->read_fn(NULL, fd, buf, n, off, got);
}
static int r_map(void *c, int fd, uint64_t n, const void **a) { (void)c; return P->map_fn(NULL, fd, n, a); }
static int r_unmap(void *c, const void *a, uint64_t n) { (void)c; return P->unmap_fn(NULL, a, n); }
static int r_stat(void *c, const char *p, ks_io_stat *st) {
  char b[4096];
  (void)c;
  return P->stat_fn(NULL, real(p, b), st);
}
static int r_list(void *c, const char *d, const char *pre, ks_io_list_cb cb, void *cc) {
  char b[4096];
  (void)c;
  return P->list_fn(NULL, real(d, b), pre, cb, cc);
}
static int r_mkdir(void *c, const char *p) { char b[4096]; (void)c; return P->mkdir_fn(NULL, real(p, b)); }
static int r_symlink(void *c, const char *t, const char *p) {
  char b[4096];
  (void)c;
  return P->symlink_fn(NULL, t, real(p, b));
}
static int r_readlink(void *c, const char *p, char *buf, size_t cap, size_t *len) {
  char b[4096];
  (void)c;
  return P->readlink_fn(NULL, real(p, b), buf, cap, len);
}
static int r_rmdir(void *c, const char *p) { char b[4096]; (void)c; return P->rmdir_fn(NULL, real(p, b)); }

static const ks_io g_io = {.version = KS_IO_VERSION, .create_fn = r_create, .write_fn = r_write, .fsync_fn = r_fsync,
                           .close_fn = r_close, .rename_fn = r_rename, .unlink_fn = r_unlink,
                           .fsync_dir_fn = r_fsync_dir, .open_fn = r_open, .read_fn = r_read, .map_fn = r_map,
                           .unmap_fn = r_unmap, .stat_fn = r_stat, .list_fn = r_list, .mkdir_fn = r_mkdir,
                           .symlink_fn = r_symlink, .readlink_fn = r_readlink, .rmdir_fn = r_rmdir};

/* What one rank holds: a replicated tensor, the timestamp, and a SumMetric. */
typedef struct rank_state {
  ks_state *st;
  float w[4];
  ks_timestamp ts;
} rank_state;

static ks_status factory(void *ctx, const char *label, const ks_allocator *a, ks_metric_collection **out,
                         ks_error *err) {
  (void)ctx, (void)label;
  ks_metric *m = NULL;
  ks_status s = ks_metric_collection_create(a, out, err);
  if (!s) s = ks_metric_create("SumMetric", NULL, a, &m, err);
  if (!s && (s = ks_metric_collection_add(*out, "S", m, err)) != KS_OK) ks_metric_free(m);
  if (s) ks_metric_collection_free(*out), *out = NULL;
  return s;
}

static void rank_init(rank_state *r) {
  memset(r, 0, sizeof *r);
  ks_timestamp_init(&r->ts);
  assert_int_equal(ks_state_create("shards", 1, NULL, &r->st, NULL), KS_OK);
  int64_t shape[1] = {4};
  ks_tensor t;
  assert_int_equal(ks_tensor_init(&t, KS_F32, 1, shape, r->w), KS_OK);
  assert_int_equal(ks_state_add_tensor(r->st, "w", &t, NULL), KS_OK);
  ks_state_set_timestamp(r->st, &r->ts);
  ks_error err;
  assert_int_equal(ks_state_build_metrics(r->st, factory, NULL, NULL, 0, &err), KS_OK);
}

/* Rank r's state at `batch`: w = batch, its SumMetric fed value * (r + 1), computed (`_computed`). */
static void rank_set(rank_state *r, int rank, int64_t batch, float value) {
  for (int i = 0; i < 4; i++) r->w[i] = (float)batch + (float)i;
  r->ts.batch = batch;
  r->ts.sample = batch * 8;
  ks_metric *m = ks_metric_collection_get(ks_state_train_metrics(r->st), "S");
  ks_metric_reset(m);
  float v = value * (float)(rank + 1);
  ks_tensor t;
  assert_int_equal(ks_tensor_init(&t, KS_F32, 0, NULL, &v), KS_OK);
  assert_int_equal(ks_metric_update(m, &t, 1, NULL), KS_OK);
  const ks_tensor *c;
  assert_int_equal(ks_metric_compute(m, &c, NULL), KS_OK);
}

/* Writes rank `rank`'s file of `dir` (through the table). */
static ks_shard_file_info write_rank(const char *dir, int rank, int64_t batch, float value) {
  rank_state r;
  rank_init(&r);
  rank_set(&r, rank, batch, value);
  ks_statedict *sd;
  ks_meta *meta;
  ks_error err;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  assert_int_equal(ks_meta_create(NULL, &meta, NULL), KS_OK);
  assert_int_equal(ks_state_to_state_dict(r.st, sd, meta, &err), KS_OK);
  ks_save_opts so = {.io = &g_io};
  ks_shard_file_info info;
  int rc = g_io.mkdir_fn(NULL, dir);
  assert_true(rc == 0 || rc == EEXIST);
  assert_int_equal(ks_shard_write_rank(dir, rank, WORLD, sd, meta, NULL, NULL, 0, &so, &info, &err), KS_OK);
  ks_statedict_free(sd);
  ks_meta_free(meta);
  ks_state_free(r.st);
  return info;
}

/* One collective save, played rank after rank: begin, every file, the index, commit. */
static void save_at(ks_ckpt_manager *m, int64_t batch, float value) {
  ks_timestamp ts;
  ks_timestamp_init(&ts);
  ts.batch = batch;
  const char *dir;
  ks_error err;
  assert_int_equal(ks_ckpt_manager_dir_begin(m, &ts, &dir, NULL, &err), KS_OK);
  char *d = strdup(dir);
  ks_shard_file_info infos[WORLD];
  for (int r = 0; r < WORLD; r++) infos[r] = write_rank(d, r, batch, value);
  ks_save_opts so = {.io = &g_io};
  assert_int_equal(ks_shard_write_index(d, WORLD, infos, &so, &err), KS_OK);
  assert_int_equal(ks_ckpt_manager_dir_commit(m, d, &err), KS_OK);
  free(d);
}

static ks_ckpt_manager *manager(int keep, int keep_best) {
  ks_ckpt_opts o = {.run_dir = RUN, .keep = keep, .keep_best = keep_best, .best_metric = keep_best ? "train/S" : NULL,
                    .io = &g_io, .sharded = 1, .log = stderr};
  ks_ckpt_manager *m;
  ks_error err;
  assert_int_equal(ks_ckpt_manager_create(&o, &m, &err), KS_OK);
  return m;
}

static int on_disk(const char *name) {
  char p[4096];
  snprintf(p, sizeof p, "%s/" RUN "/%s", g_root, name);
  return ks_test_exists(p);
}

static void latest_is(const char *name) {
  char p[4096], got[256];
  snprintf(p, sizeof p, "%s/" RUN "/latest", g_root);
  ssize_t n = readlink(p, got, sizeof got - 1);
  assert_true(n > 0);
  got[n] = '\0';
  assert_string_equal(got, name);
}

static int setup(void **s) {
  (void)s;
  char *d = ks_test_tmpdir("mgr-shards");
  snprintf(g_root, sizeof g_root, "%s", d);
  free(d);
  assert_false(ks_test_exists(RUN)); /* the name means something only through the table */
  return 0;
}

static int teardown(void **s) {
  (void)s;
  ks_test_rmtree(g_root);
  return 0;
}

static void keep_n_and_latest_name_directories(void **s) {
  (void)s;
  ks_ckpt_manager *m = manager(2, 0);
  for (int b = 10; b <= 40; b += 10) save_at(m, b, 1.0f);
  assert_false(on_disk("ep0-ba10"));
  assert_false(on_disk("ep0-ba20"));
  assert_true(on_disk("ep0-ba30/" KS_SHARD_INDEX_NAME));
  assert_true(on_disk("ep0-ba40/rank-00001-of-00002.keepsake"));
  latest_is("ep0-ba40");
  rank_state r;
  rank_init(&r);
  ks_error err;
  assert_int_equal(ks_ckpt_manager_save(m, r.st, NULL, &err), KS_E_STATE); /* the ranks save, with ks_dist_ckpt_save */
  assert_int_equal(ks_ckpt_manager_save_async(m, r.st, NULL, &err), KS_E_STATE);
  ks_state_free(r.st);
  ks_ckpt_manager_free(m);
}

static void keep_best_ranks_by_the_stored_result(void **s) {
  (void)s;
  ks_ckpt_manager *m = manager(1, 1);
  save_at(m, 10, 3.0f);
  save_at(m, 20, 9.0f); /* the best */
  save_at(m, 30, 2.0f);
  save_at(m, 40, 1.0f); /* the newest */
  assert_true(on_disk("ep0-ba20"));
  assert_true(on_disk("ep0-ba40"));
  assert_false(on_disk("ep0-ba10"));
  assert_false(on_disk("ep0-ba30"));
  ks_ckpt_manager_free(m);
}

static void a_dead_save_is_removed_and_never_resumed(void **s) {
  (void)s;
  ks_ckpt_manager *m = manager(0, 0);
  save_at(m, 10, 1.0f);
  write_rank(RUN "/ep0-ba20", 0, 20, 1.0f); /* rank 1 died: no index */
  const char *dir;
  ks_error err;
  assert_int_equal(ks_ckpt_manager_dir_latest(m, &dir, &err), KS_OK);
  assert_non_null(dir);
  assert_string_equal(dir, RUN "/ep0-ba10");
  assert_false(on_disk("ep0-ba20")); /* removed: a directory without an index is not a checkpoint */
  write_rank(RUN "/ep0-ba30", 1, 30, 1.0f);
  ks_timestamp ts;
  ks_timestamp_init(&ts);
  ts.batch = 40;
  size_t removed = 0;
  assert_int_equal(ks_ckpt_manager_dir_begin(m, &ts, &dir, &removed, &err), KS_OK);
  assert_int_equal(removed, 1);
  assert_false(on_disk("ep0-ba30"));
  assert_string_equal(dir, RUN "/ep0-ba40");
  ks_ckpt_manager_free(m);
}

static void a_corrupt_shard_is_skipped(void **s) {
  (void)s;
  ks_ckpt_manager *m = manager(0, 0);
  save_at(m, 10, 1.0f);
  save_at(m, 20, 1.0f);
  char p[4096];
  snprintf(p, sizeof p, "%s/" RUN "/ep0-ba20/rank-00001-of-00002.keepsake", g_root);
  size_t n;
  uint8_t *bytes = ks_test_read_file(p, &n);
  assert_non_null(bytes);
  bytes[n - 3] ^= 0x40;
  assert_int_equal(ks_test_write_file(p, bytes, n), 0);
  free(bytes);
  const char *dir;
  ks_error err;
  assert_int_equal(ks_ckpt_manager_dir_latest(m, &dir, &err), KS_OK);
  assert_string_equal(dir, RUN "/ep0-ba10");
  assert_int_equal(ks_ckpt_manager_skipped(m), 1);
  ks_ckpt_manager_free(m);
}

static void autoresume_merges_the_ranks_onto_one_process(void **s) {
  (void)s;
  ks_ckpt_manager *m = manager(0, 0);
  save_at(m, 10, 1.0f);
  save_at(m, 20, 2.0f);
  rank_state r;
  rank_init(&r);
  int resumed = 0;
  const char *path = NULL;
  ks_error err;
  long before = g_calls;
  assert_int_equal(ks_ckpt_manager_autoresume(m, r.st, NULL, NULL, &resumed, &path, &err), KS_OK);
  assert_true(g_calls > before);
  assert_int_equal(resumed, 1);
  assert_string_equal(path, RUN "/ep0-ba20");
  assert_int_equal(r.ts.batch, 20);
  assert_true(r.w[3] == 23.0f);
  const ks_tensor *t;
  ks_metric *sm = ks_metric_collection_get(ks_state_train_metrics(r.st), "S");
  assert_int_equal(ks_metric_update_count(sm), WORLD);
  assert_int_equal(ks_metric_compute(sm, &t, NULL), KS_OK);
  assert_true(*(const float *)t->data == 2.0f * 1 + 2.0f * 2); /* rank 0's 2 plus rank 1's 4 */
  ks_state_free(r.st);
  ks_ckpt_manager_free(m);
}

/* Every allocation of the manager failing in turn: an error (KS_E_NOMEM) or success, and no leak. */
static void allocation_failures_are_reported_and_nothing_leaks(void **s) {
  (void)s;
  ks_ckpt_manager *m0 = manager(0, 0);
  save_at(m0, 10, 1.0f);
  save_at(m0, 20, 2.0f);
  ks_ckpt_manager_free(m0);
  int clean = 0;
  for (long n = 1; !clean && n < 5000; n++) {
    if (!on_disk("ep0-ba30")) write_rank(RUN "/ep0-ba30", 0, 30, 1.0f); /* a dead save, again once removed */
    ks_test_alloc ta;
    ks_test_alloc_init(&ta, n);
    ks_ckpt_opts o = {.run_dir = RUN, .io = &g_io, .sharded = 1, .alloc = &ta.a, .log = stderr};
    ks_ckpt_manager *m = NULL;
    ks_error err;
    ks_status st = ks_ckpt_manager_create(&o, &m, &err);
    const char *dir = NULL;
    if (!st) st = ks_ckpt_manager_dir_latest(m, &dir, &err);
    if (!st) assert_string_equal(dir, RUN "/ep0-ba20");
    ks_timestamp ts;
    ks_timestamp_init(&ts);
    ts.batch = 40;
    if (!st) st = ks_ckpt_manager_dir_begin(m, &ts, &dir, NULL, &err);
    if (!st) st = ks_ckpt_manager_dir_commit(m, RUN "/ep0-ba20", &err);
    rank_state r;
    rank_init(&r);
    int resumed = 0;
    if (!st) st = ks_ckpt_manager_autoresume(m, r.st, NULL, NULL, &resumed, NULL, &err);
    if (!st) assert_int_equal(r.ts.batch, 20);
    assert_true(st == KS_OK || st == KS_E_NOMEM);
    ks_state_free(r.st);
    ks_ckpt_manager_free(m);
    assert_int_equal(ta.live, 0);
    clean = st == KS_OK && ta.calls < n;
  }
  assert_true(clean);
}

static void a_file_manager_refuses_directory_calls(void **s) {
  (void)s;
  ks_ckpt_opts o = {.run_dir = RUN, .io = &g_io};
  ks_ckpt_manager *m;
  ks_error err;
  assert_int_equal(ks_ckpt_manager_create(&o, &m, &err), KS_OK);
  const char *dir;
  ks_timestamp ts;
  ks_timestamp_init(&ts);
  assert_int_equal(ks_ckpt_manager_dir_begin(m, &ts, &dir, NULL, &err), KS_E_STATE);
  assert_int_equal(ks_ckpt_manager_dir_latest(m, &dir, &err), KS_E_STATE);
  ks_ckpt_manager_free(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(keep_n_and_latest_name_directories, setup, teardown),
      cmocka_unit_test_setup_teardown(keep_best_ranks_by_the_stored_result, setup, teardown),
      cmocka_unit_test_setup_teardown(a_dead_save_is_removed_and_never_resumed, setup, teardown),
      cmocka_unit_test_setup_teardown(a_corrupt_shard_is_skipped, setup, teardown),
      cmocka_unit_test_setup_teardown(autoresume_merges_the_ranks_onto_one_process, setup, teardown),
      cmocka_unit_test_setup_teardown(allocation_failures_are_reported_and_nothing_leaks, setup, teardown),
      cmocka_unit_test_setup_teardown(a_file_manager_refuses_directory_calls, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
