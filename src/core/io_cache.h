/*
 * Internals of the caching table (io_cache.c: the table and its handles;
 * io_cache_piece.c: the piece files). Not installed.
 *
 * A piece file cache_dir/<XXH3 of path>-<size>[-<XXH3 of validator>]/<off>-<len> (16 hex digits
 * each) holds
 *   "KSCACHE1" | file size | off | len | XXH3-64 of the bytes | identity length  (u64 LE each)
 *   | the identity | the len bytes of the file at off,
 * where the identity is the path, followed by a NUL and the validator when the inner table gave one
 * (validator_fn: an ETag, else a Last-Modified), so a piece of one version of an object is never
 * taken for another's. It is trusted only when its length, every header field and the hash match.
 *
 * A read is planned as a run of parts, each served by a piece or read from
 * inner (a gap, kept as a new piece); the pieces of a handle are kept sorted
 * by offset so the plan is one pass from a binary search (see ks__cache_lookup).
 */
#ifndef KS_CORE_IO_CACHE_H
#define KS_CORE_IO_CACHE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "core/hindex.h"
#include "core/internal.h"
#include "core/io_ops.h"
#include "keepsake/io_cache.h"

typedef struct ks__cache_piece {
  uint64_t off, len;
  bool verified; /* its hash was checked through this handle */
} ks__cache_piece;

typedef struct ks__cache_slot {
  bool used, reading, listed;
  int fd;     /* the inner table's handle */
  char *path; /* reading: the path opened */
  char *dir;  /* reading: the folder of its pieces */
  char *ident; /* reading: what its pieces must carry: the path, and NUL and the validator when there is one */
  size_t ident_len;
  uint64_t size;
  ks__cache_piece *pieces; /* sorted by offset, then length; no two alike */
  size_t n_pieces, cap_pieces;
  uint64_t max_len; /* no piece is longer: where a scan for pieces covering an offset can start */
} ks__cache_slot;

typedef struct ks__cache {
  ks_io io; /* first: the table handed out; ctx points here */
  ks_allocator alloc;
  const ks_io *inner;   /* the table wrapped (validator_fn, detail_fn, locks) */
  const ks_io *v1, *v2; /* inner's tables of each version's operations */
  char *dir;
  pthread_mutex_t lock; /* guards the slots and their pieces */
  ks__cache_slot *slots;
  size_t n_slots, cap_slots;
  atomic_uint_least64_t hit_reads, hit_bytes, miss_reads, miss_bytes, stored, store_failures, rejected;
} ks__cache;

/* Most parts (pieces and gaps) one read is assembled from; a read that would
   need more is read whole from inner, so a cache of tiny pieces costs one
   round trip per read, not one per piece. Bounds the plan's size on the stack. */
#define KS__CACHE_MAX_PARTS 64
/* The longest validator kept (an ETag is at most a few dozen bytes); a longer one is not used. */
#define KS__CACHE_VALIDATOR_MAX 256

/* [off, off + len) of the file: out of `piece` when cached, else from inner. */
typedef struct ks__cache_part {
  uint64_t off;
  size_t len;
  bool cached;
  ks__cache_piece piece;
} ks__cache_part;

/* One read, as planned under the lock. */
typedef struct ks__cache_read {
  int h, fd;
  const char *path, *dir; /* the slot's: stable while the handle is open */
  const char *ident;      /* the slot's identity (path, NUL, validator) and its length */
  size_t ident_len;
  uint64_t size, off;
  size_t want; /* bytes to return: n cut at the end of the file */
  size_t n_parts; /* in order, adjacent, covering [off, off + want) */
  ks__cache_part parts[KS__CACHE_MAX_PARTS];
} ks__cache_read;

/* Plans a read of n bytes at off through handle h; EBADF when h is not open for reading. */
int ks__cache_lookup(ks__cache *c, int h, size_t n, uint64_t off, ks__cache_read *q);
/* Copies a cached part out of its piece into buf; 0, or -1 after deleting a bad piece. */
int ks__cache_serve(ks__cache *c, const ks__cache_read *q, const ks__cache_part *p, void *buf);
/* Keeps buf (part p of the read, read from inner) as a new piece; failures are only counted. */
void ks__cache_store(ks__cache *c, const ks__cache_read *q, const ks__cache_part *p, const void *buf);
/* Deletes every piece of `path` (removed or replaced in the inner table). */
void ks__cache_forget(ks__cache *c, const char *path);
/* Deletes the pieces of every other version of `path` than the folder `keep` (a name in the cache
 * directory): an object replaced on the server leaves the old version's pieces behind. */
void ks__cache_forget_others(ks__cache *c, const char *path, const char *keep);

#endif
