/*
 * Hostile and dying servers (tests/remote/hostile.py, started here on 127.0.0.1 and stopped at the
 * end; it also stops by itself): every remote operation ends within its deadline
 * (ks_storage_opts.deadline_ms, 3 s here) plus a small slack, or at once at its budget or cap, with
 * the expected errno from the table, the expected class from ks_storage_last_status() (KS_E_NET
 * for a deadline, KS_E_LIMIT for a budget or cap) and a message naming the URL and the limit:
 *   - a listing that never ends (budgets of pages, entries and bytes; a deadline when slow);
 *   - a server that sends 1 byte every 2 s (S3 and HTTP tables, and ks_reader_open over them);
 *   - a Content-Length far above the range asked, or an object size no store holds;
 *   - a body longer than the range asked (never written past the caller's buffer).
 * Before the deadline existed, the drip took about 189 s (6 attempts ended by the 30 s low-speed
 * limit, plus backoff) and the endless listing 100,000 pages.
 */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "keepsake/format.h"
#include "keepsake/storage.h"

#define DEADLINE_MS 3000L
#define SLACK_S 2.5 /* a loaded 2-core machine: process start, scheduling */

static const char *g_python, *g_script;
static pid_t g_pid = -1;
static char g_endpoint[64];

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Starts hostile.py and reads its "PORT n" line. */
static int start_server(void **state) {
  (void)state;
  int fds[2];
  if (pipe(fds)) return -1;
  g_pid = fork();
  if (g_pid < 0) return -1;
  if (g_pid == 0) {
    dup2(fds[1], 1);
    close(fds[0]);
    close(fds[1]);
    execlp(g_python, g_python, g_script, "--lifetime", "150", (char *)NULL);
    _exit(127);
  }
  close(fds[1]);
  FILE *f = fdopen(fds[0], "r");
  int port = 0;
  if (!f || fscanf(f, "PORT %d", &port) != 1 || port <= 0) {
    if (f) fclose(f);
    return -1;
  }
  fclose(f);
  snprintf(g_endpoint, sizeof g_endpoint, "http://127.0.0.1:%d", port);
  return 0;
}

static int stop_server(void **state) {
  (void)state;
  if (g_pid > 0) {
    kill(g_pid, SIGTERM);
    waitpid(g_pid, NULL, 0);
  }
  return 0;
}

/* A location on the hostile server with a short deadline and the given listing budgets. */
static ks_storage *open_at(const char *location, long deadline_ms, uint64_t pages, uint64_t keys, uint64_t bytes) {
  ks_storage_opts o = KS_OPTS_INIT(ks_storage_opts);
  o.endpoint = g_endpoint;
  o.retry_base_ms = 20;
  o.deadline_ms = deadline_ms;
  o.list_max_pages = pages;
  o.list_max_keys = keys;
  o.list_max_bytes = bytes;
  ks_storage *st = NULL;
  ks_error e;
  assert_int_equal(ks_storage_open(location, &o, &st, &e), KS_OK);
  return st;
}

/* The last failure: its class is `cls` and its message holds each of the NULL-terminated needles. */
static void assert_failure(const ks_storage *st, ks_status cls, ...) {
  ks_error e;
  ks_error_clear(&e);
  ks_status s = ks_storage_last_status(st, &e);
  print_message("  last error: %s (%s)\n", e.message, ks_status_name(s));
  assert_int_equal(s, cls);
  assert_int_equal(e.code, cls);
  va_list ap;
  va_start(ap, cls);
  for (const char *needle; (needle = va_arg(ap, const char *)) != NULL;) {
    if (!strstr(e.message, needle)) fail_msg("'%s' not in '%s'", needle, e.message);
  }
  va_end(ap);
}

static int count_entry(void *ctx, const char *name, ks_io_kind kind) {
  (void)name;
  (void)kind;
  ++*(size_t *)ctx;
  return 0;
}

/* An endless listing against a budget (deadline far off): EOVERFLOW, KS_E_LIMIT, quickly. */
static void listing_budget(uint64_t pages, uint64_t keys, uint64_t bytes, const char *opt) {
  ks_storage *st = open_at("s3://endless/run", 60000, pages, keys, bytes);
  const ks_io *io = ks_storage_io(st);
  size_t n = 0;
  double t0 = now_s();
  assert_int_equal(io->list_fn(io->ctx, "run", "", count_entry, &n), EOVERFLOW);
  double dt = now_s() - t0;
  print_message("  %s: %zu entries, %.2f s\n", opt, n, dt);
  assert_true(dt < 10.0);
  char url[96];
  snprintf(url, sizeof url, "GET %s/endless/?", g_endpoint);
  assert_failure(st, KS_E_LIMIT, "s3://endless/run/", url, opt, NULL);
  ks_storage_free(st);
}

static void endless_listing_budgets(void **state) {
  (void)state;
  listing_budget(25, 0, 0, "list_max_pages");
  listing_budget(0, 42, 0, "list_max_keys");
  listing_budget(0, 0, 20000, "list_max_bytes");
}

/* Pages that come slowly and never end: the listing's one deadline ends it (not each page's). */
static void endless_listing_deadline(void **state) {
  (void)state;
  ks_storage *st = open_at("s3://slowlist/run", DEADLINE_MS, 0, 0, 0);
  const ks_io *io = ks_storage_io(st);
  size_t n = 0;
  double t0 = now_s();
  assert_int_equal(io->list_fn(io->ctx, "run", "", count_entry, &n), ETIMEDOUT);
  double dt = now_s() - t0;
  print_message("  slow endless listing: %zu entries, %.2f s\n", n, dt);
  assert_true(dt >= 2.5 && dt < DEADLINE_MS / 1000.0 + SLACK_S);
  assert_failure(st, KS_E_NET, "/slowlist/?", "deadline of 3000 ms", "deadline_ms", NULL);
  ks_storage_free(st);
}

/* One read of a dripping object through the table: ETIMEDOUT at the deadline. */
static void drip_read(const char *location, const char *path, const char *url_part) {
  ks_storage *st = open_at(location, DEADLINE_MS, 0, 0, 0);
  const ks_io *io = ks_storage_io(st);
  int fd;
  uint64_t size = 0;
  assert_int_equal(io->open_fn(io->ctx, path, &fd, &size), 0);
  assert_int_equal(size, 1000);
  uint8_t buf[100];
  size_t got = 0;
  double t0 = now_s();
  assert_int_equal(io->read_fn(io->ctx, fd, buf, sizeof buf, 0, &got), ETIMEDOUT);
  double dt = now_s() - t0;
  print_message("  drip read %s: %.2f s\n", location, dt);
  assert_true(dt < DEADLINE_MS / 1000.0 + SLACK_S);
  assert_int_equal(io->close_fn(io->ctx, fd), 0);
  assert_failure(st, KS_E_NET, url_part, "deadline of 3000 ms (ks_storage_opts.deadline_ms) exceeded", NULL);

  /* the library's reader over the same table gives up as quickly */
  ks_read_opts ro = KS_OPTS_INIT(ks_read_opts);
  ro.io = io;
  ks_reader *r = NULL;
  ks_error e;
  t0 = now_s();
  assert_int_not_equal(ks_reader_open(path, &ro, &r, &e), KS_OK);
  dt = now_s() - t0;
  print_message("  ks_reader_open: %.2f s: %s\n", dt, e.message);
  assert_true(dt < DEADLINE_MS / 1000.0 + SLACK_S);
  assert_failure(st, KS_E_NET, url_part, "deadline", NULL);
  ks_storage_free(st);
}

static void drip_one_byte_every_2s(void **state) {
  (void)state;
  char url[128];
  snprintf(url, sizeof url, "GET %s/drip/run/x.keepsake", g_endpoint);
  drip_read("s3://drip/run", "run/x.keepsake", url);
  char loc[128];
  snprintf(loc, sizeof loc, "%s/drip/run", g_endpoint);
  snprintf(url, sizeof url, "GET %s/drip/run/x.keepsake", g_endpoint);
  char path[160];
  snprintf(path, sizeof path, "%s/x.keepsake", loc);
  drip_read(loc, path, url);
}

/* A read whose answer is bigger than asked: EFBIG at once (no retries), buffer not overrun. */
static void oversized_read(const char *bucket, const char *needle) {
  char loc[64];
  snprintf(loc, sizeof loc, "s3://%s/run", bucket);
  ks_storage *st = open_at(loc, DEADLINE_MS, 0, 0, 0);
  const ks_io *io = ks_storage_io(st);
  int fd;
  uint64_t size = 0;
  assert_int_equal(io->open_fn(io->ctx, "run/x", &fd, &size), 0);
  uint8_t buf[132];
  memset(buf, 0xAB, sizeof buf);
  size_t got = 7;
  double t0 = now_s();
  assert_int_equal(io->read_fn(io->ctx, fd, buf, 100, 0, &got), EFBIG);
  double dt = now_s() - t0;
  print_message("  %s: %.2f s\n", bucket, dt);
  assert_true(dt < 2.0);
  assert_int_equal(got, 0);
  for (size_t i = 100; i < sizeof buf; i++) assert_int_equal(buf[i], 0xAB);
  assert_int_equal(io->close_fn(io->ctx, fd), 0);
  char url[128];
  snprintf(url, sizeof url, "GET %s/%s/run/x", g_endpoint, bucket);
  assert_failure(st, KS_E_LIMIT, url, needle, NULL);
  ks_storage_free(st);
}

static void huge_content_length(void **state) {
  (void)state;
  oversized_read("huge", "Content-Length 1000000000000000 exceeds the 100 bytes asked");
  /* an object size no store holds is refused by open */
  ks_storage *st = open_at("s3://hugehead/run", DEADLINE_MS, 0, 0, 0);
  const ks_io *io = ks_storage_io(st);
  int fd;
  uint64_t size = 0;
  assert_int_equal(io->open_fn(io->ctx, "run/x", &fd, &size), EFBIG);
  char url[128];
  snprintf(url, sizeof url, "HEAD %s/hugehead/run/x", g_endpoint);
  assert_failure(st, KS_E_LIMIT, url, "exceeds the largest object size (5 TiB)", NULL);
  ks_storage_free(st);
}

static void body_longer_than_range(void **state) {
  (void)state;
  oversized_read("long", "answer longer than the 100 bytes asked");
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s PYTHON HOSTILE_PY\n", argv[0]);
    return 2;
  }
  g_python = argv[1];
  g_script = argv[2];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(endless_listing_budgets),
      cmocka_unit_test(endless_listing_deadline),
      cmocka_unit_test(drip_one_byte_every_2s),
      cmocka_unit_test(huge_content_length),
      cmocka_unit_test(body_longer_than_range),
  };
  return cmocka_run_group_tests(tests, start_server, stop_server);
}
