/*
 * ks_save: atomic, durable, streaming write of a state dict.
 *
 * Every allocation happens before the temporary file exists, so running out of
 * memory never touches the disk. The temp file, fsync and rename steps are
 * core/durable.c, shared with the torch writer.
 *
 * The header, which precedes the data, holds every tensor's checksum, but its
 * length does not depend on their values (16 hex digits each): it is written with
 * placeholder digits, the tensors are hashed as they are written, and the digits
 * are then written over the placeholders with the table's pwrite_fn (one call). A
 * table without one (an upload that can only append) gets the checksums from a
 * hashing pass before the file is written; the file is byte for byte the same.
 *
 * How the bytes get to the file (save_pipe.c holds the threads):
 *   - a durable save of at least DIRECT_MIN bytes through a local table: a second
 *     thread gathers the file's image, chunk by chunk, into a few aligned buffers,
 *     hashing each piece as it copies it, while the caller writes the chunk before
 *     with direct I/O (O_DIRECT): no copy into the page cache and no writeback left
 *     to fsync, as a staged save's file image (image.c). A file system that
 *     refuses direct I/O gets the pipeline below instead, or buffered writes of the
 *     chunks when it refuses only the writes;
 *   - else, with a second CPU and enough bytes (PIPE_MIN): the caller writes the tensors straight from their
 *     memory through the page cache while a second thread hashes them a few MiB
 *     ahead, so the writes find the bytes in the cache and the hashing costs no
 *     wall time; whatever the thread has not hashed when the writes end, the caller
 *     hashes itself;
 *   - with one CPU, a small save, or when no thread starts: one thread hashes each piece just
 *     before writing it, while it is in the cache.
 * Small tensors are gathered in a staging buffer so that a file of 100,000 tiny
 * tensors does not cost 100,000 system calls.
 */
#include <string.h>

#include "core/durable.h"
#include "core/io_ops.h"
#include "core/nosync/io_nosync.h"
#include "core/pcopy.h"
#include "format/fmt_internal.h"
#include "format/save_pipe.h"

#define STAGE_CAP ((size_t)1 << 20)
/* A durable save at least this large writes its image with direct I/O (when the table allows):
   below, the page cache's copy costs little and fsync little more. */
#define DIRECT_MIN ((uint64_t)16 << 20)
/* Below this, or with tensors smaller than PIPE_MIN_AVERAGE on average, a save hashes on the
   caller's thread: one thread, as with one CPU. */
#define PIPE_MIN ((uint64_t)4 << 20)
#define PIPE_MIN_AVERAGE ((uint64_t)4 << 10)

typedef enum save_mode { MODE_SERIAL, MODE_PIPE, MODE_DIRECT, MODE_TWO_PASS } save_mode;

typedef struct save_ctx {
  const ks_allocator *alloc;
  ks__durable out;
  ks__sbuf *hdr;
  ks__save_job job; /* the tensors, their checksums and where those go in the header */
  uint8_t *stage;
  size_t stage_len, stage_cap;
  uint8_t *ring_mem; /* MODE_DIRECT: the aligned buffers' allocation */
  bool baseline_hash; /* MODE_SERIAL: XXH3 as compiled here, not ks__xxh3's dispatch (ks__save_tuning) */
  ks__xxh3_state xx;
} save_ctx;

static KS_NODISCARD ks_status flush_stage(save_ctx *c) {
  ks_status st = ks__durable_write(&c->out, c->stage, c->stage_len);
  c->stage_len = 0;
  return st;
}

static KS_NODISCARD ks_status put_data(save_ctx *c, const void *p, size_t n) {
  ks_status st = KS_OK;
  if (c->stage_len + n > c->stage_cap && (st = flush_stage(c)) != KS_OK) return st;
  if (n >= c->stage_cap) return ks__durable_write(&c->out, p, n);
  if (n) memcpy(c->stage + c->stage_len, p, n);
  c->stage_len += n;
  return KS_OK;
}

/* One thread: a staged tensor is hashed whole before it is copied, a large one piece by piece
   before each piece is written (still in the cache when write() copies it). */
static KS_NODISCARD ks_status put_hashed(save_ctx *c, size_t k) {
  const ks__save_span *s = &c->job.spans[k];
  if (s->n < c->stage_cap) {
    c->job.sums[k] = c->baseline_hash ? XXH3_64bits(s->p, s->n) : ks_checksum(s->p, s->n);
    return put_data(c, s->p, s->n);
  }
  ks_status st = flush_stage(c);
  if (st) return st;
  ks__xxh3_reset(&c->xx);
  for (size_t done = 0; done < s->n;) {
    size_t len = s->n - done < KS__HASH_PIECE ? s->n - done : KS__HASH_PIECE;
    if (c->baseline_hash) (void)XXH3_64bits_update(&c->xx, s->p + done, len);
    else ks__xxh3_update(&c->xx, s->p + done, len);
    if ((st = ks__durable_write(&c->out, s->p + done, len)) != KS_OK) return st;
    done += len;
  }
  c->job.sums[k] = ks__xxh3_digest(&c->xx);
  return KS_OK;
}

/* The checksums into the header's placeholders (in memory). */
static void put_digits(save_ctx *c) {
  for (size_t k = 0; k < c->job.n; k++) ks__put_sum_digits(c->hdr->p + c->job.sum_at[k], c->job.sums[k]);
}

/* Writes the checksum digits over their placeholders in the file: one write covering all of them. */
static KS_NODISCARD ks_status patch_sums(save_ctx *c) {
  if (!c->job.n) return KS_OK;
  put_digits(c);
  size_t first = c->job.sum_at[0], end = c->job.sum_at[c->job.n - 1] + 16;
  return ks__durable_pwrite(&c->out, c->hdr->p + first, end - first, first);
}

/* The data section through the page cache; `pipe`: a hashing thread runs beside (told how far the
   writes are), else each tensor is hashed here (one_pass) or was hashed before (neither). */
static KS_NODISCARD ks_status write_data(save_ctx *c, ks__save_hasher *pipe, bool one_pass) {
  ks_status st = KS_OK;
  for (size_t k = 0; !st && k < c->job.n; k++) {
    const ks__save_span *s = &c->job.spans[k];
    if (one_pass && !pipe) {
      st = put_hashed(c, k);
      continue;
    }
    if (!pipe || s->n < c->stage_cap) {
      st = put_data(c, s->p, s->n);
      if (pipe) ks__save_hasher_wrote(pipe, s->off + s->n);
      continue;
    }
    if ((st = flush_stage(c)) != KS_OK) break;
    for (size_t done = 0; !st && done < s->n;) { /* in pieces, so the hashing thread keeps close ahead */
      size_t len = s->n - done < KS__WRITE_PIECE ? s->n - done : KS__WRITE_PIECE;
      st = ks__durable_write(&c->out, s->p + done, len);
      done += len;
      ks__save_hasher_wrote(pipe, s->off + done);
    }
  }
  return st ? st : flush_stage(c);
}

static KS_NODISCARD ks_status body_serial(save_ctx *c) {
  ks_status st = ks__durable_write(&c->out, c->hdr->p, c->hdr->len);
  if (!st) st = write_data(c, NULL, true);
  return st ? st : patch_sums(c);
}

static KS_NODISCARD ks_status body_pipe(save_ctx *c, const ks__save_tuning *t) {
  ks__save_hasher h;
  ks__save_hasher_start(&h, &c->job, t->lead ? t->lead : KS__HASH_LEAD, t->threads != 1);
  ks_status st = ks__durable_write(&c->out, c->hdr->p, c->hdr->len);
  if (!st) st = write_data(c, &h, true);
  ks__save_hasher_finish(&h, st == KS_OK); /* the caller hashes what the thread has not */
  return st ? st : patch_sums(c);
}

static KS_NODISCARD ks_status body_two_pass(save_ctx *c, const ks__save_tuning *t) {
  ks__save_hasher h;
  ks__save_hasher_start(&h, &c->job, 0, t->threads != 1); /* both threads hash, nothing is written yet */
  ks__save_hasher_finish(&h, true);
  put_digits(c);
  ks_status st = ks__durable_write(&c->out, c->hdr->p, c->hdr->len);
  return st ? st : write_data(c, NULL, false);
}

/* Whether a second thread may share the hashing with the caller's writes. */
static bool two_threads(const ks__save_tuning *t) { return t->threads ? t->threads >= 2 : ks__cpus() >= 2; }

static KS_NODISCARD ks_status body_direct(save_ctx *c, const ks__save_tuning *t) {
  if (!ks__durable_direct_begin(&c->out)) /* the file system will not */
    return two_threads(t) ? body_pipe(c, t) : body_serial(c);
  ks__save_ring ring;
  ks__save_ring_init(&ring, &c->job, c->hdr->p, c->hdr->len, c->ring_mem);
  ks_status st = ks__save_ring_run(&ring, &c->out, t->threads != 1);
  return st || ring.head_written ? st : patch_sums(c);
}

static void cleanup(save_ctx *c) {
  ks__durable_abort(&c->out);
  ks__free(c->alloc, c->stage);
  ks__free(c->alloc, c->ring_mem);
  ks__save_job_free(&c->job, c->alloc);
}

/* Which way the bytes go (see the top of this file). */
static save_mode plan(const ks_io *io, const ks__save_tuning *t, uint64_t data_len, size_t hlen, size_t tensors) {
  const ks_io *v = ks__io_v1(io);
  if (!ks__io_can_pwrite(io)) return MODE_TWO_PASS;
  unsigned caps = ks_io_caps(v);
  bool durable = !(caps & KS__IO_CAP_NO_FSYNC);
  if ((caps & KS_IO_CAP_LOCAL) && t->direct >= 0 && hlen <= KS__RING_CHUNK &&
      (t->direct > 0 || (durable && data_len >= DIRECT_MIN && hlen <= data_len / 16)))
    return MODE_DIRECT;
  /* A small data section is hashed in less time than a thread takes to start and meet the writes,
     and tiny tensors cost the threads more in handing them over than in hashing them. */
  bool worth = data_len >= PIPE_MIN && data_len / (tensors ? tensors : 1) >= PIPE_MIN_AVERAGE;
  return two_threads(t) && (t->threads >= 2 || worth) ? MODE_PIPE : MODE_SERIAL;
}

ks_status ks_save(const char *path, const ks_statedict *sd, const ks_meta *extra, const ks_save_opts *opts,
                  ks_error *err) {
  return ks__save_tuned(path, sd, extra, opts, NULL, err);
}

ks_status ks__save_tuned(const char *path, const ks_statedict *sd, const ks_meta *extra, const ks_save_opts *opts,
                         const ks__save_tuning *tuning, ks_error *err) {
  ks_error_clear(err);
  if (!path || !*path || !sd) return ks__err(err, KS_E_INVALID, "ks_save: path and state dict are required");
  KS__TAKE_OPTS(ks_save_opts, opts, KS__V1_SIZE(ks_save_opts, io), err);
  if (opts->image) { /* the state into the image, then the file from it (image.c) */
    ks_status is = ks_image_stage(opts->image, sd, extra, err);
    if (!is) is = ks_image_write(opts->image, path, opts, err);
    else ks__err_set_file(err, path);
    return is;
  }
  ks__save_tuning t = tuning ? *tuning : (ks__save_tuning){0};
  save_ctx c = {0};
  c.alloc = opts ? opts->alloc : NULL;
  c.baseline_hash = t.baseline_hash && t.threads == 1;
  ks__sbuf hdr;
  ks__sbuf_init(&hdr, c.alloc);
  c.hdr = &hdr;
  const ks_io *io = opts ? opts->io : NULL;
  uint64_t data_len = 0;
  ks_status st = ks__save_job_make(&c.job, sd, c.alloc, err);
  if (!st) st = ks__build_header(sd, extra, c.alloc, &hdr, &data_len, c.job.sum_at, err);
  /* ks_io_check first: a table that fails it is refused by prepare, whatever its members say. */
  save_mode mode = st || ks_io_check(io, NULL) ? MODE_SERIAL : plan(io, &t, data_len, hdr.len, c.job.n);
  if (!st) st = ks__durable_prepare(&c.out, path, io, c.alloc, err);
  c.stage_cap = data_len < STAGE_CAP ? (size_t)data_len + 1 : STAGE_CAP;
  if (!st && !(c.stage = ks__malloc(c.alloc, c.stage_cap))) st = ks__err(err, KS_E_NOMEM, "out of memory");
  if (!st && mode == MODE_DIRECT && !(c.ring_mem = ks__malloc(c.alloc, ks__ring_bytes(hdr.len))))
    st = ks__err(err, KS_E_NOMEM, "out of memory");
  if (!st) st = ks__durable_open(&c.out);
  if (!st) {
    switch (mode) {
    case MODE_SERIAL: st = body_serial(&c); break;
    case MODE_PIPE: st = body_pipe(&c, &t); break;
    case MODE_DIRECT: st = body_direct(&c, &t); break;
    case MODE_TWO_PASS: st = body_two_pass(&c, &t); break;
    }
  }
  if (!st) st = ks__durable_commit(&c.out);
  if (st) ks__err_set_file(err, path);
  cleanup(&c);
  ks__sbuf_free(&hdr);
  return st;
}
