/* ks_load: a whole file as a state dict whose tensors are views kept alive by the dict. */
#include "format/fmt_internal.h"

static void release_reader(void *r) { ks_reader_free(r); }

static KS_NODISCARD ks_status fill_dict(ks_reader *r, ks_statedict *sd, ks_error *err) {
  for (size_t i = 0; i < r->count; i++) {
    const char *name;
    ks_tensor view;
    ks_status st = ks_reader_tensor_at(r, i, &name, &view); /* in memory: cannot fail */
    if (!st) st = ks_statedict_set_tensor(sd, name, &view, KS_MAPPED_VIEW, err);
    if (st)
      return ks__err_at(err, st, r->path, name, (int64_t)(r->data_off + r->entries[i].begin),
                        "cannot add tensor to the state dict: %s", ks_strerror(st));
  }
  return ks_reader_scalars(r, sd, err);
}

static KS_NODISCARD ks_status load_reader(ks_reader *r, ks_statedict **out, ks_meta **meta, ks_error *err) {
  ks_statedict *sd = NULL;
  ks_meta *m = NULL;
  ks_status st = r->lazy ? ks__lazy_load_all(r, err) : KS_OK; /* parallel ranged reads, verified on arrival */
  if (!st) st = ks_statedict_create(&r->alloc, &sd, err);
  if (!st) st = fill_dict(r, sd, err);
  if (!st && meta && !(st = ks_meta_create(&r->alloc, &m, err))) st = ks__meta_copy(m, r->meta, err);
  if (!st) st = ks__statedict_attach(sd, r, release_reader, err);
  if (st) {
    if (st == KS_E_NOMEM) ks__err_at(err, st, r->path, NULL, -1, "out of memory loading the file");
    ks_statedict_free(sd);
    ks_meta_free(m);
    ks_reader_free(r);
    return st;
  }
  *out = sd;
  if (meta) *meta = m;
  return KS_OK;
}

/* Lazy mode verifies each tensor as the load brings it: open must not read it all first. */
static KS_NODISCARD ks_status open_for_load(const char *path, const ks_read_opts *opts, ks_reader **r,
                                            bool *verify_after, ks_error *err) {
  ks_read_opts o = *opts;
  *verify_after = o.mode == KS_READ_LAZY && o.verify_checksums;
  if (*verify_after) o.verify_checksums = 0;
  return ks_reader_open(path, &o, r, err);
}

ks_status ks_load(const char *path, const ks_read_opts *opts, ks_statedict **sd, ks_meta **meta, ks_error *err) {
  if (!sd) return ks__err(err, KS_E_INVALID, "ks_load: sd is required");
  ks_error_clear(err);
  KS__TAKE_OPTS(ks_read_opts, opts, KS__V1_SIZE(ks_read_opts, verify_checksums), err);
  ks_reader *r;
  bool verify_after;
  ks_status st = open_for_load(path, opts, &r, &verify_after, err);
  if (!st && verify_after) {
    /* tensors verified on arrival; the checksum and scalar tables then from memory, nothing read twice */
    if (!(st = ks__lazy_load_all(r, err))) st = ks_reader_verify(r, NULL, NULL, err);
    if (st) ks_reader_free(r);
  }
  return st ? st : load_reader(r, sd, meta, err);
}

ks_status ks_load_buffer(const void *buf, size_t len, const ks_read_opts *opts, ks_statedict **sd,
                         ks_meta **meta, ks_error *err) {
  if (!sd) return ks__err(err, KS_E_INVALID, "ks_load_buffer: sd is required");
  ks_reader *r;
  ks_status st = ks_reader_open_buffer(buf, len, opts, &r, err);
  return st ? st : load_reader(r, sd, meta, err);
}
