/*
 * Save and load throughput of keepsake files against baselines measured in the
 * same run: raw write()+fsync / read() of the same bytes, memcpy, and
 * torch.save / torch.load through /usr/bin/python3 (skipped when torch is absent).
 *
 * Cases: 256 tensors of 4 MiB (1 GiB), and 100,000 tensors of 64 bytes.
 * Reads are from the page cache on both sides (the file was just written).
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "benchutil.h"
#include "keepsake/format.h"
#include "keepsake/keepsake.h"

typedef struct bench_case {
  const char *label;
  size_t count;
  size_t elems; /* F32 elements per tensor */
  int reps;
} bench_case;

typedef struct results {
  double raw_write, ks_save, raw_write_nosync, ks_save_nosync, raw_read, raw_read_warm, ks_load_copy, ks_open_mmap,
      ks_verify, memcpy_s;
  double torch_save, torch_load, torch_load_first; /* < 0 when skipped */
} results;

static const char *tmp_dir(void) {
  const char *d = getenv("KS_BENCH_TMP");
  return d && *d ? d : "/tmp";
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

static ks_statedict *make_dict(const bench_case *c, float *payload) {
  ks_statedict *sd;
  if (ks_statedict_create(NULL, &sd, NULL)) return NULL;
  char name[64];
  int64_t shape[1] = {(int64_t)c->elems};
  for (size_t i = 0; i < c->count; i++) {
    ks_tensor t;
    snprintf(name, sizeof name, "t/%zu", i);
    if (ks_tensor_init(&t, KS_F32, 1, shape, payload + i * c->elems)) abort(); /* fixed, valid shape: cannot fail */
    if (ks_statedict_set_tensor(sd, name, &t, KS_BORROW, NULL)) {
      ks_statedict_free(sd);
      return NULL;
    }
  }
  return sd;
}

static double time_raw_write(const char *path, const void *buf, size_t n, int sync) {
  double t0 = ks_bench_now();
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
  return ks_bench_now() - t0;
}

/* read() into memory that is already faulted in: the kernel's copy speed alone. */
static double time_raw_read_warm(const char *path, void *buf, size_t n) {
  double t0 = ks_bench_now();
  int fd = open(path, O_RDONLY);
  if (fd < 0) return -1;
  size_t off = 0;
  ssize_t r;
  while (off < n && (r = read(fd, (char *)buf + off, n - off)) > 0) off += (size_t)r;
  close(fd);
  return ks_bench_now() - t0;
}

/* Like a loader: fresh memory each time, so page faults count on both sides. */
static double time_raw_read(const char *path, size_t n) {
  double t0 = ks_bench_now();
  char *buf = malloc(n);
  if (!buf) return -1;
  double t = time_raw_read_warm(path, buf, n) < 0 ? -1 : ks_bench_now() - t0;
  ks_bench_sink(buf[n / 2]);
  free(buf);
  return t;
}

static double time_save(const char *path, const ks_statedict *sd, int sync) {
  ks_error err;
  ks_save_opts o = {.io = sync ? NULL : ks_bench_io_nosync()};
  double t0 = ks_bench_now();
  if (ks_save(path, sd, NULL, &o, &err)) {
    fprintf(stderr, "save failed: %s\n", err.message);
    return -1;
  }
  return ks_bench_now() - t0;
}

static double time_open(const char *path, ks_read_mode mode, int verify) {
  ks_read_opts o = {.mode = mode, .verify_checksums = verify};
  ks_reader *r;
  ks_error err;
  double t0 = ks_bench_now();
  if (ks_reader_open(path, &o, &r, &err)) {
    fprintf(stderr, "open failed: %s\n", err.message);
    return -1;
  }
  double t = ks_bench_now() - t0;
  ks_tensor v;
  const char *name;
  if (ks_reader_count(r) && !ks_reader_tensor_at(r, 0, &name, &v)) ks_bench_sink(((const float *)v.data)[0]);
  ks_reader_free(r);
  return t;
}

static double best(double a, double b) { return a < 0 ? b : (b < a ? b : a); }

static void run_torch(const bench_case *c, results *res) {
  res->torch_save = res->torch_load = res->torch_load_first = -1;
  if (system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0) {
    printf("  torch baseline skipped: /usr/bin/python3 cannot import torch\n");
    return;
  }
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/bench/torch_baseline.py %zu %zu %s %d", KS_SOURCE_DIR,
           c->count, c->elems, tmp_dir(), c->reps);
  FILE *p = popen(cmd, "r");
  if (!p) return;
  char line[256];
  while (fgets(line, sizeof line, p)) /* drain everything so the child never sees EPIPE */
    sscanf(line, "save_s=%lf load_s=%lf first_load_s=%lf", &res->torch_save, &res->torch_load,
           &res->torch_load_first);
  if (pclose(p) != 0) res->torch_save = res->torch_load = res->torch_load_first = -1;
}

static void measure(const bench_case *c, results *res, const ks_statedict *sd, const float *payload,
                    size_t payload_bytes) {
  char raw_path[512], ks_path[512];
  snprintf(raw_path, sizeof raw_path, "%s/raw.bin", tmp_dir());
  snprintf(ks_path, sizeof ks_path, "%s/bench.keepsake", tmp_dir());
  void *buf = malloc(payload_bytes);
  memset(res, 0xff, sizeof *res); /* all -nan until measured */
  for (int r = 0; r < c->reps; r++) {
    /* Each write starts with no dirty pages, so none pays for the previous one's writeback. */
    sync();
    res->raw_write_nosync = best(r ? res->raw_write_nosync : -1, time_raw_write(raw_path, payload, payload_bytes, 0));
    sync();
    res->ks_save_nosync = best(r ? res->ks_save_nosync : -1, time_save(ks_path, sd, 0));
    sync();
    res->raw_write = best(r ? res->raw_write : -1, time_raw_write(raw_path, payload, payload_bytes, 1));
    sync();
    res->ks_save = best(r ? res->ks_save : -1, time_save(ks_path, sd, 1));
    res->raw_read = best(r ? res->raw_read : -1, time_raw_read(raw_path, payload_bytes));
    res->raw_read_warm = best(r ? res->raw_read_warm : -1, time_raw_read_warm(raw_path, buf, payload_bytes));
    res->ks_load_copy = best(r ? res->ks_load_copy : -1, time_open(ks_path, KS_READ_COPY, 0));
    res->ks_open_mmap = best(r ? res->ks_open_mmap : -1, time_open(ks_path, KS_READ_MMAP, 0));
    res->ks_verify = best(r ? res->ks_verify : -1, time_open(ks_path, KS_READ_MMAP, 1));
    double t0 = ks_bench_now();
    memcpy(buf, payload, payload_bytes);
    ks_bench_sink(((float *)buf)[payload_bytes / 8]);
    res->memcpy_s = best(r ? res->memcpy_s : -1, ks_bench_now() - t0);
  }
  free(buf);
  unlink(raw_path);
  unlink(ks_path);
  run_torch(c, res);
}

static void row(const char *what, double bytes, double secs, const char *vs, double base_secs) {
  printf("  %-28s %9.3f ms %8.2f GiB/s", what, secs * 1e3, ks_bench_gibps(bytes, secs));
  if (vs && base_secs > 0)
    printf("   %6.2fx %s\n", base_secs / secs, vs);
  else
    printf("\n");
}

static void report(const bench_case *c, const results *r, double bytes) {
  printf("\n%s: %zu tensors x %zu bytes = %.1f MiB (best of %d)\n", c->label, c->count, c->elems * 4,
         bytes / 1048576.0, c->reps);
  row("raw write() (page cache)", bytes, r->raw_write_nosync, NULL, 0);
  row("keepsake save (no fsync)", bytes, r->ks_save_nosync, "of raw write", r->raw_write_nosync);
  row("raw write()+fsync", bytes, r->raw_write, NULL, 0);
  row("keepsake save (fsync)", bytes, r->ks_save, "of raw write", r->raw_write);
  if (r->torch_save > 0) row("torch.save (+fsync)", bytes, r->torch_save, "of keepsake save", r->ks_save);
  row("raw read() (fresh malloc)", bytes, r->raw_read, NULL, 0);
  row("raw read() (warm buffer)", bytes, r->raw_read_warm, NULL, 0);
  row("memcpy (warm buffers)", bytes, r->memcpy_s, NULL, 0);
  row("keepsake load (copy)", bytes, r->ks_load_copy, "of raw read (fresh)", r->raw_read);
  row("  (same, vs warm read)", bytes, r->ks_load_copy, "of raw read (warm)", r->raw_read_warm);
  row("keepsake open (mmap)", bytes, r->ks_open_mmap, NULL, 0);
  row("keepsake open (mmap+xxh3)", bytes, r->ks_verify, "of memcpy", r->memcpy_s);
  if (r->torch_load_first > 0)
    row("torch.load (fresh memory)", bytes, r->torch_load_first, "of keepsake copy load", r->ks_load_copy);
  if (r->torch_load > 0)
    row("torch.load (reused memory)", bytes, r->torch_load, "of keepsake copy load", r->ks_load_copy);
  printf("  ratios: save_nosync/raw_write_nosync=%.2f save/raw_write=%.2f save_vs_torch.save=%.2fx "
         "load_copy/raw_read=%.2f "
         "load_copy/warm_read=%.2f load_vs_torch.load(fresh)=%.2fx\n",
         r->raw_write_nosync / r->ks_save_nosync, r->raw_write / r->ks_save,
         r->torch_save > 0 ? r->torch_save / r->ks_save : 0, r->raw_read / r->ks_load_copy,
         r->raw_read_warm / r->ks_load_copy, r->torch_load_first > 0 ? r->torch_load_first / r->ks_load_copy : 0);
}

int main(int argc, char **argv) {
  int quick = 0, many_only = 0; /* --many-only: skip the 1 GiB case when tuning per-tensor costs */
  for (int a = 1; a < argc; a++) {
    quick |= strcmp(argv[a], "--quick") == 0;
    many_only |= strcmp(argv[a], "--many-only") == 0;
  }
  bench_case cases[2] = {
      {"large", quick ? 16 : 256, 1u << 20, 5},
      {"many-small", quick ? 10000 : 100000, 16, 3},
  };
  printf("bench_io: keepsake save/load vs raw I/O, memcpy and torch (dir %s)\n", tmp_dir());
  for (int i = many_only ? 1 : 0; i < 2; i++) {
    const bench_case *c = &cases[i];
    size_t n = c->count * c->elems, bytes = n * sizeof(float);
    float *payload = make_payload(n);
    ks_statedict *sd = payload ? make_dict(c, payload) : NULL;
    if (!sd) {
      fprintf(stderr, "out of memory building %s\n", c->label);
      free(payload);
      return 1;
    }
    results r;
    measure(c, &r, sd, payload, bytes);
    report(c, &r, (double)bytes);
    ks_statedict_free(sd);
    free(payload);
  }
  return 0;
}
