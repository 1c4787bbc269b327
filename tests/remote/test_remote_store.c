/*
 * What a remote store changes under a program, against moto (S3) and nginx (HTTP) on 127.0.0.1:
 *   - an object replaced by another of the same size is read anew through the read cache (the
 *     pieces are keyed by the validator open_fn found: the ETag), and the old pieces go;
 *   - a reader open on an object that is replaced meanwhile fails instead of mixing the two;
 *   - the run directory lock on S3: a lease object written with conditional writes, so a second
 *     manager on one prefix is refused naming the holder, a manager's close lets another take it,
 *     a live holder keeps it by renewing, a dead or expired one is taken over, a manager that lost
 *     it writes nothing more, and a store that ignores conditional writes has no locks;
 *   - a failed request names the s3:// URL and the endpoint in the library's own message.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "keepsake/format.h"
#include "keepsake/io_cache.h"
#include "keepsake/manager.h"
#include "keepsake/storage.h"
#include "remoteenv.h"
#include "testutil.h"

#define BUCKET "store-checks"
#define N 4096

static int g_seq;

static ks_storage *open_at(const char *location, const char *endpoint, long ttl_ms) {
  ks_storage_opts o = {.endpoint = endpoint, .max_retries = 2, .retry_base_ms = 5, .lock_ttl_ms = ttl_ms};
  ks_storage *st = NULL;
  ks_error e;
  ks_error_clear(&e);
  if (ks_storage_open(location, &o, &st, &e)) fail_msg("open %s: %s", location, e.message);
  return st;
}

/* A fresh prefix of the bucket (its own run directory). */
static ks_storage *open_prefix(char *prefix, size_t cap, const char *endpoint, long ttl_ms) {
  char url[256];
  snprintf(prefix, cap, "p%d-%ld", ++g_seq, (long)getpid());
  snprintf(url, sizeof url, "s3://" BUCKET "/%s", prefix);
  return open_at(url, endpoint, ttl_ms);
}

/* Saves {"w": n floats, value*1000 + i} at path: every value's file has the same size. */
static void save_n(const ks_io *io, const char *path, int value, int64_t n) {
  ks_statedict *sd = NULL;
  float *w = NULL;
  int64_t shape[1] = {n};
  ks_error e;
  ks_error_clear(&e);
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  assert_int_equal(ks_statedict_new_tensor(sd, "w", KS_F32, 1, shape, (void **)&w, NULL), KS_OK);
  for (int64_t i = 0; i < n; i++) w[i] = (float)(value * 1000 + i % 1000);
  ks_save_opts so = {.io = io};
  if (ks_save(path, sd, NULL, &so, &e)) fail_msg("save %s: %s", path, e.message);
  ks_statedict_free(sd);
}

static void save_values(const ks_io *io, const char *path, int value) { save_n(io, path, value, N); }

/* The value a file was saved with, loaded (lazily, verified) through io; -1 when the load fails. */
static int load_value(const ks_io *io, const char *path, ks_error *e) {
  ks_read_opts ro = {.mode = KS_READ_LAZY, .verify_checksums = 1, .io = io};
  ks_statedict *sd = NULL;
  ks_error_clear(e);
  if (ks_load(path, &ro, &sd, NULL, e)) return -1;
  const ks_tensor *t = ks_statedict_tensor(sd, "w");
  assert_non_null(t);
  const float *w = t->data;
  int v = (int)w[5] / 1000;
  for (int i = 0; i < N; i++) assert_true(w[i] == (float)(v * 1000 + i % 1000)); /* one version, never a mix */
  ks_statedict_free(sd);
  return v;
}

static uint64_t size_of(const ks_io *io, const char *path) {
  ks_io_stat st;
  assert_int_equal(io->stat_fn(io->ctx, path, &st), 0);
  return st.size;
}

/* The folders of pieces in a cache directory (one per version of a file). */
static int folders(const char *dir) { return ks_test_dir_entries(dir); }

/* Loads through the cache before and after the object is replaced (same size, other bytes) behind it. */
static void replaced_behind_the_cache(const ks_io *store, const char *path, void (*replace)(void *), void *arg) {
  char *dir = ks_test_tmpdir("store-cache");
  ks_io *cache = NULL;
  ks_error e;
  ks_io_cache_stats s0, s1, s2;
  assert_int_equal(ks_io_cache_create(store, dir, NULL, &cache, NULL), KS_OK);
  assert_int_equal(load_value(cache, path, &e), 1);
  assert_int_equal(load_value(cache, path, &e), 1);
  ks_io_cache_get_stats(cache, &s0);
  assert_true(s0.hit_bytes > 0); /* the second load came from the pieces */
  uint64_t size = size_of(store, path);
  replace(arg);
  assert_int_equal(size_of(store, path), size); /* the same size: only the validator tells them apart */
  int v = load_value(cache, path, &e);
  if (v != 2) fail_msg("after the replacement the cache served version %d (%s)", v, e.message);
  ks_io_cache_get_stats(cache, &s1);
  assert_true(s1.miss_bytes - s0.miss_bytes >= size); /* downloaded anew... */
  assert_true(s1.hit_bytes == s0.hit_bytes);          /* ...and not one old piece used */
  assert_int_equal(folders(dir), 1);                  /* the old version's pieces are gone */
  assert_int_equal(load_value(cache, path, &e), 2);   /* and the new version is cached in turn */
  ks_io_cache_get_stats(cache, &s2);
  assert_true(s2.miss_bytes == s1.miss_bytes);
  ks_io_cache_free(cache);
  ks_test_rmtree(dir);
  free(dir);
}

typedef struct s3_replace {
  const ks_io *io;
  const char *path;
} s3_replace;

static void replace_s3(void *arg) {
  s3_replace *r = arg;
  save_values(r->io, r->path, 2); /* another writer: straight to the store, not through the cache */
}

static void cache_sees_a_replaced_s3_object(void **state) {
  (void)state;
  char prefix[64], path[128];
  ks_storage *st = open_prefix(prefix, sizeof prefix, ks_test_remote("KS_TEST_S3_ENDPOINT"), 0);
  snprintf(path, sizeof path, "%s/ck.keepsake", ks_storage_path(st));
  save_values(ks_storage_io(st), path, 1);
  s3_replace r = {ks_storage_io(st), path};
  replaced_behind_the_cache(ks_storage_io(st), path, replace_s3, &r);
  ks_storage_free(st);
}

typedef struct http_replace {
  const char *local;
} http_replace;

/* nginx's ETag is the file's mtime (in seconds) and size: the new file gets another mtime, as any
 * file replaced a second or more later has. */
static void replace_http(void *arg) {
  http_replace *r = arg;
  struct stat sb;
  assert_int_equal(stat(r->local, &sb), 0);
  save_values(NULL, r->local, 2);
  struct timespec t[2] = {{sb.st_mtime + 7, 0}, {sb.st_mtime + 7, 0}};
  assert_int_equal(utimensat(AT_FDCWD, r->local, t, 0), 0);
}

static void cache_sees_a_replaced_http_file(void **state) {
  (void)state;
  char name[64], url[256];
  snprintf(name, sizeof name, "store-%ld-%d.keepsake", (long)getpid(), ++g_seq);
  char *local = ks_test_path(ks_test_remote("KS_TEST_HTTP_ROOT"), name);
  save_values(NULL, local, 1);
  snprintf(url, sizeof url, "%s/%s", ks_test_remote("KS_TEST_HTTP_URL"), name);
  ks_storage *st = open_at(url, NULL, 0);
  http_replace r = {local};
  replaced_behind_the_cache(ks_storage_io(st), ks_storage_path(st), replace_http, &r);
  ks_storage_free(st);
  unlink(local);
  free(local);
}

/* A reader keeps reading the object it opened: a replacement in between is an error, not a mix. */
static void reader_refuses_an_object_replaced_while_open(void **state) {
  (void)state;
  char prefix[64], path[128];
  ks_storage *st = open_prefix(prefix, sizeof prefix, ks_test_remote("KS_TEST_S3_ENDPOINT"), 0);
  snprintf(path, sizeof path, "%s/ck.keepsake", ks_storage_path(st));
  save_n(ks_storage_io(st), path, 1, 1 << 18); /* 1 MiB: more than the header's first read brings */
  ks_read_opts ro = {.mode = KS_READ_LAZY, .io = ks_storage_io(st)};
  ks_reader *rd = NULL;
  ks_error e;
  ks_error_clear(&e);
  assert_int_equal(ks_reader_open(path, &ro, &rd, &e), KS_OK);
  save_n(ks_storage_io(st), path, 2, 1 << 18);
  ks_tensor t;
  ks_error_clear(&e);
  ks_status s = ks_reader_tensor(rd, "w", &t, &e);
  assert_int_equal(s, KS_E_IO);
  assert_non_null(strstr(e.message, "changed since it was opened"));
  ks_reader_free(rd);
  ks_storage_free(st);
}

/* ---- the run directory lock ---- */

static ks_status manager(ks_storage *st, ks_ckpt_lock lock, ks_ckpt_manager **m, ks_error *e) {
  ks_ckpt_opts co = {.run_dir = ks_storage_path(st), .io = ks_storage_io(st), .lock = lock};
  *m = NULL;
  ks_error_clear(e);
  return ks_ckpt_manager_create(&co, m, e);
}

static void second_manager_is_refused_naming_the_holder(void **state) {
  (void)state;
  char prefix[64], url[128], me[64];
  ks_storage *a = open_prefix(prefix, sizeof prefix, ks_test_remote("KS_TEST_S3_ENDPOINT"), 0);
  snprintf(url, sizeof url, "s3://" BUCKET "/%s", prefix);
  ks_storage *b = open_at(url, ks_test_remote("KS_TEST_S3_ENDPOINT"), 0);
  ks_ckpt_manager *m1, *m2;
  ks_error e;
  assert_int_equal(manager(a, KS_CKPT_LOCK_REQUIRE, &m1, &e), KS_OK); /* S3 can lock now */
  assert_int_equal(manager(b, KS_CKPT_LOCK_AUTO, &m2, &e), KS_E_LOCKED);
  snprintf(me, sizeof me, "pid %ld on host ", (long)getpid());
  if (!strstr(e.message, me)) fail_msg("the holder is not named: %s", e.message);
  assert_null(m2);
  ks_ckpt_manager_free(m1); /* releases it */
  assert_int_equal(manager(b, KS_CKPT_LOCK_REQUIRE, &m2, &e), KS_OK);
  assert_int_equal(manager(a, KS_CKPT_LOCK_AUTO, &m1, &e), KS_E_LOCKED);
  ks_ckpt_manager_free(m2);
  ks_storage_free(a);
  ks_storage_free(b);
}

/* The lease at prefix/.keepsake.lock as the store holds it (the JSON text), into buf. */
static void lease_text(ks_storage *st, char *buf, size_t cap) {
  char path[160];
  snprintf(path, sizeof path, "%s/.keepsake.lock", ks_storage_path(st));
  const ks_io *io = ks_storage_io(st);
  int fd;
  uint64_t size;
  size_t got = 0;
  assert_int_equal(io->open_fn(io->ctx, path, &fd, &size), 0);
  assert_true(size < cap);
  assert_int_equal(io->read_fn(io->ctx, fd, buf, (size_t)size, 0, &got), 0);
  buf[got] = '\0';
  io->close_fn(io->ctx, fd);
}

/* Writes the lease object as another machine's manager would have (unconditionally). */
static void foreign_lease(ks_storage *st, long ttl_ms) {
  char path[160], body[512];
  snprintf(path, sizeof path, "%s/.keepsake.lock.tmp-x", ks_storage_path(st));
  int n = snprintf(body, sizeof body,
                   "{\"owner\":\"pid 4242 on host elsewhere since 2020-01-01T00:00:00Z\",\"host\":\"elsewhere\","
                   "\"pid\":4242,\"ttl_ms\":%ld}\n",
                   ttl_ms);
  const ks_io *io = ks_storage_io(st);
  int fd;
  size_t w;
  assert_int_equal(io->create_fn(io->ctx, path, &fd), 0);
  assert_int_equal(io->write_fn(io->ctx, fd, body, (size_t)n, &w), 0);
  assert_int_equal(io->close_fn(io->ctx, fd), 0);
  char to[160];
  snprintf(to, sizeof to, "%s/.keepsake.lock", ks_storage_path(st));
  assert_int_equal(io->rename_fn(io->ctx, path, to), 0);
}

static void sleep_ms(long ms) {
  struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&t, NULL);
}

static void expired_lease_is_taken_over(void **state) {
  (void)state;
  char prefix[64], text[1024];
  ks_storage *st = open_prefix(prefix, sizeof prefix, ks_test_remote("KS_TEST_S3_ENDPOINT"), 1000);
  foreign_lease(st, 1000);
  ks_ckpt_manager *m;
  ks_error e;
  assert_int_equal(manager(st, KS_CKPT_LOCK_AUTO, &m, &e), KS_E_LOCKED); /* alive: renewed just now */
  assert_non_null(strstr(e.message, "pid 4242 on host elsewhere"));
  sleep_ms(3200); /* a second of time to live, a second for the server's clock, and some */
  if (manager(st, KS_CKPT_LOCK_REQUIRE, &m, &e)) fail_msg("the expired lease was not taken over: %s", e.message);
  lease_text(st, text, sizeof text);
  char me[32];
  snprintf(me, sizeof me, "\"pid\":%ld", (long)getpid());
  assert_non_null(strstr(text, me));
  ks_ckpt_manager_free(m);
  ks_storage_free(st);
}

static void live_holder_keeps_it_by_renewing(void **state) {
  (void)state;
  char prefix[64], url[128];
  ks_storage *a = open_prefix(prefix, sizeof prefix, ks_test_remote("KS_TEST_S3_ENDPOINT"), 2000);
  snprintf(url, sizeof url, "s3://" BUCKET "/%s", prefix);
  ks_storage *b = open_at(url, ks_test_remote("KS_TEST_S3_ENDPOINT"), 2000);
  ks_ckpt_manager *m1, *m2;
  ks_error e;
  assert_int_equal(manager(a, KS_CKPT_LOCK_AUTO, &m1, &e), KS_OK);
  sleep_ms(5000); /* two and a half times its time to live: only renewals keep it */
  assert_int_equal(manager(b, KS_CKPT_LOCK_AUTO, &m2, &e), KS_E_LOCKED);
  ks_ckpt_manager_free(m1);
  ks_storage_free(a);
  ks_storage_free(b);
}

static void dead_holder_of_this_machine_is_taken_over(void **state) {
  (void)state;
  char prefix[64], url[128];
  ks_storage *st = open_prefix(prefix, sizeof prefix, ks_test_remote("KS_TEST_S3_ENDPOINT"), 0);
  snprintf(url, sizeof url, "s3://" BUCKET "/%s", prefix);
  fflush(NULL);
  pid_t child = fork();
  if (child == 0) { /* takes the lock and dies holding it (a minute's lease) */
    ks_storage *c = open_at(url, ks_test_remote("KS_TEST_S3_ENDPOINT"), 0);
    ks_ckpt_manager *m;
    ks_error e;
    _exit(manager(c, KS_CKPT_LOCK_REQUIRE, &m, &e) == KS_OK ? 0 : 1);
  }
  int status = 0;
  assert_int_equal(waitpid(child, &status, 0), child);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  char text[1024], pid[32];
  lease_text(st, text, sizeof text);
  snprintf(pid, sizeof pid, "\"pid\":%ld", (long)child);
  assert_non_null(strstr(text, pid)); /* the dead child's lease is there, a minute from expiring */
  ks_ckpt_manager *m;
  ks_error e;
  if (manager(st, KS_CKPT_LOCK_REQUIRE, &m, &e)) fail_msg("a dead holder's lease was not taken over: %s", e.message);
  ks_ckpt_manager_free(m);
  ks_storage_free(st);
}

static void manager_that_lost_its_lease_writes_nothing(void **state) {
  (void)state;
  char prefix[64], path[160];
  ks_storage *st = open_prefix(prefix, sizeof prefix, ks_test_remote("KS_TEST_S3_ENDPOINT"), 1000);
  ks_ckpt_manager *m;
  ks_error e;
  assert_int_equal(manager(st, KS_CKPT_LOCK_AUTO, &m, &e), KS_OK);
  foreign_lease(st, 60000); /* someone else's now (as after a takeover while this one was stopped) */
  sleep_ms(1000);           /* a renewal finds it is not ours any more */
  ks_statedict *sd = NULL;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_int(sd, "x", 1, NULL), KS_OK);
  ks_timestamp ts;
  ks_timestamp_init(&ts);
  ts.batch = 1;
  ks_error_clear(&e);
  assert_int_equal(ks_ckpt_manager_save_image(m, NULL, sd, NULL, &ts, 0, NULL, &e), KS_E_IO);
  if (!strstr(e.message, "taken over")) fail_msg("not said: %s", e.message);
  snprintf(path, sizeof path, "%s/ep0-ba1.keepsake", ks_storage_path(st));
  ks_io_stat sb;
  assert_int_equal(ks_storage_io(st)->stat_fn(ks_storage_io(st)->ctx, path, &sb), ENOENT);
  char text[1024];
  ks_ckpt_manager_free(m);
  lease_text(st, text, sizeof text); /* the other holder's lease is left alone */
  assert_non_null(strstr(text, "host elsewhere"));
  ks_statedict_free(sd);
  ks_storage_free(st);
}

/* Through the proxy, which drops the conditional headers: a store without conditional writes. */
static void store_without_conditional_writes_has_no_locks(void **state) {
  (void)state;
  char prefix[64];
  assert_int_equal(ks_test_remote_faults("[{\"target\":\"s3\",\"path_re\":\"keepsake\\\\.lock$\",\"action\":\"strip\","
                                         "\"headers\":[\"If-None-Match\",\"If-Match\"]}]"),
                   0);
  ks_storage *st = open_prefix(prefix, sizeof prefix, ks_test_remote("KS_TEST_PROXY_S3"), 0);
  ks_ckpt_manager *m1, *m2;
  ks_error e;
  assert_int_equal(manager(st, KS_CKPT_LOCK_REQUIRE, &m1, &e), KS_E_UNSUPPORTED);
  if (!strstr(e.message, "conditional writes")) fail_msg("not said: %s", e.message);
  assert_int_equal(manager(st, KS_CKPT_LOCK_AUTO, &m1, &e), KS_OK); /* the documented default: unlocked */
  assert_int_equal(manager(st, KS_CKPT_LOCK_AUTO, &m2, &e), KS_OK);
  ks_ckpt_manager_free(m1);
  ks_ckpt_manager_free(m2);
  assert_int_equal(ks_test_remote_faults_clear(), 0);
  ks_storage_free(st);
}

/* ---- failures name the object and the endpoint ---- */

/* A port of 127.0.0.1 nobody listens on (bound a moment ago, then closed). */
static int closed_port(void) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  assert_true(s >= 0);
  assert_int_equal(bind(s, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(getsockname(s, (struct sockaddr *)&a, &len), 0);
  close(s);
  return ntohs(a.sin_port);
}

static void unreachable_endpoint_is_named(void **state) {
  (void)state;
  char endpoint[64], url[160];
  snprintf(endpoint, sizeof endpoint, "http://127.0.0.1:%d", closed_port());
  ks_storage *st = open_at("s3://" BUCKET "/run", endpoint, 0);
  ks_statedict *sd = NULL;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_int(sd, "x", 1, NULL), KS_OK);
  ks_save_opts so = {.io = ks_storage_io(st)};
  ks_error e;
  ks_error_clear(&e);
  assert_int_equal(ks_save("run/ck.keepsake", sd, NULL, &so, &e), KS_E_IO);
  snprintf(url, sizeof url, "s3://" BUCKET "/run/ck.keepsake");
  if (!strstr(e.message, url) || !strstr(e.message, endpoint) || !strstr(e.message, "cannot rename into place"))
    fail_msg("the message names neither the object nor the endpoint: %s", e.message);
  /* The manager's first request (its run directory) says the same. */
  ks_ckpt_manager *m;
  assert_int_equal(manager(st, KS_CKPT_LOCK_AUTO, &m, &e), KS_E_IO);
  if (!strstr(e.message, "s3://" BUCKET "/run") || !strstr(e.message, endpoint))
    fail_msg("the manager's message names neither the location nor the endpoint: %s", e.message);
  ks_statedict_free(sd);
  ks_storage_free(st);
}

static int group_setup(void **state) {
  (void)state;
  if (ks_test_remote_env_load() || ks_test_remote_bucket(BUCKET)) return -1;
  return ks_test_remote_faults_clear();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(cache_sees_a_replaced_s3_object),
      cmocka_unit_test(cache_sees_a_replaced_http_file),
      cmocka_unit_test(reader_refuses_an_object_replaced_while_open),
      cmocka_unit_test(second_manager_is_refused_naming_the_holder),
      cmocka_unit_test(expired_lease_is_taken_over),
      cmocka_unit_test(live_holder_keeps_it_by_renewing),
      cmocka_unit_test(dead_holder_of_this_machine_is_taken_over),
      cmocka_unit_test(manager_that_lost_its_lease_writes_nothing),
      cmocka_unit_test(store_without_conditional_writes_has_no_locks),
      cmocka_unit_test(unreachable_endpoint_is_named),
  };
  return cmocka_run_group_tests(tests, group_setup, NULL);
}
