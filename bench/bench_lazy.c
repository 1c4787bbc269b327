/*
 * Lazy (ranged) reading of a 1 GiB checkpoint through a table that cannot map
 * and counts its reads, the shape of a remote store where every read_fn is a
 * ranged GET: bytes and calls to open, to fetch one tensor, and to load it all;
 * the lazy full load's throughput (parallel ranges, checksums verified on
 * arrival) against the mapped and copied loads of the same file with the same
 * verification, in the same run; and a second load through the caching table.
 * Reads are from the page cache (the file was just written).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "benchutil.h"
#include "keepsake/binding.h"
#include "keepsake/io_cache.h"
#include "keepsake/keepsake.h"

/* ks_reader_fetch of the tensor named `name` (KS_E_NOTFOUND when there is none). */
static ks_status fetch_name(const ks_reader *r, const char *name, void *buf, size_t cap, ks_error *err) {
  long i = ks_reader_find(r, name);
  return ks_reader_fetch(r, i < 0 ? SIZE_MAX : (size_t)i, buf, cap, err);
}

#define N_BIG 256
#define BIG_ELEMS ((size_t)1 << 20) /* 4 MiB of F32 */
#define REPS 3

static const char *tmp_dir(void) {
  const char *d = getenv("KS_BENCH_TMP");
  return d && *d ? d : "/tmp";
}

static int make_file(const char *path) {
  ks_statedict *sd;
  if (ks_statedict_create(NULL, &sd, NULL)) return -1;
  int64_t shape[1] = {(int64_t)BIG_ELEMS};
  char name[64];
  for (int i = 0; i < N_BIG; i++) {
    float *p;
    snprintf(name, sizeof name, "model/layer%03d/weight", i);
    if (ks_statedict_new_tensor(sd, name, KS_F32, 1, shape, (void **)&p, NULL)) return -1;
    for (size_t k = 0; k < BIG_ELEMS; k++) p[k] = (float)((k * 2654435761u + (size_t)i) & 0xffff);
  }
  int64_t small[1] = {16};
  float *b;
  if (ks_statedict_new_tensor(sd, "model/head/bias", KS_F32, 1, small, (void **)&b, NULL)) return -1;
  for (int k = 0; k < 16; k++) b[k] = (float)k;
  ks_save_opts so = {.io = ks_bench_io_nosync()};
  ks_error e;
  ks_status st = ks_save(path, sd, NULL, &so, &e);
  if (st) fprintf(stderr, "save failed: %s\n", e.message);
  ks_statedict_free(sd);
  return st ? -1 : 0;
}

/* Best wall time of a verified ks_load in `mode` through `io`. */
static double time_load(const char *path, ks_read_mode mode, const ks_io *io) {
  double best = -1;
  for (int rep = 0; rep < REPS; rep++) {
    ks_read_opts o = {.mode = mode, .io = io, .verify_checksums = 1};
    ks_statedict *sd = NULL;
    ks_error e;
    double t0 = ks_bench_now();
    ks_status st = ks_load(path, &o, &sd, NULL, &e);
    double t = ks_bench_now() - t0;
    if (st) {
      fprintf(stderr, "load failed: %s\n", e.message);
      return -1;
    }
    ks_statedict_free(sd);
    if (best < 0 || t < best) best = t;
  }
  return best;
}

static void count_row(const char *what, const ks_io *io) {
  ks_io_counts c;
  ks_io_counter_get(io, &c);
  printf("  %-36s %12llu bytes in %4llu read calls\n", what, (unsigned long long)c.read_bytes,
         (unsigned long long)c.read_calls);
}

static int lazy_counts(const char *path, const ks_io *io) {
  ks_read_opts o = {.mode = KS_READ_LAZY, .io = io};
  ks_reader *r;
  ks_error e;
  ks_io_counter_reset(io);
  if (ks_reader_open(path, &o, &r, &e)) {
    fprintf(stderr, "open failed: %s\n", e.message);
    return -1;
  }
  count_row("lazy open (header)", io);
  float bias[16];
  ks_io_counter_reset(io);
  if (fetch_name(r, "model/head/bias", bias, sizeof bias, &e)) return -1;
  count_row("fetch 64-byte tensor", io);
  float *w = malloc(BIG_ELEMS * sizeof *w);
  ks_io_counter_reset(io);
  ks_status st = w ? fetch_name(r, "model/layer128/weight", w, BIG_ELEMS * sizeof *w, &e) : KS_E_NOMEM;
  free(w);
  if (st) return -1;
  count_row("fetch 4 MiB tensor", io);
  ks_reader_free(r);
  return 0;
}

static void speed_row(const char *what, double bytes, double secs, const char *vs, double base) {
  printf("  %-36s %9.1f ms %7.2f GiB/s", what, secs * 1e3, ks_bench_gibps(bytes, secs));
  if (vs && base > 0) printf("   %5.2fx the speed of %s", base / secs, vs);
  printf("\n");
}

int main(void) {
  char path[4096], cache_dir[4096];
  snprintf(path, sizeof path, "%s/lazy.keepsake", tmp_dir());
  snprintf(cache_dir, sizeof cache_dir, "%s/lazy-cache", tmp_dir());
  printf("bench_lazy: lazy ranged reads of a 1 GiB checkpoint through a table that cannot map (dir %s)\n", tmp_dir());
  if (make_file(path)) return 1;
  ks_io *counter = NULL, *cache = NULL;
  if (ks_io_counter_create(NULL, 1, NULL, &counter, NULL)) return 1;
  if (lazy_counts(path, counter)) return 1;
  double bytes = (double)N_BIG * (double)(BIG_ELEMS * 4);
  double mapped = time_load(path, KS_READ_MMAP, NULL);
  double copied = time_load(path, KS_READ_COPY, NULL);
  ks_io_counter_reset(counter);
  double lazy = time_load(path, KS_READ_LAZY, counter);
  ks_io_counts c;
  ks_io_counter_get(counter, &c);
  printf("  lazy full load: %llu bytes in %llu read calls per load (%d loads)\n",
         (unsigned long long)(c.read_bytes / REPS), (unsigned long long)(c.read_calls / REPS), REPS);
  printf("  full verified loads (best of %d):\n", REPS);
  speed_row("mapped load + verify", bytes, mapped, NULL, 0);
  speed_row("copy load + verify", bytes, copied, NULL, 0);
  speed_row("lazy load (parallel ranges)", bytes, lazy, "the mapped load", mapped);
  if (ks_io_cache_create(counter, cache_dir, NULL, &cache, NULL)) return 1;
  ks_read_opts o = {.mode = KS_READ_LAZY, .io = cache};
  ks_statedict *sd = NULL;
  double t0 = ks_bench_now();
  if (ks_load(path, &o, &sd, NULL, NULL)) return 1;
  double first = ks_bench_now() - t0;
  ks_statedict_free(sd);
  ks_io_counter_reset(counter);
  t0 = ks_bench_now();
  if (ks_load(path, &o, &sd, NULL, NULL)) return 1;
  double second = ks_bench_now() - t0;
  ks_statedict_free(sd);
  speed_row("through the cache, first (fills it)", bytes, first, NULL, 0);
  speed_row("through the cache, second", bytes, second, "the mapped load", mapped);
  count_row("inner table reads of the second", counter);
  ks_io_cache_free(cache);
  ks_io_counter_free(counter);
  char cmd[8300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", cache_dir, path);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", cache_dir);
  return 0;
}
