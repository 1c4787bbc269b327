/*
 * KS_READ_LAZY through a table that cannot map and counts what it reads (the
 * shape of a remote backend): open reads the header only, a fetch reads only
 * its tensor, checksums are verified on arrival, a full load reads each byte
 * once; the caching table downloads bytes once (assembling a read from the
 * pieces that cover it) and never trusts a damaged piece.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "keepsake/io_cache.h"
#include "test_format_helpers.h"

/* ks_reader_fetch of the tensor named `name` (KS_E_NOTFOUND when there is none). */
static ks_status fetch_name(const ks_reader *r, const char *name, void *buf, size_t cap, ks_error *err) {
  long i = ks_reader_find(r, name);
  return ks_reader_fetch(r, i < 0 ? SIZE_MAX : (size_t)i, buf, cap, err);
}

#define BIG_BYTES ((size_t)64 << 20)
#define SMALL_N 40

typedef struct fixture {
  char *dir, *path;
  ks_statedict *sd; /* what was saved */
  size_t file_size;
  ks_io *counter;   /* over POSIX, no map */
} fixture;

/* 64 MiB of "big" first, then small tensors (so they lie past the first 64 KiB), and a scalar. */
static ks_statedict *big_dict(void) {
  ks_statedict *sd;
  if (ks_statedict_create(NULL, &sd, NULL)) return NULL;
  int64_t shape[1] = {(int64_t)(BIG_BYTES / 4)};
  uint32_t *big;
  assert_int_equal(ks_statedict_new_tensor(sd, "model/big", KS_U32, 1, shape, (void **)&big, NULL), KS_OK);
  for (size_t i = 0; i < BIG_BYTES / 4; i++) big[i] = (uint32_t)(i * 2654435761u);
  for (int t = 0; t < SMALL_N; t++) {
    char name[32];
    int64_t s[1] = {256};
    float *v;
    snprintf(name, sizeof name, "model/small%02d", t);
    assert_int_equal(ks_statedict_new_tensor(sd, name, KS_F32, 1, s, (void **)&v, NULL), KS_OK);
    for (int i = 0; i < 256; i++) v[i] = (float)(t * 1000 + i);
  }
  assert_int_equal(ks_statedict_set_int(sd, "step", 42, NULL), KS_OK);
  return sd;
}

static int setup(void **state) {
  fixture *fx = calloc(1, sizeof *fx);
  fx->dir = ks_test_tmpdir("fmt-lazy");
  fx->path = ks_test_path(fx->dir, "ckpt.keepsake");
  fx->sd = big_dict();
  ks_save_opts so = {.io = ks_test_io_nosync()};
  if (!fx->sd || ks_save(fx->path, fx->sd, NULL, &so, NULL)) return -1;
  struct stat sb;
  if (stat(fx->path, &sb)) return -1;
  fx->file_size = (size_t)sb.st_size;
  if (ks_io_counter_create(NULL, 1, NULL, &fx->counter, NULL)) return -1;
  *state = fx;
  return 0;
}

static int teardown(void **state) {
  fixture *fx = *state;
  ks_test_rmtree(fx->dir);
  free(fx->dir);
  free(fx->path);
  ks_statedict_free(fx->sd);
  ks_io_counter_free(fx->counter);
  free(fx);
  return 0;
}

static ks_reader *open_lazy(const char *path, const ks_io *io) {
  ks_read_opts o = {.mode = KS_READ_LAZY, .io = io};
  ks_reader *r = NULL;
  ks_error e;
  ks_status st = ks_reader_open(path, &o, &r, &e);
  if (st) print_error("open: %s\n", e.message);
  assert_int_equal(st, KS_OK);
  return r;
}

static ks_io_counts counts(const ks_io *io) {
  ks_io_counts c;
  ks_io_counter_get(io, &c);
  return c;
}

static void test_open_reads_header_only(void **state) {
  fixture *fx = *state;
  ks_io_counter_reset(fx->counter);
  ks_reader *r = open_lazy(fx->path, fx->counter);
  ks_io_counts c = counts(fx->counter);
  assert_true(c.read_bytes < 128 * 1024);
  assert_true(c.read_calls <= 2);
  assert_int_equal(c.map_calls, 0);
  assert_int_equal(ks_reader_count(r), SMALL_N + 1);
  assert_int_equal(ks_reader_file_size(r), fx->file_size);
  ks_statedict *sc;
  assert_int_equal(ks_statedict_create(NULL, &sc, NULL), KS_OK);
  assert_int_equal(ks_reader_scalars(r, sc, NULL), KS_OK); /* from the header: no read */
  ks_entry en;
  assert_int_equal(ks_statedict_get(sc, "step", &en), KS_OK);
  assert_int_equal(en.i, 42);
  ks_statedict_free(sc);
  assert_int_equal(counts(fx->counter).read_bytes, c.read_bytes);
  /* verifying reads forward in large windows: the 64 MiB tensor, then all small ones at once */
  ks_io_counter_reset(fx->counter);
  assert_int_equal(ks_reader_verify(r, NULL, NULL, NULL), KS_OK);
  c = counts(fx->counter);
  assert_true(c.read_calls <= 3);
  assert_true(c.read_bytes <= fx->file_size);
  ks_reader_free(r);
}

static void test_fetch_reads_only_the_tensor(void **state) {
  fixture *fx = *state;
  ks_reader *r = open_lazy(fx->path, fx->counter);
  ks_io_counter_reset(fx->counter);
  float buf[256];
  ks_error e;
  assert_int_equal(fetch_name(r, "model/small07", buf, sizeof buf, &e), KS_OK);
  ks_io_counts c = counts(fx->counter);
  assert_int_equal(c.read_bytes, sizeof buf);
  assert_int_equal(c.read_calls, 1);
  assert_memory_equal(buf, ks_statedict_tensor(fx->sd, "model/small07")->data, sizeof buf);
  /* through ks_reader_tensor: fetched once into the reader, then served from memory */
  ks_tensor v;
  assert_int_equal(ks_reader_tensor(r, "model/small08", &v, &e), KS_OK);
  assert_int_equal(ks_reader_tensor(r, "model/small08", &v, &e), KS_OK);
  assert_int_equal(counts(fx->counter).read_bytes, 2 * sizeof buf);
  assert_memory_equal(v.data, ks_statedict_tensor(fx->sd, "model/small08")->data, v.nbytes);
  /* the description of a tensor not fetched yet reads nothing */
  ks_io_counter_reset(fx->counter);
  ks_tensor d;
  long i9 = ks_reader_find(r, "model/small09");
  assert_true(i9 >= 0);
  assert_int_equal(ks_reader_tensor_desc(r, (size_t)i9, &d), KS_OK);
  const ks_tensor *want = ks_statedict_tensor(fx->sd, "model/small09");
  assert_int_equal(d.dtype, want->dtype);
  assert_int_equal(d.rank, want->rank);
  assert_int_equal(d.shape[0], want->shape[0]);
  assert_int_equal(d.nbytes, want->nbytes);
  assert_null(d.data);
  assert_int_equal(counts(fx->counter).read_calls, 0);
  assert_int_equal(ks_reader_tensor_desc(r, ks_reader_count(r), &d), KS_E_NOTFOUND);
  assert_int_equal(ks_reader_tensor_desc(r, 0, NULL), KS_E_NOTFOUND);
  /* too small a buffer, unknown name */
  assert_int_equal(fetch_name(r, "model/small07", buf, 16, &e), KS_E_INVALID);
  assert_int_equal(ks_reader_find(r, "nope"), -1);
  assert_int_equal(ks_reader_fetch(r, ks_reader_count(r), buf, sizeof buf, &e), KS_E_NOTFOUND);
  ks_reader_free(r);
}

/* Flips one byte at absolute offset `at` of the file. */
static void flip(const char *path, uint64_t at) {
  FILE *f = fopen(path, "r+b");
  assert_non_null(f);
  assert_int_equal(fseek(f, (long)at, SEEK_SET), 0);
  int ch = fgetc(f);
  assert_int_equal(fseek(f, (long)at, SEEK_SET), 0);
  fputc(ch ^ 0x40, f);
  fclose(f);
}

static void test_corrupt_tensor_fails_its_fetch_only(void **state) {
  fixture *fx = *state;
  ks_reader *r = open_lazy(fx->path, fx->counter);
  long i = ks_reader_find(r, "model/small03");
  ks_tensor_info info;
  assert_int_equal(ks_reader_tensor_info(r, (size_t)i, &info), KS_OK);
  ks_reader_free(r);
  flip(fx->path, info.begin + 5);
  r = open_lazy(fx->path, fx->counter); /* structure is intact: open succeeds */
  float buf[256];
  ks_error e;
  assert_int_equal(ks_reader_fetch(r, (size_t)i, buf, sizeof buf, &e), KS_E_CHECKSUM);
  assert_string_equal(e.key, "model/small03");
  assert_int_equal(e.offset, (int64_t)info.begin);
  ks_tensor v;
  assert_int_equal(ks_reader_tensor(r, "model/small03", &v, &e), KS_E_CHECKSUM);
  assert_int_equal(ks_reader_tensor_at(r, (size_t)i, NULL, &v), KS_E_CHECKSUM);
  assert_int_equal(fetch_name(r, "model/small04", buf, sizeof buf, &e), KS_OK);
  assert_int_equal(ks_reader_tensor(r, "model/small02", &v, &e), KS_OK);
  assert_int_equal(ks_reader_verify(r, NULL, NULL, &e), KS_E_CHECKSUM);
  assert_string_equal(e.key, "model/small03");
  ks_reader_free(r);
  /* ks_reader_fetch verifies in the other modes too */
  ks_read_opts mm = {.mode = KS_READ_MMAP};
  assert_int_equal(ks_reader_open(fx->path, &mm, &r, &e), KS_OK);
  assert_int_equal(ks_reader_fetch(r, (size_t)i, buf, sizeof buf, &e), KS_E_CHECKSUM);
  assert_int_equal(e.offset, (int64_t)info.begin);
  assert_int_equal(fetch_name(r, "model/small04", buf, sizeof buf, &e), KS_OK);
  assert_memory_equal(buf, ks_statedict_tensor(fx->sd, "model/small04")->data, sizeof buf);
  ks_reader_free(r);
  /* a full load stops at the bad tensor */
  ks_read_opts o = {.mode = KS_READ_LAZY, .io = fx->counter};
  ks_statedict *sd = NULL;
  assert_int_equal(ks_load(fx->path, &o, &sd, NULL, &e), KS_E_CHECKSUM);
  assert_string_equal(e.key, "model/small03");
  assert_null(sd);
  flip(fx->path, info.begin + 5); /* restore for the other tests */
}

static void assert_same_tensors(const ks_statedict *a, const ks_statedict *b) {
  assert_int_equal(ks_statedict_count(a), ks_statedict_count(b));
  for (size_t i = 0; i < ks_statedict_count(a); i++) {
    ks_entry e;
    assert_int_equal(ks_statedict_at(a, i, &e), KS_OK);
    if (e.kind != KS_VAL_TENSOR) continue;
    const ks_tensor *t = ks_statedict_tensor(b, e.name);
    assert_non_null(t);
    assert_int_equal(t->nbytes, e.tensor.nbytes);
    assert_memory_equal(t->data, e.tensor.data, t->nbytes);
  }
}

static void test_full_load_reads_each_byte_once(void **state) {
  fixture *fx = *state;
  ks_io_counter_reset(fx->counter);
  ks_read_opts o = {.mode = KS_READ_LAZY, .io = fx->counter};
  ks_statedict *sd = NULL;
  ks_error e;
  assert_int_equal(ks_load(fx->path, &o, &sd, NULL, &e), KS_OK);
  ks_io_counts c = counts(fx->counter);
  assert_int_equal(c.read_bytes, fx->file_size);
  assert_true(c.read_calls > 2); /* several ranges (in parallel) */
  assert_same_tensors(fx->sd, sd);
  ks_statedict_free(sd);
  /* the same through the mapped mode of the plain table */
  ks_read_opts m = {.mode = KS_READ_MMAP};
  assert_int_equal(ks_load(fx->path, &m, &sd, NULL, &e), KS_OK);
  assert_same_tensors(fx->sd, sd);
  ks_statedict_free(sd);
}

typedef struct race {
  ks_reader *r;
  const void *got;
} race;

static void *grab(void *arg) {
  race *q = arg;
  ks_tensor v;
  if (ks_reader_tensor(q->r, "model/small11", &v, NULL) == KS_OK) q->got = v.data;
  return NULL;
}

static void test_concurrent_first_use_keeps_one_copy(void **state) {
  fixture *fx = *state;
  ks_reader *r = open_lazy(fx->path, fx->counter);
  race q[4];
  pthread_t t[4];
  for (int i = 0; i < 4; i++) {
    q[i] = (race){r, NULL};
    assert_int_equal(pthread_create(&t[i], NULL, grab, &q[i]), 0);
  }
  for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < 4; i++) {
    assert_non_null(q[i].got);
    assert_ptr_equal(q[i].got, q[0].got);
  }
  ks_reader_free(r);
}

/* ---- the cache ---- */

static char *first_piece(const char *cache) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "find '%s' -type f -name '0*' | sort | head -n 1", cache);
  char *out = NULL;
  if (ks_test_run(cmd, &out) != 0 || !out) return NULL;
  out[strcspn(out, "\n")] = '\0';
  return out;
}

static void fetch_small(const char *path, const ks_io *io, const ks_statedict *want) {
  ks_reader *r = open_lazy(path, io);
  float buf[256];
  ks_error e;
  assert_int_equal(fetch_name(r, "model/small20", buf, sizeof buf, &e), KS_OK);
  assert_memory_equal(buf, ks_statedict_tensor(want, "model/small20")->data, sizeof buf);
  ks_reader_free(r);
}

static void test_cache_downloads_once(void **state) {
  fixture *fx = *state;
  char *cdir = ks_test_path(fx->dir, "cache");
  ks_io *cache;
  ks_error e;
  assert_int_equal(ks_io_cache_create(fx->counter, cdir, NULL, &cache, &e), KS_OK);
  assert_null(cache->map_fn);
  ks_io_counter_reset(fx->counter);
  fetch_small(fx->path, cache, fx->sd);
  uint64_t first = counts(fx->counter).read_bytes;
  assert_true(first > 0);
  ks_io_counter_reset(fx->counter);
  fetch_small(fx->path, cache, fx->sd);
  assert_int_equal(counts(fx->counter).read_bytes, 0);
  ks_io_cache_stats st;
  ks_io_cache_get_stats(cache, &st);
  assert_true(st.stored >= 2);
  assert_true(st.hit_reads >= 2);
  /* a full load twice: the second downloads nothing */
  ks_read_opts o = {.mode = KS_READ_LAZY, .io = cache};
  ks_statedict *sd = NULL;
  assert_int_equal(ks_load(fx->path, &o, &sd, NULL, &e), KS_OK);
  ks_statedict_free(sd);
  ks_io_counter_reset(fx->counter);
  assert_int_equal(ks_load(fx->path, &o, &sd, NULL, &e), KS_OK);
  assert_int_equal(counts(fx->counter).read_bytes, 0);
  assert_same_tensors(fx->sd, sd);
  ks_statedict_free(sd);
  ks_io_cache_free(cache);
  ks_test_rmtree(cdir);
  free(cdir);
}

static void test_cache_rejects_damaged_pieces(void **state) {
  fixture *fx = *state;
  char *cdir = ks_test_path(fx->dir, "cache2");
  ks_io *cache;
  assert_int_equal(ks_io_cache_create(fx->counter, cdir, NULL, &cache, NULL), KS_OK);
  fetch_small(fx->path, cache, fx->sd); /* fills the cache: the header piece comes first in name order */
  char *piece = first_piece(cdir);
  assert_non_null(piece);
  struct stat sb;
  assert_int_equal(stat(piece, &sb), 0);
  /* corrupted: a flipped data byte */
  flip(piece, (uint64_t)sb.st_size - 3);
  ks_io_counter_reset(fx->counter);
  fetch_small(fx->path, cache, fx->sd);
  assert_true(counts(fx->counter).read_bytes > 0);
  ks_io_cache_stats st;
  ks_io_cache_get_stats(cache, &st);
  assert_int_equal(st.rejected, 1);
  /* re-fetched and kept again: the next read is a hit */
  ks_io_counter_reset(fx->counter);
  fetch_small(fx->path, cache, fx->sd);
  assert_int_equal(counts(fx->counter).read_bytes, 0);
  /* torn: the piece cut short */
  assert_int_equal(truncate(piece, sb.st_size / 2), 0);
  ks_io_counter_reset(fx->counter);
  fetch_small(fx->path, cache, fx->sd);
  assert_true(counts(fx->counter).read_bytes > 0);
  ks_io_cache_get_stats(cache, &st);
  assert_int_equal(st.rejected, 2);
  /* unlink through the table drops the file's pieces */
  free(piece);
  char *copy = ks_test_path(fx->dir, "copy.keepsake");
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "cp '%s' '%s'", fx->path, copy);
  assert_int_equal(ks_test_run(cmd, NULL), 0);
  fetch_small(copy, cache, fx->sd);
  assert_int_equal(cache->unlink_fn(cache->ctx, copy), 0);
  assert_int_equal(ks_test_run(cmd, NULL), 0);
  ks_io_counter_reset(fx->counter);
  fetch_small(copy, cache, fx->sd);
  assert_true(counts(fx->counter).read_bytes > 0);
  free(copy);
  ks_io_cache_free(cache);
  ks_test_rmtree(cdir);
  free(cdir);
}

/* A file rewritten (same path, same size) through the cache: the rename drops the old pieces. */
static void test_cache_forgets_replaced_files(void **state) {
  fixture *fx = *state;
  char *cdir = ks_test_path(fx->dir, "cache3"), *p = ks_test_path(fx->dir, "same.keepsake");
  ks_io *cache;
  assert_int_equal(ks_io_cache_create(ks_test_io_nosync(), cdir, NULL, &cache, NULL), KS_OK);
  ks_statedict *one = fmt_small_dict(1), *two = fmt_small_dict(2);
  ks_save_opts so = {.io = cache};
  float w[6];
  ks_error e;
  assert_int_equal(ks_save(p, one, NULL, &so, &e), KS_OK);
  ks_reader *r = open_lazy(p, cache);
  uint64_t size1 = ks_reader_file_size(r);
  assert_int_equal(fetch_name(r, "model/w", w, sizeof w, &e), KS_OK);
  ks_reader_free(r);
  assert_int_equal(ks_save(p, two, NULL, &so, &e), KS_OK); /* written through the cache's table */
  r = open_lazy(p, cache);
  assert_int_equal(ks_reader_file_size(r), size1); /* same key: only the forgetting protects it */
  assert_int_equal(fetch_name(r, "model/w", w, sizeof w, &e), KS_OK);
  assert_memory_equal(w, ks_statedict_tensor(two, "model/w")->data, sizeof w);
  ks_reader_free(r);
  ks_statedict_free(one);
  ks_statedict_free(two);
  ks_io_cache_free(cache);
  ks_test_rmtree(cdir);
  free(cdir);
  free(p);
}

/* Every allocation of the cache and the reader fails in turn: an error or success, never a leak. */
/* A store whose files carry a validator (as an HTTP ETag): what validator_fn reports, set by the test. */
static char g_validator[64];
static int g_detail_calls;

static int test_validator(void *ctx, int fd, char *buf, size_t cap) {
  (void)ctx;
  (void)fd;
  if (!g_validator[0]) return ENOTSUP;
  snprintf(buf, cap, "%s", g_validator);
  return 0;
}

static size_t test_detail(void *ctx, int rc, char *buf, size_t cap) {
  (void)ctx;
  g_detail_calls++;
  return (size_t)snprintf(buf, cap, "store says %d", rc);
}

/* A file replaced behind the cache (not through it) by one of the same size: the cache tells them apart by
 * the validator open_fn's handle reports, never by path and size alone, and drops the old version's pieces. */
static void test_cache_keys_pieces_by_validator(void **state) {
  fixture *fx = *state;
  char *cdir = ks_test_path(fx->dir, "cache-validator"), *p = ks_test_path(fx->dir, "validated.keepsake");
  ks_io store = *ks_test_io_nosync(), *cache;
  store.validator_fn = test_validator;
  store.detail_fn = test_detail;
  assert_int_equal(ks_io_cache_create(&store, cdir, NULL, &cache, NULL), KS_OK);
  ks_statedict *one = fmt_small_dict(1), *two = fmt_small_dict(2);
  ks_save_opts so = {.io = ks_test_io_nosync()}; /* another writer: not through the cache */
  float w[6];
  ks_error e;
  char v[64];
  snprintf(g_validator, sizeof g_validator, "\"etag-1\"");
  assert_int_equal(ks_save(p, one, NULL, &so, &e), KS_OK);
  ks_reader *r = open_lazy(p, cache);
  uint64_t size1 = ks_reader_file_size(r);
  assert_int_equal(fetch_name(r, "model/w", w, sizeof w, &e), KS_OK);
  ks_reader_free(r);
  int h;
  uint64_t size;
  assert_int_equal(cache->open_fn(cache->ctx, p, &h, &size), 0);
  assert_int_equal(cache->validator_fn(cache->ctx, h, v, sizeof v), 0); /* passed on from the store */
  assert_string_equal(v, "\"etag-1\"");
  assert_int_equal(cache->close_fn(cache->ctx, h), 0);
  assert_int_equal(ks_save(p, two, NULL, &so, &e), KS_OK);
  r = open_lazy(p, cache);
  assert_int_equal(ks_reader_file_size(r), size1);
  assert_int_equal(fetch_name(r, "model/w", w, sizeof w, &e), KS_OK);
  assert_memory_equal(w, ks_statedict_tensor(one, "model/w")->data, sizeof w); /* same validator: the pieces */
  ks_reader_free(r);
  snprintf(g_validator, sizeof g_validator, "\"etag-2\""); /* the store says the content changed */
  r = open_lazy(p, cache);
  assert_int_equal(fetch_name(r, "model/w", w, sizeof w, &e), KS_OK);
  assert_memory_equal(w, ks_statedict_tensor(two, "model/w")->data, sizeof w);
  ks_reader_free(r);
  assert_int_equal(ks_test_dir_entries(cdir), 1); /* the old version's folder is gone */
  /* the store's account of a failure reaches the library's messages through the cache */
  g_detail_calls = 0;
  char *missing = ks_test_path(fx->dir, "no-such.keepsake");
  ks_read_opts ro = {.mode = KS_READ_LAZY, .io = cache};
  assert_int_equal(ks_reader_open(missing, &ro, &r, &e), KS_E_IO);
  assert_non_null(strstr(e.message, "(store says 2)"));
  assert_true(g_detail_calls > 0);
  g_validator[0] = '\0';
  free(missing);
  ks_statedict_free(one);
  ks_statedict_free(two);
  ks_io_cache_free(cache);
  ks_test_rmtree(cdir);
  free(cdir);
  free(p);
}

static void test_cache_alloc_failure_sweep(void **state) {
  fixture *fx = *state;
  char *cdir = ks_test_path(fx->dir, "cache4");
  ks_statedict *want = fmt_small_dict(5);
  char *p = ks_test_path(fx->dir, "five.keepsake");
  ks_save_opts so = {.io = ks_test_io_nosync()};
  assert_int_equal(ks_save(p, want, NULL, &so, NULL), KS_OK);
  for (long n = 1;; n++) {
    ks_test_alloc ta;
    ks_test_alloc_init(&ta, n);
    ks_io *cache = NULL;
    ks_status st = ks_io_cache_create(fx->counter, cdir, &ta.a, &cache, NULL);
    float w[6] = {0};
    if (!st) {
      ks_read_opts o = {.mode = KS_READ_LAZY, .io = cache, .alloc = &ta.a};
      ks_reader *r = NULL;
      st = ks_reader_open(p, &o, &r, NULL);
      if (!st) st = fetch_name(r, "model/w", w, sizeof w, NULL);
      ks_reader_free(r);
    }
    ks_io_cache_free(cache);
    assert_int_equal(ta.live, 0);
    if (ta.calls < n) {
      assert_int_equal(st, KS_OK);
      assert_memory_equal(w, ks_statedict_tensor(want, "model/w")->data, sizeof w);
      break;
    }
    /* the table's ENOMEM reaches the reader as an I/O error; a piece that could not be kept
       (its write failed) still gives the right bytes */
    if (st == KS_OK) assert_memory_equal(w, ks_statedict_tensor(want, "model/w")->data, sizeof w);
    else if (st != KS_E_NOMEM && st != KS_E_IO) fail_msg("allocation %ld: %s", n, ks_status_name(st));
  }
  ks_statedict_free(want);
  ks_test_rmtree(cdir);
  free(cdir);
  free(p);
}

/* ---- the cache: reads over several pieces ---- */

#define PF_SIZE ((size_t)1 << 20)

/* A file of n pseudo-random bytes at path; returns them (free them). */
static uint8_t *write_noise(const char *path, size_t n, uint64_t seed) {
  uint8_t *b = malloc(n);
  assert_non_null(b);
  uint64_t x = seed | 1;
  for (size_t i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b[i] = (uint8_t)(x >> 24);
  }
  assert_int_equal(ks_test_write_file(path, b, n), 0);
  return b;
}

static int open_h(const ks_io *io, const char *path) {
  int h;
  uint64_t size;
  assert_int_equal(io->open_fn(io->ctx, path, &h, &size), 0);
  return h;
}

static void close_h(const ks_io *io, int h) { assert_int_equal(io->close_fn(io->ctx, h), 0); }

/* Reads [off, off + n) through h: 0 when it gave the file's bytes (cut at its end), else nonzero. */
static int read_cmp(const ks_io *io, int h, const uint8_t *file, size_t size, uint64_t off, size_t n) {
  uint8_t *b = malloc(n ? n : 1);
  size_t got = 0, want = off >= size ? 0 : size - off < n ? (size_t)(size - off) : n;
  int rc = io->read_fn(io->ctx, h, b, n, off, &got);
  int bad = rc ? rc : got != want || (want && memcmp(b, file + off, want));
  free(b);
  return bad;
}

static void read_check(const ks_io *io, int h, const uint8_t *file, size_t size, uint64_t off, size_t n) {
  assert_int_equal(read_cmp(io, h, file, size, off, n), 0);
}

/* Reads the windows set in mask (bit i: the i-th of `parts` equal windows) through one handle. */
static void read_windows(const ks_io *io, const char *path, const uint8_t *file, size_t size, int parts,
                         unsigned mask) {
  int h = open_h(io, path);
  for (int i = 0; i < parts; i++)
    if (mask >> i & 1) read_check(io, h, file, size, (uint64_t)i * (size / (size_t)parts), size / (size_t)parts);
  close_h(io, h);
}

static ks_io_cache_stats cache_stats(const ks_io *cache) {
  ks_io_cache_stats st;
  ks_io_cache_get_stats(cache, &st);
  return st;
}

/* A file read in four windows, then whole: assembled from the four pieces, nothing downloaded. */
static void test_cache_assembles_adjacent_pieces(void **state) {
  fixture *fx = *state;
  char *cdir = ks_test_path(fx->dir, "cache5"), *p = ks_test_path(fx->dir, "noise5.bin");
  uint8_t *file = write_noise(p, PF_SIZE, 5);
  ks_io *cache;
  assert_int_equal(ks_io_cache_create(fx->counter, cdir, NULL, &cache, NULL), KS_OK);
  int a = open_h(cache, p);
  for (size_t i = 0; i < 4; i++) read_check(cache, a, file, PF_SIZE, i * PF_SIZE / 4, PF_SIZE / 4);
  ks_io_counter_reset(fx->counter);
  ks_io_cache_stats before = cache_stats(cache);
  read_check(cache, a, file, PF_SIZE, 0, PF_SIZE); /* the pieces this handle kept */
  close_h(cache, a);
  int b = open_h(cache, p); /* pieces found by listing the folder, checked on first use */
  read_check(cache, b, file, PF_SIZE, 0, PF_SIZE);
  read_check(cache, b, file, PF_SIZE, 0, PF_SIZE + 4096); /* past the end: cut there */
  close_h(cache, b);
  assert_int_equal(counts(fx->counter).read_bytes, 0);
  ks_io_cache_stats st = cache_stats(cache);
  assert_int_equal(st.hit_reads - before.hit_reads, 3);
  assert_int_equal(st.hit_bytes - before.hit_bytes, 3 * PF_SIZE);
  assert_int_equal(st.miss_reads, before.miss_reads);
  assert_int_equal(st.stored, 4);
  ks_io_cache_free(cache);
  ks_test_rmtree(cdir);
  free(file);
  free(cdir);
  free(p);
}

/* Half the file cached in two windows: a whole read downloads only the two gaps. */
static void test_cache_reads_only_gaps(void **state) {
  fixture *fx = *state;
  char *cdir = ks_test_path(fx->dir, "cache6"), *p = ks_test_path(fx->dir, "noise6.bin");
  uint8_t *file = write_noise(p, PF_SIZE, 6);
  ks_io *cache;
  assert_int_equal(ks_io_cache_create(fx->counter, cdir, NULL, &cache, NULL), KS_OK);
  read_windows(cache, p, file, PF_SIZE, 4, 0x5); /* windows 0 and 2 */
  ks_io_counter_reset(fx->counter);
  ks_io_cache_stats before = cache_stats(cache);
  int h = open_h(cache, p);
  read_check(cache, h, file, PF_SIZE, 0, PF_SIZE);
  ks_io_counts c = counts(fx->counter);
  assert_int_equal(c.read_bytes, PF_SIZE / 2);
  assert_int_equal(c.read_calls, 2);
  ks_io_cache_stats st = cache_stats(cache);
  assert_int_equal(st.miss_reads - before.miss_reads, 1); /* partly served: one miss */
  assert_int_equal(st.miss_bytes - before.miss_bytes, PF_SIZE / 2);
  assert_int_equal(st.hit_bytes - before.hit_bytes, PF_SIZE / 2);
  assert_int_equal(st.hit_reads, before.hit_reads);
  assert_int_equal(st.stored - before.stored, 2); /* each gap kept */
  close_h(cache, h);
  ks_io_counter_reset(fx->counter);
  read_windows(cache, p, file, PF_SIZE, 1, 1);
  assert_int_equal(counts(fx->counter).read_bytes, 0);
  ks_io_cache_free(cache);
  ks_test_rmtree(cdir);
  free(file);
  free(cdir);
  free(p);
}

/* The piece file of [off, off + len) under cdir (free it), or NULL. */
static char *piece_file(const char *cdir, uint64_t off, uint64_t len) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "find '%s' -type f -name '%016llx-%016llx'", cdir, (unsigned long long)off,
           (unsigned long long)len);
  char *out = NULL;
  if (ks_test_run(cmd, &out) != 0 || !out || !*out) {
    free(out);
    return NULL;
  }
  out[strcspn(out, "\n")] = '\0';
  return out;
}

/* A corrupted middle piece: deleted, its range alone read again, the bytes right. */
static void test_cache_rereads_bad_middle_piece(void **state) {
  fixture *fx = *state;
  char *cdir = ks_test_path(fx->dir, "cache7"), *p = ks_test_path(fx->dir, "noise7.bin");
  uint8_t *file = write_noise(p, PF_SIZE, 7);
  ks_io *cache;
  assert_int_equal(ks_io_cache_create(fx->counter, cdir, NULL, &cache, NULL), KS_OK);
  read_windows(cache, p, file, PF_SIZE, 4, 0xf);
  char *piece = piece_file(cdir, PF_SIZE / 4, PF_SIZE / 4);
  assert_non_null(piece);
  struct stat sb;
  assert_int_equal(stat(piece, &sb), 0);
  flip(piece, (uint64_t)sb.st_size - 1000);
  ks_io_counter_reset(fx->counter);
  read_windows(cache, p, file, PF_SIZE, 1, 1);
  assert_int_equal(counts(fx->counter).read_bytes, PF_SIZE / 4);
  assert_int_equal(cache_stats(cache).rejected, 1);
  ks_io_counter_reset(fx->counter); /* kept again: the next read downloads nothing */
  read_windows(cache, p, file, PF_SIZE, 1, 1);
  assert_int_equal(counts(fx->counter).read_bytes, 0);
  ks_io_cache_free(cache);
  ks_test_rmtree(cdir);
  free(piece);
  free(file);
  free(cdir);
  free(p);
}

/* Pieces at odd offsets, nested and overlapping; reads straddling their edges give the file's bytes. */
static void test_cache_odd_ranges(void **state) {
  fixture *fx = *state;
  char *cdir = ks_test_path(fx->dir, "cache8"), *p = ks_test_path(fx->dir, "noise8.bin");
  const size_t size = PF_SIZE + 123;
  uint8_t *file = write_noise(p, size, 8);
  ks_io *cache;
  assert_int_equal(ks_io_cache_create(fx->counter, cdir, NULL, &cache, NULL), KS_OK);
  static const uint64_t ranges[][2] = {{0, 1000},        {100, 50},       {700, 4300},     {5000, 4001},
                                       {12000, 8000},    {20000, 1},      {20001, 99999},  {300001, 77777},
                                       {600000, 1 << 20}, {299999, 3},    {150000, 150000}};
  int h = open_h(cache, p);
  for (size_t i = 0; i < sizeof ranges / sizeof *ranges; i++)
    read_check(cache, h, file, size, ranges[i][0], (size_t)ranges[i][1]);
  close_h(cache, h);
  h = open_h(cache, p);
  uint64_t x = 88172645463325252u;
  for (int i = 0; i < 300; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    uint64_t off = x % (size + 16);
    size_t n = (size_t)(x >> 40) % 200000;
    read_check(cache, h, file, size, off, n);
  }
  read_check(cache, h, file, size, 0, size);
  close_h(cache, h);
  ks_io_counter_reset(fx->counter);
  h = open_h(cache, p);
  read_check(cache, h, file, size, 0, size);
  read_check(cache, h, file, size, 4999, 7003);
  close_h(cache, h);
  assert_int_equal(counts(fx->counter).read_bytes, 0);
  ks_io_cache_free(cache);
  ks_test_rmtree(cdir);
  free(file);
  free(cdir);
  free(p);
}

/* More parts than a read may take: the range is read whole from inner, then kept as one piece. */
static void test_cache_too_many_pieces_reads_whole(void **state) {
  fixture *fx = *state;
  char *cdir = ks_test_path(fx->dir, "cache9"), *p = ks_test_path(fx->dir, "noise9.bin");
  uint8_t *file = write_noise(p, PF_SIZE, 9);
  ks_io *cache;
  assert_int_equal(ks_io_cache_create(fx->counter, cdir, NULL, &cache, NULL), KS_OK);
  int h = open_h(cache, p);
  for (uint64_t i = 0; i < 100; i++) read_check(cache, h, file, PF_SIZE, i * 100, 10);
  ks_io_counter_reset(fx->counter);
  read_check(cache, h, file, PF_SIZE, 0, 2000); /* 20 pieces, 20 gaps: under the cap */
  assert_int_equal(counts(fx->counter).read_calls, 20);
  assert_int_equal(counts(fx->counter).read_bytes, 1800);
  ks_io_counter_reset(fx->counter);
  read_check(cache, h, file, PF_SIZE, 0, 10000); /* 40 parts, then 80 pieces and 80 gaps */
  assert_int_equal(counts(fx->counter).read_calls, 1);
  assert_int_equal(counts(fx->counter).read_bytes, 10000);
  close_h(cache, h);
  ks_io_counter_reset(fx->counter);
  read_windows(cache, p, file, 10000, 1, 1); /* the whole piece reaches furthest: one part */
  assert_int_equal(counts(fx->counter).read_bytes, 0);
  ks_io_cache_free(cache);
  ks_test_rmtree(cdir);
  free(file);
  free(cdir);
  free(p);
}

/* Every allocation fails in turn while pieces are kept, listed and assembled: an error or the right bytes. */
static void test_cache_assemble_alloc_failure_sweep(void **state) {
  fixture *fx = *state;
  char *cdir = ks_test_path(fx->dir, "cache10"), *p = ks_test_path(fx->dir, "noise10.bin");
  const size_t size = 64 * 1024;
  uint8_t *file = write_noise(p, size, 10);
  for (long n = 1;; n++) {
    ks_test_rmtree(cdir);
    ks_test_alloc ta;
    ks_test_alloc_init(&ta, n);
    ks_io *cache = NULL;
    int bad = 0, failed = ks_io_cache_create(fx->counter, cdir, &ta.a, &cache, NULL) != KS_OK;
    for (int round = 0; !failed && round < 2; round++) {
      int h;
      uint64_t sz;
      int rc = cache->open_fn(cache->ctx, p, &h, &sz);
      if (rc) {
        failed = rc == ENOMEM ? 1 : (bad = rc);
        break;
      }
      static const uint64_t r[][2] = {{0, 16384}, {32768, 16384}, {40000, 20000}, {0, 65536}, {1000, 50000}};
      for (size_t i = round ? 3 : 0; i < (round ? 5u : 3u); i++)
        bad |= read_cmp(cache, h, file, size, r[i][0], (size_t)r[i][1]);
      cache->close_fn(cache->ctx, h);
    }
    ks_io_cache_free(cache);
    assert_int_equal(ta.live, 0);
    assert_int_equal(bad, 0); /* a failed allocation never fails a read nor gives wrong bytes */
    if (ta.calls < n) {
      assert_false(failed);
      break;
    }
  }
  ks_test_rmtree(cdir);
  free(file);
  free(cdir);
  free(p);
}

typedef struct reader_arg {
  const ks_io *io;
  int h;
  const uint8_t *file;
  size_t size;
  uint64_t seed;
  int bad;
} reader_arg;

static void *reader_thread(void *v) {
  reader_arg *a = v;
  uint64_t x = a->seed;
  for (int i = 0; i < 40; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    uint64_t off = i % 10 == 0 ? 0 : x % a->size;
    size_t n = i % 10 == 0 ? a->size : (size_t)(x >> 40) % (300 * 1024);
    a->bad |= read_cmp(a->io, a->h, a->file, a->size, off, n) != 0;
  }
  return NULL;
}

/* Four threads read one handle at once over shared pieces and gaps: every read gives the file's bytes. */
static void test_cache_concurrent_assembly(void **state) {
  fixture *fx = *state;
  char *cdir = ks_test_path(fx->dir, "cache11"), *p = ks_test_path(fx->dir, "noise11.bin");
  const size_t size = 2 * PF_SIZE;
  uint8_t *file = write_noise(p, size, 11);
  ks_io *cache;
  assert_int_equal(ks_io_cache_create(fx->counter, cdir, NULL, &cache, NULL), KS_OK);
  read_windows(cache, p, file, size, 8, 0x55); /* even windows cached, odd ones gaps */
  int h = open_h(cache, p);
  pthread_t t[4];
  reader_arg args[4];
  for (int i = 0; i < 4; i++) {
    args[i] = (reader_arg){cache, h, file, size, 0x9e3779b97f4a7c15u * (uint64_t)(i + 1), 0};
    assert_int_equal(pthread_create(&t[i], NULL, reader_thread, &args[i]), 0);
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(t[i], NULL);
    assert_int_equal(args[i].bad, 0);
  }
  close_h(cache, h);
  ks_io_cache_stats st = cache_stats(cache);
  assert_true(st.hit_bytes > 0 && st.rejected == 0);
  read_windows(cache, p, file, size, 1, 1);
  ks_io_cache_free(cache);
  ks_test_rmtree(cdir);
  free(file);
  free(cdir);
  free(p);
}

/* ---- failures ---- */

static void test_alloc_failure_sweep(void **state) {
  fixture *fx = *state;
  char *small = ks_test_path(fx->dir, "small.keepsake");
  ks_statedict *sd = fmt_small_dict(3);
  ks_save_opts so = {.io = ks_test_io_nosync()};
  assert_int_equal(ks_save(small, sd, NULL, &so, NULL), KS_OK);
  for (long n = 1;; n++) {
    ks_test_alloc ta;
    ks_test_alloc_init(&ta, n);
    ks_read_opts o = {.mode = KS_READ_LAZY, .io = fx->counter, .alloc = &ta.a};
    ks_reader *r = NULL;
    ks_error e;
    ks_status st = ks_reader_open(small, &o, &r, &e);
    float w[6];
    ks_tensor v;
    if (!st) st = fetch_name(r, "model/w", w, sizeof w, &e);
    if (!st) st = ks_reader_tensor(r, "step", &v, &e);
    ks_reader_free(r);
    ks_statedict *got = NULL;
    if (!st) st = ks_load(small, &o, &got, NULL, &e);
    ks_statedict_free(got);
    assert_int_equal(ta.live, 0);
    if (ta.calls < n) { /* nothing failed: done */
      assert_int_equal(st, KS_OK);
      assert_memory_equal(w, ks_statedict_tensor(sd, "model/w")->data, sizeof w);
      break;
    }
    assert_int_equal(st, KS_E_NOMEM);
  }
  ks_statedict_free(sd);
  free(small);
}

/* Hostile files give the same status in lazy mode as in copy mode. */
static void test_hostile_headers_same_errors(void **state) {
  fixture *fx = *state;
  static const char *headers[] = {
      "{", "[]", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,9]}}",
      "{\"a\":{\"dtype\":\"Q9\",\"shape\":[1],\"data_offsets\":[0,4]}}",
      "{\"__metadata__\":{\"keepsake.format\":\"keepsake\",\"keepsake.format_version\":\"9\"}}"};
  char *p = ks_test_path(fx->dir, "hostile.bin");
  uint8_t data[8] = {0};
  for (size_t k = 0; k < sizeof headers / sizeof *headers + 4; k++) {
    size_t len;
    uint8_t *b;
    if (k < sizeof headers / sizeof *headers) {
      b = fmt_build(headers[k], data, 4, &len);
    } else { /* a length past EOF; a huge one; a huge one past the cap; a file under 8 bytes */
      b = fmt_build("{}", NULL, 0, &len);
      uint64_t n = k == 5 ? 1000 : k == 6 ? (uint64_t)KS_MAX_HEADER : k == 7 ? UINT64_MAX : 2;
      for (int i = 0; i < 8; i++) b[i] = (uint8_t)(n >> (8 * i));
      if (k == 8) len = 5;
    }
    assert_int_equal(ks_test_write_file(p, b, len), 0);
    free(b);
    ks_read_opts oc = {.mode = KS_READ_COPY}, ol = {.mode = KS_READ_LAZY, .io = fx->counter};
    ks_reader *r = NULL;
    ks_error ec, el;
    ks_status sc = ks_reader_open(p, &oc, &r, &ec);
    ks_reader_free(r);
    r = NULL;
    ks_status sl = ks_reader_open(p, &ol, &r, &el);
    ks_reader_free(r);
    if (k != 4) assert_int_not_equal(sc, KS_OK);
    assert_int_equal(sl, sc);
    assert_int_equal(el.offset, ec.offset);
    assert_string_equal(el.message, ec.message);
  }
  free(p);
}

/* A header larger than the first read: open takes exactly one more read. */
static void test_large_header_two_reads(void **state) {
  fixture *fx = *state;
  ks_statedict *sd;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  for (int i = 0; i < 3000; i++) {
    char name[96];
    snprintf(name, sizeof name, "model/layers/%04d/a_rather_long_parameter_name_to_grow_the_header", i);
    int64_t s[1] = {2};
    float *v;
    assert_int_equal(ks_statedict_new_tensor(sd, name, KS_F32, 1, s, (void **)&v, NULL), KS_OK);
    v[0] = (float)i;
    v[1] = -(float)i;
  }
  char *p = ks_test_path(fx->dir, "wide.keepsake");
  ks_save_opts so = {.io = ks_test_io_nosync()};
  assert_int_equal(ks_save(p, sd, NULL, &so, NULL), KS_OK);
  ks_io_counter_reset(fx->counter);
  ks_reader *r = open_lazy(p, fx->counter);
  ks_io_counts c = counts(fx->counter);
  assert_int_equal(c.read_calls, 2);
  assert_true(ks_reader_data_offset(r) > 64 * 1024);
  assert_int_equal(c.read_bytes, ks_reader_data_offset(r));
  float two[2];
  const char *name = "model/layers/2999/a_rather_long_parameter_name_to_grow_the_header";
  assert_int_equal(fetch_name(r, name, two, sizeof two, NULL), KS_OK);
  assert_true(two[0] == 2999.0f && two[1] == -2999.0f);
  ks_reader_free(r);
  ks_statedict_free(sd);
  free(p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_open_reads_header_only),
      cmocka_unit_test(test_fetch_reads_only_the_tensor),
      cmocka_unit_test(test_corrupt_tensor_fails_its_fetch_only),
      cmocka_unit_test(test_full_load_reads_each_byte_once),
      cmocka_unit_test(test_concurrent_first_use_keeps_one_copy),
      cmocka_unit_test(test_cache_downloads_once),
      cmocka_unit_test(test_cache_rejects_damaged_pieces),
      cmocka_unit_test(test_cache_forgets_replaced_files),
      cmocka_unit_test(test_cache_keys_pieces_by_validator),
      cmocka_unit_test(test_cache_alloc_failure_sweep),
      cmocka_unit_test(test_cache_assembles_adjacent_pieces),
      cmocka_unit_test(test_cache_reads_only_gaps),
      cmocka_unit_test(test_cache_rereads_bad_middle_piece),
      cmocka_unit_test(test_cache_odd_ranges),
      cmocka_unit_test(test_cache_too_many_pieces_reads_whole),
      cmocka_unit_test(test_cache_assemble_alloc_failure_sweep),
      cmocka_unit_test(test_cache_concurrent_assembly),
      cmocka_unit_test(test_alloc_failure_sweep),
      cmocka_unit_test(test_hostile_headers_same_errors),
      cmocka_unit_test(test_large_header_two_reads),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
