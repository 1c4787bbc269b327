/*
 * ks_save: atomic, durable, streaming write of a state dict.
 *
 * Every allocation happens before the temporary file exists, so running out of
 * memory never touches the disk. Tensor bytes go straight from the state dict
 * to write(); only small tensors are gathered in a staging buffer so that a
 * file of 100,000 tiny tensors does not cost 100,000 system calls. The temp
 * file, fsync and rename steps are core/durable.c, shared with the torch writer.
 *
 * Each byte is read once. The header, which precedes the data, holds every
 * tensor's checksum, but its length does not depend on their values (16 hex
 * digits each): it is written with placeholder digits, each tensor is hashed
 * piece by piece just before that piece is written (while it is in the cache),
 * and the digits are then written over the placeholders with the table's
 * pwrite_fn. A table without one (an upload that can only append) gets the
 * same bytes from a hashing pass of their own before the file is written.
 */
#include <string.h>

#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack: no allocation outside the hook */
#include <xxhash.h>

#include "core/durable.h"
#include "format/fmt_internal.h"

#define STAGE_CAP ((size_t)1 << 20)
/* A large tensor is hashed and written in pieces of this size: small enough to be
   still in the L2 cache when write() copies it, large enough that the system calls
   cost little. */
#define HASH_CHUNK ((size_t)256 << 10)

typedef struct save_ctx {
  const ks_allocator *alloc;
  ks__durable out;
  uint8_t *stage;
  size_t stage_len, stage_cap;
  size_t *sum_at; /* one pass: each tensor's checksum digits in the header (NULL: two passes) */
  ks__sbuf *hdr;
  XXH3_state_t xx;
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

/* Writes a tensor and fills in its checksum digits: a staged tensor is hashed whole
   before it is copied, a large one piece by piece before each piece is written. */
static KS_NODISCARD ks_status put_hashed(save_ctx *c, const uint8_t *p, size_t n, size_t k) {
  char *digits = c->hdr->p + c->sum_at[k];
  if (n < c->stage_cap) {
    ks__put_sum_digits(digits, ks_checksum(p, n));
    return put_data(c, p, n);
  }
  ks_status st = flush_stage(c);
  if (st) return st;
  (void)XXH3_64bits_reset(&c->xx); /* cannot fail on a valid state */
  for (size_t done = 0; done < n;) {
    size_t len = n - done < HASH_CHUNK ? n - done : HASH_CHUNK;
    (void)XXH3_64bits_update(&c->xx, p + done, len); /* cannot fail: p is not NULL */
    if ((st = ks__durable_write(&c->out, p + done, len)) != KS_OK) return st;
    done += len;
  }
  ks__put_sum_digits(digits, XXH3_64bits_digest(&c->xx));
  return KS_OK;
}

/* Writes the checksum digits over their placeholders: one write covering all of them. */
static KS_NODISCARD ks_status patch_sums(save_ctx *c, size_t tensors) {
  if (!tensors) return KS_OK;
  size_t first = c->sum_at[0], end = c->sum_at[tensors - 1] + 16;
  return ks__durable_pwrite(&c->out, c->hdr->p + first, end - first, first);
}

static KS_NODISCARD ks_status write_body(save_ctx *c, const ks_statedict *sd) {
  ks_status st = ks__durable_write(&c->out, c->hdr->p, c->hdr->len);
  size_t k = 0;
  for (size_t i = 0; !st && i < ks_statedict_count(sd); i++) {
    ks_entry e;
    if (ks_statedict_at(sd, i, &e)) continue; /* index in range: cannot fail */
    if (e.kind != KS_VAL_TENSOR) continue;
    st = c->sum_at ? put_hashed(c, e.tensor.data, e.tensor.nbytes, k++) : put_data(c, e.tensor.data, e.tensor.nbytes);
  }
  if (!st) st = flush_stage(c);
  if (!st && c->sum_at) st = patch_sums(c, k);
  return st;
}

static void cleanup(save_ctx *c) {
  ks__durable_abort(&c->out);
  ks__free(c->alloc, c->stage);
  ks__free(c->alloc, c->sum_at);
}

static size_t count_tensors(const ks_statedict *sd) {
  size_t n = 0;
  for (size_t i = 0; i < ks_statedict_count(sd); i++) {
    ks_entry e;
    if (!ks_statedict_at(sd, i, &e) && e.kind == KS_VAL_TENSOR) n++;
  }
  return n;
}

ks_status ks_save(const char *path, const ks_statedict *sd, const ks_meta *extra, const ks_save_opts *opts,
                  ks_error *err) {
  ks_error_clear(err);
  if (!path || !*path || !sd) return ks__err(err, KS_E_INVALID, "ks_save: path and state dict are required");
  KS__TAKE_OPTS(ks_save_opts, opts, KS__V1_SIZE(ks_save_opts, io), err);
  save_ctx c = {0};
  c.alloc = opts ? opts->alloc : NULL;
  ks__sbuf hdr;
  ks__sbuf_init(&hdr, c.alloc);
  c.hdr = &hdr;
  ks_status st = KS_OK;
  const ks_io *io = opts ? opts->io : NULL;
  size_t tensors = count_tensors(sd);
  /* ks_io_check first: a table that fails it is refused by prepare, whatever its members say. */
  if (tensors && ks_io_check(io, NULL) == KS_OK && ks__io_can_pwrite(io) &&
      !(c.sum_at = ks__malloc(c.alloc, tensors * sizeof *c.sum_at)))
    st = ks__err(err, KS_E_NOMEM, "out of memory");
  uint64_t data_len = 0;
  if (!st) st = ks__build_header(sd, extra, c.alloc, &hdr, &data_len, c.sum_at, err);
  if (!st) st = ks__durable_prepare(&c.out, path, io, c.alloc, err);
  c.stage_cap = data_len < STAGE_CAP ? (size_t)data_len + 1 : STAGE_CAP;
  if (!st && !(c.stage = ks__malloc(c.alloc, c.stage_cap))) st = ks__err(err, KS_E_NOMEM, "out of memory");
  if (!st) st = ks__durable_open(&c.out);
  if (!st) st = write_body(&c, sd);
  if (!st) st = ks__durable_commit(&c.out);
  if (st) ks__err_set_file(err, path);
  cleanup(&c);
  ks__sbuf_free(&hdr);
  return st;
}

ks_status ks_save_layout(const ks_statedict *sd, const ks_meta *extra, const ks_allocator *alloc, size_t *header_len,
                         uint64_t *data_len, ks_error *err) {
  if (!sd || !header_len || !data_len) return ks__err(err, KS_E_INVALID, "ks_save_layout: NULL argument");
  size_t tensors = count_tensors(sd);
  size_t *sum_at = tensors ? ks__malloc(alloc, tensors * sizeof *sum_at) : NULL; /* placeholders: no hashing */
  if (tensors && !sum_at) return ks__err(err, KS_E_NOMEM, "out of memory");
  ks__sbuf hdr;
  ks__sbuf_init(&hdr, alloc);
  ks_status st = ks__build_header(sd, extra, alloc, &hdr, data_len, sum_at, err);
  if (!st) *header_len = hdr.len;
  ks__sbuf_free(&hdr);
  ks__free(alloc, sum_at);
  return st;
}

/* Whether every tensor of sd lies at image + hlen + its offset, with the image aligned and its
   room covering the aligned end of the file. */
static bool laid_out(const ks_statedict *sd, const uint8_t *image, size_t cap, size_t hlen, uint64_t data_len) {
  if ((uintptr_t)image % KS_IMAGE_ALIGN || hlen > cap || data_len > cap - hlen) return false;
  size_t end = hlen + (size_t)data_len, tail = (KS_IMAGE_ALIGN - end % KS_IMAGE_ALIGN) % KS_IMAGE_ALIGN;
  if (tail > cap - end) return false; /* the last aligned write may read up to the aligned end */
  uint64_t off = 0;
  for (size_t i = 0; i < ks_statedict_count(sd); i++) {
    ks_entry e;
    if (ks_statedict_at(sd, i, &e) || e.kind != KS_VAL_TENSOR) continue;
    if (e.tensor.nbytes && (const uint8_t *)e.tensor.data != image + hlen + off) return false;
    off += e.tensor.nbytes;
  }
  return true;
}

/* Hashes each tensor where it lies and writes its digits over the header's placeholders. */
static void hash_in_place(const ks_statedict *sd, ks__sbuf *hdr, const size_t *sum_at) {
  for (size_t i = 0, k = 0; i < ks_statedict_count(sd); i++) {
    ks_entry e;
    if (ks_statedict_at(sd, i, &e) || e.kind != KS_VAL_TENSOR) continue;
    ks__put_sum_digits(hdr->p + sum_at[k++], ks_checksum(e.tensor.data, e.tensor.nbytes));
  }
}

ks_status ks_save_image(const char *path, const ks_statedict *sd, const ks_meta *extra, const ks_save_opts *opts,
                        void *image, size_t image_cap, ks_error *err) {
  ks_error_clear(err);
  if (!path || !*path || !sd || !image)
    return ks__err(err, KS_E_INVALID, "ks_save_image: path, state dict and image are required");
  KS__TAKE_OPTS(ks_save_opts, opts, KS__V1_SIZE(ks_save_opts, io), err);
  save_ctx c = {0};
  c.alloc = opts ? opts->alloc : NULL;
  ks__sbuf hdr;
  ks__sbuf_init(&hdr, c.alloc);
  size_t tensors = count_tensors(sd);
  uint64_t data_len = 0;
  ks_status st = KS_OK;
  if (tensors && !(c.sum_at = ks__malloc(c.alloc, tensors * sizeof *c.sum_at)))
    st = ks__err(err, KS_E_NOMEM, "out of memory");
  if (!st) st = ks__build_header(sd, extra, c.alloc, &hdr, &data_len, c.sum_at, err);
  if (!st && !laid_out(sd, image, image_cap, hdr.len, data_len)) {
    cleanup(&c);
    ks__sbuf_free(&hdr);
    return ks_save(path, sd, extra, opts, err);
  }
  if (!st) {
    hash_in_place(sd, &hdr, c.sum_at);
    memcpy(image, hdr.p, hdr.len);
    st = ks__durable_prepare(&c.out, path, opts ? opts->io : NULL, c.alloc, err);
  }
  if (!st) st = ks__durable_open(&c.out);
  if (!st) st = ks__durable_write_image(&c.out, image, hdr.len + (size_t)data_len);
  if (!st) st = ks__durable_commit(&c.out);
  if (st) ks__err_set_file(err, path);
  cleanup(&c);
  ks__sbuf_free(&hdr);
  return st;
}
