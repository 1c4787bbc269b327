/*
 * The whole training state at scale: ks_state_save and ks_state_load of a model
 * of N tensors plus its AdamW state (exp_avg, exp_avg_sq and step per tensor:
 * about 4N + 20 entries), against ks_save and ks_load of the same state dict and
 * file measured in the same run. The difference is what the state layer adds
 * (flattening, registry lookups, load semantics and the report).
 *
 * fsync is skipped on both sides (an I/O table with no-op fsyncs) so the rows
 * compare CPU work, not the disk; times are the process's CPU time (user +
 * system, page faults of the mapping included), best of several runs, which
 * stays meaningful when other work shares the machine.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "benchutil.h"
#include "keepsake/keepsake.h"

enum { ELEMS = 16 }; /* F32 elements per model tensor: 64 bytes, as bench_io's many-small case */

/* Process CPU time: the machine may be shared, and the rows compare CPU work (fsync is off). */
static double now(void) { return ks_bench_cpu_now(); }

typedef struct model {
  size_t n;
  float *params, *grads;
  ks_optimizer *opt;
  ks_state *st;
  ks_timestamp ts;
  ks_rng rng;
} model;

static void die(const char *what, const ks_error *e) {
  fprintf(stderr, "bench_state: %s failed: %s\n", what, e ? e->message : "");
  exit(1);
}

static void model_build(model *m, size_t n) {
  memset(m, 0, sizeof *m);
  m->n = n;
  m->params = calloc(n * ELEMS, sizeof(float));
  m->grads = calloc(n * ELEMS, sizeof(float));
  if (!m->params || !m->grads) die("calloc", NULL);
  for (size_t i = 0; i < n * ELEMS; i++) m->params[i] = (float)i * 1e-6f, m->grads[i] = 1e-3f;
  ks_adamw_opts ao = {1e-3, 0.9, 0.999, 1e-8, 1e-2};
  if (ks_optimizer_create_adamw(&ao, NULL, &m->opt, NULL) || ks_state_create("bench", 17, NULL, &m->st, NULL))
    die("create", NULL);
  int64_t shape[1] = {ELEMS};
  char name[64];
  for (size_t i = 0; i < n; i++) {
    float *p = m->params + i * ELEMS;
    snprintf(name, sizeof name, "layers.%zu.block.%zu.weight", i / 100, i % 100);
    ks_tensor t;
    if (ks_tensor_init(&t, KS_F32, 1, shape, p) || ks_state_add_tensor(m->st, name, &t, NULL) ||
        ks_optimizer_add_param(m->opt, p, m->grads + i * ELEMS, 1, shape, NULL))
      die("register", NULL);
  }
  ks_optimizer_step(m->opt); /* so the AdamW state exists, as in torch */
  ks_timestamp_init(&m->ts);
  ks_rng_seed(&m->rng, 5);
  if (ks_state_add_optimizer(m->st, "AdamW", m->opt, NULL)) die("add optimizer", NULL);
  ks_state_set_timestamp(m->st, &m->ts);
  ks_state_set_rng(m->st, &m->rng);
}

static void model_free(model *m) {
  ks_state_free(m->st);
  ks_optimizer_free(m->opt);
  free(m->params);
  free(m->grads);
}

typedef struct row {
  double state_save, save, state_load, load;
  size_t entries;
} row;

static double best(double a, double b) { return a < 0 || b < a ? b : a; }

static double time_state_save(const model *m, const char *path, const ks_save_opts *so) {
  ks_error e;
  double t0 = now();
  if (ks_state_save(m->st, path, so, &e)) die("ks_state_save", &e);
  return now() - t0;
}

static double time_save(const model *m, const char *path, const ks_save_opts *so, size_t *entries) {
  ks_statedict *sd;
  ks_meta *meta;
  ks_error e;
  if (ks_statedict_create(NULL, &sd, NULL) || ks_meta_create(NULL, &meta, NULL)) die("create", NULL);
  if (ks_state_to_state_dict(m->st, sd, meta, &e)) die("ks_state_to_state_dict", &e);
  *entries = ks_statedict_count(sd);
  double t0 = now();
  if (ks_save(path, sd, meta, so, &e)) die("ks_save", &e);
  double t = now() - t0;
  ks_meta_free(meta);
  ks_statedict_free(sd);
  return t;
}

static double time_load(const char *path) {
  ks_read_opts ro = {.mode = KS_READ_MMAP};
  ks_statedict *sd;
  ks_meta *meta;
  ks_error e;
  double t0 = now();
  if (ks_load(path, &ro, &sd, &meta, &e)) die("ks_load", &e);
  double t = now() - t0;
  ks_meta_free(meta);
  ks_statedict_free(sd);
  return t;
}

static double time_state_load(model *m, const char *path) {
  ks_load_report *rep;
  ks_error e;
  if (ks_load_report_create(NULL, &rep, NULL)) die("report", NULL);
  double t0 = now();
  if (ks_state_load(m->st, path, NULL, rep, &e)) die("ks_state_load", &e);
  double t = now() - t0;
  ks_load_report_free(rep);
  return t;
}

static row measure(size_t n, const char *dir, int reps) {
  model m;
  model_build(&m, n);
  ks_save_opts so = {.io = ks_bench_io_nosync()};
  char a[4096], b[4096];
  snprintf(a, sizeof a, "%s/state-%zu.keepsake", dir, n);
  snprintf(b, sizeof b, "%s/plain-%zu.keepsake", dir, n);
  row r = {-1, -1, -1, -1, 0};
  for (int i = 0; i < reps; i++) {
    r.state_save = best(r.state_save, time_state_save(&m, a, &so));
    r.save = best(r.save, time_save(&m, b, &so, &r.entries));
    r.state_load = best(r.state_load, time_state_load(&m, a));
    r.load = best(r.load, time_load(a));
  }
  remove(a);
  remove(b);
  model_free(&m);
  return r;
}

/* Usage: bench_state [N...] (default: 1000 2000 4000 8000 16000 100000 tensors). */
int main(int argc, char **argv) {
  const char *dir = getenv("KS_BENCH_TMP");
  if (!dir) dir = "/tmp";
  size_t sizes[16] = {1000, 2000, 4000, 8000, 16000, 100000}, n_sizes = 6;
  if (argc > 1) {
    n_sizes = 0;
    for (int i = 1; i < argc && n_sizes < 16; i++) sizes[n_sizes++] = (size_t)strtoull(argv[i], NULL, 10);
  }
  printf("bench_state: ks_state_save/ks_state_load vs ks_save/ks_load of the same state (AdamW, %d-float tensors, no "
         "fsync, CPU time, best of 5 / 3 at 100k)\n\n",
         ELEMS);
  printf("  %8s %9s %12s %12s %7s %12s %12s %7s\n", "tensors", "entries", "state_save", "ks_save", "ratio",
         "state_load", "ks_load", "ratio");
  for (size_t i = 0; i < n_sizes; i++) {
    row r = measure(sizes[i], dir, sizes[i] >= 100000 ? 3 : 5);
    printf("  %8zu %9zu %9.2f ms %9.2f ms %6.2fx %9.2f ms %9.2f ms %6.2fx\n", sizes[i], r.entries, r.state_save * 1e3,
           r.save * 1e3, r.state_save / r.save, r.state_load * 1e3, r.load * 1e3, r.state_load / r.load);
  }
  return 0;
}
