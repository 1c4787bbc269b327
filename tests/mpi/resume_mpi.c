/*
 * A tiny deterministic data-parallel run for the kill-and-resume test
 * (resume_mpi.sh): each step updates this rank's rows of a row-sharded tensor
 * from its PRNG, feeds its metrics a batch chosen by step and rank, advances
 * its data position and the timestamp, and every second step saves
 * RUN/ep0-ba{step} with ks_dist_save. It starts from the newest complete
 * checkpoint of RUN (ks_dist_latest). With --die-at STEP last|all step|save
 * the last rank (or every rank) exits at the start of that step, or in the
 * middle of writing its file during that step's save.
 *
 * usage: resume_mpi RUN STEPS [--die-at STEP last|all step|save]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "catalogue.h"
#include "keepsake/dist.h"
#include "mpitest.h"

#define ROWS 8
#define COLS 4

typedef struct run {
  ks_state *st;
  float w[ROWS * COLS];
  int64_t off[2], shape[2];
  ks_rng rng;
  ks_dataset_state ds;
  ks_timestamp ts;
  ks_shard_map *map;
} run;

static ks_status metrics_factory(void *ctx, const char *label, const ks_allocator *a, ks_metric_collection **out,
                                 ks_error *err) {
  (void)ctx;
  (void)label;
  static const char *const cls[][2] = {{"MeanMetric", "{}"}, {"CatMetric", "{}"},
                                       {"MulticlassAccuracy", "{\"num_classes\":5}"}, {"BinaryAUROC", "{}"}};
  ks_status st = ks_metric_collection_create(a, out, NULL);
  for (size_t i = 0; !st && i < sizeof cls / sizeof cls[0]; i++) {
    ks_metric *m;
    st = ks_metric_create(cls[i][0], cls[i][1], a, &m, err);
    if (!st && (st = ks_metric_collection_add(*out, cls[i][0], m, NULL))) ks_metric_free(m);
  }
  if (st) ks_metric_collection_free(*out), *out = NULL;
  return st;
}

static void setup(run *r) {
  memset(r, 0, sizeof *r);
  int64_t g[2] = {ROWS, COLS};
  ks_shard_split_dim0(2, g, mt_rank, mt_size, r->off, r->shape);
  for (int64_t i = 0; i < r->shape[0] * COLS; i++) r->w[i] = (float)(r->off[0] * COLS + i);
  ks_rng_seed(&r->rng, 100u + (uint64_t)mt_rank);
  r->ds.shuffle_seed = 3;
  ks_error err;
  MT_OK(ks_state_create("resume-mpi", 7, NULL, &r->st, NULL), NULL);
  ks_tensor t;
  MT_CHECK(ks_tensor_init(&t, KS_F32, 2, r->shape, r->w) == KS_OK, "setup");
  MT_OK(ks_state_add_tensor(r->st, "w", &t, NULL), NULL);
  ks_state_set_rng(r->st, &r->rng);
  ks_state_set_timestamp(r->st, &r->ts);
  MT_OK(ks_state_add_dataset(r->st, "train", &r->ds, NULL), NULL);
  MT_OK(ks_state_build_metrics(r->st, metrics_factory, NULL, NULL, 0, &err), &err);
  MT_OK(ks_shard_map_create(NULL, &r->map, NULL), NULL);
  MT_OK(ks_shard_map_add(r->map, "state/model/w", 2, g, r->off, r->shape, NULL), NULL);
}

static void resume(run *r, const char *dir) {
  char *latest = NULL;
  ks_error err;
  MT_OK(ks_dist_latest(MPI_COMM_WORLD, dir, &latest, &err), &err);
  if (!latest) return;
  ks_statedict *sd;
  ks_meta *meta;
  MT_OK(ks_dist_load(MPI_COMM_WORLD, latest, r->map, NULL, &sd, &meta, &err), &err);
  MT_OK(ks_state_load_state_dict(r->st, sd, meta, NULL, NULL, &err), &err);
  if (mt_rank == 0) printf("resumed at batch %lld\n", (long long)r->ts.batch);
  ks_statedict_free(sd);
  ks_meta_free(meta);
  free(latest);
}

static void step(run *r) {
  for (int64_t i = 0; i < r->shape[0] * COLS; i++) r->w[i] += (float)(ks_rng_uniform(&r->rng) - 0.5) * 0.125f;
  ks_metric_collection *c = ks_state_train_metrics(r->st);
  ks_error err;
  for (size_t i = 0; i < ks_metric_collection_count(c); i++) {
    ks_metric *m = ks_metric_collection_at(c, i, NULL);
    MT_OK(golden_feed(m, ks_metric_class(m), (int)(r->ts.batch * mt_size + mt_rank), &err), &err);
  }
  r->ds.sample_in_epoch += 4;
  ks_timestamp_batch_done(&r->ts, 4 * mt_size, 0, 0.0);
}

static int die_write(void *ctx, int fd, const void *buf, size_t n, size_t *written) {
  (void)ctx;
  static int calls;
  if (calls++ > 0) _exit(9);
  return ks_io_posix()->write_fn(NULL, fd, buf, n / 2, written);
}

static void save(run *r, const char *root, int dying) {
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/ep%lld-ba%lld", root, (long long)r->ts.epoch, (long long)r->ts.batch);
  ks_statedict *sd;
  ks_meta *meta;
  ks_error err;
  MT_OK(ks_statedict_create(NULL, &sd, NULL), NULL);
  MT_OK(ks_meta_create(NULL, &meta, NULL), NULL);
  MT_OK(ks_state_to_state_dict(r->st, sd, meta, &err), &err);
  ks_io io = *ks_io_posix();
  io.write_fn = die_write;
  ks_dist_save_opts o = {.io = dying ? &io : NULL};
  MT_OK(ks_dist_save(MPI_COMM_WORLD, dir, sd, meta, r->map, &o, &err), &err);
  ks_statedict_free(sd);
  ks_meta_free(meta);
}

int main(int argc, char **argv) {
  mt_init(&argc, &argv);
  if (argc != 3 && argc != 7) {
    fprintf(stderr, "usage: resume_mpi RUN STEPS [--die-at STEP last|all step|save]\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  int steps = atoi(argv[2]), die_at = argc == 7 ? atoi(argv[4]) : -1;
  int me = argc == 7 && (!strcmp(argv[5], "all") || mt_rank == mt_size - 1);
  int in_save = argc == 7 && !strcmp(argv[6], "save");
  if (mt_rank == 0) mkdir(argv[1], 0777);
  MPI_Barrier(MPI_COMM_WORLD);
  run r;
  setup(&r);
  resume(&r, argv[1]);
  while (r.ts.batch < steps) {
    if (me && !in_save && r.ts.batch + 1 == die_at) _exit(9);
    step(&r);
    if (r.ts.batch % 2 == 0) save(&r, argv[1], me && in_save && r.ts.batch == die_at);
  }
  ks_shard_map_free(r.map);
  ks_state_free(r.st);
  MPI_Finalize();
  return 0;
}
