/*
 * Sharded checkpoints over MPI. For every N and M up to the job size, N ranks
 * save a program state (a row-sharded and a column-sharded tensor, a
 * replicated tensor, timestamp, per-rank RNG, data position and the whole
 * metric catalogue fed each rank's data) and M ranks load it: tensors come
 * back resharded, the synced metrics equal the single-process value on the
 * union of the data, and at M = N every rank gets its own states back bit for
 * bit. Then the faults: a failing write on one rank, timestamps that differ,
 * and a corrupt, truncated or missing shard.
 */
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "catalogue.h"
#include "faultio.h"
#include "keepsake/dist.h"
#include "mpitest.h"
#include "testutil.h"

#define W_ROWS 10
#define W_COLS 3
#define V_ROWS 4
#define V_COLS 6
#define N_BATCHES 7

static int owner(int b, int size) { return size == 1 ? 0 : b % (size - 1); }

typedef struct prog {
  ks_state *st;
  float *w, *v, b[W_COLS];
  int64_t w_off[2], w_shape[2], v_off[2], v_shape[2];
  ks_rng rng;
  ks_dataset_state ds;
  ks_timestamp ts;
} prog;

static void expected_rng(int saved_rank, ks_rng *r) {
  ks_rng_seed(r, 1000u + (uint64_t)saved_rank);
  for (int i = 0; i < saved_rank; i++) ks_rng_next(r);
}

static void feed_local(ks_metric_collection *c, int rank, int size) {
  ks_error err;
  for (size_t i = 0; i < ks_metric_collection_count(c); i++) {
    ks_metric *m = ks_metric_collection_at(c, i, NULL);
    for (int b = 0; b < N_BATCHES; b++)
      if (owner(b, size) == rank) MT_OK(golden_feed(m, ks_metric_class(m), b, &err), &err);
  }
}

/* A program at rank r of n; `saving` fills it with the values a run would hold, else defaults. */
static void prog_init(prog *p, int r, int n, int saving, int v_by_cols) {
  memset(p, 0, sizeof *p);
  ks_error err;
  int64_t wg[2] = {W_ROWS, W_COLS}, vg[2] = {V_ROWS, V_COLS};
  ks_shard_split_dim0(2, wg, r, n, p->w_off, p->w_shape);
  ks_shard_split_dim0(2, vg, r, n, p->v_off, p->v_shape);
  if (v_by_cols) { /* split v along its columns instead */
    int64_t t[2] = {V_COLS, V_ROWS}, o[2], s[2];
    ks_shard_split_dim0(2, t, r, n, o, s);
    p->v_off[0] = 0, p->v_off[1] = o[0], p->v_shape[0] = V_ROWS, p->v_shape[1] = s[0];
  }
  p->w = calloc((size_t)(p->w_shape[0] * p->w_shape[1]) + 1, sizeof(float));
  p->v = calloc((size_t)(p->v_shape[0] * p->v_shape[1]) + 1, sizeof(float));
  MT_OK(ks_state_create("mpi", 42, NULL, &p->st, NULL), NULL);
  ks_tensor t;
  MT_CHECK(ks_tensor_init(&t, KS_F32, 2, p->w_shape, p->w) == KS_OK, "setup");
  MT_OK(ks_state_add_tensor(p->st, "w", &t, NULL), NULL);
  MT_CHECK(ks_tensor_init(&t, KS_F32, 2, p->v_shape, p->v) == KS_OK, "setup");
  MT_OK(ks_state_add_tensor(p->st, "v", &t, NULL), NULL);
  int64_t bs[1] = {W_COLS};
  MT_CHECK(ks_tensor_init(&t, KS_F32, 1, bs, p->b) == KS_OK, "setup");
  MT_OK(ks_state_add_tensor(p->st, "b", &t, NULL), NULL);
  ks_state_set_timestamp(p->st, &p->ts);
  ks_state_set_rng(p->st, &p->rng);
  MT_OK(ks_state_add_dataset(p->st, "train", &p->ds, NULL), NULL);
  MT_OK(ks_state_build_metrics(p->st, golden_catalogue_factory, NULL, NULL, 0, &err), &err);
  if (!saving) return;
  for (int64_t i = 0; i < p->w_shape[0]; i++)
    for (int64_t j = 0; j < W_COLS; j++) p->w[i * W_COLS + j] = (float)((i + p->w_off[0]) * W_COLS + j) + 0.5f;
  for (int64_t i = 0; i < p->v_shape[0]; i++)
    for (int64_t j = 0; j < p->v_shape[1]; j++)
      p->v[i * p->v_shape[1] + j] = (float)((i + p->v_off[0]) * V_COLS + j + p->v_off[1]);
  for (int j = 0; j < W_COLS; j++) p->b[j] = (float)j - 1.25f;
  expected_rng(r, &p->rng);
  p->ds.epoch = 1, p->ds.sample_in_epoch = 100 + r, p->ds.shuffle_seed = 7;
  p->ts.epoch = 1, p->ts.batch = 5, p->ts.sample = 50;
  feed_local(ks_state_train_metrics(p->st), r, n);
}

static void prog_free(prog *p) {
  ks_state_free(p->st);
  free(p->w);
  free(p->v);
}

static ks_shard_map *chunks_of(const prog *p) {
  ks_shard_map *m;
  int64_t wg[2] = {W_ROWS, W_COLS}, vg[2] = {V_ROWS, V_COLS};
  MT_OK(ks_shard_map_create(NULL, &m, NULL), NULL);
  MT_OK(ks_shard_map_add(m, "state/model/w", 2, wg, p->w_off, p->w_shape, NULL), NULL);
  MT_OK(ks_shard_map_add(m, "state/model/v", 2, vg, p->v_off, p->v_shape, NULL), NULL);
  return m;
}

static ks_status save(MPI_Comm comm, const prog *p, const char *dir, const ks_io *io, ks_error *err) {
  ks_statedict *sd;
  ks_meta *meta;
  MT_OK(ks_statedict_create(NULL, &sd, NULL), NULL);
  MT_OK(ks_meta_create(NULL, &meta, NULL), NULL);
  MT_OK(ks_state_to_state_dict(p->st, sd, meta, err), err);
  ks_shard_map *chunks = chunks_of(p);
  ks_dist_save_opts o = {.io = io};
  ks_status st = ks_dist_save(comm, dir, sd, meta, chunks, &o, err);
  ks_shard_map_free(chunks);
  ks_meta_free(meta);
  ks_statedict_free(sd);
  return st;
}

static ks_status load(MPI_Comm comm, prog *p, const char *dir, ks_error *err) {
  ks_shard_map *want = chunks_of(p);
  ks_statedict *sd = NULL;
  ks_meta *meta = NULL;
  ks_status st = ks_dist_load(comm, dir, want, NULL, &sd, &meta, err);
  if (!st) MT_OK(ks_state_load_state_dict(p->st, sd, meta, NULL, NULL, err), err);
  ks_shard_map_free(want);
  ks_statedict_free(sd);
  ks_meta_free(meta);
  return st;
}

static void check_tensors(const prog *p) {
  for (int64_t i = 0; i < p->w_shape[0]; i++)
    for (int64_t j = 0; j < W_COLS; j++)
      MT_CHECK(p->w[i * W_COLS + j] == (float)((i + p->w_off[0]) * W_COLS + j) + 0.5f, "w[%lld][%lld]",
               (long long)(i + p->w_off[0]), (long long)j);
  for (int64_t i = 0; i < p->v_shape[0]; i++)
    for (int64_t j = 0; j < p->v_shape[1]; j++)
      MT_CHECK(p->v[i * p->v_shape[1] + j] == (float)((i + p->v_off[0]) * V_COLS + j + p->v_off[1]), "v[%lld][%lld]",
               (long long)(i + p->v_off[0]), (long long)(j + p->v_off[1]));
  for (int j = 0; j < W_COLS; j++) MT_CHECK(p->b[j] == (float)j - 1.25f, "b[%d]", j);
  MT_CHECK(p->ts.epoch == 1 && p->ts.batch == 5 && p->ts.sample == 50, "timestamp not restored");
}

/* The first saved rank of n assigned to rank r of m, as ks_shard_load_rank assigns them. */
static int first_source(int r, int m, int n) {
  for (int s = 0; s < n; s++)
    if ((int64_t)s * m / n == r) return s;
  return r % n;
}

static void check_per_rank(prog *p, int r, int m, int n) {
  int src = m == n ? r : first_source(r, m, n);
  ks_rng want;
  expected_rng(src, &want);
  MT_CHECK(!memcmp(&want, &p->rng, sizeof want), "rank %d: rng is not saved rank %d's", r, src);
  MT_CHECK(p->ds.sample_in_epoch == 100 + src && p->ds.shuffle_seed == 7, "rank %d: data position is not rank %d's", r,
           src);
  if (m != n) return;
  /* Same world size: this rank's own local metric states, bit for bit. */
  ks_metric_collection *own;
  MT_OK(golden_catalogue_factory(NULL, NULL, NULL, &own, NULL), NULL);
  feed_local(own, r, n);
  MT_CHECK(mt_states_hash(ks_state_train_metrics(p->st)) == mt_states_hash(own), "rank %d: local metric states differ",
           r);
  ks_metric_collection_free(own);
}

static void check_global_metrics(MPI_Comm comm, prog *p, int n) {
  ks_metric_collection *c = ks_state_train_metrics(p->st), *ref;
  ks_error err;
  MT_OK(golden_catalogue_factory(NULL, NULL, NULL, &ref, NULL), NULL);
  for (int s = 0; s < n; s++) feed_local(ref, s, n);
  MT_OK(ks_dist_sync(c, comm, NULL, NULL, &err), &err);
  for (size_t i = 0; i < ks_metric_collection_count(c); i++) {
    const char *name;
    ks_metric *m = ks_metric_collection_at(c, i, &name);
    mt_expect_same_states(name, m, ks_metric_collection_at(ref, i, NULL));
    mt_expect_same_compute(name, m, ks_metric_collection_at(ref, i, NULL));
  }
  ks_metric_collection_free(ref);
}

static MPI_Comm first_ranks(int k) {
  MPI_Comm c;
  MPI_Comm_split(MPI_COMM_WORLD, mt_rank < k ? 0 : MPI_UNDEFINED, mt_rank, &c);
  return c;
}

static char *dir_for(const char *root, const char *name) {
  char *d = ks_test_path(root, name);
  return d;
}

static void test_every_world_size(const char *root) {
  for (int n = 1; n <= mt_size; n++) {
    char name[64];
    snprintf(name, sizeof name, "n%d-ep1-ba5", n);
    char *dir = dir_for(root, name);
    MPI_Comm cn = first_ranks(n);
    if (cn != MPI_COMM_NULL) {
      prog p;
      ks_error err;
      prog_init(&p, mt_rank, n, 1, n % 2 == 0);
      MT_OK(save(cn, &p, dir, NULL, &err), &err);
      prog_free(&p);
      MPI_Comm_free(&cn);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    for (int m = 1; m <= mt_size; m++) {
      /* Loaded directly at m ranks, and after `keepsake reshard --world-size m` (no MPI). */
      char rname[64];
      snprintf(rname, sizeof rname, "n%d-resharded-m%d", n, m);
      char *resharded = dir_for(root, rname);
      if (mt_rank == 0) {
        char cmd[2048], *out = NULL;
        snprintf(cmd, sizeof cmd, "%s reshard %s --world-size %d %s", KS_CLI_PATH, dir, m, resharded);
        MT_CHECK(ks_test_run(cmd, &out) == 0, "%s: %s", cmd, out ? out : "");
        free(out);
      }
      MPI_Barrier(MPI_COMM_WORLD);
      MPI_Comm cm = first_ranks(m);
      for (int pass = 0; cm != MPI_COMM_NULL && pass < 2; pass++) {
        prog p;
        ks_error err;
        prog_init(&p, mt_rank, m, 0, 0);
        MT_OK(load(cm, &p, pass ? resharded : dir, &err), &err);
        check_tensors(&p);
        check_per_rank(&p, mt_rank, m, n);
        check_global_metrics(cm, &p, n);
        prog_free(&p);
      }
      if (cm != MPI_COMM_NULL) MPI_Comm_free(&cm);
      MPI_Barrier(MPI_COMM_WORLD);
      free(resharded);
    }
    free(dir);
  }
}

static void expect_agreed(ks_status st, ks_status want, const ks_error *err, const char *needle) {
  char buf[1200];
  MT_CHECK(st == want, "status %s, want %s: %s", ks_status_name(st), ks_status_name(want),
           ks_error_format(err, buf, sizeof buf));
  MT_CHECK(mt_same_on_all(ks_checksum(err->message, strlen(err->message))), "ranks disagree: %s", err->message);
  MT_CHECK(!needle || strstr(err->message, needle), "'%s' not in: %s", needle, err->message);
}

/* Runs `keepsake CMD DIR`: the exit status and a piece of its output. */
static void expect_cli(const char *cmd, const char *dir, int status, const char *needle) {
  char line[2048], *out = NULL;
  snprintf(line, sizeof line, "%s %s %s", KS_CLI_PATH, cmd, dir);
  int rc = ks_test_run(line, &out);
  MT_CHECK(rc == status && out && strstr(out, needle), "%s: exit %d (want %d), '%s' not in: %s", line, rc, status,
           needle, out ? out : "");
  free(out);
}

static void test_faults(const char *root) {
  char *good = dir_for(root, "run/ep1-ba4"), *bad = dir_for(root, "run/ep1-ba5"), *run = dir_for(root, "run");
  if (mt_rank == 0) MT_CHECK(mkdir(run, 0777) == 0, "mkdir");
  MPI_Barrier(MPI_COMM_WORLD);
  prog p;
  ks_error err;
  prog_init(&p, mt_rank, mt_size, 1, 0);
  p.ts.batch = 4;
  MT_OK(save(MPI_COMM_WORLD, &p, good, NULL, &err), &err);
  p.ts.batch = 5;
  /* A write failing on the last rank fails every rank's save; no index is written. */
  ks_fault_io fio;
  ks_fault_io_init(&fio, 2);
  ks_status st = save(MPI_COMM_WORLD, &p, bad, mt_rank == mt_size - 1 ? &fio.io : NULL, &err);
  expect_agreed(st, KS_E_IO, &err, NULL);
  char *idx = ks_test_path(bad, KS_SHARD_INDEX_NAME);
  MT_CHECK(!ks_test_exists(idx), "a failed save left an index");
  char *latest = NULL;
  MT_OK(ks_shard_latest(run, NULL, &latest, NULL, &err), &err);
  MT_CHECK(latest && !strcmp(latest, good), "latest is %s, want %s", latest ? latest : "(none)", good);
  free(latest);
  /* Timestamps that differ across ranks. */
  if (mt_size > 1) {
    if (mt_rank == mt_size - 1) p.ts.batch = 6;
    st = save(MPI_COMM_WORLD, &p, bad, NULL, &err);
    expect_agreed(st, KS_E_MISMATCH, &err, "timestamps differ");
    MT_CHECK(!ks_test_exists(idx), "a refused save left an index");
    p.ts.batch = 5;
  }
  MT_OK(save(MPI_COMM_WORLD, &p, bad, NULL, &err), &err);
  MT_CHECK(ks_test_exists(idx), "no index after a good save");
  if (mt_rank == 0) {
    expect_cli("verify", bad, 0, "OK (sharded checkpoint");
    expect_cli("inspect", bad, 0, "sharded tensors (2)");
  }
  /* Corrupt, truncated and missing shards are refused, naming the rank and the file. */
  int victim = mt_size - 1;
  char fname[64], needle[32];
  MT_CHECK(ks_shard_file_name(victim, mt_size, fname, sizeof fname) == KS_OK, "setup");
  snprintf(needle, sizeof needle, "rank %d", victim);
  char *shard = ks_test_path(bad, fname);
  size_t len = 0;
  uint8_t *bytes = NULL;
  if (mt_rank == 0) bytes = ks_test_read_file(shard, &len);
  for (int kind = 0; kind < 3; kind++) {
    if (mt_rank == 0) {
      uint8_t *copy = malloc(len);
      memcpy(copy, bytes, len);
      copy[len - 1] ^= 0x40;
      if (kind == 0) MT_CHECK(ks_test_write_file(shard, copy, len) == 0, "write");
      if (kind == 1) MT_CHECK(ks_test_write_file(shard, bytes, len - 7) == 0, "write");
      if (kind == 2) MT_CHECK(unlink(shard) == 0, "unlink");
      free(copy);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    prog q;
    prog_init(&q, mt_rank, mt_size, 0, 0);
    st = load(MPI_COMM_WORLD, &q, bad, &err);
    static const ks_status want[3] = {KS_E_CHECKSUM, KS_E_FORMAT, KS_E_NOTFOUND};
    static const char *const what[3] = {"corrupt", "truncated", "missing"};
    expect_agreed(st, want[kind], &err, needle);
    MT_CHECK(strstr(err.message, what[kind]) && strstr(err.file, fname), "error does not name the file: %s %s",
             err.file, err.message);
    prog_free(&q);
    if (mt_rank == 0) expect_cli("verify", bad, 1, needle);
    if (mt_rank == 0 && kind == 0) {
      size_t skipped = 0;
      MT_OK(ks_shard_latest(run, NULL, &latest, &skipped, &err), &err);
      MT_CHECK(latest && !strcmp(latest, good) && skipped == 1, "latest should skip the corrupt checkpoint");
      free(latest);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  free(bytes);
  free(shard);
  free(idx);
  prog_free(&p);
  free(good);
  free(bad);
  free(run);
}

/* A ks_io whose writes make this process exit after the first one: a rank dying mid-save. */
static int die_write(void *ctx, int fd, const void *buf, size_t n, size_t *written) {
  (void)ctx;
  static int calls;
  if (calls++ > 0) _exit(9);
  return ks_io_posix()->write_fn(NULL, fd, buf, n / 2, written);
}

/* test_mpi_ckpt --die-mid-save RUN last|all: save RUN/ep1-ba4, then die while saving RUN/ep1-ba5. */
static int die_mid_save(const char *run, const char *who) {
  char *good = dir_for(run, "ep1-ba4"), *bad = dir_for(run, "ep1-ba5");
  if (mt_rank == 0) mkdir(run, 0777);
  MPI_Barrier(MPI_COMM_WORLD);
  prog p;
  ks_error err;
  prog_init(&p, mt_rank, mt_size, 1, 0);
  p.ts.batch = 4;
  MT_OK(save(MPI_COMM_WORLD, &p, good, NULL, &err), &err);
  p.ts.batch = 5;
  ks_io dying = *ks_io_posix();
  dying.write_fn = die_write;
  int dies = !strcmp(who, "all") || mt_rank == mt_size - 1;
  save(MPI_COMM_WORLD, &p, bad, dies ? &dying : NULL, &err);
  fprintf(stderr, "rank %d: the save should not have finished\n", mt_rank);
  return 1;
}

/* test_mpi_ckpt --after-death RUN: the interrupted save left no index; resume from the previous checkpoint. */
static int after_death(const char *run) {
  char *good = dir_for(run, "ep1-ba4"), *bad = dir_for(run, "ep1-ba5");
  char *idx = ks_test_path(bad, KS_SHARD_INDEX_NAME), *latest = NULL;
  MT_CHECK(ks_test_exists(bad) && !ks_test_exists(idx), "the interrupted save left an index (or nothing at all)");
  ks_error err;
  MT_OK(ks_dist_latest(MPI_COMM_WORLD, run, &latest, &err), &err);
  MT_CHECK(latest && !strcmp(latest, good), "resuming from %s, want %s", latest ? latest : "(none)", good);
  prog p;
  prog_init(&p, mt_rank, mt_size, 0, 0);
  MT_OK(load(MPI_COMM_WORLD, &p, latest, &err), &err);
  MT_CHECK(p.ts.batch == 4, "resumed at batch %lld", (long long)p.ts.batch);
  p.ts.batch = 5; /* check_tensors expects batch 5; the tensors are those of batch 4 */
  check_tensors(&p);
  check_per_rank(&p, mt_rank, mt_size, mt_size);
  prog_free(&p);
  free(latest);
  free(idx);
  free(good);
  free(bad);
  if (mt_rank == 0) printf("test_mpi_ckpt: resumed from the last complete checkpoint\n");
  MPI_Finalize();
  return 0;
}

int main(int argc, char **argv) {
  mt_init(&argc, &argv);
  if (argc == 4 && !strcmp(argv[1], "--die-mid-save")) return die_mid_save(argv[2], argv[3]);
  if (argc == 3 && !strcmp(argv[1], "--after-death")) return after_death(argv[2]);
  if (argc == 2) { /* test_mpi_ckpt DIR: only write one checkpoint at this world size, for read_sharded.py */
    prog p;
    ks_error err;
    prog_init(&p, mt_rank, mt_size, 1, 1);
    MT_OK(save(MPI_COMM_WORLD, &p, argv[1], NULL, &err), &err);
    prog_free(&p);
    MPI_Finalize();
    return 0;
  }
  char root[512] = {0};
  if (mt_rank == 0) {
    char *t = ks_test_tmpdir("mpi_ckpt");
    snprintf(root, sizeof root, "%s", t);
    free(t);
  }
  MPI_Bcast(root, sizeof root, MPI_CHAR, 0, MPI_COMM_WORLD);
  test_every_world_size(root);
  test_faults(root);
  MPI_Barrier(MPI_COMM_WORLD);
  if (mt_rank == 0) {
    if (!getenv("KS_TEST_KEEP")) ks_test_rmtree(root); /* KS_TEST_KEEP=1 keeps the checkpoints to look at */
    printf("test_mpi_ckpt: %d ranks ok\n", mt_size);
  }
  MPI_Finalize();
  return 0;
}
