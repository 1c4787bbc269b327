/*
 * ks_save: atomic, durable, streaming write of a state dict.
 *
 * Every allocation happens before the temporary file exists, so running out of
 * memory never touches the disk. Tensor bytes go straight from the state dict
 * to write(); only small tensors are gathered in a staging buffer so that a
 * file of 100,000 tiny tensors does not cost 100,000 system calls. The temp
 * file, fsync and rename steps are core/durable.c, shared with the torch writer.
 */
#include <string.h>

#include "core/durable.h"
#include "format/fmt_internal.h"

#define STAGE_CAP ((size_t)1 << 20)

typedef struct save_ctx {
  const ks_allocator *alloc;
  ks__durable out;
  uint8_t *stage;
  size_t stage_len, stage_cap;
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

static KS_NODISCARD ks_status write_body(save_ctx *c, const ks__sbuf *hdr, const ks_statedict *sd) {
  ks_status st = ks__durable_write(&c->out, hdr->p, hdr->len);
  for (size_t i = 0; !st && i < ks_statedict_count(sd); i++) {
    ks_entry e;
    if (ks_statedict_at(sd, i, &e)) continue; /* index in range: cannot fail */
    if (e.kind == KS_VAL_TENSOR) st = put_data(c, e.tensor.data, e.tensor.nbytes);
  }
  return st ? st : flush_stage(c);
}

static void cleanup(save_ctx *c) {
  ks__durable_abort(&c->out);
  ks__free(c->alloc, c->stage);
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
  uint64_t data_len = 0;
  ks_status st = ks__build_header(sd, extra, c.alloc, &hdr, &data_len, err);
  if (!st) st = ks__durable_prepare(&c.out, path, opts ? opts->io : NULL, c.alloc, err);
  c.stage_cap = data_len < STAGE_CAP ? (size_t)data_len + 1 : STAGE_CAP;
  if (!st && !(c.stage = ks__malloc(c.alloc, c.stage_cap))) st = ks__err(err, KS_E_NOMEM, "out of memory");
  if (!st) st = ks__durable_open(&c.out);
  if (!st) st = write_body(&c, &hdr, sd);
  if (!st) st = ks__durable_commit(&c.out);
  if (st) ks__err_set_file(err, path);
  cleanup(&c);
  ks__sbuf_free(&hdr);
  return st;
}
