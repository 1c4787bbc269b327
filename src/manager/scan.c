/*
 * Finding checkpoints in a run directory: listing, ordering by the timestamp
 * stored inside, retention, and autoresume from the newest one that verifies.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/io_ops.h"
#include "keepsake/layout.h"
#include "manager/manager_internal.h"

void ks__mgr_list_free(const ks_allocator *a, ckpt_list *l) {
  for (size_t i = 0; i < l->n; i++) ks__free(a, l->v[i].name);
  ks__free(a, l->v);
  l->v = NULL;
  l->n = l->cap = 0;
}

/* Length of the placeholder at t ({epoch} {batch} {sample}), 0 when t is plain text. */
static size_t placeholder_len(const char *t) {
  if (!strncmp(t, "{epoch}", 7) || !strncmp(t, "{batch}", 7)) return 7;
  return strncmp(t, "{sample}", 8) ? 0 : 8;
}

/*
 * Whether `name` is what the template expands to for some timestamp: text
 * matches itself, a placeholder one or more digits (after an optional '-').
 * Other files in the run dir (a final export, a copied checkpoint) are neither
 * resumed from nor deleted by retention.
 */
static int matches_template(const char *t, const char *name) {
  for (; *t; t++, name++) {
    size_t k = placeholder_len(t);
    if (k) {
      if (*name == '-') name++;
      /* Adjacent placeholders ("{epoch}{batch}") split a digit run: try every split. */
      for (const char *d = name; *d >= '0' && *d <= '9'; d++)
        if (matches_template(t + k, d + 1)) return 1;
      return 0;
    }
    if (*name != *t) return 0;
  }
  return *name == '\0';
}

/* A checkpoint of this run: a regular file (not a link, not a temp file) named by the template. */
static int is_candidate(const ks_ckpt_manager *m, const char *name, ks_io_kind kind) {
  return kind == (m->sharded ? KS_IO_DIR : KS_IO_FILE) && name[0] != '.' && matches_template(m->tmpl, name);
}

/* The stored value of the best-N metric: a finite one-element `_computed` tensor, or none (and why). */
static void probe_metric(const ks_ckpt_manager *m, const ks_reader *r, ckpt *c) {
  ks_tensor t;
  if (!m->ret.keep_best) return;
  c->unranked = "the metric was never computed before the save (its _computed is None or absent)";
  if (ks_reader_tensor(r, m->ret.metric_key, &t, NULL)) return;
  c->unranked = "its _computed is not one floating-point number";
  if (ks_tensor_numel(&t) != 1 || !ks_dtype_is_float(t.dtype)) return;
  double v = ks_dtype_get_f64(t.dtype, t.data, 0);
  c->unranked = "its _computed is NaN or infinite";
  if (v != v || v - v != 0) return; /* NaN or infinite */
  c->unranked = NULL;
  c->metric = v;
  c->has_metric = 1;
}

#define TS_PREFIX KS_KEY_TIMESTAMP

/* Reads the timestamp out of the checkpoint file `path` without verifying its data. */
void ks__mgr_probe_file(const ks_ckpt_manager *m, const char *path, ckpt *c) {
  ks_reader *r = NULL;
  ks_statedict *sd = NULL;
  ks_read_opts ro = {.alloc = &m->alloc, .mode = ks__io_read_mode(m->io), .io = m->io}; /* lazy: the header only */
  ks_error e;
  ks_error_clear(&e);
  snprintf(c->why, sizeof c->why, "no training timestamp in it");
  if ((c->code = ks_reader_open(path, &ro, &r, &e)) != KS_OK) {
    c->nomem = e.code == KS_E_NOMEM;
    snprintf(c->why, sizeof c->why, "%s (%s)", e.message, ks_status_name(e.code));
    return;
  }
  c->code = ks_statedict_create(&m->alloc, &sd, NULL);
  if (!c->code) c->code = ks_reader_scalars(r, sd, NULL);
  c->nomem = c->code == KS_E_NOMEM; /* not a damaged file: the listing fails instead */
  if (c->code) snprintf(c->why, sizeof c->why, "cannot read its scalars (%s)", ks_status_name(c->code));
  if (!c->code && !ks__get_int(sd, TS_PREFIX, "batch", &c->batch, NULL) &&
      !ks__get_int(sd, TS_PREFIX, "epoch", &c->epoch, NULL) &&
      !ks__get_int(sd, TS_PREFIX, "sample", &c->sample, NULL)) {
    c->readable = 1;
    if (ks__get_int(sd, TS_PREFIX, "batch_in_epoch", &c->batch_in_epoch, NULL)) c->batch_in_epoch = -1;
    if (ks__get_float(sd, TS_PREFIX, "total_wct", &c->wct, NULL)) c->wct = 0;
    probe_metric(m, r, c);
  }
  ks_statedict_free(sd);
  ks_reader_free(r);
}

static KS_NODISCARD ks_status list_add(const ks_ckpt_manager *m, ckpt_list *l, const char *name) {
  ks_status s = ks__grow(&m->alloc, &l->v, &l->cap, l->n + 1, sizeof *l->v);
  if (s) return s;
  ckpt c = {.name = ks__strdup(&m->alloc, name)};
  if (!c.name) return KS_E_NOMEM;
  char path[4096];
  if (ks__mgr_join(m, c.name, path, sizeof path)) snprintf(c.why, sizeof c.why, "path too long");
  else if (m->sharded) ks__mgr_probe_dir(m, path, &c);
  else ks__mgr_probe_file(m, path, &c);
  if (c.nomem) {
    ks__free(&m->alloc, c.name);
    return KS_E_NOMEM;
  }
  l->v[l->n++] = c;
  return KS_OK;
}

/* Newest first: readable ones by (batch, epoch, sample), then name; unreadable ones last. */
static int newest_first(const void *pa, const void *pb) {
  const ckpt *a = pa, *b = pb;
  if (a->readable != b->readable) return b->readable - a->readable;
  if (a->batch != b->batch) return a->batch > b->batch ? -1 : 1;
  if (a->epoch != b->epoch) return a->epoch > b->epoch ? -1 : 1;
  if (a->sample != b->sample) return a->sample > b->sample ? -1 : 1;
  return strcmp(b->name, a->name);
}

typedef struct list_ctx {
  const ks_ckpt_manager *m;
  ckpt_list *l;
  ks_status s;
} list_ctx;

static int on_entry(void *ctx, const char *name, ks_io_kind kind) {
  list_ctx *c = ctx;
  if (!is_candidate(c->m, name, kind)) return 0;
  c->s = list_add(c->m, c->l, name);
  return c->s ? ECANCELED : 0;
}

ks_status ks__mgr_list(const ks_ckpt_manager *m, ckpt_list *l, ks_error *err) {
  const ks_io *io = ks__io_v2(m->io);
  list_ctx c = {m, l, KS_OK};
  int rc = io->list_fn(io->ctx, m->run_dir, "", on_entry, &c);
  if (c.s || rc) {
    ks__mgr_list_free(&m->alloc, l);
    if (c.s) return ks__err(err, c.s, "listing checkpoints: %s", ks_strerror(c.s));
    char why[KS__IO_WHY_MAX];
    return ks__err_at(err, KS_E_IO, m->run_dir, NULL, -1, "listing checkpoints: %s",
                      ks__io_why(io, rc, why, sizeof why));
  }
  if (l->n) qsort(l->v, l->n, sizeof(ckpt), newest_first);
  return KS_OK;
}

/* Retention's view of the readable checkpoints of l (which come first, newest first). */
static KS_NODISCARD ks_status infos(const ks_ckpt_manager *m, const ckpt_list *l, ks__ckpt_info **out, size_t *n) {
  size_t k = 0;
  while (k < l->n && l->v[k].readable) k++;
  *n = k;
  *out = k ? ks__calloc(&m->alloc, k, sizeof **out) : NULL;
  if (k && !*out) return KS_E_NOMEM;
  for (size_t i = 0; i < k; i++) {
    const ckpt *c = &l->v[i];
    (*out)[i] = (ks__ckpt_info){.name = c->name, .batch = c->batch, .epoch = c->epoch,
                               .batch_in_epoch = c->batch_in_epoch, .wct = c->wct,
                               .has_metric = c->has_metric, .metric = c->metric};
  }
  return KS_OK;
}

/* Deletes what no policy keeps; a failed unlink is reported, and the rest still run. */
static KS_NODISCARD ks_status apply(ks_ckpt_manager *m, const ks__ckpt_info *v, size_t n, const char *keep_name,
                                    ks_error *err) {
  const ks_io *io = ks__io_v1(m->io);
  ks_status s = KS_OK;
  for (size_t i = 0; i < n; i++) {
    char path[4096];
    int keep = v[i].keep || !strcmp(v[i].name, keep_name);
    if (m->retention_log) {
      const char *where = m->where ? m->where : "";
      if (keep)
        fprintf(m->retention_log, "keepsake: kept %s%s: %s\n", where, v[i].name, v[i].why[0] ? v[i].why : "just saved");
      else fprintf(m->retention_log, "keepsake: deleted %s%s: kept by no policy\n", where, v[i].name);
    }
    if (keep || ks__mgr_join(m, v[i].name, path, sizeof path)) continue;
    int rc = m->sharded ? ks__mgr_remove_dir(m, path) : io->unlink_fn(io->ctx, path);
    if (rc && rc != ENOENT && !s) s = ks__err_at(err, KS_E_IO, path, NULL, -1, "retention: unlink: %s", strerror(rc));
  }
  if (m->retention_log) fflush(m->retention_log);
  return s;
}

/* keep_best that silently ranks nothing is said once: the checkpoint just saved holds no value it can rank. */
static void warn_unranked(ks_ckpt_manager *m, const ckpt_list *l, const char *keep_name) {
  for (size_t i = 0; !m->warned_unranked && i < l->n; i++) {
    const ckpt *c = &l->v[i];
    if (!c->readable || !c->unranked || strcmp(c->name, keep_name)) continue;
    fprintf(m->log, "keepsake: warning: keep_best cannot rank %s%s by '%s': %s; such checkpoints are never "
            "among the best (said once)\n", m->where ? m->where : "", c->name, m->ret.metric_name, c->unranked);
    fflush(m->log);
    m->warned_unranked = 1;
  }
}

ks_status ks__mgr_prune(ks_ckpt_manager *m, const char *keep_name, ks_error *err) {
  ckpt_list l = {0};
  ks_status s = ks__mgr_list(m, &l, err);
  if (s) return s;
  warn_unranked(m, &l, keep_name);
  ks__ckpt_info *v = NULL;
  size_t n = 0;
  s = infos(m, &l, &v, &n);
  if (s) s = ks__err(err, s, "retention: out of memory");
  if (!s) {
    ks__retention_decide(&m->ret, v, n);
    s = apply(m, v, n, keep_name, err);
  }
  ks__free(&m->alloc, v);
  ks__mgr_list_free(&m->alloc, &l);
  return s;
}

/* Temp files (".<name>.tmp-XXXXXX", ".latest.tmp") of saves that were killed halfway. */
static int on_leftover(void *ctx, const char *name, ks_io_kind kind) {
  ks_ckpt_manager *m = ctx;
  char path[4096];
  if (kind == KS_IO_DIR || !strstr(name, ".tmp") || ks__mgr_join(m, name, path, sizeof path)) return 0;
  const ks_io *io = ks__io_v1(m->io);
  int rc = io->unlink_fn(io->ctx, path);
  if (rc && rc != ENOENT)
    fprintf(m->log, "keepsake: warning: cannot remove temporary file %s: %s\n", path, strerror(rc));
  return 0;
}

/*
 * Never valid, always safe to remove. A failure to list or remove is only a
 * warning: a temp file never matches the template, so it cannot be resumed from.
 */
static void remove_leftovers(ks_ckpt_manager *m) {
  const ks_io *io = ks__io_v2(m->io);
  int rc = io->list_fn(io->ctx, m->run_dir, ".", on_leftover, m);
  if (rc) fprintf(m->log, "keepsake: warning: cannot list %s for temporary files: %s\n", m->run_dir, strerror(rc));
}

/*
 * A damaged checkpoint is renamed to <name>.corrupt: kept for inspection, but no
 * longer matching the template, so no later autoresume tries it and no policy
 * ranks it (its stored metric could be the damaged bytes).
 */
static void warn_skip(ks_ckpt_manager *m, const char *name, const char *why) {
  char from[4096], to[4096];
  const ks_io *io = ks__io_v1(m->io);
  int moved = !ks__mgr_join(m, name, from, sizeof from) &&
              snprintf(to, sizeof to, "%s.corrupt", from) < (int)sizeof to && io->rename_fn(io->ctx, from, to) == 0;
  fprintf(m->log, "keepsake: warning: skipping checkpoint %s/%s: %s%s\n", m->run_dir, name, why,
          moved ? " (moved aside to .corrupt)" : "");
  m->skipped++;
}

/* The local file system (where an I/O error is the file's own fault), not a remote store. */
static int local_table(const ks_io *io) { return (ks_io_caps(io) & KS_IO_CAP_LOCAL) != 0; }

/* Loads c if it fully verifies; a file that does not comes back as `bad` = 1 with a warning. */
static KS_NODISCARD ks_status try_one(ks_ckpt_manager *m, const char *name, ks_state *st, const ks_load_opts *opts,
                         ks_load_report *report, int *bad, ks_error *err) {
  const ks_io *io = opts->io ? opts->io : m->io;
  char path[4096];
  ks_error e;
  ks_error_clear(&e);
  ks_statedict *sd = NULL;
  ks_meta *meta = NULL;
  /* A table that cannot map (remote) is read lazily: parallel ranges, each tensor verified on arrival. */
  ks_read_opts ro = {.alloc = &m->alloc, .mode = ks__io_read_mode(io), .verify_checksums = 1, .io = io};
  if (ks__mgr_join(m, name, path, sizeof path)) return ks__err(err, KS_E_LIMIT, "path too long");
  ks_status s = ks_load(path, &ro, &sd, &meta, &e);
  if (s == KS_E_NOMEM) return ks__err(err, s, "out of memory loading %s", path);
  /* A store that failed (after its retries) says nothing about the checkpoint: never set it aside. */
  if (s == KS_E_IO && !local_table(io))
    return ks__err_at(err, s, path, NULL, -1, "autoresume: cannot read %s: %s", path, e.message);
  if (s) {
    char why[KS_ERROR_MSG_MAX + 40];
    snprintf(why, sizeof why, "%s (%s)", e.message, ks_status_name(e.code));
    warn_skip(m, name, why);
    *bad = 1;
    return KS_OK;
  }
  s = ks_state_load_state_dict(st, sd, meta, opts, report, err);
  if (s) ks__err_set_file(err, path);
  ks_meta_free(meta);
  ks_statedict_free(sd);
  return s;
}

/* Out of memory always; an I/O error when `remote` or the table is not the local file system. */
static int unreadable_is_error(const ks_ckpt_manager *m, const ckpt *c, int remote) {
  if (c->code == KS_E_NOMEM) return 1;
  return c->code == KS_E_IO && (remote || !local_table(m->io));
}

ks_status ks_ckpt_manager_autoresume(ks_ckpt_manager *m, ks_state *st, const ks_load_opts *opts,
                                     ks_load_report *report, int *resumed, const char **path, ks_error *err) {
  if (!m || !st || !resumed) return ks__err(err, KS_E_INVALID, "autoresume: NULL argument");
  KS__TAKE_OPTS(ks_load_opts, opts, KS__V1_SIZE(ks_load_opts, verify_checksums), err);
  *resumed = 0;
  ks_status ws = ks_ckpt_manager_wait(m, err); /* never read a directory a background save is changing */
  if (ws) return ws;
  m->skipped = 0;
  if (m->sharded) return ks__mgr_autoresume_dir(m, st, opts, report, resumed, path, err);
  remove_leftovers(m);
  ckpt_list l = {0};
  ks_status s = ks__mgr_list(m, &l, err);
  /* Unreadable files sort last but may well be the newest (a truncated copy): always warn. But one
   * that could not be read for want of memory or of a remote store is no reason to resume an older
   * one (or none): that is an error. */
  for (size_t i = 0; !s && i < l.n; i++)
    if (!l.v[i].readable && unreadable_is_error(m, &l.v[i], 0))
      s = ks__err_at(err, l.v[i].code, l.v[i].name, NULL, -1, "autoresume: cannot read checkpoint %s/%s: %s",
                     m->run_dir, l.v[i].name, l.v[i].why);
  for (size_t i = 0; !s && i < l.n; i++)
    if (!l.v[i].readable) warn_skip(m, l.v[i].name, l.v[i].why);
  for (size_t i = 0; !s && i < l.n && !*resumed && l.v[i].readable; i++) {
    int bad = 0;
    s = try_one(m, l.v[i].name, st, opts, report, &bad, err);
    if (s || bad) continue;
    s = ks__mgr_set_last(m, l.v[i].name, err);
    *resumed = !s;
  }
  ks__mgr_list_free(&m->alloc, &l);
  /* Nothing local loads (run_dir empty, missing or all corrupt): the uploaded copies, if any. */
  if (!s && !*resumed && m->upload_io) s = ks__mgr_resume_uploaded(m, st, opts, report, resumed, err);
  if (!s && *resumed && path) *path = m->last_path;
  return s;
}

ks_status ks__mgr_set_last(ks_ckpt_manager *m, const char *name, ks_error *err) {
  char full[4096];
  if (ks__mgr_join(m, name, full, sizeof full)) return ks__err(err, KS_E_LIMIT, "path too long");
  char *copy = ks__strdup(&m->alloc, full);
  if (!copy) return ks__err(err, KS_E_NOMEM, "out of memory");
  ks__free(&m->alloc, m->last_path);
  m->last_path = copy;
  return KS_OK;
}

ks_status ks__mgr_try_load(ks_ckpt_manager *m, const char *name, ks_state *st, const ks_load_opts *opts,
                           ks_load_report *report, int *bad, ks_error *err) {
  *bad = 0;
  return try_one(m, name, st, opts, report, bad, err);
}

ks_status ks__mgr_candidates(const ks_ckpt_manager *m, char ***names, size_t *n, size_t *unreadable,
                             ks_error *err) {
  ckpt_list l = {0};
  *names = NULL;
  *n = 0;
  ks_status s = ks__mgr_list(m, &l, err);
  if (s) return s;
  for (size_t i = 0; i < l.n; i++)
    if (!l.v[i].readable && unreadable_is_error(m, &l.v[i], 1)) {
      s = ks__err_at(err, l.v[i].code, l.v[i].name, NULL, -1, "cannot read checkpoint %s/%s: %s", m->run_dir,
                     l.v[i].name, l.v[i].why);
      ks__mgr_list_free(&m->alloc, &l);
      return s;
    }
  size_t k = 0;
  for (size_t i = 0; i < l.n; i++) {
    if (l.v[i].readable) {
      l.v[k++].name = l.v[i].name; /* readable ones come first: this only compacts */
      continue;
    }
    fprintf(m->log, "keepsake: warning: skipping checkpoint %s/%s: %s\n", m->run_dir, l.v[i].name, l.v[i].why);
    (*unreadable)++;
    ks__free(&m->alloc, l.v[i].name);
  }
  char **out = k ? ks__calloc(&m->alloc, k, sizeof *out) : NULL;
  if (k && !out) {
    l.n = k;
    ks__mgr_list_free(&m->alloc, &l);
    return ks__err(err, KS_E_NOMEM, "out of memory");
  }
  for (size_t i = 0; i < k; i++) out[i] = l.v[i].name;
  ks__free(&m->alloc, l.v);
  *names = out;
  *n = k;
  return KS_OK;
}

void ks__mgr_names_free(const ks_ckpt_manager *m, char **names, size_t n) {
  for (size_t i = 0; names && i < n; i++) ks__free(&m->alloc, names[i]);
  ks__free(&m->alloc, names);
}
