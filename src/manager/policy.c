/*
 * Checkpoint manager, what decides: the save triggers (interval, clock, preemption), file
 * names, the `latest` symlink, retention after each commit and the run directory's lock.
 * What writes lives beside it: checkpoint files in files.c, checkpoint directories in
 * dirs.c; listing and autoresume in scan.c. Ordering of checkpoints comes from the timestamp
 * inside each file, never from file times, so it is the same on every machine.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/io_ops.h"
#include "keepsake/layout.h"
#include "manager/manager_internal.h"

static KS_NODISCARD ks_status parse_interval(const char *spec, int64_t *every, int *epochs) {
  if (!spec) spec = "1ep";
  char *end;
  errno = 0;
  long long v = strtoll(spec, &end, 10);
  if (errno || end == spec || v <= 0) return KS_E_INVALID;
  if (!strcmp(end, "ba")) *epochs = 0;
  else if (!strcmp(end, "ep")) *epochs = 1;
  else return KS_E_INVALID;
  *every = v;
  return KS_OK;
}

/* Only {epoch} {batch} {sample} may appear, and no '/' (files live in run_dir). */
static int valid_template(const char *t) {
  if (!*t || strchr(t, '/') || t[0] == '.') return 0;
  for (const char *p = strchr(t, '{'); p; p = strchr(p + 1, '{'))
    if (strncmp(p, "{epoch}", 7) && strncmp(p, "{batch}", 7) && strncmp(p, "{sample}", 8)) return 0;
  return 1;
}

static double mono_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

void ks__mgr_touch(ks_ckpt_manager *m) { m->last_save_time = mono_now(); }

/* Parses "eval/Name", "train/Name" or a full "state/..." metric path into its `_computed` key. */
static KS_NODISCARD ks_status metric_key(const char *metric, char *key, size_t cap) {
  int w;
  if (!metric || !*metric) return KS_E_INVALID;
  if (!strncmp(metric, "state/", 6)) w = snprintf(key, cap, "%s/_computed", metric);
  else if (!strncmp(metric, "train/", 6)) w = snprintf(key, cap, "state/train_metrics/%s/_computed", metric + 6);
  /* The key layout's own folder names (the Python package's spelling): train_metrics/Name, eval_metrics/label/Name. */
  else if (!strncmp(metric, "train_metrics/", 14)) w = snprintf(key, cap, "state/%s/_computed", metric);
  else if (!strncmp(metric, "eval_metrics/", 13)) w = snprintf(key, cap, "state/%s/_computed", metric);
  else if (strchr(metric, '/')) w = snprintf(key, cap, "state/eval_metrics/%s/_computed", metric);
  else return KS_E_INVALID;
  return w < 0 || (size_t)w >= cap ? KS_E_LIMIT : KS_OK;
}

/*
 * With the program's metrics given (opts.metrics), keep_best must name one of them: a metric
 * the program never saves would rank nothing, and no error would ever say so.
 */
static KS_NODISCARD ks_status check_best_metric(const ks_ckpt_opts *o, const ks__retention *r, ks_error *err) {
  if (!o->keep_best || !o->metrics) return KS_OK;
  size_t len = strlen(r->metric_key) - strlen("/" KS_KEY_METRIC_COMPUTED); /* metric_key ends with it */
  char have[KS_ERROR_MSG_MAX / 2] = "";
  size_t used = 0;
  for (size_t i = 0; i < o->n_metrics; i++) {
    const char *p = o->metrics[i];
    if (!p) continue;
    if (strlen(p) == len && !strncmp(p, r->metric_key, len)) return KS_OK;
    const char *shown = strncmp(p, "state/", 6) ? p : p + 6; /* as best_metric spells it */
    int w = snprintf(have + used, sizeof have - used, "%s%s", used ? ", " : "", shown);
    if (w > 0) used = (size_t)w < sizeof have - used ? used + (size_t)w : sizeof have - 1;
  }
  return ks__err(err, KS_E_INVALID, "keep_best: best_metric '%s' (%.*s) names no metric of the program; %s%s",
                 r->metric_name, (int)len, r->metric_key, used ? "its metrics: " : "it gives the manager no metrics",
                 have);
}

/* The preservation policies of opts, checked. */
static KS_NODISCARD ks_status parse_retention(const ks_ckpt_opts *o, ks__retention *r, ks_error *err) {
  *r = (ks__retention){.keep_latest = o->keep, .keep_best = o->keep_best, .best_min = o->best_mode == KS_BEST_MIN,
                       .period_seconds = o->keep_period_seconds};
  if (o->keep_best < 0 || !(o->keep_period_seconds >= 0) ||
      (o->best_mode != KS_BEST_MAX && o->best_mode != KS_BEST_MIN))
    return ks__err(err, KS_E_INVALID, "retention: keep_best, best_mode or keep_period_seconds out of range");
  if (o->keep_best) {
    if (metric_key(o->best_metric, r->metric_key, sizeof r->metric_key))
      return ks__err(err, KS_E_INVALID, "keep_best: metric '%s': expected label/Name (eval/MulticlassAccuracy), "
                     "train/Name or a state/... path", o->best_metric ? o->best_metric : "(none)");
    snprintf(r->metric_name, sizeof r->metric_name, "%s", o->best_metric);
    ks_status s = check_best_metric(o, r, err);
    if (s) return s;
  }
  if (o->keep_every && parse_interval(o->keep_every, &r->every, &r->every_epochs))
    return ks__err(err, KS_E_INVALID, "keep_every '%s': expected e.g. 5ep or 500ba", o->keep_every);
  return KS_OK;
}

/* The upload side, when there is one: a valid table and a run directory in it (created there). */
static KS_NODISCARD ks_status check_upload(const ks_ckpt_opts *o, ks_error *err) {
  if (!o->upload_io) return KS_OK;
  if (!o->upload_dir || !*o->upload_dir) return ks__err(err, KS_E_INVALID, "upload_io needs an upload_dir");
  ks_status s = ks_io_check(o->upload_io, err);
  if (!s) s = ks__io_mkdir_p(o->upload_io, o->upload_dir, err);
  if (s) ks__err_set_file(err, o->upload_dir);
  return s;
}

/* Who holds a lock, for the message a second manager gets: "pid N on host H since T". */
static void lock_owner(char *buf, size_t cap) {
  char host[256] = "?";
  if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "?");
  host[sizeof host - 1] = '\0';
  char when[32] = "";
  time_t now = time(NULL);
  struct tm tm;
  if (gmtime_r(&now, &tm)) strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
  snprintf(buf, cap, "pid %ld on host %s since %s\n", (long)getpid(), host, when);
}

/* A table without locks: unlocked under KS_CKPT_LOCK_AUTO, refused under KS_CKPT_LOCK_REQUIRE. `why`: what the
 * table said when asked (a store without conditional writes answers lock_fn with ENOTSUP), or NULL. */
static KS_NODISCARD ks_status no_lock(const char *run_dir, ks_ckpt_lock policy, const char *why, ks_error *err) {
  if (policy == KS_CKPT_LOCK_AUTO) return KS_OK;
  return ks__err_at(err, KS_E_UNSUPPORTED, run_dir, NULL, -1,
                    "checkpoint manager: this storage cannot lock the run directory (KS_CKPT_LOCK_REQUIRE)%s%s",
                    why ? ": " : "", why ? why : "");
}

/* Takes the run directory's lock where the policy and the table allow; *handle -1 when none. */
static KS_NODISCARD ks_status take_lock(const ks_io *io, const char *run_dir, ks_ckpt_lock policy, int *handle,
                                        ks_error *err) {
  *handle = -1;
  if (policy == KS_CKPT_LOCK_OFF) return KS_OK;
  const ks_io *t = io ? io : ks_io_posix();
  if (!(ks_io_caps(t) & KS_IO_CAP_LOCK) || !t->lock_fn) return no_lock(run_dir, policy, NULL, err);
  char path[4096], owner[400], holder[400], why[KS__IO_WHY_MAX];
  int w = snprintf(path, sizeof path, "%s/.keepsake.lock", run_dir);
  if (w < 0 || (size_t)w >= sizeof path)
    return ks__err_at(err, KS_E_LIMIT, run_dir, NULL, -1, "run directory path too long");
  lock_owner(owner, sizeof owner);
  int rc = t->lock_fn(t->ctx, path, owner, handle, holder, sizeof holder);
  if (rc == EWOULDBLOCK)
    return ks__err_at(err, KS_E_LOCKED, run_dir, NULL, -1,
                      "run directory is in use by another checkpoint manager (%s, lock %s); refusing to share it",
                      *holder ? holder : "holder unknown", path);
  if (rc) *handle = -1;
  if (rc == ENOTSUP) return no_lock(run_dir, policy, ks__io_why(t, rc, why, sizeof why), err);
  if (rc)
    return ks__err_at(err, KS_E_IO, run_dir, NULL, -1, "cannot lock the run directory (%s): %s", path,
                      ks__io_why(t, rc, why, sizeof why));
  return KS_OK;
}

static void drop_lock(const ks_io *io, int handle) {
  const ks_io *t = io ? io : ks_io_posix();
  if (handle >= 0 && ks_io_caps(t) & KS_IO_CAP_LOCK && t->unlock_fn) (void)t->unlock_fn(t->ctx, handle);
}

/* The run directory as the table names it. A local table's may be written file://...; another table's
 * paths are its own (an HTTP table's are URLs). A read-only table (HTTP) is refused here: a manager writes. */
static KS_NODISCARD ks_status run_dir_of(const ks_ckpt_opts *opts, const char **run_dir, ks_error *err) {
  unsigned caps = ks_io_caps(opts->io);
  if (caps & KS_IO_CAP_READ_ONLY)
    return ks__err_at(err, KS_E_UNSUPPORTED, opts->run_dir, NULL, -1,
                      "a checkpoint manager writes its run directory, and this location is read-only "
                      "(http(s)://): use a local directory or s3://, and read http(s):// checkpoints with a load");
  if (caps & KS_IO_CAP_LOCAL) return ks_io_local_path(opts->run_dir, run_dir, err);
  if (!opts->run_dir || !*opts->run_dir) return ks__err(err, KS_E_INVALID, "run directory: empty");
  *run_dir = opts->run_dir;
  return KS_OK;
}

ks_status ks_ckpt_manager_create(const ks_ckpt_opts *opts, ks_ckpt_manager **out, ks_error *err) {
  if (!opts || !opts->run_dir || !*opts->run_dir || !out || opts->keep < 0)
    return ks__err(err, KS_E_INVALID, "checkpoint manager: run_dir and out are required, keep >= 0");
  KS__TAKE_OPTS(ks_ckpt_opts, opts, KS__V1_SIZE(ks_ckpt_opts, staging_size), err);
  int sharded = opts->sharded != 0;
  const char *tmpl = opts->filename ? opts->filename : sharded ? "ep{epoch}-ba{batch}" : "ep{epoch}-ba{batch}.keepsake";
  ks_ckpt_manager m = {.alloc = *ks__alloc_or_default(opts->alloc), .keep = opts->keep, .io = opts->io,
                       .log = opts->log ? opts->log : stderr,
                       .retention_log = opts->retention_log, .save_every_seconds = opts->save_every_seconds,
                       .last_save_time = mono_now(), .async_busy = opts->async_busy, .staging = opts->staging,
                       .staging_size = opts->staging_size, .upload_io = opts->upload_io,
                       .upload_retention = opts->upload_retention, .where = "", .sharded = sharded,
                       .lock_handle = -1};
  if (!(opts->save_every_seconds >= 0)) return ks__err(err, KS_E_INVALID, "save_every_seconds must be >= 0");
  ks_status rs = parse_retention(opts, &m.ret, err);
  if (rs) return rs;
  if (parse_interval(opts->save_interval, &m.every, &m.by_epoch))
    return ks__err(err, KS_E_INVALID, "save interval '%s': expected e.g. 100ba or 1ep", opts->save_interval);
  if (!valid_template(tmpl)) return ks__err(err, KS_E_INVALID, "filename template '%s' is not valid", tmpl);
  const char *run_dir = NULL;
  ks_status s = ks_io_check(opts->io, err);
  if (!s) s = run_dir_of(opts, &run_dir, err);
  if (!s) s = ks__io_mkdir_p(opts->io, run_dir, err);
  if (!s) s = check_upload(opts, err);
  ks_ckpt_lock lock = opts->lock; /* 0 (AUTO) for a struct from before 0.4: KS__TAKE_OPTS zero-fills */
  if (!s && lock != KS_CKPT_LOCK_AUTO && lock != KS_CKPT_LOCK_REQUIRE && lock != KS_CKPT_LOCK_OFF)
    s = ks__err(err, KS_E_INVALID, "checkpoint manager: lock policy %d is not a ks_ckpt_lock", (int)lock);
  if (!s) s = take_lock(opts->io, run_dir, lock, &m.lock_handle, err);
  if (s) return s;
  ks_ckpt_manager *p = ks__calloc(&m.alloc, 1, sizeof *p);
  if (p) {
    *p = m;
    p->run_dir = ks__strdup(&m.alloc, run_dir);
    p->tmpl = ks__strdup(&m.alloc, tmpl);
    p->upload_dir = opts->upload_io ? ks__strdup(&m.alloc, opts->upload_dir) : NULL;
  }
  if (!p || !p->run_dir || !p->tmpl || (opts->upload_io && !p->upload_dir)) {
    if (!p) drop_lock(opts->io, m.lock_handle);
    ks_ckpt_manager_free(p);
    return ks__err(err, KS_E_NOMEM, "out of memory");
  }
  *out = p;
  return KS_OK;
}

void ks_ckpt_manager_free(ks_ckpt_manager *m) {
  if (!m) return;
  ks_async_saver_free(m->saver); /* finishes a save in flight: committed, or its temp file removed */
  drop_lock(m->io, m->lock_handle);  /* only after the last write of this manager */
  ks__free(&m->alloc, m->run_dir);
  ks__free(&m->alloc, m->tmpl);
  ks__free(&m->alloc, m->last_path);
  ks__free(&m->alloc, m->upload_dir);
  ks__free(&m->alloc, m);
}

/* The interval trigger: every `every` batches (or epochs) of the timestamp. */
static int due(const ks_ckpt_manager *m, const ks_timestamp *ts, int epoch_end) {
  if (!m || !ts) return 0;
  if (m->by_epoch) return epoch_end && ts->epoch > 0 && ts->epoch % m->every == 0;
  return !epoch_end && ts->batch > 0 && ts->batch % m->every == 0;
}

/*
 * A loop that never advances its timestamp never comes due, and nothing would say so: the
 * calls of one kind (batch ends, epoch ends) that see the same timestamp in a row are counted,
 * and the log is told once. The watch is the manager's own bookkeeping, not its state: the
 * call stays const to its callers (a manager is never used from two threads at once).
 */
static void watch_progress(const ks_ckpt_manager *cm, const ks_timestamp *ts, int epoch_end) {
  ks_ckpt_manager *m = (ks_ckpt_manager *)(uintptr_t)cm; /* allocated by ks_ckpt_manager_create: not const */
  int k = epoch_end != 0;
  int64_t batch = k ? 0 : ts->batch; /* an epoch end is stuck when its epoch is */
  if (m->seen[k].repeats && m->seen[k].epoch == ts->epoch && m->seen[k].batch == batch) {
    m->seen[k].repeats++;
  } else {
    m->seen[k].epoch = ts->epoch;
    m->seen[k].batch = batch;
    m->seen[k].repeats = 1;
  }
  if (m->warned_stuck || m->seen[k].repeats < KS_CKPT_STUCK_CALLS) return;
  m->warned_stuck = 1;
  fprintf(m->log, "keepsake: warning: %d %s in a row saw the same timestamp (epoch %lld, batch %lld): the "
          "training loop does not advance it, so no save interval comes due; count each batch (and epoch) in "
          "the timestamp before the step (said once)\n", KS_CKPT_STUCK_CALLS,
          k ? "epoch ends" : "batch ends", (long long)ts->epoch, (long long)ts->batch);
  fflush(m->log);
}

int ks_ckpt_manager_should_save(const ks_ckpt_manager *m, const ks_timestamp *ts, int epoch_end) {
  if (!m || !ts) return 0;
  watch_progress(m, ts, epoch_end);
  if (due(m, ts, epoch_end)) return 1;
  if (epoch_end) return 0;
  if (ks_preemption_signal()) return 1;
  return m->save_every_seconds > 0 && mono_now() - m->last_save_time >= m->save_every_seconds;
}

size_t ks_ckpt_manager_skipped(const ks_ckpt_manager *m) { return m ? m->skipped : 0; }

/* Expands the template with the timestamp into `name` (cap bytes). */
static KS_NODISCARD ks_status expand(const char *tmpl, const ks_timestamp *ts, char *name, size_t cap) {
  size_t n = 0;
  for (const char *p = tmpl; *p;) {
    int w;
    if (!strncmp(p, "{epoch}", 7)) w = snprintf(name + n, cap - n, "%lld", (long long)ts->epoch), p += 7;
    else if (!strncmp(p, "{batch}", 7)) w = snprintf(name + n, cap - n, "%lld", (long long)ts->batch), p += 7;
    else if (!strncmp(p, "{sample}", 8)) w = snprintf(name + n, cap - n, "%lld", (long long)ts->sample), p += 8;
    else w = snprintf(name + n, cap - n, "%c", *p++);
    if (w < 0 || (size_t)w >= cap - n) return KS_E_LIMIT;
    n += (size_t)w;
  }
  return KS_OK;
}

ks_status ks__mgr_expand(const ks_ckpt_manager *m, const ks_timestamp *ts, char *name, size_t cap) {
  return expand(m->tmpl, ts, name, cap);
}

ks_status ks__mgr_join(const ks_ckpt_manager *m, const char *name, char *out, size_t cap) {
  int w = snprintf(out, cap, "%s/%s", m->run_dir, name);
  return w < 0 || (size_t)w >= cap ? KS_E_LIMIT : KS_OK;
}

/*
 * Points `latest` at `name` atomically: a link under a temporary name is renamed
 * over it, then the directory is fsynced so the switch is durable.
 */
static KS_NODISCARD ks_status update_latest(ks_ckpt_manager *m, const char *name, ks_error *err) {
  return ks__io_pointer_set(m->io, m->run_dir, "latest", name, err);
}

/* What follows a durable checkpoint, in order: `latest`, then retention, then the upload (if any). Runs on the saver's
 * thread for async saves; the manager is not touched by the caller's thread meanwhile. */
ks_status ks__mgr_after_commit(void *ctx, const char *path, ks_error *err) {
  ks_ckpt_manager *m = ctx;
  const char *slash = strrchr(path, '/');
  const char *name = slash ? slash + 1 : path;
  ks_status s = update_latest(m, name, err);
  if (!s) s = ks__mgr_prune(m, name, err);
  if (!m->upload_io) return s;
  ks_error ue;
  ks_error_clear(&ue);
  ks_status us = ks__mgr_upload(m, name, &ue); /* the local checkpoint is committed: upload it regardless */
  if (us && !s && err) *err = ue;
  else if (us) fprintf(m->log, "keepsake: warning: %s\n", ue.message);
  return s ? s : us;
}

/* The checkpoint's path from the template; remembered as last_path. */
ks_status ks__mgr_next_path(ks_ckpt_manager *m, const ks_timestamp *ts, ks_error *err) {
  ks_timestamp zero;
  ks_timestamp_init(&zero);
  char name[1024], path[4096];
  if (expand(m->tmpl, ts ? ts : &zero, name, sizeof name) || ks__mgr_join(m, name, path, sizeof path))
    return ks__err(err, KS_E_LIMIT, "checkpoint path too long");
  char *copy = ks__strdup(&m->alloc, path);
  if (!copy) return ks__err(err, KS_E_NOMEM, "out of memory");
  ks__free(&m->alloc, m->last_path);
  m->last_path = copy;
  return KS_OK;
}

ks_status ks_ckpt_manager_wait(ks_ckpt_manager *m, ks_error *err) {
  if (!m) return ks__err(err, KS_E_INVALID, "wait: NULL manager");
  return m->saver ? ks_async_saver_wait(m->saver, err) : KS_OK;
}

