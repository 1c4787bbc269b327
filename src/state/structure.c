/*
 * The torch structure document (KS_TORCH_STRUCTURE_META, docs/FORMAT.md §10) of what the state
 * layer writes, so that `keepsake convert X.keepsake X.pt` of a C program's checkpoint is a
 * PyTorch checkpoint: an optimizer's `state` is a dict keyed by int parameter index, its
 * `param_groups` a list whose groups hold `params` as a list and `betas` as a tuple; a
 * scheduler's per-group values (`base_lrs`, `_last_lr`) are lists; `rng` is a list with one
 * item per rank, as Composer writes it. Every other folder is a str-keyed dict, which the
 * document leaves out.
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "keepsake/layout.h"
#include "keepsake/binding/structure.h"
#include "state/state_internal.h"

/* Nonzero for "0", "1", ... "123": the canonical decimal names of sequence items. */
static int is_index(const char *s, size_t n) {
  if (!n || n > 18 || (s[0] == '0' && n > 1)) return 0;
  for (size_t i = 0; i < n; i++)
    if (s[i] < '0' || s[i] > '9') return 0;
  return 1;
}

/* What the direct children of a folder are. */
typedef struct kids {
  size_t n;     /* distinct children */
  int all_idx;  /* every child is an index */
  int64_t max;  /* the largest index */
} kids;

/* The direct children of `folder` ("a/b", no trailing '/') among the names of sd. */
static KS_NODISCARD ks_status children(const ks_allocator *a, const ks_statedict *sd, const char *folder, kids *k) {
  *k = (kids){0, 1, -1};
  ks__jv *seen = ks__jv_object(a); /* a set: one child's entries need not be adjacent */
  ks_status s = seen ? KS_OK : KS_E_NOMEM;
  size_t fl = strlen(folder);
  ks_entry e;
  for (size_t i = 0; !s && ks_statedict_at(sd, i, &e) == KS_OK; i++) {
    if (strncmp(e.name, folder, fl) || e.name[fl] != '/') continue;
    const char *c = e.name + fl + 1, *slash = strchr(c, '/');
    size_t n = slash ? (size_t)(slash - c) : strlen(c);
    char comp[KS__KEY_MAX + 1];
    memcpy(comp, c, n), comp[n] = 0; /* n <= KS__KEY_MAX: a part of a name */
    if (ks__jv_get(seen, comp)) continue;
    if ((s = ks__jv_set(a, seen, comp, ks__jv_bool(a, true))) != KS_OK) break;
    k->n++;
    if (!is_index(c, n)) {
      k->all_idx = 0;
      continue;
    }
    int64_t v = strtoll(comp, NULL, 10);
    if (v > k->max) k->max = v;
  }
  ks__jv_free(a, seen);
  return s;
}

/* folder as a sequence of `kind` when its children are exactly 0..n-1 (else left a dict). */
static KS_NODISCARD ks_status seq(const ks_allocator *a, ks_structure *c, const ks_statedict *sd,
                                  const char *folder, ks_container_kind kind) {
  kids k;
  ks_status s = children(a, sd, folder, &k);
  if (s || !k.n || !k.all_idx || k.max + 1 != (int64_t)k.n) return s;
  return ks_structure_add_sequence(c, folder, kind, k.n, NULL);
}

/* An optimizer's `state`: a dict keyed by int parameter indices, as torch's state_dict() has it. */
static KS_NODISCARD ks_status int_keys(const ks_allocator *a, ks_structure *c, const ks_statedict *sd,
                                       const char *folder) {
  kids k;
  ks_status s = children(a, sd, folder, &k);
  if (s || !k.n || !k.all_idx) return s;
  size_t bytes, n = 0;
  ks_key *keys = ks__mul_size(k.n, sizeof *keys, &bytes) ? ks__malloc(a, bytes) : NULL;
  ks__jv *seen = ks__jv_object(a); /* one child's entries need not be adjacent */
  s = keys && seen ? KS_OK : KS_E_NOMEM;
  size_t fl = strlen(folder);
  ks_entry e;
  for (size_t i = 0; !s && ks_statedict_at(sd, i, &e) == KS_OK; i++) {
    if (strncmp(e.name, folder, fl) || e.name[fl] != '/') continue;
    char comp[24];
    const char *cp = e.name + fl + 1, *slash = strchr(cp, '/');
    size_t len = slash ? (size_t)(slash - cp) : strlen(cp);
    if (len >= sizeof comp) continue; /* not an index (all_idx says none is) */
    memcpy(comp, cp, len), comp[len] = 0;
    if (ks__jv_get(seen, comp) || n == k.n) continue;
    s = ks__jv_set(a, seen, comp, ks__jv_bool(a, true));
    keys[n++] = (ks_key){.type = KS_KEY_INT, .i = strtoll(comp, NULL, 10)};
  }
  if (!s) s = ks_structure_add_dict(c, folder, keys, n, NULL);
  ks__jv_free(a, seen);
  ks__free(a, keys);
  return s;
}

static KS_NODISCARD ks_status optimizer(const ks_allocator *a, ks_structure *c, const ks_statedict *sd, const char *p) {
  char f[KS__KEY_MAX + 1];
  if (ks__keyf(f, p, "state")) return KS_E_LIMIT;
  ks_status s = int_keys(a, c, sd, f);
  if (!s && ks__keyf(f, p, "param_groups")) return KS_E_LIMIT;
  if (!s) s = seq(a, c, sd, f, KS_CONTAINER_LIST);
  kids groups = {0, 0, -1};
  if (!s) s = children(a, sd, f, &groups);
  for (int64_t g = 0; !s && groups.all_idx && groups.max + 1 == (int64_t)groups.n && g <= groups.max; g++) {
    /* betas before params: the order torch's group dict has them in, so the document is the Python package's */
    if (ks__keyf(f, p, "param_groups/%lld/betas", (long long)g)) return KS_E_LIMIT;
    s = seq(a, c, sd, f, KS_CONTAINER_TUPLE);
    if (!s && ks__keyf(f, p, "param_groups/%lld/params", (long long)g)) return KS_E_LIMIT;
    if (!s) s = seq(a, c, sd, f, KS_CONTAINER_LIST);
  }
  return s;
}

/* A scheduler's folders of per-group values (base_lrs, _last_lr, ...). */
static KS_NODISCARD ks_status scheduler(const ks_allocator *a, ks_structure *c, const ks_statedict *sd, const char *p) {
  size_t pl = strlen(p);
  ks_entry e;
  ks__jv *done = ks__jv_object(a); /* folders already looked at: each is scanned once, list or not */
  ks_status s = done ? KS_OK : KS_E_NOMEM;
  for (size_t i = 0; !s && ks_statedict_at(sd, i, &e) == KS_OK; i++) {
    if (strncmp(e.name, p, pl)) continue;
    const char *slash = strchr(e.name + pl, '/');
    if (!slash) continue;
    char f[KS__KEY_MAX + 1];
    size_t n = (size_t)(slash - e.name);
    if (n > KS__KEY_MAX) continue;
    memcpy(f, e.name, n), f[n] = 0;
    if (ks__jv_get(done, f)) continue;
    s = ks__jv_set(a, done, f, ks__jv_bool(a, true));
    if (!s) s = seq(a, c, sd, f, KS_CONTAINER_LIST);
  }
  ks__jv_free(a, done);
  return s;
}

static KS_NODISCARD ks_status build(const ks_state *st, const ks_statedict *sd, const ks_allocator *a,
                                    ks_structure *c) {
  ks_status s = KS_OK;
  for (size_t i = 0; !s && i < st->n_comps; i++) {
    const st_comp *comp = &st->comps[i];
    if (comp->kind != ST_OPTIM && comp->kind != ST_SCHED) continue;
    char p[KS__KEY_MAX + 1];
    if (ks__comp_prefix(comp, p)) return KS_E_LIMIT;
    s = comp->kind == ST_OPTIM ? optimizer(a, c, sd, p) : scheduler(a, c, sd, p);
  }
  int rng = st->rng != NULL; /* the built-in generator, or a component under rng/ (a binding's) */
  for (size_t i = 0; i < st->n_comps; i++) rng |= st->comps[i].kind == ST_CUSTOM && st->comps[i].root == KS_ROOT_RNG;
  if (!s && rng) s = seq(a, c, sd, "rng", KS_CONTAINER_LIST);
  ks_entry e;
  for (size_t i = 0; !s && ks_statedict_at(sd, i, &e) == KS_OK; i++) { /* ks_statedict_mark_leaf's marks */
    int kind = ks__statedict_leaf(sd, i);
    if (kind) s = ks_structure_add_leaf(c, e.name, (ks_leaf_kind)kind, NULL);
  }
  return s;
}

ks_status ks__state_structure(const ks_state *st, const ks_statedict *sd, ks_meta *meta, ks_error *err) {
  const ks_allocator *a = ks__statedict_allocator(sd);
  ks_structure *c = NULL;
  char *text = NULL;
  ks_status s = ks_structure_create(a, &c, NULL);
  if (!s) s = build(st, sd, a, c);
  if (!s && !ks_structure_is_empty(c)) { /* nothing but str-keyed dicts: no document */
    s = ks_structure_dump(c, &text, NULL);
    if (!s) s = ks_meta_set(meta, KS_TORCH_STRUCTURE_META, text, err);
  }
  ks_structure_text_free(c, text);
  ks_structure_free(c);
  if (s == KS_E_LIMIT) return ks__err(err, s, "torch structure: a component name is too long");
  return s ? ks__err(err, s, "cannot record the torch structure of the state") : KS_OK;
}
