/*
 * The S3 and HTTP storage backends against the test servers (fixture
 * remote_servers): moto_server for S3, nginx for HTTP with Range, and the fault
 * proxy in front of both. Each test uses its own bucket.
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
#include <jansson.h>

#include "keepsake/keepsake.h"
#include "remoteenv.h"
#include "testutil.h"

/* ---- helpers ---- */

static int setup(void **state) {
  (void)state;
  return ks_test_remote_env_load() || ks_test_remote_faults_clear();
}

/* The request timeout of the next open_s3: long, so that a slow moto on a loaded machine is never
   taken for a fault; the stall test shortens it to see a stalled transfer time out. */
static long g_timeout_ms = 20000;

static ks_storage *open_s3(const char *bucket, const char *prefix, int via_proxy, uint64_t threshold) {
  char loc[512];
  assert_int_equal(ks_test_remote_bucket(bucket), 0);
  snprintf(loc, sizeof loc, "s3://%s/%s", bucket, prefix);
  ks_storage_opts o = KS_OPTS_INIT(ks_storage_opts);
  o.endpoint = ks_test_remote(via_proxy ? "KS_TEST_PROXY_S3" : "KS_TEST_S3_ENDPOINT");
  o.retry_base_ms = 5; /* fast retries: the backoff itself is not what is tested */
  o.timeout_ms = g_timeout_ms;
  o.multipart_threshold = threshold;
  o.part_size = 5u << 20; /* S3's (and moto's) smallest part */
  o.parallel = 3;
  ks_storage *st = NULL;
  ks_error e;
  assert_int_equal(ks_storage_open(loc, &o, &st, &e), KS_OK);
  return st;
}

/* A staged write committed by rename, the way the writers do it. */
static int put(const ks_io *io, const char *path, const void *data, size_t n) {
  char tmp[1024];
  int fd, rc;
  size_t w = 0;
  snprintf(tmp, sizeof tmp, "%s.tmp-stage", path);
  const char *slash = strrchr(path, '/');
  snprintf(tmp, sizeof tmp, "%.*s.%s.tmp-AAAAAA", slash ? (int)(slash - path + 1) : 0, path, slash ? slash + 1 : path);
  if ((rc = io->create_fn(io->ctx, tmp, &fd)) != 0) return rc;
  if (n && (rc = io->write_fn(io->ctx, fd, data, n, &w)) != 0) return rc;
  if ((rc = io->close_fn(io->ctx, fd)) != 0) return rc;
  return io->rename_fn(io->ctx, tmp, path);
}

static uint8_t *get(const ks_io *io, const char *path, size_t *n, int *rc) {
  int fd;
  uint64_t size;
  *rc = io->open_fn(io->ctx, path, &fd, &size);
  if (*rc) return NULL;
  uint8_t *b = malloc(size ? size : 1);
  size_t got = 0;
  *rc = io->read_fn(io->ctx, fd, b, size, 0, &got);
  io->close_fn(io->ctx, fd);
  *n = got;
  return b;
}

typedef struct names {
  char v[32][256];
  int kind[32];
  int n;
} names;

static int collect(void *ctx, const char *name, ks_io_kind kind) {
  names *l = ctx;
  if (l->n < 32) {
    snprintf(l->v[l->n], sizeof l->v[0], "%s", name);
    l->kind[l->n++] = (int)kind;
  }
  return 0;
}

static int has(const names *l, const char *name) {
  for (int i = 0; i < l->n; i++)
    if (!strcmp(l->v[i], name)) return 1;
  return 0;
}

/* The bucket's unfinished multipart uploads, asked of moto directly (ListMultipartUploads). */
static int open_uploads(const char *bucket) {
  char cmd[1024], *out = NULL;
  snprintf(cmd, sizeof cmd,
           "curl -sS --fail-with-body --aws-sigv4 'aws:amz:%s:s3' --user '%s:%s' '%s/%s?uploads='",
           ks_test_remote("AWS_REGION"), ks_test_remote("AWS_ACCESS_KEY_ID"), ks_test_remote("AWS_SECRET_ACCESS_KEY"),
           ks_test_remote("KS_TEST_S3_ENDPOINT"), bucket);
  assert_int_equal(ks_test_run(cmd, &out), 0);
  assert_non_null(strstr(out, "ListMultipartUploadsResult"));
  int n = 0;
  for (const char *p = out; (p = strstr(p, "<Upload>")) != NULL; p++) n++;
  free(out);
  return n;
}

/* Requests of the proxy log with this method whose path, query or Range header contains needle. */
static int logged(const char *method, const char *needle) {
  char *text = ks_test_remote_log();
  assert_non_null(text);
  json_t *log = json_loads(text, 0, NULL);
  free(text);
  assert_true(json_is_array(log));
  int n = 0;
  size_t i;
  json_t *r;
  json_array_foreach(log, i, r) {
    const char *m = json_string_value(json_object_get(r, "method"));
    const char *f[] = {json_string_value(json_object_get(r, "path")), json_string_value(json_object_get(r, "query")),
                       json_string_value(json_object_get(r, "range"))};
    int hit = 0;
    for (int k = 0; k < 3; k++) hit |= f[k] && strstr(f[k], needle);
    n += m && !strcmp(m, method) && hit;
  }
  json_decref(log);
  return n;
}

static ks_statedict *sample_dict(size_t nfloats, float seed) {
  ks_statedict *sd;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  float *w = malloc(nfloats * sizeof *w);
  for (size_t i = 0; i < nfloats; i++) w[i] = seed + (float)i * 0.25f;
  int64_t shape[1] = {(int64_t)nfloats};
  ks_tensor t;
  assert_int_equal(ks_tensor_init(&t, KS_F32, 1, shape, w), KS_OK);
  assert_int_equal(ks_statedict_set_tensor(sd, "model/w", &t, KS_COPY, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_int(sd, "step", 7, NULL), KS_OK);
  free(w);
  return sd;
}

/* ---- object round trips ---- */

static void put_get_list_stat_delete(void **state) {
  (void)state;
  ks_storage *st = open_s3("ks-roundtrip", "run", 0, 0);
  const ks_io *io = ks_storage_io(st);
  assert_true(ks_storage_is_remote(st));
  assert_string_equal(ks_storage_path(st), "run");
  assert_int_equal(put(io, "run/a.bin", "hello, world", 12), 0);
  assert_int_equal(put(io, "run/sub/b.bin", "x", 1), 0);
  assert_int_equal(put(io, "run/empty", "", 0), 0);
  size_t n;
  int rc;
  uint8_t *b = get(io, "run/a.bin", &n, &rc);
  assert_int_equal(rc, 0);
  assert_int_equal(n, 12);
  assert_memory_equal(b, "hello, world", 12);
  free(b);
  /* a range in the middle */
  int fd;
  uint64_t size;
  char mid[5] = {0};
  size_t got;
  assert_int_equal(io->open_fn(io->ctx, "run/a.bin", &fd, &size), 0);
  assert_int_equal(io->read_fn(io->ctx, fd, mid, 4, 7, &got), 0);
  assert_int_equal(got, 4);
  assert_string_equal(mid, "worl");
  assert_int_equal(io->read_fn(io->ctx, fd, mid, 4, 12, &got), 0);
  assert_int_equal(got, 0); /* at the end */
  assert_int_equal(io->close_fn(io->ctx, fd), 0);
  ks_io_stat s;
  assert_int_equal(io->stat_fn(io->ctx, "run/a.bin", &s), 0);
  assert_int_equal(s.kind, KS_IO_FILE);
  assert_int_equal(s.size, 12);
  assert_int_equal(io->stat_fn(io->ctx, "run/sub", &s), 0);
  assert_int_equal(s.kind, KS_IO_DIR);
  assert_int_equal(io->stat_fn(io->ctx, "run/nope", &s), ENOENT);
  names l = {0};
  assert_int_equal(io->list_fn(io->ctx, "run", "", collect, &l), 0);
  assert_int_equal(l.n, 3);
  assert_true(has(&l, "a.bin") && has(&l, "empty") && has(&l, "sub"));
  memset(&l, 0, sizeof l);
  assert_int_equal(io->list_fn(io->ctx, "run", "e", collect, &l), 0);
  assert_int_equal(l.n, 1);
  assert_string_equal(l.v[0], "empty");
  /* nothing of a staged file is visible before its rename, and unlink drops it */
  assert_int_equal(io->create_fn(io->ctx, "run/.c.tmp-BBBBBB", &fd), 0);
  assert_int_equal(io->write_fn(io->ctx, fd, "zz", 2, &got), 0);
  assert_int_equal(io->close_fn(io->ctx, fd), 0);
  assert_int_equal(io->stat_fn(io->ctx, "run/.c.tmp-BBBBBB", &s), ENOENT);
  assert_int_equal(io->unlink_fn(io->ctx, "run/.c.tmp-BBBBBB"), 0);
  assert_int_equal(io->rename_fn(io->ctx, "run/.c.tmp-BBBBBB", "run/c"), ENOENT);
  /* pointers */
  assert_int_equal(io->symlink_fn(io->ctx, "a.bin", "run/.latest.tmp"), 0);
  assert_int_equal(io->rename_fn(io->ctx, "run/.latest.tmp", "run/latest"), 0);
  char target[256];
  size_t tl;
  assert_int_equal(io->readlink_fn(io->ctx, "run/latest", target, sizeof target, &tl), 0);
  assert_string_equal(target, "a.bin");
  assert_int_equal(io->stat_fn(io->ctx, "run/latest", &s), 0);
  assert_int_equal(s.kind, KS_IO_LINK);
  assert_int_equal(io->readlink_fn(io->ctx, "run/a.bin", target, sizeof target, &tl), EINVAL);
  /* a server-side rename (what autoresume does to a damaged checkpoint) */
  assert_int_equal(io->rename_fn(io->ctx, "run/empty", "run/empty.corrupt"), 0);
  assert_int_equal(io->stat_fn(io->ctx, "run/empty", &s), ENOENT);
  assert_int_equal(io->stat_fn(io->ctx, "run/empty.corrupt", &s), 0);
  /* delete */
  assert_int_equal(io->unlink_fn(io->ctx, "run/a.bin"), 0);
  assert_int_equal(io->open_fn(io->ctx, "run/a.bin", &fd, &size), ENOENT);
  char detail[512];
  assert_true(ks_storage_last_error(st, detail, sizeof detail) > 0);
  assert_non_null(strstr(detail, "HTTP 404"));
  assert_non_null(strstr(detail, "/ks-roundtrip/run/a.bin"));
  ks_storage_free(st);
}

static int count(void *ctx, const char *name, ks_io_kind kind) {
  int *c = ctx;
  c[0]++;
  c[1] += kind != KS_IO_FILE || strncmp(name, "k", 1);
  return 0;
}

/* Listing pages through continuation tokens: moto answers 1000 keys a page, so 1100 keys take two. */
static void list_many_pages(void **state) {
  (void)state;
  ks_storage *st = open_s3("ks-pages", "", 0, 0);
  const ks_io *io = ks_storage_io(st);
  assert_string_equal(ks_storage_path(st), ".");
  char name[64];
  for (int i = 0; i < 1100; i++) {
    snprintf(name, sizeof name, "./k%04d", i);
    assert_int_equal(put(io, name, "v", 1), 0);
  }
  ks_storage_free(st);
  st = open_s3("ks-pages", "", 1, 0); /* the listing through the proxy, to count its pages */
  io = ks_storage_io(st);
  assert_int_equal(ks_test_remote_log_clear(), 0);
  int c[2] = {0, 0};
  assert_int_equal(io->list_fn(io->ctx, ".", "k", count, c), 0);
  assert_int_equal(c[0], 1100);
  assert_int_equal(c[1], 0);
  assert_int_equal(logged("GET", "list-type=2"), 2);
  assert_int_equal(logged("GET", "continuation-token="), 1);
  ks_storage_free(st);
}

/* ---- the library through the table ---- */

static void save_then_read_s3_and_http(void **state) {
  (void)state;
  ks_storage *st = open_s3("ks-save", "ckpt", 0, 0);
  ks_statedict *sd = sample_dict(1000, 1.0f);
  ks_save_opts so = KS_OPTS_INIT(ks_save_opts);
  so.io = ks_storage_io(st);
  ks_error e;
  assert_int_equal(ks_save("ckpt/one.keepsake", sd, NULL, &so, &e), KS_OK);
  ks_read_opts ro = KS_OPTS_INIT(ks_read_opts);
  ro.io = ks_storage_io(st);
  ro.verify_checksums = 1;
  ks_statedict *back = NULL;
  ks_meta *meta = NULL;
  assert_int_equal(ks_load("ckpt/one.keepsake", &ro, &back, &meta, &e), KS_OK);
  const ks_tensor *a = ks_statedict_tensor(sd, "model/w"), *b = ks_statedict_tensor(back, "model/w");
  assert_non_null(a);
  assert_non_null(b);
  assert_int_equal(a->nbytes, b->nbytes);
  assert_memory_equal(a->data, b->data, a->nbytes);
  ks_statedict_free(back);
  ks_meta_free(meta);
  /* a missing file: KS_E_IO naming the path, the detail in the storage */
  assert_int_equal(ks_load("ckpt/none.keepsake", &ro, &back, &meta, &e), KS_E_IO);
  assert_non_null(strstr(e.message, "No such file"));
  ks_storage_free(st);

  /* the same file served by nginx, read over HTTP with ranges */
  char path[1024];
  snprintf(path, sizeof path, "%s/one.keepsake", ks_test_remote("KS_TEST_HTTP_ROOT"));
  assert_int_equal(ks_save(path, sd, NULL, NULL, &e), KS_OK);
  char url[1024];
  snprintf(url, sizeof url, "%s/one.keepsake", ks_test_remote("KS_TEST_HTTP_URL"));
  assert_int_equal(ks_storage_open(url, NULL, &st, &e), KS_OK);
  assert_true(ks_storage_is_read_only(st));
  ro.io = ks_storage_io(st);
  assert_int_equal(ks_load(ks_storage_path(st), &ro, &back, &meta, &e), KS_OK);
  b = ks_statedict_tensor(back, "model/w");
  assert_non_null(b);
  assert_memory_equal(a->data, b->data, a->nbytes);
  ks_statedict_free(back);
  ks_meta_free(meta);
  /* read-only: a save fails with EROFS and names the path */
  so.io = ks_storage_io(st);
  char out[1100];
  snprintf(out, sizeof out, "%s/new.keepsake", ks_storage_path(st));
  assert_int_equal(ks_save(out, sd, NULL, &so, &e), KS_E_IO);
  assert_non_null(strstr(e.message, "Read-only"));
  ks_storage_free(st);
  ks_statedict_free(sd);
}

/* Above the threshold: a multipart upload with parts in parallel; the object's bytes are identical. */
static void multipart_parallel_identical(void **state) {
  (void)state;
  ks_storage *st = open_s3("ks-multipart", "big", 1, 6u << 20);
  const ks_io *io = ks_storage_io(st);
  size_t n = (17u << 20) + 12345; /* 4 parts of 5 MiB, the last one short */
  uint8_t *data = malloc(n);
  for (size_t i = 0; i < n; i++) data[i] = (uint8_t)((i * 2654435761u) >> 13);
  assert_int_equal(ks_test_remote_log_clear(), 0);
  assert_int_equal(put(io, "big/blob", data, n), 0);
  assert_int_equal(logged("POST", "uploads"), 1);
  assert_int_equal(logged("PUT", "partNumber="), 4);
  assert_int_equal(logged("POST", "uploadId="), 1);
  size_t got;
  int rc;
  uint8_t *back = get(io, "big/blob", &got, &rc);
  assert_int_equal(rc, 0);
  assert_int_equal(got, n);
  assert_memory_equal(back, data, n);
  assert_true(logged("GET", "bytes=") >= 4); /* read in parallel ranges */
  free(back);
  assert_int_equal(open_uploads("ks-multipart"), 0);
  ks_storage_free(st);
  free(data);
}

/* ---- the manager on s3://bucket/run ---- */

typedef struct prog {
  float w[64];
  int64_t shape[1];
  ks_timestamp ts;
  ks_state *st;
} prog;

static void prog_init(prog *p) {
  memset(p, 0, sizeof *p);
  p->shape[0] = 64;
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
  for (int i = 0; i < 64; i++) p->w[i] = (float)(b * 100 + i);
}

static ks_ckpt_manager *manager(ks_storage *st, int keep) {
  ks_ckpt_opts co = KS_OPTS_INIT(ks_ckpt_opts);
  co.run_dir = ks_storage_path(st);
  co.io = ks_storage_io(st);
  co.save_interval = "10ba";
  co.keep = keep;
  co.filename = "ba{batch}.keepsake";
  ks_ckpt_manager *m = NULL;
  ks_error e;
  assert_int_equal(ks_ckpt_manager_create(&co, &m, &e), KS_OK);
  return m;
}

static void latest_is(const ks_io *io, const char *want) {
  char target[256];
  size_t tl;
  assert_int_equal(io->readlink_fn(io->ctx, "run/latest", target, sizeof target, &tl), 0);
  assert_string_equal(target, want);
}

static void manager_keep_latest_autoresume(void **state) {
  (void)state;
  ks_storage *st = open_s3("ks-manager", "run", 0, 0);
  const ks_io *io = ks_storage_io(st);
  ks_ckpt_manager *m = manager(st, 2);
  prog p;
  prog_init(&p);
  ks_error e;
  for (int64_t b = 10; b <= 40; b += 10) {
    prog_step(&p, b);
    assert_int_equal(ks_ckpt_manager_save(m, p.st, NULL, &e), KS_OK);
  }
  /* an async save from the manager's background thread */
  prog_step(&p, 50);
  assert_int_equal(ks_ckpt_manager_save_async(m, p.st, NULL, &e), KS_OK);
  assert_int_equal(ks_ckpt_manager_wait(m, &e), KS_OK);
  names l = {0};
  assert_int_equal(io->list_fn(io->ctx, "run", "", collect, &l), 0);
  assert_int_equal(l.n, 4); /* keep 2, plus the pointer and the manager's lock (a lease object, as on disk) */
  assert_true(has(&l, "ba40.keepsake") && has(&l, "ba50.keepsake") && has(&l, "latest"));
  assert_true(has(&l, ".keepsake.lock"));
  latest_is(io, "ba50.keepsake");
  ks_ckpt_manager_free(m);
  ks_state_free(p.st);

  /* a new process: autoresume from the bucket */
  m = manager(st, 2);
  prog_init(&p);
  int resumed = 0;
  const char *from = NULL;
  assert_int_equal(ks_ckpt_manager_autoresume(m, p.st, NULL, NULL, &resumed, &from, &e), KS_OK);
  assert_true(resumed);
  assert_string_equal(from, "run/ba50.keepsake");
  assert_int_equal(p.ts.batch, 50);
  assert_true(p.w[3] == 5003.0f);
  ks_ckpt_manager_free(m);
  ks_state_free(p.st);

  /* the newest remote checkpoint damaged (a flipped byte), a newer one truncated: autoresume skips
     both, moves them aside to .corrupt and resumes from ba40 */
  size_t n;
  int rc;
  uint8_t *b = get(io, "run/ba50.keepsake", &n, &rc);
  assert_int_equal(rc, 0);
  b[n - 3] ^= 0x55;
  assert_int_equal(put(io, "run/ba50.keepsake", b, n), 0);
  assert_int_equal(put(io, "run/ba60.keepsake", b, n / 2), 0);
  free(b);
  m = manager(st, 2);
  prog_init(&p);
  resumed = 0;
  assert_int_equal(ks_ckpt_manager_autoresume(m, p.st, NULL, NULL, &resumed, &from, &e), KS_OK);
  assert_true(resumed);
  assert_string_equal(from, "run/ba40.keepsake");
  assert_int_equal(p.ts.batch, 40);
  assert_int_equal(ks_ckpt_manager_skipped(m), 2);
  ks_io_stat s;
  assert_int_equal(io->stat_fn(io->ctx, "run/ba50.keepsake.corrupt", &s), 0);
  assert_int_equal(io->stat_fn(io->ctx, "run/ba60.keepsake.corrupt", &s), 0);
  assert_int_equal(io->stat_fn(io->ctx, "run/ba50.keepsake", &s), ENOENT);
  ks_ckpt_manager_free(m);
  ks_state_free(p.st);
  ks_storage_free(st);
}

/* A pointer object put the way the manager writes `latest`: staged by symlink_fn, uploaded by rename_fn. */
static void put_pointer(const ks_io *io, const char *path, const char *target) {
  char tmp[512];
  const char *slash = strrchr(path, '/');
  snprintf(tmp, sizeof tmp, "%.*s.%s.tmp", (int)(slash - path + 1), path, slash + 1);
  assert_int_equal(io->symlink_fn(io->ctx, target, tmp), 0);
  assert_int_equal(io->rename_fn(io->ctx, tmp, path), 0);
}

/* `latest` on S3 is a pointer object: opening it (the reader, ks_load, the CLI) opens what it names,
   as open(2) follows a local `latest` symlink; stat still shows the pointer. */
static void latest_pointer_is_followed(void **state) {
  (void)state;
  ks_storage *st = open_s3("ks-latest", "run", 0, 0);
  const ks_io *io = ks_storage_io(st);
  ks_ckpt_manager *m = manager(st, 0);
  prog p;
  prog_init(&p);
  ks_error e;
  for (int64_t b = 10; b <= 20; b += 10) {
    prog_step(&p, b);
    assert_int_equal(ks_ckpt_manager_save(m, p.st, NULL, &e), KS_OK);
  }
  ks_ckpt_manager_free(m);
  ks_state_free(p.st);
  latest_is(io, "ba20.keepsake");
  ks_io_stat s;
  assert_int_equal(io->stat_fn(io->ctx, "run/latest", &s), 0);
  assert_int_equal(s.kind, KS_IO_LINK);

  /* the bytes read through `latest` are the checkpoint's */
  size_t n1 = 0, n2 = 0;
  int rc1, rc2;
  uint8_t *a = get(io, "run/latest", &n1, &rc1), *b = get(io, "run/ba20.keepsake", &n2, &rc2);
  assert_int_equal(rc1, 0);
  assert_int_equal(rc2, 0);
  assert_true(n1 > 100 && n1 == n2 && !memcmp(a, b, n1));
  free(a);
  free(b);

  /* the library's reader and ks_load (lazy, checksums verified) open it */
  ks_read_opts ro = KS_OPTS_INIT(ks_read_opts);
  ro.io = io;
  ro.verify_checksums = 1;
  ks_reader *r = NULL;
  if (ks_reader_open("run/latest", &ro, &r, &e)) fail_msg("ks_reader_open(latest): %s", e.message);
  ks_reader_free(r);
  ro.mode = KS_READ_LAZY;
  ks_statedict *sd = NULL;
  ks_meta *meta = NULL;
  if (ks_load("run/latest", &ro, &sd, &meta, &e)) fail_msg("ks_load(latest): %s", e.message);
  assert_true(ks_statedict_count(sd) > 0);
  ks_statedict_free(sd);
  ks_meta_free(meta);

  /* a pointer to a pointer is followed too; a loop is ELOOP; a dangling one ENOENT */
  put_pointer(io, "run/alias", "latest");
  a = get(io, "run/alias", &n1, &rc1);
  assert_int_equal(rc1, 0);
  assert_int_equal(n1, n2);
  free(a);
  put_pointer(io, "run/loop", "loop");
  int fd;
  uint64_t size;
  assert_int_equal(io->open_fn(io->ctx, "run/loop", &fd, &size), ELOOP);
  char msg[512];
  assert_true(ks_storage_last_error(st, msg, sizeof msg) > 0);
  assert_non_null(strstr(msg, "more than 8 pointers"));
  put_pointer(io, "run/dangling", "nothere.keepsake");
  assert_int_equal(io->open_fn(io->ctx, "run/dangling", &fd, &size), ENOENT);
  ks_storage_free(st);
}

/* ---- faults through the proxy ---- */

static void retries_after_503_and_drops(void **state) {
  (void)state;
  ks_storage *st = open_s3("ks-retry", "run", 1, 0);
  const ks_io *io = ks_storage_io(st);
  ks_ckpt_manager *m = manager(st, 0);
  prog p;
  prog_init(&p);
  prog_step(&p, 10);
  ks_error e;
  assert_int_equal(ks_test_remote_faults("[{\"target\":\"s3\",\"method\":\"PUT\",\"path_re\":\"ba10\","
                                         "\"action\":\"status\",\"status\":503,\"times\":2},"
                                         "{\"target\":\"s3\",\"method\":\"PUT\",\"path_re\":\"latest\","
                                         "\"action\":\"drop\",\"times\":1}]"),
                   0);
  assert_int_equal(ks_test_remote_log_clear(), 0);
  ks_status s = ks_ckpt_manager_save(m, p.st, NULL, &e);
  if (s) {
    char detail[512];
    ks_storage_last_error(st, detail, sizeof detail);
    print_error("%s [%s]\n", e.message, detail);
  }
  assert_int_equal(s, KS_OK);
  assert_int_equal(logged("PUT", "ba10"), 3);   /* two 503s, then stored */
  assert_int_equal(logged("PUT", "latest"), 2); /* a dropped connection, then stored */
  latest_is(io, "ba10.keepsake");
  /* a fresh reader: HEAD answered 500 once, the body truncated once, then stalled past the timeout */
  assert_int_equal(ks_test_remote_faults("[{\"target\":\"s3\",\"method\":\"GET\",\"path_re\":\"ba10\","
                                         "\"action\":\"truncate\",\"phase\":\"response\",\"times\":1},"
                                         "{\"target\":\"s3\",\"method\":\"GET\",\"path_re\":\"ba10\","
                                         "\"action\":\"stall\",\"stall_ms\":4000,\"times\":1},"
                                         "{\"target\":\"s3\",\"method\":\"HEAD\",\"path_re\":\"ba10\","
                                         "\"action\":\"status\",\"status\":500,\"times\":1}]"),
                   0);
  assert_int_equal(ks_test_remote_log_clear(), 0);
  ks_storage_opts so = KS_OPTS_INIT(ks_storage_opts); /* a reader whose timeout is below the 4 s stall */
  so.endpoint = ks_test_remote("KS_TEST_PROXY_S3");
  so.retry_base_ms = 5;
  so.timeout_ms = 1500;
  ks_storage *rst = NULL;
  assert_int_equal(ks_storage_open("s3://ks-retry/run", &so, &rst, &e), KS_OK);
  ks_read_opts ro = KS_OPTS_INIT(ks_read_opts);
  ro.io = ks_storage_io(rst);
  ro.verify_checksums = 1;
  ks_statedict *sd = NULL;
  ks_meta *meta = NULL;
  assert_int_equal(ks_load("run/ba10.keepsake", &ro, &sd, &meta, &e), KS_OK);
  assert_true(logged("HEAD", "ba10") >= 2); /* the 500, then the answer */
  assert_true(logged("GET", "ba10") >= 2); /* the stalled one is logged when the proxy gives up on it */
  ks_statedict_free(sd);
  ks_meta_free(meta);
  ks_storage_free(rst);
  assert_int_equal(ks_test_remote_faults_clear(), 0);
  ks_ckpt_manager_free(m);
  ks_state_free(p.st);
  ks_storage_free(st);
}

/* A persistent fault: the save fails clearly; no object under its name, `latest` unchanged. */
static void persistent_fault_single_put(void **state) {
  (void)state;
  ks_storage *st = open_s3("ks-persist", "run", 1, 0);
  const ks_io *io = ks_storage_io(st);
  ks_ckpt_manager *m = manager(st, 0);
  prog p;
  prog_init(&p);
  prog_step(&p, 10);
  ks_error e;
  assert_int_equal(ks_ckpt_manager_save(m, p.st, NULL, &e), KS_OK);
  prog_step(&p, 20);
  assert_int_equal(ks_test_remote_faults("[{\"target\":\"s3\",\"method\":\"PUT\",\"path_re\":\"ba20\","
                                         "\"action\":\"status\",\"status\":503}]"),
                   0);
  assert_int_equal(ks_ckpt_manager_save(m, p.st, NULL, &e), KS_E_IO);
  assert_non_null(strstr(e.message, "ba20.keepsake"));
  char detail[512];
  ks_storage_last_error(st, detail, sizeof detail);
  assert_non_null(strstr(detail, "HTTP 503"));
  assert_non_null(strstr(detail, "retries"));
  assert_int_equal(ks_test_remote_faults_clear(), 0);
  ks_io_stat s;
  assert_int_equal(io->stat_fn(io->ctx, "run/ba20.keepsake", &s), ENOENT);
  latest_is(io, "ba10.keepsake");
  ks_ckpt_manager_free(m);
  ks_state_free(p.st);
  ks_storage_free(st);
}

/* The same for a multipart upload: one part keeps failing; the upload is aborted. */
static void persistent_fault_multipart(void **state) {
  (void)state;
  ks_storage *st = open_s3("ks-persist-mp", "run", 1, 6u << 20);
  const ks_io *io = ks_storage_io(st);
  ks_statedict *sd = sample_dict((12u << 20) / 4, 2.0f); /* 12 MiB: 3 parts */
  ks_save_opts so = KS_OPTS_INIT(ks_save_opts);
  so.io = io;
  ks_error e;
  assert_int_equal(ks_test_remote_faults("[{\"target\":\"s3\",\"method\":\"PUT\",\"query_re\":\"partNumber=2\","
                                         "\"action\":\"drop\"}]"),
                   0);
  assert_int_equal(ks_save("run/big.keepsake", sd, NULL, &so, &e), KS_E_IO);
  char detail[512];
  ks_storage_last_error(st, detail, sizeof detail);
  assert_non_null(strstr(detail, "multipart upload aborted"));
  assert_int_equal(ks_test_remote_faults_clear(), 0);
  ks_io_stat s;
  assert_int_equal(io->stat_fn(io->ctx, "run/big.keepsake", &s), ENOENT);
  assert_int_equal(open_uploads("ks-persist-mp"), 0);
  /* and the same save goes through once the fault is gone */
  assert_int_equal(ks_save("run/big.keepsake", sd, NULL, &so, &e), KS_OK);
  assert_int_equal(io->stat_fn(io->ctx, "run/big.keepsake", &s), 0);
  assert_int_equal(open_uploads("ks-persist-mp"), 0);
  ks_statedict_free(sd);
  ks_storage_free(st);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(put_get_list_stat_delete),
      cmocka_unit_test(list_many_pages),
      cmocka_unit_test(save_then_read_s3_and_http),
      cmocka_unit_test(multipart_parallel_identical),
      cmocka_unit_test(manager_keep_latest_autoresume),
      cmocka_unit_test(latest_pointer_is_followed),
      cmocka_unit_test(retries_after_503_and_drops),
      cmocka_unit_test(persistent_fault_single_put),
      cmocka_unit_test(persistent_fault_multipart),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
