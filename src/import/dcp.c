/*
 * torch.distributed.checkpoint import: the flat dict of ks_torch_dcp_load
 * (torch module) with the metadata a keepsake file keeps beside it: the
 * structure document (lists and typed keys, for a .pt export) and what was read
 * from the directory (KS_META_DCP_IMPORT, with the objects left out).
 */
#include "core/internal.h"
#include "keepsake/import.h"
#include "keepsake/layout.h"

ks_status ks_dcp_import(const char *dir, const ks_import_opts *opts, ks_statedict **out, ks_meta **meta,
                        ks_error *err) {
  if (!dir || !out) return ks__err(err, KS_E_INVALID, "dcp: NULL argument");
  const ks_torch_read_opts *ro = opts ? opts->read : NULL;
  const ks_allocator *a = ro ? ro->alloc : NULL;
  ks_statedict *sd = NULL;
  ks_meta *m = NULL;
  char *structure = NULL, *info = NULL;
  ks_status st = ks_torch_dcp_load(dir, ro, &sd, &structure, &info, err);
  if (!st && meta && (st = ks_meta_create(a, &m, err)) == KS_OK && (st = ks_meta_set(m, KS_TORCH_STRUCTURE_META,
                                                                                    structure, err)) == KS_OK)
    st = ks_meta_set(m, KS_META_DCP_IMPORT, info, err);
  if (st == KS_E_NOMEM) ks__err(err, st, "dcp: out of memory describing the import");
  ks_torch_free(a, structure);
  ks_torch_free(a, info);
  if (st) {
    ks_meta_free(m);
    ks_statedict_free(sd);
    return st;
  }
  *out = sd;
  if (meta) *meta = m;
  return KS_OK;
}
