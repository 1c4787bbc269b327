/*
 * File images (ks_image): a state laid out in memory exactly as ks_save writes its file, so a
 * staged save copies each tensor once (into the image, or not at all when the caller put it
 * there), hashes it where it lies and writes the file from the image with large aligned writes
 * that bypass the page cache.
 *
 * The layout is computed once, from the names, kinds, dtypes and shapes of the state it was made
 * for, and kept while later states have the same entries. The header is not part of the layout:
 * its scalars and metadata change from one save to the next, and with them its length, so it is
 * rendered at every save into the room the layout leaves before the data. The data starts right
 * after the header (the file's own offsets, which direct I/O needs to share the memory's
 * alignment), so a header of another length moves the data: the one memmove of a save whose
 * header changed length, never a copy of the caller's tensors through a second buffer.
 *
 * Memory: the caller's (opts.buf: page-locked memory that device tensors are copied into), the
 * image's own (allocated and touched at creation, grown when a state outgrows it), or none (a
 * layout only). A background save writing from the image registers itself (ks_image_set_writer,
 * binding.h), and every call that lets the caller write into the image, or frees it, first waits
 * for that save.
 */
#include <string.h>

#include "core/durable.h"
#include "core/pcopy.h"
#include "format/fmt_internal.h"

/* Room a layout leaves for a header that grows (a counter gains a digit, a metric a record). */
#define HEADROOM ((size_t)1 << 20)
#define ALIGN ((size_t)KS_IMAGE_ALIGN)

/* One entry of the layout. */
typedef struct slot {
  char *name;
  ks_value_kind kind;
  ks_dtype dtype;
  int rank;
  int64_t shape[KS_MAX_RANK];
  uint64_t nbytes, off; /* tensors: bytes and offset in the data section */
} slot;

struct ks_image {
  ks_allocator alloc;
  slot *slots;
  size_t n, n_tensors;
  uint64_t *offsets; /* per entry: header_len + off (tensors), UINT64_MAX (scalars) */
  uint64_t data_len;
  size_t header_len; /* the last header laid out: where the data starts now */
  unsigned char *buf, *own_base; /* own_base: the allocation when the memory is the image's */
  size_t buf_size;
  bool layout_only;
  /* The header of the last state staged, with placeholder checksum digits (sum_at: where). */
  ks__sbuf hdr;
  size_t *sum_at;
  uint64_t *sums;
  bool staged;
  /* The background save writing from the image, if any. */
  ks_image_wait_fn wait_fn;
  void *wait_ctx;
};

static size_t align_up(size_t n) { return (n + ALIGN - 1) / ALIGN * ALIGN; }

/* Bytes of memory a header of hlen bytes and dlen of data take, to the aligned end (direct writes
   read up to it); 0 past SIZE_MAX. */
static size_t extent(size_t hlen, uint64_t dlen, size_t extra) {
  if (dlen > SIZE_MAX - hlen - extra - ALIGN) return 0;
  return align_up(hlen + (size_t)dlen + extra);
}

static void slots_free(const ks_allocator *a, slot *v, size_t n) {
  for (size_t i = 0; v && i < n; i++) ks__free(a, v[i].name);
  ks__free(a, v);
}

/* Whether sd has exactly the entries of the layout (names, kinds, dtypes, shapes, in order). */
static bool same_entries(const ks_image *im, const ks_statedict *sd) {
  if (ks_statedict_count(sd) != im->n) return false;
  for (size_t i = 0; i < im->n; i++) {
    ks_entry e;
    const slot *s = &im->slots[i];
    if (ks_statedict_at(sd, i, &e) || e.kind != s->kind || strcmp(e.name, s->name)) return false;
    if (e.kind != KS_VAL_TENSOR) continue;
    if (e.tensor.dtype != s->dtype || e.tensor.rank != s->rank || e.tensor.nbytes != s->nbytes ||
        memcmp(e.tensor.shape, s->shape, (size_t)s->rank * sizeof s->shape[0]))
      return false;
  }
  return true;
}

/* A layout of sd: its entries, each tensor's offset in the data section, the data's length. */
typedef struct layout {
  slot *slots;
  size_t n, n_tensors;
  uint64_t *offsets;
  size_t *sum_at;
  uint64_t *sums;
  uint64_t data_len;
} layout;

static void layout_free(const ks_allocator *a, layout *l) {
  slots_free(a, l->slots, l->n);
  ks__free(a, l->offsets);
  ks__free(a, l->sum_at);
  ks__free(a, l->sums);
  *l = (layout){0};
}

static KS_NODISCARD ks_status layout_make(const ks_allocator *a, const ks_statedict *sd, layout *l, ks_error *err) {
  size_t n = ks_statedict_count(sd), t = 0;
  *l = (layout){0};
  l->slots = ks__calloc(a, n ? n : 1, sizeof *l->slots);
  l->offsets = ks__malloc(a, (n ? n : 1) * sizeof *l->offsets);
  l->sum_at = ks__malloc(a, (n ? n : 1) * sizeof *l->sum_at);
  l->sums = ks__malloc(a, (n ? n : 1) * sizeof *l->sums);
  if (!l->slots || !l->offsets || !l->sum_at || !l->sums) {
    layout_free(a, l);
    return ks__err(err, KS_E_NOMEM, "out of memory");
  }
  uint64_t off = 0;
  for (size_t i = 0; i < n; i++, l->n++) {
    ks_entry e;
    slot *s = &l->slots[i];
    if (ks_statedict_at(sd, i, &e) || !(s->name = ks__strdup(a, e.name))) {
      layout_free(a, l);
      return ks__err(err, KS_E_NOMEM, "out of memory");
    }
    s->kind = e.kind;
    if (e.kind != KS_VAL_TENSOR) continue;
    s->dtype = e.tensor.dtype;
    s->rank = e.tensor.rank;
    memcpy(s->shape, e.tensor.shape, sizeof s->shape);
    s->nbytes = e.tensor.nbytes;
    s->off = off;
    off += e.tensor.nbytes;
    t++;
  }
  l->n_tensors = t;
  l->data_len = off;
  return KS_OK;
}

/* Takes layout l into the image (the old one freed). */
static void layout_adopt(ks_image *im, layout *l) {
  slots_free(&im->alloc, im->slots, im->n);
  ks__free(&im->alloc, im->offsets);
  ks__free(&im->alloc, im->sum_at);
  ks__free(&im->alloc, im->sums);
  im->slots = l->slots;
  im->n = l->n;
  im->n_tensors = l->n_tensors;
  im->offsets = l->offsets;
  im->sum_at = l->sum_at;
  im->sums = l->sums;
  im->data_len = l->data_len;
  *l = (layout){0};
}

static void set_offsets(ks_image *im) {
  for (size_t i = 0; i < im->n; i++)
    im->offsets[i] = im->slots[i].kind == KS_VAL_TENSOR ? im->header_len + im->slots[i].off : UINT64_MAX;
}

/* Own memory of `size` bytes (aligned), pages touched when `touch`; the old is freed. */
static KS_NODISCARD ks_status own_memory(ks_image *im, size_t size, bool touch, ks_error *err) {
  unsigned char *base = size <= SIZE_MAX - ALIGN ? ks__malloc(&im->alloc, size + ALIGN) : NULL;
  if (!base) return ks__err(err, KS_E_NOMEM, "out of memory for an image of %zu bytes", size);
  ks__free(&im->alloc, im->own_base);
  im->own_base = base;
  im->buf = (unsigned char *)(((uintptr_t)base + (ALIGN - 1)) & ~(uintptr_t)(ALIGN - 1));
  im->buf_size = size;
  /* A fresh buffer's first writes fault each page in: done now, not inside a save its caller waits for. */
  if (touch) memset(im->buf, 0, size);
  return KS_OK;
}

ks_status ks_image_create(const ks_statedict *sd, const ks_meta *meta, const ks_image_opts *opts, ks_image **out,
                          ks_error *err) {
  if (!sd || !out) return ks__err(err, KS_E_INVALID, "ks_image_create: state dict and out are required");
  KS__TAKE_OPTS(ks_image_opts, opts, KS__V1_SIZE(ks_image_opts, layout_only), err);
  if (opts->buf && (uintptr_t)opts->buf % ALIGN)
    return ks__err(err, KS_E_INVALID, "ks_image_create: the caller's memory is not %u-byte aligned", KS_IMAGE_ALIGN);
  const ks_allocator *a = ks__alloc_or_default(opts->alloc);
  ks_image *im = ks__calloc(a, 1, sizeof *im);
  if (!im) return ks__err(err, KS_E_NOMEM, "out of memory");
  im->alloc = *a;
  ks__sbuf_init(&im->hdr, &im->alloc);
  im->layout_only = !opts->buf && opts->layout_only;
  layout l;
  ks_status s = layout_make(&im->alloc, sd, &l, err);
  uint64_t dlen = 0;
  if (!s) s = ks__build_header(sd, meta, &im->alloc, &im->hdr, &dlen, l.sum_at, err); /* what ks_save refuses */
  if (!s) {
    layout_adopt(im, &l);
    im->header_len = im->hdr.len;
    set_offsets(im);
  }
  size_t fits = s ? 0 : extent(im->header_len, im->data_len, 0);
  size_t need = s ? 0 : extent(im->header_len, im->data_len, HEADROOM);
  if (!s && !need) s = ks__err(err, KS_E_LIMIT, "a state of %llu bytes cannot be an image",
                               (unsigned long long)im->data_len);
  if (!s && opts->buf && opts->buf_size < fits)
    s = ks__err(err, KS_E_LIMIT, "the image needs %zu bytes of memory (%zu with headroom); the caller's has %zu",
                fits, need, opts->buf_size);
  if (!s && opts->buf) {
    im->buf = opts->buf;
    im->buf_size = opts->buf_size;
  } else if (!s && !im->layout_only) {
    s = own_memory(im, need, true, err);
  }
  layout_free(&im->alloc, &l);
  if (s) {
    ks_image_free(im);
    return s;
  }
  *out = im;
  return KS_OK;
}

void ks_image_free(ks_image *im) {
  if (!im) return;
  if (im->wait_fn) (void)im->wait_fn(im->wait_ctx, 0, NULL); /* never free memory a save writes from */
  slots_free(&im->alloc, im->slots, im->n);
  ks__free(&im->alloc, im->offsets);
  ks__free(&im->alloc, im->sum_at);
  ks__free(&im->alloc, im->sums);
  ks__sbuf_free(&im->hdr);
  ks__free(&im->alloc, im->own_base);
  ks__free(&im->alloc, im);
}

void ks_image_set_writer(ks_image *im, ks_image_wait_fn wait, void *ctx) {
  if (!im || (!wait && ctx && ctx != im->wait_ctx)) return; /* a release by a writer that no longer holds it */
  im->wait_fn = wait;
  im->wait_ctx = wait ? ctx : NULL;
}

/* Waits for the save writing from the image (refusing beside it when its saver says so). */
static KS_NODISCARD ks_status wait_writer(ks_image *im, ks_error *err) {
  if (!im->wait_fn) return KS_OK;
  ks_image_wait_fn fn = im->wait_fn; /* the wait releases the image: read both first */
  void *ctx = im->wait_ctx;
  return fn(ctx, 1, err);
}

/* Where a tensor of the state to stage is, against its place in the image. */
typedef enum where { AT_PLACE, SHIFTED, INSIDE, OUTSIDE } where;

/*
 * Lays the image out for sd and meta: the same entries keep the layout; others get a new one.
 * The header is rendered (placeholder checksums) into `hdr`, its length in *hlen. *relaid: the
 * layout changed; *grow: the memory the image needs now, when its own must grow (0: it fits).
 * *need_out: the memory the state wants, headroom included (also with KS_E_LIMIT).
 * Nothing of the image changes on failure; the new layout is in *l when *relaid.
 */
static KS_NODISCARD ks_status lay_out(ks_image *im, const ks_statedict *sd, const ks_meta *meta, ks__sbuf *hdr,
                                      layout *l, bool *relaid, size_t *grow, size_t *need_out, ks_error *err) {
  *relaid = !same_entries(im, sd);
  *grow = 0;
  *need_out = 0;
  *l = (layout){0};
  ks_status s = *relaid ? layout_make(&im->alloc, sd, l, err) : KS_OK;
  uint64_t dlen = 0;
  if (!s) s = ks__build_header(sd, meta, &im->alloc, hdr, &dlen, *relaid ? l->sum_at : im->sum_at, err);
  if (s) {
    layout_free(&im->alloc, l);
    return s;
  }
  size_t fits = extent(hdr->len, dlen, 0), need = extent(hdr->len, dlen, HEADROOM);
  *need_out = need;
  if (!need) s = ks__err(err, KS_E_LIMIT, "a state of %llu bytes cannot be an image", (unsigned long long)dlen);
  else if (fits > im->buf_size && (im->own_base || im->layout_only)) *grow = need;
  else if (fits > im->buf_size)
    s = ks__err(err, KS_E_LIMIT, "this state needs an image of %zu bytes (%zu with headroom); the caller's memory "
                "holds %zu: make an image with more", fits, need, im->buf_size);
  if (s) layout_free(&im->alloc, l);
  return s;
}

static void fill_info(const ks_image *im, ks_image_info *info, size_t need) {
  ks_image_info in = {.size = info->size, .need = need, .header_len = im->header_len, .data_len = im->data_len,
                      .buf = im->buf, .buf_size = im->buf_size, .count = im->n, .offsets = im->offsets};
  memcpy(info, &in, info->size && info->size < sizeof in ? info->size : sizeof in);
}

ks_status ks_image_get(ks_image *im, const ks_statedict *sd, const ks_meta *meta, ks_image_info *info,
                       ks_error *err) {
  if (!im || !info) return ks__err(err, KS_E_INVALID, "ks_image_get: image and info are required");
  ks_status s = wait_writer(im, err);
  if (s) return s;
  if (!sd) {
    fill_info(im, info, extent(im->header_len, im->data_len, HEADROOM));
    return KS_OK;
  }
  ks__sbuf hdr;
  ks__sbuf_init(&hdr, &im->alloc);
  layout l;
  bool relaid = false;
  size_t grow = 0, need = 0;
  s = lay_out(im, sd, meta, &hdr, &l, &relaid, &grow, &need, err);
  if (s == KS_E_LIMIT) fill_info(im, info, need); /* the caller's memory is too small: how much, the image unchanged */
  /* The memory's contents are the next save's to fill: a new layout or a larger own buffer
     moves nothing; what the caller puts at the new offsets is what a save finds there. */
  if (!s && grow && !im->layout_only) s = own_memory(im, grow, false, err);
  if (!s) {
    if (relaid) layout_adopt(im, &l);
    im->header_len = hdr.len;
    im->staged = false;
    set_offsets(im);
    fill_info(im, info, need);
  }
  layout_free(&im->alloc, &l);
  ks__sbuf_free(&hdr);
  return s;
}

/* Where a tensor of the state to stage lies, against its place (buf + hlen + off) in the image. */
static where classify(const ks_image *im, const ks_entry *e, size_t hlen, uint64_t off, bool shift) {
  uintptr_t p = (uintptr_t)e->tensor.data, lo = (uintptr_t)im->buf, hi = lo + im->buf_size;
  if (!e->tensor.nbytes || p == lo + hlen + off) return AT_PLACE;
  if (shift && p == lo + im->header_len + off) return SHIFTED; /* where the last header put it */
  return p < hi && p + e->tensor.nbytes > lo ? INSIDE : OUTSIDE; /* as addresses: other objects to C */
}

/*
 * The copy plan of a stage: each tensor of sd classified against the image as it is now, and
 * the bytes of those that lie in its memory away from their place, copied aside first (the
 * memory is about to move or be written).
 */
typedef struct plan {
  where *w;
  unsigned char *aside;
  bool any_shifted;
} plan;

static KS_NODISCARD ks_status plan_make(ks_image *im, const ks_statedict *sd, const slot *slots, size_t hlen,
                                        bool shift, plan *p, ks_error *err) {
  size_t n = ks_statedict_count(sd), aside = 0;
  *p = (plan){0};
  if (!(p->w = ks__calloc(&im->alloc, n ? n : 1, sizeof *p->w))) return ks__err(err, KS_E_NOMEM, "out of memory");
  for (size_t i = 0; i < n; i++) {
    ks_entry e;
    p->w[i] = AT_PLACE;
    if (ks_statedict_at(sd, i, &e) || e.kind != KS_VAL_TENSOR) continue;
    p->w[i] = classify(im, &e, hlen, slots[i].off, shift);
    p->any_shifted |= p->w[i] == SHIFTED;
  }
  for (size_t i = 0; i < n; i++) {
    ks_entry e;
    if (ks_statedict_at(sd, i, &e) || e.kind != KS_VAL_TENSOR) continue;
    /* The data section is about to move as a whole: a tensor already at its new place would be
       overwritten by it, so it is copied aside like any other bytes lying in the image. */
    if (p->any_shifted && p->w[i] == AT_PLACE && e.tensor.nbytes) p->w[i] = INSIDE;
    if (p->w[i] == INSIDE) aside += e.tensor.nbytes;
  }
  if (aside && !(p->aside = ks__malloc(&im->alloc, aside))) return ks__err(err, KS_E_NOMEM, "out of memory");
  for (size_t i = 0, at = 0; aside && i < n; i++) {
    ks_entry e;
    if (p->w[i] != INSIDE || ks_statedict_at(sd, i, &e)) continue;
    memcpy(p->aside + at, e.tensor.data, e.tensor.nbytes);
    at += e.tensor.nbytes;
  }
  return KS_OK;
}

static void plan_free(ks_image *im, plan *p) {
  ks__free(&im->alloc, p->w);
  ks__free(&im->alloc, p->aside);
}

/* Every tensor of sd to its place (buf + hlen + off): the plan's copies, then the rest in parallel
   (the caller waits for this copy: every core helps). `old`: the memory before it grew (or buf). */
static KS_NODISCARD ks_status place_all(ks_image *im, const ks_statedict *sd, const slot *slots, size_t hlen,
                                        const plan *p, const unsigned char *old, ks_error *err) {
  size_t n = ks_statedict_count(sd), np = 0, at = 0;
  ks__copy *pieces = ks__calloc(&im->alloc, n ? n : 1, sizeof *pieces);
  if (!pieces) return ks__err(err, KS_E_NOMEM, "out of memory");
  if (p->any_shifted) memmove(im->buf + hlen, old + im->header_len, (size_t)im->data_len);
  for (size_t i = 0; i < n; i++) {
    ks_entry e;
    if (ks_statedict_at(sd, i, &e) || e.kind != KS_VAL_TENSOR || !e.tensor.nbytes) continue;
    unsigned char *dst = im->buf + hlen + slots[i].off;
    if (p->w[i] == INSIDE) {
      memcpy(dst, p->aside + at, e.tensor.nbytes);
      at += e.tensor.nbytes;
    } else if (p->w[i] == OUTSIDE || (p->w[i] == AT_PLACE && old != im->buf)) { /* at its place in the old memory */
      pieces[np++] = (ks__copy){dst, e.tensor.data, e.tensor.nbytes};
    }
  }
  ks__copy_parallel(pieces, np, 0);
  ks__free(&im->alloc, pieces);
  return KS_OK;
}

ks_status ks_image_stage(ks_image *im, const ks_statedict *sd, const ks_meta *meta, ks_error *err) {
  if (!im || !sd) return ks__err(err, KS_E_INVALID, "ks_image_stage: image and state dict are required");
  if (im->layout_only) return ks__err(err, KS_E_STATE, "this image is a layout only: it has no memory to stage into");
  ks_status s = wait_writer(im, err);
  if (s) return s;
  ks__sbuf hdr;
  ks__sbuf_init(&hdr, &im->alloc);
  layout l;
  bool relaid = false;
  size_t grow = 0, need = 0, old_size = im->buf_size;
  plan p = {0};
  s = lay_out(im, sd, meta, &hdr, &l, &relaid, &grow, &need, err);
  const slot *slots = relaid ? l.slots : im->slots;
  bool shift = !relaid && hdr.len != im->header_len; /* the same entries under a header of another length */
  if (!s) s = plan_make(im, sd, slots, hdr.len, shift, &p, err);
  unsigned char *old = im->buf, *old_base = NULL;
  if (!s && grow) { /* its own memory, too small: a larger one; the old stays until the copies are done */
    old_base = im->own_base;
    im->own_base = NULL;
    if ((s = own_memory(im, grow, false, err)) != KS_OK) im->own_base = old_base, old_base = NULL;
  }
  if (!s) s = place_all(im, sd, slots, hdr.len, &p, old, err);
  if (!s) {
    if (relaid) layout_adopt(im, &l);
    ks__sbuf_free(&im->hdr);
    im->hdr = hdr;
    ks__sbuf_init(&hdr, &im->alloc);
    im->header_len = im->hdr.len;
    im->staged = true;
    set_offsets(im);
  } else if (old_base) { /* failed after growing: the new memory goes, the old (and what it holds) stays */
    ks__free(&im->alloc, im->own_base);
    im->own_base = old_base;
    im->buf = old;
    im->buf_size = old_size;
    old_base = NULL;
  }
  ks__free(&im->alloc, old_base);
  plan_free(im, &p);
  layout_free(&im->alloc, &l);
  ks__sbuf_free(&hdr);
  return s;
}

ks_status ks_image_write(ks_image *im, const char *path, const ks_save_opts *opts, ks_error *err) {
  if (!im || !path || !*path) return ks__err(err, KS_E_INVALID, "ks_image_write: image and path are required");
  if (!im->staged) return ks__err(err, KS_E_STATE, "ks_image_write: nothing is staged in the image");
  KS__TAKE_OPTS(ks_save_opts, opts, KS__V1_SIZE(ks_save_opts, io), err);
  size_t k = 0;
  for (size_t i = 0; i < im->n; i++) { /* each tensor hashed where it lies */
    const slot *sl = &im->slots[i];
    if (sl->kind != KS_VAL_TENSOR) continue;
    im->sums[k] = ks_checksum(im->buf + im->header_len + sl->off, (size_t)sl->nbytes);
    ks__put_sum_digits(im->hdr.p + im->sum_at[k], im->sums[k]);
    k++;
  }
  memcpy(im->buf, im->hdr.p, im->header_len);
  ks__durable out;
  ks_status s = ks__durable_prepare(&out, path, opts->io, opts->alloc, err);
  if (!s) s = ks__durable_open(&out);
  if (!s) s = ks__durable_write_image(&out, im->buf, im->header_len + (size_t)im->data_len);
  if (!s) s = ks__durable_commit(&out);
  if (s) ks__err_set_file(err, path);
  ks__durable_abort(&out);
  return s;
}
