/*
 * The Python package's container table (`keepsake.pytree`: {path: kind}) as the one structure
 * document the .pt writer reads (`keepsake.torch_structure`, docs/FORMAT.md section 10), so a
 * checkpoint a Python program saved exports to a .pt that PyTorch's own objects load, as a C
 * program's and an imported file's do.
 *
 * kinds: "list" / "tuple" / "set" (items named by index; the length is the largest index under
 * the folder, in the entries or in the table, plus one), "dict" (an empty str-keyed dict),
 * "intdict" (int keys in decimal), {"keys": [[code, key], ...]} (items named by position, codes
 * i/f/b/n/s), and the leaf kinds "bigint", "ndarray", "bytes" (exported as the string or tensor
 * stored). A keyed dict holding a str key has no section-10 form (its names are positions, not
 * key texts): KS_E_UNSUPPORTED names it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert/convert_internal.h"
#include "core/json.h"
#include "keepsake/layout.h"

#define PYTREE_META KS_META_PYTREE

typedef struct tr {
  const ks_allocator *a;
  const ks_statedict *sd;
  const ks__jv *table;
  ks__jv *containers;
  ks_error *err;
} tr;

/* The first name component under folder `path` of `name`, or NULL. */
static const char *child_of(const char *path, const char *name, size_t *len) {
  size_t n = strlen(path);
  if (n && (strncmp(name, path, n) || name[n] != '/')) return NULL;
  const char *seg = n ? name + n + 1 : name, *slash = strchr(seg, '/');
  *len = slash ? (size_t)(slash - seg) : strlen(seg);
  return *len ? seg : NULL;
}

/* A decimal index of at most 18 digits, or -1. */
static int64_t index_of(const char *seg, size_t len) {
  if (!len || len > 18) return -1;
  int64_t v = 0;
  for (size_t i = 0; i < len; i++) {
    if (seg[i] < '0' || seg[i] > '9') return -1;
    v = v * 10 + (seg[i] - '0');
  }
  return v;
}

/* The item count of a sequence at `path`: the largest child index, in entries or table, plus one. */
static int64_t seq_len(const tr *t, const char *path) {
  int64_t n = 0;
  ks_entry e;
  size_t len;
  for (size_t i = 0; ks_statedict_at(t->sd, i, &e) == KS_OK; i++) {
    const char *seg = child_of(path, e.name, &len);
    int64_t k = seg ? index_of(seg, len) : -1;
    if (k >= n) n = k + 1;
  }
  for (size_t i = 0; i < t->table->len; i++) {
    const char *seg = child_of(path, t->table->keys[i], &len);
    int64_t k = seg ? index_of(seg, len) : -1;
    if (k >= n) n = k + 1;
  }
  return n;
}

/* {"kind": "dict", "keys": {component: int}} for the decimal children of `path`. */
static KS_NODISCARD ks_status int_keys(const tr *t, const char *path, ks__jv *keys) {
  ks_entry e;
  size_t len;
  char seg_buf[32];
  for (size_t i = 0; ks_statedict_at(t->sd, i, &e) == KS_OK; i++) {
    const char *seg = child_of(path, e.name, &len);
    int64_t k = seg ? index_of(seg, len) : -1;
    if (k < 0) continue;
    snprintf(seg_buf, sizeof seg_buf, "%.*s", (int)len, seg);
    if (!ks__jv_get(keys, seg_buf) && ks__jv_set(t->a, keys, seg_buf, ks__jv_int(t->a, k))) return KS_E_NOMEM;
  }
  return KS_OK;
}

/* The section-10 key of one [code, key] pair into *out: KS_E_FORMAT for a malformed pair,
 * KS_E_UNSUPPORTED for a str key (no section-10 form), KS_E_NOMEM. */
static KS_NODISCARD ks_status typed_key(const ks_allocator *a, const ks__jv *pair, ks__jv **out) {
  const char *code = ks__jv_is(pair, KS__JV_ARRAY) && pair->len == 2 ? ks__jv_string(pair->items[0]) : NULL;
  if (!code) return KS_E_FORMAT;
  if (!strcmp(code, "s")) return KS_E_UNSUPPORTED;
  *out = !strcmp(code, "n") ? ks__jv_null(a) : ks__jv_copy(a, pair->items[1]);
  return *out ? KS_OK : KS_E_NOMEM;
}

static KS_NODISCARD ks_status keyed_dict(const tr *t, const char *path, const ks__jv *list, ks__jv *keys) {
  for (size_t i = 0; ks__jv_is(list, KS__JV_ARRAY) && i < list->len; i++) {
    ks__jv *k = NULL;
    ks_status st = typed_key(t->a, list->items[i], &k);
    if (st == KS_E_UNSUPPORTED)
      return ks__err_at(t->err, st, NULL, path, -1,
                        "convert: '%s' is a dict whose str keys were saved by position; it has no .pt structure",
                        path);
    if (st == KS_E_FORMAT)
      return ks__err_at(t->err, st, NULL, KS_META_PYTREE, -1, "convert: bad key record at '%s'", path);
    char comp[32];
    snprintf(comp, sizeof comp, "%zu", i);
    if (st || ks__jv_set(t->a, keys, comp, k)) return KS_E_NOMEM;
  }
  return KS_OK;
}

/* The section-10 record of table entry (path, kind); *rec NULL for a leaf kind. */
static KS_NODISCARD ks_status record_of(const tr *t, const char *path, const ks__jv *kind, ks__jv **rec) {
  const char *k = ks__jv_string(kind);
  *rec = NULL;
  if (k && strcmp(k, "list") && strcmp(k, "tuple") && strcmp(k, "set") && strcmp(k, "dict") && strcmp(k, "intdict"))
    return KS_OK; /* bigint, ndarray, bytes: leaves, exported as stored */
  if (!k && !ks__jv_is(kind, KS__JV_OBJECT))
    return ks__err_at(t->err, KS_E_FORMAT, NULL, PYTREE_META, -1, "convert: bad container record at '%s'", path);
  ks__jv *r = ks__jv_object(t->a), *keys = NULL;
  ks_status st = r ? KS_OK : KS_E_NOMEM;
  int seq = k && strcmp(k, "dict") && strcmp(k, "intdict");
  if (!st) st = ks__jv_set(t->a, r, "kind", ks__jv_str(t->a, seq ? k : "dict"));
  if (!st && seq) st = ks__jv_set(t->a, r, "len", ks__jv_int(t->a, seq_len(t, path)));
  if (!st && !seq && (!k || !strcmp(k, "intdict"))) {
    keys = ks__jv_object(t->a);
    st = !keys ? KS_E_NOMEM : k ? int_keys(t, path, keys) : keyed_dict(t, path, ks__jv_get(kind, "keys"), keys);
    if (!st && keys->len) st = ks__jv_set(t->a, r, "keys", keys), keys = NULL;
  }
  ks__jv_free(t->a, keys);
  if (st) {
    ks__jv_free(t->a, r);
    return st == KS_E_NOMEM ? ks__err(t->err, st, "convert: out of memory") : st;
  }
  *rec = r;
  return KS_OK;
}

ks_status ks__convert_pytree(const ks_allocator *a, const ks_statedict *sd, ks_meta *meta, ks_error *err) {
  const char *text = ks_meta_get(meta, PYTREE_META);
  if (!text || ks_meta_get(meta, KS_TORCH_STRUCTURE_META)) return KS_OK;
  ks__jv *table = NULL, *doc = ks__jv_object(a);
  ks_status st = doc ? ks__jv_parse(a, text, strlen(text), PYTREE_META, &table, err) : KS_E_NOMEM;
  if (!st && !ks__jv_is(table, KS__JV_OBJECT))
    st = ks__err_at(err, KS_E_FORMAT, NULL, PYTREE_META, -1, "convert: metadata is not a JSON object");
  tr t = {a, sd, table, NULL, err};
  if (!st && (st = ks__jv_set(a, doc, "version", ks__jv_int(a, 1))) == KS_OK) {
    t.containers = ks__jv_object(a);
    st = t.containers ? ks__jv_set(a, doc, "containers", t.containers) : KS_E_NOMEM;
  }
  for (size_t i = 0; !st && i < table->len; i++) {
    ks__jv *rec = NULL;
    st = record_of(&t, table->keys[i], table->items[i], &rec);
    if (!st && rec && ks__jv_set(a, t.containers, table->keys[i], rec)) st = KS_E_NOMEM;
  }
  char *dump = st ? NULL : ks__jv_dump(a, doc, false);
  if (!st && !dump) st = KS_E_NOMEM;
  if (!st) st = ks_meta_set(meta, KS_TORCH_STRUCTURE_META, dump, err);
  if (st == KS_E_NOMEM && (!err || !err->code)) st = ks__err(err, st, "convert: out of memory");
  ks__free(a, dump);
  ks__jv_free(a, table);
  ks__jv_free(a, doc);
  return st;
}
