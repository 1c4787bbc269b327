/* Destinations for the torch writer: memory, or a file replaced atomically and durably. */
#include <string.h>

#include "core/durable.h"
#include "torch/torch_internal.h"

typedef struct membuf {
  const ks_allocator *a;
  uint8_t *p;
  size_t n, cap;
} membuf;

static KS_NODISCARD ks_status mem_write(void *ctx, const void *p, size_t n) {
  membuf *m = ctx;
  size_t need;
  if (!ks__add_size(m->n, n, &need)) return KS_E_LIMIT;
  ks_status s = ks__grow(m->a, &m->p, &m->cap, need, 1);
  if (s) return s;
  memcpy(m->p + m->n, p, n);
  m->n += n;
  return KS_OK;
}

static KS_NODISCARD ks_status save_buffer(const ks_statedict *sd, const ks_torch_write_opts *opts, int force_zip64,
                                          void **out, size_t *out_len, ks_error *err) {
  if (!sd || !out || !out_len) return ks__err(err, KS_E_INVALID, "torch: NULL argument");
  ks_error_clear(err);
  KS__TAKE_OPTS(ks_torch_write_opts, opts, KS__V1_SIZE(ks_torch_write_opts, io), err);
  membuf m = {ks__alloc_or_default(opts->alloc), NULL, 0, 0};
  ks_status st = ks__pt_write(sd, opts, force_zip64, mem_write, &m, err);
  if (st) {
    ks__free(m.a, m.p);
    return st;
  }
  *out = m.p;
  *out_len = m.n;
  return KS_OK;
}

ks_status ks_torch_save_buffer(const ks_statedict *sd, const ks_torch_write_opts *opts, void **out, size_t *out_len,
                               ks_error *err) {
  return save_buffer(sd, opts, 0, out, out_len, err);
}

ks_status ks__torch_save_buffer_zip64(const ks_statedict *sd, const ks_torch_write_opts *opts, void **out,
                                      size_t *out_len, ks_error *err) {
  return save_buffer(sd, opts, 1, out, out_len, err);
}

/* The archive goes straight into the temporary file. I/O errors are kept apart so
 * that their message (which step, which file, errno) survives the zip writer's. */
typedef struct file_sink {
  ks__durable out;
  ks_error io_err;
} file_sink;

static KS_NODISCARD ks_status file_write(void *ctx, const void *p, size_t n) {
  file_sink *f = ctx;
  return ks__durable_write(&f->out, p, n);
}

ks_status ks_torch_save(const char *path, const ks_statedict *sd, const ks_torch_write_opts *opts, ks_error *err) {
  if (!path || !sd) return ks__err(err, KS_E_INVALID, "torch: NULL argument");
  ks_error_clear(err);
  KS__TAKE_OPTS(ks_torch_write_opts, opts, KS__V1_SIZE(ks_torch_write_opts, io), err);
  file_sink f;
  ks_error_clear(&f.io_err);
  ks_status st = ks__durable_prepare(&f.out, path, opts ? opts->io : NULL, opts ? opts->alloc : NULL, &f.io_err);
  if (!st) st = ks__durable_open(&f.out);
  if (!st) st = ks__pt_write(sd, opts, 0, file_write, &f, err);
  if (!st) st = ks__durable_commit(&f.out);
  ks__durable_abort(&f.out);
  if (st && f.io_err.code && err) *err = f.io_err;
  if (st) ks__err_set_file(err, path);
  return st;
}
