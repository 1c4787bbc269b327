/*
 * The threads of a save (save_pipe.h). Hashing a tensor is sequential (XXH3's state goes
 * through its bytes in order), so the unit two threads share is a whole tensor; within one,
 * the bytes go by in pieces small enough to be used again while they are in the cache.
 */
#include "format/save_pipe.h"

#include <errno.h>
#include <string.h>

ks_status ks__save_job_make(ks__save_job *j, const ks_statedict *sd, const ks_allocator *a, ks_error *err) {
  *j = (ks__save_job){0};
  size_t n = 0;
  for (size_t i = 0; i < ks_statedict_count(sd); i++) {
    ks_entry e;
    if (!ks_statedict_at(sd, i, &e) && e.kind == KS_VAL_TENSOR) n++;
  }
  if (!n) return KS_OK;
  j->spans = ks__malloc(a, n * sizeof *j->spans);
  j->sums = ks__malloc(a, n * sizeof *j->sums);
  j->sum_at = ks__malloc(a, n * sizeof *j->sum_at);
  if (!j->spans || !j->sums || !j->sum_at) {
    ks__save_job_free(j, a);
    return ks__err(err, KS_E_NOMEM, "out of memory");
  }
  uint64_t off = 0;
  for (size_t i = 0; i < ks_statedict_count(sd); i++) {
    ks_entry e;
    if (ks_statedict_at(sd, i, &e) || e.kind != KS_VAL_TENSOR) continue; /* index in range: cannot fail */
    j->spans[j->n++] = (ks__save_span){e.tensor.data, e.tensor.nbytes, off};
    off += e.tensor.nbytes;
  }
  return KS_OK;
}

void ks__save_job_free(ks__save_job *j, const ks_allocator *a) {
  ks__free(a, j->spans);
  ks__free(a, j->sums);
  ks__free(a, j->sum_at);
  *j = (ks__save_job){0};
}

/* ---- the hashing thread beside buffered writes ---- */

/* Whether the bytes before `end` of the data section may be hashed now: the caller's writes are
   at most `lead` behind, or over. */
static bool may_hash(ks__save_hasher *h, uint64_t end, uint64_t lead) {
  return !h->lead || end <= atomic_load(&h->written) + lead || atomic_load(&h->done) || atomic_load(&h->stop);
}

/* Sleeps until may_hash (with half the lead). `waiting` is set before the condition is checked again and the caller
   stores its progress before it reads `waiting` (both sequentially consistent), so one of the
   two sees the other: no wakeup is lost. */
static void wait_for_writes(ks__save_hasher *h, uint64_t end) {
  if (may_hash(h, end, h->lead)) return;
  pthread_mutex_lock(&h->mu);
  atomic_store(&h->waiting, true);
  /* Until the writes are half the lead behind: woken once per half lead, not once per piece. */
  while (!may_hash(h, end, h->lead / 2)) pthread_cond_wait(&h->cv, &h->mu);
  atomic_store(&h->waiting, false);
  pthread_mutex_unlock(&h->mu);
}

static void hash_one(ks__save_hasher *h, size_t k) {
  const ks__save_span *s = &h->job->spans[k];
  ks__xxh3_state xx;
  ks__xxh3_reset(&xx);
  for (size_t done = 0; done < s->n && !atomic_load(&h->stop);) {
    size_t len = s->n - done < KS__HASH_PIECE ? s->n - done : KS__HASH_PIECE;
    wait_for_writes(h, s->off + done + len);
    ks__xxh3_update(&xx, s->p + done, len);
    done += len;
  }
  h->job->sums[k] = s->n ? ks__xxh3_digest(&xx) : ks__xxh3(NULL, 0);
}

static void hash_claimed(ks__save_hasher *h) {
  for (;;) {
    size_t k = atomic_fetch_add(&h->next, 1);
    if (k >= h->job->n || atomic_load(&h->stop)) return;
    hash_one(h, k);
  }
}

static void *hasher_main(void *arg) {
  hash_claimed(arg);
  return NULL;
}

void ks__save_hasher_start(ks__save_hasher *h, ks__save_job *job, uint64_t lead, bool thread) {
  h->job = job;
  h->lead = lead;
  atomic_init(&h->next, 0);
  atomic_init(&h->written, 0);
  atomic_init(&h->done, false);
  atomic_init(&h->stop, false);
  atomic_init(&h->waiting, false);
  pthread_mutex_init(&h->mu, NULL); /* default attributes: cannot fail on Linux */
  pthread_cond_init(&h->cv, NULL);
  /* A thread that cannot start leaves its work to ks__save_hasher_finish. */
  h->started = thread && job->n && pthread_create(&h->tid, NULL, hasher_main, h) == 0;
}

void ks__save_hasher_wrote(ks__save_hasher *h, uint64_t end) {
  atomic_store(&h->written, end);
  if (!atomic_load(&h->waiting)) return;
  pthread_mutex_lock(&h->mu);
  pthread_cond_broadcast(&h->cv);
  pthread_mutex_unlock(&h->mu);
}

void ks__save_hasher_finish(ks__save_hasher *h, bool hash_rest) {
  pthread_mutex_lock(&h->mu);
  atomic_store(hash_rest ? &h->done : &h->stop, true);
  pthread_cond_broadcast(&h->cv);
  pthread_mutex_unlock(&h->mu);
  if (hash_rest) hash_claimed(h);
  if (h->started) pthread_join(h->tid, NULL);
  pthread_cond_destroy(&h->cv);
  pthread_mutex_destroy(&h->mu);
}

/* ---- the ring of aligned buffers for direct writes ---- */

void ks__save_ring_init(ks__save_ring *r, ks__save_job *job, const char *hdr, size_t hlen, uint8_t *mem) {
  memset(r, 0, sizeof *r);
  r->job = job;
  r->hdr = hdr;
  r->hlen = hlen;
  r->buf = mem + (KS__DIRECT_ALIGN - (uintptr_t)mem % KS__DIRECT_ALIGN) % KS__DIRECT_ALIGN;
  r->head = r->buf + KS__RING_CHUNK * KS__RING_BUFS;
  r->head_len = ks__ring_head_len(hlen);
  r->total = hlen + (job->n ? job->spans[job->n - 1].off + job->spans[job->n - 1].n : 0);
  /* A short first chunk: the disk starts writing after a few hundred KiB are copied, not 4 MiB
     (the first use of each buffer also faults its pages in). */
  r->first = r->head_len + KS__RING_FIRST_DATA < KS__RING_CHUNK ? r->head_len + KS__RING_FIRST_DATA : KS__RING_CHUNK;
  size_t grid = (size_t)((r->total + KS__RING_CHUNK - 1) / KS__RING_CHUNK); /* 4 MiB chunks */
  r->chunks = r->total <= r->first ? 1 : r->first < KS__RING_CHUNK ? grid + 1 : grid;
  for (size_t k = 0; k < job->n; k++) /* the empty ones take no place in the image */
    if (!job->spans[k].n) job->sums[k] = ks__xxh3(NULL, 0);
}

static uint8_t *chunk_at(const ks__save_ring *r, size_t ci) { return r->buf + (ci % KS__RING_BUFS) * KS__RING_CHUNK; }

/* Where chunk ci ends: the first at `first`, the others where main's 4 MiB grid puts them, so
   every later write is as large and as aligned as without the short first chunk. */
static uint64_t chunk_end(const ks__save_ring *r, size_t ci) {
  uint64_t end = ci ? (uint64_t)(ci + (r->first < KS__RING_CHUNK ? 0 : 1)) * KS__RING_CHUNK : r->first;
  return end < r->total ? end : r->total;
}

static uint64_t chunk_start(const ks__save_ring *r, size_t ci) { return ci ? chunk_end(r, ci - 1) : 0; }

static size_t chunk_len(const ks__save_ring *r, size_t ci) { return (size_t)(chunk_end(r, ci) - chunk_start(r, ci)); }

/* Copies the file's bytes of chunk ci into its buffer, hashing each tensor piece as it lands. */
static void fill_chunk(ks__save_ring *r, size_t ci) {
  uint8_t *dst = chunk_at(r, ci);
  uint64_t pos = chunk_start(r, ci), end = pos + chunk_len(r, ci);
  while (pos < end) {
    size_t n;
    if (pos < r->hlen) {
      n = (size_t)((end < r->hlen ? end : r->hlen) - pos);
      memcpy(dst, r->hdr + pos, n);
    } else {
      while (!r->job->spans[r->k].n) r->k++; /* pos < total: a tensor with bytes left follows */
      const ks__save_span *s = &r->job->spans[r->k];
      n = s->n - r->in;
      if (n > end - pos) n = (size_t)(end - pos);
      if (n > KS__HASH_PIECE) n = KS__HASH_PIECE;
      if (!r->in) ks__xxh3_reset(&r->xx);
      memcpy(dst, s->p + r->in, n);
      ks__xxh3_update(&r->xx, dst, n); /* from the copy, still in the cache */
      if ((r->in += n) == s->n) {
        r->job->sums[r->k++] = ks__xxh3_digest(&r->xx);
        r->in = 0;
      }
    }
    dst += n;
    pos += n;
  }
}

static void *filler_main(void *arg) {
  ks__save_ring *r = arg;
  for (size_t ci = r->filled; ci < r->chunks; ci++) { /* the caller filled the first */
    pthread_mutex_lock(&r->mu);
    while (ci >= r->taken + KS__RING_BUFS && !r->stop) pthread_cond_wait(&r->cv, &r->mu);
    bool stop = r->stop;
    pthread_mutex_unlock(&r->mu);
    if (stop) break;
    fill_chunk(r, ci);
    pthread_mutex_lock(&r->mu);
    r->filled = ci + 1;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
  }
  return NULL;
}

/* The bytes of chunk ci a writer writes: all of it but the last chunk's partial block, which
   goes after the head (write_ends). */
static size_t chunk_bulk(const ks__save_ring *r, size_t ci) {
  size_t n = chunk_len(r, ci);
  return ci + 1 < r->chunks ? n : n - n % KS__DIRECT_ALIGN;
}

/* Chunk ci's bulk at its offset, directly while `direct`; a file system that refuses ends direct
   writes (once, under mu) and gets it buffered. 0 or the errno. */
static int write_chunk(ks__save_ring *r, size_t ci, bool direct) {
  const uint8_t *p = chunk_at(r, ci);
  size_t n = chunk_bulk(r, ci);
  if (ci == 0 && r->head_len <= chunk_len(r, 0)) memcpy(r->head, p, r->head_len);
  int rc = n ? ks__durable_pwrite_raw(r->out, p, n, chunk_start(r, ci)) : 0;
  if (!direct || (rc != EINVAL && rc != ENOTSUP && rc != EOPNOTSUPP)) return rc;
  pthread_mutex_lock(&r->mu);
  if (r->direct) {
    r->direct = false;
    ks_status st = ks__durable_direct_end(r->out);
    if (st && !r->st) r->st = st;
  }
  pthread_mutex_unlock(&r->mu);
  return ks__durable_pwrite_raw(r->out, p, n, chunk_start(r, ci));
}

/* Chunk ci is written (rc 0) or failed: frees its buffer once every chunk before it is written. */
static void wrote(ks__save_ring *r, size_t ci, int rc) {
  pthread_mutex_lock(&r->mu);
  r->written |= 1u << (ci - r->taken);
  while (r->written & 1u) {
    r->written >>= 1;
    r->taken++;
  }
  if ((rc || r->st) && !r->stop) {
    r->stop = true;
    if (rc && !r->rc) r->rc = rc;
  }
  pthread_cond_broadcast(&r->cv);
  pthread_mutex_unlock(&r->mu);
}

/* A writer: claims the next filled chunk and writes it, until none is left or one failed. */
static void write_claimed(ks__save_ring *r) {
  for (;;) {
    pthread_mutex_lock(&r->mu);
    while (!r->stop && r->next < r->chunks && r->filled <= r->next) pthread_cond_wait(&r->cv, &r->mu);
    if (r->stop || r->next >= r->chunks) {
      pthread_mutex_unlock(&r->mu);
      return;
    }
    size_t ci = r->next++;
    bool direct = r->direct;
    pthread_mutex_unlock(&r->mu);
    wrote(r, ci, write_chunk(r, ci, direct));
  }
}

static void *writer_main(void *arg) {
  write_claimed(arg);
  return NULL;
}

/* The head blocks again, now with every checksum's digits, at offset 0 with a direct write: no
   block of the file is left in the page cache for fsync to read back and write (a buffered
   patch of the header would). Only over bytes already written, so the file never grows; a file
   system that refuses leaves it to the caller. Then the last partial block, through the page
   cache. */
static KS_NODISCARD ks_status write_ends(ks__save_ring *r) {
  size_t last = r->chunks - 1, bulk = chunk_bulk(r, last);
  uint64_t tail_at = chunk_start(r, last) + bulk;
  if (r->direct && r->head_len <= tail_at) {
    for (size_t k = 0; k < r->job->n; k++) ks__put_sum_digits((char *)r->head + r->job->sum_at[k], r->job->sums[k]);
    int rc = ks__durable_pwrite_raw(r->out, r->head, r->head_len, 0);
    if (rc && rc != EINVAL && rc != ENOTSUP && rc != EOPNOTSUPP) return ks__durable_fail(r->out, rc);
    r->head_written = !rc;
  }
  ks_status st = ks__durable_direct_end(r->out);
  int rc = st || bulk == chunk_len(r, last) ? 0
                                            : ks__durable_pwrite_raw(r->out, chunk_at(r, last) + bulk,
                                                                     chunk_len(r, last) - bulk, tail_at);
  return st ? st : rc ? ks__durable_fail(r->out, rc) : KS_OK;
}

ks_status ks__save_ring_run(ks__save_ring *r, ks__durable *out, bool thread) {
  pthread_mutex_init(&r->mu, NULL); /* default attributes: cannot fail on Linux */
  pthread_cond_init(&r->cv, NULL);
  r->out = out;
  r->direct = out->direct;
  pthread_t filler, writer;
  /* The caller fills the short first chunk itself: the disk starts without waiting for the new
     threads to be scheduled (milliseconds when the CPUs are busy). */
  bool two = thread && r->chunks > 1;
  if (two) {
    fill_chunk(r, 0);
    r->filled = 1;
    (void)ks__durable_reserve(out, r->total); /* false: the writes allocate as they go */
  }
  bool filling = two && pthread_create(&filler, NULL, filler_main, r) == 0;
  bool writing = filling && pthread_create(&writer, NULL, writer_main, r) == 0;
  if (filling) {
    write_claimed(r);
    if (writing) pthread_join(writer, NULL);
    pthread_join(filler, NULL);
  } else {
    for (size_t ci = 0; ci < r->chunks && !r->stop; ci++) { /* fill, then write, in turn */
      if (ci >= r->filled) fill_chunk(r, ci);
      r->filled = ci + 1;
      wrote(r, ci, write_chunk(r, ci, r->direct));
    }
  }
  pthread_cond_destroy(&r->cv);
  pthread_mutex_destroy(&r->mu);
  if (r->st) return r->st;
  return r->rc ? ks__durable_fail(out, r->rc) : write_ends(r);
}
