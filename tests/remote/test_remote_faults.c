/*
 * The checkpoint manager on S3 (moto) through the fault proxy: 500/503 answers,
 * stalls, truncated bodies and dropped connections, during uploads (of a
 * checkpoint, of its multipart parts, of the `latest` pointer) and downloads
 * (autoresume), both straight to a remote run directory and in the "save
 * locally, then upload" mode. After every fault:
 *   - no data loss: every checkpoint committed before is still there and verifies;
 *   - no half-written object under a checkpoint's name: every object named like
 *     a checkpoint fully verifies (checksums), read straight from moto;
 *   - `latest` names a checkpoint that verifies;
 *   - a fault that the retries outlast is invisible (the save or resume succeeds),
 *     a persistent one is a clear KS_E_IO error (never a fresh start on resume).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "keepsake/layout.h"
#include "keepsake/manager.h"
#include "keepsake/state.h"
#include "keepsake/storage.h"
#include "remoteenv.h"
#include "testutil.h"

#define BUCKET "faults"

typedef struct prog {
  float *w;
  int64_t shape[1];
  ks_timestamp ts;
  ks_state *st;
} prog;

static void prog_init(prog *p, int64_t n) {
  memset(p, 0, sizeof *p);
  p->shape[0] = n;
  p->w = calloc((size_t)n, sizeof(float));
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
  for (int64_t i = 0; i < p->shape[0]; i++) p->w[i] = (float)(b * 1000 + i % 977);
}

static void prog_free(prog *p) {
  ks_state_free(p->st);
  free(p->w);
}

/* One case: a fresh prefix, storage through the proxy (short timeouts, quick retries) and straight to moto. */
typedef struct rcase {
  char prefix[128];
  char *local; /* upload mode's run dir; NULL in direct mode */
  ks_storage *via, *direct;
  ks_ckpt_manager *m;
  FILE *log;
} rcase;

static int g_seq;

static ks_storage *open_s3(const char *endpoint, const char *prefix, uint64_t threshold) {
  char url[256];
  snprintf(url, sizeof url, "s3://" BUCKET "/%s", prefix);
  ks_storage_opts o = {.endpoint = endpoint, .max_retries = 3, .retry_base_ms = 5, .timeout_ms = 1500,
                       .multipart_threshold = threshold, .part_size = 5u << 20};
  ks_storage *st = NULL;
  ks_error e;
  ks_error_clear(&e);
  if (ks_storage_open(url, &o, &st, &e)) fail_msg("open %s: %s", url, e.message);
  return st;
}

static void case_open(rcase *c, int upload_mode, uint64_t threshold) {
  memset(c, 0, sizeof *c);
  assert_int_equal(ks_test_remote_faults_clear(), 0); /* a failed case before may have left its rules */
  snprintf(c->prefix, sizeof c->prefix, "c%d-%ld", ++g_seq, (long)getpid());
  c->via = open_s3(ks_test_remote("KS_TEST_PROXY_S3"), c->prefix, threshold);
  c->direct = open_s3(ks_test_remote("KS_TEST_S3_ENDPOINT"), c->prefix, threshold);
  c->log = tmpfile();
  if (upload_mode) c->local = ks_test_tmpdir("remote-faults");
}

static ks_ckpt_manager *case_manager(rcase *c) {
  ks_ckpt_opts co = {.save_interval = "10ba", .log = c->log};
  if (c->local) {
    co.run_dir = c->local;
    co.io = ks_test_io_nosync();
    co.upload_io = ks_storage_io(c->via);
    co.upload_dir = ks_storage_path(c->via);
  } else {
    co.run_dir = ks_storage_path(c->via);
    co.io = ks_storage_io(c->via);
  }
  ks_ckpt_manager *m = NULL;
  ks_error e;
  ks_error_clear(&e);
  if (ks_ckpt_manager_create(&co, &m, &e)) fail_msg("manager: %s", e.message);
  return m;
}

static void case_close(rcase *c) {
  ks_ckpt_manager_free(c->m);
  ks_storage_free(c->via);
  ks_storage_free(c->direct);
  if (c->local) {
    ks_test_rmtree(c->local);
    free(c->local);
  }
  fclose(c->log);
  assert_int_equal(ks_test_remote_faults_clear(), 0);
}

static void name_of(int64_t b, char *buf, size_t cap) {
  snprintf(buf, cap, "ep%lld-ba%lld.keepsake", (long long)(b / 10), (long long)b);
}

/* Loads prefix/name straight from moto with every checksum verified; returns its batch or -1. */
static int64_t verified_batch(rcase *c, const char *name) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", ks_storage_path(c->direct), name);
  ks_read_opts ro = {.verify_checksums = 1, .io = ks_storage_io(c->direct)};
  ks_statedict *sd = NULL;
  ks_meta *meta = NULL;
  ks_error e;
  ks_error_clear(&e);
  if (ks_load(path, &ro, &sd, &meta, &e)) {
    print_message("%s does not verify: %s\n", path, e.message);
    return -1;
  }
  ks_entry ent;
  int64_t b = -1;
  if (!ks_statedict_get(sd, KS_KEY_TIMESTAMP "batch", &ent) && ent.kind == KS_VAL_INT) b = ent.i;
  ks_statedict_free(sd);
  ks_meta_free(meta);
  return b;
}

typedef struct listing {
  char names[64][128];
  int n;
} listing;

static int on_entry(void *ctx, const char *name, ks_io_kind kind) {
  listing *l = ctx;
  (void)kind;
  if (l->n < 64) snprintf(l->names[l->n++], sizeof l->names[0], "%s", name);
  return 0;
}

/* What `latest` names in moto, or "" when there is none. */
static const char *remote_latest(rcase *c, char *buf, size_t cap) {
  const ks_io *io = ks_storage_io(c->direct);
  char path[512];
  size_t len = 0;
  snprintf(path, sizeof path, "%s/latest", ks_storage_path(c->direct));
  if (io->readlink_fn(io->ctx, path, buf, cap, &len)) buf[0] = '\0';
  return buf;
}

/*
 * The invariants, read straight from moto: every object named like a checkpoint verifies, the
 * batches in `committed` (0-terminated) are all there, and `latest` names want_latest.
 */
static void check_remote(rcase *c, const int64_t *committed, int64_t want_latest) {
  listing l = {.n = 0};
  const ks_io *io = ks_storage_io(c->direct);
  assert_int_equal(io->list_fn(io->ctx, ks_storage_path(c->direct), "", on_entry, &l), 0);
  for (int i = 0; i < l.n; i++) {
    size_t n = strlen(l.names[i]);
    if (n > 9 && !strcmp(l.names[i] + n - 9, ".keepsake") && verified_batch(c, l.names[i]) < 0)
      fail_msg("%s/%s is named as a checkpoint but does not verify", c->prefix, l.names[i]);
    assert_null(strstr(l.names[i], ".tmp")); /* staging names never reach the store */
  }
  for (const int64_t *b = committed; *b; b++) {
    char name[64];
    name_of(*b, name, sizeof name);
    if (verified_batch(c, name) != *b) fail_msg("committed checkpoint %s is lost", name);
  }
  char buf[256], want[64];
  name_of(want_latest, want, sizeof want);
  assert_string_equal(remote_latest(c, buf, sizeof buf), want);
}

static ks_status save_at(rcase *c, prog *p, int64_t b, ks_error *e) {
  prog_step(p, b);
  ks_error_clear(e);
  return ks_ckpt_manager_save(c->m, p->st, NULL, e);
}

/* A rule with its action spelled "%s" in `rule`, so the JSON stays readable. */
static void set_faults(const char *rule, const char *action) {
  char json[1024];
  const char *at = strstr(rule, "%s");
  assert_non_null(at);
  snprintf(json, sizeof json, "%.*s%s%s", (int)(at - rule), rule, action, at + 2);
  assert_int_equal(ks_test_remote_faults(json), 0);
}

/* An upload fault on the second checkpoint's object: transient (times) then persistent. */
static void upload_fault(int upload_mode, const char *rule, int may_land) {
  rcase c;
  prog p;
  ks_error e;
  case_open(&c, upload_mode, 0);
  c.m = case_manager(&c);
  prog_init(&p, 4096);
  assert_int_equal(save_at(&c, &p, 10, &e), KS_OK);
  /* transient: the first two matching requests fail, the retries get through */
  char json[1024];
  snprintf(json, sizeof json, "[%s]", rule);
  char *times = strstr(json, "\"times\":0");
  assert_non_null(times);
  times[8] = strstr(rule, "stall") ? '1' : '2';
  assert_int_equal(ks_test_remote_faults(json), 0);
  if (save_at(&c, &p, 20, &e)) {
    char detail[1024];
    ks_storage_last_error(c.via, detail, sizeof detail);
    fail_msg("transient %s: %s [%s]", rule, e.message, detail);
  }
  check_remote(&c, (const int64_t[]){10, 20, 0}, 20);
  assert_int_equal(ks_test_remote_faults_clear(), 0);
  int stall = strstr(rule, "stall") != NULL;
  if (stall) goto done; /* a stalled upload still lands (the proxy forwards it late): only ever retried */
  /* persistent: more failures than retries */
  times[8] = '9';
  assert_int_equal(ks_test_remote_faults(json), 0);
  assert_int_equal(save_at(&c, &p, 30, &e), KS_E_IO);
  assert_non_null(strstr(e.message, upload_mode ? "upload of" : "ep3-ba30"));
  check_remote(&c, (const int64_t[]){10, 20, 0}, 20);
  char name[64];
  name_of(30, name, sizeof name);
  /* Not there at all, unless moto got the whole body (then check_remote verified it). */
  if (!may_land) assert_int_equal(verified_batch(&c, name), -1);
  if (upload_mode) { /* the local checkpoint is saved regardless */
    char *lp = ks_test_path(c.local, name);
    assert_true(ks_test_exists(lp));
    free(lp);
  }
done:
  assert_int_equal(ks_test_remote_faults_clear(), 0);
  assert_int_equal(save_at(&c, &p, 40, &e), KS_OK); /* and the store works again */
  check_remote(&c, (const int64_t[]){10, 20, 40, 0}, 40);
  prog_free(&p);
  case_close(&c);

}

#define PUT_RULE(action, extra)                                                                           \
  "{\"target\":\"s3\",\"method\":\"PUT\",\"path_re\":\"/ep[0-9]+-ba[0-9]+\\\\.keepsake$\",\"action\":\"" action \
  "\"" extra ",\"times\":0}"

/* Each rule, and whether moto may end up with the whole object although the client saw a failure. */
static const struct {
  const char *rule;
  int may_land;
} UPLOAD_RULES[] = {
    {PUT_RULE("status", ",\"status\":503"), 0},
    {PUT_RULE("status", ",\"status\":500"), 0},
    {PUT_RULE("drop", ",\"after_bytes\":1000"), 0},
    {PUT_RULE("truncate", ",\"after_bytes\":5000"), 0},
    {PUT_RULE("stall", ",\"after_bytes\":2000,\"stall_ms\":4000"), 1}, /* forwarded late */
    /* the whole body goes through, the connection drops before the answer */
    {PUT_RULE("drop", ",\"phase\":\"request\",\"after_bytes\":1000000000"), 1},
};

static void upload_faults_direct(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof UPLOAD_RULES / sizeof *UPLOAD_RULES; i++)
    upload_fault(0, UPLOAD_RULES[i].rule, UPLOAD_RULES[i].may_land);
}

static void upload_faults_save_then_upload(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof UPLOAD_RULES / sizeof *UPLOAD_RULES; i++)
    upload_fault(1, UPLOAD_RULES[i].rule, UPLOAD_RULES[i].may_land);
}

/* The `latest` pointer's PUT fails for good: the checkpoint is whole, latest still names the previous one. */
static void latest_pointer_fault(int upload_mode) {
  rcase c;
  prog p;
  ks_error e;
  case_open(&c, upload_mode, 0);
  c.m = case_manager(&c);
  prog_init(&p, 1024);
  assert_int_equal(save_at(&c, &p, 10, &e), KS_OK);
  set_faults("[{\"target\":\"s3\",\"method\":\"PUT\",\"path_re\":\"/latest$\",\"action\":\"%s\",\"status\":503}]",
             "status");
  assert_int_equal(save_at(&c, &p, 20, &e), KS_E_IO);
  check_remote(&c, (const int64_t[]){10, 20, 0}, 10);
  assert_int_equal(ks_test_remote_faults_clear(), 0);
  assert_int_equal(save_at(&c, &p, 30, &e), KS_OK);
  check_remote(&c, (const int64_t[]){10, 20, 30, 0}, 30);
  prog_free(&p);
  case_close(&c);
}

static void latest_pointer_faults(void **state) {
  (void)state;
  latest_pointer_fault(0);
  latest_pointer_fault(1);
}

/* Multipart: a 12 MiB checkpoint in 5 MiB parts; part 2 fails transiently, then for good. */
static void multipart_faults(void **state) {
  (void)state;
  rcase c;
  prog p;
  ks_error e;
  case_open(&c, 0, 6u << 20);
  c.m = case_manager(&c);
  prog_init(&p, 3 << 20); /* 12 MiB of float32 */
  const char *rule = "[{\"target\":\"s3\",\"method\":\"PUT\",\"query_re\":\"partNumber=2\",\"action\":\"%s\","
                     "\"after_bytes\":100000,\"times\":2}]";
  set_faults(rule, "drop");
  if (save_at(&c, &p, 10, &e)) fail_msg("multipart with a transient fault: %s", e.message);
  check_remote(&c, (const int64_t[]){10, 0}, 10);
  assert_int_equal(ks_test_remote_faults_clear(), 0);
  set_faults("[{\"target\":\"s3\",\"method\":\"PUT\",\"query_re\":\"partNumber=2\",\"action\":\"%s\","
             "\"status\":503}]",
             "status");
  assert_int_equal(save_at(&c, &p, 20, &e), KS_E_IO);
  check_remote(&c, (const int64_t[]){10, 0}, 10);
  assert_int_equal(ks_test_remote_faults_clear(), 0);
  /* the failed multipart upload was aborted: moto lists no upload in progress */
  char cmd[1024], *out = NULL;
  snprintf(cmd, sizeof cmd,
           "curl -sS --fail-with-body --aws-sigv4 'aws:amz:%s:s3' --user '%s:%s' '%s/" BUCKET "?uploads&prefix=%s/'",
           ks_test_remote("AWS_REGION"), ks_test_remote("AWS_ACCESS_KEY_ID"), ks_test_remote("AWS_SECRET_ACCESS_KEY"),
           ks_test_remote("KS_TEST_S3_ENDPOINT"), c.prefix);
  assert_int_equal(ks_test_run(cmd, &out), 0);
  assert_non_null(strstr(out, "ListMultipartUploadsResult"));
  if (strstr(out, "<Upload>")) fail_msg("a multipart upload was left behind: %s", out);
  free(out);
  prog_free(&p);
  case_close(&c);
}

/* Autoresume with an empty local side, a fault on the GETs of the newest checkpoint. */
static void download_fault(int upload_mode, const char *action_extra, int times, int expect_ok) {
  rcase c;
  prog p, q;
  ks_error e;
  case_open(&c, upload_mode, 0);
  c.m = case_manager(&c);
  prog_init(&p, 4096);
  assert_int_equal(save_at(&c, &p, 10, &e), KS_OK);
  assert_int_equal(save_at(&c, &p, 20, &e), KS_OK);
  ks_ckpt_manager_free(c.m);
  if (c.local) ks_test_rmtree(c.local);
  char json[1024];
  snprintf(json, sizeof json,
           "[{\"target\":\"s3\",\"method\":\"GET\",\"path_re\":\"/ep2-ba20\\\\.keepsake$\",%s,\"times\":%d}]",
           action_extra, times);
  assert_int_equal(ks_test_remote_faults(json), 0);
  c.m = case_manager(&c);
  prog_init(&q, 4096);
  int resumed = 0;
  ks_error_clear(&e);
  ks_status s = ks_ckpt_manager_autoresume(c.m, q.st, NULL, NULL, &resumed, NULL, &e);
  if (expect_ok) {
    if (s) fail_msg("autoresume under %s x%d: %s", action_extra, times, e.message);
    assert_int_equal(resumed, 1);
    assert_int_equal(q.ts.batch, 20);
    assert_true(q.w[5] == (float)(20 * 1000 + 5));
  } else {
    assert_int_equal(s, KS_E_IO); /* never a fresh start, never the older checkpoint */
    assert_int_equal(resumed, 0);
    assert_non_null(strstr(e.message, "ep2-ba20"));
  }
  assert_int_equal(ks_test_remote_faults_clear(), 0);
  check_remote(&c, (const int64_t[]){10, 20, 0}, 20); /* a failed download changes nothing upstream */
  prog_free(&q);
  prog_free(&p);
  case_close(&c);
}

static const char *const DOWNLOAD_FAULTS[] = {
    "\"action\":\"status\",\"status\":503",
    "\"action\":\"status\",\"status\":500",
    "\"action\":\"truncate\"",
    "\"action\":\"drop\"",
    "\"action\":\"drop\",\"phase\":\"request\"",
    "\"action\":\"stall\",\"after_bytes\":100,\"stall_ms\":4000",
};

static void download_faults(int upload_mode) {
  for (size_t i = 0; i < sizeof DOWNLOAD_FAULTS / sizeof *DOWNLOAD_FAULTS; i++) {
    download_fault(upload_mode, DOWNLOAD_FAULTS[i], 2, 1);
    if (i < 2) download_fault(upload_mode, DOWNLOAD_FAULTS[i], 99, 0);
  }
  /* The header reads fine (the probe), then every read of the data fails: still an error, and the
   * good checkpoint is not set aside as corrupt (check_remote finds it under its name). */
  download_fault(upload_mode, "\"action\":\"status\",\"status\":500,\"skip\":1", 99, 0);
}

static void download_faults_direct(void **state) {
  (void)state;
  download_faults(0);
}

static void download_faults_save_then_upload(void **state) {
  (void)state;
  download_faults(1);
}

static int group_setup(void **state) {
  (void)state;
  if (ks_test_remote_env_load() || ks_test_remote_bucket(BUCKET)) return -1;
  return ks_test_remote_faults_clear();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(upload_faults_direct),          cmocka_unit_test(upload_faults_save_then_upload),
      cmocka_unit_test(latest_pointer_faults),         cmocka_unit_test(multipart_faults),
      cmocka_unit_test(download_faults_direct),        cmocka_unit_test(download_faults_save_then_upload),
  };
  return cmocka_run_group_tests(tests, group_setup, NULL);
}
