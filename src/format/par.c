/*
 * ks__par_each (fmt_internal.h): work on many tensors at once on a few threads. A load into
 * memory is bound by the CPU (the kernel's copy out of the page cache, the first touch of each
 * page, XXH3), not by one core's share of it, so the items are cut into runs of about equal
 * bytes, one per thread, each run done in order (a tensor's bytes are hashed in order, so a
 * tensor is the smallest unit two threads can share).
 */
#include <pthread.h>
#include <stdatomic.h>

#include "core/pcopy.h"
#include "format/fmt_internal.h"

#define PAR_MAX_THREADS 4
#define PAR_MIN_BYTES ((uint64_t)32 << 20) /* below this, one thread: starting others costs more */

typedef struct par_run {
  const ks__par_job *job;
  size_t begin, end;   /* items [begin, end) */
  atomic_size_t *fail; /* the lowest item that failed so far (n when none): items past it are skipped,
                          items before it are still done, so the earliest failure is always found */
  size_t failed_at;    /* the item that failed (end when none) */
  ks_status st;
  ks_error err;
} par_run;

static void note_failure(atomic_size_t *fail, size_t k) {
  size_t seen = atomic_load(fail);
  while (k < seen && !atomic_compare_exchange_weak(fail, &seen, k)) {
  }
}

static void run_items(par_run *w) {
  w->failed_at = w->end;
  for (size_t k = w->begin; k < w->end && k < atomic_load(w->fail); k++) {
    ks_error_clear(&w->err);
    w->st = w->job->fn(w->job->ctx, k, &w->err);
    if (w->st) {
      w->failed_at = k;
      note_failure(w->fail, k);
      break;
    }
  }
}

static void *worker(void *arg) {
  run_items(arg);
  return NULL;
}

static size_t thread_count(unsigned threads, uint64_t total) {
  if (total < PAR_MIN_BYTES) return 1;
  size_t cpus = threads ? threads : ks__cpus();
  return cpus > PAR_MAX_THREADS ? PAR_MAX_THREADS : cpus < 1 ? 1 : cpus;
}

ks_status ks__par_each(const ks__par_job *job, size_t n, unsigned threads, ks_error *err) {
  uint64_t total = 0;
  for (size_t k = 0; k < n; k++) total += job->bytes(job->ctx, k);
  size_t t = thread_count(threads, total);
  atomic_size_t fail;
  atomic_init(&fail, n);
  par_run runs[PAR_MAX_THREADS];
  size_t k = 0;
  uint64_t done = 0;
  for (size_t w = 0; w < t; w++) { /* run w ends once the bytes so far reach (w + 1) / t of the total */
    size_t begin = k;
    uint64_t goal = w + 1 == t ? total : total / t * (w + 1);
    while (k < n && (done < goal || w + 1 == t)) done += job->bytes(job->ctx, k++);
    runs[w] = (par_run){.job = job, .begin = begin, .end = k, .fail = &fail};
  }
  pthread_t ids[PAR_MAX_THREADS];
  int started[PAR_MAX_THREADS] = {0};
  for (size_t w = 1; w < t; w++) started[w] = pthread_create(&ids[w], NULL, worker, &runs[w]) == 0;
  run_items(&runs[0]);
  for (size_t w = 1; w < t; w++) {
    if (started[w]) pthread_join(ids[w], NULL);
    else run_items(&runs[w]); /* could not start: this thread does it */
  }
  const par_run *first = NULL; /* the failure of the earliest item is the one reported */
  for (size_t w = 0; w < t; w++)
    if (runs[w].failed_at < runs[w].end && (!first || runs[w].failed_at < first->failed_at)) first = &runs[w];
  if (!first) return KS_OK;
  if (err) *err = first->err;
  return first->st;
}
