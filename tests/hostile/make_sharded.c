/*
 * make_sharded DIR: writes a small valid 3-rank sharded checkpoint into DIR
 * (created) with the public API only, the starting point of shard_index.py's
 * malformed variants and of the `inspect --json DIR` test:
 *   state/model/w  F32 [7, 2]  split along dimension 0 (rank 2 holds 1 row)
 *   state/model/v  F32 [4, 6]  split along dimension 1
 *   state/model/b  F32 [4]     replicated (rank 0's file)
 *   state/train_metrics/S      a SumMetric per rank: rank r holds r+1 after r+1 updates,
 *                              its computed value saved in _computed
 *   rng/0, a timestamp (epoch 2, batch 5), state/run_name.
 *
 * make_sharded DIR --long-names K L --globs G: the same, plus the hostile case of per-rank globs
 * (issue 29): K replicated integer scalars in rank 0's file named "state/long/<k>/a/a/.../a" (L
 * bytes, a '/' every other byte) and, besides the default per-rank globs, G more that match none of
 * them (each a leading '*' and a tail no name has), in the index and every rank file's record.
 * Every load, reshard and diff matches each name against each glob.
 *
 * make_sharded DIR --pad-mib M: the same, plus "state/model/pad", F32 [3 * M * 2^18] split along
 * dimension 0: M MiB of data in each rank file after a small header (tests/hostile/shard_truncate.py).
 * Exit status 0, or 1 with the error on stderr.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "keepsake/keepsake.h"

#define N 3

static int fail(const char *what, const ks_error *err) {
  fprintf(stderr, "make_sharded: %s: %s\n", what, err ? err->message : "failed");
  return 1;
}

/* A tensor `name` of the part of a [g0, g1] F32 tensor that `off`/`shape` select, value = global index. */
static ks_status chunk(ks_statedict *sd, ks_shard_map *map, const char *name, const int64_t *g, const int64_t *off,
                       const int64_t *shape, ks_error *err) {
  float *p;
  ks_status st = ks_statedict_new_tensor(sd, name, KS_F32, 2, shape, (void **)&p, err);
  for (int64_t i = 0; !st && i < shape[0]; i++)
    for (int64_t j = 0; j < shape[1]; j++) p[i * shape[1] + j] = (float)((off[0] + i) * g[1] + off[1] + j);
  return st ? st : ks_shard_map_add(map, name, 2, g, off, shape, err);
}

/* Rank r's SumMetric: r+1 updates of 1, computed, with its keepsake.metrics record. */
static ks_status metric(int r, ks_statedict *sd, ks_meta *meta, ks_error *err) {
  ks_metric *m;
  ks_status st = ks_metric_create("SumMetric", NULL, NULL, &m, err);
  if (st) return st;
  float one = 1.0f;
  ks_tensor t;
  const ks_tensor *value = NULL;
  st = ks_tensor_init(&t, KS_F32, 0, NULL, &one);
  for (int i = 0; !st && i <= r; i++) st = ks_metric_update(m, &t, 1, err);
  if (!st) st = ks_metric_compute(m, &value, err);
  if (!st) st = ks_metric_to_state_dict(m, sd, "state/train_metrics/S/state_dict/", err);
  if (!st) st = ks_statedict_set_tensor(sd, "state/train_metrics/S/_computed", value, KS_COPY, err);
  char json[512];
  if (!st) {
    snprintf(
        json, sizeof json,
        "{\"state/train_metrics/S\":{\"class\":\"SumMetric\",\"args\":%s,\"schema_version\":2,\"update_count\":%d}}",
        ks_metric_args_json(m), r + 1);
    st = ks_meta_set(meta, "keepsake.metrics", json, err);
  }
  ks_metric_free(m);
  return st;
}

typedef struct hostile {
  int names, name_len, globs;
  int pad_mib;
} hostile;

/* Rank r's M MiB chunk of "state/model/pad" (value = global index, modulo 2^24). */
static ks_status pad(const hostile *h, int r, ks_statedict *sd, ks_shard_map *map, ks_error *err) {
  int64_t g[1] = {(int64_t)N * h->pad_mib << 18}, off[1], shape[1];
  ks_shard_split_dim0(1, g, r, N, off, shape);
  float *p;
  ks_status st = ks_statedict_new_tensor(sd, "state/model/pad", KS_F32, 1, shape, (void **)&p, err);
  for (int64_t i = 0; !st && i < shape[0]; i++) p[i] = (float)((off[0] + i) & 0xFFFFFF);
  return st ? st : ks_shard_map_add(map, "state/model/pad", 1, g, off, shape, err);
}

/* Rank 0's K scalars with long names of many '/' boundaries. */
static ks_status long_names(const hostile *h, ks_statedict *sd, ks_error *err) {
  char name[KS_MAX_NAME + 1];
  ks_status st = KS_OK;
  for (int k = 0; !st && k < h->names; k++) {
    int n = snprintf(name, sizeof name, "state/long/%d", k);
    while (n + 2 <= h->name_len && n + 2 <= KS_MAX_NAME) name[n++] = '/', name[n++] = 'a';
    name[n] = '\0';
    st = ks_statedict_set_int(sd, name, k, err);
  }
  return st;
}

/* The default per-rank globs, then G that match no name of this directory. NULL when out of memory. */
static char **hostile_globs(const hostile *h, size_t *n) {
  size_t nd;
  const char *const *def = ks_shard_default_per_rank(&nd);
  *n = nd + (size_t)h->globs;
  char **g = calloc(*n, sizeof *g);
  for (size_t i = 0; g && i < *n; i++) {
    char buf[64];
    if (i < nd) snprintf(buf, sizeof buf, "%s", def[i]);
    else snprintf(buf, sizeof buf, "*/a/b/%zu/xxxxxxxxxxxxxxxxxxxxxxxx", i - nd); /* a near miss at each boundary */
    size_t len = strlen(buf) + 1;
    if (!(g[i] = malloc(len))) return NULL;
    memcpy(g[i], buf, len);
  }
  return g;
}

static ks_status rank_state(int r, ks_statedict *sd, ks_meta *meta, ks_shard_map *map, ks_error *err) {
  int64_t gw[2] = {7, 2}, gv[2] = {4, 6}, off[2], shape[2], bs[1] = {4};
  ks_shard_split_dim0(2, gw, r, N, off, shape);
  ks_status st = chunk(sd, map, "state/model/w", gw, off, shape, err);
  int64_t voff[2] = {0, 2 * r}, vshape[2] = {4, 2};
  if (!st) st = chunk(sd, map, "state/model/v", gv, voff, vshape, err);
  float *b;
  if (!st) st = ks_statedict_new_tensor(sd, "state/model/b", KS_F32, 1, bs, (void **)&b, err);
  for (int i = 0; !st && i < 4; i++) b[i] = (float)i * 0.25f;
  static const char *const ts[] = {"epoch", "batch", "sample", "token"};
  static const int64_t tv[] = {2, 5, 50, 0};
  char key[64];
  for (int i = 0; !st && i < 4; i++) {
    snprintf(key, sizeof key, "state/timestamp/Timestamp/%s", ts[i]);
    st = ks_statedict_set_int(sd, key, tv[i], err);
  }
  if (!st) st = ks_statedict_set_string(sd, "state/run_name", "sharded-fixture", err);
  ks_rng rng;
  ks_rng_seed(&rng, (uint64_t)r + 1);
  ks_stateful rc = ks_rng_stateful(&rng);
  if (!st) st = rc.to_state_dict(rc.ctx, sd, "rng/0/", err);
  return st ? st : metric(r, sd, meta, err);
}

int main(int argc, char **argv) {
  hostile h = {0, 0, 0, 0};
  if (argc == 7 && !strcmp(argv[2], "--long-names") && !strcmp(argv[5], "--globs")) {
    h.names = atoi(argv[3]);
    h.name_len = atoi(argv[4]);
    h.globs = atoi(argv[6]);
  } else if (argc == 4 && !strcmp(argv[2], "--pad-mib")) {
    h.pad_mib = atoi(argv[3]);
  } else if (argc != 2)
    return fprintf(stderr, "usage: make_sharded DIR [--long-names K L --globs G | --pad-mib M]\n"), 2;
  const char *dir = argv[1];
  size_t n_globs = 0;
  char **globs = h.globs ? hostile_globs(&h, &n_globs) : NULL;
  if (h.globs && !globs) return fprintf(stderr, "make_sharded: out of memory\n"), 1;
  if (mkdir(dir, 0777)) return perror(dir), 1;
  ks_shard_file_info infos[N];
  ks_error err;
  for (int r = 0; r < N; r++) {
    ks_statedict *sd = NULL;
    ks_meta *meta = NULL;
    ks_shard_map *map = NULL;
    ks_status st = ks_statedict_create(NULL, &sd, &err);
    if (!st) st = ks_meta_create(NULL, &meta, &err);
    if (!st) st = ks_shard_map_create(NULL, &map, &err);
    if (!st) st = rank_state(r, sd, meta, map, &err);
    if (!st && r == 0) st = long_names(&h, sd, &err);
    if (!st && h.pad_mib > 0) st = pad(&h, r, sd, map, &err);
    if (!st)
      st = ks_shard_write_rank(dir, r, N, sd, meta, map, (const char *const *)globs, n_globs, NULL, &infos[r], &err);
    ks_statedict_free(sd);
    ks_meta_free(meta);
    ks_shard_map_free(map);
    if (st) return fail("rank file", &err);
  }
  if (ks_shard_write_index(dir, N, infos, NULL, &err)) return fail("index", &err);
  for (size_t i = 0; i < n_globs; i++) free(globs[i]);
  free(globs);
  return 0;
}
