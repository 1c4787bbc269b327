/*
 * The structure document (include/keepsake/binding/structure.h, docs/FORMAT.md §10) and the one rule
 * that turns a dict key into a name component. The torch reader, the C state layer and the
 * Python package all name keys and record containers through here, so a file says the same
 * thing whichever of them wrote it.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "core/keys.h"
#include "keepsake/binding/structure.h"

struct ks_structure {
  const ks_allocator *a;
  ks__jv *containers; /* path -> {"kind", "len" | "keys"} */
  ks__jv *leaves;     /* path -> "bigint" | "ndarray" | "bytes" */
};

/* ---- escaping ---- */

size_t ks__key_escaped_len(const char *s, size_t n) {
  size_t out = n;
  for (size_t i = 0; i < n; i++) out += (s[i] == '/' || s[i] == '%') ? 2 : 0;
  return out;
}

size_t ks__key_escape(const char *s, size_t n, char *dst) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] == '/' || s[i] == '%') {
      dst[k++] = '%';
      dst[k++] = '2';
      dst[k++] = s[i] == '/' ? 'F' : '5';
    } else {
      dst[k++] = s[i];
    }
  }
  return k;
}

/* Whether s[i..] starts an escape: "%2F" or "%25". */
static int at_escape(const char *s, size_t n, size_t i) {
  return s[i] == '%' && i + 2 < n && s[i + 1] == '2' && (s[i + 2] == 'F' || s[i + 2] == '5');
}

size_t ks__key_reread_len(const char *s, size_t n) {
  size_t out = 0;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (at_escape(s, n, i)) {
      c = s[i + 2] == 'F' ? '/' : '%';
      i += 2;
    }
    out += (c == '/' || c == '%') ? 3 : 1;
  }
  return out;
}

size_t ks__key_unescape(const char *s, size_t n, char *dst) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    if (at_escape(s, n, i)) {
      dst[k++] = s[i + 2] == 'F' ? '/' : '%';
      i += 2;
    } else {
      dst[k++] = s[i];
    }
  }
  return k;
}

/* ---- key text ---- */

/* The text of a key that is not a str, in buf (at least 32 bytes); its length, or -1. */
static int number_text(const ks_key *k, char *buf, size_t cap) {
  switch (k->type) {
    case KS_KEY_INT: return snprintf(buf, cap, "%" PRId64, k->i);
    case KS_KEY_BOOL: return snprintf(buf, cap, "%s", k->i ? "True" : "False");
    case KS_KEY_NONE: return snprintf(buf, cap, "None");
    case KS_KEY_FLOAT: return snprintf(buf, cap, "%.17g", k->f);
    default: return -1;
  }
}

/* Checks a key and measures its text; a number's text goes to buf (40 bytes). */
static KS_NODISCARD ks_status measure(const ks_key *key, char *buf, size_t *len, ks_error *err) {
  if (key->type == KS_KEY_STR) {
    if (!key->str && key->len) return ks__err(err, KS_E_INVALID, "key text: NULL str key");
    if (!ks__utf8_valid((const uint8_t *)key->str, key->len))
      return ks__err(err, KS_E_VALUE, "a str key is not valid UTF-8");
    *len = ks__key_escaped_len(key->str, key->len);
    return KS_OK;
  }
  if (key->type == KS_KEY_FLOAT && !isfinite(key->f)) /* JSON has no inf/nan: it could not be told apart */
    return ks__err(err, KS_E_VALUE, "a float key is not finite");
  int n = number_text(key, buf, 40);
  if (n < 0) return ks__err(err, KS_E_INVALID, "key text: unknown key type %d", (int)key->type);
  *len = (size_t)n;
  return KS_OK;
}

ks_status ks_key_text(const ks_key *key, char *dst, size_t cap, size_t *len, ks_error *err) {
  if (!key || !len || (!dst && cap)) return ks__err(err, KS_E_INVALID, "key text: NULL argument");
  char buf[40];
  ks_status st = measure(key, buf, len, err);
  if (st) return st;
  if (*len >= cap) return ks__err(err, KS_E_LIMIT, "key text: %zu bytes do not fit in %zu", *len, cap);
  if (key->type == KS_KEY_STR)
    dst[ks__key_escape(key->str, key->len, dst)] = 0;
  else
    memcpy(dst, buf, *len + 1);
  return KS_OK;
}

/* ---- the document ---- */

ks_status ks_structure_create(const ks_allocator *alloc, ks_structure **out, ks_error *err) {
  const ks_allocator *a = ks__alloc_or_default(alloc);
  if (!out) return ks__err(err, KS_E_INVALID, "structure: NULL out");
  *out = NULL;
  ks_structure *s = ks__calloc(a, 1, sizeof *s);
  if (s) {
    s->a = a;
    s->containers = ks__jv_object(a);
    s->leaves = ks__jv_object(a);
  }
  if (!s || !s->containers || !s->leaves) {
    ks_structure_free(s);
    return ks__err(err, KS_E_NOMEM, "structure: out of memory");
  }
  *out = s;
  return KS_OK;
}

void ks_structure_free(ks_structure *s) {
  if (!s) return;
  ks__jv_free(s->a, s->containers);
  ks__jv_free(s->a, s->leaves);
  ks__free(s->a, s);
}

/* A path may be recorded once, as a container or as a leaf. */
static KS_NODISCARD ks_status check_path(const ks_structure *s, const char *path, ks_error *err) {
  if (!s || !path) return ks__err(err, KS_E_INVALID, "structure: NULL argument");
  if (!ks__utf8_valid((const uint8_t *)path, strlen(path)))
    return ks__err(err, KS_E_VALUE, "structure: a path is not valid UTF-8");
  if (ks__jv_get(s->containers, path) || ks__jv_get(s->leaves, path))
    return ks__err_at(err, KS_E_EXISTS, NULL, path, -1, "structure: '%s' is recorded twice", path);
  return KS_OK;
}

static KS_NODISCARD ks_status nomem(ks_error *err) { return ks__err(err, KS_E_NOMEM, "structure: out of memory"); }

/* containers[path] = {"kind": kind} plus `extra` (taken in every case) under `member`. */
static KS_NODISCARD ks_status put(ks_structure *s, const char *path, const char *kind, const char *member,
                                  ks__jv *extra, ks_error *err) {
  ks__jv *r = ks__jv_object(s->a);
  ks_status st = r ? ks__jv_set(s->a, r, "kind", ks__jv_str(s->a, kind)) : KS_E_NOMEM;
  if (!st && member) st = ks__jv_set(s->a, r, member, extra), extra = NULL;
  ks__jv_free(s->a, extra);
  if (!st) return ks__jv_set(s->a, s->containers, path, r) ? nomem(err) : KS_OK;
  ks__jv_free(s->a, r);
  return nomem(err);
}

ks_status ks_structure_add_sequence(ks_structure *s, const char *path, ks_container_kind kind, uint64_t len,
                                    ks_error *err) {
  ks_status st = check_path(s, path, err);
  if (st) return st;
  const char *name = kind == KS_CONTAINER_LIST ? "list" : kind == KS_CONTAINER_TUPLE ? "tuple"
                     : kind == KS_CONTAINER_SET ? "set" : NULL;
  if (!name) return ks__err_at(err, KS_E_INVALID, NULL, path, -1, "structure: kind %d is not a sequence", (int)kind);
  if (len > INT64_MAX) return ks__err_at(err, KS_E_LIMIT, NULL, path, -1, "structure: length too large");
  return put(s, path, name, "len", ks__jv_int(s->a, (int64_t)len), err);
}

/* One key's text, kept beside its index while the texts are sorted. */
typedef struct key_slot {
  const char *text; /* the str key itself when it needs no escape, else own */
  char *own;
  size_t n;
} key_slot;

static int cmp_slot(const void *pa, const void *pb) {
  const key_slot *x = pa, *y = pb;
  int c = memcmp(x->text, y->text, x->n < y->n ? x->n : y->n);
  return c ? c : (x->n > y->n) - (x->n < y->n);
}

/* The texts of keys[0..n) into slots (their own copies); KS_E_EXISTS for two alike. */
static KS_NODISCARD ks_status texts(ks_structure *s, const char *path, const ks_key *keys, size_t n, key_slot *slots,
                                    ks_error *err) {
  for (size_t i = 0; i < n; i++) {
    char buf[40];
    size_t len;
    ks_status st = measure(&keys[i], buf, &len, NULL);
    if (st)
      return ks__err_at(err, st, NULL, path, -1, "key %zu of the dict at '%s' is %s", i, path,
                        st != KS_E_VALUE ? "of an unknown type"
                        : keys[i].type == KS_KEY_FLOAT ? "a float that is not finite" : "not valid UTF-8");
    slots[i].n = len;
    if (keys[i].type == KS_KEY_STR && len == keys[i].len) { /* nothing to escape: no copy */
      slots[i].text = keys[i].str;
      continue;
    }
    if (!(slots[i].own = ks__malloc(s->a, len + 1))) return nomem(err);
    if (keys[i].type == KS_KEY_STR)
      ks__key_escape(keys[i].str, keys[i].len, slots[i].own);
    else
      memcpy(slots[i].own, buf, len);
    slots[i].text = slots[i].own;
  }
  if (n > 1) qsort(slots, n, sizeof *slots, cmp_slot); /* an empty dict has no slots (NULL) */
  for (size_t i = 0; i + 1 < n; i++)
    if (!cmp_slot(&slots[i], &slots[i + 1]))
      return ks__err_at(err, KS_E_EXISTS, NULL, path, -1, "two keys of the dict at '%s' have the same name '%.*s'",
                        path, (int)(slots[i].n < 200 ? slots[i].n : 200), slots[i].text);
  return KS_OK;
}

/* The "keys" record of a dict: name component -> typed key, for its keys that are not str. */
static ks__jv *typed_keys(const ks_structure *s, const ks_key *keys, size_t n) {
  ks__jv *out = ks__jv_object(s->a);
  for (size_t i = 0; out && i < n; i++) {
    const ks_key *k = &keys[i];
    if (k->type == KS_KEY_STR) continue;
    char text[40];
    size_t len;
    ks__jv *v = k->type == KS_KEY_INT ? ks__jv_int(s->a, k->i) : k->type == KS_KEY_BOOL ? ks__jv_bool(s->a, k->i != 0)
                : k->type == KS_KEY_NONE ? ks__jv_null(s->a) : ks__jv_real(s->a, k->f);
    if (ks_key_text(k, text, sizeof text, &len, NULL)) { /* checked by the caller: cannot fail */
      ks__jv_free(s->a, v);
      v = NULL;
    }
    if (ks__jv_set(s->a, out, text, v)) { /* takes v, or fails on NULL */
      ks__jv_free(s->a, out);
      out = NULL;
    }
  }
  return out;
}

ks_status ks_structure_add_dict(ks_structure *s, const char *path, const ks_key *keys, size_t n, ks_error *err) {
  ks_status st = check_path(s, path, err);
  if (st) return st;
  if (n && !keys) return ks__err(err, KS_E_INVALID, "structure: NULL keys");
  size_t bytes;
  key_slot *slots = n && ks__mul_size(n, sizeof *slots, &bytes) ? ks__calloc(s->a, n, sizeof *slots) : NULL;
  if (n && !slots) return nomem(err);
  st = texts(s, path, keys, n, slots, err);
  for (size_t i = 0; i < n; i++) ks__free(s->a, slots[i].own);
  ks__free(s->a, slots);
  if (st) return st;
  int typed = 0;
  for (size_t i = 0; i < n && !typed; i++) typed = keys[i].type != KS_KEY_STR;
  if (n && !typed) return KS_OK; /* a str-keyed dict: the names say all */
  if (!n) return put(s, path, "dict", NULL, NULL, err);
  ks__jv *k = typed_keys(s, keys, n);
  return k ? put(s, path, "dict", "keys", k, err) : nomem(err);
}

ks_status ks_structure_add_leaf(ks_structure *s, const char *path, ks_leaf_kind kind, ks_error *err) {
  ks_status st = check_path(s, path, err);
  if (st) return st;
  const char *name = kind == KS_LEAF_BIGINT ? "bigint" : kind == KS_LEAF_NDARRAY ? "ndarray"
                     : kind == KS_LEAF_BYTES ? "bytes" : NULL;
  if (!name) return ks__err_at(err, KS_E_INVALID, NULL, path, -1, "structure: unknown leaf kind %d", (int)kind);
  return ks__jv_set(s->a, s->leaves, path, ks__jv_str(s->a, name)) ? nomem(err) : KS_OK;
}

int ks_structure_is_empty(const ks_structure *s) { return !s || (!s->containers->len && !s->leaves->len); }

ks_status ks_structure_dump(const ks_structure *s, char **json, ks_error *err) {
  if (!s || !json) return ks__err(err, KS_E_INVALID, "structure: NULL argument");
  *json = NULL;
  ks__jv *doc = ks__jv_object(s->a);
  ks_status st = doc ? ks__jv_set(s->a, doc, "version", ks__jv_int(s->a, 1)) : KS_E_NOMEM;
  if (!st) st = ks__jv_set(s->a, doc, "containers", ks__jv_copy(s->a, s->containers));
  if (!st && s->leaves->len) st = ks__jv_set(s->a, doc, "leaves", ks__jv_copy(s->a, s->leaves));
  if (!st && !(*json = ks__jv_dump(s->a, doc, false))) st = KS_E_NOMEM;
  ks__jv_free(s->a, doc);
  return st ? nomem(err) : KS_OK;
}

void ks_structure_text_free(const ks_structure *s, char *json) {
  if (json) ks__free(s ? s->a : ks__alloc_or_default(NULL), json);
}
