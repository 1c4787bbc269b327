/*
 * Checkpoint manager, what writes a checkpoint file: blocking and background saves of a
 * ks_state or of a flattened state through a file image (ks_image), each named by the policy
 * (policy.c: ks__mgr_next_path), then committed with `latest`, retention and the upload
 * (ks__mgr_after_commit), on the caller's thread or the background saver's.
 */
#include "manager/manager_internal.h"

ks_status ks_ckpt_manager_save(ks_ckpt_manager *m, const ks_state *st, const char **saved, ks_error *err) {
  if (!m || !st) return ks__err(err, KS_E_INVALID, "save: NULL argument");
  if (m->sharded)
    return ks__err(err, KS_E_STATE, "this manager keeps sharded checkpoint directories: save with ks_dist_ckpt_save");
  ks_status s = ks_ckpt_manager_wait(m, err);
  if (!s) s = ks__mgr_next_path(m, ks_state_timestamp(st), err);
  if (s) return s;
  ks_save_opts so = {.alloc = &m->alloc, .io = m->io};
  s = ks_state_save(st, m->last_path, &so, err);
  if (!s) s = ks__mgr_after_commit(m, m->last_path, err);
  ks__mgr_touch(m);
  if (!s && saved) *saved = m->last_path;
  return s;
}

/* The manager's background saver, created on first use. */
static KS_NODISCARD ks_status saver(ks_ckpt_manager *m, ks_error *err) {
  if (m->saver) return KS_OK;
  ks_async_opts ao = {
      .alloc = &m->alloc, .busy = m->async_busy, .staging = m->staging, .staging_size = m->staging_size};
  return ks_async_saver_create(&ao, &m->saver, err);
}

ks_status ks_ckpt_manager_save_image(ks_ckpt_manager *m, ks_image *im, const ks_statedict *sd, const ks_meta *meta,
                                     const ks_timestamp *ts, int async, const char **saved, ks_error *err) {
  if (!m || !sd) return ks__err(err, KS_E_INVALID, "save: NULL argument");
  if (m->sharded)
    return ks__err(err, KS_E_STATE, "this manager keeps sharded checkpoint directories: save with ks_dist_ckpt_save");
  ks_status s = async ? saver(m, err) : KS_OK;
  if (!s && async && m->async_busy == KS_ASYNC_FAIL_BUSY && ks_async_saver_busy(m->saver))
    return ks__err(err, KS_E_STATE, "a background save is still in flight");
  if (!s) s = ks_ckpt_manager_wait(m, err); /* the previous save's error surfaces here, once */
  if (!s) s = ks__mgr_next_path(m, ts, err);
  if (s) return s;
  ks_save_opts so = {.size = sizeof so, .alloc = &m->alloc, .io = m->io, .image = im};
  if (async) {
    s = ks_async_saver_start_image(m->saver, im, sd, meta, m->last_path, &so, ks__mgr_after_commit, m, err);
  } else {
    s = ks_save(m->last_path, sd, meta, &so, err);
    if (!s) s = ks__mgr_after_commit(m, m->last_path, err);
  }
  ks__mgr_touch(m);
  if (!s && saved) *saved = m->last_path;
  return s;
}

ks_status ks_ckpt_manager_save_async(ks_ckpt_manager *m, const ks_state *st, const char **saved, ks_error *err) {
  if (!m || !st) return ks__err(err, KS_E_INVALID, "save: NULL argument");
  if (m->sharded)
    return ks__err(err, KS_E_STATE, "this manager keeps sharded checkpoint directories: save with ks_dist_ckpt_save");
  ks_status sv = saver(m, err);
  if (sv) return sv;
  if (m->async_busy == KS_ASYNC_FAIL_BUSY && ks_async_saver_busy(m->saver))
    return ks__err(err, KS_E_STATE, "a background save is still in flight");
  ks_status s = ks_async_saver_wait(m->saver, err); /* the previous save's error surfaces here, once */
  if (!s) s = ks__mgr_next_path(m, ks_state_timestamp(st), err);
  ks_save_opts so = {.alloc = &m->alloc, .io = m->io};
  if (!s) s = ks_async_saver_start(m->saver, st, m->last_path, &so, ks__mgr_after_commit, m, err);
  ks__mgr_touch(m);
  if (!s && saved) *saved = m->last_path;
  return s;
}
