/*
 * Background saves. A save is split at the one point where the training loop
 * may move on: once every tensor has been copied into a file image (the
 * snapshot, ks_image_stage), the state may change; a thread then writes the
 * file from the image with the same durable replace as ks_state_save, and runs
 * the caller's after-commit step (the manager's `latest` update and retention)
 * in the same order a synchronous save does.
 *
 * The image is the caller's (ks_async_saver_start_image: made once for its
 * state, perhaps over page-locked memory its device tensors were copied into)
 * or the saver's own, kept and reused, so steady saves copy into warm memory and
 * the file is written from it with large aligned writes that bypass the page
 * cache where the file system allows, leaving the training loop the CPU that
 * copies into the page cache and the kernel's writeback would take (image.c).
 * While its write runs, the image knows it (ks_image_set_writer): whoever wants
 * to write into it, or free it, waits for the save first.
 * At most one save is in flight; its result is kept until the next call.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "state/state_internal.h"

struct ks_async_saver {
  ks_allocator alloc;
  ks_async_busy busy_mode;
  /* The saver's own image: for states, and for dicts started without one. */
  ks_image *own;
  bool own_given; /* its memory is the caller's staging (ks_async_opts.staging) */
  unsigned char *given;
  size_t given_size;
  /* The job in flight (or finished and not yet collected). */
  pthread_t thread;
  int running;     /* a thread was started and not yet joined (touched by the caller's thread only) */
  atomic_int done; /* set by the worker as its last act */
  ks_image *image; /* the image the job writes from */
  char *path;
  ks_save_opts save_opts;
  ks_after_save_fn after;
  void *after_ctx;
  ks_status result; /* of the last finished job, until collected */
  ks_error result_err;
};

ks_status ks_async_saver_create(const ks_async_opts *opts, ks_async_saver **out, ks_error *err) {
  if (!out) return ks__err(err, KS_E_INVALID, "async saver: out is NULL");
  KS__TAKE_OPTS(ks_async_opts, opts, KS__V1_SIZE(ks_async_opts, staging_size), err);
  if (opts && opts->staging_size && !opts->staging)
    return ks__err(err, KS_E_INVALID, "async saver: staging_size without a staging buffer");
  const ks_allocator *a = ks__alloc_or_default(opts ? opts->alloc : NULL);
  ks_async_saver *sv = ks__calloc(a, 1, sizeof *sv);
  if (!sv) return ks__err(err, KS_E_NOMEM, "out of memory");
  sv->alloc = *a;
  sv->busy_mode = opts ? opts->busy : KS_ASYNC_WAIT;
  sv->given = opts ? opts->staging : NULL;
  sv->given_size = opts ? opts->staging_size : 0;
  ks_error_clear(&sv->result_err);
  *out = sv;
  return KS_OK;
}

/* Joins a started thread; its result stays in sv->result until collected. The image is released. */
static void join(ks_async_saver *sv) {
  if (!sv->running) return;
  pthread_join(sv->thread, NULL);
  sv->running = 0;
  ks_image_set_writer(sv->image, NULL, sv);
  sv->image = NULL;
  ks__free(&sv->alloc, sv->path);
  sv->path = NULL;
}

/* Hands the last job's result to the caller once, then forgets it. */
static KS_NODISCARD ks_status collect(ks_async_saver *sv, ks_error *err) {
  ks_status s = sv->result;
  if (s && err) *err = sv->result_err;
  sv->result = KS_OK;
  ks_error_clear(&sv->result_err);
  return s;
}

void ks_async_saver_free(ks_async_saver *sv) {
  if (!sv) return;
  join(sv);
  ks_image_free(sv->own);
  ks__free(&sv->alloc, sv);
}

ks_status ks_async_saver_wait(ks_async_saver *sv, ks_error *err) {
  if (!sv) return ks__err(err, KS_E_INVALID, "async saver: NULL");
  join(sv);
  return collect(sv, err);
}

int ks_async_saver_busy(ks_async_saver *sv) { return sv && sv->running && !atomic_load(&sv->done); }

/* The image's wait for the save writing from it (ks_image_wait_fn): its result stays to collect. */
static KS_NODISCARD ks_status image_wait(void *ctx, int may_refuse, ks_error *err) {
  ks_async_saver *sv = ctx;
  if (may_refuse && sv->busy_mode == KS_ASYNC_FAIL_BUSY && ks_async_saver_busy(sv))
    return ks__err(err, KS_E_STATE, "a background save is still writing from this image");
  join(sv);
  return KS_OK;
}

/* The saver's own image, made for sd: over the caller's staging when it is aligned and large
   enough, else over memory of its own. */
static KS_NODISCARD ks_status own_image(ks_async_saver *sv, const ks_statedict *sd, const ks_meta *meta,
                                        bool try_given, ks_error *err) {
  ks_image_opts o = {.size = sizeof o, .alloc = &sv->alloc};
  ks_status s = KS_E_LIMIT;
  if (try_given && sv->given && (uintptr_t)sv->given % KS_IMAGE_ALIGN == 0) {
    o.buf = sv->given;
    o.buf_size = sv->given_size;
    s = ks_image_create(sd, meta, &o, &sv->own, NULL);
    sv->own_given = s == KS_OK;
  }
  if (s == KS_E_LIMIT) { /* too small (or not aligned): memory of its own */
    o.buf = NULL;
    o.buf_size = 0;
    s = ks_image_create(sd, meta, &o, &sv->own, err);
  } else if (s) {
    s = ks_image_create(sd, meta, &o, &sv->own, err); /* the same refusal, with its message */
  }
  return s;
}

/* sd into the saver's own image (made on first use; over memory of its own once the caller's
   staging no longer holds the state). */
static KS_NODISCARD ks_status stage_own(ks_async_saver *sv, const ks_statedict *sd, const ks_meta *meta,
                                        ks_error *err) {
  ks_status s = sv->own ? KS_OK : own_image(sv, sd, meta, true, err);
  if (!s) s = ks_image_stage(sv->own, sd, meta, err);
  if (s == KS_E_LIMIT && sv->own_given) {
    ks_image_free(sv->own);
    sv->own = NULL;
    sv->own_given = false;
    ks_error_clear(err);
    s = own_image(sv, sd, meta, false, err);
    if (!s) s = ks_image_stage(sv->own, sd, meta, err);
  }
  return s;
}

/* The snapshot of a state: flattened (tensors borrowed), then staged into the saver's own image. */
static KS_NODISCARD ks_status snapshot(ks_async_saver *sv, const ks_state *st, ks_error *err) {
  ks_statedict *flat = NULL;
  ks_meta *meta = NULL;
  ks_status s = ks_statedict_create(&sv->alloc, &flat, err);
  if (!s) s = ks_meta_create(&sv->alloc, &meta, err);
  if (s) s = ks__err(err, s, "out of memory");
  if (!s) s = ks_state_to_state_dict(st, flat, meta, err);
  if (!s) s = stage_own(sv, flat, meta, err);
  ks_meta_free(meta);
  ks_statedict_free(flat);
  return s;
}

static void *worker(void *arg) {
  ks_async_saver *sv = arg;
  ks_error e;
  ks_error_clear(&e);
  ks_status s = ks_image_write(sv->image, sv->path, &sv->save_opts, &e);
  if (!s && sv->after) s = sv->after(sv->after_ctx, sv->path, &e);
  if (s && e.code == KS_OK) ks__err(&e, s, "background save of %s failed", sv->path);
  sv->result = s;
  sv->result_err = e;
  atomic_store(&sv->done, 1);
  return NULL;
}

/* Waits for (or, in busy mode, refuses beside) a save in flight; then surfaces its error once. */
static KS_NODISCARD ks_status make_room(ks_async_saver *sv, ks_error *err) {
  if (sv->busy_mode == KS_ASYNC_FAIL_BUSY && ks_async_saver_busy(sv))
    return ks__err(err, KS_E_STATE, "a background save is still in flight");
  join(sv);
  return collect(sv, err);
}

/* Starts the background write of the image staged with status `s` (nothing when it failed). */
static KS_NODISCARD ks_status launch(ks_async_saver *sv, ks_status s, ks_image *im, const char *path,
                                     const ks_save_opts *opts, ks_after_save_fn after, void *ctx, ks_error *err) {
  if (s) return s;
  if (ks__struct_in(&sv->save_opts, sizeof sv->save_opts, opts, KS__V1_SIZE(ks_save_opts, io)))
    return ks__err(err, KS_E_INVALID, "options: struct size is not one this library knows");
  if (!(sv->path = ks__strdup(&sv->alloc, path))) return ks__err(err, KS_E_NOMEM, "out of memory");
  if (!sv->save_opts.alloc) sv->save_opts.alloc = &sv->alloc;
  sv->save_opts.image = NULL; /* the worker writes `im` itself */
  sv->after = after;
  sv->after_ctx = ctx;
  sv->image = im;
  atomic_store(&sv->done, 0);
  ks_image_set_writer(im, image_wait, sv);
  if (pthread_create(&sv->thread, NULL, worker, sv)) {
    ks_image_set_writer(im, NULL, sv);
    sv->image = NULL;
    ks__free(&sv->alloc, sv->path);
    sv->path = NULL;
    return ks__err(err, KS_E_IO, "cannot start the background save thread");
  }
  sv->running = 1;
  return KS_OK;
}

ks_status ks_async_saver_start(ks_async_saver *sv, const ks_state *st, const char *path, const ks_save_opts *opts,
                               ks_after_save_fn after, void *ctx, ks_error *err) {
  if (!sv || !st || !path) return ks__err(err, KS_E_INVALID, "async save: NULL argument");
  ks_status s = make_room(sv, err);
  if (s) return s;
  s = snapshot(sv, st, err);
  return launch(sv, s, sv->own, path, opts, after, ctx, err);
}

ks_status ks_async_saver_start_image(ks_async_saver *sv, ks_image *im, const ks_statedict *sd, const ks_meta *meta,
                                     const char *path, const ks_save_opts *opts, ks_after_save_fn after, void *ctx,
                                     ks_error *err) {
  if (!sv || !sd || !path) return ks__err(err, KS_E_INVALID, "async save: NULL argument");
  ks_status s = make_room(sv, err);
  if (s) return s;
  s = im ? ks_image_stage(im, sd, meta, err) : stage_own(sv, sd, meta, err);
  return launch(sv, s, im ? im : sv->own, path, opts, after, ctx, err);
}

ks_status ks_state_save_async(ks_async_saver *sv, const ks_state *st, const char *path, const ks_save_opts *opts,
                              ks_error *err) {
  return ks_async_saver_start(sv, st, path, opts, NULL, NULL, err);
}
