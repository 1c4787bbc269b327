/*
 * The full load of a lazy reader: the data section (whose tensors tile it, as
 * open checked) is cut into a few large ranges that worker threads read
 * concurrently through io->read_fn. Each tensor keeps a count of the ranges it
 * still waits for; the thread whose range completes it verifies its checksum,
 * so verification overlaps the transfer and a mismatch stops the load early.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/fmap.h"
#include "core/io_ops.h"
#include "format/fmt_internal.h"

#define LOAD_THREADS 4
#define RANGE_MIN ((uint64_t)8 << 20)
#define RANGE_MAX ((uint64_t)64 << 20)

typedef struct load_job {
  ks_reader *r;
  uint64_t len, range;     /* data section length, range size */
  uint64_t base;           /* data bytes [0, base) came with the header: ranges start after them */
  size_t n_ranges;
  size_t *order;           /* tensor indices sorted by offset */
  size_t *first;           /* per range: position in order of its first tensor */
  atomic_size_t *pending;  /* per tensor (by index): ranges not yet read */
  atomic_size_t next;      /* next range to take */
  atomic_bool stop;
  pthread_mutex_t lock;    /* guards st and err */
  ks_status st;
  ks_error err;
} load_job;

static void fail(load_job *j, ks_status st, const ks_error *e) {
  pthread_mutex_lock(&j->lock);
  if (!j->st) {
    j->st = st;
    j->err = *e;
  }
  pthread_mutex_unlock(&j->lock);
  atomic_store(&j->stop, true);
}

/* Marks range k's share of every tensor it overlaps; a tensor whose last range it was is verified. */
static void finish_range(load_job *j, size_t k) {
  const ks_reader *r = j->r;
  uint64_t end = j->base + (uint64_t)(k + 1) * j->range;
  for (size_t p = j->first[k]; p < r->count && !atomic_load(&j->stop); p++) {
    size_t i = j->order[p];
    const fmt_entry *e = &r->entries[i];
    if (e->begin >= end) break;
    if (e->end == e->begin || atomic_fetch_sub(&j->pending[i], 1) != 1) continue;
    ks_error er;
    ks_status st = ks__lazy_check(r, i, r->data + e->begin, &er);
    if (st) fail(j, st, &er);
  }
}

static void read_range(load_job *j, size_t k) {
  const ks_reader *r = j->r;
  uint64_t a = j->base + (uint64_t)k * j->range, b = a + j->range < j->len ? a + j->range : j->len;
  size_t done = 0, n = (size_t)(b - a);
  while (done < n && !atomic_load(&j->stop)) {
    size_t got = 0;
    uint64_t off = r->data_off + a + done;
    int rc = r->io->read_fn(r->io->ctx, r->fd, r->data + a + done, n - done, off, &got);
    ks_error er;
    char why[KS__IO_WHY_MAX];
    if (rc || got == 0) {
      if (rc)
        ks__err_at(&er, KS_E_IO, r->path, NULL, (int64_t)off, "cannot read %zu bytes: %s", n - done,
                   ks__io_why(r->io, rc, why, sizeof why));
      else ks__err_at(&er, KS_E_IO, r->path, NULL, (int64_t)off, "file shrank while being read");
      fail(j, KS_E_IO, &er);
      return;
    }
    done += got;
  }
  if (done == n) finish_range(j, k);
}

static void *worker(void *arg) {
  load_job *j = arg;
  for (;;) {
    size_t k = atomic_fetch_add(&j->next, 1);
    if (k >= j->n_ranges || atomic_load(&j->stop)) return NULL;
    read_range(j, k);
  }
}

/* Tensors in no range (empty, or wholly in the bytes that came with the header) are verified up front. */
static void check_in_memory(load_job *j) {
  for (size_t i = 0; i < j->r->count && !j->st; i++) {
    const fmt_entry *e = &j->r->entries[i];
    ks_error er;
    ks_status st =
        e->end <= j->base || e->end == e->begin ? ks__lazy_check(j->r, i, j->r->data + e->begin, &er) : KS_OK;
    if (st) fail(j, st, &er);
  }
}

static int cmp_entry(const ks_reader *r, size_t a, size_t b) {
  const fmt_entry *x = &r->entries[a], *y = &r->entries[b];
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  return x->end < y->end ? -1 : x->end > y->end;
}

/* Insertion into a sorted order would be quadratic; files keepsake writes are in order already. */
void ks__fmt_order(const ks_reader *r, size_t *order) {
  bool sorted = true;
  for (size_t i = 0; i < r->count; i++) order[i] = i;
  for (size_t i = 1; i < r->count && sorted; i++) sorted = cmp_entry(r, i - 1, i) <= 0;
  if (sorted) return;
  /* Heap sort: no context pointer is needed and the worst case stays n log n on hostile headers. */
  size_t n = r->count, *a = order;
  for (size_t s = n / 2; s-- > 0;) {
    for (size_t root = s, c; (c = 2 * root + 1) < n; root = c) {
      if (c + 1 < n && cmp_entry(r, a[c], a[c + 1]) < 0) c++;
      if (cmp_entry(r, a[root], a[c]) >= 0) break;
      size_t t = a[root]; a[root] = a[c]; a[c] = t;
    }
  }
  for (size_t end = n; end-- > 1;) {
    size_t t = a[0]; a[0] = a[end]; a[end] = t;
    for (size_t root = 0, c; (c = 2 * root + 1) < end; root = c) {
      if (c + 1 < end && cmp_entry(r, a[c], a[c + 1]) < 0) c++;
      if (cmp_entry(r, a[root], a[c]) >= 0) break;
      t = a[root]; a[root] = a[c]; a[c] = t;
    }
  }
}

/* Ranges of [RANGE_MIN, RANGE_MAX] bytes, about four per thread; each tensor's count of ranges. */
static void size_ranges(load_job *j) {
  uint64_t left = j->len - j->base, range = left / (LOAD_THREADS * 4);
  j->range = range < RANGE_MIN ? RANGE_MIN : range > RANGE_MAX ? RANGE_MAX : range;
  j->n_ranges = (size_t)((left + j->range - 1) / j->range);
}

static void plan(load_job *j) {
  const ks_reader *r = j->r;
  ks__fmt_order(r, j->order);
  size_t p = 0;
  for (size_t k = 0; k < j->n_ranges; k++) {
    uint64_t start = j->base + (uint64_t)k * j->range;
    while (p < r->count && r->entries[j->order[p]].end <= start) p++;
    j->first[k] = p;
  }
  for (size_t i = 0; i < r->count; i++) {
    const fmt_entry *e = &r->entries[i];
    uint64_t b = e->begin > j->base ? e->begin - j->base : 0;
    size_t c =
        e->end > j->base && e->end > e->begin ? (size_t)((e->end - 1 - j->base) / j->range - b / j->range + 1) : 0;
    atomic_init(&j->pending[i], c);
  }
}

static void run(load_job *j) {
  pthread_t t[LOAD_THREADS - 1];
  size_t started = 0, want = j->n_ranges < LOAD_THREADS ? j->n_ranges : LOAD_THREADS;
  for (; started + 1 < want; started++) /* a thread that cannot start just leaves more work to the others */
    if (pthread_create(&t[started], NULL, worker, j)) break;
  worker(j);
  for (size_t i = 0; i < started; i++) pthread_join(t[i], NULL);
}

static KS_NODISCARD ks_status job_alloc(load_job *j, ks_error *err) {
  const ks_reader *r = j->r;
  size_t n = r->count ? r->count : 1;
  j->order = ks__calloc(&r->alloc, n, sizeof *j->order);
  j->first = ks__calloc(&r->alloc, j->n_ranges ? j->n_ranges : 1, sizeof *j->first);
  j->pending = ks__calloc(&r->alloc, n, sizeof *j->pending);
  if (!j->order || !j->first || !j->pending)
    return ks__err_at(err, KS_E_NOMEM, r->path, NULL, -1, "out of memory planning the load of %zu tensors", n);
  return KS_OK;
}

static void job_free(load_job *j) {
  ks__free(&j->r->alloc, j->order);
  ks__free(&j->r->alloc, j->first);
  ks__free(&j->r->alloc, j->pending);
}

ks_status ks__lazy_load_all(ks_reader *r, ks_error *err) {
  if (r->data) return KS_OK;
  load_job j = {.r = r, .len = (uint64_t)r->size - r->data_off};
  if (j.len > SIZE_MAX) return ks__err_at(err, KS_E_LIMIT, r->path, NULL, -1, "data too large for this platform");
  r->data = ks__malloc(&r->alloc, j.len ? (size_t)j.len : 1);
  if (!r->data)
    return ks__err_at(err, KS_E_NOMEM, r->path, NULL, -1, "out of memory for %llu bytes", (unsigned long long)j.len);
  ks__advise_huge(r->data, (size_t)j.len);
  if (r->have > r->data_off) { /* the first read of open brought these: never read a byte twice */
    j.base = r->have - r->data_off < j.len ? r->have - r->data_off : j.len;
    memcpy(r->data, r->copy + r->data_off, (size_t)j.base);
  }
  size_ranges(&j);
  ks_status st = job_alloc(&j, err);
  if (!st) {
    atomic_init(&j.next, 0);
    atomic_init(&j.stop, false);
    pthread_mutex_init(&j.lock, NULL);
    plan(&j);
    check_in_memory(&j);
    if (!j.st) run(&j);
    pthread_mutex_destroy(&j.lock);
    st = j.st;
    if (st && err) *err = j.err;
  }
  job_free(&j);
  if (st) {
    ks__free(&r->alloc, r->data);
    r->data = NULL;
  }
  return st;
}
