/*
 * Flattening: every leaf of a pickle tree becomes one state dict entry named by
 * its '/'-joined path (dict keys as written, sequence items by index). Inert
 * objects contribute `__class__` plus their BUILD state and appended items, so a
 * pickled torchmetrics object's tensors appear under the object's own path.
 *
 * Names never collide silently: '/' and '%' inside a key are percent-escaped,
 * and two values that still reach one name (an int key 1 beside a str key "1",
 * a state attribute named like an object's own `__class__`) are refused, as is
 * a name that is both a value and a folder. Shared references are copied once
 * per path, against a budget of output bytes relative to the input's size that
 * counts what the results hold in memory: an entry its name, its value and
 * KS__PK_ENTRY_BYTES (its record in the state dict), a container (each path to
 * it) its name plus KS__PK_CONTAINER_BYTES (its record in the structure
 * document), so neither a small DAG of shared containers nor a flood of one-byte
 * items can build records far beyond the input.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "keepsake/binding/structure.h"
#include "torch/torch_internal.h"

typedef struct flat {
  ks_statedict *sd;
  const ks__pk_limits *lim;
  ks_error *err;
  ks__structure *shape; /* container kinds, or NULL when not asked for */
  size_t len, entries, containers;
  uint64_t bytes;
  char path[KS_MAX_NAME + 2];
} flat;

static KS_NODISCARD ks_status visit(flat *f, const ks__pk_node *n, size_t depth);

static KS_NODISCARD ks_status too_long(flat *f) {
  return ks__err_at(f->err, KS_E_LIMIT, NULL, f->path, -1, "torch: key longer than %d bytes", KS_MAX_NAME);
}

/* Shared references are copied once per path: the total of names, records, tensors, bytes and
   strings is bounded against the input's size. */
static KS_NODISCARD ks_status spend(flat *f, uint64_t n) {
  if (n <= f->lim->max_output_bytes && f->bytes <= f->lim->max_output_bytes - n) {
    f->bytes += n;
    return KS_OK;
  }
  return ks__err_at(f->err, KS_E_LIMIT, NULL, f->path, -1,
                    "torch: flattened values would exceed %" PRIu64 " bytes (the budget for this input: "
                    "each entry and container counts with its record, and a value shared by many paths is "
                    "copied once per path)", f->lim->max_output_bytes);
}

/* Appends one component, percent-escaping '/' and '%' so that a key's own slashes stay its own. */
static KS_NODISCARD ks_status push_comp(flat *f, const char *s, size_t n, size_t *saved) {
  *saved = f->len;
  size_t need = f->len + (f->len ? 1 : 0) + ks__key_escaped_len(s, n);
  if (need > KS_MAX_NAME) return too_long(f);
  if (f->len) f->path[f->len++] = '/';
  f->len += ks__key_escape(s, n, f->path + f->len);
  f->path[f->len] = 0;
  return KS_OK;
}

static void pop_comp(flat *f, size_t saved) {
  f->len = saved;
  f->path[saved] = 0;
}

/* A key's name component, by core's one rule (ks_key_text): str and UTF-8 bytes keys as written
   (escaped when pushed), the others as text in buf. */
static KS_NODISCARD ks_status key_text(flat *f, const ks__pk_node *k, char *buf, size_t cap, const char **s,
                                       size_t *n) {
  ks_key key = {.type = KS_KEY_INT};
  switch (k->kind) {
    case PK_STR: *s = k->u.s.p, *n = k->u.s.n; return KS_OK;
    case PK_INT: key.i = k->u.i; break;
    case PK_BOOL: key.type = KS_KEY_BOOL, key.i = k->u.i; break;
    case PK_NONE: key.type = KS_KEY_NONE; break;
    case PK_FLOAT: key.type = KS_KEY_FLOAT, key.f = k->u.f; break;
    case PK_BYTES:
      if (ks__utf8_valid((const uint8_t *)k->u.s.p, k->u.s.n)) {
        *s = k->u.s.p, *n = k->u.s.n;
        return KS_OK;
      } /* fall through */
    default:
      return ks__err_at(f->err, KS_E_UNSUPPORTED, NULL, f->path, -1, "torch: dict key of type %s cannot name an entry",
                        ks__pk_kind_name(k->kind));
  }
  ks_status st = ks_key_text(&key, buf, cap, n, f->err);
  if (st) return ks__err_at(f->err, st, NULL, f->path, -1, "torch: a %s key on this path cannot name an entry",
                            ks__pk_kind_name(k->kind));
  *s = buf;
  return KS_OK;
}

static KS_NODISCARD ks_status visit_named(flat *f, const char *s, size_t n, const ks__pk_node *v, size_t depth) {
  size_t saved;
  ks_status st = push_comp(f, s, n, &saved);
  if (!st) st = visit(f, v, depth + 1);
  pop_comp(f, saved);
  return st;
}

static KS_NODISCARD ks_status visit_seq(flat *f, const ks__pk_seq *seq, size_t depth) {
  char buf[24];
  for (size_t i = 0; i < seq->n; i++) {
    int n = snprintf(buf, sizeof buf, "%zu", i);
    ks_status st = visit_named(f, buf, (size_t)n, seq->v[i], depth);
    if (st) return st;
  }
  return KS_OK;
}

typedef struct key_slot {
  char buf[40];  /* the text of a non-str key */
  const char *s; /* the text of a str key, or NULL for buf (structs move in qsort) */
  size_t n;
} key_slot;

static const char *slot_text(const key_slot *k) { return k->s ? k->s : k->buf; }

static int cmp_slot(const void *a, const void *b) {
  const key_slot *x = a, *y = b;
  size_t n = x->n < y->n ? x->n : y->n;
  int c = memcmp(slot_text(x), slot_text(y), n);
  return c ? c : (x->n > y->n) - (x->n < y->n);
}

/* Two keys of one dict that print alike (1 and "1", or a repeated key in a hostile pickle)
   would merge two values or folders into one name: refused. */
static KS_NODISCARD ks_status distinct_keys(flat *f, const ks__pk_seq *seq) {
  size_t n = seq->n / 2, bytes;
  if (n < 2) return KS_OK;
  const ks_allocator *a = ks__statedict_allocator(f->sd);
  key_slot *k = ks__mul_size(n, sizeof *k, &bytes) ? ks__malloc(a, bytes) : NULL;
  if (!k) return ks__err(f->err, KS_E_NOMEM, "torch: out of memory");
  ks_status st = KS_OK;
  for (size_t i = 0; i < n && !st; i++) {
    st = key_text(f, seq->v[2 * i], k[i].buf, sizeof k[i].buf, &k[i].s, &k[i].n);
    if (k[i].s == k[i].buf) k[i].s = NULL;
  }
  if (!st) qsort(k, n, sizeof *k, cmp_slot);
  for (size_t i = 0; i + 1 < n && !st; i++)
    if (!cmp_slot(&k[i], &k[i + 1]))
      st = ks__err_at(f->err, KS_E_EXISTS, NULL, f->path, -1,
                      "torch: two keys of %s%s%s flatten to the name '%.*s' (keys that print alike, e.g. 1 and '1')",
                      *f->path ? "'" : "the top-level dict", f->path, *f->path ? "'" : "", (int)k[i].n,
                      slot_text(&k[i]));
  ks__free(a, k);
  return st;
}

static KS_NODISCARD ks_status visit_dict(flat *f, const ks__pk_seq *seq, size_t depth) {
  char buf[40];
  /* Each key becomes at least an entry: a dict too large for the budget is refused before its keys are
     sorted (distinct_keys holds 56 bytes per key). */
  uint64_t least = (uint64_t)(seq->n / 2) * KS__PK_ENTRY_BYTES;
  ks_status dst = least > f->lim->max_output_bytes - f->bytes ? spend(f, least) : KS_OK;
  if (!dst) dst = distinct_keys(f, seq);
  if (dst) return dst;
  for (size_t i = 0; i + 1 < seq->n; i += 2) {
    const char *s = NULL;
    size_t n = 0;
    ks_status st = key_text(f, seq->v[i], buf, sizeof buf, &s, &n);
    if (!st && f->shape && seq->v[i]->kind != PK_STR)
      st = ks__structure_key(f->shape, f->path, seq->v[i], s, n, f->err);
    if (!st) st = visit_named(f, s, n, seq->v[i + 1], depth);
    if (st) return st;
  }
  return KS_OK;
}

static KS_NODISCARD ks_status check(flat *f, ks_status st) {
  if (st == KS_OK) return KS_OK;
  return ks__err_at(f->err, st, NULL, f->path, -1, "torch: cannot add entry: %s", ks_strerror(st));
}

/* A second value at a name already taken would replace the first: refuse instead. */
static KS_NODISCARD ks_status claim(flat *f) {
  ks_entry e;
  if (ks_statedict_get(f->sd, f->path, &e) != KS_OK) return KS_OK;
  return ks__err_at(f->err, KS_E_EXISTS, NULL, f->path, -1,
                    "torch: two values flatten to the name '%s' (keys that print alike, e.g. 1 and '1')", f->path);
}

static KS_NODISCARD ks_status add_class(flat *f, const ks__pk_node *cls) {
  char name[512];
  int w = cls && cls->kind == PK_GLOBAL ? snprintf(name, sizeof name, "%s.%s", cls->u.g.module, cls->u.g.name)
                                        : snprintf(name, sizeof name, "?");
  if (w < 0 || (size_t)w >= sizeof name) /* never stored cut short */
    return ks__err_at(f->err, KS_E_LIMIT, NULL, f->path, -1, "torch: class name of %d bytes is longer than %zu", w,
                      sizeof name - 1);
  size_t saved;
  ks_status st = push_comp(f, "__class__", 9, &saved);
  if (!st) st = claim(f);
  if (!st) st = spend(f, f->len + (uint64_t)w + KS__PK_ENTRY_BYTES);
  if (!st) st = check(f, ks_statedict_set_string(f->sd, f->path, name, NULL));
  pop_comp(f, saved);
  f->entries++;
  return st;
}

static KS_NODISCARD ks_status visit_object(flat *f, const ks__pk_node *o, size_t depth) {
  const ks__pk_node *state = o->u.obj->state, *items = o->u.obj->items, *args = o->u.obj->args;
  ks_status st = add_class(f, o->u.obj->cls);
  if (!st && state && state->kind == PK_DICT) st = visit_dict(f, &state->u.seq, depth);
  else if (!st && state && state->kind == PK_TUPLE) {
    for (size_t i = 0; !st && i < state->u.seq.n; i++) /* (dict, slots) */
      if (state->u.seq.v[i]->kind == PK_DICT) st = visit_dict(f, &state->u.seq.v[i]->u.seq, depth);
  } else if (!st && state)
    st = visit_named(f, "__state__", 9, state, depth);
  if (!st && items)
    st = items->kind == PK_DICT ? visit_dict(f, &items->u.seq, depth) : visit_seq(f, &items->u.seq, depth);
  /* A value object rebuilt from its arguments alone (datetime.timedelta(days, seconds, us),
     an enum member): the arguments are its value. */
  if (!st && !state && !items && args && args->kind == PK_TUPLE && args->u.seq.n)
    st = visit_named(f, "__args__", 8, args, depth);
  return st;
}

/* The decimal text the pickle machine made once (every reference shares it). */
static KS_NODISCARD ks_status bigint_text(flat *f, const ks__pk_node *n) {
  if (!n->u.s.p)
    return ks__err_at(f->err, KS_E_LIMIT, NULL, f->path, -1, "torch: integer of %zu bytes is longer than %d",
                      n->u.s.n, KS__PK_BIGINT_MAX);
  return check(f, ks_statedict_set_string(f->sd, f->path, n->u.s.p, NULL));
}

static KS_NODISCARD ks_status add_tensor(flat *f, const ks_tensor *t) {
  ks_take take = t->ownership == KS_BORROWED ? KS_COPY : KS_MAPPED_VIEW;
  ks_status st = spend(f, t->nbytes);
  return st ? st : check(f, ks_statedict_set_tensor(f->sd, f->path, t, take, NULL));
}

static KS_NODISCARD ks_status add_bytes(flat *f, const ks__pk_node *n) {
  ks_tensor t;
  int64_t len = (int64_t)n->u.s.n;
  ks_status st = spend(f, n->u.s.n);
  if (st) return st;
  st = ks_tensor_init(&t, KS_U8, 1, &len, n->u.s.n ? n->u.s.p : NULL);
  if (!st) st = ks_statedict_set_tensor(f->sd, f->path, &t, KS_MAPPED_VIEW, NULL);
  return check(f, st);
}

static KS_NODISCARD ks_status add_storage(flat *f, const ks__pk_node *n) {
  ks_tensor t;
  int64_t len = (int64_t)n->u.st.numel;
  ks_status st = ks_tensor_init(&t, n->u.st.dtype, 1, &len, len ? (void *)(uintptr_t)n->u.st.data : NULL);
  if (st) return check(f, st);
  t.ownership = KS_BORROWED;
  return add_tensor(f, &t);
}

static KS_NODISCARD ks_status leaf(flat *f, const ks__pk_node *n) {
  if (f->entries++ >= f->lim->max_entries)
    return ks__err_at(f->err, KS_E_LIMIT, NULL, f->path, -1, "torch: more than %zu entries", f->lim->max_entries);
  if (f->len == 0) { /* a bare value at the root (a tensor saved alone) */
    ks_status st = push_comp(f, "value", 5, &(size_t){0}); /* at the root: it always fits */
    if (!st && f->shape) st = ks__structure_bare_value(f->shape, f->err);
    if (st) return st;
  }
  if (n->kind <= PK_BYTES || n->kind == PK_TENSOR || n->kind == PK_STORAGE) {
    ks_status st = claim(f);
    uint64_t text = n->kind == PK_STR || (n->kind == PK_BIGINT && n->u.s.p) ? n->u.s.n : 0;
    if (!st) st = spend(f, f->len + text + KS__PK_ENTRY_BYTES);
    if (st) return st;
  }
  switch (n->kind) {
    case PK_NONE: return check(f, ks_statedict_set_null(f->sd, f->path, NULL));
    case PK_BOOL: return check(f, ks_statedict_set_bool(f->sd, f->path, (int)n->u.i, NULL));
    case PK_INT: return check(f, ks_statedict_set_int(f->sd, f->path, n->u.i, NULL));
    case PK_FLOAT: return check(f, ks_statedict_set_float(f->sd, f->path, n->u.f, NULL));
    case PK_STR: return check(f, ks_statedict_set_string(f->sd, f->path, n->u.s.p, NULL));
    case PK_BIGINT: return bigint_text(f, n);
    case PK_BYTES: return add_bytes(f, n);
    case PK_TENSOR: return add_tensor(f, n->u.t);
    case PK_STORAGE: return add_storage(f, n);
    default: f->entries--; return KS_OK; /* globals, dtypes: no data */
  }
}

static KS_NODISCARD ks_status visit(flat *f, const ks__pk_node *n, size_t depth) {
  if (depth > f->lim->max_depth)
    return ks__err_at(f->err, KS_E_LIMIT, NULL, f->path, -1, "torch: nesting deeper than %zu (or a cycle)",
                      f->lim->max_depth);
  /* Shared references make a small DAG of containers without leaves visit exponentially many paths. */
  bool container = n->kind == PK_DICT || n->kind == PK_TUPLE || n->kind == PK_LIST || n->kind == PK_SET ||
                   n->kind == PK_OBJECT;
  if (container && f->containers++ >= f->lim->max_entries)
    return ks__err_at(f->err, KS_E_LIMIT, NULL, f->path, -1,
                      "torch: more than %zu containers visited (shared references?)", f->lim->max_entries);
  if (container) { /* each path to a container records it (a second path copies it) */
    ks_status st = spend(f, (uint64_t)f->len + KS__PK_CONTAINER_BYTES);
    if (st) return st;
  }
  if (container && n->kind != PK_OBJECT && f->shape) {
    ks_status st = ks__structure_container(f->shape, f->path, n, f->err);
    if (st) return st;
  }
  switch (n->kind) {
    case PK_DICT: return visit_dict(f, &n->u.seq, depth);
    case PK_TUPLE:
    case PK_LIST:
    case PK_SET: return visit_seq(f, &n->u.seq, depth);
    case PK_OBJECT: return visit_object(f, n, depth);
    default: return leaf(f, n);
  }
}

ks_status ks__pk_flatten(const ks__pk_node *root, const ks__pk_arena *ar, const ks__pk_limits *lim,
                         ks_statedict *sd, ks_error *err) {
  (void)ar;
  return ks__pk_flatten_structured(root, lim, sd, NULL, err);
}

ks_status ks__pk_flatten_structured(const ks__pk_node *root, const ks__pk_limits *lim, ks_statedict *sd,
                                    ks__structure *shape, ks_error *err) {
  flat *f = ks__malloc(ks__statedict_allocator(sd), sizeof *f);
  if (!f) return ks__err(err, KS_E_NOMEM, "torch: out of memory");
  f->sd = sd;
  f->lim = lim;
  f->err = err;
  f->shape = shape;
  f->len = f->entries = f->containers = 0;
  f->bytes = 0;
  f->path[0] = 0;
  ks_status st = visit(f, root, 0);
  ks__free(ks__statedict_allocator(sd), f);
  if (!st) st = ks__torch_names_prefix_free(sd, err);
  return st;
}
