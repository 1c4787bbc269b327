/*
 * The file image (ks_image): every staged save path writes, byte for byte, the reference files
 * of tests/fixtures/image, which keepsake wrote with the staging calls the image replaced
 * (ks_save_image, ks_async_saver_stage_into / _start_dict, ks_ckpt_manager_reserve_dict /
 * _save_dict; make_image_files.c). And ks_image_create fails cleanly at every allocation.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "../fixtures/image/image_state.h"
#include "keepsake/keepsake.h"
#include "testutil.h"

typedef struct one_state {
  ks_statedict *sd;
  ks_meta *meta;
  void *data;
  uint8_t *ref;
  size_t ref_len;
} one_state;

static void state_load(int64_t step, const char *file, one_state *o) {
  assert_int_equal(image_state_build(step, &o->sd, &o->meta, &o->data), KS_OK);
  char *path = ks_test_path(KS_FIXTURES_DIR "/image", file);
  o->ref = ks_test_read_file(path, &o->ref_len);
  assert_non_null(o->ref);
  free(path);
}

static void state_free(one_state *o) {
  image_state_free(o->sd, o->meta, o->data);
  free(o->ref);
}

static void assert_file_is(const char *path, const one_state *o) {
  size_t len = 0;
  uint8_t *got = ks_test_read_file(path, &len);
  assert_non_null(got);
  assert_int_equal(len, o->ref_len);
  assert_memory_equal(got, o->ref, len);
  free(got);
}

/* sd's tensors copied to the offsets ks_image_get gives (as a caller copying device tensors into
   page-locked memory does); *out borrows them there. */
static ks_statedict *placed_in(ks_image *im, const one_state *o) {
  ks_image_info info = {.size = sizeof info};
  assert_int_equal(ks_image_get(im, o->sd, o->meta, &info, NULL), KS_OK);
  assert_non_null(info.buf);
  ks_statedict *p = NULL;
  assert_int_equal(ks_statedict_create(NULL, &p, NULL), KS_OK);
  for (size_t i = 0; i < ks_statedict_count(o->sd); i++) {
    ks_entry e;
    assert_int_equal(ks_statedict_at(o->sd, i, &e), KS_OK);
    if (e.kind == KS_VAL_TENSOR) {
      assert_true(info.offsets[i] + e.tensor.nbytes <= info.buf_size);
      if (e.tensor.nbytes) memcpy((uint8_t *)info.buf + info.offsets[i], e.tensor.data, e.tensor.nbytes);
      e.tensor.data = (uint8_t *)info.buf + info.offsets[i];
    }
    assert_int_equal(ks_statedict_set_entry(p, e.name, &e, KS_BORROW, NULL), KS_OK);
  }
  return p;
}

/* Each path of the image API writes the reference file of each state; one image (the caller's
   memory, then the image's own) carries both states in turn, so the second save moves the data
   behind a header of another length. */
static void every_image_path_writes_the_reference_files(void **state) {
  (void)state;
  char *dir = ks_test_tmpdir("image-ref");
  char *path = ks_test_path(dir, "f.keepsake");
  one_state st[2];
  state_load(9, "step9.keepsake", &st[0]);
  state_load(1000200, "step1000200.keepsake", &st[1]);
  assert_true(st[0].ref_len != st[1].ref_len); /* headers of two lengths */
  /* The caller's memory, sized by a layout-only image of the larger state. */
  ks_image_opts lo = {.size = sizeof lo, .layout_only = 1};
  ks_image *lay = NULL;
  assert_int_equal(ks_image_create(st[1].sd, st[1].meta, &lo, &lay, NULL), KS_OK);
  ks_image_info info = {.size = sizeof info};
  assert_int_equal(ks_image_get(lay, NULL, NULL, &info, NULL), KS_OK);
  ks_image_free(lay);
  size_t cap = info.need;
  void *mem = aligned_alloc(KS_IMAGE_ALIGN, cap);
  assert_non_null(mem);
  ks_image_opts co = {.size = sizeof co, .buf = mem, .buf_size = cap};
  ks_image *given = NULL, *own = NULL;
  assert_int_equal(ks_image_create(st[0].sd, st[0].meta, &co, &given, NULL), KS_OK);
  assert_int_equal(ks_image_create(st[0].sd, st[0].meta, NULL, &own, NULL), KS_OK);
  ks_async_saver *sv = NULL;
  assert_int_equal(ks_async_saver_create(NULL, &sv, NULL), KS_OK);
  char *run = ks_test_path(dir, "run");
  ks_ckpt_opts mo = {.run_dir = run, .filename = "ckpt.keepsake", .lock = KS_CKPT_LOCK_OFF};
  ks_ckpt_manager *m = NULL;
  assert_int_equal(ks_ckpt_manager_create(&mo, &m, NULL), KS_OK);
  for (int k = 0; k < 2; k++) {
    one_state *o = &st[k];
    ks_image *ims[2] = {given, own};
    for (int w = 0; w < 2; w++) {
      /* 1. The sync save through the image: tensors copied in, or already placed by the caller. */
      ks_save_opts so = {.size = sizeof so, .image = ims[w]};
      assert_int_equal(ks_save(path, o->sd, o->meta, &so, NULL), KS_OK);
      assert_file_is(path, o);
      ks_statedict *placed = placed_in(ims[w], o);
      assert_int_equal(ks_save(path, placed, o->meta, &so, NULL), KS_OK);
      assert_file_is(path, o);
      /* 2. The background saver through the image. */
      assert_int_equal(ks_async_saver_start_image(sv, ims[w], placed, o->meta, path, NULL, NULL, NULL, NULL), KS_OK);
      assert_int_equal(ks_async_saver_wait(sv, NULL), KS_OK);
      assert_file_is(path, o);
      /* 3. The manager's background and blocking saves through the image. */
      const char *saved = NULL;
      for (int async = 1; async >= 0; async--) {
        assert_int_equal(ks_ckpt_manager_save_image(m, ims[w], o->sd, o->meta, NULL, async, &saved, NULL), KS_OK);
        assert_int_equal(ks_ckpt_manager_wait(m, NULL), KS_OK);
        assert_file_is(saved, o);
      }
      ks_statedict_free(placed);
    }
    /* 4. The saver's own image (no image given) and the manager's blocking save without one. */
    assert_int_equal(ks_async_saver_start_image(sv, NULL, o->sd, o->meta, path, NULL, NULL, NULL, NULL), KS_OK);
    assert_int_equal(ks_async_saver_wait(sv, NULL), KS_OK);
    assert_file_is(path, o);
    const char *saved = NULL;
    for (int async = 1; async >= 0; async--) {
      assert_int_equal(ks_ckpt_manager_save_image(m, NULL, o->sd, o->meta, NULL, async, &saved, NULL), KS_OK);
      assert_int_equal(ks_ckpt_manager_wait(m, NULL), KS_OK);
      assert_file_is(saved, o);
    }
  }
  ks_ckpt_manager_free(m);
  ks_async_saver_free(sv);
  ks_image_free(own);
  ks_image_free(given);
  free(mem);
  state_free(&st[0]);
  state_free(&st[1]);
  free(run);
  free(path);
  ks_test_rmtree(dir);
  free(dir);
}

/* Every allocation of ks_image_create may fail, in each of its modes: KS_E_NOMEM, no image, no
   leak; once they all succeed, the image saves the reference file. ks_image_get and ks_image_stage
   of a state of other entries (a new layout) fail the same way, leaving the image as it was. */
static void image_create_survives_every_failed_allocation(void **state) {
  (void)state;
  char *dir = ks_test_tmpdir("image-nomem");
  char *path = ks_test_path(dir, "f.keepsake");
  one_state o, other;
  state_load(9, "step9.keepsake", &o);
  state_load(1000200, "step1000200.keepsake", &other);
  void *mem = aligned_alloc(KS_IMAGE_ALIGN, (size_t)4 << 20);
  assert_non_null(mem);
  for (int mode = 0; mode < 3; mode++) {
    ks_status s = KS_E_NOMEM;
    long n = 1, failures = 0;
    for (; s == KS_E_NOMEM && n < 200; n++) {
      ks_test_alloc ta;
      ks_test_alloc_init(&ta, n);
      ks_image_opts io = {.size = sizeof io, .alloc = &ta.a, .layout_only = mode == 2};
      if (mode == 1) io.buf = mem, io.buf_size = (size_t)4 << 20;
      ks_image *im = NULL;
      ks_error err;
      s = ks_image_create(o.sd, o.meta, &io, &im, &err);
      if (s) {
        assert_int_equal(s, KS_E_NOMEM);
        assert_null(im);
        failures++;
      } else if (mode != 2) {
        ks_save_opts so = {.size = sizeof so, .image = im};
        ta.fail_at = 0; /* the save's allocations are the next test's */
        assert_int_equal(ks_save(path, o.sd, o.meta, &so, NULL), KS_OK);
        assert_file_is(path, &o);
      }
      ks_image_free(im);
      assert_int_equal(ta.live, 0);
    }
    assert_int_equal(s, KS_OK);
    assert_true(failures >= 4); /* the image, its layout's arrays, a name, the header */
  }
  /* A new layout in an existing image: each failure leaves the image able to save as before. */
  for (long n = 1; n < 200; n++) {
    ks_test_alloc ta;
    ks_test_alloc_init(&ta, 0);
    ks_image_opts io = {.size = sizeof io, .alloc = &ta.a};
    ks_image *im = NULL;
    assert_int_equal(ks_image_create(o.sd, o.meta, &io, &im, NULL), KS_OK);
    ta.fail_at = ta.calls + n;
    ks_statedict *swap = NULL; /* other's entries, one renamed: a state of other entries */
    assert_int_equal(ks_statedict_create(NULL, &swap, NULL), KS_OK);
    for (size_t i = 0; i < ks_statedict_count(other.sd); i++) {
      ks_entry e;
      assert_int_equal(ks_statedict_at(other.sd, i, &e), KS_OK);
      assert_int_equal(ks_statedict_set_entry(swap, i ? e.name : "state/model/renamed", &e, KS_BORROW, NULL), KS_OK);
    }
    ks_save_opts so = {.size = sizeof so, .image = im};
    ks_status s = ks_save(path, swap, other.meta, &so, NULL);
    ks_statedict_free(swap);
    ta.fail_at = 0;
    if (s == KS_OK) {
      ks_image_free(im);
      assert_int_equal(ta.live, 0);
      break;
    }
    assert_int_equal(s, KS_E_NOMEM);
    assert_int_equal(ks_save(path, o.sd, o.meta, &so, NULL), KS_OK); /* the old layout still works */
    assert_file_is(path, &o);
    ks_image_free(im);
    assert_int_equal(ta.live, 0);
  }
  free(mem);
  state_free(&o);
  state_free(&other);
  free(path);
  ks_test_rmtree(dir);
  free(dir);
}

/* A header of another length moves the data section as a whole (the entries are the same). A
   tensor the caller already put at its new place is not overwritten by that move: the file is the
   reference file still. */
static void a_tensor_at_its_new_place_survives_the_moved_data(void **state) {
  (void)state;
  char *dir = ks_test_tmpdir("image-shift");
  char *path = ks_test_path(dir, "f.keepsake");
  one_state a, b;
  state_load(9, "step9.keepsake", &a);
  state_load(1000200, "step1000200.keepsake", &b);
  ks_image_opts lo = {.size = sizeof lo, .layout_only = 1};
  ks_image *lay = NULL;
  assert_int_equal(ks_image_create(b.sd, b.meta, &lo, &lay, NULL), KS_OK);
  ks_image_info lb = {.size = sizeof lb};
  assert_int_equal(ks_image_get(lay, NULL, NULL, &lb, NULL), KS_OK);
  ks_image *im = NULL;
  assert_int_equal(ks_image_create(a.sd, a.meta, NULL, &im, NULL), KS_OK);
  ks_statedict *placed = placed_in(im, &a); /* a's tensors at a's places */
  ks_save_opts so = {.size = sizeof so, .image = im};
  assert_int_equal(ks_save(path, placed, a.meta, &so, NULL), KS_OK);
  assert_file_is(path, &a);
  ks_image_info ia = {.size = sizeof ia};
  assert_int_equal(ks_image_get(im, NULL, NULL, &ia, NULL), KS_OK);
  assert_true(lb.header_len > ia.header_len); /* b's header is longer: its data starts further on */
  /* b's state: every tensor where a's save left it, but the last one (the largest) copied by the
     caller to its place under b's header, over the tail of where a's data lay. */
  size_t last = 0;
  for (size_t i = 0; i < ks_statedict_count(b.sd); i++) {
    ks_entry e;
    assert_int_equal(ks_statedict_at(b.sd, i, &e), KS_OK);
    if (e.kind == KS_VAL_TENSOR) last = i;
  }
  ks_statedict *mixed = NULL;
  assert_int_equal(ks_statedict_create(NULL, &mixed, NULL), KS_OK);
  for (size_t i = 0; i < ks_statedict_count(b.sd); i++) {
    ks_entry e, at;
    assert_int_equal(ks_statedict_at(b.sd, i, &e), KS_OK);
    if (e.kind == KS_VAL_TENSOR && i == last) {
      uint8_t *dst = (uint8_t *)ia.buf + lb.offsets[i];
      memmove(dst, e.tensor.data, e.tensor.nbytes);
      e.tensor.data = dst;
    } else if (e.kind == KS_VAL_TENSOR) {
      assert_int_equal(ks_statedict_at(placed, i, &at), KS_OK);
      e.tensor.data = at.tensor.data; /* the same bytes (a and b share their tensors), a's place */
    }
    assert_int_equal(ks_statedict_set_entry(mixed, e.name, &e, KS_BORROW, NULL), KS_OK);
  }
  assert_int_equal(ks_save(path, mixed, b.meta, &so, NULL), KS_OK);
  assert_file_is(path, &b);
  ks_statedict_free(mixed);
  ks_statedict_free(placed);
  ks_image_free(im);
  ks_image_free(lay);
  state_free(&a);
  state_free(&b);
  free(path);
  ks_test_rmtree(dir);
  free(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(every_image_path_writes_the_reference_files),
      cmocka_unit_test(image_create_survives_every_failed_allocation),
      cmocka_unit_test(a_tensor_at_its_new_place_survives_the_moved_data),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
