/*
 * The Hugging Face safetensors layout of a state dict (ks_convert_opts.hf):
 * a directory that torch's HuggingFaceStorageReader and transformers'
 * from_pretrained read as written. Tensors whole, stored under DCP's and
 * Hugging Face's name for them (the keepsake name's components joined by '.'),
 * in files of at most hf_shard_bytes of tensor data filled in the state dict's
 * order: one `model.safetensors`, or `model-0000i-of-0000N.safetensors` and the
 * index `model.safetensors.index.json` ({"metadata": {"total_size"},
 * "weight_map"}), written last. Each file is written by ks_save: a keepsake
 * file, its tensors' checksums in its header (which safetensors readers skip),
 * `format` = `pt` as transformers asks, and the keepsake names of its renamed
 * tensors (KS_META_HF_NAMES); the first file also holds the scalars and the
 * input's metadata, so the layout reads back (ks_dcp_import) as it was.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert/convert_internal.h"
#include "core/durable.h"
#include "core/io_ops.h"
#include "core/json.h"
#include "keepsake/layout.h"

#define DEFAULT_SHARD_BYTES ((uint64_t)5000000000)
#define INDEX_NAME "model.safetensors.index.json"

typedef struct hf_tensor {
  size_t entry; /* in the input */
  char *key;    /* the stored name */
  size_t file;
} hf_tensor;

typedef struct hf_out {
  const ks_allocator *a;
  const ks_io *io;
  const char *dir;
  ks_error *err;
  hf_tensor *t;
  size_t n;
  size_t nfiles;
} hf_out;

static KS_NODISCARD ks_status nomem(ks_error *err) { return ks__err(err, KS_E_NOMEM, "convert: out of memory"); }

/* name's components, '%2F' and '%25' read back, joined by '.' (the name DCP flattens the same value to). */
static char *dotted(const ks_allocator *a, const char *name) {
  size_t n = strlen(name), m = 0;
  char *k = ks__malloc(a, n + 1);
  if (!k) return NULL;
  for (size_t i = 0; i < n; i++) {
    if (name[i] == '/') k[m++] = '.';
    else if (name[i] == '%' && i + 2 < n && name[i + 1] == '2' && (name[i + 2] == 'F' || name[i + 2] == '5'))
      k[m++] = name[i + 2] == 'F' ? '/' : '%', i += 2;
    else k[m++] = name[i];
  }
  k[m] = 0;
  return k;
}

static int cmp_key(const void *x, const void *y) {
  return strcmp(((const hf_tensor *)x)->key, ((const hf_tensor *)y)->key);
}

/* The tensors, their stored names (two of one name refused) and files. */
static KS_NODISCARD ks_status plan(hf_out *h, const ks_statedict *sd, uint64_t limit) {
  size_t bytes, n = 0;
  h->t = ks__mul_size(ks_statedict_count(sd) + 1, sizeof *h->t, &bytes) ? ks__calloc(h->a, 1, bytes) : NULL;
  if (!h->t) return nomem(h->err);
  uint64_t in_file = 0;
  size_t file = 0;
  for (size_t i = 0; i < ks_statedict_count(sd); i++) {
    ks_entry e;
    if (ks_statedict_at(sd, i, &e) || e.kind != KS_VAL_TENSOR) continue;
    hf_tensor *t = &h->t[n++];
    t->entry = i;
    if (!(t->key = dotted(h->a, e.name))) return h->n = n, nomem(h->err);
    if (in_file && e.tensor.nbytes > limit - in_file) file++, in_file = 0; /* a new file: this one is full */
    in_file = e.tensor.nbytes > limit - in_file ? limit : in_file + e.tensor.nbytes;
    t->file = file;
  }
  h->n = n;
  h->nfiles = n ? file + 1 : 1;
  hf_tensor *sorted = ks__mul_size(n + 1, sizeof *sorted, &bytes) ? ks__malloc(h->a, bytes) : NULL;
  if (!sorted) return nomem(h->err);
  for (size_t i = 0; i < n; i++) sorted[i] = h->t[i];
  qsort(sorted, n, sizeof *sorted, cmp_key);
  ks_status st = KS_OK;
  for (size_t i = 0; i + 1 < n && !st; i++)
    if (!strcmp(sorted[i].key, sorted[i + 1].key))
      st = ks__err_at(h->err, KS_E_EXISTS, NULL, sorted[i].key, -1,
                      "convert: two tensors are both named '%s' in the Hugging Face layout (their names' components "
                      "joined by '.')", sorted[i].key);
  ks__free(h->a, sorted);
  return st;
}

static void file_name(const hf_out *h, size_t f, char *buf, size_t cap) {
  if (h->nfiles == 1) snprintf(buf, cap, "model.safetensors");
  else snprintf(buf, cap, "model-%05zu-of-%05zu.safetensors", f + 1, h->nfiles);
}

static KS_NODISCARD ks_status join(const hf_out *h, const char *name, char **out) {
  size_t n = strlen(h->dir) + strlen(name) + 2;
  char *p = ks__malloc(h->a, n);
  if (!p) return nomem(h->err);
  snprintf(p, n, "%s/%s", h->dir, name);
  *out = p;
  return KS_OK;
}

/* File f's metadata: `format` = `pt`, its renamed tensors' keepsake names, and (the first) the input's. */
static KS_NODISCARD ks_status file_meta(hf_out *h, const ks_statedict *sd, const ks_meta *in, size_t f,
                                        ks_meta **out) {
  ks__jv *names = ks__jv_object(h->a);
  ks_meta *m = NULL;
  ks_status st = names ? ks_meta_create(h->a, &m, h->err) : nomem(h->err);
  for (size_t i = 0; !st && f == 0 && in && i < ks_meta_count(in); i++) {
    const char *k, *v;
    if (!ks_meta_at(in, i, &k, &v) && strcmp(k, KS_META_HF_NAMES)) st = ks_meta_set(m, k, v, h->err);
  }
  if (!st) st = ks_meta_set(m, "format", "pt", h->err);
  bool renamed = false;
  for (size_t i = 0; !st && i < h->n; i++) {
    ks_entry e;
    if (h->t[i].file != f || ks_statedict_at(sd, h->t[i].entry, &e) || !strcmp(e.name, h->t[i].key)) continue;
    ks__jv *v = ks__jv_str(h->a, e.name);
    st = v ? ks__jv_set(h->a, names, h->t[i].key, v) : KS_E_NOMEM;
    renamed = true;
  }
  char *text = !st && renamed ? ks__jv_dump(h->a, names, true) : NULL;
  if (!st && renamed && !text) st = KS_E_NOMEM;
  if (!st && text) st = ks_meta_set(m, KS_META_HF_NAMES, text, h->err);
  if (st == KS_E_NOMEM) st = nomem(h->err);
  ks__free(h->a, text);
  ks__jv_free(h->a, names);
  if (st) ks_meta_free(m);
  else *out = m;
  return st;
}

static KS_NODISCARD ks_status write_file(hf_out *h, const ks_statedict *sd, const ks_meta *in, size_t f) {
  ks_statedict *part = NULL;
  ks_meta *m = NULL;
  char name[64], *path = NULL;
  file_name(h, f, name, sizeof name);
  ks_status st = ks_statedict_create(h->a, &part, h->err);
  for (size_t i = 0; !st && i < h->n; i++) {
    ks_entry e;
    if (h->t[i].file == f && !ks_statedict_at(sd, h->t[i].entry, &e))
      st = ks_statedict_set_tensor(part, h->t[i].key, &e.tensor, KS_BORROW, h->err);
  }
  for (size_t i = 0; !st && f == 0 && i < ks_statedict_count(sd); i++) { /* the scalars, in the first file */
    ks_entry e;
    if (!ks_statedict_at(sd, i, &e) && e.kind != KS_VAL_TENSOR)
      st = ks_statedict_set_entry(part, e.name, &e, KS_COPY, h->err);
  }
  if (!st) st = file_meta(h, sd, in, f, &m);
  if (!st) st = join(h, name, &path);
  ks_save_opts so = {0};
  so.size = sizeof so;
  so.alloc = h->a;
  so.io = h->io;
  if (!st) st = ks_save(path, part, m, &so, h->err);
  ks__free(h->a, path);
  ks_meta_free(m);
  ks_statedict_free(part);
  return st;
}

static KS_NODISCARD ks_status write_index(hf_out *h, const ks_statedict *sd) {
  ks__jv *root = ks__jv_object(h->a), *md = ks__jv_object(h->a), *wm = ks__jv_object(h->a);
  ks_status st = root && md && wm ? KS_OK : KS_E_NOMEM;
  uint64_t total = 0;
  char name[64];
  for (size_t i = 0; !st && i < h->n; i++) {
    ks_entry e;
    if (ks_statedict_at(sd, h->t[i].entry, &e)) continue; /* in range */
    total += e.tensor.nbytes;
    file_name(h, h->t[i].file, name, sizeof name);
    ks__jv *v = ks__jv_str(h->a, name);
    st = v ? ks__jv_set(h->a, wm, h->t[i].key, v) : KS_E_NOMEM;
  }
  ks__jv *tv = st ? NULL : ks__jv_int(h->a, (int64_t)total);
  if (!st) st = tv ? ks__jv_set(h->a, md, "total_size", tv) : KS_E_NOMEM;
  if (!st) st = ks__jv_set(h->a, root, "metadata", md), md = NULL;
  if (!st) st = ks__jv_set(h->a, root, "weight_map", wm), wm = NULL;
  char *text = st ? NULL : ks__jv_dump_indented(h->a, root, true, 2);
  if (!st && !text) st = KS_E_NOMEM;
  if (st == KS_E_NOMEM) st = nomem(h->err);
  char *path = NULL;
  if (!st) st = join(h, INDEX_NAME, &path);
  if (!st) { /* abort after prepare in every case: a failed prepare may hold memory */
    ks__durable d;
    st = ks__durable_prepare(&d, path, h->io, h->a, h->err);
    if (!st) st = ks__durable_open(&d);
    if (!st) st = ks__durable_write(&d, text, strlen(text));
    if (!st) st = ks__durable_commit(&d);
    ks__durable_abort(&d);
  }
  ks__free(h->a, path);
  ks__free(h->a, text);
  ks__jv_free(h->a, md);
  ks__jv_free(h->a, wm);
  ks__jv_free(h->a, root);
  return st;
}

static int any_entry(void *ctx, const char *name, ks_io_kind kind) {
  (void)name, (void)kind;
  *(bool *)ctx = true;
  return ECANCELED;
}

/* OUT absent (made) or an empty directory: files of an earlier layout would mix with this one. */
static KS_NODISCARD ks_status prepare_dir(hf_out *h) {
  ks_io_stat s;
  const ks_io *t = h->io;
  if (t->stat_fn(t->ctx, h->dir, &s)) {
    int e = t->mkdir_fn(t->ctx, h->dir);
    char why[KS__IO_WHY_MAX];
    return e ? ks__err_at(h->err, KS_E_IO, h->dir, NULL, -1, "convert: cannot make the directory: %s",
                          ks__io_why(t, e, why, sizeof why))
             : KS_OK;
  }
  if (s.kind != KS_IO_DIR)
    return ks__err_at(h->err, KS_E_INVALID, h->dir, NULL, -1,
                      "convert: a Hugging Face layout is written into a directory; OUT is not one");
  bool any = false;
  int e = t->list_fn(t->ctx, h->dir, "", any_entry, &any);
  if (e && e != ECANCELED)
    return ks__err_at(h->err, KS_E_IO, h->dir, NULL, -1, "convert: cannot list the directory: %s", strerror(e));
  if (any)
    return ks__err_at(h->err, KS_E_EXISTS, h->dir, NULL, -1,
                      "convert: the directory is not empty (its files would mix with the new layout's)");
  return KS_OK;
}

ks_status ks__convert_write_hf(const ks_allocator *a, const ks_io *io, const char *dir, const ks_statedict *sd,
                               const ks_meta *meta, uint64_t shard_bytes, ks_error *err) {
  ks_status st = ks_io_check(io, err);
  if (st) return st;
  hf_out h = {a, ks__io_v2(io), dir, err, NULL, 0, 0};
  st = plan(&h, sd, shard_bytes ? shard_bytes : DEFAULT_SHARD_BYTES);
  if (!st) st = prepare_dir(&h);
  for (size_t f = 0; !st && f < h.nfiles; f++) st = write_file(&h, sd, meta, f);
  if (!st && h.nfiles > 1) st = write_index(&h, sd); /* last: the files it names are all in place */
  for (size_t i = 0; i < h.n; i++) ks__free(a, h.t[i].key);
  ks__free(a, h.t);
  return st;
}
