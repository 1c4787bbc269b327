/*
 * Internals of the format module: the reader's layout, a growable byte buffer
 * with JSON escaping, scalar encoding and the header parser. Not installed.
 */
#ifndef KS_FORMAT_INTERNAL_H
#define KS_FORMAT_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/hindex.h"
#include "core/internal.h"
#include "core/json.h"
#include "keepsake/binding.h"
#include "core/xxh.h"
#include "keepsake/format.h"

/* One tensor of an open file; offsets are relative to the data section. */
typedef struct fmt_entry {
  const char *name; /* into the reader's name arena */
  size_t name_off;  /* the same, as an offset while the arena grows */
  size_t name_len;
  uint64_t hash;
  ks_dtype dtype;
  int rank;
  int64_t shape[KS_MAX_RANK];
  uint64_t begin, end;
} fmt_entry;

struct ks_reader {
  ks_allocator alloc;
  char *path;
  const uint8_t *bytes; /* whole file: the mapping, the copy or the caller's buffer */
  size_t size;
  const void *map; /* non-NULL when bytes is a mapping of map_len bytes by io */
  size_t map_len;
  const ks_io *io; /* the table that opened the file (never NULL for a file) */
  uint8_t *copy; /* non-NULL when bytes is owned heap memory */
  uint64_t header_len;
  uint64_t data_off; /* 8 + header_len */
  fmt_entry *entries;
  size_t count;
  char *names; /* arena of NUL-terminated names */
  ks__hindex index; /* entries by name */
  ks_meta *meta;
  int version; /* keepsake format version, 0 for plain safetensors */
  /* KS_READ_LAZY (lazy.c): `bytes` (= copy) holds only the first `have` bytes of the
     file (the length, the header, maybe more); tensor bytes come through io->read_fn. */
  bool lazy;
  int fd;                          /* lazy: the open handle, closed by ks_reader_free */
  size_t have;                     /* lazy: bytes of the file's start held in copy */
  uint8_t *data;                   /* lazy, after a full load: the whole data section */
  _Atomic(uint8_t *) *fetched;     /* lazy: per tensor, its verified bytes once fetched */
  uint64_t *sums;                  /* lazy keepsake file: the checksum table by tensor index */
  uint8_t *has_sum;
  ks_status sums_status;           /* lazy: KS_OK, or why the checksum table cannot be used */
  ks_error sums_err;
};

/* Lazy mode (lazy.c). Reads the length and the header through io (one or two reads)
   into r->copy, keeping fd open; ks__fmt_parse then validates as in the other modes. */
KS_NODISCARD ks_status ks__lazy_open(ks_reader *r, int fd, uint64_t size, ks_error *err);
/* After a successful parse: the per-tensor slots and the checksum table. */
KS_NODISCARD ks_status ks__lazy_prepare(ks_reader *r, ks_error *err);
/* Frees what lazy mode added to r (closes the handle). */
void ks__lazy_free(ks_reader *r);
/* Tensor i's bytes (fetched and verified on first use in lazy mode). */
KS_NODISCARD ks_status ks__reader_bytes(const ks_reader *r, size_t i, const uint8_t **p, ks_error *err);
/* Lazy verification reads the file forward through a window of at least 8 MiB, so
   checking many small tensors costs few reads. */
typedef struct ks__lazy_window {
  uint8_t *buf;
  uint64_t off; /* absolute offset of buf[0] */
  size_t len, cap;
} ks__lazy_window;
/* Tensor i's bytes, from the window (refilled from the tensor's first byte when it lacks them). */
KS_NODISCARD ks_status ks__lazy_window_get(const ks_reader *r, ks__lazy_window *w, size_t i, const uint8_t **p,
                                           ks_error *err);
void ks__lazy_window_free(const ks_reader *r, ks__lazy_window *w);
/* Lazy mode: reads the whole data section into r->data with a few threads issuing
   large ranged reads concurrently, verifying each tensor's checksum as it arrives. */
KS_NODISCARD ks_status ks__lazy_load_all(ks_reader *r, ks_error *err);
/* The tensor indices of r in the order of their bytes in the file (count of them into order). */
void ks__fmt_order(const ks_reader *r, size_t *order);
/* KS_READ_COPY after the header is parsed (copy_load.c): reads the data section into r->copy
   from the open handle r->fd, on a few threads where ks__reader_parallel allows, in pieces, each
   tensor hashed into got[i] (when got is not NULL) as its bytes land; closes the handle. */
KS_NODISCARD ks_status ks__copy_load(ks_reader *r, uint64_t *got, ks_error *err);
/* Parses the checksum table into want/have (count entries each); the first problem. */
KS_NODISCARD ks_status ks__fmt_sums(const ks_reader *r, uint64_t *want, uint8_t *have, ks_error *err);
/* KS_E_CHECKSUM (or KS_E_FORMAT when the table lacks it) unless tensor i's bytes p hash to
   its stored checksum; KS_OK for plain safetensors files. Lazy readers only. */
KS_NODISCARD ks_status ks__lazy_check(const ks_reader *r, size_t i, const uint8_t *p, ks_error *err);
/* The same with the hash of the bytes already computed. */
KS_NODISCARD ks_status ks__lazy_check_hash(const ks_reader *r, size_t i, uint64_t got, ks_error *err);

/* Work on many items (tensors) on a few threads (par.c): fn(ctx, k, err) for every k in [0, n),
   in runs of about equal bytes(ctx, k), one run per thread: up to `threads` (0: one per CPU this
   process may use), at most 4, and one when the bytes are fewer than 32 MiB in all. A thread that
   cannot start leaves its run to the caller. Items after the first failure may be skipped; the
   failure of the lowest k is returned (its error in err). */
typedef struct ks__par_job {
  void *ctx;
  uint64_t (*bytes)(void *ctx, size_t k);
  ks_status (*fn)(void *ctx, size_t k, ks_error *err);
} ks__par_job;
KS_NODISCARD ks_status ks__par_each(const ks__par_job *job, size_t n, unsigned threads, ks_error *err);

/* Reads n bytes at absolute offset off of the reader's open handle (r->fd) into buf through the
   table, adding them to xx (when not NULL): from a local file in pieces, each hashed as soon as it
   lands, while it is in the cache; through other tables in as few reads as they allow.
   KS_E_IO naming the offset when a read fails or the file ends first. Safe on several threads at
   once (a table that allows it: see ks__reader_parallel). */
KS_NODISCARD ks_status ks__reader_read(const ks_reader *r, uint64_t off, void *buf, size_t n, ks__xxh3_state *xx,
                                       ks_error *err);
/* Whether the reader's table may be read from several threads at once: a local one (its read_fn
   is pread), or any in lazy mode, which format.h asks of such tables. */
bool ks__reader_parallel(const ks_reader *r);
/* Verification (verify.c) of tensors [from, to) with their hashes already computed (tensor i's at
   got[i - from]; NULL: hashed here): the same checks, order and errors as ks_reader_verify. */
KS_NODISCARD ks_status ks__reader_verify_with(const ks_reader *r, size_t from, size_t to, const uint64_t *got,
                                              bool scalars, ks_error *err);

/* Index of the tensor named name[0..n), or -1. */
long ks__reader_find_n(const ks_reader *r, const char *name, size_t n);

/* The callbacks of the reader's name index (layout.c). */
extern const ks__hindex_ops ks__fmt_entry_ops;

/* Steps of opening a file, in order (header.c), then the layout checks (layout.c). */
KS_NODISCARD ks_status ks__fmt_read_prefix(ks_reader *r, ks_error *err);
KS_NODISCARD ks_status ks__fmt_check_utf8(const ks_reader *r, ks_error *err);
KS_NODISCARD ks_status ks__fmt_read_header(ks_reader *r, ks_error *err);
/* Parses and validates the header and layout of r->bytes; fills the reader. */
KS_NODISCARD ks_status ks__fmt_parse(ks_reader *r, ks_error *err);
/* Absolute byte offset of the first `"name"` in the header, or 8 when not found. */
int64_t ks__fmt_key_offset(const ks_reader *r, const char *name);

/* True when the map holds key[0..klen). */
bool ks__meta_has(const ks_meta *m, const char *key, size_t klen);
/* Copies every pair of src into dst (insert or replace). @return KS_OK, KS_E_INVALID or KS_E_NOMEM (dst may
 * then hold some of the pairs). */
KS_NODISCARD ks_status ks__meta_copy(ks_meta *dst, const ks_meta *src, ks_error *err);
/* Checks tensor i against its stored checksum (ks_reader_verify does every tensor).
 * @return KS_OK (also for plain safetensors files), KS_E_CHECKSUM, KS_E_FORMAT, KS_E_NOTFOUND, KS_E_NOMEM. */
KS_NODISCARD ks_status ks__reader_verify_tensor(const ks_reader *r, size_t i, ks_error *err);
/* Tensor i checked against its stored checksum without being kept anywhere: a lazy reader reads it
   piece by piece into one small scratch piece and hashes it there (lazy.c); a reader holding the
   file hashes it where it is. Safe on several threads at once. Same returns as above, plus KS_E_IO. */
KS_NODISCARD ks_status ks__reader_check(const ks_reader *r, size_t i, ks_error *err);
/* Appends a pair without looking for an existing key (the caller knows it is new). */
KS_NODISCARD ks_status ks__meta_append(ks_meta *m, const char *key, size_t klen, const char *value, size_t vlen);

/* Encodes the scalar entries of sd as the JSON object stored under "keepsake.scalars". */
KS_NODISCARD ks_status ks__scalars_encode(const ks_statedict *sd, ks__sbuf *out, ks_error *err);
/* Decodes a "keepsake.scalars" value into dst; `file` names the source in errors. */
KS_NODISCARD ks_status ks__scalars_decode(const char *json, const char *file, int64_t offset, ks_statedict *dst,
                             ks_error *err);

/* Builds the 8-byte length prefix, JSON header and padding of a file holding sd;
   *data_len receives the size of the data section that must follow. sum_at NULL:
   every tensor is hashed here. Else it has one slot per tensor (in order) and
   receives the offset in h of that tensor's 16 checksum digits, written as
   placeholders for the caller to fill in (ks__put_sum_digits); the header's
   length is the same either way. */
KS_NODISCARD ks_status ks__build_header(const ks_statedict *sd, const ks_meta *extra, const ks_allocator *a,
                                        ks__sbuf *h, uint64_t *data_len, size_t *sum_at, ks_error *err);
/* How ks_save may spread its work (writer.c); ks_save passes NULL: every field 0. */
typedef struct ks__save_tuning {
  unsigned threads; /* 0: a second thread where a second CPU is there to run it; 1: the caller's alone */
  int direct;       /* 0: direct writes where they pay (below); < 0: never; > 0: whenever the table allows */
  size_t lead;      /* buffered pipeline: how far the hashing thread may run ahead of the writes (0: default) */
  int baseline_hash; /* one thread only: XXH3 as compiled for the baseline CPU (SSE2 on x86-64), not the
                        widest vector code: with {1, -1}, the writer as it was before either change */
} ks__save_tuning;
/* ks_save with tuning (NULL: the defaults). {threads = 1, direct = -1, baseline_hash = 1} is the writer
   ks_save was before it used a second thread, direct writes or the CPU's widest vector code for
   XXH3: the benchmarks compare the two, and the tests check that they write the same bytes. */
KS_NODISCARD ks_status ks__save_tuned(const char *path, const ks_statedict *sd, const ks_meta *extra,
                                      const ks_save_opts *opts, const ks__save_tuning *tuning, ks_error *err);
/* Writes v as the 16 lowercase hex digits a checksum is stored as (no terminator). */
void ks__put_sum_digits(char *dst, uint64_t v);

#endif
