/*
 * Checkpoint manager, what writes a checkpoint directory (files.c writes checkpoint files):
 * the sharded directories the ranks of a distributed run fill, what a directory says about
 * itself (its index, then rank 0's file for the timestamp and stored metric), removing dead
 * saves and retired checkpoints, and finding the newest complete one. Every file system call
 * goes through the manager's ks_io table.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "core/io_ops.h"
#include "keepsake/shard.h"
#include "manager/manager_internal.h"

/* What the index records (ks_shard_index_get), by value. */
static ks_shard_index_info index_info(const ks_shard_index *idx) {
  ks_shard_index_info info = KS_OPTS_INIT(ks_shard_index_info);
  ks_shard_index_get(idx, &info);
  return info;
}

static KS_NODISCARD ks_status not_sharded(ks_error *err) {
  return ks__err(err, KS_E_STATE, "this manager keeps checkpoint files, not sharded directories (set opts.sharded)");
}

void ks__mgr_probe_dir(const ks_ckpt_manager *m, const char *path, ckpt *c) {
  ks_shard_index *idx = NULL;
  ks_error e;
  ks_error_clear(&e);
  ks_status s = ks_shard_index_read(path, &m->alloc, m->io, &idx, &e);
  if (s == KS_E_NOTFOUND) {
    c->incomplete = 1;
    snprintf(c->why, sizeof c->why, "no index: a save that did not finish");
    return;
  }
  if (s) {
    snprintf(c->why, sizeof c->why, "%s (%s)", e.message, ks_status_name(e.code));
    c->nomem = s == KS_E_NOMEM;
    return;
  }
  char file[4096];
  if (snprintf(file, sizeof file, "%s/%s", path, ks_shard_index_file(idx, 0, NULL)) < (int)sizeof file)
    ks__mgr_probe_file(m, file, c);
  else
    snprintf(c->why, sizeof c->why, "path too long");
  ks_shard_index_free(idx);
}

typedef struct rm_ctx {
  const ks_ckpt_manager *m;
  const char *dir;
  int rc;
} rm_ctx;

static int rm_entry(void *ctx, const char *name, ks_io_kind kind) {
  rm_ctx *r = ctx;
  char p[4096];
  if (kind == KS_IO_DIR || snprintf(p, sizeof p, "%s/%s", r->dir, name) >= (int)sizeof p) return 0;
  const ks_io *io = ks__io_v1(r->m->io);
  int rc = io->unlink_fn(io->ctx, p);
  if (rc && rc != ENOENT && !r->rc) r->rc = rc;
  return 0;
}

/*
 * The index goes first and durably: from then on the directory is incomplete,
 * never a checkpoint, whatever a crash leaves of the rest.
 */
int ks__mgr_remove_dir(const ks_ckpt_manager *m, const char *path) {
  const ks_io *io1 = ks__io_v1(m->io), *io2 = ks__io_v2(m->io);
  char idx[4096];
  if (snprintf(idx, sizeof idx, "%s/%s", path, KS_SHARD_INDEX_NAME) >= (int)sizeof idx) return ENAMETOOLONG;
  int rc = io1->unlink_fn(io1->ctx, idx);
  if (rc && rc != ENOENT) return rc;
  if (!rc && (rc = io1->fsync_dir_fn(io1->ctx, path)) != 0) return rc;
  rm_ctx r = {m, path, 0};
  rc = io2->list_fn(io2->ctx, path, "", rm_entry, &r);
  if (!rc) rc = r.rc;
  if (!rc) rc = ks__io_rmdir(m->io, path);
  if (!rc) rc = io1->fsync_dir_fn(io1->ctx, m->run_dir);
  return rc == ENOENT ? 0 : rc;
}

/* Removes every incomplete directory of l (dead saves), except `spare` (NULL: none). */
static size_t remove_incomplete(ks_ckpt_manager *m, const ckpt_list *l, const char *spare) {
  size_t n = 0;
  for (size_t i = 0; i < l->n; i++) {
    char path[4096];
    if (!l->v[i].incomplete || (spare && !strcmp(spare, l->v[i].name)) ||
        ks__mgr_join(m, l->v[i].name, path, sizeof path))
      continue;
    int rc = ks__mgr_remove_dir(m, path);
    if (rc) fprintf(m->log, "keepsake: warning: cannot remove the incomplete checkpoint %s: %s\n", path, strerror(rc));
    else {
      n++;
      if (m->retention_log) fprintf(m->retention_log, "keepsake: removed %s: incomplete (a save that did not finish)\n",
                                    l->v[i].name);
    }
  }
  if (m->retention_log) fflush(m->retention_log);
  return n;
}

static KS_NODISCARD ks_status remember(ks_ckpt_manager *m, const char *path, ks_error *err) {
  char *copy = ks__strdup(&m->alloc, path);
  if (!copy) return ks__err(err, KS_E_NOMEM, "out of memory");
  ks__free(&m->alloc, m->last_path);
  m->last_path = copy;
  return KS_OK;
}

ks_status ks_ckpt_manager_dir_path(ks_ckpt_manager *m, const ks_timestamp *ts, const char **dir, ks_error *err) {
  if (!m || !ts || !dir) return ks__err(err, KS_E_INVALID, "dir_begin: NULL argument");
  if (!m->sharded) return not_sharded(err);
  char name[1024], path[4096];
  if (ks__mgr_expand(m, ts, name, sizeof name) || ks__mgr_join(m, name, path, sizeof path))
    return ks__err(err, KS_E_LIMIT, "checkpoint path too long");
  ks_status s = remember(m, path, err);
  if (!s) *dir = m->last_path;
  return s;
}

ks_status ks_ckpt_manager_dir_begin(ks_ckpt_manager *m, const ks_timestamp *ts, const char **dir, size_t *removed,
                                    ks_error *err) {
  ks_status s = ks_ckpt_manager_dir_path(m, ts, dir, err);
  if (s) return s;
  ckpt_list l = {0};
  if ((s = ks__mgr_list(m, &l, err)) != KS_OK) return s;
  size_t n = remove_incomplete(m, &l, NULL); /* also the one about to be rewritten: the save recreates it */
  ks__mgr_list_free(&m->alloc, &l);
  if (removed) *removed = n;
  return KS_OK;
}


const ks_io *ks_ckpt_manager_io(const ks_ckpt_manager *m) { return m && m->io ? m->io : ks_io_posix(); }

ks_status ks_ckpt_manager_dir_commit(ks_ckpt_manager *m, const char *dir, ks_error *err) {
  if (!m || !dir) return ks__err(err, KS_E_INVALID, "dir_commit: NULL argument");
  if (!m->sharded) return not_sharded(err);
  ks_shard_index *idx = NULL;
  ks_status s = ks_shard_index_read(dir, &m->alloc, m->io, &idx, err);
  ks_shard_index_free(idx);
  if (!s) s = ks__mgr_after_commit(m, dir, err);
  ks__mgr_touch(m); /* save_every_seconds counts from here */
  return s;
}

/*
 * Checks every file of the directory against its index: KS_OK, or the problem in `why`
 * (*bad = 1). Running out of memory says nothing about the checkpoint: KS_E_NOMEM.
 */
static KS_NODISCARD ks_status verify_dir(const ks_ckpt_manager *m, const char *path, int *bad, char *why, size_t cap,
                            ks_error *err) {
  ks_shard_index *idx = NULL;
  ks_error e;
  ks_error_clear(&e);
  ks_status s = ks_shard_index_read(path, &m->alloc, m->io, &idx, &e);
  for (int f = 0; !s && f < index_info(idx).world_size; f++) s = ks_shard_verify_file(path, idx, f, m->io, &e);
  ks_shard_index_free(idx);
  *bad = 0;
  if (s == KS_E_NOMEM) return ks__err(err, s, "out of memory verifying %s", path);
  if (s) {
    snprintf(why, cap, "%s (%s)", e.message, ks_status_name(e.code));
    *bad = 1;
  }
  return KS_OK;
}

static void warn_dir(ks_ckpt_manager *m, const char *name, const char *why) {
  fprintf(m->log, "keepsake: warning: skipping checkpoint %s/%s: %s\n", m->run_dir, name, why);
  m->skipped++;
}

ks_status ks_ckpt_manager_dir_latest(ks_ckpt_manager *m, const char **dir, ks_error *err) {
  if (!m || !dir) return ks__err(err, KS_E_INVALID, "dir_latest: NULL argument");
  if (!m->sharded) return not_sharded(err);
  *dir = NULL;
  ks_status s = ks_ckpt_manager_wait(m, err);
  if (s) return s;
  m->skipped = 0;
  ckpt_list l = {0};
  if ((s = ks__mgr_list(m, &l, err)) != KS_OK) return s;
  remove_incomplete(m, &l, NULL);
  for (size_t i = 0; i < l.n; i++)
    if (!l.v[i].readable && !l.v[i].incomplete) warn_dir(m, l.v[i].name, l.v[i].why);
  for (size_t i = 0; !s && !*dir && i < l.n && l.v[i].readable; i++) {
    char path[4096], why[KS_ERROR_MSG_MAX + 40];
    int bad = 0;
    if (ks__mgr_join(m, l.v[i].name, path, sizeof path)) continue;
    if ((s = verify_dir(m, path, &bad, why, sizeof why, err)) != KS_OK) break;
    if (bad) warn_dir(m, l.v[i].name, why);
    else if (!(s = remember(m, path, err)))
      *dir = m->last_path;
  }
  ks__mgr_list_free(&m->alloc, &l);
  return s;
}

ks_status ks__mgr_autoresume_dir(ks_ckpt_manager *m, ks_state *st, const ks_load_opts *opts, ks_load_report *report,
                                 int *resumed, const char **path, ks_error *err) {
  const char *dir = NULL;
  ks_status s = ks_ckpt_manager_dir_latest(m, &dir, err);
  if (s || !dir) return s;
  ks_shard_index *idx = NULL;
  ks_statedict *sd = NULL;
  ks_meta *meta = NULL;
  ks_shard_load_opts lo = {.alloc = &m->alloc, .no_verify = 1, .io = m->io}; /* just verified */
  s = ks_shard_index_read(dir, &m->alloc, m->io, &idx, err);
  if (!s) s = ks_shard_load_rank(dir, idx, 0, 1, NULL, &lo, &sd, &meta, err);
  if (!s) s = ks_state_load_state_dict(st, sd, meta, opts, report, err);
  if (s) ks__err_set_file(err, dir);
  ks_meta_free(meta);
  ks_statedict_free(sd);
  ks_shard_index_free(idx);
  if (!s) {
    *resumed = 1;
    if (path) *path = dir;
  }
  return s;
}
