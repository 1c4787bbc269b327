/*
 * Remote checkpoints against the loopback test servers (tests/remote: moto_server for S3, nginx
 * for HTTP, the fault proxy for its request log), started by scripts/bench, which sets
 * KS_REMOTE_ENV; skipped without it.
 *
 *   1. Upload: ks_save of a KS_BENCH_REMOTE_MB (default 256) MiB checkpoint to s3:// (multipart,
 *      4 parts in flight), against a plain `curl -T` PUT of the same file to the same server.
 *   2. Download: ks_load (verify_checksums, lazy mode: parallel ranged GETs) from s3:// and from
 *      http:// (nginx), against `curl -o /dev/null` GETs of the same objects.
 *      Ratios are keepsake throughput / curl throughput (1.0 = as fast as curl).
 *   3. Lazy: one tensor of a KS_BENCH_LAZY_MB (default 1024) MiB checkpoint on nginx, read through
 *      the proxy: the bytes the proxy sent (its /log) and the bytes the reader asked for.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "benchutil.h"
#include "keepsake/binding.h"
#include "keepsake/io_cache.h"
#include "keepsake/keepsake.h"
#include "keepsake/storage.h"

#define MIB (1024.0 * 1024.0)

static char g_env[16][2][512];
static int g_n_env;

/* servers.env: KEY=VALUE lines, also exported (curl below reads AWS_* from the command line). */
static int load_env(void) {
  const char *path = getenv("KS_REMOTE_ENV");
  FILE *f = path ? fopen(path, "r") : NULL;
  if (!f) return -1;
  char line[512];
  while (g_n_env < 16 && fgets(line, sizeof line, f)) {
    line[strcspn(line, "\r\n")] = '\0';
    char *eq = strchr(line, '=');
    if (!eq) continue;
    *eq = '\0';
    snprintf(g_env[g_n_env][0], sizeof g_env[0][0], "%s", line);
    snprintf(g_env[g_n_env][1], sizeof g_env[0][1], "%s", eq + 1);
    setenv(line, eq + 1, 1);
    g_n_env++;
  }
  fclose(f);
  return 0;
}

static const char *env(const char *k) {
  for (int i = 0; i < g_n_env; i++)
    if (!strcmp(g_env[i][0], k)) return g_env[i][1];
  return "";
}

static const char *tmp_dir(void) {
  const char *d = getenv("KS_BENCH_TMP");
  return d && *d ? d : "/tmp";
}

static long env_long(const char *k, long dflt) {
  const char *v = getenv(k);
  return v && atol(v) > 0 ? atol(v) : dflt;
}

/* A state dict of `count` float32 tensors of `elems` elements each, plus a small one named "small". */
static ks_statedict *make_sd(size_t count, size_t elems) {
  ks_statedict *sd = NULL;
  if (ks_statedict_create(NULL, &sd, NULL)) return NULL;
  uint32_t x = 2463534242u;
  for (size_t i = 0; i <= count; i++) {
    char name[64];
    int64_t n = (int64_t)(i == count ? 1024 : elems);
    snprintf(name, sizeof name, i == count ? "small" : "layer%03zu.weight", i);
    void *data = NULL;
    if (ks_statedict_new_tensor(sd, name, KS_F32, 1, &n, &data, NULL)) {
      ks_statedict_free(sd);
      return NULL;
    }
    float *p = data;
    for (int64_t j = 0; j < n; j++) {
      x ^= x << 13, x ^= x >> 17, x ^= x << 5;
      p[j] = (float)(x >> 8) * (1.0f / 16777216.0f);
    }
  }
  return sd;
}

static ks_storage *open_store(const char *url, const char *endpoint) {
  ks_storage_opts o = {.endpoint = endpoint};
  ks_storage *st = NULL;
  ks_error e;
  ks_error_clear(&e);
  if (ks_storage_open(url, &o, &st, &e)) {
    fprintf(stderr, "bench_remote: %s: %s\n", url, e.message);
    return NULL;
  }
  return st;
}

/* Wall seconds of a shell command (best of reps); < 0 when it fails. */
static double time_cmd(const char *cmd, int reps) {
  double best = -1;
  for (int i = 0; i < reps; i++) {
    double t0 = ks_bench_now();
    if (system(cmd) != 0) return -1;
    double t = ks_bench_now() - t0;
    if (best < 0 || t < best) best = t;
  }
  return best;
}

static void curl_s3(char *out, size_t cap, const char *args, const char *url) {
  snprintf(out, cap,
           "curl -sS --fail --aws-sigv4 'aws:amz:%s:s3' --user '%s:%s' -H 'Content-Type: application/octet-stream' "
           "%s '%s'",
           env("AWS_REGION"), env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY"), args, url);
}

static double time_save(const ks_statedict *sd, const ks_io *io, const char *path, int reps) {
  double best = -1;
  for (int i = 0; i < reps; i++) {
    ks_save_opts so = {.io = io};
    ks_error e;
    ks_error_clear(&e);
    double t0 = ks_bench_now();
    if (ks_save(path, sd, NULL, &so, &e)) {
      fprintf(stderr, "bench_remote: save %s: %s\n", path, e.message);
      return -1;
    }
    double t = ks_bench_now() - t0;
    if (best < 0 || t < best) best = t;
  }
  return best;
}

static double time_load(const ks_io *io, const char *path, int reps) {
  double best = -1;
  for (int i = 0; i < reps; i++) {
    ks_read_opts ro = {.io = io, .mode = KS_READ_LAZY, .verify_checksums = 1};
    ks_statedict *sd = NULL;
    ks_error e;
    ks_error_clear(&e);
    double t0 = ks_bench_now();
    ks_status s = ks_load(path, &ro, &sd, NULL, &e);
    double t = ks_bench_now() - t0;
    ks_statedict_free(sd);
    if (s) {
      fprintf(stderr, "bench_remote: load %s: %s\n", path, e.message);
      return -1;
    }
    if (best < 0 || t < best) best = t;
  }
  return best;
}

static void row(const char *what, double bytes, double ks_s, double curl_s) {
  if (ks_s <= 0 || curl_s <= 0) {
    printf("  %-34s  (failed)\n", what);
    return;
  }
  printf("  %-34s  keepsake %7.1f MiB/s   curl %7.1f MiB/s   ratio %.2f\n", what, bytes / MIB / ks_s,
         bytes / MIB / curl_s, curl_s / ks_s);
}

static int throughput(int reps) {
  long mb = env_long("KS_BENCH_REMOTE_MB", 256);
  size_t count = 16, elems = (size_t)mb * 1024 * 1024 / 4 / count;
  ks_statedict *sd = make_sd(count, elems);
  char local[1024], cmd[4096], url[1024];
  snprintf(local, sizeof local, "%s/bench-remote.keepsake", tmp_dir());
  ks_storage *s3 = open_store("s3://bench", env("KS_TEST_S3_ENDPOINT"));
  if (!sd || !s3 || time_save(sd, ks_bench_io_nosync(), local, 1) < 0) return 1;
  FILE *f = fopen(local, "rb");
  fseek(f, 0, SEEK_END);
  double bytes = (double)ftell(f);
  fclose(f);
  snprintf(url, sizeof url, "%s/bench", env("KS_TEST_S3_ENDPOINT"));
  curl_s3(cmd, sizeof cmd, "-X PUT -o /dev/null", url);
  if (system(cmd) != 0) fprintf(stderr, "bench_remote: cannot create the bucket\n");
  printf("checkpoint of %.0f MiB (%zu tensors), best of %d, loopback servers\n", bytes / MIB, count + 1, reps);

  double ks_up = time_save(sd, ks_storage_io(s3), "ckpt.keepsake", reps);
  snprintf(url, sizeof url, "%s/bench/curl.keepsake", env("KS_TEST_S3_ENDPOINT"));
  char args[1200];
  snprintf(args, sizeof args, "-o /dev/null -T '%s'", local);
  curl_s3(cmd, sizeof cmd, args, url);
  double curl_up = time_cmd(cmd, reps);
  row("upload, S3 (moto)", bytes, ks_up, curl_up);

  double ks_down = time_load(ks_storage_io(s3), "ckpt.keepsake", reps);
  snprintf(url, sizeof url, "%s/bench/ckpt.keepsake", env("KS_TEST_S3_ENDPOINT"));
  curl_s3(cmd, sizeof cmd, "-o /dev/null", url);
  double curl_down = time_cmd(cmd, reps);
  row("download + verify, S3 (moto)", bytes, ks_down, curl_down);

  snprintf(cmd, sizeof cmd, "cp '%s' '%s/bench-remote.keepsake'", local, env("KS_TEST_HTTP_ROOT"));
  snprintf(url, sizeof url, "%s/bench-remote.keepsake", env("KS_TEST_HTTP_URL"));
  ks_storage *http = system(cmd) == 0 ? open_store(url, NULL) : NULL;
  if (http) {
    double ks_h = time_load(ks_storage_io(http), ks_storage_path(http), reps);
    snprintf(cmd, sizeof cmd, "curl -sS --fail -o /dev/null '%s'", url);
    row("download + verify, HTTP (nginx)", bytes, ks_h, time_cmd(cmd, reps));
  }
  ks_storage_free(http);
  ks_storage_free(s3);
  ks_statedict_free(sd);
  unlink(local);
  return 0;
}

/* Sums "resp_bytes" over the proxy's log, and counts its entries. */
static void proxy_bytes(double *bytes, int *requests) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "curl -sS '%s/log'", env("KS_TEST_PROXY_CTL"));
  FILE *p = popen(cmd, "r");
  *bytes = 0;
  *requests = 0;
  if (!p) return;
  static char buf[1 << 20];
  size_t n = fread(buf, 1, sizeof buf - 1, p);
  pclose(p);
  buf[n] = '\0';
  for (const char *s = strstr(buf, "\"resp_bytes\": "); s; s = strstr(s + 1, "\"resp_bytes\": ")) {
    *bytes += atof(s + 14);
    (*requests)++;
  }
}

static int lazy(void) {
  long mb = env_long("KS_BENCH_LAZY_MB", 1024);
  size_t count = 64, elems = (size_t)mb * 1024 * 1024 / 4 / count;
  ks_statedict *sd = make_sd(count, elems);
  char path[1024], url[1024], cmd[1024];
  snprintf(path, sizeof path, "%s/lazy.keepsake", env("KS_TEST_HTTP_ROOT"));
  if (!sd || time_save(sd, ks_bench_io_nosync(), path, 1) < 0) return 1;
  ks_statedict_free(sd);
  FILE *f = fopen(path, "rb");
  fseek(f, 0, SEEK_END);
  double size = (double)ftell(f);
  fclose(f);
  snprintf(url, sizeof url, "%s/lazy.keepsake", env("KS_TEST_PROXY_HTTP"));
  ks_storage *http = open_store(url, NULL);
  ks_io *counter = NULL;
  if (!http || ks_io_counter_create(ks_storage_io(http), 1, NULL, &counter, NULL)) return 1;
  printf("lazy read of one tensor from a %.0f MiB checkpoint (%zu tensors of %.0f MiB) on nginx, via the proxy\n",
         size / MIB, count + 1, (double)elems * 4 / MIB);
  const char *names[] = {"small", "layer031.weight"};
  for (int i = 0; i < 2; i++) {
    snprintf(cmd, sizeof cmd, "curl -sS -X DELETE -o /dev/null '%s/log'", env("KS_TEST_PROXY_CTL"));
    if (system(cmd) != 0) return 1;
    ks_io_counter_reset(counter);
    ks_read_opts ro = {.io = counter, .mode = KS_READ_LAZY};
    ks_reader *r = NULL;
    ks_tensor t;
    ks_error e;
    ks_error_clear(&e);
    double t0 = ks_bench_now();
    ks_status s = ks_reader_open(ks_storage_path(http), &ro, &r, &e);
    if (!s) s = ks_reader_tensor(r, names[i], &t, &e);
    double secs = ks_bench_now() - t0;
    size_t tbytes = s ? 0 : t.nbytes;
    ks_reader_free(r);
    if (s) {
      fprintf(stderr, "bench_remote: lazy read of %s: %s\n", names[i], e.message);
      return 1;
    }
    ks_io_counts c;
    ks_io_counter_get(counter, &c);
    double sent;
    int reqs;
    proxy_bytes(&sent, &reqs);
    printf("  %-16s (%9zu B): %d requests, %.0f B on the wire (%.4f%% of the file), reader asked %llu B in %llu "
           "reads, %.3f s\n",
           names[i], tbytes, reqs, sent, 100.0 * sent / size, (unsigned long long)c.read_bytes,
           (unsigned long long)c.read_calls, secs);
  }
  ks_io_counter_free(counter);
  ks_storage_free(http);
  unlink(path);
  return 0;
}

int main(void) {
  if (load_env()) {
    printf("bench_remote: skipped (KS_REMOTE_ENV unset: scripts/bench starts the test servers)\n");
    return 0;
  }
  ks_storage *probe = NULL;
  if (ks_storage_open("s3://bench", NULL, &probe, NULL) == KS_E_UNSUPPORTED) {
    printf("bench_remote: skipped (built without libcurl)\n");
    return 0;
  }
  ks_storage_free(probe);
  int reps = (int)env_long("KS_BENCH_REPS", 3);
  int rc = throughput(reps);
  if (!rc) rc = lazy();
  return rc;
}
