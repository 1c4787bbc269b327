/*
 * Background saves. A save is split at the one point where the training loop
 * may move on: once every tensor has been copied into the staging buffer (the
 * snapshot), the state may change; a thread then writes the snapshot with the
 * same durable replace as ks_state_save, and runs the caller's after-commit
 * step (the manager's `latest` update and retention) in the same order a
 * synchronous save does.
 *
 * The staging buffer is kept and reused, so steady saves copy into warm memory.
 * It holds the snapshot as the file's image (ks_save_layout: room for the header,
 * then the tensors packed at their offsets in the file), so the thread writes
 * the file from it with ks_save_image: large aligned writes that bypass the page
 * cache where the file system allows, leaving the training loop the CPU that
 * copies into the page cache and the kernel's writeback would take.
 * At most one save is in flight; its result is kept until the next call.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "core/pcopy.h"
#include "state/state_internal.h"

#define STAGING_ALIGN 64 /* each tensor's start, when the snapshot cannot be the file's image */
#define BASE_ALIGN ((size_t)KS_IMAGE_ALIGN) /* the staging buffer's start */

struct ks_async_saver {
  ks_allocator alloc;
  ks_async_busy busy_mode;
  /* Staging: owned (reused, grown as needed) unless the caller gave one. */
  unsigned char *own, *own_base;
  size_t own_size;
  unsigned char *given;
  size_t given_size;
  /* The job in flight (or finished and not yet collected). */
  pthread_t thread;
  int running;       /* a thread was started and not yet joined (touched by the caller's thread only) */
  atomic_int done;   /* set by the worker as its last act */
  ks_statedict *sd;
  ks_meta *meta;
  char *path;
  unsigned char *image; /* the staging area when it holds the file's image (else NULL) */
  size_t image_cap;
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

static void job_clear(ks_async_saver *sv) {
  ks_statedict_free(sv->sd);
  ks_meta_free(sv->meta);
  ks__free(&sv->alloc, sv->path);
  sv->sd = NULL;
  sv->meta = NULL;
  sv->path = NULL;
  sv->image = NULL;
}

/* Joins a started thread; its result stays in sv->result until collected. */
static void join(ks_async_saver *sv) {
  if (!sv->running) return;
  pthread_join(sv->thread, NULL);
  sv->running = 0;
  job_clear(sv);
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
  ks__free(&sv->alloc, sv->own_base);
  ks__free(&sv->alloc, sv);
}

ks_status ks_async_saver_wait(ks_async_saver *sv, ks_error *err) {
  if (!sv) return ks__err(err, KS_E_INVALID, "async saver: NULL");
  join(sv);
  return collect(sv, err);
}

int ks_async_saver_busy(ks_async_saver *sv) { return sv && sv->running && !atomic_load(&sv->done); }

static size_t align_up(size_t n) { return (n + (STAGING_ALIGN - 1)) & ~(size_t)(STAGING_ALIGN - 1); }

/* Bytes of staging the tensors of sd need, each 64-aligned. */
static KS_NODISCARD ks_status staging_need(const ks_statedict *sd, size_t *need) {
  size_t total = 0;
  for (size_t i = 0; i < ks_statedict_count(sd); i++) {
    ks_entry e;
    if (ks_statedict_at(sd, i, &e) || e.kind != KS_VAL_TENSOR) continue;
    if (e.tensor.nbytes > SIZE_MAX - total - STAGING_ALIGN) return KS_E_LIMIT;
    total = align_up(total + e.tensor.nbytes);
  }
  *need = total;
  return KS_OK;
}

/* A staging area of at least `need` bytes: the caller's if it is big enough (and aligned for an
   image, when `image`), else ours (grown; aligned for an image). */
static unsigned char *staging(ks_async_saver *sv, size_t need, bool image, bool given_ok) {
  if (given_ok && sv->given && sv->given_size >= need && (!image || (uintptr_t)sv->given % BASE_ALIGN == 0))
    return sv->given;
  if (sv->own && sv->own_size >= need) return sv->own;
  unsigned char *base = need <= SIZE_MAX - BASE_ALIGN ? ks__malloc(&sv->alloc, need + BASE_ALIGN) : NULL;
  if (!base) return NULL;
  ks__free(&sv->alloc, sv->own_base);
  sv->own_base = base;
  sv->own = (unsigned char *)(((uintptr_t)base + (BASE_ALIGN - 1)) & ~(uintptr_t)(BASE_ALIGN - 1));
  sv->own_size = need;
  return sv->own;
}

/* Copies every entry of src into dst; tensor bytes go to the staging area (borrowed), copied on
   several threads when there are many of them: the caller waits for this copy. Packed (the
   file's data section) or each at a 64-byte boundary. */
static KS_NODISCARD ks_status copy_entries(const ks_allocator *a, const ks_statedict *src, ks_statedict *dst,
                                           unsigned char *area, bool packed) {
  size_t off = 0, n = 0, count = ks_statedict_count(src);
  ks__copy *pieces = ks__calloc(a, count ? count : 1, sizeof *pieces);
  ks_status s = pieces ? KS_OK : KS_E_NOMEM;
  for (size_t i = 0; !s && i < count; i++) {
    ks_entry e;
    s = ks_statedict_at(src, i, &e);
    if (!s && e.kind == KS_VAL_TENSOR) {
      if (e.tensor.nbytes && e.tensor.data != area + off) /* else staged there by the caller (stage_into) */
        pieces[n++] = (ks__copy){area + off, e.tensor.data, e.tensor.nbytes};
      e.tensor.data = area + off;
      off = packed ? off + e.tensor.nbytes : align_up(off + e.tensor.nbytes);
    }
    if (!s) s = ks_statedict_set_entry(dst, e.name, &e, KS_BORROW, NULL);
  }
  if (!s) ks__copy_parallel(pieces, n, 0);
  ks__free(a, pieces);
  return s;
}

/* The bytes of an image of a hlen-byte header and dlen bytes of data, to the next aligned end; 0 past SIZE_MAX. */
static size_t room_of(size_t hlen, uint64_t dlen) {
  if (dlen > SIZE_MAX - hlen - BASE_ALIGN) return 0;
  size_t end = hlen + (size_t)dlen;
  return end + (BASE_ALIGN - end % BASE_ALIGN) % BASE_ALIGN;
}

/* The room of the file's image (header, then data, to the next aligned end), or 0 when the
   snapshot cannot be one (a state ks_save refuses, sizes past SIZE_MAX): it is then staged
   entry by entry, and the thread's ks_save says what is wrong. */
static size_t image_room(ks_async_saver *sv, const ks_statedict *flat, const ks_meta *meta, size_t *hlen) {
  uint64_t dlen = 0;
  return ks_save_layout(flat, meta, &sv->alloc, hlen, &dlen, NULL) ? 0 : room_of(*hlen, dlen);
}

/* Whether a tensor of flat lies inside the caller's staging buffer other than exactly where this
   snapshot puts it (hlen and a packed layout): copying it there would overlap its own bytes. */
static bool misplaced_in_given(const ks_async_saver *sv, const ks_statedict *flat, size_t hlen, bool packed) {
  /* As addresses: the tensors' memory and the buffer are different objects to C. */
  uintptr_t lo = (uintptr_t)sv->given, hi = lo + sv->given_size;
  size_t off = hlen;
  for (size_t i = 0; lo && i < ks_statedict_count(flat); i++) {
    ks_entry e;
    if (ks_statedict_at(flat, i, &e) || e.kind != KS_VAL_TENSOR) continue;
    uintptr_t p = (uintptr_t)e.tensor.data;
    if (e.tensor.nbytes && p + e.tensor.nbytes > lo && p < hi && p != lo + off) return true;
    off = packed ? off + e.tensor.nbytes : align_up(off + e.tensor.nbytes);
  }
  return false;
}

/* sv->sd: every entry of flat, with every tensor copied into staging (as the file's image when it can be). */
static KS_NODISCARD ks_status stage(ks_async_saver *sv, const ks_statedict *flat, ks_error *err) {
  size_t hlen = 0, need = image_room(sv, flat, sv->meta, &hlen);
  /* A caller's buffer is used as it was sized: as an image only when it is aligned and big enough. */
  bool image = need && (!sv->given || (sv->given_size >= need && (uintptr_t)sv->given % BASE_ALIGN == 0));
  if (!image && staging_need(flat, &need)) return ks__err(err, KS_E_LIMIT, "state too large to stage");
  if (!image) hlen = 0;
  unsigned char *area = staging(sv, need, image, !misplaced_in_given(sv, flat, hlen, image));
  if (!area) return ks__err(err, KS_E_NOMEM, "out of memory for %zu bytes of staging", need);
  if (copy_entries(&sv->alloc, flat, sv->sd, image ? area + hlen : area, image))
    return ks__err(err, KS_E_NOMEM, "out of memory");
  sv->image = image ? area : NULL;
  sv->image_cap = need;
  return KS_OK;
}

/* The snapshot: the flattened state with every tensor copied into staging. */
static KS_NODISCARD ks_status snapshot(ks_async_saver *sv, const ks_state *st, ks_error *err) {
  ks_statedict *flat = NULL;
  ks_status s = ks_statedict_create(&sv->alloc, &flat, err);
  if (!s) s = ks_statedict_create(&sv->alloc, &sv->sd, err);
  if (!s) s = ks_meta_create(&sv->alloc, &sv->meta, err);
  if (s) s = ks__err(err, s, "out of memory");
  if (!s) s = ks_state_to_state_dict(st, flat, sv->meta, err);
  if (!s) s = stage(sv, flat, err);
  ks_statedict_free(flat);
  return s;
}

/* The snapshot of a state dict flattened by the caller: its entries staged, its metadata copied. */
static KS_NODISCARD ks_status snapshot_dict(ks_async_saver *sv, const ks_statedict *sd, const ks_meta *meta,
                                            ks_error *err) {
  ks_status s = ks_statedict_create(&sv->alloc, &sv->sd, err);
  if (!s) s = ks_meta_create(&sv->alloc, &sv->meta, err);
  if (s) return ks__err(err, s, "out of memory");
  for (size_t i = 0; !s && meta && i < ks_meta_count(meta); i++) {
    const char *k, *v;
    if (ks_meta_at(meta, i, &k, &v) == KS_OK) s = ks_meta_set(sv->meta, k, v, err);
  }
  return s ? s : stage(sv, sd, err);
}

static void *worker(void *arg) {
  ks_async_saver *sv = arg;
  ks_error e;
  ks_error_clear(&e);
  ks_status s = sv->image ? ks_save_image(sv->path, sv->sd, sv->meta, &sv->save_opts, sv->image, sv->image_cap, &e)
                          : ks_save(sv->path, sv->sd, sv->meta, &sv->save_opts, &e);
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

/* Starts the background write of the snapshot made with status `s` (nothing when it failed). */
static KS_NODISCARD ks_status launch(ks_async_saver *sv, ks_status s, const char *path, const ks_save_opts *opts,
                        ks_after_save_fn after, void *ctx, ks_error *err) {
  sv->path = s ? NULL : ks__strdup(&sv->alloc, path);
  if (!s && !sv->path) s = ks__err(err, KS_E_NOMEM, "out of memory");
  if (s) {
    job_clear(sv);
    return s;
  }
  if (ks__struct_in(&sv->save_opts, sizeof sv->save_opts, opts, KS__V1_SIZE(ks_save_opts, io))) {
    job_clear(sv);
    return ks__err(err, KS_E_INVALID, "options: struct size is not one this library knows");
  }
  if (!sv->save_opts.alloc) sv->save_opts.alloc = &sv->alloc;
  sv->after = after;
  sv->after_ctx = ctx;
  atomic_store(&sv->done, 0);
  if (pthread_create(&sv->thread, NULL, worker, sv)) {
    job_clear(sv);
    return ks__err(err, KS_E_IO, "cannot start the background save thread");
  }
  sv->running = 1;
  return KS_OK;
}

ks_status ks_async_saver_start(ks_async_saver *sv, const ks_state *st, const char *path,
                               const ks_save_opts *opts, ks_after_save_fn after, void *ctx, ks_error *err) {
  if (!sv || !st || !path) return ks__err(err, KS_E_INVALID, "async save: NULL argument");
  ks_status s = make_room(sv, err);
  if (s) return s;
  return launch(sv, snapshot(sv, st, err), path, opts, after, ctx, err);
}

ks_status ks_async_saver_start_dict(ks_async_saver *sv, const ks_statedict *sd, const ks_meta *meta,
                                    const char *path, const ks_save_opts *opts, ks_after_save_fn after, void *ctx,
                                    ks_error *err) {
  if (!sv || !sd || !path) return ks__err(err, KS_E_INVALID, "async save: NULL argument");
  ks_status s = make_room(sv, err);
  if (s) return s;
  return launch(sv, snapshot_dict(sv, sd, meta, err), path, opts, after, ctx, err);
}

/* Headroom of a reservation: a later save of the same state may have a slightly longer header
   (a counter gains a digit, a metric one more entry) and must not have to grow the buffer. */
#define RESERVE_SLACK ((size_t)1 << 20)

ks_status ks_async_saver_reserve_dict(ks_async_saver *sv, const ks_statedict *sd, const ks_meta *meta,
                                      ks_error *err) {
  if (!sv || !sd) return ks__err(err, KS_E_INVALID, "async reserve: NULL argument");
  if (sv->running) return ks__err(err, KS_E_STATE, "async reserve: a background save is in flight or not collected");
  size_t hlen = 0, need = image_room(sv, sd, meta, &hlen);
  if (!need && staging_need(sd, &need)) return ks__err(err, KS_E_LIMIT, "state too large to stage");
  if (need > SIZE_MAX - RESERVE_SLACK - BASE_ALIGN) return ks__err(err, KS_E_LIMIT, "state too large to stage");
  need = align_up(need + RESERVE_SLACK);
  if (sv->given && sv->given_size >= need && (uintptr_t)sv->given % BASE_ALIGN == 0) return KS_OK; /* the caller's */
  if (sv->own && sv->own_size >= need) return KS_OK;
  unsigned char *area = staging(sv, need, true, false);
  if (!area) return ks__err(err, KS_E_NOMEM, "out of memory for %zu bytes of staging", need);
  /* Touch every page now: a fresh buffer's first writes fault each page in, which would
     otherwise happen inside the first save, while the training loop waits. */
  memset(area, 0, need);
  return KS_OK;
}

ks_status ks_async_saver_stage_into(ks_async_saver *sv, const ks_statedict *sd, const ks_meta *meta, void *buf,
                                    size_t size, size_t *need, uint64_t *offsets, ks_error *err) {
  if (!sv || !sd || !need) return ks__err(err, KS_E_INVALID, "async stage_into: NULL argument");
  ks_status s = make_room(sv, err); /* the buffer may still be the save in flight's */
  if (s) return s;
  size_t hlen = 0;
  uint64_t dlen = 0;
  s = ks_save_layout(sd, meta, &sv->alloc, &hlen, &dlen, err); /* what ks_save would refuse, refused here */
  if (s) return s;
  *need = room_of(hlen, dlen);
  if (!*need) return ks__err(err, KS_E_LIMIT, "a state of %llu bytes cannot be staged", (unsigned long long)dlen);
  if (!buf || size < *need || (uintptr_t)buf % BASE_ALIGN) return KS_OK; /* the caller grows it and asks again */
  sv->given = buf;
  sv->given_size = size;
  uint64_t off = hlen;
  for (size_t i = 0; offsets && i < ks_statedict_count(sd); i++) {
    ks_entry e;
    bool tensor = ks_statedict_at(sd, i, &e) == KS_OK && e.kind == KS_VAL_TENSOR;
    offsets[i] = tensor ? off : UINT64_MAX;
    if (tensor) off += e.tensor.nbytes;
  }
  return KS_OK;
}

ks_status ks_state_save_async(ks_async_saver *sv, const ks_state *st, const char *path, const ks_save_opts *opts,
                              ks_error *err) {
  return ks_async_saver_start(sv, st, path, opts, NULL, NULL, err);
}
