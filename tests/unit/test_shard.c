/*
 * Sharded checkpoints without MPI (src/shard): rank files and the index, loads
 * at fewer, equal and more ranks, reshard, the index's validation, shard file
 * verification, timestamps that disagree, and allocation failures.
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
#include "faultio.h"
#include "testutil.h"

/* What the index records (ks_shard_index_get), by value. */
static ks_shard_index_info index_info(const ks_shard_index *idx) {
  ks_shard_index_info info = KS_OPTS_INIT(ks_shard_index_info);
  ks_shard_index_get(idx, &info);
  return info;
}

#define N 3
#define ROWS 7
#define COLS 2

/* Rank r of N: its row chunk of w, a replicated b, its own counter metric and rng. */
static void rank_state(int r, int64_t batch, ks_statedict **sd, ks_meta **meta, ks_shard_map **map) {
  int64_t g[2] = {ROWS, COLS}, off[2], shape[2];
  ks_shard_split_dim0(2, g, r, N, off, shape);
  assert_int_equal(ks_statedict_create(NULL, sd, NULL), KS_OK);
  assert_int_equal(ks_meta_create(NULL, meta, NULL), KS_OK);
  assert_int_equal(ks_shard_map_create(NULL, map, NULL), KS_OK);
  float *w;
  assert_int_equal(ks_statedict_new_tensor(*sd, "state/model/w", KS_F32, 2, shape, (void **)&w, NULL), KS_OK);
  for (int64_t i = 0; i < shape[0] * COLS; i++) w[i] = (float)(off[0] * COLS + i);
  float *b;
  int64_t bs[1] = {4};
  assert_int_equal(ks_statedict_new_tensor(*sd, "state/model/b", KS_F32, 1, bs, (void **)&b, NULL), KS_OK);
  for (int i = 0; i < 4; i++) b[i] = (float)i * 0.25f;
  assert_int_equal(ks_shard_map_add(*map, "state/model/w", 2, g, off, shape, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_int(*sd, "state/timestamp/Timestamp/epoch", 2, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_int(*sd, "state/timestamp/Timestamp/batch", batch, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_int(*sd, "state/timestamp/Timestamp/sample", 10 * batch, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_int(*sd, "state/timestamp/Timestamp/token", 0, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_string(*sd, "state/run_name", "shard", NULL), KS_OK);
  ks_rng rng;
  ks_rng_seed(&rng, (uint64_t)r + 1);
  assert_int_equal(ks_test_save(ks_rng_stateful(&rng), *sd, "rng/0/", NULL), KS_OK);
  /* A SumMetric holding r+1 after r+1 updates. */
  ks_metric *m;
  assert_int_equal(ks_metric_create("SumMetric", NULL, NULL, &m, NULL), KS_OK);
  float one = 1.0f;
  ks_tensor t;
  assert_int_equal(ks_tensor_init(&t, KS_F32, 0, NULL, &one), KS_OK);
  for (int i = 0; i <= r; i++) assert_int_equal(ks_metric_update(m, &t, 1, NULL), KS_OK);
  assert_int_equal(ks_metric_to_state_dict(m, *sd, "state/train_metrics/S/state_dict/", NULL), KS_OK);
  assert_int_equal(ks_statedict_set_null(*sd, "state/train_metrics/S/_computed", NULL), KS_OK);
  char json[256];
  snprintf(json, sizeof json,
           "{\"state/train_metrics/S\":{\"class\":\"SumMetric\",\"args\":%s,\"schema_version\":2,\"update_count\":%d}}",
           ks_metric_args_json(m), r + 1);
  assert_int_equal(ks_meta_set(*meta, "keepsake.metrics", json, NULL), KS_OK);
  ks_metric_free(m);
}

static char *write_ckpt_at(const char *root, const char *name, int bad_rank, int64_t batch) {
  char *dir = ks_test_path(root, name);
  assert_int_equal(mkdir(dir, 0777), 0);
  ks_shard_file_info infos[N];
  ks_save_opts so = {.io = ks_test_io_nosync()};
  for (int r = 0; r < N; r++) {
    ks_statedict *sd;
    ks_meta *meta;
    ks_shard_map *map;
    rank_state(r, r == bad_rank ? 9 : batch, &sd, &meta, &map);
    ks_error err;
    assert_int_equal(ks_shard_write_rank(dir, r, N, sd, meta, map, NULL, 0, &so, &infos[r], &err), KS_OK);
    ks_statedict_free(sd);
    ks_meta_free(meta);
    ks_shard_map_free(map);
  }
  ks_error err;
  ks_status st = ks_shard_write_index(dir, N, infos, &so, &err);
  assert_int_equal(st, bad_rank >= 0 ? KS_E_MISMATCH : KS_OK);
  if (bad_rank >= 0) assert_non_null(strstr(err.message, "timestamps differ"));
  return dir;
}

static char *write_ckpt(const char *root, const char *name, int bad_rank) {
  return write_ckpt_at(root, name, bad_rank, 5);
}

static float metric_sum(const ks_statedict *sd) {
  const ks_tensor *t = ks_statedict_tensor(sd, "state/train_metrics/S/state_dict/sum_value");
  assert_non_null(t);
  return *(const float *)t->data;
}

/* Loads every rank at m and checks w, b and that the metric sums add up to 1+2+3. */
static void check_load_at(const char *dir, int saved, int m, ks_test_alloc *ta) {
  ks_shard_index *idx;
  ks_error err;
  assert_int_equal(ks_shard_index_read(dir, NULL, NULL, &idx, &err), KS_OK);
  assert_int_equal(index_info(idx).world_size, saved);
  float total = 0;
  for (int r = 0; r < m; r++) {
    int64_t g[2] = {ROWS, COLS}, off[2], shape[2];
    ks_shard_split_dim0(2, g, r, m, off, shape);
    ks_shard_map *want;
    assert_int_equal(ks_shard_map_create(NULL, &want, NULL), KS_OK);
    assert_int_equal(ks_shard_map_add(want, "state/model/w", 2, g, off, shape, NULL), KS_OK);
    ks_statedict *sd;
    ks_meta *meta;
    ks_shard_load_opts lo = {.alloc = ta ? &ta->a : NULL};
    assert_int_equal(ks_shard_load_rank(dir, idx, r, m, want, &lo, &sd, &meta, &err), KS_OK);
    const ks_tensor *w = ks_statedict_tensor(sd, "state/model/w");
    assert_non_null(w);
    assert_int_equal(w->shape[0], shape[0]);
    for (int64_t i = 0; i < shape[0] * COLS; i++) assert_true(((float *)w->data)[i] == (float)(off[0] * COLS + i));
    assert_true(((const float *)ks_statedict_tensor(sd, "state/model/b")->data)[3] == 0.75f);
    total += metric_sum(sd);
    if (m == N && saved == N) assert_true(metric_sum(sd) == (float)(r + 1)); /* own state back */
    assert_non_null(strstr(ks_meta_get(meta, "keepsake.metrics"), "update_count"));
    ks_statedict_free(sd);
    ks_meta_free(meta);
    ks_shard_map_free(want);
  }
  assert_true(total == 6.0f);
  ks_shard_index_free(idx);
}

static void loads_at_fewer_equal_and_more_ranks(void **s) {
  (void)s;
  char *root = ks_test_tmpdir("shard");
  char *dir = write_ckpt(root, "ep2-ba5", -1);
  for (int m = 1; m <= 5; m++) check_load_at(dir, N, m, NULL);
  /* Resharded to 2 then loaded at 2: the same as loading the original at 2. */
  char *out = ks_test_path(root, "two");
  ks_error err;
  assert_int_equal(ks_shard_reshard(dir, 2, out, NULL, &err), KS_OK);
  check_load_at(out, 2, 2, NULL);
  check_load_at(out, 2, 3, NULL);
  assert_int_equal(ks_shard_reshard(dir, 2, out, NULL, &err), KS_E_EXISTS);
  char *latest = NULL;
  assert_int_equal(ks_shard_latest(root, NULL, &latest, NULL, &err), KS_OK);
  assert_non_null(latest); /* both have the same timestamp: either is newest */
  free(latest);
  ks_test_rmtree(root);
  free(out);
  free(dir);
  free(root);
}

static void timestamps_that_disagree_leave_no_index(void **s) {
  (void)s;
  char *root = ks_test_tmpdir("shard");
  char *dir = write_ckpt(root, "ep2-ba5", 2);
  ks_shard_index *idx = NULL;
  assert_int_equal(ks_shard_index_read(dir, NULL, NULL, &idx, NULL), KS_E_NOTFOUND);
  char *latest = (char *)1;
  assert_int_equal(ks_shard_latest(root, NULL, &latest, NULL, NULL), KS_OK);
  assert_null(latest);
  ks_test_rmtree(root);
  free(dir);
  free(root);
}

static void bad_shards_are_named(void **s) {
  (void)s;
  char *root = ks_test_tmpdir("shard");
  char *dir = write_ckpt(root, "ep2-ba5", -1);
  char *f1 = ks_test_path(dir, "rank-00001-of-00003.keepsake");
  size_t len;
  uint8_t *bytes = ks_test_read_file(f1, &len);
  ks_shard_index *idx;
  assert_int_equal(ks_shard_index_read(dir, NULL, NULL, &idx, NULL), KS_OK);
  ks_error err;
  bytes[len / 2] ^= 1;
  assert_int_equal(ks_test_write_file(f1, bytes, len), 0);
  assert_int_equal(ks_shard_verify_file(dir, idx, 1, NULL, &err), KS_E_CHECKSUM);
  assert_non_null(strstr(err.message, "rank 1"));
  assert_non_null(strstr(err.file, "rank-00001-of-00003.keepsake"));
  bytes[len / 2] ^= 1;
  assert_int_equal(ks_test_write_file(f1, bytes, len - 1), 0);
  assert_int_equal(ks_shard_verify_file(dir, idx, 1, NULL, &err), KS_E_FORMAT);
  assert_non_null(strstr(err.message, "truncated"));
  remove(f1);
  assert_int_equal(ks_shard_verify_file(dir, idx, 1, NULL, &err), KS_E_NOTFOUND);
  assert_non_null(strstr(err.message, "missing"));
  ks_statedict *sd;
  ks_meta *meta;
  assert_int_equal(ks_shard_load_rank(dir, idx, 0, 1, NULL, NULL, &sd, &meta, &err), KS_E_NOTFOUND);
  assert_int_equal(ks_test_write_file(f1, bytes, len), 0);
  assert_int_equal(ks_shard_load_rank(dir, idx, 0, 1, NULL, NULL, &sd, &meta, &err), KS_OK);
  ks_statedict_free(sd);
  ks_meta_free(meta);
  ks_shard_index_free(idx);
  ks_test_rmtree(root);
  free(bytes);
  free(f1);
  free(dir);
  free(root);
}

/* What a version 2 index records of a file: the XXH3-64 of its length and header. */
static uint64_t header_hash(const uint8_t *bytes, size_t len) {
  assert_true(len >= 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = n << 8 | bytes[i];
  assert_true(n <= len - 8);
  return ks_checksum(bytes, (size_t)n + 8);
}

/* Version 2 records each file's header hash, not its whole-file hash: a damaged byte anywhere (the
   length, the header, the data) still fails verification, and a version 1 index (whole-file
   hashes, as older writers made) still verifies and loads. */
static void every_byte_is_verified_and_version_1_indexes_still_read(void **s) {
  (void)s;
  char *root = ks_test_tmpdir("shard");
  char *dir = write_ckpt(root, "ep2-ba5", -1);
  char *f1 = ks_test_path(dir, "rank-00001-of-00003.keepsake");
  size_t len;
  uint8_t *bytes = ks_test_read_file(f1, &len);
  ks_shard_index *idx;
  ks_error err;
  assert_int_equal(ks_shard_index_read(dir, NULL, NULL, &idx, NULL), KS_OK);
  assert_int_equal(index_info(idx).version, 2);
  ks_shard_file_info info;
  assert_non_null(ks_shard_index_file(idx, 1, &info));
  assert_int_equal(info.size, len);
  assert_true(info.checksum == header_hash(bytes, len));
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | bytes[i];
  const size_t spots[] = {0, 3, 8, (size_t)hlen / 2 + 8, (size_t)hlen + 7, (size_t)hlen + 8, len / 2 + hlen / 2,
                          len - 1};
  for (size_t i = 0; i < sizeof spots / sizeof spots[0]; i++) {
    bytes[spots[i]] ^= 0x20;
    assert_int_equal(ks_test_write_file(f1, bytes, len), 0);
    ks_status st = ks_shard_verify_file(dir, idx, 1, NULL, &err);
    if (st != KS_E_CHECKSUM) fail_msg("byte %zu flipped: %s (%s)", spots[i], ks_status_name(st), err.message);
    assert_non_null(strstr(err.message, "rank 1"));
    assert_non_null(strstr(err.message, "corrupt"));
    bytes[spots[i]] ^= 0x20;
  }
  assert_int_equal(ks_test_write_file(f1, bytes, len), 0);
  assert_int_equal(ks_shard_verify_file(dir, idx, 1, NULL, &err), KS_OK);
  ks_shard_index_free(idx);

  /* The same checkpoint under a version 1 index, each file's whole-file hash in "xxh3". */
  char *ip = ks_test_path(dir, KS_SHARD_INDEX_NAME);
  json_t *doc = json_load_file(ip, 0, NULL);
  json_t *ks = json_object_get(doc, "keepsake");
  json_object_set_new(ks, "version", json_integer(1));
  for (int r = 0; r < N; r++) {
    json_t *f = json_array_get(json_object_get(ks, "files"), (size_t)r);
    char *fp = ks_test_path(dir, json_string_value(json_object_get(f, "file")));
    size_t flen;
    uint8_t *fb = ks_test_read_file(fp, &flen);
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)ks_checksum(fb, flen));
    json_object_del(f, "header_xxh3");
    json_object_set_new(f, "xxh3", json_string(hex));
    free(fb);
    free(fp);
  }
  assert_int_equal(json_dump_file(doc, ip, JSON_INDENT(1) | JSON_SORT_KEYS), 0);
  json_decref(doc);
  assert_int_equal(ks_shard_index_read(dir, NULL, NULL, &idx, &err), KS_OK);
  assert_int_equal(index_info(idx).version, 1);
  for (int r = 0; r < N; r++) assert_int_equal(ks_shard_verify_file(dir, idx, r, NULL, &err), KS_OK);
  assert_int_equal(ks_shard_check(dir, idx, NULL, KS_SHARD_CHECK_HEADERS, NULL, NULL, &err), KS_OK);
  ks_statedict *sd = NULL;
  ks_meta *meta = NULL;
  assert_int_equal(ks_shard_load_rank(dir, idx, 0, 1, NULL, NULL, &sd, &meta, &err), KS_OK);
  ks_statedict_free(sd);
  ks_meta_free(meta);
  char *latest = NULL;
  assert_int_equal(ks_shard_latest(root, NULL, &latest, NULL, NULL), KS_OK);
  assert_non_null(latest);
  free(latest);
  bytes[len - 1] ^= 1; /* a data byte: whole-file hash mismatch */
  assert_int_equal(ks_test_write_file(f1, bytes, len), 0);
  assert_int_equal(ks_shard_verify_file(dir, idx, 1, NULL, &err), KS_E_CHECKSUM);
  assert_non_null(strstr(err.message, "corrupt"));
  ks_shard_index_free(idx);

  /* A version 1 index must carry xxh3, a version 2 one header_xxh3. */
  doc = json_load_file(ip, 0, NULL);
  ks = json_object_get(doc, "keepsake");
  json_object_set_new(ks, "version", json_integer(2));
  assert_int_equal(json_dump_file(doc, ip, 0), 0);
  json_decref(doc);
  assert_int_equal(ks_shard_index_read(dir, NULL, NULL, &idx, &err), KS_E_FORMAT);
  assert_non_null(strstr(err.message, "header_xxh3"));
  ks_test_rmtree(root);
  free(ip);
  free(bytes);
  free(f1);
  free(dir);
  free(root);
}

/* A rank file swapped in from another checkpoint, with the index patched to match its bytes. */
static void a_file_from_another_checkpoint_is_refused(void **s) {
  (void)s;
  char *root = ks_test_tmpdir("shard");
  char *a = write_ckpt_at(root, "ep2-ba5", -1, 5), *b = write_ckpt_at(root, "ep2-ba6", -1, 6);
  char *fa = ks_test_path(a, "rank-00001-of-00003.keepsake"), *fb = ks_test_path(b, "rank-00001-of-00003.keepsake");
  size_t len;
  uint8_t *bytes = ks_test_read_file(fb, &len);
  assert_int_equal(ks_test_write_file(fa, bytes, len), 0);
  char *ip = ks_test_path(a, KS_SHARD_INDEX_NAME), hex[17];
  json_t *idx_json = json_load_file(ip, 0, NULL);
  json_t *f1 = json_array_get(json_object_get(json_object_get(idx_json, "keepsake"), "files"), 1);
  snprintf(hex, sizeof hex, "%016llx", (unsigned long long)header_hash(bytes, len));
  json_object_set_new(f1, "size", json_integer((json_int_t)len));
  json_object_set_new(f1, "header_xxh3", json_string(hex));
  assert_int_equal(json_dump_file(idx_json, ip, 0), 0);
  json_decref(idx_json);
  ks_shard_index *idx;
  ks_error err;
  assert_int_equal(ks_shard_index_read(a, NULL, NULL, &idx, &err), KS_OK);
  assert_int_equal(ks_shard_verify_file(a, idx, 1, NULL, &err), KS_OK);
  ks_statedict *sd = NULL;
  ks_meta *meta = NULL;
  assert_int_equal(ks_shard_load_rank(a, idx, 1, 3, NULL, NULL, &sd, &meta, &err), KS_E_MISMATCH);
  assert_non_null(strstr(err.message, "timestamps disagree"));
  assert_non_null(strstr(err.message, "batch 6"));
  assert_non_null(strstr(err.file, "rank-00001-of-00003.keepsake"));
  ks_shard_index_free(idx);
  ks_test_rmtree(root);
  free(ip);
  free(bytes);
  free(fa);
  free(fb);
  free(a);
  free(b);
  free(root);
}

static void write_index_text(const char *dir, const char *text) {
  char *p = ks_test_path(dir, KS_SHARD_INDEX_NAME);
  assert_int_equal(ks_test_write_file(p, text, strlen(text)), 0);
  free(p);
}

static void malformed_indexes_are_refused(void **s) {
  (void)s;
  char *root = ks_test_tmpdir("shard");
  static const struct {
    const char *text;
    ks_status want;
  } cases[] = {
      {"not json", KS_E_FORMAT},
      {"{}", KS_E_FORMAT},
      /* a Hugging Face index (no keepsake object): a safetensors layout, which ks_dcp_import reads */
      {"{\"metadata\":{\"total_size\":4},\"weight_map\":{\"w\":\"model.safetensors\"}}", KS_E_UNSUPPORTED},
      {"{\"weight_map\":{},\"keepsake\":{\"format\":\"other\",\"version\":1}}", KS_E_FORMAT},
      {"{\"weight_map\":{},\"keepsake\":{\"format\":\"keepsake-sharded\",\"version\":3,\"world_size\":1}}",
       KS_E_VERSION},
      {"{\"weight_map\":{},\"keepsake\":{\"format\":\"keepsake-sharded\",\"version\":1,\"world_size\":0}}",
       KS_E_FORMAT},
      {"{\"weight_map\":{},\"keepsake\":{\"format\":\"keepsake-sharded\",\"version\":1,\"world_size\":1,"
       "\"timestamp\":null,\"files\":[{\"rank\":0,\"file\":\"../x\",\"size\":1,\"xxh3\":\"0000000000000000\"}]}}",
       KS_E_FORMAT},
      {"{\"weight_map\":{},\"keepsake\":{\"format\":\"keepsake-sharded\",\"version\":1,\"world_size\":1,"
       "\"timestamp\":null,\"per_rank\":[],\"files\":[{\"rank\":0,\"file\":\"rank-00000-of-00001.keepsake\","
       "\"size\":1,\"xxh3\":\"0000000000000000\"}],\"sharded\":{\"w\":{\"dtype\":\"F32\",\"global_shape\":[4],"
       "\"chunks\":[{\"rank\":0,\"offsets\":[0],\"shape\":[3]}]}}}}",
       KS_E_FORMAT},
      {"{\"weight_map\":{},\"keepsake\":{\"format\":\"keepsake-sharded\",\"version\":1,\"world_size\":1,"
       "\"timestamp\":null,\"per_rank\":[],\"files\":[{\"rank\":0,\"file\":\"rank-00000-of-00001.keepsake\","
       "\"size\":1,\"xxh3\":\"0000000000000000\"}],\"sharded\":{\"w\":{\"dtype\":\"F32\",\"global_shape\":[4],"
       "\"chunks\":[{\"rank\":0,\"offsets\":[2],\"shape\":[4]}]}}}}",
       KS_E_FORMAT},
      {"{\"weight_map\":{},\"keepsake\":{\"format\":\"keepsake-sharded\",\"version\":1,\"world_size\":1,"
       "\"timestamp\":null,\"per_rank\":[],\"files\":[{\"rank\":0,\"file\":\"rank-00000-of-00001.keepsake\","
       "\"size\":1,\"xxh3\":\"0000000000000000\"}],\"sharded\":{}}}",
       KS_OK},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    write_index_text(root, cases[i].text);
    ks_shard_index *idx = NULL;
    ks_error err;
    ks_status st = ks_shard_index_read(root, NULL, NULL, &idx, &err);
    if (st != cases[i].want)
      fail_msg("case %zu: %s, want %s (%s)", i, ks_status_name(st), ks_status_name(cases[i].want), err.message);
    ks_shard_index_free(idx);
  }
  ks_test_rmtree(root);
  free(root);
}

static void allocation_failures_leak_nothing(void **s) {
  (void)s;
  char *root = ks_test_tmpdir("shard");
  char *dir = write_ckpt(root, "ep2-ba5", -1);
  ks_shard_index *idx;
  assert_int_equal(ks_shard_index_read(dir, NULL, NULL, &idx, NULL), KS_OK);
  ks_status st = KS_E_NOMEM;
  for (long n = 1; st == KS_E_NOMEM && n < 10000; n++) {
    ks_test_alloc ta;
    ks_test_alloc_init(&ta, n);
    ks_shard_load_opts lo = {.alloc = &ta.a};
    ks_statedict *sd = NULL;
    ks_meta *meta = NULL;
    st = ks_shard_load_rank(dir, idx, 0, 2, NULL, &lo, &sd, &meta, NULL);
    if (!st) {
      assert_true(metric_sum(sd) == 3.0f); /* saved ranks 0 and 1 merged: 1 + 2 */
      ks_statedict_free(sd);
      ks_meta_free(meta);
    }
    assert_int_equal(ta.live, 0);
  }
  assert_int_equal(st, KS_OK);
  ks_shard_index_free(idx);
  ks_test_rmtree(root);
  free(dir);
  free(root);
}

/* Blanks the values of "size" and "header_xxh3" lines: they follow the writer's version string. */
static void mask_file_facts(char *text) {
  for (char *p = text; (p = strstr(p, "\"size\": ")) != NULL; p += 8)
    for (char *q = p + 8; *q && *q != ','; q++) *q = '#';
  for (char *p = text; (p = strstr(p, "\"header_xxh3\": \"")) != NULL; p += 16)
    for (char *q = p + 16; *q && *q != '"'; q++) *q = '#';
}

/* The index keeps the exact layout it had when it was written with jansson's JSON_INDENT(1) | JSON_SORT_KEYS. */
static void the_index_keeps_its_layout(void **s) {
  (void)s;
  static const char want[] =
      "{\n"
      " \"keepsake\": {\n"
      "  \"files\": [\n"
      "   {\n"
      "    \"file\": \"rank-00000-of-00003.keepsake\",\n"
      "    \"header_xxh3\": \"################\",\n"
      "    \"rank\": 0,\n"
      "    \"size\": 1676\n"
      "   },\n"
      "   {\n"
      "    \"file\": \"rank-00001-of-00003.keepsake\",\n"
      "    \"header_xxh3\": \"################\",\n"
      "    \"rank\": 1,\n"
      "    \"size\": 1276\n"
      "   },\n"
      "   {\n"
      "    \"file\": \"rank-00002-of-00003.keepsake\",\n"
      "    \"header_xxh3\": \"################\",\n"
      "    \"rank\": 2,\n"
      "    \"size\": 1260\n"
      "   }\n"
      "  ],\n"
      "  \"format\": \"keepsake-sharded\",\n"
      "  \"per_rank\": [\n"
      "   \"rng\",\n"
      "   \"state/dataset_state\",\n"
      "   \"state/train_metrics\",\n"
      "   \"state/eval_metrics\"\n"
      "  ],\n"
      "  \"sharded\": {\n"
      "   \"state/model/w\": {\n"
      "    \"chunks\": [\n"
      "     {\n"
      "      \"offsets\": [\n"
      "       0,\n"
      "       0\n"
      "      ],\n"
      "      \"rank\": 0,\n"
      "      \"shape\": [\n"
      "       3,\n"
      "       2\n"
      "      ]\n"
      "     },\n"
      "     {\n"
      "      \"offsets\": [\n"
      "       3,\n"
      "       0\n"
      "      ],\n"
      "      \"rank\": 1,\n"
      "      \"shape\": [\n"
      "       3,\n"
      "       2\n"
      "      ]\n"
      "     },\n"
      "     {\n"
      "      \"offsets\": [\n"
      "       6,\n"
      "       0\n"
      "      ],\n"
      "      \"rank\": 2,\n"
      "      \"shape\": [\n"
      "       1,\n"
      "       2\n"
      "      ]\n"
      "     }\n"
      "    ],\n"
      "    \"dtype\": \"F32\",\n"
      "    \"global_shape\": [\n"
      "     7,\n"
      "     2\n"
      "    ]\n"
      "   }\n"
      "  },\n"
      "  \"timestamp\": {\n"
      "   \"batch\": 5,\n"
      "   \"epoch\": 2,\n"
      "   \"sample\": 50,\n"
      "   \"token\": 0\n"
      "  },\n"
      "  \"version\": 2,\n"
      "  \"world_size\": 3\n"
      " },\n"
      " \"metadata\": {\n"
      "  \"total_size\": 72\n"
      " },\n"
      " \"weight_map\": {\n"
      "  \"state/model/b\": \"rank-00000-of-00003.keepsake\"\n"
      " }\n"
      "}";
  char *root = ks_test_tmpdir("shard");
  char *dir = write_ckpt(root, "ep2-ba5", -1);
  char *p = ks_test_path(dir, KS_SHARD_INDEX_NAME);
  size_t n;
  uint8_t *got = ks_test_read_file(p, &n);
  assert_non_null(got);
  char *text = malloc(n + 1), *expect = strdup(want);
  assert_non_null(text);
  assert_non_null(expect);
  memcpy(text, got, n);
  text[n] = '\0';
  mask_file_facts(text);
  mask_file_facts(expect);
  assert_string_equal(text, expect);
  free(text);
  free(expect);
  free(got);
  free(p);
  ks_test_rmtree(root);
  free(dir);
  free(root);
}

/* Writes every rank file and the index, reads the index and loads rank 0 of 2, all through ta. */
static ks_status save_and_load_through(const char *dir, ks_test_alloc *ta, float *sum) {
  ks_shard_file_info infos[N];
  ks_save_opts so = {.io = ks_test_io_nosync(), .alloc = &ta->a};
  ks_status st = KS_OK;
  for (int r = 0; !st && r < N; r++) {
    ks_statedict *sd;
    ks_meta *meta;
    ks_shard_map *map;
    rank_state(r, 5, &sd, &meta, &map);
    st = ks_shard_write_rank(dir, r, N, sd, meta, map, NULL, 0, &so, &infos[r], NULL);
    ks_statedict_free(sd);
    ks_meta_free(meta);
    ks_shard_map_free(map);
  }
  if (!st) st = ks_shard_write_index(dir, N, infos, &so, NULL);
  ks_shard_index *idx = NULL;
  if (!st) st = ks_shard_index_read(dir, &ta->a, NULL, &idx, NULL);
  ks_shard_load_opts lo = {.alloc = &ta->a};
  ks_statedict *out = NULL;
  ks_meta *meta = NULL;
  if (!st) st = ks_shard_load_rank(dir, idx, 0, 2, NULL, &lo, &out, &meta, NULL);
  if (!st) *sum = metric_sum(out);
  ks_statedict_free(out);
  ks_meta_free(meta);
  ks_shard_index_free(idx);
  return st;
}

/* Every allocation of a sharded save and load, the index's JSON included, can fail cleanly. */
static void allocation_failures_in_save_and_index(void **s) {
  (void)s;
  char *root = ks_test_tmpdir("shard");
  char *dir = ks_test_path(root, "sweep");
  assert_int_equal(mkdir(dir, 0777), 0);
  ks_status st = KS_E_NOMEM;
  long n = 1;
  for (; st == KS_E_NOMEM && n < 20000; n++) {
    ks_test_alloc ta;
    ks_test_alloc_init(&ta, n);
    float sum = 0;
    st = save_and_load_through(dir, &ta, &sum);
    assert_int_equal(ta.live, 0);
    if (!st) assert_true(sum == 3.0f);
  }
  assert_int_equal(st, KS_OK);
  assert_true(n > 100); /* the sweep reached well past the first allocations */
  ks_test_rmtree(root);
  free(dir);
  free(root);
}

/* Writes the 3 rank files then the index through io; *st_out is the first failure (or OK). */
static int write_through(const char *dir, ks_fault_io *f, ks_status *st_out, int *index_failed) {
  ks_shard_file_info infos[N];
  ks_save_opts so = {.io = &f->io};
  ks_status first = KS_OK;
  *index_failed = 0;
  for (int r = 0; r < N; r++) {
    ks_statedict *sd;
    ks_meta *meta;
    ks_shard_map *map;
    rank_state(r, 5, &sd, &meta, &map);
    ks_error err;
    ks_status st = ks_shard_write_rank(dir, r, N, sd, meta, map, NULL, 0, &so, &infos[r], &err);
    ks_statedict_free(sd);
    ks_meta_free(meta);
    ks_shard_map_free(map);
    if (st == KS_E_NOT_DURABLE) assert_non_null(strstr(err.message, "durability unknown"));
    if (st && !first) first = st;
    if (st && st != KS_E_NOT_DURABLE) { /* a hard failure: nothing to commit */
      *st_out = first;
      return 0;
    }
  }
  ks_error err;
  ks_status st = ks_shard_write_index(dir, N, infos, &so, &err);
  if (st) *index_failed = 1;
  if (st && !first) first = st;
  *st_out = first;
  return 1;
}

/* Each durable step of a sharded save fails in turn: a failed directory fsync after a rename is
   KS_E_NOT_DURABLE with the file in place (the checkpoint still commits); anything else is KS_E_IO. */
static void a_failed_directory_fsync_is_not_durable(void **s) {
  (void)s;
  char *root = ks_test_tmpdir("shard");
  int seen_not_durable = 0, seen_io = 0, seen_index_not_durable = 0, seen_read_close = 0;
  for (long n = 1; n < 1000; n++) {
    char sub[32];
    snprintf(sub, sizeof sub, "c%ld", n);
    char *dir = ks_test_path(root, sub);
    assert_int_equal(mkdir(dir, 0777), 0);
    ks_fault_io f;
    ks_fault_io_init(&f, n);
    ks_status st;
    int index_failed;
    int reached_index = write_through(dir, &f, &st, &index_failed);
    ks_shard_index *idx = NULL;
    ks_status rd = ks_shard_index_read(dir, NULL, NULL, &idx, NULL);
    int done = f.failed_op == -1;
    if (done) {
      assert_int_equal(st, KS_OK);
      assert_int_equal(rd, KS_OK);
    } else if (st == KS_OK && f.failed_op == KS_FAULT_CLOSE) {
      /* the close of a read handle (the index writer reads the rank headers through the same
         table): what it read was complete, so the checkpoint commits */
      assert_int_equal(rd, KS_OK);
      seen_read_close = 1;
    } else if (f.failed_op == KS_FAULT_FSYNC_DIR) {
      assert_int_equal(st, KS_E_NOT_DURABLE);
      /* committed: the index is there and names files that verify */
      assert_int_equal(rd, KS_OK);
      for (int r = 0; r < N; r++) assert_int_equal(ks_shard_verify_file(dir, idx, r, NULL, NULL), KS_OK);
      seen_not_durable = 1;
      seen_index_not_durable |= index_failed;
    } else {
      assert_int_equal(st, KS_E_IO);
      /* not committed: no index, whichever file failed */
      assert_int_equal(rd, KS_E_NOTFOUND);
      seen_io = 1;
      (void)reached_index;
    }
    ks_shard_index_free(idx);
    free(dir);
    if (done) break;
  }
  assert_true(seen_not_durable && seen_io && seen_index_not_durable && seen_read_close);
  ks_test_rmtree(root);
  free(root);
}

static void chunk_maps_check_their_bounds(void **s) {
  (void)s;
  ks_shard_map *m;
  assert_int_equal(ks_shard_map_create(NULL, &m, NULL), KS_OK);
  int64_t g[1] = {4}, o[1] = {3}, sh[1] = {2};
  assert_int_equal(ks_shard_map_add(m, "w", 1, g, o, sh, NULL), KS_E_INVALID);
  sh[0] = 1;
  assert_int_equal(ks_shard_map_add(m, "w", 1, g, o, sh, NULL), KS_OK);
  ks_shard_chunk c;
  assert_int_equal(ks_shard_map_get(m, "w", &c), KS_OK);
  assert_int_equal(c.offsets[0], 3);
  assert_int_equal(ks_shard_map_count(m), 1);
  ks_shard_map_free(m);
  int64_t off[1], shape[1], g10[1] = {10};
  int64_t total = 0;
  for (int r = 0; r < 4; r++) {
    ks_shard_split_dim0(1, g10, r, 4, off, shape);
    assert_int_equal(off[0], total);
    total += shape[0];
  }
  assert_int_equal(total, 10);
  char name[64];
  assert_int_equal(ks_shard_file_name(3, 4, name, sizeof name), KS_OK);
  assert_string_equal(name, "rank-00003-of-00004.keepsake");
  assert_int_equal(ks_shard_file_name(4, 4, name, sizeof name), KS_E_INVALID);
}

/* ks_shard_index_get fills what the caller's layout has (size), as the option structs are read. */
static void index_info_fills_the_callers_layout(void **s) {
  (void)s;
  char *root = ks_test_tmpdir("shard-info");
  char *dir = write_ckpt(root, "a", -1);
  ks_shard_index *idx;
  assert_int_equal(ks_shard_index_read(dir, NULL, NULL, &idx, NULL), KS_OK);
  ks_shard_index_info in = KS_OPTS_INIT(ks_shard_index_info);
  ks_shard_index_get(idx, &in);
  assert_int_equal(in.size, sizeof in);
  assert_int_equal(in.version, KS_SHARD_INDEX_VERSION);
  assert_int_equal(in.world_size, N);
  assert_int_equal(in.epoch, 2);
  assert_int_equal(in.batch, 5);
  assert_int_equal(in.n_sharded, 1);
  size_t np;
  const char *const *def = ks_shard_default_per_rank(&np);
  assert_int_equal(in.n_per_rank, np);
  for (size_t i = 0; i < np; i++) assert_string_equal(in.per_rank[i], def[i]);
  /* An older caller's struct, up to n_sharded: nothing past it is written. */
  ks_shard_index_info old;
  memset(&old, 0x5A, sizeof old);
  old.size = offsetof(ks_shard_index_info, n_sharded);
  ks_shard_index_get(idx, &old);
  assert_int_equal(old.world_size, N);
  assert_int_equal(old.batch, in.batch);
  unsigned char rest[sizeof old - offsetof(ks_shard_index_info, n_sharded)];
  memset(rest, 0x5A, sizeof rest);
  assert_memory_equal((const unsigned char *)&old + offsetof(ks_shard_index_info, n_sharded), rest, sizeof rest);
  ks_shard_index_free(idx);
  /* No index: zeros, epoch and batch -1. */
  ks_shard_index_get(NULL, &in);
  assert_int_equal(in.world_size, 0);
  assert_int_equal(in.epoch, -1);
  assert_int_equal(in.batch, -1);
  assert_null(in.per_rank);
  ks_shard_index_get(NULL, NULL); /* no crash */
  free(dir);
  ks_test_rmtree(root);
  free(root);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(loads_at_fewer_equal_and_more_ranks),
      cmocka_unit_test(timestamps_that_disagree_leave_no_index),
      cmocka_unit_test(bad_shards_are_named),
      cmocka_unit_test(index_info_fills_the_callers_layout),
      cmocka_unit_test(a_file_from_another_checkpoint_is_refused),
      cmocka_unit_test(every_byte_is_verified_and_version_1_indexes_still_read),
      cmocka_unit_test(malformed_indexes_are_refused),
      cmocka_unit_test(allocation_failures_leak_nothing),
      cmocka_unit_test(chunk_maps_check_their_bounds),
      cmocka_unit_test(the_index_keeps_its_layout),
      cmocka_unit_test(allocation_failures_in_save_and_index),
      cmocka_unit_test(a_failed_directory_fsync_is_not_durable),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
