/*
 * The storage interface (keepsake/io.h): the version rules (a version 1 table,
 * allocated at exactly its own size, still drives the manager; the library
 * never reads past it), ks_io_check, file:// locations, the POSIX backend's
 * reading, listing, stat and link operations, and the reader's use of them.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "keepsake/manager.h"
#include "keepsake/state.h"
#include "testutil.h"

static ks_state *small_state(float *w, int64_t *shape, ks_timestamp *ts, int64_t batch) {
  ks_state *st = NULL;
  ks_tensor t;
  assert_int_equal(ks_state_create("run", 1, NULL, &st, NULL), KS_OK);
  assert_int_equal(ks_tensor_init(&t, KS_F32, 1, shape, w), KS_OK);
  assert_int_equal(ks_state_add_tensor(st, "w", &t, NULL), KS_OK);
  ks_timestamp_init(ts);
  ts->batch = batch;
  ks_state_set_timestamp(st, ts);
  return st;
}

static int v1_writes, v1_dir_syncs;
static int v1_fsync_dir(void *ctx, const char *dir) {
  (void)ctx;
  v1_dir_syncs++;
  return ks_io_posix()->fsync_dir_fn(NULL, dir);
}
static int v1_write(void *ctx, int fd, const void *buf, size_t n, size_t *written) {
  (void)ctx;
  v1_writes++;
  return ks_io_posix()->write_fn(NULL, fd, buf, n, written);
}

/* The table as a program built against version 1 of the header declares it. */
typedef struct ks_io_v1 {
  unsigned version;
  void *ctx;
  int (*create_fn)(void *ctx, const char *path, int *fd);
  int (*write_fn)(void *ctx, int fd, const void *buf, size_t n, size_t *written);
  int (*fsync_fn)(void *ctx, int fd);
  int (*close_fn)(void *ctx, int fd);
  int (*rename_fn)(void *ctx, const char *from, const char *to);
  int (*unlink_fn)(void *ctx, const char *path);
  int (*fsync_dir_fn)(void *ctx, const char *dir);
} ks_io_v1;

static void version_1_table_drives_the_manager(void **state) {
  (void)state;
  assert_int_equal(sizeof(ks_io_v1), offsetof(ks_io, open_fn)); /* version 2 only appended */
  ks_io_v1 *old = malloc(sizeof *old); /* exactly the old size: ASan reports any read of a version 2 member */
  assert_non_null(old);
  const ks_io *p = ks_io_posix();
  *old = (ks_io_v1){1, NULL, p->create_fn, v1_write, p->fsync_fn, p->close_fn, p->rename_fn, p->unlink_fn,
                    v1_fsync_dir};
  const ks_io *io = (const ks_io *)(void *)old;
  assert_int_equal(ks_io_check(io, NULL), KS_OK);
  char *dir = ks_test_tmpdir("io-v1"), *run = ks_test_path(dir, "a/b/run");
  ks_ckpt_opts co = {.run_dir = run, .save_interval = "1ba", .keep = 1, .io = io};
  ks_ckpt_manager *m = NULL;
  assert_int_equal(ks_ckpt_manager_create(&co, &m, NULL), KS_OK); /* mkdir -p by the POSIX backend ... */
  assert_int_equal(v1_dir_syncs,
                   3); /* ... and the new entries made durable by the table: a, b and run in their parents */
  float w[2] = {1, 2};
  int64_t shape[1] = {2};
  ks_timestamp ts;
  ks_state *st = small_state(w, shape, &ts, 1);
  for (int64_t b = 1; b <= 3; b++) {
    ts.batch = b;
    assert_int_equal(ks_ckpt_manager_save(m, st, NULL, NULL), KS_OK);
  }
  assert_true(v1_writes > 0); /* the version 1 members are used ... */
  assert_int_equal(ks_test_dir_entries(run), 2); /* ... and keep=1 retention and `latest` still ran */
  ks_ckpt_manager_free(m);
  ks_state_free(st);
  free(old);
  ks_test_rmtree(dir);
  free(dir);
  free(run);
}

static void check_refuses_bad_tables(void **state) {
  (void)state;
  ks_error e;
  assert_int_equal(ks_io_check(NULL, NULL), KS_OK);
  assert_int_equal(ks_io_check(ks_io_posix(), NULL), KS_OK);
  ks_io io = *ks_io_posix();
  io.version = 0;
  assert_int_equal(ks_io_check(&io, &e), KS_E_INVALID);
  io = *ks_io_posix();
  io.stat_fn = NULL;
  assert_int_equal(ks_io_check(&io, &e), KS_E_INVALID);
  assert_non_null(strstr(e.message, "stat_fn"));
  io.version = 1; /* a version 1 table has no stat_fn to check */
  assert_int_equal(ks_io_check(&io, NULL), KS_OK);
  io = *ks_io_posix();
  io.map_fn = NULL; /* cannot map: allowed */
  io.unmap_fn = NULL;
  assert_int_equal(ks_io_check(&io, NULL), KS_OK);
  io.unmap_fn = ks_io_posix()->unmap_fn;
  assert_int_equal(ks_io_check(&io, NULL), KS_E_INVALID);
  io = *ks_io_posix();
  io.rename_fn = NULL;
  assert_int_equal(ks_io_check(&io, &e), KS_E_INVALID);
  io = *ks_io_posix();
  io.version = 99; /* newer than this library: used as the newest it knows */
  assert_int_equal(ks_io_check(&io, NULL), KS_OK);
  /* The manager and the writer refuse a bad table before touching anything. */
  io.version = 0;
  char *dir = ks_test_tmpdir("io-bad"), *run = ks_test_path(dir, "run");
  ks_ckpt_opts co = {.run_dir = run, .io = &io};
  ks_ckpt_manager *m = NULL;
  assert_int_equal(ks_ckpt_manager_create(&co, &m, NULL), KS_E_INVALID);
  assert_null(m);
  assert_false(ks_test_exists(run));
  float w[2] = {1, 2};
  int64_t shape[1] = {2};
  ks_timestamp ts;
  ks_state *st = small_state(w, shape, &ts, 1);
  ks_save_opts so = {.io = &io};
  char *f = ks_test_path(dir, "x.keepsake");
  assert_int_equal(ks_state_save(st, f, &so, NULL), KS_E_INVALID);
  assert_false(ks_test_exists(f));
  ks_state_free(st);
  ks_test_rmtree(dir);
  free(dir);
  free(run);
  free(f);
}

static void locations_file_urls_and_other_schemes(void **state) {
  (void)state;
  const char *p = NULL;
  assert_int_equal(ks_io_local_path("/a/b", &p, NULL), KS_OK);
  assert_string_equal(p, "/a/b");
  assert_int_equal(ks_io_local_path("file:///a/b", &p, NULL), KS_OK);
  assert_string_equal(p, "/a/b");
  assert_int_equal(ks_io_local_path("file://rel/x", &p, NULL), KS_OK);
  assert_string_equal(p, "rel/x");
  assert_int_equal(ks_io_local_path("s3://bucket/run", &p, NULL), KS_E_UNSUPPORTED);
  assert_int_equal(ks_io_local_path("https://host/x", &p, NULL), KS_E_UNSUPPORTED);
  assert_int_equal(ks_io_local_path("file://", &p, NULL), KS_E_INVALID);
  assert_int_equal(ks_io_local_path("", &p, NULL), KS_E_INVALID);
  /* A manager on a file:// run directory saves and resumes there. */
  char *dir = ks_test_tmpdir("io-url"), url[4200];
  snprintf(url, sizeof url, "file://%s/run", dir);
  ks_ckpt_opts co = {.run_dir = url, .save_interval = "1ba", .io = ks_test_io_nosync()};
  ks_ckpt_manager *m = NULL;
  assert_int_equal(ks_ckpt_manager_create(&co, &m, NULL), KS_OK);
  float w[2] = {3, 4};
  int64_t shape[1] = {2};
  ks_timestamp ts;
  ks_state *st = small_state(w, shape, &ts, 7);
  const char *saved = NULL;
  assert_int_equal(ks_ckpt_manager_save(m, st, &saved, NULL), KS_OK);
  assert_non_null(strstr(saved, "/run/ep0-ba7.keepsake"));
  assert_int_equal(strncmp(saved, "file://", 7) != 0, 1);
  assert_true(ks_test_exists(saved));
  w[0] = 0;
  int resumed = 0;
  assert_int_equal(ks_ckpt_manager_autoresume(m, st, NULL, NULL, &resumed, NULL, NULL), KS_OK);
  assert_int_equal(resumed, 1);
  assert_true(w[0] == 3.0f);
  ks_ckpt_manager_free(m);
  co.run_dir = "s3://bucket/run";
  assert_int_equal(ks_ckpt_manager_create(&co, &m, NULL), KS_E_UNSUPPORTED);
  ks_state_free(st);
  ks_test_rmtree(dir);
  free(dir);
}

typedef struct seen {
  char names[8][64];
  ks_io_kind kinds[8];
  int n;
} seen;

static int collect(void *ctx, const char *name, ks_io_kind kind) {
  seen *s = ctx;
  if (s->n == 8) return E2BIG;
  snprintf(s->names[s->n], sizeof s->names[0], "%s", name);
  s->kinds[s->n++] = kind;
  return 0;
}

static int stop_at_first(void *ctx, const char *name, ks_io_kind kind) {
  (void)ctx;
  (void)name;
  (void)kind;
  return ECANCELED;
}

static ks_io_kind kind_named(const seen *s, const char *name) {
  for (int i = 0; i < s->n; i++)
    if (!strcmp(s->names[i], name)) return s->kinds[i];
  return (ks_io_kind)0;
}

static void posix_backend_reads_lists_and_links(void **state) {
  (void)state;
  const ks_io *io = ks_io_posix();
  char *dir = ks_test_tmpdir("io-posix"), *f = ks_test_path(dir, "data.bin"), *l = ks_test_path(dir, "ptr"),
       *sub = ks_test_path(dir, "sub");
  assert_int_equal(ks_test_write_file(f, "0123456789", 10), 0);
  assert_int_equal(io->mkdir_fn(NULL, sub), 0);
  assert_int_equal(io->mkdir_fn(NULL, sub), EEXIST);
  assert_int_equal(io->symlink_fn(NULL, "data.bin", l), 0);
  assert_int_equal(io->symlink_fn(NULL, "data.bin", l), EEXIST);
  /* stat does not follow the link */
  ks_io_stat st;
  assert_int_equal(io->stat_fn(NULL, f, &st), 0);
  assert_int_equal(st.kind, KS_IO_FILE);
  assert_int_equal(st.size, 10);
  assert_int_equal(io->stat_fn(NULL, l, &st), 0);
  assert_int_equal(st.kind, KS_IO_LINK);
  assert_int_equal(io->stat_fn(NULL, sub, &st), 0);
  assert_int_equal(st.kind, KS_IO_DIR);
  char *missing = ks_test_path(dir, "nope");
  assert_int_equal(io->stat_fn(NULL, missing, &st), ENOENT);
  char buf[64];
  size_t len = 0;
  assert_int_equal(io->readlink_fn(NULL, l, buf, sizeof buf, &len), 0);
  assert_int_equal(len, 8);
  assert_string_equal(buf, "data.bin");
  assert_int_equal(io->readlink_fn(NULL, l, buf, 8, &len), ENAMETOOLONG);
  /* listing, with and without a prefix; a callback's errno stops it and is returned */
  seen s = {0};
  assert_int_equal(io->list_fn(NULL, dir, "", collect, &s), 0);
  assert_int_equal(s.n, 3);
  assert_int_equal(kind_named(&s, "data.bin"), KS_IO_FILE);
  assert_int_equal(kind_named(&s, "ptr"), KS_IO_LINK);
  assert_int_equal(kind_named(&s, "sub"), KS_IO_DIR);
  memset(&s, 0, sizeof s);
  assert_int_equal(io->list_fn(NULL, dir, "da", collect, &s), 0);
  assert_int_equal(s.n, 1);
  assert_int_equal(io->list_fn(NULL, dir, "", stop_at_first, NULL), ECANCELED);
  assert_int_equal(io->list_fn(NULL, missing, "", collect, &s), ENOENT);
  /* ranged reads, short only at the end, and a mapping */
  int fd = -1;
  uint64_t size = 0;
  assert_int_equal(io->open_fn(NULL, f, &fd, &size), 0);
  assert_int_equal(size, 10);
  size_t got = 0;
  assert_int_equal(io->read_fn(NULL, fd, buf, 4, 3, &got), 0);
  assert_int_equal(got, 4);
  assert_memory_equal(buf, "3456", 4);
  assert_int_equal(io->read_fn(NULL, fd, buf, 8, 6, &got), 0);
  assert_int_equal(got, 4);
  assert_int_equal(io->read_fn(NULL, fd, buf, 8, 20, &got), 0);
  assert_int_equal(got, 0);
  const void *map = NULL;
  assert_int_equal(io->map_fn(NULL, fd, size, &map), 0);
  assert_memory_equal(map, "0123456789", 10);
  assert_int_equal(io->unmap_fn(NULL, map, size), 0);
  assert_int_equal(io->close_fn(NULL, fd), 0);
  assert_int_equal(io->open_fn(NULL, sub, &fd, &size), EISDIR);
  assert_int_equal(io->open_fn(NULL, missing, &fd, &size), ENOENT);
  ks_test_rmtree(dir);
  free(dir);
  free(f);
  free(l);
  free(sub);
  free(missing);
}

typedef struct read_count {
  int opens, reads, maps, unmaps, closes;
} read_count;
static read_count g_rc;
static int rc_open(void *c, const char *p, int *fd, uint64_t *size) {
  (void)c;
  g_rc.opens++;
  return ks_io_posix()->open_fn(NULL, p, fd, size);
}
static int rc_read(void *c, int fd, void *b, size_t n, uint64_t off, size_t *got) {
  (void)c;
  g_rc.reads++;
  if (n > 5) n = 5; /* the reader copes with small pieces */
  return ks_io_posix()->read_fn(NULL, fd, b, n, off, got);
}
static int rc_map(void *c, int fd, uint64_t size, const void **addr) {
  (void)c;
  g_rc.maps++;
  return ks_io_posix()->map_fn(NULL, fd, size, addr);
}
static int rc_unmap(void *c, const void *addr, uint64_t size) {
  (void)c;
  g_rc.unmaps++;
  return ks_io_posix()->unmap_fn(NULL, addr, size);
}
static int rc_close(void *c, int fd) {
  (void)c;
  g_rc.closes++;
  return ks_io_posix()->close_fn(NULL, fd);
}

/* ks_reader_open maps or reads through the table; without map_fn, a mapped open reads. */
static void reader_goes_through_the_table(void **state) {
  (void)state;
  char *dir = ks_test_tmpdir("io-read"), *f = ks_test_path(dir, "s.keepsake");
  float w[2] = {5, 6};
  int64_t shape[1] = {2};
  ks_timestamp ts;
  ks_state *st = small_state(w, shape, &ts, 3);
  assert_int_equal(ks_state_save(st, f, NULL, NULL), KS_OK);
  ks_state_free(st);
  ks_io io = *ks_io_posix();
  io.open_fn = rc_open;
  io.read_fn = rc_read;
  io.map_fn = rc_map;
  io.unmap_fn = rc_unmap;
  io.close_fn = rc_close;
  for (int variant = 0; variant < 3; variant++) {
    memset(&g_rc, 0, sizeof g_rc);
    if (variant == 2) io.map_fn = NULL, io.unmap_fn = NULL;
    ks_read_opts ro = {.mode = variant == 1 ? KS_READ_COPY : KS_READ_MMAP, .verify_checksums = 1, .io = &io};
    ks_reader *r = NULL;
    assert_int_equal(ks_reader_open(f, &ro, &r, NULL), KS_OK);
    ks_tensor t;
    assert_int_equal(ks_reader_tensor(r, "state/model/w", &t, NULL), KS_OK);
    assert_true(((const float *)t.data)[1] == 6.0f);
    ks_reader_free(r);
    assert_int_equal(g_rc.opens, 1);
    assert_int_equal(g_rc.closes, 1);
    assert_int_equal(g_rc.maps, variant == 0);
    assert_int_equal(g_rc.unmaps, variant == 0);
    if (variant) assert_true(g_rc.reads > 1); /* pieces of 5 bytes */
    else assert_int_equal(g_rc.reads, 0);
  }
  /* errors of the table reach the caller with the path */
  ks_error e;
  char *missing = ks_test_path(dir, "missing.keepsake");
  ks_read_opts ro = {.io = &io};
  ks_reader *r = NULL;
  assert_int_equal(ks_reader_open(missing, &ro, &r, &e), KS_E_IO);
  assert_non_null(strstr(e.message, "cannot open file"));
  assert_int_equal(ks_reader_open(dir, &ro, &r, &e), KS_E_IO);
  assert_non_null(strstr(e.message, "not a regular file"));
  io.version = 0;
  assert_int_equal(ks_reader_open(f, &ro, &r, &e), KS_E_INVALID);
  assert_null(r);
  ks_test_rmtree(dir);
  free(dir);
  free(f);
  free(missing);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(version_1_table_drives_the_manager),
    cmocka_unit_test(check_refuses_bad_tables),
    cmocka_unit_test(locations_file_urls_and_other_schemes),
    cmocka_unit_test(posix_backend_reads_lists_and_links),
    cmocka_unit_test(reader_goes_through_the_table),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
