/*
 * The threads of a save (writer.c): a hashing thread that keeps a few MiB ahead of the caller's
 * buffered writes, and a ring of aligned buffers that a thread fills with the file's image
 * (hashing it as it copies) while the caller writes them with direct I/O. Not installed.
 */
#ifndef KS_FORMAT_SAVE_PIPE_H
#define KS_FORMAT_SAVE_PIPE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/durable.h"
#include "core/xxh.h"
#include "format/fmt_internal.h"

/* One tensor of the file: its bytes and where they start in the data section. */
typedef struct ks__save_span {
  const uint8_t *p;
  size_t n;
  uint64_t off;
} ks__save_span;

/* The tensors of a save, in file order, with their checksums (filled in as they are hashed) and
   where each one's 16 digits go in the header (ks__build_header's sum_at). */
typedef struct ks__save_job {
  ks__save_span *spans;
  uint64_t *sums;
  size_t *sum_at;
  size_t n;
} ks__save_job;

/* The tensors of sd (KS_E_NOMEM; nothing allocated for none). Free with ks__save_job_free. */
KS_NODISCARD ks_status ks__save_job_make(ks__save_job *j, const ks_statedict *sd, const ks_allocator *a,
                                         ks_error *err);
void ks__save_job_free(ks__save_job *j, const ks_allocator *a);

/* A tensor is hashed in pieces of this size: small enough to stay in the L2 cache until the
   bytes are used again (written, or copied by the other thread), large enough that the calls
   cost little. */
#define KS__HASH_PIECE ((size_t)256 << 10)
/* Buffered writes with a hashing thread: the caller writes a large tensor in pieces of this size
   and says after each how far it got. */
#define KS__WRITE_PIECE ((size_t)1 << 20)
/* How far ahead of the writes the hashing thread may run by default: the bytes it hashed are
   still in the shared cache when write() copies them. */
#define KS__HASH_LEAD ((uint64_t)4 << 20)

/* The hashing thread: every tensor of the job is hashed into job->sums, each by whichever of the
   two threads claims it first. */
typedef struct ks__save_hasher {
  ks__save_job *job;
  uint64_t lead;       /* 0: no bound */
  atomic_size_t next;  /* the next tensor to claim */
  atomic_uint_least64_t written; /* data bytes the caller has written so far */
  atomic_bool done, stop, waiting;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pthread_t tid;
  bool started;
} ks__save_hasher;

/* Starts hashing the job on a second thread (when `thread` and one starts), never more than
   `lead` bytes past what the caller said it wrote (0: as fast as it can). Never fails: without a
   thread, ks__save_hasher_finish hashes everything. */
void ks__save_hasher_start(ks__save_hasher *h, ks__save_job *job, uint64_t lead, bool thread);
/* The caller has written the data section's bytes [0, end). */
void ks__save_hasher_wrote(ks__save_hasher *h, uint64_t end);
/* Joins the thread. `hash_rest`: the caller first hashes every tensor the thread has not claimed,
   so every checksum is in job->sums; else the thread stops at its next piece (a failed write). */
void ks__save_hasher_finish(ks__save_hasher *h, bool hash_rest);

/* Direct writes: the file's image goes through KS__RING_BUFS buffers of KS__RING_CHUNK bytes,
   KS__DIRECT_ALIGN-aligned, in a KS__RING_BYTES allocation. */
#define KS__RING_CHUNK ((size_t)4 << 20)
#define KS__RING_BUFS ((size_t)4)
#define KS__RING_BYTES (KS__RING_CHUNK * KS__RING_BUFS + KS__DIRECT_ALIGN)
/* Data bytes in the first chunk beside the header: the disk starts once these are copied. */
#define KS__RING_FIRST_DATA ((size_t)256 << 10)

/* The whole blocks that hold a header of hlen bytes (what the ring keeps a copy of). */
static inline size_t ks__ring_head_len(size_t hlen) {
  return (hlen + KS__DIRECT_ALIGN - 1) / KS__DIRECT_ALIGN * KS__DIRECT_ALIGN;
}
/* The allocation a ring for a header of hlen bytes needs. */
static inline size_t ks__ring_bytes(size_t hlen) { return KS__RING_BYTES + ks__ring_head_len(hlen); }

typedef struct ks__save_ring {
  ks__save_job *job;
  const char *hdr; /* the header (placeholder digits), hlen bytes: the image's start */
  size_t hlen;
  uint8_t *buf;    /* KS__RING_BUFS chunks */
  uint8_t *head;   /* head_len bytes after them: the image's first blocks, kept until the digits are known */
  size_t head_len;
  bool head_written; /* the head went to the file with the checksums' digits in it */
  uint64_t total;  /* bytes of the file */
  size_t first;    /* chunk 0's length: the disk starts early; the rest end on the 4 MiB grid */
  size_t chunks;
  /* Under mu: chunks filled; chunks before `taken` all written (their buffers free again);
     which of the next KS__RING_BUFS are written too; the next chunk a writer claims. */
  size_t filled, taken, next;
  unsigned written;
  bool direct;     /* the writers write with direct I/O (until a file system refuses) */
  int rc;          /* the first failed write's errno */
  ks_status st;    /* a failure already reported (ending direct writes) */
  ks__durable *out;
  bool stop;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  size_t k, in; /* the filler's place: tensor k, byte `in` of it */
  ks__xxh3_state xx;
} ks__save_ring;

/* A ring for the job's file (header hdr of hlen bytes) in mem, a ks__ring_bytes(hlen) allocation. */
void ks__save_ring_init(ks__save_ring *r, ks__save_job *job, const char *hdr, size_t hlen, uint8_t *mem);
/* Writes the whole file to out, which has direct writes on (ks__durable_direct_begin), chunk by
   chunk at each one's offset. With `thread`: a second thread fills the chunks (hashing their
   tensors into job->sums) while the caller and a third thread write the two before it, so two
   writes are in flight (the file given its size first, ks__durable_reserve, so that the file
   system runs them at once); without, or when no thread starts, the caller fills and writes each
   in turn. A file system that refuses a direct write gets that chunk and the rest through the
   page cache. Once every
   checksum is known and the file's whole blocks are written, the head blocks are written again
   at offset 0 with the digits in place, directly (head_written); where they cannot be, the
   caller patches the digits (ks__durable_pwrite). */
KS_NODISCARD ks_status ks__save_ring_run(ks__save_ring *r, ks__durable *out, bool thread);

#endif
