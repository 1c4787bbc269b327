/*
 * The readers above the format module through a table that cannot map (the
 * shape of a remote store): ks_state_load and the manager's autoresume read the
 * checkpoint lazily, in parallel ranges verified on arrival, each byte once, and
 * a corrupt newest checkpoint is still skipped; torch.save files and the import
 * read through the table too.
 */
#include <stdarg.h>
#include <stdlib.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "keepsake/io_cache.h"
#include "keepsake/keepsake.h"
#include "testutil.h"

#define N_FLOATS (3 << 20) /* 12 MiB: more than one range of the parallel load */

typedef struct prog {
  float *w;
  int64_t shape[1];
  ks_timestamp ts;
  ks_state *st;
} prog;

static void prog_init(prog *p, float seed) {
  memset(p, 0, sizeof *p);
  p->shape[0] = N_FLOATS;
  p->w = malloc(sizeof(float) * N_FLOATS);
  for (size_t i = 0; i < N_FLOATS; i++) p->w[i] = seed + (float)(i % 1000);
  ks_tensor t;
  assert_int_equal(ks_state_create("run", 1, NULL, &p->st, NULL), KS_OK);
  assert_int_equal(ks_tensor_init(&t, KS_F32, 1, p->shape, p->w), KS_OK);
  assert_int_equal(ks_state_add_tensor(p->st, "w", &t, NULL), KS_OK);
  ks_timestamp_init(&p->ts);
  ks_state_set_timestamp(p->st, &p->ts);
}

static void prog_free(prog *p) {
  ks_state_free(p->st);
  free(p->w);
}

static uint64_t file_size(const char *path) {
  struct stat sb;
  assert_int_equal(stat(path, &sb), 0);
  return (uint64_t)sb.st_size;
}

static void state_load_reads_through_the_table(void **state) {
  (void)state;
  char *dir = ks_test_tmpdir("state-lazy");
  char *path = ks_test_path(dir, "c.keepsake");
  prog a, b;
  prog_init(&a, 1.0f);
  prog_init(&b, 7.0f);
  a.ts.batch = 12;
  ks_save_opts so = {.io = ks_test_io_nosync()};
  assert_int_equal(ks_state_save(a.st, path, &so, NULL), KS_OK);
  ks_io *io;
  assert_int_equal(ks_io_counter_create(NULL, 1, NULL, &io, NULL), KS_OK);
  ks_load_opts lo = {.io = io, .verify_checksums = 1};
  ks_error e;
  assert_int_equal(ks_state_load(b.st, path, &lo, NULL, &e), KS_OK);
  assert_memory_equal(a.w, b.w, sizeof(float) * N_FLOATS);
  assert_int_equal(b.ts.batch, 12);
  ks_io_counts c;
  ks_io_counter_get(io, &c);
  assert_int_equal(c.map_calls, 0);
  assert_int_equal(c.read_bytes, file_size(path)); /* verified, yet each byte read once */
  assert_true(c.read_calls > 2);
  /* a damaged tensor: KS_E_CHECKSUM, the program's buffer untouched */
  size_t len;
  uint8_t *bytes = ks_test_read_file(path, &len);
  bytes[len - 100] ^= 1;
  assert_int_equal(ks_test_write_file(path, bytes, len), 0);
  free(bytes);
  b.w[0] = -1.0f;
  assert_int_equal(ks_state_load(b.st, path, &lo, NULL, &e), KS_E_CHECKSUM);
  assert_string_equal(e.key, "state/model/w");
  assert_true(b.w[0] == -1.0f);
  ks_io_counter_free(io);
  prog_free(&a);
  prog_free(&b);
  ks_test_rmtree(dir);
  free(dir);
  free(path);
}

static void autoresume_through_a_table_that_cannot_map(void **state) {
  (void)state;
  char *dir = ks_test_tmpdir("mgr-lazy");
  ks_io *io;
  assert_int_equal(ks_io_counter_create(ks_test_io_nosync(), 1, NULL, &io, NULL), KS_OK);
  ks_ckpt_opts co = {.run_dir = dir, .save_interval = "10ba", .keep = 3, .io = io};
  ks_ckpt_manager *m = NULL;
  assert_int_equal(ks_ckpt_manager_create(&co, &m, NULL), KS_OK);
  prog p;
  prog_init(&p, 2.0f);
  const char *saved[2] = {NULL, NULL};
  char paths[2][4096];
  for (int i = 0; i < 2; i++) {
    p.ts.batch = (i + 1) * 10;
    p.w[5] = (float)i;
    assert_int_equal(ks_ckpt_manager_save(m, p.st, &saved[i], NULL), KS_OK);
    snprintf(paths[i], sizeof paths[i], "%s", saved[i]);
  }
  ks_ckpt_manager_free(m);
  size_t len;
  uint8_t *bytes = ks_test_read_file(paths[1], &len);
  bytes[len - 8] ^= 0x10; /* the newest is corrupt */
  assert_int_equal(ks_test_write_file(paths[1], bytes, len), 0);
  free(bytes);
  assert_int_equal(ks_ckpt_manager_create(&co, &m, NULL), KS_OK);
  prog q;
  prog_init(&q, 9.0f);
  ks_io_counter_reset(io);
  int resumed = 0;
  ks_error e;
  assert_int_equal(ks_ckpt_manager_autoresume(m, q.st, NULL, NULL, &resumed, NULL, &e), KS_OK);
  assert_int_equal(resumed, 1);
  assert_int_equal(q.ts.batch, 10);
  assert_true(q.w[5] == 0.0f);
  assert_int_equal(ks_ckpt_manager_skipped(m), 1);
  ks_io_counts c;
  ks_io_counter_get(io, &c);
  assert_int_equal(c.map_calls, 0);
  /* listing reads two headers; the load reads the good file once and the bad one at most once */
  assert_true(c.read_bytes <= file_size(paths[0]) * 2 + 256 * 1024);
  ks_ckpt_manager_free(m);
  ks_io_counter_free(io);
  prog_free(&p);
  prog_free(&q);
  ks_test_rmtree(dir);
  free(dir);
}

static void torch_files_through_the_table(void **state) {
  (void)state;
  const char *pt = KS_FIXTURES_DIR "/torch/tensors.pt";
  ks_io *io;
  assert_int_equal(ks_io_counter_create(NULL, 1, NULL, &io, NULL), KS_OK);
  ks_statedict *a = NULL, *b = NULL;
  assert_int_equal(ks_torch_load(pt, NULL, &a, NULL, NULL), KS_OK);
  ks_torch_read_opts ro = {.io = io};
  ks_error e;
  assert_int_equal(ks_torch_load(pt, &ro, &b, NULL, &e), KS_OK);
  ks_io_counts c;
  ks_io_counter_get(io, &c);
  assert_int_equal(c.map_calls, 0);
  assert_int_equal(c.read_bytes, file_size(pt));
  assert_int_equal(ks_statedict_count(a), ks_statedict_count(b));
  for (size_t i = 0; i < ks_statedict_count(a); i++) {
    ks_entry x, y;
    assert_int_equal(ks_statedict_at(a, i, &x), KS_OK);
    assert_int_equal(ks_statedict_get(b, x.name, &y), KS_OK);
    assert_int_equal(x.kind, y.kind);
    if (x.kind == KS_VAL_TENSOR && x.tensor.nbytes)
      assert_memory_equal(x.tensor.data, y.tensor.data, x.tensor.nbytes);
  }
  ks_statedict_free(a);
  ks_statedict_free(b);
  /* the import (convert) reads through the same table */
  ks_io_counter_reset(io);
  ks_import_opts io_opts = {.read = &ro};
  ks_statedict *imp = NULL;
  ks_meta *meta = NULL;
  assert_int_equal(ks_torch_import(pt, &io_opts, &imp, &meta, &e), KS_OK);
  ks_io_counter_get(io, &c);
  assert_true(c.open_calls >= 1 && c.read_bytes == file_size(pt));
  ks_statedict_free(imp);
  ks_meta_free(meta);
  /* a table that fails to open: the error is the table's */
  assert_int_equal(ks_torch_load(KS_FIXTURES_DIR "/torch/no-such-file.pt", &ro, &b, NULL, &e), KS_E_IO);
  ks_io_counter_free(io);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(state_load_reads_through_the_table),
      cmocka_unit_test(autoresume_through_a_table_that_cannot_map),
      cmocka_unit_test(torch_files_through_the_table),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
