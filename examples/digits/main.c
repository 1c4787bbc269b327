/*
 * keepsake-digits: trains a small MLP on the UCI digits and checkpoints the
 * whole run with keepsake, so that a run killed at any point and resumed with
 * --autoresume ends bit-identical to one that was never interrupted.
 * `mpirun -np K keepsake-digits ...` trains data-parallel on K ranks and writes
 * sharded checkpoint directories (parallel.c); only rank 0 prints.
 *
 * Read this file top to bottom as an example of the API:
 *   1. build the model, optimizer, scheduler, PRNG, timestamp and data position;
 *   2. register them in a ks_state, with the metrics built by get_metrics();
 *   3. let a ks_ckpt_manager autoresume, then save on its interval.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "digits.h"
#include "keepsake/io_cache.h"
#include "keepsake/storage.h"

#define BATCH 32
#define HIDDEN 128
#define DROPOUT 0.2f

typedef struct args {
  const char *run_dir, *save_interval, *data, *keep_every;
  const char *upload_to;             /* --upload-to URL: save in run_dir, then upload there */
  int upload_retention;              /* --upload-retention: the keep policies delete uploaded copies too */
  const char *cache_dir;             /* --cache-dir DIR: keep what is read from a remote run dir or upload */
  int epochs, keep, autoresume, async_save, continue_on_save_error;
  long long seed, halt_after;
  int keep_best;                     /* --keep-best N:METRIC:max|min */
  char best_metric[256];
  ks_best_mode best_mode;
  double save_every_seconds;
  char early_metric[256];            /* --early-stop METRIC:PATIENCE[:max|min] */
  long long early_patience;
  ks_best_mode early_mode;
} args;

static int usage(void) {
  fprintf(stderr, "usage: keepsake-digits --run-dir DIR [--epochs N] [--save-interval 50ba|1ep] [--keep N]\n"
                  "                       [--seed S] [--autoresume] [--halt-after-batches N] [--data FILE]\n"
                  "                       [--async-save] [--keep-best N:METRIC:max|min] [--keep-every 5ep|100ba]\n"
                  "                       [--save-every-seconds S] [--early-stop METRIC:PATIENCE[:max|min]]\n"
                  "                       [--on-save-error stop|continue] [--upload-to s3://bucket/run]\n"
                  "                       [--upload-retention] [--cache-dir DIR]\n"
                  "  METRIC is label/Name, e.g. eval/MulticlassAccuracy. SIGTERM or SIGUSR1 saves at the next\n"
                  "  batch and exits with status 75; --autoresume continues from there.\n");
  return 2;
}

/* "max" / "min" (NULL = max). */
static int parse_mode(const char *s, ks_best_mode *m) {
  if (!s || !strcmp(s, "max")) *m = KS_BEST_MAX;
  else if (!strcmp(s, "min")) *m = KS_BEST_MIN;
  else return -1;
  return 0;
}

/* "N:METRIC[:MODE]" into n, metric and mode; METRIC may not contain ':'. */
static int parse_spec(const char *v, long long *n, char *metric, size_t cap, ks_best_mode *mode, int n_first) {
  char buf[512];
  if (snprintf(buf, sizeof buf, "%s", v) >= (int)sizeof buf) return -1;
  char *a = strtok(buf, ":"), *b = strtok(NULL, ":"), *c = strtok(NULL, ":");
  if (!a || !b || strtok(NULL, ":")) return -1;
  const char *num = n_first ? a : b, *name = n_first ? b : a;
  char *end;
  *n = strtoll(num, &end, 10);
  if (*end || *n <= 0 || strlen(name) >= cap) return -1;
  memcpy(metric, name, strlen(name) + 1);
  return parse_mode(c, mode);
}

static int parse_args(int argc, char **argv, args *a) {
  *a = (args){.save_interval = "1ep", .data = KS_DIGITS_DEFAULT_DATA, .epochs = 20, .keep = 3, .seed = 42};
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    long long n = 0;
    if (!strcmp(f, "--autoresume")) a->autoresume = 1;
    else if (!strcmp(f, "--async-save")) a->async_save = 1;
    else if (!strcmp(f, "--upload-retention")) a->upload_retention = 1;
    else if (!v) return -1;
    else if (!strcmp(f, "--keep-best")) {
      if (parse_spec(v, &n, a->best_metric, sizeof a->best_metric, &a->best_mode, 1) || n > 1000) return -1;
      a->keep_best = (int)n;
    } else if (!strcmp(f, "--early-stop")) {
      if (parse_spec(v, &a->early_patience, a->early_metric, sizeof a->early_metric, &a->early_mode, 0)) return -1;
    } else if (!strcmp(f, "--on-save-error")) {
      if (strcmp(v, "stop") && strcmp(v, "continue")) return -1;
      a->continue_on_save_error = !strcmp(v, "continue");
    } else if (!strcmp(f, "--keep-every")) a->keep_every = v;
    else if (!strcmp(f, "--save-every-seconds")) a->save_every_seconds = atof(v);
    else if (!strcmp(f, "--run-dir")) a->run_dir = v;
    else if (!strcmp(f, "--upload-to")) a->upload_to = v;
    else if (!strcmp(f, "--cache-dir")) a->cache_dir = v;
    else if (!strcmp(f, "--epochs")) a->epochs = atoi(v);
    else if (!strcmp(f, "--save-interval")) a->save_interval = v;
    else if (!strcmp(f, "--keep")) a->keep = atoi(v);
    else if (!strcmp(f, "--seed")) a->seed = atoll(v);
    else if (!strcmp(f, "--halt-after-batches")) a->halt_after = atoll(v);
    else if (!strcmp(f, "--data")) a->data = v;
    else return -1;
    if (strcmp(f, "--autoresume") && strcmp(f, "--async-save") && strcmp(f, "--upload-retention")) i++;
  }
  return a->run_dir && a->epochs > 0 && a->keep >= 0 ? 0 : -1;
}

/* The program's get_metrics(): what it measures, rebuilt on every start and filled by name on load. */
static ks_status get_metrics(void *ctx, const char *label, const ks_allocator *alloc, ks_metric_collection **out,
                             ks_error *err) {
  (void)ctx;
  static const char *const train[][2] = {{"MulticlassAccuracy", "{\"num_classes\":10,\"average\":\"micro\"}"},
                                         {"LanguageCrossEntropy", "{}"}};
  static const char *const eval[][2] = {{"MulticlassAccuracy", "{\"num_classes\":10,\"average\":\"micro\"}"},
                                        {"MulticlassF1Score", "{\"num_classes\":10}"},
                                        {"MulticlassConfusionMatrix", "{\"num_classes\":10}"}};
  const char *const(*defs)[2] = label ? eval : train;
  size_t n = label ? 3 : 2;
  ks_status s = ks_metric_collection_create(alloc, out, NULL);
  for (size_t i = 0; i < n && !s; i++) {
    ks_metric *m = NULL;
    s = ks_metric_create(defs[i][0], defs[i][1], alloc, &m, err);
    if (!s) s = ks_metric_collection_add(*out, defs[i][0], m, NULL);
    if (s) ks_metric_free(m);
  }
  if (s) ks_metric_collection_free(*out);
  return s;
}

/* Everything the run is made of. */
typedef struct run {
  args a;
  digits_data data;
  size_t n_train;
  mlp model;
  ks_optimizer *opt;
  ks_scheduler sched;
  ks_rng rng;
  ks_timestamp ts;
  ks_dataset_state ds;
  ks_state *st;
  ks_ckpt_manager *mgr;
  ks_storage *store; /* the run directory: a local path or a storage URL (s3://bucket/run) */
  ks_storage *upload; /* --upload-to: where each checkpoint is copied after it is saved */
  ks_io *cache[2];    /* --cache-dir: read caches over the remote run dir and the upload store */
  int64_t *order;
  ks_early_stop early;
  int stopping;  /* early stopping fired */
  digits_par par;
  const ks_io *io; /* the test hooks' I/O table, or NULL */
} run;

static int fail(const char *what, ks_status s, const ks_error *e) {
  char buf[1024];
  fprintf(stderr, "keepsake-digits: %s: %s\n", what,
          e && e->code ? ks_error_format(e, buf, sizeof buf) : ks_strerror(s));
  return 1;
}

/* --cache-dir: a read cache over a remote table (in DIR/which), so a resume downloads each byte
 * once; the manager then uses the cache, which forwards every write unchanged. */
static ks_status with_cache(run *r, int i, const ks_io *inner, const char *which, ks_error *e) {
  if (!r->a.cache_dir) return KS_OK;
  char dir[4096];
  int n = snprintf(dir, sizeof dir, "%s/%s", r->a.cache_dir, which);
  if (n < 0 || (size_t)n >= sizeof dir) {
    e->code = KS_E_LIMIT;
    snprintf(e->message, sizeof e->message, "cache directory path too long");
    return KS_E_LIMIT;
  }
  ks_status s = ks_io_cache_create(inner, dir, NULL, &r->cache[i], e);
  if (!s && i == 0) r->io = r->cache[0];
  return s;
}

static int build(run *r) {
  ks_error e;
  ks_error_clear(&e);
  r->n_train = r->data.n - DIGITS_EVAL_ROWS;
  int64_t per_epoch = (int64_t)((r->n_train + BATCH - 1) / BATCH);
  ks_rng init;
  ks_rng_seed(&init, (uint64_t)r->a.seed); /* weights from the seed; the training PRNG is a separate stream */
  /* Each rank its own dropout stream; rank 0's is the serial run's. */
  uint64_t salt = (uint64_t)r->par.rank * UINT64_C(0x9e3779b97f4a7c15);
  ks_rng_seed(&r->rng, ((uint64_t)r->a.seed ^ UINT64_C(0x5eedf00d)) + salt);
  if (mlp_create(&r->model, HIDDEN, BATCH) || !(r->order = malloc(sizeof(int64_t) * r->n_train)))
    return fail("allocating the model", KS_E_NOMEM, NULL);
  mlp_init(&r->model, &init);
  ks_adamw_opts ao = {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 1e-4};
  ks_status s = ks_optimizer_create_adamw(&ao, NULL, &r->opt, NULL);
  if (s) return fail("optimizer", s, NULL);
  ks_scheduler_init(&r->sched, r->opt, ao.lr, per_epoch, per_epoch * r->a.epochs, 0.02);
  ks_timestamp_init(&r->ts);
  r->ds = (ks_dataset_state){.shuffle_seed = r->a.seed};
  char name[64];
  snprintf(name, sizeof name, "digits-seed%lld", r->a.seed);
  static const char *const labels[] = {"eval"};
  s = ks_state_create(name, r->a.seed, NULL, &r->st, NULL);
  if (!s) s = mlp_register(&r->model, r->st, r->opt);
  if (!s) s = ks_state_add_optimizer(r->st, ks_optimizer_name(r->opt), r->opt, NULL);
  if (!s) s = ks_state_add_scheduler(r->st, "CosineAnnealingWithWarmupScheduler", &r->sched, NULL);
  if (!s) s = ks_state_add_dataset(r->st, "train", &r->ds, NULL);
  if (!s) s = ks_state_build_metrics(r->st, get_metrics, NULL, labels, 1, &e);
  if (!s && r->a.early_metric[0]) {
    s = ks_early_stop_init(&r->early, r->a.early_metric, r->a.early_mode, r->a.early_patience, 0.0, &e);
    ks_stateful es = ks_early_stop_stateful(&r->early);
    if (!s) s = ks_state_add_component(r->st, KS_ROOT_CALLBACKS, "EarlyStopping", &es, NULL);
  }
  if (s) return fail("building the training state", s, &e);
  ks_state_set_timestamp(r->st, &r->ts);
  ks_state_set_rng(r->st, &r->rng);
  int policies = r->a.keep_best || r->a.keep_every;
  if ((s = ks_storage_open(r->a.run_dir, NULL, &r->store, &e)) != KS_OK) return fail("run directory", s, &e);
  int remote = ks_storage_is_remote(r->store); /* the test hooks wrap local files only */
  r->io = remote ? ks_storage_io(r->store) : digits_test_io();
  if (remote && (s = with_cache(r, 0, r->io, "run", &e)) != KS_OK) return fail("--cache-dir", s, &e);
  ks_ckpt_opts co = {.run_dir = ks_storage_path(r->store), .save_interval = r->a.save_interval, .keep = r->a.keep,
                     .io = r->io, .keep_best = r->a.keep_best,
                     .best_metric = r->a.keep_best ? r->a.best_metric : NULL, .best_mode = r->a.best_mode,
                     .keep_every = r->a.keep_every, .retention_log = policies && r->par.rank == 0 ? stdout : NULL,
                     .save_every_seconds = r->a.save_every_seconds, .sharded = r->par.on,
                     /* rank 0 holds the run directory; the other ranks write their files into it */
                     .lock = r->par.on && r->par.rank != 0 ? KS_CKPT_LOCK_OFF : KS_CKPT_LOCK_AUTO};
  if (r->a.upload_to) { /* save locally, then upload; autoresume downloads from there when run_dir has nothing */
    if ((s = ks_storage_open(r->a.upload_to, NULL, &r->upload, &e)) != KS_OK) return fail("--upload-to", s, &e);
    co.upload_io = ks_storage_io(r->upload);
    if (ks_storage_is_remote(r->upload) && (s = with_cache(r, 1, co.upload_io, "upload", &e)) != KS_OK)
      return fail("--cache-dir", s, &e);
    if (r->cache[1]) co.upload_io = r->cache[1];
    co.upload_dir = ks_storage_path(r->upload);
    co.upload_retention = r->a.upload_retention;
  }
  static const int preempt[] = {SIGTERM, SIGUSR1};
  s = ks_preemption_install(preempt, 2, &e);
  if (s) return fail("preemption handlers", s, &e);
  s = ks_ckpt_manager_create(&co, &r->mgr, &e);
  return s ? fail("checkpoint manager", s, &e) : 0;
}

static int resume(run *r) {
  ks_error e;
  ks_error_clear(&e);
  ks_load_report *rep = NULL;
  int resumed = 0;
  const char *path = NULL;
  ks_status s = ks_load_report_create(NULL, &rep, NULL);
  if (!s) s = r->par.on ? par_autoresume(&r->par, r->mgr, r->st, rep, &resumed, &path, &e)
                        : ks_ckpt_manager_autoresume(r->mgr, r->st, NULL, rep, &resumed, &path, &e);
  if (!s && r->par.rank != 0) {
  } else if (!s && resumed) {
    printf("resumed from %s at epoch %lld, batch %lld\n", path, (long long)r->ts.epoch, (long long)r->ts.batch);
    ks_load_report_print(rep, stdout);
  } else if (!s) {
    printf("no checkpoint to resume in %s: starting fresh\n", r->a.run_dir);
  }
  ks_load_report_free(rep);
  return s ? fail("autoresume", s, &e) : 0;
}

/* The remote stores' own account of their last failure (URL, HTTP status, retries), if any. */
static void storage_detail(const run *r) {
  char buf[1024];
  const ks_storage *v[2] = {r->store, r->upload};
  for (int i = 0; i < 2; i++)
    if (v[i] && ks_storage_last_error(v[i], buf, sizeof buf)) fprintf(stderr, "keepsake-digits: storage: %s\n", buf);
}

static int save(run *r) {
  ks_error e;
  ks_error_clear(&e);
  ks_status s = r->par.on       ? par_save(&r->par, r->mgr, r->st, r->io, r->a.async_save, &e)
                : r->a.async_save ? ks_ckpt_manager_save_async(r->mgr, r->st, NULL, &e)
                                  : ks_ckpt_manager_save(r->mgr, r->st, NULL, &e);
  if (!s) return 0;
  fail(r->a.continue_on_save_error ? "saving a checkpoint (training goes on; the next save retries)"
                                   : "saving a checkpoint",
       s, &e);
  storage_detail(r);
  return !r->a.continue_on_save_error;
}

/* After a preemption signal: the checkpoint just started must be durable before the exit. */
static int preempted(run *r, int sig) {
  ks_error e;
  ks_error_clear(&e);
  ks_status s = r->par.on ? par_wait(&r->par, &e) : ks_ckpt_manager_wait(r->mgr, &e);
  if (s) return fail("saving the preemption checkpoint", s, &e);
  if (r->par.rank == 0)
    printf("preempted by signal %d after batch %lld: checkpoint saved; resume with --autoresume\n",
         sig, (long long)r->ts.batch);
  fflush(stdout);
  return KS_EXIT_PREEMPTED;
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* This epoch's order: a function of (shuffle seed, epoch) only, so a resumed run sees the same order. */
static void epoch_order(run *r) {
  ks_rng g;
  ks_rng_seed(&g, (uint64_t)r->ds.shuffle_seed ^ ((uint64_t)r->ds.epoch * 0x9e3779b97f4a7c15ull));
  for (size_t i = 0; i < r->n_train; i++) r->order[i] = (int64_t)i;
  ks_rng_shuffle(&g, r->order, r->n_train);
}

static ks_status update_all(ks_metric_collection *mc, const float *logits, const int64_t *y, size_t bs, ks_error *e) {
  ks_tensor in[2];
  int64_t ls[2] = {(int64_t)bs, DIGITS_CLASSES}, ys[1] = {(int64_t)bs};
  ks_status s = ks_tensor_init(&in[0], KS_F32, 2, ls, (void *)logits);
  if (!s) s = ks_tensor_init(&in[1], KS_I64, 1, ys, (void *)y);
  for (size_t i = 0; i < ks_metric_collection_count(mc) && !s; i++)
    s = ks_metric_update(ks_metric_collection_at(mc, i, NULL), in, 2, e);
  return s;
}

/* This rank's contiguous part [*lo, *lo + *n) of n_all items (all of them on one process). */
static void my_part(const run *r, size_t n_all, size_t *lo, size_t *n) {
  size_t per = (n_all + (size_t)r->par.size - 1) / (size_t)r->par.size, a = per * (size_t)r->par.rank;
  *lo = a < n_all ? a : n_all;
  *n = *lo + per < n_all ? per : n_all - *lo;
}

static int train_batch(run *r, float *loss) {
  float x[BATCH * DIGITS_PIXELS], logits[BATCH * DIGITS_CLASSES];
  int64_t y[BATCH];
  size_t start = (size_t)r->ds.sample_in_epoch, all = r->n_train - start < BATCH ? r->n_train - start : BATCH, lo, bs;
  my_part(r, all, &lo, &bs); /* data parallel: this rank's rows of the batch */
  for (size_t b = 0; b < bs; b++) {
    size_t row = (size_t)r->order[start + lo + b];
    memcpy(x + b * DIGITS_PIXELS, r->data.x + row * DIGITS_PIXELS, sizeof(float) * DIGITS_PIXELS);
    y[b] = r->data.y[row];
  }
  double t0 = now();
  *loss = bs ? mlp_train_batch(&r->model, x, y, bs, DROPOUT, &r->rng, logits) : 0.0f;
  if (par_average_grads(&r->par, &r->model, bs)) return fail("allreducing the gradients", KS_E_IO, NULL);
  ks_optimizer_step(r->opt);
  ks_scheduler_step(&r->sched, r->opt);
  ks_error e;
  ks_error_clear(&e);
  ks_status s = bs ? update_all(ks_state_train_metrics(r->st), logits, y, bs, &e) : KS_OK;
  if (s) return fail("train metrics", s, &e);
  ks_timestamp_batch_done(&r->ts, (int64_t)all, 0, now() - t0);
  r->ds.sample_in_epoch += (int64_t)all;
  return 0;
}

static int evaluate(run *r) {
  ks_metric_collection *mc = ks_state_eval_metrics(r->st, "eval");
  for (size_t i = 0; i < ks_metric_collection_count(mc); i++) ks_metric_reset(ks_metric_collection_at(mc, i, NULL));
  float logits[BATCH * DIGITS_CLASSES];
  ks_error e;
  ks_error_clear(&e);
  size_t lo, n;
  my_part(r, r->data.n - r->n_train, &lo, &n); /* this rank's eval rows */
  size_t end = r->n_train + lo + n;
  for (size_t start = r->n_train + lo; start < end; start += BATCH) {
    size_t bs = end - start < BATCH ? end - start : BATCH;
    mlp_forward(&r->model, r->data.x + start * DIGITS_PIXELS, bs, logits);
    ks_status s = update_all(mc, logits, r->data.y + start, bs, &e);
    if (s) return fail("eval metrics", s, &e);
  }
  return 0;
}

/* Under mpirun: train and eval results of the whole data, cached (`_computed`) before anything reads them. */
static int sync_results(run *r) {
  ks_error e;
  ks_error_clear(&e);
  ks_status s = par_sync_computed(&r->par, ks_state_train_metrics(r->st), &e);
  if (!s) s = par_sync_computed(&r->par, ks_state_eval_metrics(r->st, "eval"), &e);
  return s ? fail("syncing the metrics", s, &e) : 0;
}

/* compute() of a scalar metric (also caches `_computed`, which the checkpoint keeps). */
static double value(ks_metric_collection *mc, const char *name) {
  const ks_tensor *t;
  ks_metric *m = ks_metric_collection_get(mc, name);
  if (!m || ks_metric_compute(m, &t, NULL) || ks_tensor_numel(t) != 1) return -1;
  return ks_dtype_get_f64(t->dtype, t->data, 0);
}

static void progress(const run *r, float loss) {
  if (r->par.rank != 0 || !isatty(2)) return;
  int width = 30, done = (int)((size_t)width * (size_t)r->ds.sample_in_epoch / r->n_train);
  fprintf(stderr, "\repoch %3lld/%d [%.*s%*s] %4lld/%zu  loss %.4f", (long long)r->ts.epoch + 1, r->a.epochs, done,
          "##############################", width - done, "", (long long)r->ds.sample_in_epoch, r->n_train, loss);
  fflush(stderr);
}

static void epoch_line(run *r) {
  ks_metric_collection *tr = ks_state_train_metrics(r->st), *ev = ks_state_eval_metrics(r->st, "eval");
  if (r->par.rank == 0 && isatty(2)) fprintf(stderr, "\r%*s\r", 80, "");
  (void)value(ev, "MulticlassConfusionMatrix"); /* computed so the checkpoint carries it as `_computed` */
  if (r->par.rank != 0) {
    (void)value(tr, "LanguageCrossEntropy"), (void)value(tr, "MulticlassAccuracy");
    (void)value(ev, "MulticlassAccuracy"), (void)value(ev, "MulticlassF1Score");
    return;
  }
  printf("epoch %3lld  train_loss %.4f  train_acc %.4f  eval_acc %.4f  eval_f1 %.4f  lr %.5f\n",
         (long long)r->ts.epoch + 1, value(tr, "LanguageCrossEntropy"), value(tr, "MulticlassAccuracy"),
         value(ev, "MulticlassAccuracy"), value(ev, "MulticlassF1Score"), ks_optimizer_lr(r->opt));
  fflush(stdout);
}

/* "label/Name" of the program's own metrics (eval/MulticlassAccuracy), computed now. */
static double monitored(run *r, const char *metric) {
  const char *slash = strchr(metric, '/');
  if (!slash) return -1;
  char label[256];
  snprintf(label, sizeof label, "%.*s", (int)(slash - metric), metric);
  ks_metric_collection *mc =
      !strcmp(label, "train") ? ks_state_train_metrics(r->st) : ks_state_eval_metrics(r->st, label);
  return mc ? value(mc, slash + 1) : -1;
}

static void early_stop_check(run *r) {
  if (!r->a.early_metric[0]) return;
  if (!ks_early_stop_update(&r->early, monitored(r, r->early.monitor), r->ts.epoch)) return;
  r->stopping = 1;
  if (r->par.rank == 0)
    printf("early stopping after epoch %lld: %s did not improve for %lld epochs (best %.4f)\n",
         (long long)r->ts.epoch + 1, r->early.monitor, (long long)r->early.patience, r->early.best_score);
}

static int train(run *r) {
  if (r->a.early_metric[0] && r->early.stopped_epoch >= 0) return 0; /* resumed after it fired */
  while (r->ts.epoch < r->a.epochs) {
    if (r->ds.sample_in_epoch == 0) { /* a fresh epoch (also right after resuming at an epoch boundary) */
      ks_metric_collection *tr = ks_state_train_metrics(r->st);
      for (size_t i = 0; i < ks_metric_collection_count(tr); i++) ks_metric_reset(ks_metric_collection_at(tr, i, NULL));
    }
    epoch_order(r);
    while ((size_t)r->ds.sample_in_epoch < r->n_train) {
      float loss;
      if (train_batch(r, &loss)) return 1;
      progress(r, loss);
      digits_test_after_batch(r->ts.batch);
      if (par_should_save(&r->par, r->mgr, &r->ts, 0) && save(r)) return 1;
      int sig = par_max(&r->par, ks_preemption_signal()); /* a signal on any rank stops every rank */
      if (sig) return preempted(r, sig);
      if (r->a.halt_after && r->ts.batch == r->a.halt_after && digits_test_this_rank()) {
        fflush(stdout);
        _exit(137); /* like a kill: no cleanup, no final save */
      }
    }
    if (evaluate(r) || sync_results(r)) return 1;
    epoch_line(r);
    early_stop_check(r);
    ks_timestamp_epoch_done(&r->ts);
    r->ds.epoch++;
    r->ds.sample_in_epoch = 0;
    if (par_should_save(&r->par, r->mgr, &r->ts, 1) && save(r)) return 1;
    if (r->stopping) break;
  }
  return 0;
}

static int finish(run *r) {
  ks_error we;
  ks_error_clear(&we);
  ks_status ws = r->par.on ? par_wait(&r->par, &we)
                           : ks_ckpt_manager_wait(r->mgr, &we); /* the last background save must have landed */
  if (ws) {
    fail("background save", ws, &we);
    storage_detail(r);
    if (!r->a.continue_on_save_error) return 1;
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", ks_storage_path(r->store), r->par.on ? "final" : "final.keepsake");
  ks_error e;
  ks_error_clear(&e);
  ks_save_opts so = {.io = ks_storage_io(r->store)};
  ks_status s = r->par.on ? par_save_final(&r->par, r->st, path, &e) : ks_state_save(r->st, path, &so, &e);
  if (s) return fail("saving the final state", s, &e);
  if (r->par.rank == 0)
    printf("final eval accuracy %.4f (%s)\n", value(ks_state_eval_metrics(r->st, "eval"), "MulticlassAccuracy"), path);
  return 0;
}

static void teardown(run *r) {
  ks_ckpt_manager_free(r->mgr);
  ks_io_cache_free(r->cache[0]); /* before the stores they wrap */
  ks_io_cache_free(r->cache[1]);
  ks_storage_free(r->store);
  ks_storage_free(r->upload);
  ks_state_free(r->st);
  ks_optimizer_free(r->opt);
  mlp_free(&r->model);
  free(r->order);
  digits_free(&r->data);
}

int main(int argc, char **argv) {
  run r;
  memset(&r, 0, sizeof r);
  if (par_init(&argc, &argv, &r.par)) return fail("MPI_Init", KS_E_IO, NULL);
  digits_test_set_rank(r.par.rank);
  if (parse_args(argc, argv, &r.a)) {
    par_finish(&r.par);
    return usage();
  }
  if (digits_load(r.a.data, &r.data)) return 1;
  int rc = build(&r);
  if (!rc && r.a.autoresume) rc = resume(&r);
  if (!rc) rc = train(&r);
  if (!rc) rc = finish(&r);
  teardown(&r);
  if (rc == 0 || rc == KS_EXIT_PREEMPTED) par_finish(&r.par);
  else if (r.par.on) _exit(rc); /* a failed collective: mpirun ends the others */
  return rc;
}
