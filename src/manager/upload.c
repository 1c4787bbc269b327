/*
 * Save locally, then upload: each committed checkpoint is copied to a second
 * storage (upload_io, upload_dir), the copy complete under its name before that
 * side's `latest` points at it; retention applies there only when asked. And the
 * way back: autoresume downloads the newest uploaded checkpoint that verifies
 * when nothing local loads.
 *
 * The upload side is "the manager with another io and run_dir" (a view), so
 * listing, ordering and retention are the same code as for run_dir.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "core/durable.h"
#include "core/io_ops.h"
#include "manager/manager_internal.h"

#define COPY_CHUNK (4u << 20) /* bytes per read while copying */

/* The manager as seen on its upload side: upload_io and upload_dir in place of io and run_dir. */
static ks_ckpt_manager upload_view(const ks_ckpt_manager *m) {
  ks_ckpt_manager v = *m;
  v.io = m->upload_io;
  v.run_dir = m->upload_dir;
  v.where = "uploaded ";
  v.saver = NULL;     /* the view never saves ... */
  v.last_path = NULL; /* ... nor owns anything */
  v.upload_io = NULL;
  return v;
}

/* Reads src (already open, `size` bytes) into the durable writer d. */
static KS_NODISCARD ks_status copy_bytes(const ks_io *in, int fd, uint64_t size, const char *src, ks__durable *d,
                                         uint8_t *buf, ks_error *err) {
  for (uint64_t off = 0; off < size;) {
    size_t want = size - off < COPY_CHUNK ? (size_t)(size - off) : COPY_CHUNK, got = 0;
    int rc = in->read_fn(in->ctx, fd, buf, want, off, &got);
    if (!rc && got == 0) rc = EIO; /* shorter than it said: never loop, never copy less */
    if (rc) return ks__err_at(err, KS_E_IO, src, NULL, (int64_t)off, "cannot read: %s", strerror(rc));
    ks_status s = ks__durable_write(d, buf, got);
    if (s) return s;
    off += got;
  }
  return KS_OK;
}

/* Copies src_path of src_io to dst_path of dst_io with dst_io's durable replace (temp, write,
 * fsync, close, rename, fsync dir): dst_path never names a partial copy. */
static KS_NODISCARD ks_status io_copy(const ks_io *src_io, const char *src_path, const ks_io *dst_io,
                                      const char *dst_path, const ks_allocator *alloc, ks_error *err) {
  const ks_io *in = ks__io_v2(src_io);
  int fd = -1;
  uint64_t size = 0;
  int rc = in->open_fn(in->ctx, src_path, &fd, &size);
  if (rc) return ks__err_at(err, KS_E_IO, src_path, NULL, -1, "cannot open: %s", strerror(rc));
  ks__durable d;
  uint8_t *buf = ks__malloc(alloc, COPY_CHUNK);
  ks_status s = buf ? ks__durable_prepare(&d, dst_path, dst_io, alloc, err) : KS_E_NOMEM;
  if (!buf) {
    in->close_fn(in->ctx, fd);
    return ks__err(err, s, "out of memory copying %s", src_path);
  }
  if (!s) s = ks__durable_open(&d);
  if (!s) s = copy_bytes(in, fd, size, src_path, &d, buf, err);
  if (!s) s = ks__durable_commit(&d);
  ks__durable_abort(&d);
  ks__free(alloc, buf);
  in->close_fn(in->ctx, fd);
  return s;
}

ks_status ks__mgr_upload(ks_ckpt_manager *m, const char *name, ks_error *err) {
  char src[4096], dst[4096];
  ks_ckpt_manager view = upload_view(m);
  if (ks__mgr_join(m, name, src, sizeof src) || ks__mgr_join(&view, name, dst, sizeof dst))
    return ks__err(err, KS_E_LIMIT, "upload: path too long");
  ks_error e;
  ks_error_clear(&e);
  const char *step = "copying the checkpoint";
  ks_status s = io_copy(m->io, src, m->upload_io, dst, &m->alloc, &e);
  if (!s) {
    step = "pointing latest at it"; /* only once the object is whole under its name */
    s = ks__io_pointer_set(m->upload_io, m->upload_dir, "latest", name, &e);
  }
  if (!s && m->upload_retention) {
    step = "retention";
    s = ks__mgr_prune(&view, name, &e);
  }
  if (!s) return KS_OK;
  return ks__err_at(err, s, dst, NULL, -1, "upload of %s to %s failed (%s): %s", src, m->upload_dir, step,
                    e.message);
}

/* Downloads upload_dir/name into run_dir/name and loads it if it verifies (else *bad = 1). */
static KS_NODISCARD ks_status fetch_and_load(ks_ckpt_manager *m, const ks_ckpt_manager *view, const char *name,
                                             ks_state *st, const ks_load_opts *opts, ks_load_report *report, int *bad,
                                             ks_error *err) {
  char src[4096], dst[4096];
  if (ks__mgr_join(view, name, src, sizeof src) || ks__mgr_join(m, name, dst, sizeof dst))
    return ks__err(err, KS_E_LIMIT, "autoresume: path too long");
  ks_error e;
  ks_error_clear(&e);
  /* A failed download is an error, not a skip: starting over while good checkpoints exist upstream
   * would redo the run and then upload older states under the names of newer ones. */
  ks_status s = io_copy(m->upload_io, src, m->io, dst, &m->alloc, &e);
  if (s) return ks__err_at(err, s, src, NULL, -1, "autoresume: cannot download %s from %s: %s", name,
                           m->upload_dir, e.message);
  return ks__mgr_try_load(m, name, st, opts, report, bad, err);
}

ks_status ks__mgr_resume_uploaded(ks_ckpt_manager *m, ks_state *st, const ks_load_opts *opts,
                                  ks_load_report *report, int *resumed, ks_error *err) {
  ks_ckpt_manager view = upload_view(m);
  char **names = NULL;
  size_t n = 0;
  ks_status s = ks__mgr_candidates(&view, &names, &n, &m->skipped, err);
  if (s) return s;
  for (size_t i = 0; i < n && !s && !*resumed; i++) {
    int bad = 0;
    s = fetch_and_load(m, &view, names[i], st, opts, report, &bad, err);
    if (s || bad) continue;
    s = ks__mgr_set_last(m, names[i], err);
    *resumed = !s;
    ks_error e;
    ks_error_clear(&e);
    /* run_dir's own `latest`, for the next local autoresume and for people; only a warning if it fails */
    if (!s && ks__io_pointer_set(m->io, m->run_dir, "latest", names[i], &e))
      fprintf(m->log, "keepsake: warning: %s\n", e.message);
  }
  ks__mgr_names_free(m, names, n);
  return s;
}
