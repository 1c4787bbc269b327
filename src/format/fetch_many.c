/*
 * ks_reader_fetch_many: many tensors into the caller's memory on a few threads (ks__par_each:
 * runs of about equal bytes, one per thread), each fetched and verified as ks_reader_fetch does, or
 * (a job without memory) only verified, through a small scratch piece.
 */
#include "format/fmt_internal.h"

typedef struct fetch_ctx {
  const ks_reader *r;
  const ks_fetch *jobs;
} fetch_ctx;

/* The tensor bytes job k asks for (0 for a bad index: ks_reader_fetch reports it). */
static uint64_t job_bytes(void *ctx, size_t k) {
  const fetch_ctx *c = ctx;
  ks_tensor_info info;
  return ks_reader_tensor_info(c->r, c->jobs[k].index, &info) ? 0 : info.end - info.begin;
}

static KS_NODISCARD ks_status fetch_one(void *ctx, size_t k, ks_error *err) {
  const fetch_ctx *c = ctx;
  const ks_fetch *j = &c->jobs[k];
  if (!j->buf && !j->cap) return ks__reader_check(c->r, j->index, err); /* checked, not kept */
  return ks_reader_fetch(c->r, j->index, j->buf, j->cap, err);
}

ks_status ks_reader_fetch_many(const ks_reader *r, const ks_fetch *jobs, size_t n, unsigned threads, ks_error *err) {
  ks_error_clear(err);
  if (!r || (n && !jobs)) return ks__err(err, KS_E_INVALID, "ks_reader_fetch_many: NULL argument");
  fetch_ctx c = {r, jobs};
  ks__par_job job = {&c, job_bytes, fetch_one};
  return ks__par_each(&job, n, threads, err);
}
