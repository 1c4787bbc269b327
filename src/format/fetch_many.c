/*
 * ks_reader_fetch_many: many tensors into the caller's memory on a few threads. A load into new
 * memory is bound by the CPU (the kernel's copy out of the page cache, the first touch of each
 * page, XXH3), not by one core's share of it, so the work is cut into runs of about equal bytes,
 * one per thread, each fetched and verified as ks_reader_fetch does.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "format/fmt_internal.h"

#define FETCH_MAX_THREADS 4
#define FETCH_PARALLEL_MIN ((uint64_t)32 << 20) /* below this, one thread: starting others costs more */

typedef struct fetch_run {
  const ks_reader *r;
  const ks_fetch *jobs;
  size_t begin, end;   /* jobs [begin, end) */
  atomic_size_t *fail; /* the lowest job that failed so far (n when none): jobs past it are skipped,
                          jobs before it are still fetched, so the earliest failure is always found */
  size_t failed_at;    /* the job that failed (end when none) */
  ks_status st;
  ks_error err;
} fetch_run;

static void note_failure(atomic_size_t *fail, size_t k) {
  size_t seen = atomic_load(fail);
  while (k < seen && !atomic_compare_exchange_weak(fail, &seen, k)) {
  }
}

static void run_jobs(fetch_run *w) {
  w->failed_at = w->end;
  for (size_t k = w->begin; k < w->end && k < atomic_load(w->fail); k++) {
    const ks_fetch *j = &w->jobs[k];
    w->st = ks_reader_fetch(w->r, j->index, j->buf, j->cap, &w->err);
    if (w->st) {
      w->failed_at = k;
      note_failure(w->fail, k);
      break;
    }
  }
}

static void *worker(void *arg) {
  run_jobs(arg);
  return NULL;
}

/* The tensor bytes job k asks for (0 for a bad index: ks_reader_fetch reports it). */
static uint64_t job_bytes(const ks_reader *r, const ks_fetch *j) {
  ks_tensor_info info;
  return ks_reader_tensor_info(r, j->index, &info) ? 0 : info.end - info.begin;
}

static size_t thread_count(unsigned threads, uint64_t total) {
  if (total < FETCH_PARALLEL_MIN) return 1;
  long cpus = threads ? (long)threads : sysconf(_SC_NPROCESSORS_ONLN);
  return cpus < 1 ? 1 : cpus > FETCH_MAX_THREADS ? FETCH_MAX_THREADS : (size_t)cpus;
}

ks_status ks_reader_fetch_many(const ks_reader *r, const ks_fetch *jobs, size_t n, unsigned threads, ks_error *err) {
  ks_error_clear(err);
  if (!r || (n && !jobs)) return ks__err(err, KS_E_INVALID, "ks_reader_fetch_many: NULL argument");
  uint64_t total = 0;
  for (size_t k = 0; k < n; k++) total += job_bytes(r, &jobs[k]);
  size_t t = thread_count(threads, total);
  atomic_size_t fail;
  atomic_init(&fail, n);
  fetch_run runs[FETCH_MAX_THREADS];
  size_t k = 0;
  uint64_t done = 0;
  for (size_t w = 0; w < t; w++) { /* run w ends once the bytes so far reach (w + 1) / t of the total */
    size_t begin = k;
    uint64_t goal = w + 1 == t ? total : total / t * (w + 1);
    while (k < n && (done < goal || w + 1 == t)) done += job_bytes(r, &jobs[k++]);
    runs[w] = (fetch_run){.r = r, .jobs = jobs, .begin = begin, .end = k, .fail = &fail};
  }
  pthread_t ids[FETCH_MAX_THREADS];
  int started[FETCH_MAX_THREADS] = {0};
  for (size_t w = 1; w < t; w++) started[w] = pthread_create(&ids[w], NULL, worker, &runs[w]) == 0;
  run_jobs(&runs[0]);
  for (size_t w = 1; w < t; w++) {
    if (started[w]) pthread_join(ids[w], NULL);
    else run_jobs(&runs[w]); /* could not start: this thread does it */
  }
  const fetch_run *first = NULL; /* the failure of the earliest job is the one reported */
  for (size_t w = 0; w < t; w++)
    if (runs[w].failed_at < runs[w].end && (!first || runs[w].failed_at < first->failed_at)) first = &runs[w];
  if (!first) return KS_OK;
  if (err) *err = first->err;
  return first->st;
}
