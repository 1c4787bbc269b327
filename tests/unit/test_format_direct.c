/*
 * What the save and load paths do with the file system, seen through the ks_io table: a durable
 * ks_save of a large state writes its bytes with direct I/O (O_DIRECT, around the page cache)
 * where the table is local and the file system takes it, and a save without fsync (the table of
 * Python's fsync=False) does not; a copy-mode open of a large file reads its data on more than
 * one thread when the process may use more than one CPU; a tensor fetched from a local file into
 * the caller's memory is read in pieces, each hashed while it is in the cache.
 */
#define _GNU_SOURCE /* O_DIRECT, sched_getaffinity */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <unistd.h>

#include <cmocka.h>

#include "test_format_helpers.h"

typedef struct fixture {
  char *dir;
} fixture;

static int setup(void **state) {
  fixture *fx = calloc(1, sizeof *fx);
  fx->dir = ks_test_tmpdir("fmt-direct");
  *state = fx;
  return fx->dir ? 0 : -1;
}

static int teardown(void **state) {
  fixture *fx = *state;
  ks_test_rmtree(fx->dir);
  free(fx->dir);
  free(fx);
  return 0;
}

/* n tensors of `each` bytes (F32, filled from seed). */
static ks_statedict *big_dict(size_t n, size_t each, unsigned seed) {
  ks_statedict *sd;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  char name[32];
  for (size_t k = 0; k < n; k++) {
    int64_t shape[1] = {(int64_t)(each / 4)};
    uint32_t *p;
    snprintf(name, sizeof name, "t/%zu", k);
    assert_int_equal(ks_statedict_new_tensor(sd, name, KS_F32, 1, shape, (void **)&p, NULL), KS_OK);
    uint32_t x = seed + (uint32_t)k;
    for (size_t i = 0; i < each / 4; i++) p[i] = x = x * 1664525u + 1013904223u;
  }
  return sd;
}

/* Whether the file system of dir takes O_DIRECT (tmpfs may not). */
static int takes_direct(const char *dir) {
  char *probe = ks_test_path(dir, "direct-probe");
  int fd = open(probe, O_WRONLY | O_CREAT | O_TRUNC, 0600), ok = 0;
  if (fd >= 0) {
    ok = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_DIRECT) == 0;
    close(fd);
    unlink(probe);
  }
  free(probe);
  return ok;
}

/* A copy of a table whose write_fn and pwrite_fn count the bytes written while the descriptor
   has O_DIRECT (atomically: a direct save writes on two threads). */
typedef struct direct_count {
  ks_io io;
  const ks_io *base;
  atomic_size_t direct, buffered;
} direct_count;

static void count(direct_count *c, int direct, size_t n) { atomic_fetch_add(direct ? &c->direct : &c->buffered, n); }

static int count_write(void *ctx, int fd, const void *buf, size_t n, size_t *written) {
  direct_count *c = ctx;
  int fl = fcntl(fd, F_GETFL);
  int rc = c->base->write_fn(c->base->ctx, fd, buf, n, written);
  if (!rc) count(c, fl >= 0 && (fl & O_DIRECT), *written);
  return rc;
}

static int count_pwrite(void *ctx, int fd, const void *buf, size_t n, uint64_t off, size_t *written) {
  direct_count *c = ctx;
  int fl = fcntl(fd, F_GETFL);
  int rc = c->base->pwrite_fn(c->base->ctx, fd, buf, n, off, written);
  if (!rc) count(c, fl >= 0 && (fl & O_DIRECT), *written);
  return rc;
}

static void count_init(direct_count *c, const ks_io *base) {
  memset(c, 0, sizeof *c);
  c->io = *base;
  c->base = base;
  c->io.ctx = c;
  c->io.write_fn = count_write;
  c->io.pwrite_fn = count_pwrite;
  atomic_init(&c->direct, 0);
  atomic_init(&c->buffered, 0);
}

static void durable_saves_write_around_the_page_cache(void **state) {
  fixture *fx = *state;
  ks_statedict *sd = big_dict(5, (4u << 20) + 100, 1); /* 20 MiB */
  char *path = ks_test_path(fx->dir, "direct.ks");
  direct_count durable, nosync;
  count_init(&durable, ks_io_posix());
  count_init(&nosync, ks_test_io_nosync());
  ks_save_opts od = {.io = &durable.io}, on = {.io = &nosync.io};
  ks_read_opts ro = {.verify_checksums = 1};
  ks_reader *r = NULL;
  assert_int_equal(ks_save(path, sd, NULL, &od, NULL), KS_OK);
  assert_int_equal(ks_reader_open(path, &ro, &r, NULL), KS_OK);
  ks_reader_free(r);
  if (takes_direct(fx->dir)) {
    assert_true(atomic_load(&durable.direct) >= (20u << 20)); /* the file's aligned bulk */
    assert_true(atomic_load(&durable.buffered) < 4096);       /* its last partial block */
  } else {
    print_message("%s does not take O_DIRECT: only the file's bytes are checked\n", fx->dir);
  }
  assert_int_equal(ks_save(path, sd, NULL, &on, NULL), KS_OK); /* no fsync: through the page cache */
  assert_int_equal(ks_reader_open(path, &ro, &r, NULL), KS_OK);
  ks_reader_free(r);
  assert_int_equal(atomic_load(&nosync.direct), 0);
  free(path);
  ks_statedict_free(sd);
}

/* A copy of the POSIX table whose read_fn notes the threads that call it. */
typedef struct thread_note {
  ks_io io;
  pthread_mutex_t mu;
  pthread_t seen[8];
  size_t n_seen, reads;
  size_t largest;
} thread_note;

static int note_read(void *ctx, int fd, void *buf, size_t n, uint64_t off, size_t *got) {
  thread_note *t = ctx;
  pthread_mutex_lock(&t->mu);
  pthread_t self = pthread_self();
  size_t i = 0;
  while (i < t->n_seen && !pthread_equal(t->seen[i], self)) i++;
  if (i == t->n_seen && t->n_seen < 8) t->seen[t->n_seen++] = self;
  t->reads++;
  if (n > t->largest) t->largest = n;
  pthread_mutex_unlock(&t->mu);
  return ks_io_posix()->read_fn(NULL, fd, buf, n, off, got);
}

static void note_init(thread_note *t) {
  memset(t, 0, sizeof *t);
  pthread_mutex_init(&t->mu, NULL);
  t->io = *ks_io_posix();
  t->io.ctx = t;
  t->io.read_fn = note_read;
  t->io.map_fn = NULL;
  t->io.unmap_fn = NULL;
}

static size_t cpus(void) {
  cpu_set_t set;
  return sched_getaffinity(0, sizeof set, &set) == 0 ? (size_t)CPU_COUNT(&set) : 1;
}

static void copy_loads_read_on_several_threads(void **state) {
  fixture *fx = *state;
  ks_statedict *sd = big_dict(6, 8u << 20, 2); /* 48 MiB */
  char *path = ks_test_path(fx->dir, "copy.ks");
  ks_save_opts so = {.io = ks_test_io_nosync()};
  assert_int_equal(ks_save(path, sd, NULL, &so, NULL), KS_OK);
  thread_note t;
  note_init(&t);
  ks_read_opts ro = {.mode = KS_READ_COPY, .verify_checksums = 1, .io = &t.io};
  ks_reader *r = NULL;
  assert_int_equal(ks_reader_open(path, &ro, &r, NULL), KS_OK);
  for (size_t k = 0; k < 6; k++) {
    ks_tensor v;
    const char *name;
    assert_int_equal(ks_reader_tensor_at(r, k, &name, &v), KS_OK);
    const ks_tensor *want = ks_statedict_tensor(sd, name);
    assert_non_null(want);
    assert_int_equal(v.nbytes, want->nbytes);
    assert_memory_equal(v.data, want->data, want->nbytes);
  }
  ks_reader_free(r);
  if (cpus() >= 2) assert_true(t.n_seen >= 2);
  else print_message("one CPU: the copy is read on one thread\n");
  pthread_mutex_destroy(&t.mu);
  free(path);
  ks_statedict_free(sd);
}

static void fetches_from_a_local_file_read_in_pieces(void **state) {
  fixture *fx = *state;
  ks_statedict *sd = big_dict(1, 8u << 20, 3);
  char *path = ks_test_path(fx->dir, "fetch.ks");
  ks_save_opts so = {.io = ks_test_io_nosync()};
  assert_int_equal(ks_save(path, sd, NULL, &so, NULL), KS_OK);
  thread_note t;
  note_init(&t);
  ks_read_opts ro = {.mode = KS_READ_LAZY, .io = &t.io};
  ks_reader *r = NULL;
  assert_int_equal(ks_reader_open(path, &ro, &r, NULL), KS_OK);
  t.reads = t.largest = 0;
  uint8_t *buf = malloc(8u << 20);
  assert_int_equal(ks_reader_fetch(r, 0, buf, 8u << 20, NULL), KS_OK);
  assert_memory_equal(buf, ks_statedict_tensor(sd, "t/0")->data, 8u << 20);
  assert_true(t.reads >= 8);           /* pieces... */
  assert_true(t.largest <= (1u << 20)); /* ...each small enough to be hashed from the cache */
  ks_reader_free(r);
  size_t len; /* and the pieces' hash still catches a changed byte */
  uint8_t *bytes = ks_test_read_file(path, &len);
  bytes[len - 12345] ^= 1;
  assert_int_equal(ks_test_write_file(path, bytes, len), 0);
  free(bytes);
  r = NULL;
  assert_int_equal(ks_reader_open(path, &ro, &r, NULL), KS_OK);
  ks_error err;
  assert_int_equal(ks_reader_fetch(r, 0, buf, 8u << 20, &err), KS_E_CHECKSUM);
  assert_string_equal(err.key, "t/0");
  ks_reader_free(r);
  free(buf);
  pthread_mutex_destroy(&t.mu);
  free(path);
  ks_statedict_free(sd);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(durable_saves_write_around_the_page_cache),
      cmocka_unit_test(copy_loads_read_on_several_threads),
      cmocka_unit_test(fetches_from_a_local_file_read_in_pieces),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
