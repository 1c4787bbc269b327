/*
 * Ordered state dict. Entries live in an array in insertion order; an
 * open-addressing table of entry indices makes lookups O(1) so that a file of
 * 100,000 tensors loads without quadratic work.
 */
#include <string.h>

#include "core/hindex.h"
#include "core/internal.h"
#include "keepsake/statedict.h"

typedef struct sd_item {
  char *name;
  size_t name_len;
  uint64_t hash;
  ks_value_kind kind;
  ks_tensor tensor;
  int64_t i;
  double f;
  char *s;
  int leaf; /* ks_leaf_kind the entry stands for (ks_statedict_mark_leaf), 0: itself */
} sd_item;

typedef struct sd_owner {
  void *owner;
  void (*release)(void *);
} sd_owner;

struct ks_statedict {
  ks_allocator alloc;
  sd_item *items;
  size_t count, cap;
  ks__hindex index; /* by name */
  sd_owner *owners;
  size_t nowners;
};

static uint64_t item_hash(const void *ctx, size_t i) {
  return ((const ks_statedict *)ctx)->items[i].hash;
}

static const char *item_key(const void *ctx, size_t i, size_t *len) {
  const sd_item *it = &((const ks_statedict *)ctx)->items[i];
  *len = it->name_len;
  return it->name;
}

static const ks__hindex_ops sd_ops = {item_hash, item_key};

ks_status ks_statedict_create(const ks_allocator *alloc, ks_statedict **out, ks_error *err) {
  if (!out) return ks__err(err, KS_E_INVALID, "ks_statedict_create: NULL out");
  ks_statedict *sd = ks__calloc(alloc, 1, sizeof *sd);
  if (!sd) return ks__err(err, KS_E_NOMEM, "out of memory for a state dict");
  sd->alloc = *ks__alloc_or_default(alloc);
  *out = sd;
  return KS_OK;
}

const ks_allocator *ks__statedict_allocator(const ks_statedict *sd) { return &sd->alloc; }

static void item_clear(ks_statedict *sd, sd_item *it) {
  if (it->kind == KS_VAL_TENSOR && it->tensor.ownership == KS_OWNED) ks__free(&sd->alloc, it->tensor.data);
  ks__free(&sd->alloc, it->s);
  it->s = NULL;
  it->tensor.data = NULL;
}

void ks_statedict_free(ks_statedict *sd) {
  if (!sd) return;
  for (size_t k = 0; k < sd->count; k++) {
    item_clear(sd, &sd->items[k]);
    ks__free(&sd->alloc, sd->items[k].name);
  }
  /* Owners go last: mapped tensors above point into them. */
  for (size_t k = sd->nowners; k-- > 0;) sd->owners[k].release(sd->owners[k].owner);
  ks__free(&sd->alloc, sd->owners);
  ks__free(&sd->alloc, sd->items);
  ks__hindex_free(&sd->index, &sd->alloc);
  ks__free(&sd->alloc, sd);
}

static long find_index(const ks_statedict *sd, const char *name) {
  size_t n = strlen(name);
  return ks__hindex_find(&sd->index, name, n, ks__hash(name, n), &sd_ops, sd);
}

/* Makes room for one more item, growing the array and keeping the table under 50% load. */
static KS_NODISCARD ks_status reserve_one(ks_statedict *sd) {
  if (sd->count >= UINT32_MAX - 1) return KS_E_LIMIT;
  ks_status s = ks__grow(&sd->alloc, &sd->items, &sd->cap, sd->count + 1, sizeof *sd->items);
  if (s) return s;
  return ks__hindex_reserve(&sd->index, &sd->alloc, sd->count + 1, sd->count, &sd_ops, sd);
}

ks_status ks__name_check(const char *name, ks_error *err) {
  if (!name) return ks__err(err, KS_E_INVALID, "a name is NULL");
  size_t n = strlen(name);
  if (n == 0) return ks__err(err, KS_E_INVALID, "a name is empty");
  if (n > KS_MAX_NAME) {
    /* The key field holds only the start of so long a name. */
    ks_status st = ks__err_at(err, KS_E_LIMIT, NULL, name, -1,
                              "name of %zu bytes; at most %d (KS_MAX_NAME) are allowed", n, KS_MAX_NAME);
    return st;
  }
  return KS_OK;
}

/* The error of a failed set: code, with the entry's name as the key. */
static KS_NODISCARD ks_status set_failed(ks_error *err, ks_status code, const char *name, const char *what) {
  return ks__err_at(err, code, NULL, name, -1, "cannot set '%.200s': %s", name ? name : "", what);
}

/* Installs a fully built value under name, replacing any entry of that name. */
static KS_NODISCARD ks_status put(ks_statedict *sd, const char *name, sd_item *val, ks_error *err) {
  ks_status st = ks__name_check(name, err);
  if (st) return st;
  long idx = find_index(sd, name);
  if (idx >= 0) {
    sd_item *it = &sd->items[idx];
    item_clear(sd, it);
    val->name = it->name;
    val->name_len = it->name_len;
    val->hash = it->hash;
    *it = *val;
    return KS_OK;
  }
  char *copy = ks__strdup(&sd->alloc, name);
  if (!copy) return set_failed(err, KS_E_NOMEM, name, "out of memory");
  if ((st = reserve_one(sd)) != KS_OK) {
    ks__free(&sd->alloc, copy);
    return set_failed(err, st, name, st == KS_E_LIMIT ? "too many entries" : "out of memory");
  }
  val->name = copy;
  val->name_len = strlen(copy);
  val->hash = ks__hash(copy, val->name_len);
  sd->items[sd->count] = *val;
  ks__hindex_insert(&sd->index, sd->count, val->hash);
  sd->count++;
  return KS_OK;
}

/* Frees the parts of an item that `put` failed to take. */
static KS_NODISCARD ks_status put_or_release(ks_statedict *sd, const char *name, sd_item *val, ks_error *err) {
  ks_status st = put(sd, name, val, err);
  if (st) item_clear(sd, val);
  return st;
}

ks_status ks_statedict_set_tensor(ks_statedict *sd, const char *name, const ks_tensor *t, ks_take take, ks_error *err) {
  if (!sd || !t) return set_failed(err, KS_E_INVALID, name, "NULL state dict or tensor");
  size_t nbytes;
  ks_status st = ks_shape_size(t->dtype, t->rank, t->shape, NULL, &nbytes);
  if (st) return set_failed(err, st, name, "bad dtype or shape");
  if (nbytes != t->nbytes || (nbytes && !t->data))
    return ks__err_at(err, KS_E_INVALID, NULL, name, -1, "'%.200s': the tensor says %zu bytes, its shape %zu%s",
                      name ? name : "", t->nbytes, nbytes, nbytes && !t->data ? ", and it has no data" : "");
  sd_item val = {0};
  val.kind = KS_VAL_TENSOR;
  val.tensor = *t;
  if (take == KS_COPY) {
    val.tensor.data = ks__malloc(&sd->alloc, nbytes);
    if (!val.tensor.data) return set_failed(err, KS_E_NOMEM, name, "out of memory for the data");
    if (nbytes) memcpy(val.tensor.data, t->data, nbytes);
    val.tensor.ownership = KS_OWNED;
  } else {
    val.tensor.ownership = take == KS_MAPPED_VIEW ? KS_MAPPED : KS_BORROWED;
  }
  return put_or_release(sd, name, &val, err);
}

ks_status ks_statedict_new_tensor(ks_statedict *sd, const char *name, ks_dtype dtype, int rank,
                                  const int64_t *shape, void **out_data, ks_error *err) {
  if (!sd) return set_failed(err, KS_E_INVALID, name, "NULL state dict");
  ks_status st = ks__name_check(name, err); /* before allocating the data */
  if (st) return st;
  sd_item val = {0};
  val.kind = KS_VAL_TENSOR;
  if ((st = ks_tensor_init(&val.tensor, dtype, rank, shape, NULL)))
    return set_failed(err, st, name, "bad dtype or shape");
  val.tensor.data = ks__calloc(&sd->alloc, 1, val.tensor.nbytes);
  if (!val.tensor.data) return set_failed(err, KS_E_NOMEM, name, "out of memory for the data");
  val.tensor.ownership = KS_OWNED;
  void *data = val.tensor.data;
  if ((st = put_or_release(sd, name, &val, err)) != KS_OK) return st;
  if (out_data) *out_data = data;
  return KS_OK;
}

static KS_NODISCARD ks_status set_scalar(ks_statedict *sd, const char *name, ks_value_kind kind, int64_t i, double f,
                            ks_error *err) {
  if (!sd) return set_failed(err, KS_E_INVALID, name, "NULL state dict");
  sd_item val = {0};
  val.kind = kind;
  val.i = i;
  val.f = f;
  return put(sd, name, &val, err);
}

ks_status ks_statedict_set_int(ks_statedict *sd, const char *name, int64_t v, ks_error *err) {
  return set_scalar(sd, name, KS_VAL_INT, v, 0, err);
}
ks_status ks_statedict_set_float(ks_statedict *sd, const char *name, double v, ks_error *err) {
  return set_scalar(sd, name, KS_VAL_FLOAT, 0, v, err);
}
ks_status ks_statedict_set_bool(ks_statedict *sd, const char *name, int v, ks_error *err) {
  return set_scalar(sd, name, KS_VAL_BOOL, v != 0, 0, err);
}
ks_status ks_statedict_set_null(ks_statedict *sd, const char *name, ks_error *err) {
  return set_scalar(sd, name, KS_VAL_NULL, 0, 0, err);
}

ks_status ks_statedict_set_string(ks_statedict *sd, const char *name, const char *v, ks_error *err) {
  if (!sd || !v) return set_failed(err, KS_E_INVALID, name, "NULL state dict or string");
  sd_item val = {0};
  val.kind = KS_VAL_STRING;
  val.s = ks__strdup(&sd->alloc, v);
  if (!val.s) return set_failed(err, KS_E_NOMEM, name, "out of memory for the string");
  return put_or_release(sd, name, &val, err);
}

size_t ks_statedict_count(const ks_statedict *sd) { return sd ? sd->count : 0; }

static void fill_entry(const sd_item *it, ks_entry *out) {
  out->name = it->name;
  out->kind = it->kind;
  out->tensor = it->tensor;
  out->i = it->i;
  out->f = it->f;
  out->s = it->s;
}

ks_status ks_statedict_at(const ks_statedict *sd, size_t i, ks_entry *out) {
  if (!sd || i >= sd->count) return KS_E_NOTFOUND;
  fill_entry(&sd->items[i], out);
  return KS_OK;
}

ks_status ks_statedict_get(const ks_statedict *sd, const char *name, ks_entry *out) {
  if (!sd || !name) return KS_E_NOTFOUND;
  long idx = find_index(sd, name);
  if (idx < 0) return KS_E_NOTFOUND;
  fill_entry(&sd->items[idx], out);
  return KS_OK;
}

const ks_tensor *ks_statedict_tensor(const ks_statedict *sd, const char *name) {
  if (!sd || !name) return NULL;
  long idx = find_index(sd, name);
  if (idx < 0 || sd->items[idx].kind != KS_VAL_TENSOR) return NULL;
  return &sd->items[idx].tensor;
}

ks_status ks_statedict_mark_leaf(ks_statedict *sd, const char *name, ks_leaf_kind kind, ks_error *err) {
  long idx = sd && name ? find_index(sd, name) : -1;
  if (idx < 0) return ks__err_at(err, KS_E_NOTFOUND, NULL, name, -1, "no entry '%.200s' to mark", name ? name : "");
  sd_item *it = &sd->items[idx];
  /* The kinds: a big int is stored as its text, an array or bytes as a tensor. */
  int fits = (kind == KS_LEAF_BIGINT && it->kind == KS_VAL_STRING) ||
             ((kind == KS_LEAF_NDARRAY || kind == KS_LEAF_BYTES) && it->kind == KS_VAL_TENSOR);
  if (!fits)
    return ks__err_at(err, KS_E_INVALID, NULL, name, -1, "'%.200s' cannot stand for a leaf of kind %d", name, kind);
  it->leaf = kind;
  return KS_OK;
}

int ks__statedict_leaf(const ks_statedict *sd, size_t i) { return sd && i < sd->count ? sd->items[i].leaf : 0; }

ks_status ks_statedict_remove(ks_statedict *sd, const char *name) {
  long idx = sd && name ? find_index(sd, name) : -1;
  if (idx < 0) return KS_E_NOTFOUND;
  item_clear(sd, &sd->items[idx]);
  ks__free(&sd->alloc, sd->items[idx].name);
  memmove(&sd->items[idx], &sd->items[idx + 1], (sd->count - (size_t)idx - 1) * sizeof(sd_item));
  sd->count--;
  /* Re-index in place: the table is already large enough, so this cannot fail. */
  ks__hindex_rebuild(&sd->index, sd->count, &sd_ops, sd);
  return KS_OK;
}

ks_status ks__statedict_attach(ks_statedict *sd, void *owner, void (*release)(void *owner), ks_error *err) {
  if (!sd || !release) return ks__err(err, KS_E_INVALID, "ks__statedict_attach: NULL state dict or release");
  size_t bytes;
  if (!ks__mul_size(sd->nowners + 1, sizeof(sd_owner), &bytes)) return ks__err(err, KS_E_LIMIT, "too many owners");
  sd_owner *o = ks__realloc(&sd->alloc, sd->owners, bytes);
  if (!o) return ks__err(err, KS_E_NOMEM, "out of memory attaching an owner");
  sd->owners = o;
  sd->owners[sd->nowners].owner = owner;
  sd->owners[sd->nowners].release = release;
  sd->nowners++;
  return KS_OK;
}

ks_status ks_statedict_set_entry(ks_statedict *sd, const char *name, const ks_entry *e, ks_take take, ks_error *err) {
  if (!e) return set_failed(err, KS_E_INVALID, name, "NULL entry");
  switch (e->kind) {
    case KS_VAL_TENSOR: return ks_statedict_set_tensor(sd, name, &e->tensor, take, err);
    case KS_VAL_INT: return ks_statedict_set_int(sd, name, e->i, err);
    case KS_VAL_FLOAT: return ks_statedict_set_float(sd, name, e->f, err);
    case KS_VAL_BOOL: return ks_statedict_set_bool(sd, name, (int)e->i, err);
    case KS_VAL_STRING: return ks_statedict_set_string(sd, name, e->s, err);
    case KS_VAL_NULL: return ks_statedict_set_null(sd, name, err);
    default: return set_failed(err, KS_E_INVALID, name, "unknown entry kind");
  }
}

ks_status ks__statedict_copy_prefix(ks_statedict *dst, const ks_statedict *src, const char *prefix,
                                   const char *new_prefix, ks_error *err) {
  if (!dst || !src || !prefix || !new_prefix)
    return ks__err(err, KS_E_INVALID, "ks__statedict_copy_prefix: NULL argument");
  size_t plen = strlen(prefix), nlen = strlen(new_prefix);
  char name[KS_MAX_NAME + 1];
  for (size_t k = 0; k < src->count; k++) {
    const sd_item *it = &src->items[k];
    if (strncmp(it->name, prefix, plen) != 0) continue;
    size_t rest = strlen(it->name) - plen;
    if (nlen + rest > KS_MAX_NAME)
      return ks__err_at(err, KS_E_LIMIT, NULL, it->name, -1, "'%.200s' renamed under '%.200s' is %zu bytes; at most %d",
                        it->name, new_prefix, nlen + rest, KS_MAX_NAME);
    memcpy(name, new_prefix, nlen);
    memcpy(name + nlen, it->name + plen, rest + 1);
    ks_entry e;
    fill_entry(it, &e);
    ks_status st = ks_statedict_set_entry(dst, name, &e, KS_COPY, err);
    if (st) return st;
  }
  return KS_OK;
}
