/*
 * Background saves of a 1 GiB state (256 x 4 MiB F32 tensors), against
 * baselines measured in the same run:
 *   - the time the caller is blocked by ks_state_save_async, against memcpy of
 *     the same bytes into warm buffers (the snapshot is that copy);
 *   - the background write's throughput, against raw write()+fsync of the bytes;
 *   - a compute loop's slowdown while a background save runs, and while a
 *     synchronous save runs, against the same loop alone.
 * Every timed save writes a new checkpoint file: the previous one is removed
 * outside the timed region, as the raw baseline removes its file. A manager
 * saves under a new name each time and deletes old checkpoints separately; a
 * save that replaced a 1 GiB file would also time the kernel freeing the old
 * file's blocks at the rename, which the baseline never pays.
 * It measures; it does not pass or fail.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "benchutil.h"
#include "keepsake/keepsake.h"

#define N_TENSORS 256
#define TENSOR_FLOATS (1u << 20) /* 4 MiB each */
#define REPS 3

static const char *tmp_dir(void) {
  const char *d = getenv("KS_BENCH_TMP");
  return d && *d ? d : "/tmp";
}

typedef struct model {
  float *w[N_TENSORS];
  int64_t shape[1];
  ks_state *st;
} model;

static int model_init(model *m) {
  m->shape[0] = TENSOR_FLOATS;
  if (ks_state_create("bench", 1, NULL, &m->st, NULL)) return -1;
  for (int i = 0; i < N_TENSORS; i++) {
    m->w[i] = malloc(sizeof(float) * TENSOR_FLOATS);
    if (!m->w[i]) return -1;
    for (size_t j = 0; j < TENSOR_FLOATS; j++) m->w[i][j] = (float)(i + 1) * 1e-3f + (float)j;
    char name[32];
    snprintf(name, sizeof name, "layer%03d.weight", i);
    ks_tensor t;
    if (ks_tensor_init(&t, KS_F32, 1, m->shape, m->w[i]) || ks_state_add_tensor(m->st, name, &t, NULL)) return -1;
  }
  return 0;
}

static void model_free(model *m) {
  ks_state_free(m->st);
  for (int i = 0; i < N_TENSORS; i++) free(m->w[i]);
}

static double bytes_total(void) { return (double)N_TENSORS * TENSOR_FLOATS * sizeof(float); }

/* memcpy of every tensor into warm destination buffers (touched once before timing). */
static double time_memcpy_warm(const model *m, float **dst) {
  for (int i = 0; i < N_TENSORS; i++) memcpy(dst[i], m->w[i], sizeof(float) * TENSOR_FLOATS);
  double best = -1;
  for (int r = 0; r < REPS; r++) {
    double t0 = ks_bench_now();
    for (int i = 0; i < N_TENSORS; i++) memcpy(dst[i], m->w[i], sizeof(float) * TENSOR_FLOATS);
    double t = ks_bench_now() - t0;
    if (best < 0 || t < best) best = t;
  }
  return best;
}

static double time_raw_write_fsync(const model *m, const char *path) {
  double t0 = ks_bench_now();
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return -1;
  for (int i = 0; i < N_TENSORS; i++)
    if (write(fd, m->w[i], sizeof(float) * TENSOR_FLOATS) < 0) break;
  fsync(fd);
  close(fd);
  double t = ks_bench_now() - t0;
  unlink(path);
  return t;
}

/* A compute loop: `iters` passes of a multiply-add over a 1 MiB working set (cache resident). */
static double compute_loop(int iters) {
  static float v[1 << 18];
  double t0 = ks_bench_now();
  float acc = 0;
  for (int it = 0; it < iters; it++)
    for (size_t j = 0; j < sizeof v / sizeof v[0]; j++) acc += v[j] = v[j] * 0.999f + 1e-3f;
  ks_bench_sink(acc);
  return ks_bench_now() - t0;
}

typedef struct res {
  double memcpy_s, raw_write_s, async_block_s, async_total_s, sync_s;
  double loop_alone_s, loop_async_s, loop_sync_s;
} res;

static void measure_async(model *m, const char *path, res *r) {
  ks_async_saver *sv = NULL;
  if (ks_async_saver_create(NULL, &sv, NULL)) return;
  r->async_block_s = r->async_total_s = -1;
  for (int rep = 0; rep < REPS + 1; rep++) { /* the first rep grows the staging buffer: not counted */
    unlink(path); /* a new checkpoint, as the baseline writes a new file (see fresh_target) */
    double t0 = ks_bench_now();
    if (ks_state_save_async(sv, m->st, path, NULL, NULL)) break;
    double blocked = ks_bench_now() - t0;
    if (ks_async_saver_wait(sv, NULL)) break;
    double total = ks_bench_now() - t0;
    if (rep && (r->async_block_s < 0 || blocked < r->async_block_s)) r->async_block_s = blocked;
    if (rep && (r->async_total_s < 0 || total < r->async_total_s)) r->async_total_s = total;
  }
  /* The loop while a background save runs: start it, run the loop, then wait. */
  unlink(path);
  if (!ks_state_save_async(sv, m->st, path, NULL, NULL)) {
    r->loop_async_s = compute_loop(400);
    if (ks_async_saver_wait(sv, NULL)) r->loop_async_s = -1; /* reported as not measured */
  }
  ks_async_saver_free(sv);
}

static void measure_sync(model *m, const char *path, res *r) {
  r->sync_s = -1;
  for (int rep = 0; rep < REPS; rep++) {
    unlink(path);
    double t0 = ks_bench_now();
    if (ks_state_save(m->st, path, NULL, NULL)) return;
    double t = ks_bench_now() - t0;
    if (r->sync_s < 0 || t < r->sync_s) r->sync_s = t;
  }
  /* The same loop with a synchronous save in the middle: the save's time is the loop's stall. */
  unlink(path);
  double t0 = ks_bench_now();
  compute_loop(200);
  ks_status st = ks_state_save(m->st, path, NULL, NULL);
  compute_loop(200);
  r->loop_sync_s = st ? -1 : ks_bench_now() - t0; /* -1: not measured */
}

static void report(const res *r) {
  double gib = bytes_total() / (1024.0 * 1024 * 1024);
  printf("%-46s %10s %10s  %s\n", "case (1 GiB state)", "seconds", "GiB/s", "ratio");
  printf("%-46s %10.4f %10.2f\n", "memcpy into warm buffers", r->memcpy_s, gib / r->memcpy_s);
  printf("%-46s %10.4f %10.2f  %.2fx of memcpy (goal <= 1.2x)\n", "async save: caller blocked", r->async_block_s,
         gib / r->async_block_s, r->async_block_s / r->memcpy_s);
  printf("%-46s %10.4f %10.2f\n", "raw write()+fsync", r->raw_write_s, gib / r->raw_write_s);
  double bg = r->async_total_s - r->async_block_s;
  printf("%-46s %10.4f %10.2f  %.2fx of raw write+fsync (goal >= 0.8x)\n", "async save: background write", bg,
         gib / bg, r->raw_write_s / bg);
  printf("%-46s %10.4f %10.2f  %.2fx of raw write+fsync\n", "sync save (ks_state_save)", r->sync_s, gib / r->sync_s,
         r->raw_write_s / r->sync_s);
  printf("%-46s %10.4f\n", "compute loop alone (400 passes)", r->loop_alone_s);
  printf("%-46s %10.4f             %.2fx of alone\n", "  same, with a background save running", r->loop_async_s,
         r->loop_async_s / r->loop_alone_s);
  printf("%-46s %10.4f             %.2fx of alone\n", "  same, with a synchronous save in the middle",
         r->loop_sync_s, r->loop_sync_s / r->loop_alone_s);
  printf("  ratios: async_block/memcpy=%.2f async_bg/raw_write_fsync=%.2f sync/raw_write_fsync=%.2f "
         "loop_async/alone=%.2f loop_sync/alone=%.2f\n",
         r->async_block_s / r->memcpy_s, r->raw_write_s / bg, r->raw_write_s / r->sync_s,
         r->loop_async_s / r->loop_alone_s, r->loop_sync_s / r->loop_alone_s);
}

int main(void) {
  model m;
  memset(&m, 0, sizeof m);
  float **dst = calloc(N_TENSORS, sizeof *dst);
  if (!dst || model_init(&m)) return 1;
  for (int i = 0; i < N_TENSORS; i++)
    if (!(dst[i] = malloc(sizeof(float) * TENSOR_FLOATS))) return 1;
  char path[512], raw[512];
  snprintf(path, sizeof path, "%s/async.keepsake", tmp_dir());
  snprintf(raw, sizeof raw, "%s/raw-async.bin", tmp_dir());
  printf("bench_async: background saves vs memcpy and raw write+fsync (dir %s)\n", tmp_dir());
  res r = {0};
  r.memcpy_s = time_memcpy_warm(&m, dst);
  r.raw_write_s = -1;
  for (int rep = 0; rep < REPS; rep++) {
    double t = time_raw_write_fsync(&m, raw);
    if (r.raw_write_s < 0 || t < r.raw_write_s) r.raw_write_s = t;
  }
  compute_loop(50); /* warm */
  r.loop_alone_s = compute_loop(400);
  measure_async(&m, path, &r);
  measure_sync(&m, path, &r);
  unlink(path);
  report(&r);
  for (int i = 0; i < N_TENSORS; i++) free(dst[i]);
  free(dst);
  model_free(&m);
  return 0;
}
