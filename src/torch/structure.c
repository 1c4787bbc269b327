/*
 * What a flat name cannot say about the pickled value: which folders were
 * lists, tuples or sets, which dict keys were ints, bools, None or floats, and
 * which containers were empty. Recorded while flattening as the JSON document
 * of keepsake.torch_structure (docs/FORMAT.md), read back by the .pt writer.
 * Also the check that flat names form a tree (no name is both a value and a
 * folder). Key text and its escaping are core's (src/core/structure.c).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/json.h"
#include "torch/torch_internal.h"

struct ks__structure {
  const ks_allocator *a;
  ks__jv *doc;        /* {"version": 1, "containers": {...}} */
  ks__jv *containers; /* borrowed from doc */
};

/* ---- names form a tree ---- */

/* Orders names so that every name under "a/" directly follows "a": '/' sorts first. */
static int cmp_names(const void *pa, const void *pb) {
  const unsigned char *a = *(const unsigned char *const *)pa, *b = *(const unsigned char *const *)pb;
  for (;; a++, b++) {
    if (*a != *b) {
      if (!*a || !*b) return *a ? 1 : -1;
      if (*a == '/' || *b == '/') return *a == '/' ? -1 : 1;
      return *a < *b ? -1 : 1;
    }
    if (!*a) return 0;
  }
}

ks_status ks__torch_names_prefix_free(const ks_statedict *sd, ks_error *err) {
  size_t n = ks_statedict_count(sd), bytes;
  if (n < 2) return KS_OK;
  if (!ks__mul_size(n, sizeof(const char *), &bytes)) return ks__err(err, KS_E_NOMEM, "torch: out of memory");
  const char **names = ks__malloc(ks__statedict_allocator(sd), bytes);
  if (!names) return ks__err(err, KS_E_NOMEM, "torch: out of memory");
  ks_entry e;
  for (size_t i = 0; i < n && ks_statedict_at(sd, i, &e) == KS_OK; i++) names[i] = e.name;
  qsort(names, n, sizeof *names, cmp_names);
  ks_status st = KS_OK;
  for (size_t i = 0; i + 1 < n && !st; i++) {
    size_t len = strlen(names[i]);
    if (!strncmp(names[i], names[i + 1], len) && names[i + 1][len] == '/')
      st = ks__err_at(err, KS_E_EXISTS, NULL, names[i], -1, "torch: '%s' is both a value and a folder (of '%s')",
                      names[i], names[i + 1]);
  }
  ks__free(ks__statedict_allocator(sd), names);
  return st;
}

/* ---- recording ---- */

ks_status ks__structure_create(ks__structure **out, ks_error *err) {
  const ks_allocator *a = ks__alloc_or_default(NULL);
  ks__structure *s = ks__calloc(a, 1, sizeof *s);
  ks__jv *doc = s ? ks__jv_object(a) : NULL;
  ks_status st = doc ? KS_OK : KS_E_NOMEM;
  if (!st) st = ks__jv_set(a, doc, "version", ks__jv_int(a, 1));
  if (!st) st = ks__jv_set(a, doc, "containers", ks__jv_object(a));
  if (st) {
    ks__jv_free(a, doc);
    ks__free(a, s);
    return ks__err(err, KS_E_NOMEM, "torch: out of memory");
  }
  s->a = a;
  s->doc = doc;
  s->containers = (ks__jv *)ks__jv_get(doc, "containers");
  *out = s;
  return KS_OK;
}

void ks__structure_free(ks__structure *s) {
  if (!s) return;
  ks__jv_free(s->a, s->doc);
  ks__free(s->a, s);
}

/* obj[key] = v (taken in every case). */
static KS_NODISCARD ks_status set_new(const ks__structure *s, ks_error *err, ks__jv *obj, const char *key, ks__jv *v) {
  if (!ks__utf8_valid((const uint8_t *)key, strlen(key))) {
    ks__jv_free(s->a, v);
    return ks__err_at(err, KS_E_VALUE, NULL, key, -1, "torch: a key on this path is not valid UTF-8");
  }
  return v && !ks__jv_set(s->a, obj, key, v) ? KS_OK : ks__err(err, KS_E_NOMEM, "torch: out of memory");
}

/* {"kind": kind} and, for a sequence (len >= 0), "len". NULL when out of memory. */
static ks__jv *record(const ks__structure *s, const char *kind, int64_t len) {
  ks__jv *r = ks__jv_object(s->a);
  ks_status st = r ? ks__jv_set(s->a, r, "kind", ks__jv_str(s->a, kind)) : KS_E_NOMEM;
  if (!st && len >= 0) st = ks__jv_set(s->a, r, "len", ks__jv_int(s->a, len));
  if (st) ks__jv_free(s->a, r), r = NULL;
  return r;
}

ks_status ks__structure_container(ks__structure *s, const char *path, const ks__pk_node *n, ks_error *err) {
  const char *kind = n->kind == PK_LIST ? "list" : n->kind == PK_TUPLE ? "tuple" : n->kind == PK_SET ? "set" : "dict";
  if (n->kind == PK_DICT) {
    if (n->u.seq.n >= 2) return KS_OK; /* plain str-keyed dicts need no record; other keys add one */
    return set_new(s, err, s->containers, path, record(s, kind, -1));
  }
  return set_new(s, err, s->containers, path, record(s, kind, (int64_t)n->u.seq.n));
}

ks_status ks__structure_key(ks__structure *s, const char *path, const ks__pk_node *key, const char *text, size_t n,
                            ks_error *err) {
  ks__jv *c = (ks__jv *)ks__jv_get(s->containers, path), *v;
  if (!c) {
    ks_status st = set_new(s, err, s->containers, path, record(s, "dict", -1));
    if (st) return st;
    c = (ks__jv *)ks__jv_get(s->containers, path);
  }
  ks__jv *keys = (ks__jv *)ks__jv_get(c, "keys");
  if (!keys) {
    ks_status st = set_new(s, err, c, "keys", ks__jv_object(s->a));
    if (st) return st;
    keys = (ks__jv *)ks__jv_get(c, "keys");
  }
  switch (key->kind) {
    case PK_INT: v = ks__jv_int(s->a, (int64_t)key->u.i); break;
    case PK_BOOL: v = ks__jv_bool(s->a, key->u.i != 0); break;
    case PK_NONE: v = ks__jv_null(s->a); break;
    case PK_FLOAT:
      if (!isfinite(key->u.f)) /* JSON has no inf/nan: such a key could not be told from None */
        return ks__err_at(err, KS_E_VALUE, NULL, path, -1, "torch: a float key on this path is not finite");
      v = ks__jv_real(s->a, key->u.f);
      break;
    default: return KS_OK; /* bytes keys: exported as str */
  }
  char comp[64];
  snprintf(comp, sizeof comp, "%.*s", (int)(n < 63 ? n : 63), text);
  return set_new(s, err, keys, comp, v);
}

ks_status ks__structure_bare_value(ks__structure *s, ks_error *err) {
  return set_new(s, err, s->containers, "", record(s, "value", -1));
}

ks_status ks__structure_dump(const ks__structure *s, const ks_allocator *a, char **out, ks_error *err) {
  *out = ks__jv_dump(a, s->doc, false);
  return *out ? KS_OK : ks__err(err, KS_E_NOMEM, "torch: out of memory");
}
