/*
 * Hugging Face safetensors layouts as one state dict: the files a
 * `model.safetensors.index.json` names in its `weight_map`, or, without an
 * index, every `*.safetensors` file of the directory (a single
 * `model.safetensors`; what torch's HuggingFaceStorageWriter wrote, one file per
 * rank when distributed). As torch's HuggingFaceStorageReader reads them: a
 * tensor is stored whole, or in chunks under one name in several files, each
 * placed by the `saved_offsets` its file's `DCP_SHARDING_INFO` records, the
 * whole tensor's shape being the largest extent of its chunks; here the chunks
 * must also cover it exactly once. Every file is a safetensors file read
 * through the format module (lazily: each tensor fetched once, verified against
 * its keepsake checksum when the file has them). Names are the stored keys,
 * each one name component (docs/FORMAT.md 12); a file keepsake wrote records
 * each key's keepsake name (KS_META_HF_NAMES), its scalars and its structure
 * document, which come back as they were.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "keepsake/format.h"
#include "keepsake/layout.h"
#include "torch/dcp_internal.h"

#define SHARDING_INFO "DCP_SHARDING_INFO"
#define SUFFIX ".safetensors"

static KS_NODISCARD ks_status nomem(ks_error *err) { return ks__err(err, KS_E_NOMEM, "dcp: out of memory"); }

typedef struct hf_file {
  char *name;
  ks_reader *rd;
  ks__jv *sharding; /* DCP_SHARDING_INFO, or NULL */
  ks__jv *names;    /* KS_META_HF_NAMES, or NULL */
} hf_file;

/* One stored tensor: a chunk (or the whole) of the entry of its name. */
typedef struct piece {
  const char *name; /* the reader's */
  size_t file, index, order;
  ks_tensor desc; /* dtype, rank, shape; no data */
  int64_t off[KS_MAX_RANK];
} piece;

typedef struct hf {
  ks__dcp_rd *r;
  hf_file *files;
  size_t nfiles, capfiles;
  piece *pieces;
  size_t npieces, cappieces;
  size_t *by_chunk; /* the piece of each chunk of r->d */
  ks_statedict *scalars;
  ks_status list_st; /* why a listing stopped */
  const char *structure; /* the first file's keepsake.torch_structure, or NULL */
} hf;

/* ---- which files ---- */

/* Appends a file (names repeat in a weight_map: unique_files sorts them and drops the repeats). */
static KS_NODISCARD ks_status add_file(hf *h, const char *name) {
  if (!ks__dcp_plain_file_name(name))
    return ks__err_at(h->r->err, KS_E_FORMAT, h->r->dir, NULL, -1,
                      "dcp: '%.200s' is not a file name inside the checkpoint directory", name);
  if (ks__grow(h->r->a, &h->files, &h->capfiles, h->nfiles + 1, sizeof *h->files)) return nomem(h->r->err);
  hf_file *f = &h->files[h->nfiles];
  memset(f, 0, sizeof *f);
  if (!(f->name = ks__strdup(h->r->a, name))) return nomem(h->r->err);
  h->nfiles++;
  return KS_OK;
}

static int cmp_file(const void *a, const void *b) {
  return strcmp(((const hf_file *)a)->name, ((const hf_file *)b)->name);
}

static void unique_files(hf *h) {
  qsort(h->files, h->nfiles, sizeof *h->files, cmp_file);
  size_t k = 0;
  for (size_t i = 0; i < h->nfiles; i++) {
    if (k && !strcmp(h->files[k - 1].name, h->files[i].name)) {
      ks__free(h->r->a, h->files[i].name);
      continue;
    }
    h->files[k++] = h->files[i];
  }
  h->nfiles = k;
}

/* The file of that name (files sorted), or NULL. */
static const hf_file *file_named(const hf *h, const char *name) {
  hf_file key = {0};
  key.name = (char *)(uintptr_t)name;
  return bsearch(&key, h->files, h->nfiles, sizeof *h->files, cmp_file);
}

/* The index's weight_map says where each of its names is: it must be there. */
static KS_NODISCARD ks_status check_weight_map(hf *h, const ks__jv *index) {
  const ks__jv *wm = ks__jv_get(index, "weight_map");
  for (size_t i = 0; wm && i < wm->len; i++) {
    const hf_file *f = file_named(h, ks__jv_string(wm->items[i]));
    if (f && ks_reader_find(f->rd, wm->keys[i]) < 0) {
      ks__dcp_rd *r = h->r;
      ks_status st = ks__dcp_set_path(r, f->name);
      return st ? st
                : ks__err_at(r->err, KS_E_FORMAT, r->path, wm->keys[i], -1,
                             "dcp: the index's weight_map puts the tensor in this file, which does not hold it");
    }
  }
  return KS_OK;
}

static KS_NODISCARD ks_status files_of_index(hf *h, const ks__jv *index) {
  const ks__jv *wm = ks__jv_get(index, "weight_map");
  if (!ks__jv_is(wm, KS__JV_OBJECT))
    return ks__err_at(h->r->err, KS_E_FORMAT, h->r->path, "weight_map", -1,
                      "dcp: the index has no keepsake member and no weight_map object");
  ks_status st = KS_OK;
  for (size_t i = 0; i < wm->len && !st; i++) {
    const char *f = ks__jv_string(wm->items[i]);
    st = f ? add_file(h, f)
           : ks__err_at(h->r->err, KS_E_FORMAT, h->r->path, wm->keys[i], -1, "dcp: a weight_map value is not a string");
  }
  return st;
}

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n > m && !strcmp(s + n - m, suffix);
}

static int on_name(void *ctx, const char *name, ks_io_kind kind) {
  hf *h = ctx;
  if ((kind != KS_IO_FILE && kind != KS_IO_LINK) || !ends_with(name, SUFFIX)) return 0;
  h->list_st = add_file(h, name);
  return h->list_st == KS_OK ? 0 : ECANCELED;
}

static KS_NODISCARD ks_status files_of_listing(hf *h) {
  ks__dcp_rd *r = h->r;
  int e = r->io->list_fn(r->io->ctx, r->dir, "", on_name, h);
  if (e && h->list_st) return h->list_st; /* add_file said why */
  if (e) return ks__err_at(r->err, KS_E_IO, r->dir, NULL, -1, "dcp: cannot list the directory: %s", strerror(e));
  if (!h->nfiles)
    return ks__err_at(r->err, KS_E_UNSUPPORTED, r->dir, NULL, -1,
                      "dcp: not a checkpoint directory keepsake reads: no .metadata (torch.distributed.checkpoint), "
                      "no model.safetensors.index.json (keepsake or Hugging Face) and no *.safetensors file");
  return KS_OK;
}

/* ---- each file's tensors ---- */

static KS_NODISCARD ks_status json_meta(hf *h, hf_file *f, const char *key, ks__jv **out) {
  const char *v = ks_meta_get(ks_reader_meta(f->rd), key);
  if (!v) return KS_OK;
  ks_status st = ks__jv_parse(h->r->a, v, strlen(v), key, out, h->r->err);
  if (!st && !ks__jv_is(*out, KS__JV_OBJECT))
    st = ks__err_at(h->r->err, KS_E_FORMAT, h->r->path, key, -1, "dcp: %s is not a JSON object", key);
  if (st && h->r->err) ks__err_set_file(h->r->err, h->r->path);
  return st;
}

/* The chunk's place: DCP_SHARDING_INFO[name].saved_offsets, or zeros without sharding info. */
static KS_NODISCARD ks_status offsets_of(hf *h, const hf_file *f, piece *p) {
  if (!f->sharding) return KS_OK;
  const ks__jv *o = ks__jv_get(ks__jv_get(f->sharding, p->name), "saved_offsets");
  if (!ks__jv_is(o, KS__JV_ARRAY) || o->len != (size_t)p->desc.rank)
    return ks__err_at(h->r->err, KS_E_FORMAT, h->r->path, p->name, -1,
                      "dcp: " SHARDING_INFO " has no saved_offsets of the tensor's rank for it");
  for (size_t d = 0; d < o->len; d++) {
    int64_t v;
    if (!ks__jv_is_int(o->items[d], &v) || v < 0 || v > INT64_MAX - p->desc.shape[d])
      return ks__err_at(h->r->err, KS_E_FORMAT, h->r->path, p->name, -1,
                        "dcp: saved_offsets[%zu] is not an offset the tensor fits after", d);
    p->off[d] = v;
  }
  return KS_OK;
}

static KS_NODISCARD ks_status read_file(hf *h, size_t fi) {
  ks__dcp_rd *r = h->r;
  hf_file *f = &h->files[fi];
  ks_read_opts ro = {.alloc = r->a, .mode = KS_READ_LAZY, .io = r->io};
  ks_status st = ks__dcp_set_path(r, f->name);
  if (!st) st = ks_reader_open(r->path, &ro, &f->rd, r->err);
  if (!st) st = json_meta(h, f, SHARDING_INFO, &f->sharding);
  if (!st) st = json_meta(h, f, KS_META_HF_NAMES, &f->names);
  if (!st && !h->structure) h->structure = ks_meta_get(ks_reader_meta(f->rd), KS_TORCH_STRUCTURE_META);
  if (!st && !ks__add_u64(r->input_bytes, ks_reader_file_size(f->rd), &r->input_bytes)) r->input_bytes = UINT64_MAX;
  if (!st) r->nfiles++, r->nchecksummed += ks_reader_is_keepsake(f->rd) != 0;
  for (size_t i = 0; !st && i < ks_reader_count(f->rd); i++) {
    if (ks__grow(r->a, &h->pieces, &h->cappieces, h->npieces + 1, sizeof *h->pieces)) return nomem(r->err);
    piece *p = &h->pieces[h->npieces];
    memset(p, 0, sizeof *p);
    p->file = fi, p->index = i, p->order = h->npieces;
    ks_tensor_info info;
    if (ks_reader_tensor_info(f->rd, i, &info) || ks_reader_tensor_desc(f->rd, i, &p->desc)) continue; /* in range */
    p->name = info.name;
    if ((st = offsets_of(h, f, p)) == KS_OK) h->npieces++;
  }
  /* Scalars (a file keepsake wrote): kept under their own names. */
  ks_statedict *mine = NULL;
  if (!st) st = ks_statedict_create(r->a, &mine, r->err);
  if (!st) st = ks_reader_scalars(f->rd, mine, r->err);
  for (size_t i = 0; !st && i < ks_statedict_count(mine); i++) {
    ks_entry e, had;
    if (ks_statedict_at(mine, i, &e)) continue; /* in range */
    if (ks_statedict_get(h->scalars, e.name, &had) == KS_OK)
      st = ks__err_at(r->err, KS_E_EXISTS, r->path, e.name, -1, "dcp: two files hold a scalar of this name");
    else
      st = ks_statedict_set_entry(h->scalars, e.name, &e, KS_COPY, r->err);
  }
  ks_statedict_free(mine);
  return st;
}

/* ---- chunks of one name into entries (in the order of their names) ---- */

static int cmp_piece(const void *a, const void *b) {
  const piece *x = *(const piece *const *)a, *y = *(const piece *const *)b;
  int c = strcmp(x->name, y->name);
  return c ? c : (x->order > y->order) - (x->order < y->order);
}

/* The entry of the pieces g[0..n) (one name): dtype and rank alike, the whole shape their largest extent, and
   volumes that add up to it (ks__dcp_alloc_tensors then refuses two chunks sharing an element). */
static KS_NODISCARD ks_status make_entry(hf *h, piece *const *g, size_t n, ks__dcp_entry *e) {
  ks__dcp_rd *r = h->r;
  const piece *p0 = g[0];
  e->fqn = p0->name;
  e->tensor = true;
  e->dtype = p0->desc.dtype;
  e->rank = p0->desc.rank;
  e->chunk0 = r->d.nchunks;
  e->nchunks = n;
  uint64_t sum = 0, vol, numel;
  for (size_t j = 0; j < n; j++) {
    const piece *p = g[j];
    if (p->desc.dtype != e->dtype || p->desc.rank != e->rank)
      return ks__err_at(r->err, KS_E_FORMAT, r->dir, e->fqn, -1,
                        "dcp: chunks of one tensor in %s and %s differ in dtype or rank", h->files[p0->file].name,
                        h->files[p->file].name);
    for (int d = 0; d < e->rank; d++)
      if (p->off[d] + p->desc.shape[d] > e->shape[d]) e->shape[d] = p->off[d] + p->desc.shape[d];
    if (!ks__dcp_volume(e->rank, p->desc.shape, &vol) || !ks__add_u64(sum, vol, &sum))
      return ks__err_at(r->err, KS_E_LIMIT, r->dir, e->fqn, -1, "dcp: chunk volumes overflow");
    ks__dcp_chunk *k = &r->d.chunks[r->d.nchunks];
    memcpy(k->off, p->off, sizeof k->off);
    memcpy(k->size, p->desc.shape, sizeof k->size);
    h->by_chunk[r->d.nchunks++] = (size_t)(p - h->pieces);
  }
  if (!ks__dcp_volume(e->rank, e->shape, &numel))
    return ks__err_at(r->err, KS_E_LIMIT, r->dir, e->fqn, -1, "dcp: tensor size overflows");
  if (sum != numel)
    return ks__err_at(r->err, KS_E_FORMAT, r->dir, e->fqn, -1,
                      "dcp: the chunks hold %llu elements, the tensor they outline %llu: they do not cover it "
                      "exactly once", (unsigned long long)sum, (unsigned long long)numel);
  return KS_OK;
}

static KS_NODISCARD ks_status make_entries(hf *h) {
  ks__dcp_rd *r = h->r;
  size_t n = h->npieces, bytes;
  piece **by = ks__mul_size(n ? n : 1, sizeof *by, &bytes) ? ks__malloc(r->a, bytes) : NULL;
  r->d.entries = ks__mul_size(n ? n : 1, sizeof *r->d.entries, &bytes) ? ks__calloc(r->a, 1, bytes) : NULL;
  r->d.chunks = ks__mul_size(n ? n : 1, sizeof *r->d.chunks, &bytes) ? ks__calloc(r->a, 1, bytes) : NULL;
  h->by_chunk = ks__mul_size(n ? n : 1, sizeof *h->by_chunk, &bytes) ? ks__malloc(r->a, bytes) : NULL;
  ks_status st = by && r->d.entries && r->d.chunks && h->by_chunk ? KS_OK : nomem(r->err);
  for (size_t i = 0; !st && i < n; i++) by[i] = &h->pieces[i];
  if (!st) qsort(by, n, sizeof *by, cmp_piece);
  for (size_t i = 0; !st && i < n;) {
    size_t end = i + 1;
    while (end < n && !strcmp(by[end]->name, by[i]->name)) end++;
    st = make_entry(h, by + i, end - i, &r->d.entries[r->d.nentries++]);
    i = end;
  }
  ks__free(r->a, by);
  return st;
}

/* ---- names: the keepsake names a file keepsake wrote records ---- */

/* name's '/'-separated components, '%2F' and '%25' read back, as a tuple of str nodes. */
static KS_NODISCARD ks_status path_of_name(ks__pk_arena *ar, const char *name, ks__pk_node **out) {
  size_t n = strlen(name), ncomp = 1, bytes;
  for (size_t i = 0; i < n; i++) ncomp += name[i] == '/';
  ks__pk_node **items = ks__mul_size(ncomp, sizeof *items, &bytes) ? ks__malloc(&ar->alloc, bytes) : NULL;
  char *buf = items ? ks__malloc(&ar->alloc, n + 1) : NULL;
  ks_status st = items && buf ? KS_OK : KS_E_NOMEM;
  size_t k = 0;
  for (const char *s = name; !st && k < ncomp; k++) {
    const char *end = strchr(s, '/');
    size_t len = end ? (size_t)(end - s) : strlen(s), m = 0;
    for (size_t i = 0; i < len; i++) {
      if (s[i] == '%' && i + 2 < len && s[i + 1] == '2' && (s[i + 2] == 'F' || s[i + 2] == '5')) {
        buf[m++] = s[i + 2] == 'F' ? '/' : '%';
        i += 2;
      } else {
        buf[m++] = s[i];
      }
    }
    if (!(items[k] = ks__pk_new_str(ar, PK_STR, buf, m))) st = KS_E_NOMEM;
    s = end ? end + 1 : s + len;
  }
  ks__pk_node *t = st ? NULL : ks__pk_new_seq(ar, PK_TUPLE, items, ncomp);
  if (!st && !t) st = KS_E_NOMEM;
  ks__free(&ar->alloc, buf);
  ks__free(&ar->alloc, items);
  if (!st) *out = t;
  return st;
}

/* Each entry's path from the keepsake name its file records (ks__dcp_finish checks that the path joins with
   '.' to the stored key, and names every entry by its key when one has none). */
static KS_NODISCARD ks_status paths(hf *h) {
  ks__dcp_rd *r = h->r;
  for (size_t i = 0; i < r->d.nentries; i++) {
    ks__dcp_entry *e = &r->d.entries[i];
    const hf_file *f = &h->files[h->pieces[h->by_chunk[e->chunk0]].file];
    const char *name = ks__jv_string(ks__jv_get(f->names, e->fqn));
    if (!name) continue;
    ks__pk_node *p = NULL;
    if (path_of_name(r->ar, name, &p)) return nomem(r->err);
    e->path = p;
  }
  return KS_OK;
}

/* ---- the bytes ---- */

static KS_NODISCARD ks_status read_chunks(hf *h) {
  ks__dcp_rd *r = h->r;
  for (size_t i = 0; i < r->d.nentries; i++) {
    const ks__dcp_entry *e = &r->d.entries[i];
    ks_tensor *whole = e->value->u.t;
    for (size_t j = 0; j < e->nchunks; j++) {
      const ks__dcp_chunk *k = &r->d.chunks[e->chunk0 + j];
      const piece *p = &h->pieces[h->by_chunk[e->chunk0 + j]];
      const hf_file *f = &h->files[p->file];
      size_t bytes = p->desc.nbytes;
      if (!bytes) continue;
      bool in_place = e->nchunks == 1; /* the one chunk covering the tensor: offsets zero, the same shape */
      uint8_t *buf = in_place ? whole->data : ks__malloc(r->a, bytes);
      if (!buf) return nomem(r->err);
      ks_status st = ks_reader_fetch(f->rd, p->index, buf, bytes, r->err);
      if (!st && !in_place) ks__dcp_copy_chunk(e, k, buf);
      if (!in_place) ks__free(r->a, buf);
      if (st) return st;
    }
  }
  return KS_OK;
}

/* ---- public ---- */

static void hf_free(hf *h) {
  for (size_t i = 0; i < h->nfiles; i++) {
    ks__free(h->r->a, h->files[i].name);
    ks_reader_free(h->files[i].rd);
    ks__jv_free(h->r->a, h->files[i].sharding);
    ks__jv_free(h->r->a, h->files[i].names);
  }
  ks__free(h->r->a, h->files);
  ks__free(h->r->a, h->pieces);
  ks__free(h->r->a, h->by_chunk);
  ks_statedict_free(h->scalars);
}

static KS_NODISCARD ks_status add_scalars(hf *h, ks_statedict *out) {
  for (size_t i = 0; i < ks_statedict_count(h->scalars); i++) {
    ks_entry e, had;
    if (ks_statedict_at(h->scalars, i, &e)) continue; /* in range */
    if (ks_statedict_get(out, e.name, &had) == KS_OK)
      return ks__err_at(h->r->err, KS_E_EXISTS, h->r->dir, e.name, -1, "dcp: a tensor and a scalar have one name");
    ks_status st = ks_statedict_set_entry(out, e.name, &e, KS_COPY, h->r->err);
    if (st) return st;
  }
  return KS_OK;
}

ks_status ks__dcp_hf_load(ks__dcp_rd *r, const ks__jv *index, ks_statedict **out, char **structure, char **info) {
  hf h = {0};
  h.r = r;
  ks_status st = ks_statedict_create(r->a, &h.scalars, r->err);
  if (!st) st = index ? files_of_index(&h, index) : files_of_listing(&h);
  if (!st) unique_files(&h);
  for (size_t i = 0; !st && i < h.nfiles; i++) st = read_file(&h, i);
  if (!st && index) st = check_weight_map(&h, index);
  if (!st) st = make_entries(&h);
  if (!st) st = paths(&h);
  if (!st) {
    r->format = "safetensors";
    st = ks__dcp_check_budget(r);
  }
  if (!st) st = ks__dcp_alloc_tensors(r);
  if (!st) st = read_chunks(&h);
  ks_statedict *sd = NULL;
  char *text = NULL, *doc = NULL;
  if (!st) st = ks__dcp_finish(r, &sd, structure ? &text : NULL, info ? &doc : NULL);
  if (!st) st = add_scalars(&h, sd);
  if (!st && structure && h.structure) { /* the document of what keepsake wrote, not of the nesting made here */
    ks_torch_free(r->a, text);
    if (!(text = ks__strdup(r->a, h.structure))) st = nomem(r->err);
  }
  if (st) {
    ks_statedict_free(sd);
    ks_torch_free(r->a, text);
    ks_torch_free(r->a, doc);
  } else {
    *out = sd;
    if (structure) *structure = text;
    if (info) *info = doc;
  }
  hf_free(&h);
  return st;
}
