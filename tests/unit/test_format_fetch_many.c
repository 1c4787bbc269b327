/*
 * ks_reader_fetch_many: the same bytes as one ks_reader_fetch per tensor whatever the thread
 * count, above and below the size where threads start; a damaged tensor reported as the earliest
 * failing job; bad indices, small buffers and NULL arguments refused. Jobs without memory (buf
 * NULL, cap 0) only check their tensor: good ones pass, a damaged one fails as a fetch would, and
 * a failed allocation of the scratch piece is KS_E_NOMEM with nothing leaked. ks_reader_memory
 * hands out the whole file of a copy or a mapping, never a lazy reader's header alone.
 */
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

#define N_TENSORS 24

/* 24 tensors of 2 MiB plus odd sizes (48+ MiB in all: the parallel path), then reopens lazily. */
static char *write_file(const char *dir, size_t scale) {
  ks_statedict *sd;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  for (int t = 0; t < N_TENSORS; t++) {
    char name[32];
    int64_t shape[1] = {(int64_t)((scale << 20) / 4 + (size_t)t * 7)};
    uint32_t *v;
    snprintf(name, sizeof name, "t%02d", t);
    assert_int_equal(ks_statedict_new_tensor(sd, name, KS_U32, 1, shape, (void **)&v, NULL), KS_OK);
    for (int64_t i = 0; i < shape[0]; i++) v[i] = (uint32_t)(i * 2654435761u) ^ (uint32_t)t;
  }
  char *path = ks_test_path(dir, scale > 1 ? "big.keepsake" : "small.keepsake");
  ks_save_opts so = {.io = ks_test_io_nosync()};
  assert_int_equal(ks_save(path, sd, NULL, &so, NULL), KS_OK);
  ks_statedict_free(sd);
  return path;
}

static ks_reader *open_lazy(const char *path) {
  ks_read_opts o = {.size = sizeof o, .mode = KS_READ_LAZY};
  ks_reader *r;
  assert_int_equal(ks_reader_open(path, &o, &r, NULL), KS_OK);
  return r;
}

/* Jobs for every tensor, each into its own buffer; the buffers are freed by free_jobs. */
static ks_fetch *jobs_for(const ks_reader *r, size_t *n) {
  *n = ks_reader_count(r);
  ks_fetch *jobs = calloc(*n, sizeof *jobs);
  for (size_t i = 0; i < *n; i++) {
    ks_tensor_info info;
    assert_int_equal(ks_reader_tensor_info(r, i, &info), KS_OK);
    size_t bytes = (size_t)(info.end - info.begin);
    jobs[i] = (ks_fetch){i, malloc(bytes ? bytes : 1), bytes};
  }
  return jobs;
}

static void free_jobs(ks_fetch *jobs, size_t n) {
  for (size_t i = 0; i < n; i++) free(jobs[i].buf);
  free(jobs);
}

static void same_bytes_for_every_thread_count(void **state) {
  (void)state;
  char *dir = ks_test_tmpdir("fetch-many");
  for (size_t scale = 1; scale <= 2; scale++) { /* 24+ MiB: one thread; 48+ MiB: several */
    char *path = write_file(dir, scale);
    ks_reader *r = open_lazy(path);
    size_t n;
    ks_fetch *ref = jobs_for(r, &n);
    for (size_t i = 0; i < n; i++) assert_int_equal(ks_reader_fetch(r, i, ref[i].buf, ref[i].cap, NULL), KS_OK);
    for (unsigned threads = 0; threads <= 4; threads++) {
      ks_fetch *jobs = jobs_for(r, &n);
      assert_int_equal(ks_reader_fetch_many(r, jobs, n, threads, NULL), KS_OK);
      for (size_t i = 0; i < n; i++) assert_memory_equal(jobs[i].buf, ref[i].buf, ref[i].cap);
      for (size_t i = 0; i < n; i += 2) { /* every other job only checked */
        free(jobs[i].buf);
        jobs[i].buf = NULL;
        jobs[i].cap = 0;
      }
      assert_int_equal(ks_reader_fetch_many(r, jobs, n, threads, NULL), KS_OK);
      for (size_t i = 1; i < n; i += 2) assert_memory_equal(jobs[i].buf, ref[i].buf, ref[i].cap);
      free_jobs(jobs, n);
    }
    free_jobs(ref, n);
    ks_reader_free(r);
    free(path);
  }
  assert_int_equal(ks_reader_fetch_many(NULL, NULL, 0, 0, NULL), KS_E_INVALID);
  ks_test_rmtree(dir);
  free(dir);
}

static void the_earliest_failure_is_reported(void **state) {
  (void)state;
  char *dir = ks_test_tmpdir("fetch-many-bad");
  char *path = write_file(dir, 2);
  ks_reader *r = open_lazy(path);
  ks_tensor_info t5, t17;
  assert_int_equal(ks_reader_tensor_info(r, 5, &t5), KS_OK);
  assert_int_equal(ks_reader_tensor_info(r, 17, &t17), KS_OK);
  char name5[32]; /* the info's name lives in the reader, freed below */
  snprintf(name5, sizeof name5, "%s", t5.name);
  ks_reader_free(r);
  size_t len;
  uint8_t *bytes = ks_test_read_file(path, &len);
  bytes[t17.begin + 3] ^= 1; /* two damaged tensors, in different threads' runs */
  bytes[t5.end - 1] ^= 1;
  assert_int_equal(ks_test_write_file(path, bytes, len), 0);
  free(bytes);
  r = open_lazy(path);
  size_t n;
  for (unsigned threads = 1; threads <= 4; threads++) {
    ks_fetch *jobs = jobs_for(r, &n);
    ks_error err;
    assert_int_equal(ks_reader_fetch_many(r, jobs, n, threads, &err), KS_E_CHECKSUM);
    assert_string_equal(err.key, name5);
    free_jobs(jobs, n);
    ks_fetch *checks = calloc(n, sizeof *checks); /* the same with nothing kept */
    for (size_t i = 0; i < n; i++) checks[i] = (ks_fetch){i, NULL, 0};
    assert_int_equal(ks_reader_fetch_many(r, checks, n, threads, &err), KS_E_CHECKSUM);
    assert_string_equal(err.key, name5);
    assert_int_equal(ks_reader_fetch_many(r, checks + 6, 11, threads, &err), KS_OK); /* 6..16: intact */
    free(checks);
  }
  ks_fetch bad[2] = {{0, NULL, 0}, {999, NULL, 0}};
  ks_fetch *jobs = jobs_for(r, &n);
  bad[0] = jobs[0];
  ks_error err;
  assert_int_equal(ks_reader_fetch_many(r, bad, 2, 2, &err), KS_E_NOTFOUND);
  jobs[1].cap -= 1; /* a buffer one byte short */
  assert_int_equal(ks_reader_fetch_many(r, jobs + 1, 1, 1, &err), KS_E_INVALID);
  free_jobs(jobs, n);
  ks_reader_free(r);
  free(path);
  ks_test_rmtree(dir);
  free(dir);
}

static void a_check_that_cannot_allocate_fails_cleanly(void **state) {
  (void)state;
  char *dir = ks_test_tmpdir("fetch-many-nomem");
  char *path = write_file(dir, 1);
  ks_test_alloc ta;
  ks_test_alloc_init(&ta, 0);
  ks_read_opts o = {.size = sizeof o, .mode = KS_READ_LAZY, .alloc = &ta.a};
  ks_reader *r;
  assert_int_equal(ks_reader_open(path, &o, &r, NULL), KS_OK);
  ks_fetch check = {3, NULL, 0};
  ta.fail_at = ta.calls + 1; /* the scratch piece */
  ks_error err;
  assert_int_equal(ks_reader_fetch_many(r, &check, 1, 1, &err), KS_E_NOMEM);
  ta.fail_at = 0;
  long live = ta.live;
  assert_int_equal(ks_reader_fetch_many(r, &check, 1, 1, &err), KS_OK);
  assert_int_equal(ta.live, live);
  ks_reader_free(r);
  assert_int_equal(ta.live, 0);
  free(path);
  ks_test_rmtree(dir);
  free(dir);
}

/* ks_reader_memory: the whole file, byte for byte, from a copy read on several threads (48+ MiB,
   verified as it lands) and from a mapping; a lazy reader, which holds the header only, and NULL
   arguments are refused. */
static void memory_is_the_whole_file(void **state) {
  (void)state;
  char *dir = ks_test_tmpdir("fetch-many");
  char *path = write_file(dir, 2);
  size_t want_len;
  uint8_t *want = ks_test_read_file(path, &want_len);
  assert_non_null(want);
  ks_read_mode modes[] = {KS_READ_COPY, KS_READ_MMAP};
  for (size_t m = 0; m < 2; m++) {
    ks_read_opts o = {.size = sizeof o, .mode = modes[m], .verify_checksums = 1};
    ks_reader *r;
    assert_int_equal(ks_reader_open(path, &o, &r, NULL), KS_OK);
    const void *p = NULL;
    size_t len = 0;
    assert_int_equal(ks_reader_memory(r, &p, &len, NULL), KS_OK);
    assert_int_equal(len, want_len);
    assert_memory_equal(p, want, want_len);
    assert_int_equal(ks_reader_memory(r, NULL, &len, NULL), KS_E_INVALID);
    ks_reader_free(r);
  }
  ks_reader *lazy = open_lazy(path);
  const void *p = NULL;
  size_t len = 0;
  ks_error err;
  assert_int_equal(ks_reader_memory(lazy, &p, &len, &err), KS_E_UNSUPPORTED);
  assert_null(p);
  ks_reader_free(lazy);
  assert_int_equal(ks_reader_memory(NULL, &p, &len, NULL), KS_E_INVALID);
  free(want);
  free(path);
  ks_test_rmtree(dir);
  free(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(same_bytes_for_every_thread_count),
      cmocka_unit_test(the_earliest_failure_is_reported),
      cmocka_unit_test(a_check_that_cannot_allocate_fails_cleanly),
      cmocka_unit_test(memory_is_the_whole_file),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
