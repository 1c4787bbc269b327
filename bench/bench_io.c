/*
 * Save and load throughput of keepsake files against baselines measured in the
 * same run: raw write()+fsync / read() of the same bytes, memcpy, the previous
 * writer (one thread, hashing each piece just before writing it, always through
 * the page cache), and torch.save / torch.load through /usr/bin/python3 (skipped
 * when torch is absent, and for the GPT-2 shapes, which its script does not build).
 *
 * Cases: GPT-2 small shapes (148 F32 tensors, 475 MiB), 256 tensors of 4 MiB (1 GiB),
 * and 100,000 tensors of 64 bytes. Every repetition times every row once, in turn,
 * so a load on the machine falls on all of them alike; each row is the best of N.
 * Reads are from the page cache on both sides (the file was just written or read).
 *
 *   bench_io [--quick] [--case gpt2|large|many-small] [--reps N]
 */
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "benchutil.h"
#include "format/fmt_internal.h" /* ks__save_tuned: the previous writer, side by side */
#include "keepsake/format.h"
#include "keepsake/keepsake.h"

typedef struct bench_case {
  const char *name, *label;
  size_t count;
  size_t elems[200];                                    /* per tensor when count <= 200, else elems[0] each */
  int64_t rows[200];                                   /* first dimension (0: 1-D) */
  int reps;
  int torch; /* the torch script builds count tensors of elems[0] */
} bench_case;

typedef struct results {
  double raw_write, ks_save, prev_save, raw_write_nosync, ks_save_nosync, prev_save_nosync;
  double raw_read, raw_read_warm, memcpy_s, ks_load_copy, ks_load_copy_noverify, ks_open_mmap, ks_verify;
  double fetch_mmap, fetch_lazy, fetch_one_thread, state_load;
  double torch_save, torch_load, torch_load_first; /* < 0 when skipped */
} results;

#define N_TIMES (sizeof(results) / sizeof(double))
/* The best wall time of each row and, apart, the best CPU time. */
typedef struct bests {
  results wall, cpu;
} bests;

/* Each timed region: wall time (returned) and the process's CPU time (all threads, in last_cpu),
   which stays meaningful when other programs share the machine. */
static double cpu_at_start, last_cpu;

static double start(void) {
  cpu_at_start = ks_bench_cpu_now();
  return ks_bench_now();
}

static double stop(double t0) {
  double t = ks_bench_now() - t0;
  last_cpu = ks_bench_cpu_now() - cpu_at_start;
  return t;
}

static const char *tmp_dir(void) {
  const char *d = getenv("KS_BENCH_TMP");
  return d && *d ? d : "/tmp";
}

static size_t case_elems(const bench_case *c, size_t i) { return c->count <= 200 ? c->elems[i] : c->elems[0]; }

static size_t case_total(const bench_case *c) {
  size_t n = 0;
  for (size_t i = 0; i < c->count; i++) n += case_elems(c, i);
  return n;
}

static float *make_payload(size_t n) {
  float *p = malloc(n * sizeof *p);
  if (!p) return NULL;
  uint32_t x = 12345;
  for (size_t i = 0; i < n; i++) {
    x = x * 1664525u + 1013904223u;
    p[i] = (float)(x >> 8) * 0x1p-24f;
  }
  return p;
}

static void tensor_of(const bench_case *c, size_t i, float *data, ks_tensor *t) {
  size_t e = case_elems(c, i);
  int64_t rows = c->count <= 200 ? c->rows[i] : 0;
  int64_t shape[2] = {rows ? rows : (int64_t)e, rows ? (int64_t)e / rows : 1};
  if (ks_tensor_init(t, KS_F32, rows ? 2 : 1, shape, data)) abort(); /* fixed, valid shape: cannot fail */
}

static ks_statedict *make_dict(const bench_case *c, float *payload) {
  ks_statedict *sd;
  if (ks_statedict_create(NULL, &sd, NULL)) return NULL;
  char name[64];
  for (size_t i = 0, off = 0; i < c->count; off += case_elems(c, i), i++) {
    ks_tensor t;
    snprintf(name, sizeof name, "t/%zu", i);
    tensor_of(c, i, payload + off, &t);
    if (ks_statedict_set_tensor(sd, name, &t, KS_BORROW, NULL)) {
      ks_statedict_free(sd);
      return NULL;
    }
  }
  return sd;
}

/* The same tensors registered in a ks_state over `dst` (a warm buffer): ks_state_load's in-place load. */
static ks_state *make_state(const bench_case *c, float *dst) {
  ks_state *st;
  if (ks_state_create("bench", 1, NULL, &st, NULL)) return NULL;
  char name[64];
  for (size_t i = 0, off = 0; i < c->count; off += case_elems(c, i), i++) {
    ks_tensor t;
    snprintf(name, sizeof name, "t.%zu", i);
    tensor_of(c, i, dst + off, &t);
    if (ks_state_add_tensor(st, name, &t, NULL)) {
      ks_state_free(st);
      return NULL;
    }
  }
  return st;
}

static double time_raw_write(const char *path, const void *buf, size_t n, int sync) {
  unlink(path); /* a new file, as the durable save writes: neither side frees the old one's pages */
  double t0 = start();
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return -1;
  size_t off = 0;
  while (off < n) {
    ssize_t w = write(fd, (const char *)buf + off, n - off > (1u << 26) ? 1u << 26 : n - off);
    if (w <= 0) break;
    off += (size_t)w;
  }
  if (sync) fsync(fd);
  close(fd);
  return stop(t0);
}

/* read() into memory that is already faulted in: the kernel's copy speed alone. */
static double time_raw_read_warm(const char *path, void *buf, size_t n) {
  double t0 = start();
  int fd = open(path, O_RDONLY);
  if (fd < 0) return -1;
  size_t off = 0;
  ssize_t r;
  while (off < n && (r = read(fd, (char *)buf + off, n - off)) > 0) off += (size_t)r;
  close(fd);
  return stop(t0);
}

/* Like a loader: fresh memory each time, so page faults count on both sides. */
static double time_raw_read(const char *path, size_t n) {
  double t0 = ks_bench_now(), c0 = ks_bench_cpu_now();
  char *buf = malloc(n);
  if (!buf) return -1;
  double t = time_raw_read_warm(path, buf, n) < 0 ? -1 : ks_bench_now() - t0;
  last_cpu = ks_bench_cpu_now() - c0;
  ks_bench_sink(buf[n / 2]);
  free(buf);
  return t;
}

/* ks_save (prev = 0), or the previous writer: one thread, buffered, each piece hashed just before it is
   written, with XXH3 as compiled for the baseline CPU. */
static double time_save(const char *path, const ks_statedict *sd, int sync, int prev) {
  ks_error err;
  ks_save_opts o = {.io = sync ? NULL : ks_bench_io_nosync()};
  ks__save_tuning previous = {.threads = 1, .direct = -1, .baseline_hash = 1};
  unlink(path);
  double t0 = start();
  if (ks__save_tuned(path, sd, NULL, &o, prev ? &previous : NULL, &err)) {
    fprintf(stderr, "save failed: %s\n", err.message);
    return -1;
  }
  return stop(t0);
}

static double time_open(const char *path, ks_read_mode mode, int verify) {
  ks_read_opts o = {.mode = mode, .verify_checksums = verify};
  ks_reader *r;
  ks_error err;
  double t0 = start();
  if (ks_reader_open(path, &o, &r, &err)) {
    fprintf(stderr, "open failed: %s\n", err.message);
    return -1;
  }
  double t = stop(t0);
  ks_tensor v;
  const char *name;
  if (ks_reader_count(r) && !ks_reader_tensor_at(r, 0, &name, &v)) ks_bench_sink(((const float *)v.data)[0]);
  ks_reader_free(r);
  return t;
}

/* Every tensor into the caller's (warm) memory, each verified: open, fetch all, close. */
static double time_fetch(const char *path, ks_read_mode mode, unsigned threads, const bench_case *c, float *dst) {
  ks_read_opts o = {.mode = mode};
  ks_reader *r;
  ks_error err;
  ks_fetch *jobs = malloc(c->count * sizeof *jobs);
  if (!jobs) return -1;
  double t0 = start();
  if (ks_reader_open(path, &o, &r, &err)) {
    fprintf(stderr, "open failed: %s\n", err.message);
    free(jobs);
    return -1;
  }
  for (size_t i = 0, off = 0; i < c->count; off += case_elems(c, i), i++)
    jobs[i] = (ks_fetch){i, dst + off, case_elems(c, i) * sizeof(float)};
  ks_status st = ks_reader_fetch_many(r, jobs, c->count, threads, &err);
  ks_reader_free(r);
  double t = stop(t0);
  free(jobs);
  if (st) fprintf(stderr, "fetch failed: %s\n", err.message);
  return st ? -1 : t;
}

static double time_state_load(const char *path, ks_state *st) {
  ks_load_opts o = {.verify_checksums = 1};
  ks_error err;
  double t0 = start();
  if (ks_state_load(st, path, &o, NULL, &err)) {
    fprintf(stderr, "state load failed: %s\n", err.message);
    return -1;
  }
  return stop(t0);
}

static double best(double a, double b) { return a < 0 ? b : (b < 0 || a < b ? a : b); }

/* Keeps the best of the row's times so far: t (wall) and last_cpu. */
#define KEEP(f)                                                                                                  \
  (res->wall.f = best(r ? res->wall.f : -1, t), res->cpu.f = best(r ? res->cpu.f : -1, t < 0 ? -1 : last_cpu))

static void run_torch(const bench_case *c, results *res) {
  res->torch_save = res->torch_load = res->torch_load_first = -1;
  if (!c->torch) return;
  if (system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0) {
    printf("  torch baseline skipped: /usr/bin/python3 cannot import torch\n");
    return;
  }
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/bench/torch_baseline.py %zu %zu %s %d", KS_SOURCE_DIR, c->count,
           c->elems[0], tmp_dir(), c->reps);
  FILE *p = popen(cmd, "r");
  if (!p) return;
  char line[256];
  while (fgets(line, sizeof line, p)) /* drain everything so the child never sees EPIPE */
    sscanf(line, "save_s=%lf load_s=%lf first_load_s=%lf", &res->torch_save, &res->torch_load,
           &res->torch_load_first);
  if (pclose(p) != 0) res->torch_save = res->torch_load = res->torch_load_first = -1;
}

/* 0 when both files hold the same bytes. */
static int compare_files(const char *a, const char *b) {
  FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
  int diff = !fa || !fb;
  char x[65536], y[65536];
  while (!diff) {
    size_t na = fread(x, 1, sizeof x, fa), nb = fread(y, 1, sizeof y, fb);
    diff = na != nb || memcmp(x, y, na) != 0;
    if (na == 0) break;
  }
  if (fa) fclose(fa);
  if (fb) fclose(fb);
  return diff;
}

static void measure(const bench_case *c, bests *res, const ks_statedict *sd, const float *payload,
                    size_t payload_bytes) {
  char raw_path[512], ks_path[512], prev_path[512], state_path[512];
  snprintf(raw_path, sizeof raw_path, "%s/raw.bin", tmp_dir());
  snprintf(ks_path, sizeof ks_path, "%s/bench.keepsake", tmp_dir());
  snprintf(prev_path, sizeof prev_path, "%s/bench-prev.keepsake", tmp_dir());
  snprintf(state_path, sizeof state_path, "%s/bench-state.keepsake", tmp_dir());
  float *buf = malloc(payload_bytes ? payload_bytes : 1);
  if (!buf) return;
  memset(buf, 0, payload_bytes); /* warm: every page faulted in before anything is timed */
  ks_state *st = make_state(c, buf);
  memset(res, 0xff, sizeof *res); /* all -nan until measured */
  double t;
  for (int r = 0; r < c->reps; r++) {
    /* Each write starts with no dirty pages, so none pays for the previous one's writeback. */
    sync();
    t = time_raw_write(raw_path, payload, payload_bytes, 0);
    KEEP(raw_write_nosync);
    sync();
    t = time_save(ks_path, sd, 0, 0);
    KEEP(ks_save_nosync);
    sync();
    t = time_save(prev_path, sd, 0, 1);
    KEEP(prev_save_nosync);
    sync();
    t = time_raw_write(raw_path, payload, payload_bytes, 1);
    KEEP(raw_write);
    sync();
    t = time_save(prev_path, sd, 1, 1);
    KEEP(prev_save);
    sync();
    t = time_save(ks_path, sd, 1, 0);
    KEEP(ks_save);
    if (r == 0 && compare_files(ks_path, prev_path))
      fprintf(stderr, "bench_io: ks_save and the previous writer differ!\n");
    /* The loads read a file in the page cache: a direct write left none of it there. */
    time_raw_read_warm(ks_path, buf, payload_bytes);
    time_raw_read_warm(ks_path, buf, payload_bytes);
    t = time_raw_read(raw_path, payload_bytes);
    KEEP(raw_read);
    t = time_raw_read_warm(raw_path, buf, payload_bytes);
    KEEP(raw_read_warm);
    t = time_open(ks_path, KS_READ_COPY, 1);
    KEEP(ks_load_copy);
    t = time_open(ks_path, KS_READ_COPY, 0);
    KEEP(ks_load_copy_noverify);
    t = time_open(ks_path, KS_READ_MMAP, 0);
    KEEP(ks_open_mmap);
    t = time_open(ks_path, KS_READ_MMAP, 1);
    KEEP(ks_verify);
    /* A mapped reader's fetch parses the checksum table on every call (format.h): not for 100,000. */
    t = c->count <= 1000 ? time_fetch(ks_path, KS_READ_MMAP, 0, c, buf) : -1;
    KEEP(fetch_mmap);
    t = time_fetch(ks_path, KS_READ_LAZY, 0, c, buf);
    KEEP(fetch_lazy);
    t = time_fetch(ks_path, KS_READ_LAZY, 1, c, buf);
    KEEP(fetch_one_thread);
    if (st) {
      ks_save_opts so = {.io = ks_bench_io_nosync()};
      if (r == 0 && ks_state_save(st, state_path, &so, NULL)) fprintf(stderr, "state save failed\n");
      time_raw_read_warm(state_path, buf, payload_bytes); /* in the page cache; then the same bytes back */
      memcpy(buf, payload, payload_bytes);
      t = time_state_load(state_path, st);
      KEEP(state_load);
    }
    double t0 = start();
    memcpy(buf, payload, payload_bytes);
    ks_bench_sink(((float *)buf)[payload_bytes / 8]);
    t = stop(t0);
    KEEP(memcpy_s);
  }
  ks_state_free(st);
  free(buf);
  unlink(raw_path);
  unlink(ks_path);
  unlink(prev_path);
  unlink(state_path);
  run_torch(c, &res->wall);
  res->cpu.torch_save = res->cpu.torch_load = res->cpu.torch_load_first = -1;
}

/* One row: best wall time, GiB/s, the ratio to a baseline's best wall time, then the best CPU time
   (the process's, every thread) and the same ratio of CPU times. */
static void row(const bests *b, const char *what, double bytes, size_t field, const char *vs, size_t base) {
  const double *w = (const double *)&b->wall, *c = (const double *)&b->cpu;
  double secs = w[field], cpu = c[field];
  if (!(secs > 0)) return;
  printf("  %-34s %9.3f ms %7.2f GiB/s", what, secs * 1e3, ks_bench_gibps(bytes, secs));
  if (vs && w[base] > 0) printf("  %5.2fx %-22s", w[base] / secs, vs);
  else printf("  %28s", "");
  if (cpu > 0) printf("  cpu %8.3f ms", cpu * 1e3);
  if (vs && cpu > 0 && c[base] > 0) printf("  %5.2fx", c[base] / cpu);
  printf("\n");
}

#define F(name) (offsetof(results, name) / sizeof(double))

static void report(const bench_case *c, const bests *b, double bytes) {
  const results *r = &b->wall;
  printf("\n%s: %zu tensors, %.1f MiB (best of %d; wall time, then CPU time of all threads)\n", c->label, c->count,
         bytes / 1048576.0, c->reps);
  row(b, "raw write() (page cache)", bytes, F(raw_write_nosync), NULL, 0);
  row(b, "keepsake save (no fsync)", bytes, F(ks_save_nosync), "of raw write", F(raw_write_nosync));
  row(b, "previous writer (no fsync)", bytes, F(prev_save_nosync), "of raw write", F(raw_write_nosync));
  row(b, "raw write()+fsync", bytes, F(raw_write), NULL, 0);
  row(b, "keepsake save (fsync)", bytes, F(ks_save), "of raw write+fsync", F(raw_write));
  row(b, "previous writer (fsync)", bytes, F(prev_save), "of raw write+fsync", F(raw_write));
  if (r->torch_save > 0) row(b, "torch.save (+fsync)", bytes, F(torch_save), "of keepsake save", F(ks_save));
  row(b, "raw read() (fresh malloc)", bytes, F(raw_read), NULL, 0);
  row(b, "raw read() (warm buffer)", bytes, F(raw_read_warm), NULL, 0);
  row(b, "memcpy (warm buffers)", bytes, F(memcpy_s), NULL, 0);
  row(b, "keepsake load (copy, verified)", bytes, F(ks_load_copy), "of read (fresh)", F(raw_read));
  row(b, "  (same, vs warm read)", bytes, F(ks_load_copy), "of read (warm)", F(raw_read_warm));
  row(b, "keepsake load (copy, unverified)", bytes, F(ks_load_copy_noverify), "of read (fresh)", F(raw_read));
  row(b, "keepsake open (mmap)", bytes, F(ks_open_mmap), NULL, 0);
  row(b, "keepsake open (mmap+xxh3)", bytes, F(ks_verify), "of memcpy", F(memcpy_s));
  row(b, "fetch_many into warm memory (mmap)", bytes, F(fetch_mmap), "of read (warm)", F(raw_read_warm));
  row(b, "fetch_many into warm memory (lazy)", bytes, F(fetch_lazy), "of read (warm)", F(raw_read_warm));
  row(b, "  (same, one thread)", bytes, F(fetch_one_thread), "of read (warm)", F(raw_read_warm));
  row(b, "ks_state_load into its tensors", bytes, F(state_load), "of read (warm)", F(raw_read_warm));
  if (r->torch_load_first > 0)
    row(b, "torch.load (fresh memory)", bytes, F(torch_load_first), "of keepsake copy load", F(ks_load_copy));
  if (r->torch_load > 0)
    row(b, "torch.load (reused memory)", bytes, F(torch_load), "of keepsake copy load", F(ks_load_copy));
  printf("  ratios, wall (>1: keepsake faster): save/raw_write nosync=%.2f fsync=%.2f; save/previous nosync=%.2f "
         "fsync=%.2f; load_copy/raw_read=%.2f load_copy/warm_read=%.2f fetch_into_warm/warm_read=%.2f "
         "state_load/warm_read=%.2f\n",
         r->raw_write_nosync / r->ks_save_nosync, r->raw_write / r->ks_save, r->prev_save_nosync / r->ks_save_nosync,
         r->prev_save / r->ks_save, r->raw_read / r->ks_load_copy, r->raw_read_warm / r->ks_load_copy,
         r->raw_read_warm / best(r->fetch_lazy, r->fetch_mmap),
         r->raw_read_warm / r->state_load);
}

/* The 148 tensors of GPT-2 small (124M parameters) as Hugging Face saves it: 475 MiB of F32. */
static void gpt2_shapes(bench_case *c, int quick) {
  const size_t d = quick ? 48 : 768, ff = 4 * d, vocab = quick ? 3141 : 50257, ctx = quick ? 64 : 1024;
  size_t n = 0;
#define T(r, e) (c->rows[n] = (int64_t)(r), c->elems[n++] = (size_t)(e))
  T(vocab, vocab * d);
  T(ctx, ctx * d);
  for (int l = 0; l < 12; l++) {
    T(0, d), T(0, d);                 /* ln_1 */
    T(d, d * 3 * d), T(0, 3 * d);     /* attn.c_attn */
    T(d, d * d), T(0, d);             /* attn.c_proj */
    T(0, d), T(0, d);                 /* ln_2 */
    T(d, d * ff), T(0, ff);           /* mlp.c_fc */
    T(ff, ff * d), T(0, d);           /* mlp.c_proj */
  }
  T(0, d), T(0, d); /* ln_f */
#undef T
  c->count = n;
}

int main(int argc, char **argv) {
  int quick = 0, reps = 0;
  const char *only = NULL;
  for (int a = 1; a < argc; a++) {
    if (!strcmp(argv[a], "--quick")) quick = 1;
    else if (!strcmp(argv[a], "--many-only")) only = "many-small"; /* kept for scripts that tune per-tensor costs */
    else if (!strcmp(argv[a], "--case") && a + 1 < argc) only = argv[++a];
    else if (!strcmp(argv[a], "--reps") && a + 1 < argc) reps = atoi(argv[++a]);
  }
  static bench_case cases[3];
  cases[0] = (bench_case){.name = "gpt2", .label = "GPT-2 small shapes (F32)", .reps = 5};
  gpt2_shapes(&cases[0], quick);
  cases[1] = (bench_case){.name = "large", .label = "256 x 4 MiB (F32)", .count = quick ? 16 : 256,
                          .elems = {1u << 20}, .reps = 5, .torch = 1};
  cases[2] = (bench_case){.name = "many-small", .label = "many small (16 x F32)", .count = quick ? 10000 : 100000,
                          .elems = {16}, .reps = 3, .torch = 1};
  FILE *up = fopen("/proc/loadavg", "r");
  char load[128] = "?";
  if (up) {
    if (!fgets(load, sizeof load, up)) snprintf(load, sizeof load, "?");
    fclose(up);
    load[strcspn(load, "\n")] = '\0';
  }
  setvbuf(stdout, NULL, _IOLBF, 0); /* each line as it comes, also into a file */
  printf("bench_io: keepsake save/load vs raw I/O, memcpy, the previous writer and torch (dir %s; load %s)\n",
         tmp_dir(), load);
  for (int i = 0; i < 3; i++) {
    bench_case *c = &cases[i];
    if (only && strcmp(only, c->name)) continue;
    if (reps > 0) c->reps = reps;
    size_t n = case_total(c), bytes = n * sizeof(float);
    float *payload = make_payload(n);
    ks_statedict *sd = payload ? make_dict(c, payload) : NULL;
    if (!sd) {
      fprintf(stderr, "out of memory building %s\n", c->label);
      free(payload);
      return 1;
    }
    bests r;
    measure(c, &r, sd, payload, bytes);
    report(c, &r, (double)bytes);
    ks_statedict_free(sd);
    free(payload);
  }
  return 0;
}
