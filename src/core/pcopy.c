/* ks__copy_parallel and ks__cpus (core/pcopy.h). */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "core/pcopy.h"

#include <pthread.h>
#include <sched.h>
#include <string.h>
#include <unistd.h>

#define PCOPY_MAX_THREADS 4

/* One thread's share: the bytes [begin, end) of the pieces laid end to end. */
typedef struct share {
  const ks__copy *pieces;
  size_t n, begin, end;
} share;

static void copy_share(const share *s) {
  size_t at = 0; /* where piece i starts in the laid-out bytes */
  for (size_t i = 0; i < s->n && at < s->end; at += s->pieces[i].n, i++) {
    const ks__copy *p = &s->pieces[i];
    size_t lo = s->begin > at ? s->begin - at : 0, hi = s->end - at < p->n ? s->end - at : p->n;
    if (lo < hi) memcpy((char *)p->dst + lo, (const char *)p->src + lo, hi - lo);
  }
}

static void *worker(void *arg) {
  copy_share(arg);
  return NULL;
}

size_t ks__cpus(void) {
#ifdef CPU_COUNT
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return (size_t)CPU_COUNT(&set);
#endif
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  return cpus > 0 ? (size_t)cpus : 1;
}

static size_t thread_count(size_t threads) {
  if (!threads) threads = ks__cpus();
  return threads > PCOPY_MAX_THREADS ? PCOPY_MAX_THREADS : threads;
}

void ks__copy_parallel(const ks__copy *pieces, size_t n, size_t threads) {
  size_t total = 0;
  for (size_t i = 0; i < n; i++) total += pieces[i].n;
  size_t t = total < KS__PCOPY_MIN ? 1 : thread_count(threads);
  share shares[PCOPY_MAX_THREADS];
  pthread_t ids[PCOPY_MAX_THREADS];
  int started[PCOPY_MAX_THREADS] = {0};
  size_t step = (total / t + 4095) & ~(size_t)4095; /* page-aligned shares: no two threads touch one page */
  for (size_t k = 0; k < t; k++) {
    size_t b = k * step < total ? k * step : total, e = k + 1 == t || (k + 1) * step > total ? total : (k + 1) * step;
    shares[k] = (share){pieces, n, b, e};
  }
  for (size_t k = 1; k < t; k++) started[k] = pthread_create(&ids[k], NULL, worker, &shares[k]) == 0;
  copy_share(&shares[0]);
  for (size_t k = 1; k < t; k++) {
    if (started[k]) pthread_join(ids[k], NULL);
    else copy_share(&shares[k]); /* could not start: the caller does it */
  }
}
