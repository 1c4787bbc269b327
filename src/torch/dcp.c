/*
 * ks_torch_dcp_load: a torch.distributed.checkpoint directory written by
 * torch's FileSystemWriter (SerializationFormat.TORCH_SAVE) as one flat state
 * dict. The `.metadata` is parsed by dcp_meta.c; then, before any data is read,
 * every item the entries use is held against its file's size (and must not
 * overlap another), the tensors' bytes against a budget relative to the input's
 * size, and the chunks of each tensor must cover it exactly once. Items are
 * then read file by file, each a byte range through the table's ranged read
 * (never mapped): a tensor chunk is a torch.save archive of one tensor, copied
 * into its place in the whole tensor; an object is a torch.save archive of any
 * value, kept when it is plain data (None, bool, int, float, str, bytes,
 * tensors and lists, tuples, sets and dicts of them) and reported otherwise.
 * The values are put back into the nesting planner_data records, and
 * flattened like a torch.save file of that state dict.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/hindex.h"
#include "core/io_ops.h"
#include "core/fmap.h"
#include "core/json.h"
#include "torch/dcp_internal.h"

#define DEFAULT_SLACK ((uint64_t)64 << 20)

typedef ks__dcp_rd rd;

static KS_NODISCARD ks_status nomem(ks_error *err) { return ks__err(err, KS_E_NOMEM, "dcp: out of memory"); }

ks_status ks__dcp_set_path(rd *r, const char *name) {
  int n = snprintf(r->path, sizeof r->path, "%s/%s", r->dir, name);
  if (n < 0 || (size_t)n >= sizeof r->path)
    return ks__err_at(r->err, KS_E_LIMIT, r->dir, NULL, -1, "dcp: path of '%s' longer than %d bytes", name,
                      KS__DCP_PATH_CAP - 1);
  return KS_OK;
}

static KS_NODISCARD ks_status set_path(rd *r, const char *name) { return ks__dcp_set_path(r, name); }

static KS_NODISCARD ks_status io_fail(rd *r, const char *what, int e) {
  return ks__err_at(r->err, KS_E_IO, r->path, NULL, -1, "dcp: cannot %s: %s", what, strerror(e));
}

static KS_NODISCARD ks_status open_file(rd *r, int *fd, uint64_t *size) {
  int e = r->io->open_fn(r->io->ctx, r->path, fd, size);
  return e ? io_fail(r, "open", e) : KS_OK;
}

/* len bytes at off; a short read means the file is shorter than the metadata says. */
static KS_NODISCARD ks_status read_at(rd *r, int fd, uint8_t *buf, size_t len, uint64_t off) {
  size_t done = 0;
  while (done < len) {
    size_t got = 0;
    int e = r->io->read_fn(r->io->ctx, fd, buf + done, len - done, off + done, &got);
    if (e) return io_fail(r, "read", e);
    if (got == 0)
      return ks__err_at(r->err, KS_E_FORMAT, r->path, NULL, (int64_t)(off + done),
                        "dcp: file ends %zu bytes before the item does", len - done);
    done += got;
  }
  return KS_OK;
}

/* ---- the .metadata ---- */

static KS_NODISCARD ks_status read_metadata(rd *r) {
  int fd;
  uint64_t size;
  ks_status st = set_path(r, ".metadata");
  if (!st) st = open_file(r, &fd, &size);
  if (st) return st;
  uint8_t *buf = NULL;
  if (size > KS__DCP_MAX_METADATA || size > SIZE_MAX)
    st = ks__err_at(r->err, KS_E_LIMIT, r->path, NULL, -1, "dcp: .metadata of %llu bytes is larger than %llu",
                    (unsigned long long)size, (unsigned long long)KS__DCP_MAX_METADATA);
  else if (!(buf = ks__malloc(r->a, size ? (size_t)size : 1)))
    st = nomem(r->err);
  else
    st = read_at(r, fd, buf, (size_t)size, 0);
  r->io->close_fn(r->io->ctx, fd);
  if (!st) {
    ks__pk_limits lim;
    ks__pk_limits_from_opts(r->opts, (size_t)size, &lim);
    if (!lim.max_entries) lim.max_entries = (size_t)size * 8 + 4096;
    st = ks__dcp_parse(buf, (size_t)size, r->ar, &lim, &r->d, r->err);
    if (st) ks__err_set_file(r->err, r->path);
  }
  ks__free(r->a, buf);
  r->input_bytes = size;
  return st;
}

/* ---- the items: sizes, overlaps, budget, coverage ---- */

static const ks__dcp_item *item_at(const rd *r, size_t i) { return &r->d.items[r->order[i]]; }

static int cmp_place(const ks__dcp_item *a, const ks__dcp_item *b) {
  int c = strcmp(a->file, b->file);
  if (c) return c;
  return (a->offset > b->offset) - (a->offset < b->offset);
}

/* qsort of indices into the items: each index carries its items array through the pair below. */
typedef struct place {
  const ks__dcp_item *it;
  size_t index;
} place;

static int cmp_place_v(const void *a, const void *b) {
  return cmp_place(((const place *)a)->it, ((const place *)b)->it);
}

static KS_NODISCARD ks_status sort_used(rd *r) {
  size_t n = 0, bytes;
  for (size_t i = 0; i < r->d.nitems; i++) n += r->d.items[i].used;
  place *p = ks__mul_size(n ? n : 1, sizeof *p, &bytes) ? ks__malloc(r->a, bytes) : NULL;
  r->order = ks__mul_size(n ? n : 1, sizeof *r->order, &bytes) ? ks__malloc(r->a, bytes) : NULL;
  if (!p || !r->order) {
    ks__free(r->a, p);
    return nomem(r->err);
  }
  for (size_t i = 0, j = 0; i < r->d.nitems; i++)
    if (r->d.items[i].used) p[j++] = (place){&r->d.items[i], i};
  qsort(p, n, sizeof *p, cmp_place_v);
  for (size_t i = 0; i < n; i++) r->order[i] = p[i].index;
  r->norder = n;
  ks__free(r->a, p);
  return KS_OK;
}

/* Nonzero when bytes look like a safetensors file (u64 header length, then '{'). */
static int looks_safetensors(const uint8_t *p, size_t n) { return n >= 9 && p[8] == '{' && !p[6] && !p[7]; }

static KS_NODISCARD ks_status refuse_safetensors(rd *r, const char *fqn) {
  return ks__err_at(r->err, KS_E_UNSUPPORTED, r->path, fqn, -1,
                    "dcp: this checkpoint was written with SerializationFormat.SAFETENSORS, which is not read "
                    "(only the default TORCH_SAVE format is)");
}

/* Items of one file must lie inside it and not overlap (each item is read once, as its own archive). */
static KS_NODISCARD ks_status check_file(rd *r, size_t first, size_t end, uint64_t size, int fd) {
  uint64_t prev_end = 0;
  for (size_t i = first; i < end; i++) {
    const ks__dcp_item *it = item_at(r, i);
    uint64_t stop;
    if (!ks__add_u64(it->offset, it->length, &stop) || stop > size)
      return ks__err_at(r->err, KS_E_FORMAT, r->path, it->fqn, (int64_t)it->offset,
                        "dcp: item of %llu bytes at %llu passes the end of the file (%llu bytes)",
                        (unsigned long long)it->length, (unsigned long long)it->offset, (unsigned long long)size);
    if (i > first && it->offset < prev_end) {
      uint8_t head[9];
      if (it->length >= sizeof head && read_at(r, fd, head, sizeof head, it->offset) == KS_OK &&
          looks_safetensors(head, sizeof head))
        return refuse_safetensors(r, it->fqn);
      return ks__err_at(r->err, KS_E_FORMAT, r->path, it->fqn, (int64_t)it->offset,
                        "dcp: item at %llu overlaps the one before it", (unsigned long long)it->offset);
    }
    prev_end = stop;
  }
  return KS_OK;
}

static KS_NODISCARD ks_status check_files(rd *r) {
  for (size_t i = 0; i < r->norder;) {
    size_t end = i + 1;
    while (end < r->norder && !strcmp(item_at(r, end)->file, item_at(r, i)->file)) end++;
    int fd;
    uint64_t size;
    ks_status st = set_path(r, item_at(r, i)->file);
    if (!st) st = open_file(r, &fd, &size);
    if (st) return st;
    st = check_file(r, i, end, size, fd);
    r->io->close_fn(r->io->ctx, fd);
    if (st) return st;
    if (!ks__add_u64(r->input_bytes, size, &r->input_bytes)) r->input_bytes = UINT64_MAX;
    r->nfiles++;
    i = end;
  }
  return KS_OK;
}

ks_status ks__dcp_check_budget(rd *r) {
  const ks_torch_read_opts *o = r->opts;
  uint64_t n = r->input_bytes;
  r->budget = o && o->max_output_bytes ? o->max_output_bytes
              : n > (UINT64_MAX - DEFAULT_SLACK) / 4 ? UINT64_MAX
                                                      : 4 * n + DEFAULT_SLACK;
  for (size_t i = 0; i < r->d.nentries; i++) {
    const ks__dcp_entry *e = &r->d.entries[i];
    size_t bytes;
    if (!e->tensor) continue;
    if (ks_shape_size(e->dtype, e->rank, e->shape, NULL, &bytes) || bytes > r->budget - r->tensor_bytes)
      return ks__err_at(r->err, KS_E_LIMIT, r->dir, e->fqn, -1,
                        "dcp: the tensors would take more than %llu bytes (the budget for %llu bytes of input)",
                        (unsigned long long)r->budget, (unsigned long long)n);
    r->tensor_bytes += bytes;
  }
  return KS_OK;
}

typedef struct cover {
  uint64_t *bits;
} cover;

/* Marks elements start .. start+len-1; nonzero when one was marked already. */
static int mark_row(void *ctx, uint64_t start, uint64_t row, uint64_t len) {
  (void)row;
  uint64_t *bits = ((cover *)ctx)->bits;
  while (len) {
    uint64_t w = start >> 6, b = start & 63, take = 64 - b < len ? 64 - b : len;
    uint64_t mask = (take == 64 ? ~(uint64_t)0 : (((uint64_t)1 << take) - 1)) << b;
    if (bits[w] & mask) return 1;
    bits[w] |= mask;
    start += take;
    len -= take;
  }
  return 0;
}

/* The volumes add up (dcp_meta.c); with no two chunks sharing an element they cover the tensor exactly once. */
static KS_NODISCARD ks_status check_cover(rd *r, const ks__dcp_entry *e) {
  uint64_t numel = 0;
  if (e->nchunks < 2 || !ks__dcp_volume(e->rank, e->shape, &numel) || numel == 0) return KS_OK;
  size_t words = (size_t)(numel / 64 + 1); /* numel is within the budget, so this fits */
  cover c = {ks__calloc(r->a, words, sizeof *c.bits)};
  if (!c.bits) return nomem(r->err);
  ks_status st = KS_OK;
  for (size_t j = 0; j < e->nchunks && !st; j++) {
    const ks__dcp_chunk *k = &r->d.chunks[e->chunk0 + j];
    if (ks__dcp_for_rows(e->rank, e->shape, k->off, k->size, mark_row, &c))
      st = ks__err_at(r->err, KS_E_FORMAT, r->dir, e->fqn, -1,
                      "dcp: chunk %zu overlaps another chunk of the tensor: they do not cover it exactly once", j);
  }
  ks__free(r->a, c.bits);
  return st;
}

/* Every tensor's whole buffer, owned by the arena (and so by the state dict). */
ks_status ks__dcp_alloc_tensors(rd *r) {
  for (size_t i = 0; i < r->d.nentries; i++) {
    ks__dcp_entry *e = &r->d.entries[i];
    if (!e->tensor) continue;
    ks_status st = check_cover(r, e);
    if (st) return st;
    ks__pk_node *n = ks__pk_new_tensor(r->ar);
    if (!n) return nomem(r->err);
    size_t bytes = 0;
    if ((st = ks_shape_size(e->dtype, e->rank, e->shape, NULL, &bytes)) != KS_OK) return ks__err(r->err, st, "dcp");
    void *data = bytes ? ks__pk_buffer(r->ar, bytes) : NULL;
    if (bytes && !data) return nomem(r->err);
    r->ar->buf_bytes -= bytes; /* the budget of views materialised by objects counts their own bytes only */
    if ((st = ks_tensor_init(n->u.t, e->dtype, e->rank, e->shape, data)) != KS_OK) return ks__err(r->err, st, "dcp");
    n->u.t->ownership = KS_OWNED; /* arena memory: the flattened dict views it and keeps the arena */
    e->value = n;
  }
  return KS_OK;
}

/* ---- reading one item ---- */

typedef struct storage_ctx {
  const ks__zip *zip;
  int verify;
} storage_ctx;

static KS_NODISCARD ks_status read_storage(void *ctx, const char *key, const uint8_t **data, size_t *len,
                                           ks_error *err) {
  const storage_ctx *sc = ctx;
  return ks__zip_read(sc->zip, key, sc->verify, data, len, err);
}

/* The item's torch.save archive, and its data.pkl run in ar. */
static KS_NODISCARD ks_status run_item(rd *r, const ks__dcp_item *it, const uint8_t *buf, size_t len,
                                       ks__pk_arena *ar, const ks__pk_limits *lim, ks__zip **z, ks__pk_node **root) {
  int verify = r->opts && r->opts->verify_crc;
  ks_torch_kind kind = ks__torch_sniff(buf, len);
  if (kind == KS_TORCH_LEGACY)
    return ks__err_at(r->err, KS_E_UNSUPPORTED, r->path, it->fqn, (int64_t)it->offset,
                      "dcp: item in torch's legacy (non-zip) format");
  if (kind != KS_TORCH_ZIP)
    return looks_safetensors(buf, len) ? refuse_safetensors(r, it->fqn)
                                       : ks__err_at(r->err, KS_E_FORMAT, r->path, it->fqn, (int64_t)it->offset,
                                                    "dcp: the item at %llu is not a torch.save archive",
                                                    (unsigned long long)it->offset);
  const uint8_t *p = NULL;
  size_t n = 0;
  ks_status st = ks__zip_open_buffer(buf, len, r->a, z, r->err);
  if (!st && ks__zip_read(*z, "byteorder", 0, &p, &n, NULL) == KS_OK && n >= 3 && !memcmp(p, "big", 3))
    st = ks__err(r->err, KS_E_UNSUPPORTED, "dcp: big-endian torch.save archive (byteorder 'big')");
  if (!st) st = ks__zip_read(*z, "data.pkl", verify, &p, &n, r->err);
  storage_ctx sc = {*z, verify};
  if (!st) st = ks__pk_run(p, n, ar, lim, read_storage, &sc, root, r->err);
  if (st) {
    ks__err_set_file(r->err, r->path);
    ks__err_set_key(r->err, it->fqn);
  }
  return st;
}

typedef struct copy_ctx {
  uint8_t *dst;
  const uint8_t *src;
  size_t esize;
} copy_ctx;

static int copy_row(void *ctx, uint64_t start, uint64_t row, uint64_t len) {
  const copy_ctx *c = ctx;
  memcpy(c->dst + start * c->esize, c->src + row * len * c->esize, (size_t)(len * c->esize));
  return 0;
}

void ks__dcp_copy_chunk(const ks__dcp_entry *e, const ks__dcp_chunk *k, const uint8_t *src) {
  copy_ctx c = {e->value->u.t->data, src, ks_dtype_size(e->dtype)};
  int never = ks__dcp_for_rows(e->rank, e->shape, k->off, k->size, copy_row, &c); /* copy_row never stops it */
  (void)never;
}

static KS_NODISCARD ks_status read_chunk(rd *r, const ks__dcp_item *it, const uint8_t *buf, size_t len) {
  const ks__dcp_entry *e = &r->d.entries[it->entry];
  const ks__dcp_chunk *k = &r->d.chunks[it->chunk];
  ks__pk_arena tmp;
  ks__pk_arena_init(&tmp, r->a);
  ks__pk_limits lim;
  ks__pk_limits_from_opts(r->opts, len, &lim);
  if (!lim.max_entries) lim.max_entries = len * 8 + 4096;
  ks__zip *z = NULL;
  ks__pk_node *root = NULL;
  ks_status st = run_item(r, it, buf, len, &tmp, &lim, &z, &root);
  const ks_tensor *t = !st && root->kind == PK_TENSOR ? root->u.t : NULL;
  if (!st && !t)
    st = ks__err_at(r->err, KS_E_FORMAT, r->path, e->fqn, (int64_t)it->offset,
                    "dcp: the chunk's archive holds a %s, not a tensor", ks__pk_kind_name(root->kind));
  if (!st && t->dtype != e->dtype)
    st = ks__err_at(r->err, KS_E_DTYPE, r->path, e->fqn, (int64_t)it->offset,
                    "dcp: chunk of dtype %s in a tensor of dtype %s", ks_dtype_name(t->dtype),
                    ks_dtype_name(e->dtype));
  if (!st && (t->rank != e->rank || (e->rank && memcmp(t->shape, k->size, (size_t)e->rank * sizeof *k->size))))
    st = ks__err_at(r->err, KS_E_SHAPE, r->path, e->fqn, (int64_t)it->offset,
                    "dcp: the chunk's tensor does not have the chunk's sizes");
  if (!st) ks__dcp_copy_chunk(e, k, t->data);
  ks__pk_arena_release(&tmp);
  ks__zip_free(z);
  return st;
}

/* Why a value is not plain data (NULL when it is). Bounded by depth and by the containers visited. */
static const char *not_plain(const ks__pk_node *n, size_t depth, size_t *visits, char *buf, size_t cap) {
  if (depth > KS__TORCH_MAX_DEPTH || !(*visits)--) return "nested too deep, or shared too often";
  switch (n->kind) {
    case PK_NONE: case PK_BOOL: case PK_INT: case PK_FLOAT: case PK_STR: case PK_BYTES: case PK_TENSOR: return NULL;
    case PK_BIGINT: return n->u.s.p ? NULL : "an integer of more than 4096 bytes";
    case PK_OBJECT:
      if (n->u.obj->cls && n->u.obj->cls->kind == PK_GLOBAL) {
        snprintf(buf, cap, "an object of class %.200s.%.200s", n->u.obj->cls->u.g.module, n->u.obj->cls->u.g.name);
        return buf;
      }
      return "an object";
    case PK_GLOBAL:
      snprintf(buf, cap, "a reference to %.200s.%.200s", n->u.g.module, n->u.g.name);
      return buf;
    case PK_STORAGE: return "a bare storage";
    case PK_NPDTYPE: return "a numpy dtype";
    default: break;
  }
  for (size_t i = 0; i < n->u.seq.n; i++) {
    const ks__pk_node *v = n->u.seq.v[i];
    if (n->kind == PK_DICT && i % 2 == 0 && v->kind != PK_STR && v->kind != PK_INT && v->kind != PK_BOOL &&
        v->kind != PK_NONE && v->kind != PK_FLOAT)
      return "a dict with keys that cannot name entries";
    const char *why = not_plain(v, depth + 1, visits, buf, cap);
    if (why) return why;
  }
  return NULL;
}

const char *ks__dcp_not_plain(const ks__pk_node *n, size_t max_visits, char *buf, size_t cap) {
  return not_plain(n, 0, &max_visits, buf, cap);
}

static KS_NODISCARD ks_status read_object(rd *r, const ks__dcp_item *it, const uint8_t *buf, size_t len) {
  ks__dcp_entry *e = &r->d.entries[it->entry];
  ks__pk_limits lim;
  ks__pk_limits_from_opts(r->opts, len, &lim);
  if (!lim.max_entries) lim.max_entries = len * 8 + 4096;
  lim.max_view_bytes = r->budget; /* one budget for the views all objects materialise */
  ks__zip *z = NULL;
  ks__pk_node *root = NULL;
  ks_status st = run_item(r, it, buf, len, r->ar, &lim, &z, &root);
  ks__zip_free(z);
  if (st) return st;
  char why[512];
  size_t visits = lim.max_entries;
  const char *reason = not_plain(root, 0, &visits, why, sizeof why);
  r->nobjects++;
  if (!reason) {
    e->value = root;
    return KS_OK;
  }
  ks__pk_node *s = ks__pk_new_str(r->ar, PK_STR, reason, strlen(reason));
  if (!s) return nomem(r->err);
  e->skipped = s->u.s.p;
  r->nskipped++;
  return KS_OK;
}

static KS_NODISCARD ks_status read_file_items(rd *r, size_t first, size_t end) {
  int fd;
  uint64_t size;
  ks_status st = set_path(r, item_at(r, first)->file);
  if (!st) st = open_file(r, &fd, &size);
  if (st) return st;
  for (size_t i = first; i < end && !st; i++) {
    const ks__dcp_item *it = item_at(r, i);
    const ks__dcp_entry *e = &r->d.entries[it->entry];
    if (it->offset + it->length > size) { /* checked before: the file changed since */
      st = ks__err_at(r->err, KS_E_IO, r->path, it->fqn, -1, "dcp: the file shrank while it was read");
      break;
    }
    size_t len = (size_t)it->length; /* within the file's size, which fit in memory's address space when checked */
    uint8_t *buf = e->tensor ? ks__malloc(r->a, len ? len : 1) : ks__pk_buffer(r->ar, len);
    if (!buf) st = nomem(r->err);
    if (!st) st = read_at(r, fd, buf, len, it->offset);
    if (!st) st = e->tensor ? read_chunk(r, it, buf, len) : read_object(r, it, buf, len);
    if (e->tensor) ks__free(r->a, buf);
  }
  r->io->close_fn(r->io->ctx, fd);
  return st;
}

static KS_NODISCARD ks_status read_items(rd *r) {
  for (size_t i = 0; i < r->norder;) {
    size_t end = i + 1;
    while (end < r->norder && !strcmp(item_at(r, end)->file, item_at(r, i)->file)) end++;
    if (item_at(r, i)->length > SIZE_MAX) return ks__err(r->err, KS_E_LIMIT, "dcp: item larger than memory");
    ks_status st = read_file_items(r, i, end);
    if (st) return st;
    i = end;
  }
  return KS_OK;
}

/* ---- the nesting: planner_data's paths, as the state dict was before DCP flattened it ---- */

typedef struct slot {
  size_t key_off, key_len; /* in tree.keys: 8 bytes of the parent's slot, then 's' or 'i' and the component */
  uint64_t hash;
  ks__pk_node *node;
} slot;

typedef struct tree {
  rd *r;
  slot *slots;
  size_t n, cap;
  ks__hindex ix;
  ks__sbuf keys;
  ks__sbuf key; /* the key being looked up */
} tree;

static uint64_t slot_hash(const void *ctx, size_t i) { return ((const tree *)ctx)->slots[i].hash; }
static const char *slot_key(const void *ctx, size_t i, size_t *len) {
  const tree *t = ctx;
  *len = t->slots[i].key_len;
  return t->keys.p + t->slots[i].key_off;
}
static const ks__hindex_ops slot_ops = {slot_hash, slot_key};

#define CONFLICT KS_E_EXISTS /* the paths do not make one tree: fall back to names by fqn */

static void make_key(tree *t, size_t parent, const ks__pk_node *comp) {
  char num[24];
  t->key.len = 0;
  t->key.failed = false;
  ks__sbuf_put(&t->key, &parent, sizeof parent);
  if (comp->kind == PK_STR) {
    ks__sbuf_putc(&t->key, 's');
    ks__sbuf_put(&t->key, comp->u.s.p, comp->u.s.n);
  } else {
    ks__sbuf_putc(&t->key, 'i');
    ks__sbuf_put(&t->key, num, (size_t)snprintf(num, sizeof num, "%lld", (long long)comp->u.i));
  }
}

static KS_NODISCARD ks_status add_slot(tree *t, ks__pk_node *node) {
  ks_status st = ks__grow(t->r->a, &t->slots, &t->cap, t->n + 1, sizeof *t->slots);
  if (!st) st = ks__hindex_reserve(&t->ix, t->r->a, t->n + 1, t->n, &slot_ops, t);
  if (st) return nomem(t->r->err);
  slot *s = &t->slots[t->n];
  s->key_off = t->keys.len;
  s->key_len = t->key.len;
  s->hash = ks__hash(t->key.p, t->key.len);
  s->node = node;
  ks__sbuf_put(&t->keys, t->key.p, t->key.len);
  if (t->keys.failed) return nomem(t->r->err);
  ks__hindex_insert(&t->ix, t->n, s->hash);
  t->n++;
  return KS_OK;
}

/* Puts v at comp in container c (a dict: a new key; a list: index comp, None filling any gap before it). */
static KS_NODISCARD ks_status attach(tree *t, ks__pk_node *c, const ks__pk_node *comp, ks__pk_node *v) {
  ks__pk_arena *ar = t->r->ar;
  if (c->kind == PK_DICT) {
    if (!ks__pk_push(ar, &c->u.seq, (ks__pk_node *)(uintptr_t)comp) || !ks__pk_push(ar, &c->u.seq, v))
      return nomem(t->r->err);
    return KS_OK;
  }
  size_t idx = (size_t)comp->u.i;
  if (idx < c->u.seq.n) {
    if (c->u.seq.v[idx]->kind != PK_NONE) return CONFLICT;
    c->u.seq.v[idx] = v;
    return KS_OK;
  }
  while (c->u.seq.n < idx) {
    ks__pk_node *none = ks__pk_new(ar, PK_NONE);
    if (!none || !ks__pk_push(ar, &c->u.seq, none)) return nomem(t->r->err);
  }
  return ks__pk_push(ar, &c->u.seq, v) ? KS_OK : nomem(t->r->err);
}

static KS_NODISCARD ks_status insert(tree *t, const ks__pk_node *const *comps, size_t ncomp, ks__pk_node *value) {
  size_t cur = 0; /* slot 0: the root dict */
  for (size_t i = 0; i < ncomp; i++) {
    const ks__pk_node *comp = comps[i];
    ks__pk_node *c = t->slots[cur].node;
    if ((comp->kind == PK_STR) != (c->kind == PK_DICT) ||
        (comp->kind == PK_INT && comp->u.i > (int64_t)t->r->d.nentries))
      return CONFLICT;
    make_key(t, cur, comp);
    if (t->key.failed) return nomem(t->r->err);
    long hit = ks__hindex_find(&t->ix, t->key.p, t->key.len, ks__hash(t->key.p, t->key.len), &slot_ops, t);
    if (hit >= 0) {
      ks__pk_node *child = t->slots[hit].node;
      if (i + 1 == ncomp || (child->kind != PK_DICT && child->kind != PK_LIST)) return CONFLICT;
      cur = (size_t)hit;
      continue;
    }
    ks__pk_node *v = i + 1 == ncomp ? value : ks__pk_new(t->r->ar, comps[i + 1]->kind == PK_STR ? PK_DICT : PK_LIST);
    if (!v) return nomem(t->r->err);
    ks_status st = attach(t, c, comp, v);
    if (!st) st = add_slot(t, v);
    if (st) return st;
    cur = t->n - 1;
  }
  return KS_OK;
}

/* planner_data's path of e, when it is (str, (str | int)...) joining with '.' to the fqn. */
static size_t path_of(const ks__dcp_entry *e, const ks__pk_node *const **comps) {
  const ks__pk_node *p = e->path;
  if (!p || (p->kind != PK_TUPLE && p->kind != PK_LIST) || !p->u.seq.n || p->u.seq.n > KS__TORCH_MAX_DEPTH) return 0;
  const char *f = e->fqn;
  for (size_t i = 0; i < p->u.seq.n; i++) {
    const ks__pk_node *c = p->u.seq.v[i];
    char num[24];
    const char *s = num;
    size_t n;
    if (c->kind == PK_STR) s = c->u.s.p, n = c->u.s.n;
    else if (c->kind == PK_INT && c->u.i >= 0 && i > 0)
      n = (size_t)snprintf(num, sizeof num, "%lld", (long long)c->u.i);
    else return 0;
    if (strncmp(f, s, n) || memchr(s, 0, n)) return 0;
    f += n;
    if (i + 1 < p->u.seq.n && *f++ != '.') return 0;
  }
  if (*f) return 0;
  *comps = (const ks__pk_node *const *)p->u.seq.v;
  return p->u.seq.n;
}

static KS_NODISCARD ks_status build(tree *t, bool by_path, ks__pk_node **root) {
  rd *r = t->r;
  t->n = 0;
  ks__hindex_free(&t->ix, r->a);
  t->keys.len = 0;
  ks__pk_node *top = ks__pk_new(r->ar, PK_DICT);
  if (!top) return nomem(r->err);
  t->key.len = 0;
  ks_status st = add_slot(t, top);
  for (size_t i = 0; i < r->d.nentries && !st; i++) {
    ks__dcp_entry *e = &r->d.entries[i];
    if (!e->value) continue;
    const ks__pk_node *const *comps = NULL;
    size_t n = by_path ? path_of(e, &comps) : 0;
    if (by_path && !n) return CONFLICT;
    ks__pk_node *name = NULL;
    if (!n && !(name = ks__pk_new_str(r->ar, PK_STR, e->fqn, strlen(e->fqn)))) return nomem(r->err);
    st = n ? insert(t, comps, n, e->value) : insert(t, (const ks__pk_node *const *)&name, 1, e->value);
  }
  if (!st) *root = top;
  return st;
}

static KS_NODISCARD ks_status nest(rd *r, ks__pk_node **root) {
  tree t = {0};
  t.r = r;
  ks__sbuf_init(&t.keys, r->a);
  ks__sbuf_init(&t.key, r->a);
  ks_status st = build(&t, true, root);
  if (st == CONFLICT) st = build(&t, false, root);
  if (st == CONFLICT) /* two entries of one fqn */
    st = ks__err_at(r->err, KS_E_EXISTS, r->dir, NULL, -1, "dcp: state_dict_metadata names one entry twice");
  ks__hindex_free(&t.ix, r->a);
  ks__free(r->a, t.slots);
  ks__sbuf_free(&t.keys);
  ks__sbuf_free(&t.key);
  return st;
}

/* ---- what was read: the info document ---- */

static KS_NODISCARD ks_status describe(rd *r, char **out) {
  ks__sbuf b;
  ks__sbuf_init(&b, r->a);
  size_t tensors = 0;
  for (size_t i = 0; i < r->d.nentries; i++) tensors += r->d.entries[i].tensor;
  ks__sbuf_puts(&b, "{\"format\":");
  const char *format = r->format ? r->format : "torch.distributed.checkpoint";
  ks__sbuf_put_json_str(&b, format, strlen(format));
  ks__sbuf_puts(&b, ",\"version\":");
  if (r->d.version) ks__sbuf_put_json_str(&b, r->d.version, strlen(r->d.version));
  else ks__sbuf_puts(&b, "null");
  ks__sbuf_puts(&b, ",\"tensors\":");
  ks__sbuf_put_u64(&b, tensors);
  ks__sbuf_puts(&b, ",\"chunks\":");
  ks__sbuf_put_u64(&b, r->d.nchunks);
  ks__sbuf_puts(&b, ",\"objects\":");
  ks__sbuf_put_u64(&b, r->nobjects);
  ks__sbuf_puts(&b, ",\"files\":");
  ks__sbuf_put_u64(&b, r->nfiles);
  ks__sbuf_puts(&b, ",\"checksummed\":");
  ks__sbuf_put_u64(&b, r->nchecksummed);
  ks__sbuf_puts(&b, ",\"skipped\":{");
  for (size_t i = 0, k = 0; i < r->d.nentries; i++) {
    const ks__dcp_entry *e = &r->d.entries[i];
    if (!e->skipped) continue;
    if (k++) ks__sbuf_putc(&b, ',');
    ks__sbuf_put_json_str(&b, e->fqn, strlen(e->fqn));
    ks__sbuf_putc(&b, ':');
    ks__sbuf_put_json_str(&b, e->skipped, strlen(e->skipped));
  }
  ks__sbuf_puts(&b, "}}");
  ks__sbuf_putc(&b, 0);
  if (b.failed) {
    ks__sbuf_free(&b);
    return nomem(r->err);
  }
  *out = b.p;
  return KS_OK;
}

/* ---- public ---- */

static void release_arena(void *p) {
  ks__pk_arena *ar = p;
  ks_allocator a = ar->alloc;
  ks__pk_arena_release(ar);
  ks__free(&a, ar);
}

ks_status ks__dcp_finish(rd *r, ks_statedict **out, char **structure, char **info) {
  ks__pk_node *root = NULL;
  ks_statedict *sd = NULL;
  ks__structure *shape = NULL;
  char *text = NULL, *doc = NULL;
  ks__pk_limits lim;
  ks__pk_limits_from_opts(r->opts, (size_t)(r->input_bytes > SIZE_MAX ? SIZE_MAX : r->input_bytes), &lim);
  uint64_t entries = r->input_bytes * 8 + 4096 + r->d.nentries;
  if (!lim.max_entries) lim.max_entries = entries > SIZE_MAX ? SIZE_MAX : (size_t)entries;
  lim.max_output_bytes = r->budget > UINT64_MAX / 2 ? UINT64_MAX : 2 * r->budget; /* tensors <= budget, and names */
  ks_status st = nest(r, &root);
  if (!st && (st = ks_statedict_create(r->a, &sd, r->err)) != KS_OK) st = nomem(r->err);
  if (!st && structure) st = ks__structure_create(&shape, r->err);
  if (!st) st = ks__pk_flatten_structured(root, &lim, sd, shape, r->err);
  if (!st && shape) st = ks__structure_dump(shape, r->a, &text, r->err);
  if (!st && info) st = describe(r, &doc);
  ks__structure_free(shape);
  if (!st && (st = ks__statedict_attach(sd, r->ar, release_arena, r->err)) != KS_OK) st = nomem(r->err);
  if (st) {
    ks__free(r->a, text);
    ks__free(r->a, doc);
    ks_statedict_free(sd);
    return st;
  }
  r->ar = NULL; /* the dict owns it now */
  *out = sd;
  if (structure) *structure = text;
  if (info) *info = doc;
  return KS_OK;
}

/* ---- which layout ---- */

#define INDEX_NAME "model.safetensors.index.json" /* keepsake's sharded index, or a Hugging Face one */

/* 1: dir/name can be opened, 0: it does not exist, else the error (set). */
static int exists(rd *r, const char *name, ks_status *st) {
  int fd;
  uint64_t size;
  if ((*st = set_path(r, name)) != KS_OK) return -1;
  int e = r->io->open_fn(r->io->ctx, r->path, &fd, &size);
  if (e == ENOENT) return 0;
  if (e) return (*st = io_fail(r, "open", e)), -1;
  r->io->close_fn(r->io->ctx, fd);
  return 1;
}

/* The index decides: keepsake's (a "keepsake" member) or Hugging Face's (a weight_map). */
static KS_NODISCARD ks_status by_index(rd *r, ks_statedict **out, char **structure, char **info) {
  ks__fmap m = {0};
  ks__jv *index = NULL;
  ks_status st = set_path(r, INDEX_NAME);
  if (!st) st = ks__fmap_open(&m, r->path, r->io, true, 0, r->a, r->err);
  if (!st && m.size > KS__DCP_MAX_METADATA)
    st = ks__err_at(r->err, KS_E_LIMIT, r->path, NULL, -1, "dcp: index of %zu bytes is larger than %llu", m.size,
                    (unsigned long long)KS__DCP_MAX_METADATA);
  if (!st) st = ks__jv_parse(r->a, (const char *)m.bytes, m.size, INDEX_NAME, &index, r->err);
  ks__fmap_close(&m, r->a);
  if (!st && !ks__jv_is(index, KS__JV_OBJECT))
    st = ks__err_at(r->err, KS_E_FORMAT, r->path, NULL, -1, "dcp: the index is not a JSON object");
  if (st && r->err && !r->err->file[0]) ks__err_set_file(r->err, r->path);
  if (!st)
    st = ks__jv_get(index, "keepsake") ? ks__dcp_keepsake_load(r, out, structure, info)
                                       : ks__dcp_hf_load(r, index, out, structure, info);
  ks__jv_free(r->a, index);
  return st;
}

/* A torch DCP directory (FileSystemWriter): `.metadata` and the items it points at. */
static KS_NODISCARD ks_status torch_dcp(rd *r, ks_statedict **out, char **structure, char **info) {
  ks_status st = read_metadata(r);
  if (!st) st = sort_used(r);
  if (!st) st = check_files(r);
  if (!st) st = ks__dcp_check_budget(r);
  if (!st) st = ks__dcp_alloc_tensors(r);
  if (!st) st = read_items(r);
  if (!st) st = ks__dcp_finish(r, out, structure, info);
  return st;
}

int ks__torch_dcp_dir(const char *dir, const ks_io *io) {
  if (!dir || ks_io_check(io, NULL)) return 0;
  const ks_io *t = ks__io_v2(io);
  char path[KS__DCP_PATH_CAP];
  ks_io_stat s;
  if (t->stat_fn(t->ctx, dir, &s) || (s.kind != KS_IO_DIR && s.kind != KS_IO_LINK)) return 0;
  static const char *const names[] = {".metadata", INDEX_NAME, "model.safetensors"};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
    int n = snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    if (n > 0 && (size_t)n < sizeof path && !t->stat_fn(t->ctx, path, &s) &&
        (s.kind == KS_IO_FILE || s.kind == KS_IO_LINK))
      return 1;
  }
  return 0;
}

ks_status ks_torch_dcp_load(const char *dir, const ks_torch_read_opts *opts, ks_statedict **out, char **structure,
                            char **info, ks_error *err) {
  if (!dir || !out) return ks__err(err, KS_E_INVALID, "dcp: NULL argument");
  KS__TAKE_OPTS(ks_torch_read_opts, opts, KS__V1_SIZE(ks_torch_read_opts, max_entries), err);
  ks_error_clear(err);
  ks_status st = ks_io_check(opts->io, err);
  if (st) return st;
  rd r = {0};
  r.opts = opts;
  r.a = ks__alloc_or_default(opts->alloc);
  r.io = ks__io_v2(opts->io);
  r.dir = dir;
  r.err = err;
  r.ar = ks__malloc(r.a, sizeof *r.ar);
  if (!r.ar) return nomem(err);
  ks__pk_arena_init(r.ar, r.a);
  r.d.alloc = r.a;
  int has = exists(&r, ".metadata", &st);
  if (has == 0) has = exists(&r, INDEX_NAME, &st) == 1 ? 2 : st ? -1 : 3;
  if (has == 1) st = torch_dcp(&r, out, structure, info);
  else if (has == 2) st = by_index(&r, out, structure, info);
  else if (has == 3) st = ks__dcp_hf_load(&r, NULL, out, structure, info);
  ks__dcp_free(&r.d);
  ks__free(r.a, r.order);
  if (r.ar) release_arena(r.ar);
  if (st && err && !err->file[0]) ks__err_set_file(err, dir);
  return st;
}
