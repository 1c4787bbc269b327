/* Storage locations without servers: parsing, the local backend, option checks, failed connections
 * and allocation failures. Built with and without libcurl (KS_TEST_HAVE_CURL says which). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "keepsake/keepsake.h"
#include "testutil.h"

static ks_status try_open(const char *loc, ks_storage **st, ks_error *e) {
  ks_storage_opts o = KS_OPTS_INIT(ks_storage_opts);
  o.endpoint = "http://127.0.0.1:1"; /* never the environment's */
  return ks_storage_open(loc, &o, st, e);
}

static void local_locations(void **state) {
  (void)state;
  ks_storage *st = NULL;
  ks_error e;
  assert_int_equal(ks_storage_open("some/dir", NULL, &st, &e), KS_OK);
  assert_false(ks_storage_is_remote(st));
  assert_false(ks_storage_is_read_only(st));
  assert_ptr_equal(ks_storage_io(st), ks_io_posix()); /* the writers recognise the POSIX table */
  assert_string_equal(ks_storage_path(st), "some/dir");
  char buf[16] = "x";
  assert_int_equal(ks_storage_last_error(st, buf, sizeof buf), 0);
  assert_string_equal(buf, "");
  ks_storage_free(st);
  assert_int_equal(ks_storage_open("file:///tmp/run", NULL, &st, &e), KS_OK);
  assert_string_equal(ks_storage_path(st), "/tmp/run");
  ks_storage_free(st);
  ks_storage_free(NULL);
  assert_null(ks_storage_io(NULL));
  assert_null(ks_storage_path(NULL));
  assert_false(ks_storage_is_remote(NULL));
}

static void bad_locations(void **state) {
  (void)state;
  ks_storage *st = (ks_storage *)0x1;
  ks_error e;
  assert_int_equal(ks_storage_open("", NULL, &st, &e), KS_E_INVALID);
  assert_int_equal(ks_storage_open(NULL, NULL, &st, &e), KS_E_INVALID);
  assert_int_equal(ks_storage_open("x", NULL, NULL, &e), KS_E_INVALID);
  assert_int_equal(ks_storage_open("ftp://host/x", NULL, &st, &e), KS_E_UNSUPPORTED);
  assert_int_equal(ks_storage_open("file://", NULL, &st, &e), KS_E_INVALID);
  struct {
    size_t size;
  } tiny = {3};
  assert_int_equal(ks_storage_open("x", (const ks_storage_opts *)(const void *)&tiny, &st, &e), KS_E_INVALID);
#if KS_TEST_HAVE_CURL
  assert_int_equal(try_open("s3://ab", &st, &e), KS_E_INVALID); /* 3 to 63 characters */
  assert_int_equal(try_open("s3://Bucket/x", &st, &e), KS_E_INVALID);
  assert_int_equal(try_open("s3://bucket_x", &st, &e), KS_E_INVALID);
  assert_int_equal(try_open("http:///path", &st, &e), KS_E_INVALID);
  ks_storage_opts o = KS_OPTS_INIT(ks_storage_opts);
  o.endpoint = "ftp://h";
  assert_int_equal(ks_storage_open("s3://bucket", &o, &st, &e), KS_E_INVALID);
#else
  assert_int_equal(try_open("s3://bucket/x", &st, &e), KS_E_UNSUPPORTED);
  assert_non_null(strstr(e.message, "libcurl"));
  assert_int_equal(try_open("https://host/x", &st, &e), KS_E_UNSUPPORTED);
#endif
}

#if KS_TEST_HAVE_CURL
static void remote_paths(void **state) {
  (void)state;
  ks_storage *st = NULL;
  ks_error e;
  assert_int_equal(try_open("s3://bucket", &st, &e), KS_OK);
  assert_true(ks_storage_is_remote(st));
  assert_false(ks_storage_is_read_only(st));
  assert_string_equal(ks_storage_path(st), ".");
  assert_int_equal(ks_io_check(ks_storage_io(st), &e), KS_OK);
  ks_storage_free(st);
  assert_int_equal(try_open("s3://my.bucket-1/runs/a//", &st, &e), KS_OK);
  assert_string_equal(ks_storage_path(st), "runs/a"); /* no trailing slash */
  ks_storage_free(st);
  assert_int_equal(try_open("https://host:8080/ckpt/x.keepsake", &st, &e), KS_OK);
  assert_true(ks_storage_is_read_only(st));
  assert_string_equal(ks_storage_path(st), "https://host:8080/ckpt/x.keepsake");
  const ks_io *io = ks_storage_io(st);
  assert_int_equal(ks_io_check(io, &e), KS_OK);
  int fd;
  assert_int_equal(io->create_fn(io->ctx, "https://host:8080/ckpt/y", &fd), EROFS);
  assert_int_equal(io->unlink_fn(io->ctx, "https://host:8080/ckpt/x.keepsake"), EROFS);
  assert_int_equal(io->list_fn(io->ctx, "https://host:8080/ckpt", "", NULL, NULL), ENOTSUP);
  assert_true(ks_io_caps(io) & KS_IO_CAP_READ_ONLY);
  /* a checkpoint manager writes its run directory: refused at once, before any request */
  ks_ckpt_opts co = KS_OPTS_INIT(ks_ckpt_opts);
  co.run_dir = ks_storage_path(st);
  co.io = io;
  ks_ckpt_manager *m = NULL;
  assert_int_equal(ks_ckpt_manager_create(&co, &m, &e), KS_E_UNSUPPORTED);
  assert_null(m);
  assert_non_null(strstr(e.message, "read-only"));
  ks_storage_free(st);
}

/* Nothing listens on port 1: the request fails after its retries with ECONNREFUSED and a detail. */
static void refused_connection(void **state) {
  (void)state;
  ks_storage_opts o = KS_OPTS_INIT(ks_storage_opts);
  o.endpoint = "http://127.0.0.1:1";
  o.max_retries = 2;
  o.retry_base_ms = 1;
  ks_storage *st = NULL;
  ks_error e;
  assert_int_equal(ks_storage_open("s3://bucket/run", &o, &st, &e), KS_OK);
  const ks_io *io = ks_storage_io(st);
  ks_io_stat s;
  assert_int_equal(io->stat_fn(io->ctx, "run/x", &s), ECONNREFUSED);
  char detail[512];
  assert_true(ks_storage_last_error(st, detail, sizeof detail) > 0);
  assert_non_null(strstr(detail, "HEAD http://127.0.0.1:1/bucket/run/x"));
  assert_non_null(strstr(detail, "after 2 retries"));
  /* a save stages its bytes, then fails at the upload, naming the file */
  ks_statedict *sd;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_int(sd, "n", 1, NULL), KS_OK);
  ks_save_opts so = KS_OPTS_INIT(ks_save_opts);
  so.io = io;
  assert_int_equal(ks_save("run/x.keepsake", sd, NULL, &so, &e), KS_E_IO);
  assert_non_null(strstr(e.file, "run/x.keepsake"));
  ks_statedict_free(sd);
  ks_storage_free(st);
}

/* Every allocation of opening (and of one staged write) may fail: an error, never a leak or a crash. */
static void allocation_failures(void **state) {
  (void)state;
  int ok = 0;
  for (long n = 1; n < 200 && !ok; n++) {
    ks_test_alloc ta;
    ks_test_alloc_init(&ta, n);
    ks_storage_opts o = KS_OPTS_INIT(ks_storage_opts);
    o.alloc = &ta.a;
    o.endpoint = "http://127.0.0.1:1";
    ks_storage *st = NULL;
    ks_error e;
    ks_status s = ks_storage_open("s3://bucket/run", &o, &st, &e);
    assert_true(s == KS_OK || s == KS_E_NOMEM);
    if (s) continue;
    const ks_io *io = ks_storage_io(st);
    int fd;
    size_t w;
    int rc = io->create_fn(io->ctx, "run/.a.tmp-XXXXXX", &fd);
    if (!rc) rc = io->write_fn(io->ctx, fd, "abc", 3, &w);
    if (!rc) rc = io->close_fn(io->ctx, fd);
    if (!rc) rc = io->unlink_fn(io->ctx, "run/.a.tmp-XXXXXX");
    assert_true(rc == 0 || rc == ENOMEM);
    ok = rc == 0;
    ks_storage_free(st);
  }
  assert_true(ok);
}
#endif

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(local_locations),
      cmocka_unit_test(bad_locations),
#if KS_TEST_HAVE_CURL
      cmocka_unit_test(remote_paths),
      cmocka_unit_test(refused_connection),
      cmocka_unit_test(allocation_failures),
#endif
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
