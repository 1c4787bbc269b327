/*
 * The read side of the value tree (include/keepsake/binding.h, ks_structure_plan; docs/FORMAT.md
 * §10): from a file's entry names and its records (the structure document, or the
 * `keepsake.pytree` table of files keepsake 0.1.0's Python package wrote), which folders rebuild
 * as lists, tuples, sets or dicts, what each dict key is (the inverse of ks_key_text, typed keys),
 * and which leaves were big ints, arrays or bytes. The writer of the same document is
 * structure.c; a binding maps the plan onto its own objects and decides nothing itself, apart
 * from comparing an undocumented folder with the program's own object (KS_PLAN_GUESS).
 *
 * Bounds: one node per distinct folder or entry (at most the name components given), one key
 * text per node (at most the bytes given plus a few per key), KS_PLAN_MAX_DEPTH components.
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "core/json.h"
#include "keepsake/binding.h"
#include "keepsake/layout.h"

#define NONE_ID SIZE_MAX
#define CHUNK 65536

/* What the records say of one path. */
typedef enum rtype {
  R_NONE, R_LIST, R_TUPLE, R_SET, R_DICT, R_INTDICT, R_KEYMAP, R_POSKEYS, R_VALUE, R_OTHER, R_LEAF
} rtype;

typedef struct rec {
  rtype type;
  int leaf_kind;
  const ks__jv *v; /* R_KEYMAP: the keys object; R_POSKEYS: the key list (NULL: none) */
} rec;

/* A folder or entry while the trie is built. */
typedef struct pnode {
  const char *seg, *path; /* name component; full path (prefix included), not NUL-terminated */
  size_t seg_len, path_len;
  size_t parent, first_kid, last_kid, next, nkids, leaf;
} pnode;

typedef struct chunk {
  struct chunk *prev;
  size_t used, cap;
  char data[];
} chunk;

struct ks_plan {
  const ks_allocator *a;
  ks_plan_node *nodes;
  size_t n_nodes;
  size_t *kids;
  ks__jv *records; /* the parsed document or table: typed key texts point into it */
  chunk *texts;    /* key texts made here */
};

typedef struct builder {
  ks_plan *p;
  pnode *pn;
  size_t n, cap;
  size_t *slots; /* open addressing: (parent, component) -> node */
  size_t n_slots;
  bool documented;
  const ks__jv *containers, *leaves, *table;
  const char *what; /* the metadata key, for errors */
  char *scratch;
  size_t scratch_cap;
  size_t n_kids;
  ks_error *err;
} builder;

/* ---- key texts ---- */

static char *text_alloc(ks_plan *p, size_t n) {
  chunk *c = p->texts;
  if (!c || c->cap - c->used < n) {
    size_t cap = n > CHUNK ? n : CHUNK;
    chunk *fresh = ks__malloc(p->a, sizeof *fresh + cap);
    if (!fresh) return NULL;
    *fresh = (chunk){c, 0, cap};
    p->texts = c = fresh;
  }
  char *out = c->data + c->used;
  c->used += n;
  return out;
}

static ks_key str_key(const char *s, size_t n) { return (ks_key){.type = KS_KEY_STR, .str = s, .len = n}; }

/* A str key from its name component: "%2F" and "%25" unescaped in documented files (the inverse
   of ks_key_text); as written in files without a document, which did not escape. */
static KS_NODISCARD ks_status seg_key(builder *b, const char *seg, size_t n, ks_key *out) {
  if (!b->documented || !memchr(seg, '%', n)) {
    *out = str_key(seg, n);
    return KS_OK;
  }
  char *d = text_alloc(b->p, n);
  if (!d) return KS_E_NOMEM;
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    if (seg[i] == '%' && i + 2 < n && seg[i + 1] == '2' && (seg[i + 2] == 'F' || seg[i + 2] == '5')) {
      d[k++] = seg[i + 2] == 'F' ? '/' : '%';
      i += 2;
    } else {
      d[k++] = seg[i];
    }
  }
  *out = str_key(d, k);
  return KS_OK;
}

/* The value of a decimal name of at most 18 ASCII digits, or -1. */
static int64_t index_of(const char *s, size_t n) {
  if (!n || n > 18) return -1;
  int64_t v = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9') return -1;
    v = v * 10 + (s[i] - '0');
  }
  return v;
}

/* An int written in decimal with an optional sign (what 0.1.0 wrote for int keys). */
static bool int_text(const char *s, size_t n, int64_t *out) {
  bool neg = n && s[0] == '-';
  size_t skip = n && (s[0] == '-' || s[0] == '+');
  int64_t v = index_of(s + skip, n - skip);
  if (v < 0) return false;
  *out = neg ? -v : v;
  return true;
}

static KS_NODISCARD ks_status bad_key(builder *b, const pnode *at, const char *why) {
  return ks__err(b->err, KS_E_FORMAT, "metadata '%s': the record of '%.*s' %s", b->what, (int)at->path_len,
                 at->path, why);
}

/* A key the records give as a JSON value: int, real, bool, null, or str. */
static KS_NODISCARD ks_status value_key(builder *b, const pnode *at, const ks__jv *v, ks_key *out) {
  switch (v ? v->type : KS__JV_ARRAY) {
    case KS__JV_NULL: *out = (ks_key){.type = KS_KEY_NONE}; return KS_OK;
    case KS__JV_BOOL: *out = (ks_key){.type = KS_KEY_BOOL, .i = v->b}; return KS_OK;
    case KS__JV_INT: *out = (ks_key){.type = KS_KEY_INT, .i = v->i}; return KS_OK;
    case KS__JV_REAL: *out = (ks_key){.type = KS_KEY_FLOAT, .f = v->d}; return KS_OK;
    case KS__JV_STRING: *out = str_key(v->s, v->len); return KS_OK;
    default: return bad_key(b, at, "holds a key that is not a number, bool, null or string");
  }
}

static bool truthy(const ks__jv *v) {
  switch (v->type) {
    case KS__JV_NULL: return false;
    case KS__JV_BOOL: return v->b;
    case KS__JV_INT: return v->i != 0;
    case KS__JV_REAL: return v->d != 0.0;
    default: return v->len != 0;
  }
}

/* "i" of a real or a text: int() of it. */
static bool to_int(const ks__jv *v, int64_t *out) {
  if (v->type == KS__JV_INT || v->type == KS__JV_BOOL) {
    *out = v->type == KS__JV_INT ? v->i : v->b;
    return true;
  }
  if (v->type == KS__JV_REAL && isfinite(v->d) && fabs(v->d) < 9.2e18) {
    *out = (int64_t)v->d;
    return true;
  }
  if (v->type != KS__JV_STRING) return false;
  const char *s = v->s;
  size_t n = v->len;
  while (n && (*s == ' ' || *s == '\t' || *s == '\n')) s++, n--;
  while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\n')) n--;
  return int_text(s, n, out);
}

static bool to_float(const ks__jv *v, double *out) {
  if (v->type != KS__JV_STRING) {
    *out = ks__jv_number(v) + (v->type == KS__JV_BOOL && v->b);
    return v->type == KS__JV_INT || v->type == KS__JV_REAL || v->type == KS__JV_BOOL;
  }
  char *end = NULL;
  *out = strtod(v->s, &end);
  return v->len && end == v->s + v->len;
}

/* A key of 0.1.0's positional list: [code, key], codes i / f / b / s / n (other codes: the key as is). */
static KS_NODISCARD ks_status coded_key(builder *b, const pnode *at, const ks__jv *pair, ks_key *out) {
  if (!ks__jv_is(pair, KS__JV_ARRAY) || pair->len != 2 || !ks__jv_is(pair->items[0], KS__JV_STRING))
    return bad_key(b, at, "holds a key that is not a [code, key] pair");
  const char *code = pair->items[0]->s;
  const ks__jv *v = pair->items[1];
  bool ok = true;
  if (!strcmp(code, "n")) {
    *out = (ks_key){.type = KS_KEY_NONE};
  } else if (!strcmp(code, "i")) {
    *out = (ks_key){.type = KS_KEY_INT};
    ok = to_int(v, &out->i);
  } else if (!strcmp(code, "f")) {
    *out = (ks_key){.type = KS_KEY_FLOAT};
    ok = to_float(v, &out->f);
  } else if (!strcmp(code, "b")) {
    *out = (ks_key){.type = KS_KEY_BOOL, .i = truthy(v)};
  } else if (!strcmp(code, "s") && v->type != KS__JV_STRING) {
    if (v->type == KS__JV_BOOL || v->type == KS__JV_NULL) {
      const char *t = v->type == KS__JV_NULL ? "None" : v->b ? "True" : "False";
      *out = str_key(t, strlen(t));
    } else if (v->type == KS__JV_INT) {
      char *d = text_alloc(b->p, 24);
      if (!d) return KS_E_NOMEM;
      *out = str_key(d, (size_t)snprintf(d, 24, "%lld", (long long)v->i));
    } else {
      ok = false;
    }
  } else {
    return value_key(b, at, v, out);
  }
  return ok ? KS_OK : bad_key(b, at, "holds a key its code does not fit");
}

/* ---- records ---- */

/* path[0..n) NUL-terminated in the scratch buffer, for a lookup. */
static KS_NODISCARD ks_status scratch_text(builder *b, const char *path, size_t n) {
  if (n + 1 > b->scratch_cap) {
    size_t cap = 2 * n + 64;
    char *s = ks__realloc(b->p->a, b->scratch, cap);
    if (!s) return KS_E_NOMEM;
    b->scratch = s, b->scratch_cap = cap;
  }
  memcpy(b->scratch, path, n);
  b->scratch[n] = 0;
  return KS_OK;
}

static KS_NODISCARD ks_status rec_of(builder *b, const char *path, size_t n, rec *r) {
  *r = (rec){R_NONE, 0, NULL};
  if (!b->containers && !b->leaves && !b->table) return KS_OK;
  if (scratch_text(b, path, n)) return KS_E_NOMEM;
  static const char *const kinds[] = {"list", "tuple", "set", "dict", "intdict", "value"};
  static const rtype types[] = {R_LIST, R_TUPLE, R_SET, R_DICT, R_INTDICT, R_VALUE};
  if (b->documented) {
    const ks__jv *c = ks__jv_get(b->containers, b->scratch), *kind = ks__jv_get(c, "kind");
    const char *k = ks__jv_string(kind);
    for (size_t i = 0; k && i < 6; i++)
      if (i != 4 && !strcmp(k, kinds[i])) r->type = types[i];
    const ks__jv *keys = ks__jv_get(c, "keys");
    if (r->type == R_DICT && ks__jv_is(keys, KS__JV_OBJECT) && keys->len) *r = (rec){R_KEYMAP, 0, keys};
  } else {
    const ks__jv *t = ks__jv_get(b->table, b->scratch);
    const char *k = ks__jv_string(t);
    if (t && t->type != KS__JV_NULL) r->type = R_OTHER;
    for (size_t i = 0; k && i < 5; i++)
      if (!strcmp(k, kinds[i])) r->type = types[i];
    if (ks__jv_is(t, KS__JV_OBJECT)) *r = (rec){R_POSKEYS, 0, ks__jv_get(t, "keys")};
    if (r->type == R_OTHER && k) {
      if (!strcmp(k, "bigint")) *r = (rec){R_LEAF, KS_LEAF_BIGINT, NULL};
      if (!strcmp(k, "ndarray")) *r = (rec){R_LEAF, KS_LEAF_NDARRAY, NULL};
      if (!strcmp(k, "bytes")) *r = (rec){R_LEAF, KS_LEAF_BYTES, NULL};
    }
    return KS_OK;
  }
  const char *l = ks__jv_string(ks__jv_get(b->leaves, b->scratch));
  if (l && !strcmp(l, "bigint")) *r = (rec){R_LEAF, KS_LEAF_BIGINT, NULL};
  if (l && !strcmp(l, "ndarray")) *r = (rec){R_LEAF, KS_LEAF_NDARRAY, NULL};
  if (l && !strcmp(l, "bytes")) *r = (rec){R_LEAF, KS_LEAF_BYTES, NULL};
  return KS_OK;
}

static bool is_container(rtype t) { return t != R_NONE && t != R_VALUE && t != R_OTHER && t != R_LEAF; }

/* ---- the trie ---- */

static uint64_t slot_hash(size_t parent, const char *s, size_t n) {
  uint64_t h = 1469598103934665603ull ^ (uint64_t)parent * 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
  return h ^ (h >> 29);
}

static size_t find_kid(const builder *b, size_t parent, const char *seg, size_t n, size_t *slot) {
  size_t mask = b->n_slots - 1, i = (size_t)slot_hash(parent, seg, n) & mask;
  for (;; i = (i + 1) & mask) {
    size_t id = b->slots[i];
    if (id == NONE_ID) break;
    const pnode *x = &b->pn[id];
    if (x->parent == parent && x->seg_len == n && !memcmp(x->seg, seg, n)) break;
  }
  if (slot) *slot = i;
  return b->slots[i];
}

static KS_NODISCARD ks_status grow(builder *b) {
  if (b->n == b->cap) {
    size_t cap = b->cap * 2;
    pnode *pn = ks__realloc(b->p->a, b->pn, cap * sizeof *pn);
    if (!pn) return KS_E_NOMEM;
    b->pn = pn, b->cap = cap;
  }
  if (2 * (b->n + 1) <= b->n_slots) return KS_OK;
  size_t n_slots = b->n_slots * 2, *slots = ks__malloc(b->p->a, n_slots * sizeof *slots);
  if (!slots) return KS_E_NOMEM;
  ks__free(b->p->a, b->slots);
  b->slots = slots, b->n_slots = n_slots;
  for (size_t i = 0; i < n_slots; i++) slots[i] = NONE_ID;
  for (size_t id = 1, s; id < b->n; id++) {
    (void)find_kid(b, b->pn[id].parent, b->pn[id].seg, b->pn[id].seg_len, &s);
    slots[s] = id;
  }
  return KS_OK;
}

/* The node of path[start..n) (components under the prefix), made as needed. */
static KS_NODISCARD ks_status insert(builder *b, const char *path, size_t start, size_t n, size_t *out) {
  size_t node = 0, depth = 0;
  for (size_t i = start; i <= n;) {
    const char *slash = memchr(path + i, '/', n - i);
    size_t end = slash ? (size_t)(slash - path) : n, slot;
    if (++depth > KS_PLAN_MAX_DEPTH)
      return ks__err(b->err, KS_E_LIMIT, "'%.*s' is deeper than %d components", (int)n, path, KS_PLAN_MAX_DEPTH);
    if (grow(b)) return KS_E_NOMEM;
    size_t id = find_kid(b, node, path + i, end - i, &slot);
    if (id == NONE_ID) {
      id = b->n++;
      b->pn[id] = (pnode){path + i, path, end - i, end, node, NONE_ID, NONE_ID, NONE_ID, 0, NONE_ID};
      b->slots[slot] = id;
      pnode *p = &b->pn[node];
      if (p->last_kid == NONE_ID) p->first_kid = id;
      else b->pn[p->last_kid].next = id;
      p->last_kid = id;
      p->nkids++;
    }
    node = id;
    i = end + 1;
  }
  *out = node;
  return KS_OK;
}

/* ---- the plan ---- */

typedef struct seqkid {
  int64_t index;
  size_t id;
} seqkid;

static int by_index(const void *x, const void *y) {
  const seqkid *a = x, *b = y;
  if (a->index != b->index) return a->index < b->index ? -1 : 1;
  return a->id < b->id ? -1 : a->id > b->id;
}

static size_t *slots_for(builder *b, ks_plan_node *o, size_t n) {
  o->first = b->n_kids, o->n = n;
  b->n_kids += n;
  return b->p->kids + o->first;
}

static KS_NODISCARD ks_status plan_sequence(builder *b, const pnode *x, ks_plan_node *o) {
  seqkid *k = ks__malloc(b->p->a, (x->nkids ? x->nkids : 1) * sizeof *k);
  if (!k) return KS_E_NOMEM;
  size_t n = 0;
  for (size_t id = x->first_kid; id != NONE_ID; id = b->pn[id].next) {
    k[n] = (seqkid){index_of(b->pn[id].seg, b->pn[id].seg_len), id};
    if (k[n++].index < 0) { /* not every name an index: no items */
      n = 0;
      break;
    }
  }
  qsort(k, n, sizeof *k, by_index);
  size_t *slots = slots_for(b, o, n);
  for (size_t i = 0; i < n; i++) {
    slots[i] = k[i].id;
    b->p->nodes[k[i].id].key = (ks_key){.type = KS_KEY_INT, .i = k[i].index};
  }
  ks__free(b->p->a, k);
  return KS_OK;
}

static KS_NODISCARD ks_status plan_poskeys(builder *b, const pnode *x, size_t self, const ks__jv *keys,
                                           ks_plan_node *o) {
  if (keys && keys->type != KS__JV_ARRAY) return bad_key(b, x, "has keys that are not a list");
  size_t n = 0, cap = keys ? keys->len : 0, *slots = NULL;
  for (size_t i = 0; i < cap; i++) {
    char name[24];
    size_t len = (size_t)snprintf(name, sizeof name, "%zu", i), id = find_kid(b, self, name, len, NULL);
    if (id == NONE_ID) continue;
    ks_key key;
    ks_status s = coded_key(b, x, keys->items[i], &key);
    if (s) return s;
    if (!slots) slots = slots_for(b, o, x->nkids);
    slots[n++] = id;
    b->p->nodes[id].key = key;
  }
  o->n = n;
  b->n_kids -= slots ? x->nkids - n : 0;
  return KS_OK;
}

static KS_NODISCARD ks_status plan_dict(builder *b, const pnode *x, const rec *r, ks_plan_node *o) {
  size_t *slots = slots_for(b, o, x->nkids), n = 0;
  bool all_idx = x->nkids > 0;
  for (size_t id = x->first_kid; id != NONE_ID; id = b->pn[id].next) {
    const pnode *c = &b->pn[id];
    ks_plan_node *k = &b->p->nodes[id];
    slots[n++] = id;
    const ks__jv *typed = NULL;
    if (r->type == R_KEYMAP) {
      if (scratch_text(b, c->seg, c->seg_len)) return KS_E_NOMEM;
      typed = ks__jv_get(r->v, b->scratch);
    }
    if (typed) {
      ks_status s = value_key(b, c, typed, &k->key);
      if (s) return s;
    } else if (r->type == R_INTDICT) {
      k->key = (ks_key){.type = KS_KEY_INT};
      if (!int_text(c->seg, c->seg_len, &k->key.i))
        return bad_key(b, c, "is an item of an int-keyed dict whose name is not an int");
    } else if (seg_key(b, c->seg, c->seg_len, &k->key)) {
      return KS_E_NOMEM;
    }
    if (r->type == R_NONE) {
      k->text = k->key;
      k->index = index_of(c->seg, c->seg_len);
      all_idx = all_idx && k->index >= 0;
    }
  }
  if (r->type != R_NONE) return KS_OK;
  o->tag = KS_PLAN_GUESS;
  o->int_keys = !b->documented && all_idx; /* files without a document: decimal names were int keys */
  for (size_t i = 0; o->int_keys && i < n; i++)
    b->p->nodes[slots[i]].key = (ks_key){.type = KS_KEY_INT, .i = b->p->nodes[slots[i]].index};
  return KS_OK;
}

static KS_NODISCARD ks_status plan_self(builder *b, size_t id, const char *prefix) {
  const pnode *x = &b->pn[id];
  ks_plan_node *o = &b->p->nodes[id];
  rec r;
  if (rec_of(b, x->path, x->path_len, &r)) return KS_E_NOMEM;
  if (x->leaf != NONE_ID && !x->nkids) {
    o->tag = KS_PLAN_LEAF, o->name = x->leaf, o->leaf_kind = r.type == R_LEAF ? r.leaf_kind : 0;
    return KS_OK;
  }
  if (!id && !*prefix && r.type == R_VALUE) { /* torch.save(value): the one entry "value" */
    size_t v = find_kid(b, 0, "value", 5, NULL);
    o->tag = KS_PLAN_NONE;
    if (v != NONE_ID && b->pn[v].leaf != NONE_ID) {
      rec vr;
      if (rec_of(b, "value", 5, &vr)) return KS_E_NOMEM;
      o->tag = KS_PLAN_LEAF, o->name = b->pn[v].leaf, o->leaf_kind = vr.type == R_LEAF ? vr.leaf_kind : 0;
    }
    return KS_OK;
  }
  switch (r.type) {
    case R_LIST: case R_TUPLE: case R_SET:
      o->tag = r.type == R_LIST ? KS_PLAN_LIST : r.type == R_TUPLE ? KS_PLAN_TUPLE : KS_PLAN_SET;
      return plan_sequence(b, x, o);
    case R_POSKEYS: o->tag = KS_PLAN_KEYED; return plan_poskeys(b, x, id, r.v, o);
    case R_KEYMAP: o->tag = KS_PLAN_KEYED; return plan_dict(b, x, &r, o);
    default: o->tag = KS_PLAN_DICT; return plan_dict(b, x, &r, o);
  }
}

/* What node `id` is, then its children: only folders the value reaches are read (a sequence
   whose names are not indices has no items, and what lies under it is not looked at). The
   depth is bounded by KS_PLAN_MAX_DEPTH. */
static KS_NODISCARD ks_status plan_node(builder *b, size_t id, const char *prefix) {
  ks_status s = plan_self(b, id, prefix);
  const ks_plan_node *o = &b->p->nodes[id];
  for (size_t i = 0; !s && o->tag != KS_PLAN_LEAF && i < o->n; i++) s = plan_node(b, b->p->kids[o->first + i], prefix);
  return s;
}

static KS_NODISCARD ks_status parse_records(builder *b, const char *document, size_t dlen, const char *pytree,
                                            size_t plen) {
  ks__jv *doc = NULL;
  if (document) {
    b->what = KS_TORCH_STRUCTURE_META;
    ks_status s = dlen ? ks__jv_parse(b->p->a, document, dlen, b->what, &doc, NULL) : KS_OK;
    if (s == KS_E_NOMEM) return s;
    if (s) return KS_OK; /* not JSON: no record at all, as files without one */
    b->documented = true;
    b->p->records = doc;
    b->containers = ks__jv_is(ks__jv_get(doc, "containers"), KS__JV_OBJECT) ? ks__jv_get(doc, "containers") : NULL;
    b->leaves = ks__jv_is(ks__jv_get(doc, "leaves"), KS__JV_OBJECT) ? ks__jv_get(doc, "leaves") : NULL;
    return KS_OK;
  }
  b->what = KS_META_PYTREE;
  if (!pytree) return KS_OK;
  ks_status s = ks__jv_parse(b->p->a, pytree, plen, b->what, &doc, NULL);
  if (s == KS_E_NOMEM) return s;
  b->p->records = doc;
  b->table = ks__jv_is(doc, KS__JV_OBJECT) ? doc : NULL;
  return KS_OK;
}

/* Empty containers have no entries: only the records know them. */
static KS_NODISCARD ks_status add_recorded(builder *b, const ks__jv *obj, const char *prefix, size_t pl) {
  for (size_t i = 0; obj && i < obj->len; i++) {
    const char *k = obj->keys[i];
    size_t n = strlen(k), at;
    if ((pl && strncmp(k, prefix, pl)) || n == pl) continue;
    rec r;
    if (rec_of(b, k, n, &r)) return KS_E_NOMEM;
    if (!is_container(r.type)) continue;
    ks_status s = insert(b, k, pl, n, &at);
    if (s) return s;
  }
  return KS_OK;
}

static KS_NODISCARD ks_status build(builder *b, const char *const *names, const size_t *lens, size_t n_names,
                                    const char *prefix) {
  size_t pl = strlen(prefix), root_len = pl;
  while (root_len && prefix[root_len - 1] == '/') root_len--;
  b->cap = 64, b->n_slots = 128;
  b->pn = ks__malloc(b->p->a, b->cap * sizeof *b->pn);
  b->slots = ks__malloc(b->p->a, b->n_slots * sizeof *b->slots);
  if (!b->pn || !b->slots) return KS_E_NOMEM;
  for (size_t i = 0; i < b->n_slots; i++) b->slots[i] = NONE_ID;
  b->pn[0] = (pnode){"", prefix, 0, root_len, NONE_ID, NONE_ID, NONE_ID, NONE_ID, 0, NONE_ID};
  b->n = 1;
  for (size_t i = 0; i < n_names; i++) {
    if (!names[i] || lens[i] < pl || memcmp(names[i], prefix, pl)) continue;
    size_t at = 0;
    ks_status s = lens[i] == pl ? KS_OK : insert(b, names[i], pl, lens[i], &at);
    if (s) return s;
    b->pn[at].leaf = i;
  }
  ks_status s = add_recorded(b, b->documented ? b->containers : b->table, prefix, pl);
  if (s) return s;
  b->p->nodes = ks__calloc(b->p->a, b->n, sizeof *b->p->nodes);
  b->p->kids = ks__malloc(b->p->a, b->n * sizeof *b->p->kids);
  if (!b->p->nodes || !b->p->kids) return KS_E_NOMEM;
  b->p->n_nodes = b->n;
  for (size_t id = 0; id < b->n; id++) b->p->nodes[id] = (ks_plan_node){.key = {.type = KS_KEY_NONE}, .index = -1};
  return plan_node(b, 0, prefix);
}

ks_status ks_structure_plan(const char *document, size_t document_len, const char *pytree, size_t pytree_len,
                            const char *const *names, const size_t *name_lens, size_t n_names, const char *prefix,
                            const ks_allocator *alloc, ks_plan **out, ks_error *err) {
  if (!out || !prefix || (n_names && (!names || !name_lens)))
    return ks__err(err, KS_E_INVALID, "ks_structure_plan: NULL argument");
  *out = NULL;
  ks_plan *p = ks__calloc(alloc, 1, sizeof *p);
  if (!p) return ks__err(err, KS_E_NOMEM, "structure plan: out of memory");
  p->a = alloc;
  builder b = {.p = p, .err = err};
  ks_status s = parse_records(&b, document, document_len, pytree, pytree_len);
  if (!s) s = build(&b, names, name_lens, n_names, prefix);
  ks__free(alloc, b.pn);
  ks__free(alloc, b.slots);
  ks__free(alloc, b.scratch);
  if (s) {
    ks_plan_free(p);
    return s == KS_E_NOMEM ? ks__err(err, s, "structure plan: out of memory") : s;
  }
  *out = p;
  return KS_OK;
}

const ks_plan_node *ks_plan_at(const ks_plan *p, size_t i) { return p && i < p->n_nodes ? &p->nodes[i] : NULL; }

size_t ks_plan_child(const ks_plan *p, size_t i) { return p->kids[i]; }

void ks_plan_free(ks_plan *p) {
  if (!p) return;
  ks__jv_free(p->a, p->records);
  for (chunk *c = p->texts, *prev; c; c = prev) {
    prev = c->prev;
    ks__free(p->a, c);
  }
  ks__free(p->a, p->nodes);
  ks__free(p->a, p->kids);
  ks__free(p->a, p);
}
