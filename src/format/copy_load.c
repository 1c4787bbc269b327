/*
 * KS_READ_COPY's data (ks__copy_load): the data section is cut into segments of whole tensors
 * in file order, of about SEGMENT bytes each (a larger tensor is a segment of its own), and a few
 * threads take runs of segments (ks__par_each). Each segment is read in pieces, and every
 * tensor's bytes are hashed as the piece holding them lands, while it is in the cache: one pass
 * over the bytes, few system calls for many small tensors, no tensor split between threads (a
 * tensor's hash goes through its bytes in order).
 */
#include "core/io_ops.h"
#include "format/fmt_internal.h"

#define PIECE ((uint64_t)512 << 10)
#define SEGMENT ((uint64_t)1 << 20)

typedef struct segment {
  size_t first, end; /* positions [first, end) in the file order */
} segment;

typedef struct copy_job {
  ks_reader *r;
  const size_t *order;
  const segment *segs;
  uint64_t *got;  /* tensor i's hash, or NULL: nothing is hashed */
  uint64_t piece; /* bytes per read */
} copy_job;

static const fmt_entry *at(const copy_job *j, size_t p) { return &j->r->entries[j->order[p]]; }

static uint64_t segment_bytes(void *ctx, size_t k) {
  const copy_job *j = ctx;
  return at(j, j->segs[k].end - 1)->end - at(j, j->segs[k].first)->begin;
}

/* The data section's bytes [from, to) are in memory: adds them to the tensors they belong to,
   from position *p on, and finishes each tensor they end. */
static void hash_landed(const copy_job *j, ks__xxh3_state *xx, size_t *p, size_t end, uint64_t from, uint64_t to) {
  const ks_reader *r = j->r;
  for (; *p < end; (*p)++) {
    const fmt_entry *e = at(j, *p);
    if (e->begin >= from && e->end <= to) { /* all of it landed at once: hashed in one call */
      j->got[j->order[*p]] = ks_checksum(r->copy + r->data_off + e->begin, (size_t)(e->end - e->begin));
      continue;
    }
    uint64_t a = e->begin > from ? e->begin : from, b = e->end < to ? e->end : to;
    if (a < b) ks__xxh3_update(xx, r->copy + r->data_off + a, (size_t)(b - a));
    if (e->end > to) return; /* its bytes go on in the next piece */
    j->got[j->order[*p]] = e->end > e->begin ? ks__xxh3_digest(xx) : ks__xxh3(NULL, 0);
    ks__xxh3_reset(xx);
  }
}

static KS_NODISCARD ks_status load_segment(void *ctx, size_t k, ks_error *err) {
  const copy_job *j = ctx;
  ks_reader *r = j->r;
  const segment *s = &j->segs[k];
  uint64_t pos = at(j, s->first)->begin, end = at(j, s->end - 1)->end;
  uint64_t held = r->have > r->data_off ? r->have - r->data_off : 0; /* came with the header */
  size_t p = s->first;
  ks__xxh3_state xx;
  ks__xxh3_reset(&xx);
  if (pos < held) {
    uint64_t m = end < held ? end : held;
    if (j->got) hash_landed(j, &xx, &p, s->end, pos, m);
    pos = m;
  }
  while (pos < end) {
    uint64_t n = end - pos < j->piece ? end - pos : j->piece;
    ks_status st = ks__reader_read(r, r->data_off + pos, r->copy + r->data_off + pos, (size_t)n, NULL, err);
    if (st) return st;
    if (j->got) hash_landed(j, &xx, &p, s->end, pos, pos + n);
    pos += n;
  }
  if (j->got) hash_landed(j, &xx, &p, s->end, end, end); /* empty tensors at the end */
  return KS_OK;
}

ks_status ks__copy_load(ks_reader *r, uint64_t *got, ks_error *err) {
  size_t n = r->count ? r->count : 1, n_segs = 0;
  size_t *order = ks__malloc(&r->alloc, n * sizeof *order);
  segment *segs = ks__malloc(&r->alloc, n * sizeof *segs);
  ks_status st = order && segs ? KS_OK : ks__err_at(err, KS_E_NOMEM, r->path, NULL, -1, "out of memory");
  bool parallel = ks__reader_parallel(r), local = ks_io_caps(r->io) & KS_IO_CAP_LOCAL;
  if (!st && r->count) {
    ks__fmt_order(r, order);
    /* Through a table that is not local, one segment read in as few calls as the table takes. */
    uint64_t seg_cap = parallel ? SEGMENT : UINT64_MAX;
    for (size_t p = 0; p < r->count;) {
      size_t first = p;
      uint64_t begin = r->entries[order[p]].begin;
      while (p < r->count && (p == first || r->entries[order[p]].end - begin <= seg_cap)) p++;
      segs[n_segs++] = (segment){first, p};
    }
    copy_job j = {r, order, segs, got, local ? PIECE : UINT64_MAX};
    ks__par_job job = {&j, segment_bytes, load_segment};
    st = ks__par_each(&job, n_segs, parallel ? 0 : 1, err);
  }
  ks__free(&r->alloc, order);
  ks__free(&r->alloc, segs);
  r->io->close_fn(r->io->ctx, r->fd); /* read-only: nothing a failed close could lose */
  r->fd = -1;
  return st;
}
