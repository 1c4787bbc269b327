/*
 * Every way ks_save can get the bytes to the file writes the same file as the writer before it
 * had more than one (one thread, buffered, each piece hashed just before it is written:
 * ks__save_tuned {1, -1, baseline_hash}): direct writes from the ring of aligned buffers (with
 * and without the filling thread, through the POSIX table, a copy of it and a table whose file
 * system refuses direct writes), buffered writes with the hashing thread (any lead, a table that
 * is not local, a table without fsync), the two-pass save of a table without pwrite_fn, and
 * tmpfs. Failing writes in the middle of the pipelines leave the old file and no temporary
 * file; every allocation of a save may fail. And the copy-mode load, which reads the data on
 * several threads and hashes it as it lands, finds what the mapped verification finds.
 */
#define _GNU_SOURCE /* O_DIRECT */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "faultio.h"
#include "format/fmt_internal.h" /* ks__save_tuned */
#include "test_format_helpers.h"

typedef struct fixture {
  char *dir;
  ks_statedict *sd;
  uint8_t *ref; /* the previous writer's file */
  size_t ref_len;
} fixture;

static int add_filled(ks_statedict *sd, const char *name, size_t n, unsigned seed) {
  int64_t shape[1] = {(int64_t)n};
  uint8_t *p;
  if (ks_statedict_new_tensor(sd, name, KS_U8, 1, shape, (void **)&p, NULL)) return -1;
  for (size_t i = 0; i < n; i++) p[i] = (uint8_t)((i * 2654435761u + seed) >> 7);
  return 0;
}

static const ks__save_tuning previous = {.threads = 1, .direct = -1, .baseline_hash = 1};

/* Saves sd to dir/name through io with tuning t (NULL: ks_save's own) and returns the file's bytes. */
static uint8_t *save_read(const char *dir, const ks_statedict *sd, const char *name, const ks_io *io,
                          const ks__save_tuning *t, size_t *len) {
  char *path = ks_test_path(dir, name);
  ks_save_opts o = {.io = io};
  ks_error err;
  if (ks__save_tuned(path, sd, NULL, &o, t, &err)) fail_msg("save of %s: %s", name, err.message);
  uint8_t *b = ks_test_read_file(path, len);
  assert_int_equal(unlink(path), 0);
  free(path);
  return b;
}

/* Above DIRECT_MIN (16 MiB) in all, so a durable save through a local table writes directly:
   tensors on both sides of the ring's chunk (4 MiB), the hashing piece (256 KiB) and the staging
   buffer (1 MiB), empty ones, hundreds of tiny ones, and scalars between them. */
static int setup(void **state) {
  fixture *fx = calloc(1, sizeof *fx);
  fx->dir = ks_test_tmpdir("fmt-savepaths");
  if (!fx->dir || ks_statedict_create(NULL, &fx->sd, NULL)) return -1;
  ks_statedict *sd = fx->sd;
  int64_t none[1] = {0};
  void *p;
  char name[32];
  if (add_filled(sd, "a/odd", (5u << 20) + 77, 1) || ks_statedict_set_int(sd, "step", 3, NULL) ||
      add_filled(sd, "b/chunk", 4u << 20, 2) || ks_statedict_new_tensor(sd, "c/empty", KS_F32, 1, none, &p, NULL) ||
      add_filled(sd, "d/piece_plus_one", (256u << 10) + 1, 3) || add_filled(sd, "e/stage_minus_one", (1u << 20) - 1, 4))
    return -1;
  for (unsigned i = 0; i < 300; i++) {
    snprintf(name, sizeof name, "f/tiny/%u", i);
    if (add_filled(sd, name, 1 + i % 50, 10 + i)) return -1;
  }
  if (add_filled(sd, "g/big", (9u << 20) + 3, 5) || ks_statedict_new_tensor(sd, "h/empty", KS_F32, 1, none, &p, NULL) ||
      ks_statedict_set_string(sd, "run", "paths", NULL) || add_filled(sd, "i/last", 12345, 6))
    return -1;
  fx->ref = save_read(fx->dir, sd, "ref.ks", ks_test_io_nosync(), &previous, &fx->ref_len);
  *state = fx;
  return 0;
}

static int teardown(void **state) {
  fixture *fx = *state;
  ks_test_rmtree(fx->dir);
  free(fx->dir);
  free(fx->ref);
  ks_statedict_free(fx->sd);
  free(fx);
  return 0;
}

static void assert_ref(const fixture *fx, const uint8_t *b, size_t len, const char *what) {
  if (!b || len != fx->ref_len || memcmp(b, fx->ref, len) != 0)
    fail_msg("%s: %zu bytes, not the previous writer's %zu bytes", what, b ? len : 0, fx->ref_len);
}

/* Whether the file system of dir takes O_DIRECT. */
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

/* The POSIX table on a file system that takes O_DIRECT on a descriptor but refuses the writes
   (refusing_direct_pwrite below refuses the positioned ones). */
static int refusing_direct_write(void *ctx, int fd, const void *buf, size_t n, size_t *written) {
  int *refused = ctx;
  int fl = fcntl(fd, F_GETFL);
  if (fl >= 0 && (fl & O_DIRECT)) {
    (*refused)++;
    return EINVAL;
  }
  return ks_io_posix()->write_fn(NULL, fd, buf, n, written);
}

/* The same for writes at an offset: what the ring's writers use. */
static int refusing_direct_pwrite(void *ctx, int fd, const void *buf, size_t n, uint64_t off, size_t *written) {
  int *refused = ctx;
  int fl = fcntl(fd, F_GETFL);
  if (fl >= 0 && (fl & O_DIRECT)) {
    (*refused)++;
    return EINVAL;
  }
  return ks_io_posix()->pwrite_fn(NULL, fd, buf, n, off, written);
}

static const ks__save_tuning tunings[] = {
    {0},                               /* ks_save's own choice */
    {.threads = 1},                    /* one thread */
    {.threads = 2},                    /* a second thread */
    {.threads = 2, .lead = 1},         /* the hashing thread waits for almost every write */
    {.threads = 2, .direct = -1},      /* never direct */
    {.direct = 1},                     /* direct whenever the table allows, even without fsync */
    {.threads = 1, .direct = 1},       /* direct, the caller filling the ring itself */
};
#define N_TUNINGS (sizeof tunings / sizeof tunings[0])

static void tables_without_durability_write_the_same_bytes(void **state) {
  fixture *fx = *state;
  ks_io nosync = *ks_test_io_nosync(); /* local, no fsync: buffered, the hashing thread */
  ks_io remote = nosync;               /* not local: never direct */
  remote.caps = 0;
  ks_io old = nosync; /* version 4: no pwrite_fn, the two-pass save */
  old.version = 4;
  const ks_io *tables[] = {&nosync, &remote, &old};
  const char *names[] = {"nosync", "not local", "version 4"};
  for (size_t t = 0; t < 3; t++)
    for (size_t k = 0; k < N_TUNINGS; k++) {
      size_t len;
      uint8_t *b = save_read(fx->dir, fx->sd, "x.ks", tables[t], &tunings[k], &len);
      char what[80];
      snprintf(what, sizeof what, "%s, tuning %zu", names[t], k);
      assert_ref(fx, b, len, what);
      free(b);
    }
}

static void durable_tables_write_the_same_bytes(void **state) {
  fixture *fx = *state;
  ks_fault_io counted; /* a copy of the POSIX table (local, durable) that counts its calls */
  ks_fault_io_init(&counted, 0);
  int refused = 0;
  ks_io refusing = *ks_io_posix();
  refusing.ctx = &refused;
  refusing.write_fn = refusing_direct_write;
  refusing.pwrite_fn = refusing_direct_pwrite;
  const ks_io *tables[] = {NULL, &counted.io, &refusing};
  const char *names[] = {"POSIX", "fault table", "refusing direct writes"};
  size_t picks[] = {0, 1, 2, 6}; /* the durable saves take a while: a few tunings */
  for (size_t t = 0; t < 3; t++)
    for (size_t k = 0; k < sizeof picks / sizeof picks[0]; k++) {
      size_t len;
      refused = 0;
      uint8_t *b = save_read(fx->dir, fx->sd, "x.ks", tables[t], &tunings[picks[k]], &len);
      char what[80];
      snprintf(what, sizeof what, "%s, tuning %zu", names[t], picks[k]);
      assert_ref(fx, b, len, what);
      free(b);
      /* Every pick saves directly here: tried once by each of the two writers at most (both may
         have claimed a chunk before either was refused), then the rest goes through the page
         cache. */
      int writers = tunings[picks[k]].threads == 1 ? 1 : 2;
      if (t == 2 && takes_direct(fx->dir)) assert_true(refused >= 1 && refused <= writers);
      if (t == 2 && !takes_direct(fx->dir)) assert_int_equal(refused, 0);
    }
  assert_int_equal(counted.failed_op, -1);
}

static void tmpfs_writes_the_same_bytes(void **state) {
  fixture *fx = *state;
  struct stat sb;
  if (stat("/dev/shm", &sb) != 0 || !S_ISDIR(sb.st_mode) || access("/dev/shm", W_OK) != 0) {
    print_message("no writable /dev/shm: skipped\n");
    return;
  }
  char shm[] = "/dev/shm/ks-savepaths-XXXXXX";
  assert_non_null(mkdtemp(shm));
  size_t picks[] = {0, 2, 5, 6};
  for (size_t k = 0; k < sizeof picks / sizeof picks[0]; k++) {
    size_t len;
    uint8_t *b = save_read(shm, fx->sd, "x.ks", NULL, &tunings[picks[k]], &len);
    assert_ref(fx, b, len, "tmpfs");
    free(b);
  }
  assert_int_equal(rmdir(shm), 0);
}

/* The writes of a save as the table sees them: length, offset (pwrite) and whether direct. */
typedef struct io_call {
  int at; /* pwrite_fn */
  int direct;
  size_t n;
  uint64_t off;
} io_call;

typedef struct recording_io {
  ks_io io;
  io_call calls[256];
  atomic_size_t n; /* two writers record at once */
} recording_io;

static void record(recording_io *r, int at, int fd, size_t n, uint64_t off) {
  int fl = fcntl(fd, F_GETFL);
  size_t i = atomic_fetch_add(&r->n, 1);
  if (i < sizeof r->calls / sizeof r->calls[0]) r->calls[i] = (io_call){at, fl >= 0 && (fl & O_DIRECT) != 0, n, off};
}

static int recording_write(void *ctx, int fd, const void *buf, size_t n, size_t *written) {
  record(ctx, 0, fd, n, 0);
  return ks_io_posix()->write_fn(NULL, fd, buf, n, written);
}

static int recording_pwrite(void *ctx, int fd, const void *buf, size_t n, uint64_t off, size_t *written) {
  record(ctx, 1, fd, n, off);
  return ks_io_posix()->pwrite_fn(NULL, fd, buf, n, off, written);
}

/* A direct save starts the disk after a short first chunk (the header's blocks and 256 KiB of
   data, not a whole 4 MiB buffer), writes every chunk directly at its offset (two writers with a
   second thread), and writes the checksums' digits with a direct write of the header's whole
   blocks at offset 0 once every tensor is hashed: no block but the file's last partial one goes
   through the page cache for fsync to write back. The same bytes. */
static void direct_saves_start_early_and_rewrite_the_header_directly(void **state) {
  fixture *fx = *state;
  if (!takes_direct(fx->dir)) {
    print_message("no O_DIRECT here: skipped\n");
    return;
  }
  size_t picks[] = {0, 6}; /* the filling thread and two writers, the caller alone */
  for (size_t k = 0; k < sizeof picks / sizeof picks[0]; k++) {
    recording_io r = {.io = *ks_io_posix()};
    atomic_init(&r.n, 0);
    r.io.ctx = &r;
    r.io.write_fn = recording_write;
    r.io.pwrite_fn = recording_pwrite;
    size_t len;
    uint8_t *b = save_read(fx->dir, fx->sd, "x.ks", &r.io, &tunings[picks[k]], &len);
    assert_ref(fx, b, len, "recorded direct save");
    free(b);
    uint64_t hlen = 8 + (fx->ref[0] | (uint64_t)fx->ref[1] << 8 | (uint64_t)fx->ref[2] << 16);
    size_t head = (size_t)(hlen + 4095) / 4096 * 4096, n = atomic_load(&r.n);
    assert_true(n >= 3 && n <= sizeof r.calls / sizeof r.calls[0]);
    assert_true(r.calls[0].at && r.calls[0].direct);
    assert_int_equal(r.calls[0].off, 0);
    assert_int_equal(r.calls[0].n, head + (256u << 10)); /* the first chunk */
    size_t heads = 0, buffered = 0, bytes = 0;
    for (size_t i = 0; i < n; i++) {
      const io_call *c = &r.calls[i];
      assert_true(c->at); /* at offsets only */
      if (i && c->off == 0) {
        heads++;
        assert_true(c->direct);
        assert_int_equal(c->n, head);
      } else if (!c->direct) {
        buffered++;
        assert_int_equal(i, n - 1); /* only the last partial block */
        assert_true(c->n < 4096);
      } else {
        assert_int_equal(c->off % 4096, 0);
      }
      if (!i || c->off) bytes += c->n;
    }
    assert_int_equal(heads, 1);
    assert_true(buffered <= 1);
    assert_int_equal(bytes, fx->ref_len); /* every other byte written once */
  }
}

/* The POSIX table on a disk with `left` bytes free: a write past them fails with ENOSPC. */
typedef struct full_io {
  ks_io io;
  atomic_size_t left; /* two writers take from it at once */
} full_io;

/* Takes up to n bytes of the space left: how many (0: the disk is full). */
static size_t take_space(full_io *f, size_t n) {
  size_t left = atomic_load(&f->left), got;
  do {
    got = n < left ? n : left;
  } while (got && !atomic_compare_exchange_weak(&f->left, &left, left - got));
  return got;
}

static int full_write(void *ctx, int fd, const void *buf, size_t n, size_t *written) {
  size_t got = take_space(ctx, n);
  return got ? ks_io_posix()->write_fn(NULL, fd, buf, got, written) : ENOSPC;
}

/* A direct write of part of an aligned run is not aligned: a full disk refuses it whole. */
static int full_pwrite(void *ctx, int fd, const void *buf, size_t n, uint64_t off, size_t *written) {
  size_t got = take_space(ctx, n);
  if (got < n) return ENOSPC;
  return ks_io_posix()->pwrite_fn(NULL, fd, buf, got, off, written);
}

/* A write that fails at the start, after a block, or in the middle of the ring (or of the hashing
   thread's run) stops both threads: KS_E_IO naming the cause, the old file, no temporary file. */
static void failing_writes_leave_the_old_file(void **state) {
  fixture *fx = *state;
  char *dir = ks_test_path(fx->dir, "full");
  assert_int_equal(mkdir(dir, 0700), 0);
  char *path = ks_test_path(dir, "ckpt.ks");
  ks_statedict *old = fmt_small_dict(2);
  assert_non_null(old);
  assert_int_equal(ks_save(path, old, NULL, NULL, NULL), KS_OK);
  size_t old_len;
  uint8_t *old_bytes = ks_test_read_file(path, &old_len);
  size_t limits[] = {0, 4096, (6u << 20) + 4096, (17u << 20)};
  size_t picks[] = {0, 1, 2, 6};
  for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++)
    for (size_t k = 0; k < sizeof picks / sizeof picks[0]; k++) {
      full_io f = {.io = *ks_io_posix()};
      atomic_init(&f.left, limits[i]);
      f.io.ctx = &f;
      f.io.write_fn = full_write;
      f.io.pwrite_fn = full_pwrite;
      ks_save_opts o = {.io = &f.io};
      ks_error err;
      assert_int_equal(ks__save_tuned(path, fx->sd, NULL, &o, &tunings[picks[k]], &err), KS_E_IO);
      assert_non_null(strstr(err.message, strerror(ENOSPC)));
      assert_string_equal(err.file, path);
      assert_int_equal(ks_test_dir_entries(dir), 1); /* no temporary file left */
      size_t len;
      uint8_t *now = ks_test_read_file(path, &len);
      assert_int_equal(len, old_len);
      assert_memory_equal(now, old_bytes, len);
      free(now);
    }
  free(old_bytes);
  ks_statedict_free(old);
  free(path);
  free(dir);
}

/* Every allocation of a save may fail, on every path: KS_E_NOMEM, no file, nothing leaked. */
static void every_allocation_may_fail(void **state) {
  fixture *fx = *state;
  char *dir = ks_test_path(fx->dir, "nomem");
  assert_int_equal(mkdir(dir, 0700), 0);
  char *path = ks_test_path(dir, "ckpt.ks");
  ks_io old = *ks_test_io_nosync();
  old.version = 4;
  const ks_io *tables[] = {NULL, ks_test_io_nosync(), &old}; /* direct, hashing thread, two passes */
  for (size_t t = 0; t < 3; t++) {
    ks_status st = KS_E_NOMEM;
    long n;
    for (n = 1; st == KS_E_NOMEM && n < 400; n++) {
      ks_test_alloc ta;
      ks_test_alloc_init(&ta, n);
      ks_save_opts o = {.alloc = &ta.a, .io = tables[t]};
      st = ks_save(path, fx->sd, NULL, &o, NULL);
      if (st == KS_E_NOMEM) assert_int_equal(ks_test_dir_entries(dir), 0);
      assert_int_equal(ta.live, 0);
    }
    assert_int_equal(st, KS_OK);
    assert_true(n > 4); /* the job's three arrays, the header, the staging buffer... */
    size_t len;
    uint8_t *b = ks_test_read_file(path, &len);
    assert_ref(fx, b, len, "after allocation failures");
    free(b);
    assert_int_equal(unlink(path), 0);
  }
  free(path);
  free(dir);
}

/* Copy-mode loads read the data on several threads, hashing it as it lands: the same tensors as
   the mapping, and the same first problem (a flipped byte in the middle of a large tensor, in a
   tiny one) with the same message as the mapped verification. */
static void copy_loads_find_what_the_mapping_finds(void **state) {
  fixture *fx = *state;
  char *path = ks_test_path(fx->dir, "load.ks");
  assert_int_equal(ks_test_write_file(path, fx->ref, fx->ref_len), 0);
  ks_read_opts oc = {.mode = KS_READ_COPY, .verify_checksums = 1}, om = {.mode = KS_READ_MMAP, .verify_checksums = 1};
  ks_reader *rc = NULL, *rm = NULL;
  assert_int_equal(ks_reader_open(path, &oc, &rc, NULL), KS_OK);
  assert_int_equal(ks_reader_open(path, &om, &rm, NULL), KS_OK);
  assert_int_equal(ks_reader_count(rc), ks_reader_count(rm));
  for (size_t i = 0; i < ks_reader_count(rc); i++) {
    ks_tensor a, b;
    assert_int_equal(ks_reader_tensor_at(rc, i, NULL, &a), KS_OK);
    assert_int_equal(ks_reader_tensor_at(rm, i, NULL, &b), KS_OK);
    assert_int_equal(a.nbytes, b.nbytes);
    if (a.nbytes) assert_memory_equal(a.data, b.data, a.nbytes);
  }
  ks_tensor_info big, tiny;
  assert_int_equal(ks_reader_tensor_info(rm, (size_t)ks_reader_find(rm, "g/big"), &big), KS_OK);
  assert_int_equal(ks_reader_tensor_info(rm, (size_t)ks_reader_find(rm, "f/tiny/7"), &tiny), KS_OK);
  ks_reader_free(rc);
  ks_reader_free(rm);
  uint64_t flips[] = {big.begin + (big.end - big.begin) / 2, tiny.begin, big.end - 1};
  for (size_t f = 0; f < sizeof flips / sizeof flips[0]; f++) {
    uint8_t *bad = malloc(fx->ref_len);
    memcpy(bad, fx->ref, fx->ref_len);
    bad[flips[f]] ^= 0x40;
    assert_int_equal(ks_test_write_file(path, bad, fx->ref_len), 0);
    free(bad);
    ks_error ec, em;
    rc = rm = NULL;
    assert_int_equal(ks_reader_open(path, &oc, &rc, &ec), KS_E_CHECKSUM);
    assert_int_equal(ks_reader_open(path, &om, &rm, &em), KS_E_CHECKSUM);
    assert_null(rc);
    assert_null(rm);
    assert_string_equal(ec.message, em.message);
    assert_string_equal(ec.key, em.key);
    assert_int_equal(ec.offset, em.offset);
  }
  free(path);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(tables_without_durability_write_the_same_bytes),
      cmocka_unit_test(durable_tables_write_the_same_bytes),
      cmocka_unit_test(tmpfs_writes_the_same_bytes),
      cmocka_unit_test(direct_saves_start_early_and_rewrite_the_header_directly),
      cmocka_unit_test(failing_writes_leave_the_old_file),
      cmocka_unit_test(every_allocation_may_fail),
      cmocka_unit_test(copy_loads_find_what_the_mapping_finds),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
