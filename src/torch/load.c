/* ks_torch_load: zip -> data.pkl -> pickle tree -> flat state dict. */

#include "core/io_ops.h"
#include "torch/torch_internal.h"

typedef struct storage_ctx {
  const ks__zip *zip;
  int verify;
} storage_ctx;

static KS_NODISCARD ks_status read_storage(void *ctx, const char *key, const uint8_t **data, size_t *len,
                                           ks_error *err) {
  const storage_ctx *sc = ctx;
  return ks__zip_read(sc->zip, key, sc->verify, data, len, err);
}

static void release_arena(void *p) {
  ks__pk_arena *ar = p;
  ks_allocator a = ar->alloc;
  ks__pk_arena_release(ar);
  ks__free(&a, ar);
}

/* torch records its byte order since 1.12; big-endian archives are refused. */
static KS_NODISCARD ks_status check_byteorder(const ks__zip *z, ks_error *err) {
  const uint8_t *p;
  size_t n;
  if (ks__zip_read(z, "byteorder", 0, &p, &n, NULL) != KS_OK) return KS_OK;
  if (n >= 3 && !memcmp(p, "big", 3))
    return ks__err(err, KS_E_UNSUPPORTED, "torch: big-endian archive (byteorder 'big')");
  return KS_OK;
}

static KS_NODISCARD ks_status run(ks__pk_arena *ar, const ks_torch_read_opts *opts, size_t file_len, ks_statedict *sd,
                     ks__structure *shape, ks_error *err) {
  const uint8_t *pkl;
  size_t n;
  ks_status st = check_byteorder(ar->zip, err);
  if (!st) st = ks__zip_read(ar->zip, "data.pkl", opts && opts->verify_crc, &pkl, &n, err);
  if (st) return st;
  ks__pk_limits lim;
  ks__pk_limits_from_opts(opts, file_len, &lim);
  if (!lim.max_entries) lim.max_entries = n * 8 + 4096;
  storage_ctx sc = {ar->zip, opts && opts->verify_crc};
  ks__pk_node *root;
  if ((st = ks__pk_run(pkl, n, ar, &lim, read_storage, &sc, &root, err)) != KS_OK) {
    ks__err_set_key(err, "data.pkl");
    return st;
  }
  return ks__pk_flatten_structured(root, &lim, sd, shape, err);
}

/* Takes ownership of z in every case. */
static KS_NODISCARD ks_status load_zip(ks__zip *z, size_t file_len, const ks_torch_read_opts *opts, ks_statedict **out,
                          char **structure, ks_error *err) {
  const ks_allocator *a = opts ? opts->alloc : NULL;
  ks__pk_arena *ar = ks__malloc(a, sizeof *ar);
  ks_statedict *sd = NULL;
  ks__structure *shape = NULL;
  char *text = NULL;
  if (!ar) {
    ks__zip_free(z);
    return ks__err(err, KS_E_NOMEM, "torch: out of memory");
  }
  ks__pk_arena_init(ar, a);
  ar->zip = z;
  ks_status st = ks_statedict_create(a, &sd, err);
  if (st) st = ks__err(err, st, "torch: out of memory");
  if (!st && structure) st = ks__structure_create(&shape, err);
  if (!st) st = run(ar, opts, file_len, sd, shape, err);
  if (!st && shape) st = ks__structure_dump(shape, ks__alloc_or_default(a), &text, err);
  ks__structure_free(shape);
  if (!st && (st = ks__statedict_attach(sd, ar, release_arena, err)) != KS_OK) ks__err(err, st, "torch: out of memory");
  if (st) {
    ks__free(a, text);
    ks_statedict_free(sd);
    release_arena(ar);
    return st;
  }
  *out = sd;
  if (structure) *structure = text;
  return KS_OK;
}

/* torch.save(..., _use_new_zipfile_serialization=False): a pickled magic number (LONG1
   0x1950a86a20f9469cfc6c) at offset 2 after the protocol opcode, followed by more pickles. */
static int is_legacy(const uint8_t *p, size_t len) {
  static const uint8_t magic[12] = {0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19};
  return p && len >= 14 && p[0] == 0x80 && !memcmp(p + 2, magic, sizeof magic);
}

/* A zip archive: a local file header, or the end record of an empty archive. */
static int is_zip(const uint8_t *p, size_t len) {
  if (!p || len < 4 || p[0] != 'P' || p[1] != 'K') return 0;
  return (p[2] == 3 && p[3] == 4) || (p[2] == 5 && p[3] == 6);
}

ks_torch_kind ks__torch_sniff(const void *buf, size_t len) {
  return is_zip(buf, len) ? KS_TORCH_ZIP : is_legacy(buf, len) ? KS_TORCH_LEGACY : KS_TORCH_UNKNOWN;
}

static KS_NODISCARD ks_status legacy_refused(ks_error *err) {
  return ks__err(err, KS_E_UNSUPPORTED,
                 "torch: legacy torch.save format (_use_new_zipfile_serialization=False) is not read; "
                 "load it in Python and torch.save it again with the default zip format");
}

/* What the first bytes of the file say, read through the table (whose open_fn refuses a FIFO,
   never waits on one). */
static ks_torch_kind path_kind(const char *path, const ks_io *table) {
  const ks_io *io = ks__io_v2(table);
  uint8_t head[14];
  int fd;
  uint64_t size;
  size_t n = 0;
  if (ks_io_check(table, NULL) || io->open_fn(io->ctx, path, &fd, &size)) return KS_TORCH_UNKNOWN;
  int rc = io->read_fn(io->ctx, fd, head, (size_t)(size < sizeof head ? size : sizeof head), 0, &n);
  io->close_fn(io->ctx, fd);
  return rc ? KS_TORCH_UNKNOWN : ks__torch_sniff(head, n);
}

static KS_NODISCARD ks_status load_path(const char *path, const ks_torch_read_opts *opts, ks_statedict **out,
                                        char **structure, ks_error *err) {
  ks__zip *z;
  ks_status st = ks__zip_open_path(path, opts->io, opts->alloc, &z, err);
  if (st && st != KS_E_NOMEM && path_kind(path, opts->io) == KS_TORCH_LEGACY) {
    ks_error_clear(err);
    st = legacy_refused(err);
  }
  if (st) {
    ks__err_set_file(err, path);
    return st;
  }
  const ks__zip_entry *e = ks__zip_at(z, 0);
  size_t len = e ? (size_t)e->data_off : 0; /* a lower bound is enough for the view limit */
  for (size_t i = 0; i < ks__zip_count(z); i++) {
    e = ks__zip_at(z, i);
    if (e->data_off + e->size > len) len = (size_t)(e->data_off + e->size);
  }
  st = load_zip(z, len, opts, out, structure, err);
  if (st) ks__err_set_file(err, path);
  return st;
}

static KS_NODISCARD ks_status load_buffer(const ks_torch_read_opts *opts, ks_statedict **out, char **structure,
                                          ks_error *err) {
  ks__zip *z;
  if (is_legacy(opts->data, opts->data_len)) return legacy_refused(err);
  ks_status st = ks__zip_open_buffer(opts->data, opts->data_len, opts->alloc, &z, err);
  if (st) return st;
  return load_zip(z, opts->data_len, opts, out, structure, err);
}

ks_status ks_torch_load(const char *path, const ks_torch_read_opts *opts, ks_statedict **out, char **structure,
                        ks_error *err) {
  if (!out) return ks__err(err, KS_E_INVALID, "torch: NULL argument");
  KS__TAKE_OPTS(ks_torch_read_opts, opts, KS__V1_SIZE(ks_torch_read_opts, max_entries), err);
  if (!path == !opts->data)
    return ks__err(err, KS_E_INVALID, "torch: give either a path or opts->data (%s)", path ? "both given" : "neither");
  ks_error_clear(err);
  return path ? load_path(path, opts, out, structure, err) : load_buffer(opts, out, structure, err);
}

ks_torch_kind ks_torch_probe(const char *path, const ks_torch_read_opts *opts) {
  ks_torch_read_opts o;
  if (ks__struct_in(&o, sizeof o, opts, KS__V1_SIZE(ks_torch_read_opts, max_entries))) return KS_TORCH_UNKNOWN;
  if (!path) return ks__torch_sniff(o.data, o.data_len);
  if (ks__torch_dcp_dir(path, o.io)) return KS_TORCH_DCP;
  return path_kind(path, o.io);
}

void ks_torch_free(const ks_allocator *alloc, void *p) { ks__free(alloc, p); }
