/*
 * Sharded checkpoint throughput over MPI against raw I/O of the same bytes on
 * the same disk: with 1, 2 and 4 ranks, every rank saves 64 MiB (its chunks of
 * four sharded tensors) with ks_dist_save, and every rank writes the same
 * number of bytes with write()+fsync to its own file, all at once. Loading
 * compares ks_dist_load (with and without verifying the whole-file checksums)
 * to read() of each rank's file into fresh memory. Reads come from the page
 * cache (the files were just written). Best of 3 (slowest rank of each); ratios
 * are keepsake's throughput over the raw baseline's.
 *
 * Run without arguments it starts itself under mpirun for each world size.
 */
#include <fcntl.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "benchutil.h"
#include "keepsake/dist.h"
#include "keepsake/keepsake.h"

#define TENSORS 4
#define ROWS_PER_RANK 4096
#define COLS 1024 /* 4096 x 1024 F32 = 16 MiB per tensor per rank */
#define REPS 3

static int rank, size;

static const char *tmp_dir(void) {
  const char *d = getenv("KS_BENCH_TMP");
  return d && *d ? d : "/tmp";
}

/* Times fn on every rank between barriers; the slowest rank counts. */
static double timed(void (*fn)(void *), void *ctx) {
  double best = 1e30;
  for (int r = 0; r < REPS; r++) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = ks_bench_now();
    fn(ctx);
    double dt = ks_bench_now() - t0, worst;
    MPI_Allreduce(&dt, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (worst < best) best = worst;
  }
  return best;
}

typedef struct job {
  ks_statedict *sd;
  ks_shard_map *map;
  char dir[512], raw[512];
  float *buf;
  size_t bytes;
} job;

static void die(const char *what, const ks_error *err) {
  fprintf(stderr, "rank %d: %s failed: %s\n", rank, what, err ? err->message : "");
  MPI_Abort(MPI_COMM_WORLD, 1);
}

static void ks_save_job(void *p) {
  job *j = p;
  ks_error err;
  if (ks_dist_save(MPI_COMM_WORLD, j->dir, j->sd, NULL, j->map, NULL, &err)) die("ks_dist_save", &err);
}

static void load_job(job *j, int no_verify) {
  ks_statedict *sd;
  ks_meta *meta;
  ks_error err;
  ks_shard_load_opts o = {.no_verify = no_verify};
  if (ks_dist_load(MPI_COMM_WORLD, j->dir, j->map, &o, &sd, &meta, &err)) die("ks_dist_load", &err);
  ks_statedict_free(sd);
  ks_meta_free(meta);
}
static void ks_load_job(void *p) { load_job(p, 0); }
static void ks_load_noverify_job(void *p) { load_job(p, 1); }

static void raw_write_job(void *p) {
  job *j = p;
  int fd = open(j->raw, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  size_t done = 0;
  while (fd >= 0 && done < j->bytes) {
    ssize_t n = write(fd, (char *)j->buf + done, j->bytes - done);
    if (n <= 0) die("write", NULL);
    done += (size_t)n;
  }
  if (fd < 0 || fsync(fd) || close(fd)) die("raw write", NULL);
}

/* Into fresh memory, as a load must produce new buffers too. */
static void raw_read_job(void *p) {
  job *j = p;
  char *dst = malloc(j->bytes);
  int fd = open(j->raw, O_RDONLY);
  size_t done = 0;
  while (dst && fd >= 0 && done < j->bytes) {
    ssize_t n = read(fd, dst + done, j->bytes - done);
    if (n <= 0) die("read", NULL);
    done += (size_t)n;
  }
  if (!dst || fd < 0 || close(fd)) die("raw read", NULL);
  free(dst);
}

static void setup(job *j) {
  size_t elems = (size_t)ROWS_PER_RANK * COLS;
  j->bytes = elems * TENSORS * sizeof(float);
  j->buf = malloc(j->bytes);
  if (!j->buf) die("malloc", NULL);
  for (size_t i = 0; i < elems * TENSORS; i++) j->buf[i] = (float)(i % 1000) * 0.5f;
  if (ks_statedict_create(NULL, &j->sd, NULL) || ks_shard_map_create(NULL, &j->map, NULL)) die("setup", NULL);
  int64_t g[2] = {(int64_t)ROWS_PER_RANK * size, COLS}, off[2], shape[2];
  ks_shard_split_dim0(2, g, rank, size, off, shape);
  for (int t = 0; t < TENSORS; t++) {
    char name[64];
    snprintf(name, sizeof name, "state/model/layer%d", t);
    ks_tensor x;
    if (ks_tensor_init(&x, KS_F32, 2, shape, j->buf + (size_t)t * elems) ||
        ks_statedict_set_tensor(j->sd, name, &x, KS_BORROW, NULL) ||
        ks_shard_map_add(j->map, name, 2, g, off, shape, NULL))
      die("setup", NULL);
  }
  snprintf(j->dir, sizeof j->dir, "%s/bench-dist-np%d", tmp_dir(), size);
  snprintf(j->raw, sizeof j->raw, "%s/bench-dist-raw-np%d-r%d.bin", tmp_dir(), size, rank);
}

static int worker(void) {
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  job j;
  memset(&j, 0, sizeof j);
  setup(&j);
  double raw_w = timed(raw_write_job, &j), ks_w = timed(ks_save_job, &j);
  double raw_r = timed(raw_read_job, &j), ks_r = timed(ks_load_job, &j), ks_rn = timed(ks_load_noverify_job, &j);
  double total = (double)j.bytes * size;
  if (rank == 0) {
    printf("  %d rank%s (%4.0f MiB)  save %5.2f GiB/s = %.2fx of raw write+fsync (%5.2f GiB/s)   "
           "load %5.2f GiB/s = %.2fx of raw read (%5.2f GiB/s); without verifying %5.2f GiB/s = %.2fx\n",
           size, size == 1 ? " " : "s", total / (1 << 20), ks_bench_gibps(total, ks_w), raw_w / ks_w,
           ks_bench_gibps(total, raw_w), ks_bench_gibps(total, ks_r), raw_r / ks_r, ks_bench_gibps(total, raw_r),
           ks_bench_gibps(total, ks_rn), raw_r / ks_rn);
    fflush(stdout);
  }
  unlink(j.raw);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", j.dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", j.dir);
  }
  ks_statedict_free(j.sd);
  ks_shard_map_free(j.map);
  free(j.buf);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 2 && !strcmp(argv[1], "--worker")) {
    MPI_Init(&argc, &argv);
    int rc = worker();
    MPI_Finalize();
    return rc;
  }
  printf("bench_dist: sharded save/load over MPI vs raw I/O of the same bytes (dir %s; best of %d, slowest rank)\n",
         tmp_dir(), REPS);
  fflush(stdout);
  static const int worlds[] = {1, 2, 4};
  for (size_t i = 0; i < sizeof worlds / sizeof worlds[0]; i++) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s --oversubscribe --allow-run-as-root -np %d '%s' --worker", KS_MPIEXEC, worlds[i],
             argv[0]);
    if (system(cmd) != 0) {
      fprintf(stderr, "bench_dist: %s failed\n", cmd);
      return 1;
    }
  }
  return 0;
}
