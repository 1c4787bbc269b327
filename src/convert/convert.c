/*
 * ks_convert: one checkpoint file to another (convert.h), the whole of
 * `keepsake convert` and of the Python package's convert(). Reads the input
 * once into memory, checks its integrity (or, salvaging, reports each problem
 * and reads again without the checks), imports torch / Composer files
 * (import), leaves out ignored entries, and writes keepsake (format) or .pt
 * (torch), with list states as lists (lists.c).
 */
#include <stdio.h>
#include <string.h>

#include "convert/convert_internal.h"
#include "core/fmap.h"
#include "core/io_ops.h"
#include "keepsake/import.h"
#include "keepsake/layout.h"
#include "keepsake/torch.h"

#define DEFAULT_METRIC_SLACK ((uint64_t)64 << 20)

typedef struct conv {
  const ks_allocator *a;
  const ks_convert_opts *o;
  const char *in, *out;
  ks_convert_report *rep;
  ks_error *err;
  ks__fmap input;
  ks_statedict *sd; /* everything read */
  ks_meta *meta;    /* metadata to write beside it */
} conv;

static KS_NODISCARD ks_status import_torch(conv *c, int verify_crc) {
  ks_torch_read_opts ro = {0};
  ro.alloc = c->a;
  ro.verify_crc = verify_crc;
  ro.data = c->input.bytes;
  ro.data_len = c->input.size;
  ks_import_opts io = {.read = &ro, .max_metric_bytes = c->o->max_metric_bytes};
  ks_status st = ks_torch_import(NULL, &io, &c->sd, &c->meta, c->err);
  if (st) ks__err_set_file(c->err, c->in);
  return st;
}

static KS_NODISCARD ks_status read_torch(conv *c) {
  ks_status st = import_torch(c, 1);
  if (st != KS_E_CHECKSUM || !c->o->salvage) return st;
  ks__convert_warn(c->rep, c->err, c->in); /* reported, then read again without the CRC checks */
  return import_torch(c, 0);
}

/* A torch.distributed.checkpoint directory (a folder holding `.metadata`), read item by item. */
static KS_NODISCARD ks_status import_dcp(conv *c, int verify_crc) {
  ks_torch_read_opts ro = {0};
  ro.alloc = c->a;
  ro.verify_crc = verify_crc;
  ro.io = c->o->in_io;
  ks_import_opts io = {.read = &ro, .max_metric_bytes = c->o->max_metric_bytes};
  return ks_dcp_import(c->in, &io, &c->sd, &c->meta, c->err);
}

static KS_NODISCARD ks_status read_dcp(conv *c) {
  ks_status st = import_dcp(c, 1);
  if (st != KS_E_CHECKSUM || !c->o->salvage) return st;
  ks__convert_warn(c->rep, c->err, c->in); /* reported, then read again without the CRC checks */
  return import_dcp(c, 0);
}

static int on_problem(void *ctx, const ks_error *problem) {
  conv *c = ctx;
  ks__convert_warn(c->rep, problem, c->in);
  return 0;
}

/* The caller's metadata pairs of a keepsake/safetensors input; the writer owns its own keys. */
static KS_NODISCARD ks_status keep_meta(const ks_meta *meta, ks_meta *extra) {
  static const char *const own[] = {KS_META_FORMAT, KS_META_FORMAT_VERSION, KS_META_WRITER, KS_META_SCALARS,
                                    KS_META_CHECKSUMS};
  const char *k, *v;
  ks_status st = KS_OK;
  for (size_t i = 0; !st && meta && ks_meta_at(meta, i, &k, &v) == KS_OK; i++) {
    int skip = 0;
    for (size_t j = 0; j < sizeof own / sizeof *own && !skip; j++) skip = !strcmp(k, own[j]);
    if (!skip) st = ks_meta_set(extra, k, v, NULL);
  }
  return st;
}

static KS_NODISCARD ks_status read_keepsake(conv *c) {
  ks_read_opts ro = {0};
  ro.alloc = c->a;
  ro.mode = KS_READ_MMAP; /* views into c->input, the copy read once */
  ro.verify_checksums = !c->o->salvage;
  if (c->o->salvage) { /* every problem named first; what cannot be parsed at all still fails below */
    ks_reader *r = NULL;
    if (ks_reader_open_buffer(c->input.bytes, c->input.size, &ro, &r, NULL) == KS_OK) {
      /* Safe to ignore: on_problem has reported each problem, and the load below decides. */
      ks_status vs = ks_reader_verify(r, on_problem, c, NULL);
      (void)vs;
    }
    ks_reader_free(r);
  }
  ks_meta *meta = NULL;
  ks_status st = ks_load_buffer(c->input.bytes, c->input.size, &ro, &c->sd, &meta, c->err);
  if (!st && (st = ks_meta_create(c->a, &c->meta, NULL)) == KS_OK && (st = keep_meta(meta, c->meta)) != KS_OK)
    st = ks__err(c->err, st, "convert: out of memory copying the metadata");
  ks_meta_free(meta);
  if (st && c->err) /* the buffer's bytes are the input's: name it, not "<buffer>" */
    snprintf(c->err->file, sizeof c->err->file, "%s", c->in);
  return st;
}

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && !strcmp(s + n - m, suffix);
}

static uint64_t metric_budget(const conv *c) {
  if (c->o->max_metric_bytes) return c->o->max_metric_bytes;
  uint64_t n = c->input.size;
  return n > (UINT64_MAX - DEFAULT_METRIC_SLACK) / 2 ? UINT64_MAX : 2 * n + DEFAULT_METRIC_SLACK;
}

static KS_NODISCARD ks_status write_pt(conv *c, const ks_statedict *kept) {
  const char *structure = ks_meta_get(c->meta, KS_TORCH_STRUCTURE_META);
  ks_statedict *listed = NULL;
  char *listed_structure = NULL;
  uint64_t budget = metric_budget(c);
  ks_status st =
      ks__convert_pt_lists(c->a, kept, c->meta, &budget, &listed, &listed_structure, &c->rep->list_states, c->err);
  ks_torch_write_opts wo = {0};
  wo.size = sizeof wo;
  wo.alloc = c->a;
  wo.io = c->o->io;
  wo.torch_compat = c->o->torch_compat;
  wo.structure = listed_structure ? listed_structure : structure;
  if (!st) st = ks_torch_save(c->out, listed ? listed : kept, &wo, c->err);
  ks_statedict_free(listed);
  ks__free(c->a, listed_structure);
  return st;
}

static KS_NODISCARD ks_status write_out(conv *c) {
  ks_statedict *kept = NULL;
  bool pt = !c->o->hf && (ends_with(c->out, ".pt") || ends_with(c->out, ".pth"));
  /* Before --ignore, which prunes the structure document it makes along with the entries. */
  ks_status st = pt ? ks__convert_pytree(c->a, c->sd, c->meta, c->err) : KS_OK;
  if (!st) st = ks__convert_ignore(c->sd, c->o->ignore, c->o->n_ignore, c->meta, &kept, c->err);
  if (st) return st;
  const ks_statedict *w = kept ? kept : c->sd;
  c->rep->written = ks_statedict_count(w);
  c->rep->ignored = ks_statedict_count(c->sd) - c->rep->written;
  if (c->o->hf) {
    st = ks__convert_write_hf(c->a, c->o->io, c->out, w, c->meta, c->o->hf_shard_bytes, c->err);
  } else if (pt) {
    st = write_pt(c, w);
  } else {
    ks_save_opts so = {0};
    so.size = sizeof so;
    so.alloc = c->a;
    so.io = c->o->io;
    st = ks_save(c->out, w, c->meta, &so, c->err);
  }
  ks_statedict_free(kept);
  return st;
}

/* A directory (or a link to a checkpoint directory): read by ks_dcp_import, which says what it holds or why
   it reads none of it. */
static bool is_dir(const char *path, const ks_io *io) {
  if (ks_io_check(io, NULL)) return false;
  const ks_io *t = ks__io_v2(io);
  ks_io_stat s;
  if (t->stat_fn(t->ctx, path, &s)) return false;
  if (s.kind == KS_IO_DIR) return true;
  ks_torch_read_opts probe = {0};
  probe.io = io;
  return s.kind == KS_IO_LINK && ks_torch_probe(path, &probe) == KS_TORCH_DCP;
}

static KS_NODISCARD ks_status run(conv *c) {
  /* The output checks are the local file system's (symlinks, devices, mode bits): they apply when the
   * table says its paths are local files (KS_IO_CAP_LOCAL, io.h), not to a remote store. */
  bool local_out = (ks_io_caps(c->o->io) & KS_IO_CAP_LOCAL) != 0 && !c->o->hf; /* hf: a directory (hf.c) */
  ks_status st = local_out ? ks__convert_check_output(c->out, c->err) : KS_OK;
  if (!st && is_dir(c->in, c->o->in_io)) {
    st = read_dcp(c);
    return st ? st : write_out(c);
  }
  if (!st) st = ks__fmap_open(&c->input, c->in, c->o->in_io, true, 0, c->a, c->err); /* never mapped: see convert.h */
  if (st) return st;
  ks_torch_read_opts probe = {0};
  probe.data = c->input.bytes;
  probe.data_len = c->input.size;
  ks_torch_kind kind = ks_torch_probe(NULL, &probe);
  st = kind == KS_TORCH_ZIP || kind == KS_TORCH_LEGACY ? read_torch(c) : read_keepsake(c);
  if (!st) st = write_out(c);
  return st;
}

ks_status ks_convert(const char *in, const char *out, const ks_convert_opts *opts, ks_convert_report **report,
                     ks_error *err) {
  if (report) *report = NULL;
  if (!in || !out) return ks__err(err, KS_E_INVALID, "ks_convert: NULL argument");
  ks_convert_opts none = {0};
  if (!opts) opts = &none;
  KS__TAKE_OPTS(ks_convert_opts, opts, KS__V1_SIZE(ks_convert_opts, io), err);
  if (opts->n_ignore && !opts->ignore) return ks__err(err, KS_E_INVALID, "ks_convert: n_ignore without ignore");
  conv c = {ks__alloc_or_default(opts->alloc), opts, in, out, NULL, err, {0}, NULL, NULL};
  c.rep = ks__convert_report_new(c.a);
  ks_status st = c.rep ? run(&c) : ks__err(err, KS_E_NOMEM, "convert: out of memory");
  ks_statedict_free(c.sd);
  ks_meta_free(c.meta);
  ks__fmap_close(&c.input, c.a);
  if (report) *report = c.rep;
  else ks_convert_report_free(c.rep);
  return st;
}
