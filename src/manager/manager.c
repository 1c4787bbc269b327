/*
 * Checkpoint manager: interval, file names, the `latest` symlink, retention and
 * autoresume. Ordering of checkpoints comes from the timestamp inside each file,
 * never from file times, so it is the same on every machine.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "manager/manager_internal.h"

static ks_status parse_interval(const char *spec, int64_t *every, int *epochs) {
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

static ks_status mkdir_p(const char *dir, ks_error *err) {
  char buf[4096];
  if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf) return ks__err(err, KS_E_LIMIT, "run dir too long");
  for (char *p = buf + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(buf, 0777) && errno != EEXIST) return ks__err_at(err, KS_E_IO, buf, NULL, -1, "mkdir: %s", strerror(errno));
    *p = '/';
  }
  if (mkdir(buf, 0777) && errno != EEXIST) return ks__err_at(err, KS_E_IO, buf, NULL, -1, "mkdir: %s", strerror(errno));
  return KS_OK;
}

ks_status ks_ckpt_manager_create(const ks_ckpt_opts *opts, ks_ckpt_manager **out, ks_error *err) {
  if (!opts || !opts->run_dir || !*opts->run_dir || !out || opts->keep < 0)
    return ks__err(err, KS_E_INVALID, "checkpoint manager: run_dir and out are required, keep >= 0");
  const char *tmpl = opts->filename ? opts->filename : "ep{epoch}-ba{batch}.keepsake";
  ks_ckpt_manager m = {.alloc = *ks__alloc_or_default(opts->alloc), .keep = opts->keep, .io = opts->io,
                       .no_fsync = opts->no_fsync, .log = opts->log ? opts->log : stderr};
  if (parse_interval(opts->save_interval, &m.every, &m.by_epoch))
    return ks__err(err, KS_E_INVALID, "save interval '%s': expected e.g. 100ba or 1ep", opts->save_interval);
  if (!valid_template(tmpl)) return ks__err(err, KS_E_INVALID, "filename template '%s' is not valid", tmpl);
  ks_status s = mkdir_p(opts->run_dir, err);
  if (s) return s;
  ks_ckpt_manager *p = ks__calloc(&m.alloc, 1, sizeof *p);
  if (p) {
    *p = m;
    p->run_dir = ks__strdup(&m.alloc, opts->run_dir);
    p->tmpl = ks__strdup(&m.alloc, tmpl);
  }
  if (!p || !p->run_dir || !p->tmpl) {
    ks_ckpt_manager_free(p);
    return ks__err(err, KS_E_NOMEM, "out of memory");
  }
  *out = p;
  return KS_OK;
}

void ks_ckpt_manager_free(ks_ckpt_manager *m) {
  if (!m) return;
  ks__free(&m->alloc, m->run_dir);
  ks__free(&m->alloc, m->tmpl);
  ks__free(&m->alloc, m->last_path);
  ks__free(&m->alloc, m);
}

int ks_ckpt_manager_due(const ks_ckpt_manager *m, const ks_timestamp *ts, int epoch_end) {
  if (!m || !ts) return 0;
  if (m->by_epoch) return epoch_end && ts->epoch > 0 && ts->epoch % m->every == 0;
  return !epoch_end && ts->batch > 0 && ts->batch % m->every == 0;
}

size_t ks_ckpt_manager_skipped(const ks_ckpt_manager *m) { return m ? m->skipped : 0; }

/* Expands the template with the timestamp into `name` (cap bytes). */
static ks_status expand(const char *tmpl, const ks_timestamp *ts, char *name, size_t cap) {
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

ks_status ks__mgr_join(const ks_ckpt_manager *m, const char *name, char *out, size_t cap) {
  int w = snprintf(out, cap, "%s/%s", m->run_dir, name);
  return w < 0 || (size_t)w >= cap ? KS_E_LIMIT : KS_OK;
}

/*
 * Points `latest` at `name` atomically: a symlink under a temporary name is
 * renamed over it, then the directory is fsynced so the switch is durable.
 */
static ks_status update_latest(ks_ckpt_manager *m, const char *name, ks_error *err) {
  char tmp[4096], dst[4096];
  if (ks__mgr_join(m, ".latest.tmp", tmp, sizeof tmp) || ks__mgr_join(m, "latest", dst, sizeof dst))
    return ks__err(err, KS_E_LIMIT, "run dir path too long");
  const ks_io *io = m->io ? m->io : ks_io_posix();
  unlink(tmp);
  if (symlink(name, tmp)) return ks__err_at(err, KS_E_IO, tmp, NULL, -1, "symlink: %s", strerror(errno));
  int e = io->rename_fn(io->ctx, tmp, dst);
  if (e) {
    unlink(tmp);
    return ks__err_at(err, KS_E_IO, dst, NULL, -1, "rename: %s", strerror(e));
  }
  e = m->no_fsync ? 0 : io->fsync_dir_fn(io->ctx, m->run_dir);
  return e ? ks__err_at(err, KS_E_IO, m->run_dir, NULL, -1, "fsync dir: %s", strerror(e)) : KS_OK;
}

ks_status ks_ckpt_manager_save(ks_ckpt_manager *m, const ks_state *st, const char **saved, ks_error *err) {
  if (!m || !st) return ks__err(err, KS_E_INVALID, "save: NULL argument");
  ks_timestamp zero;
  ks_timestamp_init(&zero);
  const ks_timestamp *ts = ks_state_timestamp(st);
  char name[1024], path[4096];
  if (expand(m->tmpl, ts ? ts : &zero, name, sizeof name) || ks__mgr_join(m, name, path, sizeof path))
    return ks__err(err, KS_E_LIMIT, "checkpoint path too long");
  ks_save_opts so = {.alloc = &m->alloc, .io = m->io, .no_fsync = m->no_fsync};
  ks_status s = ks_state_save(st, path, &so, err);
  if (!s) s = update_latest(m, name, err);
  if (!s && m->keep > 0) s = ks__mgr_prune(m, name, err);
  if (s) return s;
  char *copy = ks__strdup(&m->alloc, path);
  if (!copy) return ks__err(err, KS_E_NOMEM, "out of memory");
  ks__free(&m->alloc, m->last_path);
  m->last_path = copy;
  if (saved) *saved = m->last_path;
  return KS_OK;
}
