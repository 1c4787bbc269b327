/*
 * ks_save reads each tensor byte once: it writes the header with placeholder
 * checksum digits, hashes each tensor as it writes it, and writes the digits over
 * the placeholders with the table's pwrite_fn. A table without one (pwrite_fn
 * NULL, or a table older than version 5) gets the two-pass save. Both must give
 * the same bytes; a failing positioned write must leave the old file alone.
 */
#define _GNU_SOURCE /* O_DIRECT */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "keepsake/io_cache.h"
#include "test_format_helpers.h"

/* A copy of the POSIX table whose pwrite_fn counts calls and bytes, and can be made
   to fail (fail_errno) or to write at most max_len bytes per call. */
typedef struct pw_io {
  ks_io io;
  int calls, fail_errno;
  size_t bytes, max_len;
} pw_io;

static int pw_pwrite(void *ctx, int fd, const void *buf, size_t n, uint64_t off, size_t *written) {
  pw_io *p = ctx;
  p->calls++;
  if (p->fail_errno) return p->fail_errno;
  if (p->max_len && n > p->max_len) n = p->max_len;
  int rc = ks_io_posix()->pwrite_fn(NULL, fd, buf, n, off, written);
  if (!rc) p->bytes += *written;
  return rc;
}

static void pw_init(pw_io *p) {
  memset(p, 0, sizeof *p);
  p->io = *ks_test_io_nosync();
  p->io.ctx = p;
  p->io.pwrite_fn = pw_pwrite;
}

typedef struct fixture {
  char *dir;
  ks_statedict *sd;
} fixture;

static int add_filled(ks_statedict *sd, const char *name, size_t n, unsigned seed) {
  int64_t shape[1] = {(int64_t)n};
  uint8_t *p;
  if (ks_statedict_new_tensor(sd, name, KS_U8, 1, shape, (void **)&p, NULL)) return -1;
  for (size_t i = 0; i < n; i++) p[i] = (uint8_t)((i * 2654435761u + seed) >> 7);
  return 0;
}

/* Tensors on both sides of the staging size (1 MiB) and of the hashing piece size, one not a
   multiple of it, an empty one, names the header escapes, and scalars between them. */
static int setup(void **state) {
  fixture *fx = calloc(1, sizeof *fx);
  fx->dir = ks_test_tmpdir("fmt-onepass");
  if (ks_statedict_create(NULL, &fx->sd, NULL)) return -1;
  ks_statedict *sd = fx->sd;
  int64_t none[1] = {0};
  void *p;
  if (add_filled(sd, "small/a", 100, 1) || ks_statedict_set_int(sd, "step", 42, NULL) ||
      add_filled(sd, "quote\"back\\slash\x01", 7, 2) || add_filled(sd, "big/three_mib_plus", (3u << 20) + 123, 3) ||
      add_filled(sd, "caf\xc3\xa9", 3, 4) || ks_statedict_new_tensor(sd, "empty", KS_F32, 1, none, &p, NULL) ||
      add_filled(sd, "big/one_mib", 1u << 20, 5) || add_filled(sd, "under_one_mib", (1u << 20) - 1, 6) ||
      ks_statedict_set_string(sd, "run", "one pass", NULL) || add_filled(sd, "small/z", 1, 7))
    return -1;
  *state = fx;
  return 0;
}

static int teardown(void **state) {
  fixture *fx = *state;
  ks_test_rmtree(fx->dir);
  free(fx->dir);
  ks_statedict_free(fx->sd);
  free(fx);
  return 0;
}

/* Saves sd to dir/name through io and returns the file's bytes. */
static uint8_t *save_read(const fixture *fx, const ks_statedict *sd, const char *name, const ks_io *io, size_t *len) {
  char *path = ks_test_path(fx->dir, name);
  ks_save_opts o = {.io = io};
  ks_error err;
  ks_status st = ks_save(path, sd, NULL, &o, &err);
  if (st) fail_msg("ks_save: %s", err.message);
  uint8_t *b = ks_test_read_file(path, len);
  ks_read_opts ro = {.verify_checksums = 1};
  ks_reader *r = NULL;
  assert_int_equal(ks_reader_open(path, &ro, &r, &err), KS_OK);
  ks_reader_free(r);
  free(path);
  return b;
}

static void assert_same(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen) {
  assert_non_null(a);
  assert_non_null(b);
  assert_int_equal(alen, blen);
  assert_memory_equal(a, b, alen);
}

static void one_pass_file_is_byte_identical_to_two_pass(void **state) {
  fixture *fx = *state;
  pw_io one;
  pw_init(&one);
  pw_io two;
  pw_init(&two);
  two.io.pwrite_fn = NULL; /* the fallback: hash first, then write */
  pw_io old;
  pw_init(&old);
  old.io.version = 4; /* pwrite_fn is past this version's members: never called */
  old.fail_errno = EIO;
  size_t l1, l2, l3;
  uint8_t *b1 = save_read(fx, fx->sd, "one.ks", &one.io, &l1);
  uint8_t *b2 = save_read(fx, fx->sd, "two.ks", &two.io, &l2);
  uint8_t *b3 = save_read(fx, fx->sd, "old.ks", &old.io, &l3);
  assert_same(b1, l1, b2, l2);
  assert_same(b1, l1, b3, l3);
  assert_int_equal(one.calls, 1); /* every checksum patched with one positioned write */
  assert_int_equal(old.calls, 0);
  /* The patched range is the checksum digits: 16 per tensor, and less than the header. */
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | b1[i];
  assert_true(one.bytes >= 8 * 16 && one.bytes < hlen);
  for (size_t i = 0; i + 16 <= (size_t)hlen + 8; i++) /* no placeholder left */
    assert_false(memcmp(b1 + i, "0000000000000000", 16) == 0);
  free(b1);
  free(b2);
  free(b3);
}

static void one_pass_through_the_default_table_matches(void **state) {
  fixture *fx = *state;
  pw_io two;
  pw_init(&two);
  two.io.pwrite_fn = NULL;
  size_t l1, l2;
  uint8_t *b1 = save_read(fx, fx->sd, "default.ks", NULL, &l1);
  uint8_t *b2 = save_read(fx, fx->sd, "two.ks", &two.io, &l2);
  assert_same(b1, l1, b2, l2);
  free(b1);
  free(b2);
}

static void short_positioned_writes_are_retried(void **state) {
  fixture *fx = *state;
  pw_io shortw;
  pw_init(&shortw);
  shortw.max_len = 5;
  pw_io two;
  pw_init(&two);
  two.io.pwrite_fn = NULL;
  size_t l1, l2;
  uint8_t *b1 = save_read(fx, fx->sd, "short.ks", &shortw.io, &l1);
  uint8_t *b2 = save_read(fx, fx->sd, "two.ks", &two.io, &l2);
  assert_same(b1, l1, b2, l2);
  assert_true(shortw.calls > 8 * 16 / 5);
  free(b1);
  free(b2);
}

static void failing_positioned_write_leaves_old_file(void **state) {
  fixture *fx = *state;
  char *dir = ks_test_path(fx->dir, "fail");
  assert_int_equal(mkdir(dir, 0700), 0);
  char *path = ks_test_path(dir, "ckpt.ks");
  ks_statedict *old = fmt_small_dict(1);
  assert_non_null(old);
  assert_int_equal(ks_save(path, old, NULL, NULL, NULL), KS_OK);
  size_t old_len;
  uint8_t *old_bytes = ks_test_read_file(path, &old_len);
  int errs[] = {EIO, ENOSPC};
  for (size_t i = 0; i < sizeof errs / sizeof errs[0]; i++) {
    pw_io bad;
    pw_init(&bad);
    bad.fail_errno = errs[i];
    ks_save_opts o = {.io = &bad.io};
    ks_error err;
    assert_int_equal(ks_save(path, fx->sd, NULL, &o, &err), KS_E_IO);
    assert_int_equal(bad.calls, 1);
    assert_string_equal(err.file, path);
    assert_non_null(strstr(err.message, "temporary"));
    assert_non_null(strstr(err.message, strerror(errs[i])));
    assert_int_equal(ks_test_dir_entries(dir), 1); /* no temporary file left */
    size_t len;
    uint8_t *now = ks_test_read_file(path, &len);
    assert_same(now, len, old_bytes, old_len);
    free(now);
  }
  free(old_bytes);
  free(path);
  free(dir);
  ks_statedict_free(old);
}

static void no_tensors_needs_no_positioned_write(void **state) {
  fixture *fx = *state;
  ks_statedict *sd;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_int(sd, "step", 7, NULL), KS_OK);
  pw_io one;
  pw_init(&one);
  pw_io two;
  pw_init(&two);
  two.io.pwrite_fn = NULL;
  size_t l1, l2;
  uint8_t *b1 = save_read(fx, sd, "one.ks", &one.io, &l1);
  uint8_t *b2 = save_read(fx, sd, "two.ks", &two.io, &l2);
  assert_same(b1, l1, b2, l2);
  assert_int_equal(one.calls, 0);
  free(b1);
  free(b2);
  ks_statedict_free(sd);
}

/* The wrapping tables pass pwrite_fn through when the table they wrap has one, and only then. */
static void wrapping_tables_forward_pwrite(void **state) {
  fixture *fx = *state;
  pw_io inner;
  pw_init(&inner);
  pw_io plain;
  pw_init(&plain);
  plain.io.pwrite_fn = NULL;
  ks_io *counter = NULL, *counter_plain = NULL, *cache = NULL, *cache_plain = NULL;
  char *cdir = ks_test_path(fx->dir, "cache");
  assert_int_equal(mkdir(cdir, 0700), 0);
  assert_int_equal(ks_io_counter_create(&inner.io, 0, NULL, &counter, NULL), KS_OK);
  assert_int_equal(ks_io_counter_create(&plain.io, 0, NULL, &counter_plain, NULL), KS_OK);
  assert_int_equal(ks_io_cache_create(&inner.io, cdir, NULL, &cache, NULL), KS_OK);
  assert_int_equal(ks_io_cache_create(&plain.io, cdir, NULL, &cache_plain, NULL), KS_OK);
  assert_non_null(counter->pwrite_fn);
  assert_non_null(cache->pwrite_fn);
  assert_null(counter_plain->pwrite_fn);
  assert_null(cache_plain->pwrite_fn);
  size_t l1, l2, l3;
  uint8_t *b1 = save_read(fx, fx->sd, "counted.ks", counter, &l1);
  uint8_t *b2 = save_read(fx, fx->sd, "cached.ks", cache, &l2);
  uint8_t *b3 = save_read(fx, fx->sd, "plain.ks", counter_plain, &l3);
  assert_int_equal(inner.calls, 2);
  assert_int_equal(plain.calls, 0);
  assert_same(b1, l1, b2, l2);
  assert_same(b1, l1, b3, l3);
  free(b1);
  free(b2);
  free(b3);
  ks_io_counter_free(counter);
  ks_io_counter_free(counter_plain);
  ks_io_cache_free(cache);
  ks_io_cache_free(cache_plain);
  free(cdir);
}

/* The POSIX table on a disk with `left` bytes free: a write past them fails with ENOSPC. */
typedef struct full_io {
  ks_io io;
  size_t left;
} full_io;

static int full_write(void *ctx, int fd, const void *buf, size_t n, size_t *written) {
  full_io *f = ctx;
  if (f->left == 0) return ENOSPC;
  int rc = ks_io_posix()->write_fn(NULL, fd, buf, n < f->left ? n : f->left, written);
  if (!rc) f->left -= *written;
  return rc;
}

/* Whether the file system of dir takes O_DIRECT (tmpfs does not: then nothing is tried). */
static int takes_direct(const char *dir) {
#ifdef O_DIRECT
  char *probe = ks_test_path(dir, "direct-probe");
  int fd = open(probe, O_WRONLY | O_CREAT | O_TRUNC, 0600), ok = 0;
  if (fd >= 0) {
    ok = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_DIRECT) == 0;
    close(fd);
    unlink(probe);
  }
  free(probe);
  return ok;
#else
  (void)dir;
  return 0;
#endif
}

/* The POSIX table on a file system that takes O_DIRECT on a descriptor but refuses the writes. */
static int refusing_direct_write(void *ctx, int fd, const void *buf, size_t n, size_t *written) {
  int *refused = ctx;
  int fl = fcntl(fd, F_GETFL);
  if (fl >= 0 && (fl & O_DIRECT)) {
    (*refused)++;
    return EINVAL;
  }
  return ks_io_posix()->write_fn(NULL, fd, buf, n, written);
}

/* A file image of sd in the caller's memory (KS_IMAGE_ALIGN-aligned, as large as a layout-only
   image says it must be, filled with a pattern the header room must overwrite); *ib->sd receives
   a state dict of the same entries whose tensors the caller copied to the offsets ks_image_get
   gives, as a caller copying device tensors into page-locked memory does. */
typedef struct image_buf {
  uint8_t *base, *mem;
  size_t cap;
  ks_image *im;
  ks_statedict *sd;
} image_buf;

static size_t image_need(const ks_statedict *sd) {
  ks_image *lay = NULL;
  ks_image_opts lo = {.size = sizeof lo, .layout_only = 1};
  assert_int_equal(ks_image_create(sd, NULL, &lo, &lay, NULL), KS_OK);
  ks_image_info info = {.size = sizeof info};
  assert_int_equal(ks_image_get(lay, NULL, NULL, &info, NULL), KS_OK);
  assert_null(info.buf); /* a layout has no memory */
  ks_image_free(lay);
  assert_int_equal(info.need % KS_IMAGE_ALIGN, 0);
  return info.need;
}

static void image_make(const ks_statedict *sd, image_buf *ib) {
  ib->cap = image_need(sd);
  ib->base = malloc(ib->cap + KS_IMAGE_ALIGN);
  assert_non_null(ib->base);
  ib->mem = (uint8_t *)(((uintptr_t)ib->base + KS_IMAGE_ALIGN - 1) & ~(uintptr_t)(KS_IMAGE_ALIGN - 1));
  memset(ib->mem, 0xA5, ib->cap);
  ks_image_opts o = {.size = sizeof o, .buf = ib->mem, .buf_size = ib->cap};
  assert_int_equal(ks_image_create(sd, NULL, &o, &ib->im, NULL), KS_OK);
  ks_image_info info = {.size = sizeof info};
  assert_int_equal(ks_image_get(ib->im, sd, NULL, &info, NULL), KS_OK);
  assert_ptr_equal(info.buf, ib->mem);
  assert_int_equal(info.count, ks_statedict_count(sd));
  assert_int_equal(ks_statedict_create(NULL, &ib->sd, NULL), KS_OK);
  for (size_t i = 0; i < ks_statedict_count(sd); i++) {
    ks_entry e;
    assert_int_equal(ks_statedict_at(sd, i, &e), KS_OK);
    if (e.kind == KS_VAL_TENSOR) {
      assert_true(info.offsets[i] >= info.header_len && info.offsets[i] + e.tensor.nbytes <= ib->cap);
      if (e.tensor.nbytes) memcpy(ib->mem + info.offsets[i], e.tensor.data, e.tensor.nbytes);
      e.tensor.data = ib->mem + info.offsets[i];
    } else {
      assert_true(info.offsets[i] == UINT64_MAX);
    }
    assert_int_equal(ks_statedict_set_entry(ib->sd, e.name, &e, KS_BORROW, NULL), KS_OK);
  }
}

static void image_free(image_buf *ib) {
  ks_image_free(ib->im);
  ks_statedict_free(ib->sd);
  free(ib->base);
}

/* Saves through an image (ks_save_opts.image) write the bytes ks_save writes: through the POSIX
   table (direct writes where the file system takes them), a table that is not local (buffered),
   on tmpfs when there is one (no O_DIRECT there), from tensors the caller placed in the image,
   from tensors lying elsewhere (copied in), or from tensors lying in the image away from their
   place (copied aside first), and through an image in memory of its own. */
static void image_saves_are_byte_identical(void **state) {
  fixture *fx = *state;
  ks_statedict *sd;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  assert_int_equal(add_filled(sd, "a/odd", (3u << 20) + 77, 21), 0); /* sizes straddling 4 KiB blocks */
  assert_int_equal(ks_statedict_set_int(sd, "step", 9, NULL), KS_OK);
  assert_int_equal(add_filled(sd, "b/small", 4095, 22), 0);
  int64_t none[1] = {0};
  void *p;
  assert_int_equal(ks_statedict_new_tensor(sd, "c/empty", KS_F32, 1, none, &p, NULL), KS_OK);
  assert_int_equal(add_filled(sd, "d/big", (9u << 20) + 1, 23), 0);
  size_t lref, l;
  uint8_t *ref = save_read(fx, sd, "ref.ks", NULL, &lref);
  pw_io remote; /* a table whose handles are not file descriptors as far as the library knows */
  pw_init(&remote);
  remote.io.caps = 0;
  const ks_io *tables[] = {NULL, &remote.io};
  for (size_t t = 0; t < 2; t++)
    for (int placed = 0; placed < 2; placed++) {
      image_buf ib;
      image_make(sd, &ib);
      char *path = ks_test_path(fx->dir, "image.ks");
      ks_save_opts o = {.size = sizeof o, .io = tables[t], .image = ib.im};
      ks_error err;
      assert_int_equal(ks_save(path, placed ? ib.sd : sd, NULL, &o, &err), KS_OK);
      uint8_t *got = ks_test_read_file(path, &l);
      assert_same(got, l, ref, lref);
      assert_memory_equal(ib.mem, ref, 4096); /* the file was written from the caller's memory */
      free(got);
      free(path);
      image_free(&ib);
    }
  { /* the caller's memory must be aligned for direct I/O */
    uint8_t *raw = malloc(2 * KS_IMAGE_ALIGN);
    uint8_t *mis = (uint8_t *)(((uintptr_t)raw + KS_IMAGE_ALIGN - 1) & ~(uintptr_t)(KS_IMAGE_ALIGN - 1)) + 64;
    ks_image_opts o = {.size = sizeof o, .buf = mis, .buf_size = KS_IMAGE_ALIGN};
    ks_image *im = NULL;
    ks_error err;
    assert_int_equal(ks_image_create(sd, NULL, &o, &im, &err), KS_E_INVALID);
    assert_null(im);
    assert_non_null(strstr(err.message, "aligned"));
    free(raw);
  }
  { /* direct writes refused by the file system: the whole file goes buffered, the same bytes */
    image_buf rb;
    image_make(sd, &rb);
    int refused = 0;
    ks_io io = *ks_io_posix();
    io.ctx = &refused;
    io.write_fn = refusing_direct_write;
    ks_save_opts o = {.size = sizeof o, .io = &io, .image = rb.im};
    char *rpath = ks_test_path(fx->dir, "refused.ks");
    assert_int_equal(ks_save(rpath, rb.sd, NULL, &o, NULL), KS_OK);
    uint8_t *rgot = ks_test_read_file(rpath, &l);
    assert_same(rgot, l, ref, lref);
    assert_int_equal(refused, takes_direct(fx->dir) ? 1 : 0); /* tried once, then buffered */
    free(rgot);
    free(rpath);
    image_free(&rb);
  }
  image_buf ib; /* entries in the image, not where the layout puts them: copied aside, then placed */
  image_make(sd, &ib);
  ks_statedict *swapped = NULL;
  assert_int_equal(ks_statedict_create(NULL, &swapped, NULL), KS_OK);
  ks_entry ea, eb;
  assert_int_equal(ks_statedict_get(ib.sd, "b/small", &eb), KS_OK);
  for (size_t i = 0; i < ks_statedict_count(ib.sd); i++) { /* b/small's bytes where a/odd's start */
    ks_entry e;
    assert_int_equal(ks_statedict_at(ib.sd, i, &e), KS_OK);
    if (!strcmp(e.name, "b/small")) {
      ea = e;
      ks_entry ma;
      assert_int_equal(ks_statedict_get(ib.sd, "a/odd", &ma), KS_OK);
      memmove(ma.tensor.data, eb.tensor.data, eb.tensor.nbytes); /* a/odd's place now holds b/small */
      ea.tensor.data = ma.tensor.data;
      e = ea;
    }
    if (!strcmp(e.name, "a/odd")) {
      ks_entry orig;
      assert_int_equal(ks_statedict_get(sd, "a/odd", &orig), KS_OK);
      e.tensor.data = orig.tensor.data; /* a/odd from outside the image */
    }
    assert_int_equal(ks_statedict_set_entry(swapped, e.name, &e, KS_BORROW, NULL), KS_OK);
  }
  char *path = ks_test_path(fx->dir, "moved.ks");
  ks_save_opts io = {.size = sizeof io, .image = ib.im};
  assert_int_equal(ks_save(path, swapped, NULL, &io, NULL), KS_OK);
  uint8_t *got = ks_test_read_file(path, &l);
  assert_same(got, l, ref, lref);
  free(got);
  free(path);
  ks_statedict_free(swapped);
  struct stat sb;
  if (stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode) && access("/dev/shm", W_OK) == 0) {
    char shm[] = "/dev/shm/ks-image-XXXXXX";
    assert_non_null(mkdtemp(shm));
    char *spath = ks_test_path(shm, "image.ks");
    ks_image *own = NULL; /* an image in memory of its own */
    assert_int_equal(ks_image_create(sd, NULL, NULL, &own, NULL), KS_OK);
    ks_save_opts so = {.size = sizeof so, .image = own};
    assert_int_equal(ks_save(spath, sd, NULL, &so, NULL), KS_OK);
    got = ks_test_read_file(spath, &l);
    assert_same(got, l, ref, lref);
    free(got);
    ks_image_free(own);
    assert_int_equal(unlink(spath), 0);
    assert_int_equal(rmdir(shm), 0);
    free(spath);
  }
  image_free(&ib);
  free(ref);
  ks_statedict_free(sd);
}

/* Every allocation of an image save may fail, ks_image_create's and the save's: KS_E_NOMEM, no
   file, no leak; a failing write leaves no temporary file and the old file in place. */
static void image_save_failures_leave_nothing(void **state) {
  fixture *fx = *state;
  char *dir = ks_test_path(fx->dir, "imgfail");
  assert_int_equal(mkdir(dir, 0700), 0);
  char *path = ks_test_path(dir, "ckpt.ks");
  ks_status st = KS_E_NOMEM;
  long failed = 0;
  for (long n = 1; st == KS_E_NOMEM && n < 400; n++) {
    ks_test_alloc ta;
    ks_test_alloc_init(&ta, n);
    ks_image_opts io = {.size = sizeof io, .alloc = &ta.a};
    ks_image *im = NULL;
    st = ks_image_create(fx->sd, NULL, &io, &im, NULL);
    if (st == KS_OK) {
      ks_save_opts o = {.size = sizeof o, .alloc = &ta.a, .image = im};
      st = ks_save(path, fx->sd, NULL, &o, NULL);
    } else {
      assert_null(im);
    }
    ks_image_free(im);
    if (st == KS_E_NOMEM) {
      failed++;
      assert_int_equal(ks_test_dir_entries(dir), 0);
    }
    assert_int_equal(ta.live, 0);
  }
  assert_int_equal(st, KS_OK);
  assert_true(failed >= 8); /* the image's own allocations, then the save's */
  size_t old_len;
  uint8_t *old = ks_test_read_file(path, &old_len);
  image_buf other;
  image_make(fx->sd, &other);
  size_t limits[] = {0, 4096, (1u << 20) + 4096}; /* the disk fills at once, after a block, midway */
  for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++) {
    full_io f = {.io = *ks_io_posix(), .left = limits[i]};
    f.io.ctx = &f;
    f.io.write_fn = full_write;
    ks_save_opts o = {.size = sizeof o, .io = &f.io, .image = other.im};
    ks_error err;
    assert_int_equal(ks_save(path, other.sd, NULL, &o, &err), KS_E_IO);
    assert_non_null(strstr(err.message, strerror(ENOSPC)));
    assert_int_equal(ks_test_dir_entries(dir), 1); /* no temporary file left */
    size_t len;
    uint8_t *now = ks_test_read_file(path, &len);
    assert_same(now, len, old, old_len);
    free(now);
  }
  free(old);
  image_free(&other);
  free(path);
  free(dir);
}

static void check_accepts_version_5_without_pwrite(void **state) {
  (void)state;
  ks_io io = *ks_io_posix();
  assert_true(io.version >= 5u);
  assert_non_null(io.pwrite_fn);
  io.version = 5u; /* a program built against the version 5 header */
  io.pwrite_fn = NULL;
  assert_int_equal(ks_io_check(&io, NULL), KS_OK);
  io.version = KS_IO_VERSION; /* version 6: validator_fn and detail_fn may be absent too */
  io.validator_fn = NULL;
  io.detail_fn = NULL;
  assert_int_equal(ks_io_check(&io, NULL), KS_OK);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(one_pass_file_is_byte_identical_to_two_pass),
      cmocka_unit_test(one_pass_through_the_default_table_matches),
      cmocka_unit_test(short_positioned_writes_are_retried),
      cmocka_unit_test(failing_positioned_write_leaves_old_file),
      cmocka_unit_test(no_tensors_needs_no_positioned_write),
      cmocka_unit_test(wrapping_tables_forward_pwrite),
      cmocka_unit_test(check_accepts_version_5_without_pwrite),
      cmocka_unit_test(image_saves_are_byte_identical),
      cmocka_unit_test(image_save_failures_leave_nothing),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
