/*
 * The index of a sharded directory is untrusted: its `sharded`
 * section must tile every global shape exactly, with every count overflow-checked
 * and bounded by the files' sizes, before anything is allocated from it
 * (ks_shard_index_read); ks_shard_check compares it with the files themselves;
 * ks_shard_load_rank runs the size check even without verification. Also: splits
 * along any one dimension of many ranks are checked fast, and every allocation
 * failure leaks nothing.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>
#include <jansson.h>

#include "keepsake/keepsake.h"
#include "testutil.h"

#define N 3
#define W "state/model/w" /* F32 [7, 2], split along dimension 0 */
#define V "state/model/v" /* F32 [4, 6], split along dimension 1 */

static void add_chunk(ks_statedict *sd, ks_shard_map *map, const char *name, const int64_t *g, const int64_t *off,
                      const int64_t *shape) {
  float *p;
  assert_int_equal(ks_statedict_new_tensor(sd, name, KS_F32, 2, shape, (void **)&p, NULL), KS_OK);
  for (int64_t i = 0; i < shape[0] * shape[1]; i++) p[i] = (float)i;
  assert_int_equal(ks_shard_map_add(map, name, 2, g, off, shape, NULL), KS_OK);
}

/* Rank 0 also holds the scalar "lr" = lr in its header (keepsake.scalars). */
static char *write_dir_at(const char *root, const char *sub, double lr) {
  char *dir = ks_test_path(root, sub);
  assert_int_equal(mkdir(dir, 0777), 0);
  ks_shard_file_info infos[N];
  ks_save_opts so = {.io = ks_test_io_nosync()};
  for (int r = 0; r < N; r++) {
    ks_statedict *sd;
    ks_shard_map *map;
    assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
    assert_int_equal(ks_shard_map_create(NULL, &map, NULL), KS_OK);
    int64_t gw[2] = {7, 2}, gv[2] = {4, 6}, off[2], shape[2];
    ks_shard_split_dim0(2, gw, r, N, off, shape);
    add_chunk(sd, map, W, gw, off, shape);
    int64_t voff[2] = {0, 2 * r}, vshape[2] = {4, 2};
    add_chunk(sd, map, V, gv, voff, vshape);
    assert_int_equal(ks_statedict_set_int(sd, "state/timestamp/Timestamp/epoch", 1, NULL), KS_OK);
    if (r == 0) assert_int_equal(ks_statedict_set_float(sd, "lr", lr, NULL), KS_OK);
    ks_error err;
    assert_int_equal(ks_shard_write_rank(dir, r, N, sd, NULL, map, NULL, 0, &so, &infos[r], &err), KS_OK);
    ks_statedict_free(sd);
    ks_shard_map_free(map);
  }
  assert_int_equal(ks_shard_write_index(dir, N, infos, &so, NULL), KS_OK);
  return dir;
}

static char *write_dir(const char *root) { return write_dir_at(root, "ckpt", 0.125); }

static json_t *load_index(const char *dir) {
  char *p = ks_test_path(dir, KS_SHARD_INDEX_NAME);
  json_t *j = json_load_file(p, 0, NULL);
  assert_non_null(j);
  free(p);
  return j;
}

static void save_index(const char *dir, const json_t *j) {
  char *p = ks_test_path(dir, KS_SHARD_INDEX_NAME);
  assert_int_equal(json_dump_file(j, p, JSON_INDENT(1) | JSON_SORT_KEYS), 0);
  free(p);
}

static json_t *chunk_of(json_t *ix, const char *name, size_t j) {
  return json_array_get(
      json_object_get(json_object_get(json_object_get(json_object_get(ix, "keepsake"), "sharded"), name), "chunks"), j);
}

static json_t *dims2(json_int_t a, json_int_t b) { return json_pack("[I, I]", a, b); }

/* Applies one change to a fresh copy of the index. */
typedef void (*mutation)(json_t *ix);

static void overlap_rows(json_t *ix) { json_object_set_new(chunk_of(ix, W, 1), "offsets", dims2(2, 0)); }
static void overlap_cols(json_t *ix) { json_object_set_new(chunk_of(ix, V, 2), "offsets", dims2(0, 3)); }
static void gap(json_t *ix) { json_object_set_new(chunk_of(ix, W, 2), "shape", dims2(0, 2)); }
static void same_rank_twice(json_t *ix) { json_object_set_new(chunk_of(ix, W, 2), "rank", json_integer(1)); }
static void more_chunks_than_files(json_t *ix) {
  json_t *c =
      json_object_get(json_object_get(json_object_get(json_object_get(ix, "keepsake"), "sharded"), W), "chunks");
  json_array_append_new(c, json_deep_copy(json_array_get(c, 0)));
}
static void overflow(json_t *ix) {
  json_t *w = json_object_get(json_object_get(json_object_get(ix, "keepsake"), "sharded"), W);
  json_object_set_new(w, "global_shape", dims2((json_int_t)1 << 62, (json_int_t)1 << 62));
  json_object_set_new(json_array_get(json_object_get(w, "chunks"), 0), "shape",
                      dims2((json_int_t)1 << 62, (json_int_t)1 << 62));
  json_object_set_new(json_array_get(json_object_get(w, "chunks"), 0), "offsets", dims2(0, 0));
}
static void past_the_file(json_t *ix) {
  json_object_set_new(json_array_get(json_object_get(json_object_get(ix, "keepsake"), "files"), 0), "size",
                      json_integer(40));
}
static void no_chunks(json_t *ix) {
  json_t *v = json_object_get(json_object_get(json_object_get(ix, "keepsake"), "sharded"), V);
  json_object_set_new(v, "global_shape", dims2(0, 6)); /* an empty tensor: no volume to miss */
  json_object_set_new(v, "chunks", json_array());
}
#define OBJ "keepsake.dcp.object/w"
static void object_of_three_chunks(json_t *ix) {
  json_t *sharded = json_object_get(json_object_get(ix, "keepsake"), "sharded");
  json_object_set(sharded, OBJ, json_object_get(sharded, W));
  json_object_del(sharded, W);
}
static void negative(json_t *ix) { json_object_set_new(chunk_of(ix, W, 0), "offsets", dims2(-1, 0)); }
static void fractional(json_t *ix) { json_object_set_new(chunk_of(ix, W, 0), "offsets", json_pack("[f, i]", 0.5, 0)); }

static void sharded_sections_are_validated(void **s) {
  (void)s;
  static const struct {
    const char *what;
    mutation m;
    const char *key, *message;
  } cases[] = {
      {"rows overlap", overlap_rows, W, "overlaps chunk"},
      {"columns overlap", overlap_cols, V, "overlaps chunk"},
      {"gap", gap, W, "do not cover it exactly"},
      {"two chunks in one file", same_rank_twice, W, "already holds a chunk"},
      {"more chunks than files", more_chunks_than_files, W, "more chunks than its 3 rank files"},
      {"volume overflow", overflow, W, "overflows"},
      {"chunks past the file size", past_the_file, W, "need more bytes than its 40"},
      {"no chunks", no_chunks, V, "has no chunks"},
      {"a DCP value in chunks", object_of_three_chunks, OBJ, "one whole 1-d U8 tensor"},
      {"negative offset", negative, W, "malformed"},
      {"fractional offset", fractional, W, "malformed"},
  };
  char *root = ks_test_tmpdir("shardcheck");
  char *dir = write_dir(root);
  json_t *valid = load_index(dir);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    json_t *ix = json_deep_copy(valid);
    cases[i].m(ix);
    save_index(dir, ix);
    json_decref(ix);
    ks_shard_index *idx = NULL;
    ks_error err;
    ks_status st = ks_shard_index_read(dir, NULL, NULL, &idx, &err);
    if (st != KS_E_FORMAT || strcmp(err.key, cases[i].key) || !strstr(err.message, cases[i].message) ||
        !strstr(err.file, KS_SHARD_INDEX_NAME))
      fail_msg("%s: %s, key '%s', file %s: %s", cases[i].what, ks_status_name(st), err.key, err.file, err.message);
    assert_null(idx);
  }
  json_decref(valid);
  ks_test_rmtree(root);
  free(dir);
  free(root);
}

/* An index of n ranks (no files needed to read it) whose tensor [2, n] is split along dimension 1;
   with `overlap` the last chunk covers the column before it instead of its own (volumes still add up). */
static char *column_index(int n, int overlap) {
  size_t cap = (size_t)n * 200 + 1024, len = 0;
  char *t = malloc(cap);
  assert_non_null(t);
  len += (size_t)snprintf(t + len, cap - len,
                          "{\"weight_map\":{},\"keepsake\":{\"format\":\"keepsake-sharded\",\"version\":1,"
                          "\"world_size\":%d,\"timestamp\":null,\"per_rank\":[],\"files\":[",
                          n);
  for (int r = 0; r < n; r++)
    len += (size_t)snprintf(t + len, cap - len, "%s{\"rank\":%d,\"file\":\"rank-%05d-of-%05d.keepsake\",\"size\":64,"
                            "\"xxh3\":\"0000000000000000\"}", r ? "," : "", r, r, n);
  len += (size_t)snprintf(t + len, cap - len,
                          "],\"sharded\":{\"x\":{\"dtype\":\"F32\",\"global_shape\":[2,%d],\"chunks\":[", n);
  for (int r = 0; r < n; r++) {
    int at = overlap && r == n - 1 ? r - 1 : r; /* then column r - 1 twice and column r never */
    len += (size_t)snprintf(t + len, cap - len, "%s{\"rank\":%d,\"offsets\":[0,%d],\"shape\":[2,1]}", r ? "," : "", r,
                            at);
  }
  snprintf(t + len, cap - len, "]}}}}");
  return t;
}

/* 20,000 chunks side by side along dimension 1: a sweep along dimension 0 would compare 2e8 pairs. */
static void wide_column_splits_are_checked(void **s) {
  (void)s;
  char *root = ks_test_tmpdir("shardcheck");
  char *p = ks_test_path(root, KS_SHARD_INDEX_NAME);
  for (int overlap = 0; overlap < 2; overlap++) {
    char *text = column_index(20000, overlap);
    assert_int_equal(ks_test_write_file(p, text, strlen(text)), 0);
    free(text);
    ks_shard_index *idx = NULL;
    ks_error err;
    ks_status st = ks_shard_index_read(root, NULL, NULL, &idx, &err);
    if (st != (overlap ? KS_E_FORMAT : KS_OK)) fail_msg("overlap %d: %s: %s", overlap, ks_status_name(st), err.message);
    if (overlap) assert_non_null(strstr(err.message, "overlaps"));
    ks_shard_index_free(idx);
  }
  free(p);
  ks_test_rmtree(root);
  free(root);
}

typedef struct seen {
  int n;
  int files[N];
  ks_status codes[8];
  char keys[8][KS_ERROR_WHERE_MAX];
} seen;

static int on_problem(void *ctx, const ks_error *e) {
  seen *x = ctx;
  for (int r = 0; r < N; r++) {
    char name[64];
    assert_int_equal(ks_shard_file_name(r, N, name, sizeof name), KS_OK);
    if (strstr(e->file, name)) x->files[r]++;
  }
  if (x->n < 8) {
    x->codes[x->n] = e->code;
    snprintf(x->keys[x->n], sizeof x->keys[0], "%s", e->key);
  }
  x->n++;
  return 0;
}

static seen check_headers(const char *dir) {
  ks_shard_index *idx;
  ks_error err;
  assert_int_equal(ks_shard_index_read(dir, NULL, NULL, &idx, &err), KS_OK);
  seen x;
  memset(&x, 0, sizeof x);
  ks_status st = ks_shard_check(dir, idx, NULL, KS_SHARD_CHECK_SIZES | KS_SHARD_CHECK_HEADERS, on_problem, &x, &err);
  assert_int_equal(st, x.n ? x.codes[0] : KS_OK);
  ks_shard_index_free(idx);
  return x;
}

/* Each problem with the files is reported with the file and the key. */
static void files_are_checked_against_the_index(void **s) {
  (void)s;
  char *root = ks_test_tmpdir("shardcheck");
  char *dir = write_dir(root);
  seen x = check_headers(dir);
  assert_int_equal(x.n, 0);
  json_t *valid = load_index(dir);
  /* A dtype the files do not have: every file named, with the key. */
  json_t *ix = json_deep_copy(valid);
  json_object_set_new(json_object_get(json_object_get(json_object_get(ix, "keepsake"), "sharded"), V), "dtype",
                      json_string("I32"));
  save_index(dir, ix);
  json_decref(ix);
  x = check_headers(dir);
  assert_int_equal(x.n, N);
  for (int r = 0; r < N; r++) assert_int_equal(x.files[r], 1);
  assert_int_equal(x.codes[0], KS_E_MISMATCH);
  assert_string_equal(x.keys[0], V);
  /* Two ranks' chunks swapped in the index: the files' own offsets disagree. */
  ix = json_deep_copy(valid);
  json_object_set_new(chunk_of(ix, W, 0), "rank", json_integer(1));
  json_object_set_new(chunk_of(ix, W, 1), "rank", json_integer(0));
  save_index(dir, ix);
  json_decref(ix);
  x = check_headers(dir);
  assert_int_equal(x.n, 2);
  assert_int_equal(x.files[0] + x.files[1], 2);
  assert_string_equal(x.keys[0], W);
  /* A tensor the index leaves out: each file holding a chunk of it says so. */
  ix = json_deep_copy(valid);
  json_object_del(json_object_get(json_object_get(ix, "keepsake"), "sharded"), V);
  save_index(dir, ix);
  json_decref(ix);
  x = check_headers(dir);
  assert_int_equal(x.n, N);
  assert_string_equal(x.keys[2], V);
  /* A missing file. */
  save_index(dir, valid);
  char name[64];
  assert_int_equal(ks_shard_file_name(1, N, name, sizeof name), KS_OK);
  char *p = ks_test_path(dir, name);
  size_t len;
  uint8_t *bytes = ks_test_read_file(p, &len);
  assert_int_equal(remove(p), 0);
  x = check_headers(dir);
  assert_int_equal(x.n, 1);
  assert_int_equal(x.files[1], 1);
  assert_int_equal(x.codes[0], KS_E_NOTFOUND);
  assert_string_equal(x.keys[0], "keepsake.files");
  /* A grown file fails a load even without verification: its size bounds what the index says. */
  uint8_t *grown = malloc(len + 16);
  memcpy(grown, bytes, len);
  memset(grown + len, 0, 16);
  assert_int_equal(ks_test_write_file(p, grown, len + 16), 0);
  ks_shard_index *idx;
  assert_int_equal(ks_shard_index_read(dir, NULL, NULL, &idx, NULL), KS_OK);
  ks_shard_load_opts lo = {.no_verify = 1};
  ks_statedict *sd = NULL;
  ks_meta *meta = NULL;
  ks_error err;
  assert_int_equal(ks_shard_load_rank(dir, idx, 0, 1, NULL, &lo, &sd, &meta, &err), KS_E_FORMAT);
  assert_non_null(strstr(err.file, name));
  assert_non_null(strstr(err.message, "longer than recorded"));
  assert_int_equal(ks_test_write_file(p, bytes, len), 0);
  assert_int_equal(ks_shard_load_rank(dir, idx, 0, 1, NULL, &lo, &sd, &meta, &err), KS_OK);
  ks_statedict_free(sd);
  ks_meta_free(meta);
  ks_shard_index_free(idx);
  free(grown);
  free(bytes);
  free(p);
  json_decref(valid);
  ks_test_rmtree(root);
  free(dir);
  free(root);
}

static char *rank_path(const char *dir, int r) {
  char name[64];
  assert_int_equal(ks_shard_file_name(r, N, name, sizeof name), KS_OK);
  return ks_test_path(dir, name);
}

/* Replaces `from` with `to` (same length) in the header of the file at p, in place. */
static void edit_header(const char *p, const char *from, const char *to) {
  size_t len, n = strlen(from);
  uint8_t *b = ks_test_read_file(p, &len);
  assert_true(len > 8 && strlen(to) == n);
  uint64_t hl = 0;
  for (int i = 7; i >= 0; i--) hl = hl << 8 | b[i];
  uint8_t *at = NULL;
  for (size_t i = 8; !at && i + n <= 8 + hl; i++)
    if (!memcmp(b + i, from, n)) at = b + i;
  assert_non_null(at);
  memcpy(at, to, n);
  assert_int_equal(ks_test_write_file(p, b, len), 0);
  free(b);
}

static void expect_one_corrupt_header(const char *dir, int rank) {
  seen x = check_headers(dir);
  if (x.n != 1 || x.codes[0] != KS_E_CHECKSUM || x.files[rank] != 1)
    fail_msg("rank %d: %d problems, the first %s", rank, x.n, ks_status_name(x.n ? x.codes[0] : KS_OK));
}

/* The header check holds every file's length and header against the index's header_xxh3: a value
   edited in place (same size, every tensor checksum intact), a one-bit lie in the index, a rank
   file swapped for another checkpoint's of the same size. Reshard and a verified load refuse them. */
static void headers_hash_to_the_index(void **s) {
  (void)s;
  char *root = ks_test_tmpdir("shardcheck");
  char *dir = write_dir(root), *other = write_dir_at(root, "other", 9.125);
  assert_int_equal(check_headers(dir).n, 0);
  char *p0 = rank_path(dir, 0), *q0 = rank_path(other, 0);
  size_t len, olen;
  uint8_t *good = ks_test_read_file(p0, &len), *theirs = ks_test_read_file(q0, &olen);
  assert_int_equal(len, olen);
  /* lr 0.125 -> 9.125 in rank 0's header */
  edit_header(p0, "0.125", "9.125");
  expect_one_corrupt_header(dir, 0);
  ks_error err;
  char *out = ks_test_path(root, "out");
  assert_int_equal(ks_shard_reshard(dir, 1, out, NULL, &err), KS_E_CHECKSUM);
  assert_int_equal(ks_test_write_file(p0, good, len), 0);
  /* one bit of rank 1's header_xxh3 in the index */
  json_t *valid = load_index(dir), *ix = json_deep_copy(valid);
  json_t *f1 = json_array_get(json_object_get(json_object_get(ix, "keepsake"), "files"), 1);
  char hex[17];
  snprintf(hex, sizeof hex, "%016llx",
           strtoull(json_string_value(json_object_get(f1, "header_xxh3")), NULL, 16) ^ 1ull);
  json_object_set_new(f1, "header_xxh3", json_string(hex));
  save_index(dir, ix);
  json_decref(ix);
  expect_one_corrupt_header(dir, 1);
  save_index(dir, valid);
  json_decref(valid);
  /* another checkpoint's rank 0 file, of the same size */
  assert_int_equal(ks_test_write_file(p0, theirs, olen), 0);
  expect_one_corrupt_header(dir, 0);
  assert_int_equal(ks_test_write_file(p0, good, len), 0);
  assert_int_equal(check_headers(dir).n, 0);
  free(good);
  free(theirs);
  free(p0);
  free(q0);
  free(out);
  ks_test_rmtree(root);
  free(dir);
  free(other);
  free(root);
}

static void allocation_failures_leak_nothing(void **s) {
  (void)s;
  char *root = ks_test_tmpdir("shardcheck");
  char *dir = write_dir(root);
  ks_status st = KS_E_NOMEM;
  long n;
  for (n = 1; st == KS_E_NOMEM && n < 10000; n++) {
    ks_test_alloc ta;
    ks_test_alloc_init(&ta, n);
    ks_shard_index *idx = NULL;
    st = ks_shard_index_read(dir, &ta.a, NULL, &idx, NULL);
    if (!st) st = ks_shard_check(dir, idx, NULL, KS_SHARD_CHECK_SIZES | KS_SHARD_CHECK_HEADERS, NULL, NULL, NULL);
    if (st != KS_OK && st != KS_E_NOMEM) fail_msg("allocation %ld failing: %s", n, ks_status_name(st));
    ks_shard_index_free(idx);
    assert_int_equal(ta.live, 0);
  }
  assert_int_equal(st, KS_OK);
  assert_true(n > 20); /* the index and the headers allocate: the failures were exercised */
  ks_test_rmtree(root);
  free(dir);
  free(root);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(sharded_sections_are_validated),
      cmocka_unit_test(wide_column_splits_are_checked),
      cmocka_unit_test(files_are_checked_against_the_index),
      cmocka_unit_test(headers_hash_to_the_index),
      cmocka_unit_test(allocation_failures_leak_nothing),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
