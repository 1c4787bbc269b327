#include "benchutil.h"

#include "io_nosync.h" /* internal: resolved in keepsake_static, see src/core/nosync/ */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static volatile double sink;

const ks_io *ks_bench_io_nosync(void) { return ks__io_posix_nosync(); }

void ks_bench_sink(double v) { sink += v; }

double ks_bench_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double ks_bench_cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double ks_bench_gibps(double bytes, double seconds) {
  return seconds > 0 ? bytes / seconds / (1024.0 * 1024.0 * 1024.0) : 0.0;
}

double ks_bench_read_bandwidth(size_t bytes, int reps) {
  size_t n = bytes / sizeof(uint64_t);
  uint64_t *buf = malloc(n * sizeof *buf);
  if (!buf) return 0;
  for (size_t i = 0; i < n; i++) buf[i] = i;
  double best = 1e30;
  for (int r = 0; r < reps; r++) {
    double t0 = ks_bench_now();
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (size_t i = 0; i + 4 <= n; i += 4) {
      a += buf[i];
      b += buf[i + 1];
      c += buf[i + 2];
      d += buf[i + 3];
    }
    double t = ks_bench_now() - t0;
    ks_bench_sink((double)(a + b + c + d));
    if (t < best) best = t;
  }
  free(buf);
  return ks_bench_gibps((double)(n * sizeof(uint64_t)), best);
}

double ks_bench_memcpy_bandwidth(size_t bytes, int reps) {
  char *src = malloc(bytes), *dst = malloc(bytes);
  if (!src || !dst) {
    free(src);
    free(dst);
    return 0;
  }
  memset(src, 1, bytes);
  memset(dst, 0, bytes);
  double best = 1e30;
  for (int r = 0; r < reps; r++) {
    double t0 = ks_bench_now();
    memcpy(dst, src, bytes);
    double t = ks_bench_now() - t0;
    ks_bench_sink(dst[bytes / 2]);
    if (t < best) best = t;
  }
  free(src);
  free(dst);
  return ks_bench_gibps((double)bytes, best);
}
