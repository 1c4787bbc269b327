/*
 * Described metrics: a program's metric as the load engine sees it, without an
 * implementation. Any torchmetrics class is described by its states (name,
 * reduction, dtype, shape), so the one set of load rules (state_io.c,
 * state/load_metrics.c) and the one merge rule (merge.c) serve classes the
 * catalogue lacks. A catalogue class built from the same attributes lends its
 * canonical arguments, legacy state names and reshape rules: the rules stay here.
 */
#include <string.h>

#include "core/json.h"
#include "core/keys.h"
#include "metrics/internal.h"

static KS_NODISCARD ks_status no_update(ks_metric *m, const ks_tensor *in, size_t n, ks_error *err) {
  (void)in;
  (void)n;
  return ks__err(err, KS_E_UNSUPPORTED, "%s is a described metric: it holds states, it cannot update",
                 m->described);
}

static KS_NODISCARD ks_status no_compute(ks_metric *m, ks_tensor *out, ks_error *err) {
  (void)out;
  return ks__err(err, KS_E_UNSUPPORTED, "%s is a described metric: it holds states, it cannot compute",
                 m->described);
}

static const ks__class described_class = {.name = "", .update = no_update, .compute = no_compute};

int ks__metric_is_described(const ks_metric *m) { return m && m->described != NULL; }

/*
 * The attributes without the null ones (but ignore_index): torchmetrics keeps attributes the
 * catalogue class does not take, unset (JaccardIndex's normalize=None, from ConfusionMatrix).
 * NULL when there is nothing to drop, or out of memory.
 */
static char *without_nulls(const ks_allocator *a, const char *attrs_json) {
  ks__jv *doc = NULL, *out = NULL;
  char *txt = NULL;
  if (ks__jv_parse(a, attrs_json, strlen(attrs_json), "attributes", &doc, NULL) || !ks__jv_is(doc, KS__JV_OBJECT))
    goto done;
  out = ks__jv_object(a);
  size_t kept = 0;
  for (size_t i = 0; out && i < doc->len; i++) {
    if (ks__jv_is(doc->items[i], KS__JV_NULL) && strcmp(doc->keys[i], "ignore_index")) continue;
    ks__jv *v = ks__jv_copy(a, doc->items[i]);
    if (!v || ks__jv_set(a, out, doc->keys[i], v)) goto done;
    kept++;
  }
  if (out && kept < doc->len) txt = ks__jv_dump(a, out, true);
done:
  ks__jv_free(a, doc);
  ks__jv_free(a, out);
  return txt;
}

/* The catalogue class of the same name built from the attributes, when both allow it. */
static KS_NODISCARD ks_status find_twin(ks_metric *m, const char *class_name, const char *attrs_json, ks_error *err) {
  if (!attrs_json || !ks__class_find(class_name)) return KS_OK;
  ks_metric *twin = NULL;
  ks_status st = ks_metric_from_attributes(class_name, attrs_json, &m->alloc, NULL, &twin, NULL);
  if (!st && !twin) {
    char *trimmed = without_nulls(&m->alloc, attrs_json);
    if (trimmed) st = ks_metric_from_attributes(class_name, trimmed, &m->alloc, NULL, &twin, NULL);
    ks__free(&m->alloc, trimmed);
  }
  if (st == KS_E_NOMEM) return ks__err(err, st, "out of memory describing %s", class_name);
  if (st || !twin) return KS_OK; /* attributes that give no arguments: compared by class only */
  m->args_json = ks__strdup(&m->alloc, twin->args_json);
  if (!m->args_json) {
    ks_metric_free(twin);
    return ks__err(err, KS_E_NOMEM, "out of memory describing %s", class_name);
  }
  m->twin = twin;
  return KS_OK;
}

ks_status ks_metric_describe(const char *class_name, const char *attrs_json, const ks_allocator *alloc,
                             ks_metric **out, ks_error *err) {
  if (!class_name || !*class_name || !out) return ks__err(err, KS_E_INVALID, "ks_metric_describe: bad argument");
  ks_status st = ks__name_check(class_name, err);
  if (st) return st;
  ks_metric *m = ks__calloc(alloc, 1, sizeof *m);
  if (!m) return ks__err(err, KS_E_NOMEM, "out of memory describing %s", class_name);
  m->alloc = *ks__alloc_or_default(alloc);
  m->cls = &described_class;
  m->st = ks__calloc(&m->alloc, KS__MAX_DESCRIBED_STATES, sizeof *m->st);
  if (!m->st) {
    ks__free(&m->alloc, m);
    return ks__err(err, KS_E_NOMEM, "out of memory describing %s", class_name);
  }
  m->cap_states = KS__MAX_DESCRIBED_STATES;
  m->described = ks__strdup(&m->alloc, class_name);
  st = m->described ? find_twin(m, class_name, attrs_json, err)
                    : ks__err(err, KS_E_NOMEM, "out of memory describing %s", class_name);
  if (st) {
    ks_metric_free(m);
    return st;
  }
  *out = m;
  return KS_OK;
}

static const ks__state *twin_state(const ks_metric *m, const char *name) {
  for (size_t i = 0; m->twin && i < m->twin->n_states; i++)
    if (!strcmp(m->twin->st[i].name, name)) return &m->twin->st[i];
  return NULL;
}

static KS_NODISCARD ks_status check_new_state(const ks_metric *m, const char *name, ks_reduce reduce, int rank,
                                              const int64_t *shape, ks_error *err) {
  if (!m || !m->described || !name)
    return ks__err(err, KS_E_INVALID, "ks_metric_describe_state: not a described metric");
  ks_status st = ks__name_check(name, err);
  if (st) return st;
  if (reduce < KS_REDUCE_SUM || reduce > KS_REDUCE_CAT || rank < 0 || rank > KS_MAX_RANK || (rank && !shape))
    return ks__err_at(err, KS_E_INVALID, NULL, name, -1, "state '%s': bad reduction or shape", name);
  for (int i = 0; i < rank; i++)
    if (shape[i] < 0) return ks__err_at(err, KS_E_INVALID, NULL, name, -1, "state '%s': negative size", name);
  for (size_t i = 0; i < m->n_states; i++)
    if (!strcmp(m->st[i].name, name))
      return ks__err_at(err, KS_E_INVALID, NULL, name, -1, "state '%s' is declared twice", name);
  return KS_OK;
}

ks_status ks_metric_describe_state(ks_metric *m, const char *name, ks_reduce reduce, ks_dtype dtype, int rank,
                                   const int64_t *shape, unsigned flags, ks_error *err) {
  ks_status st = check_new_state(m, name, reduce, rank, shape, err);
  if (st) return st;
  char *own = ks__strdup(&m->alloc, name);
  if (!own) return ks__err(err, KS_E_NOMEM, "out of memory describing state '%s'", name);
  int64_t sh[KS_MAX_RANK] = {0};
  for (int i = 0; i < rank; i++) sh[i] = shape[i];
  const ks__state *t = twin_state(m, name);
  if (reduce == KS_REDUCE_CAT && t && t->reduce == KS_REDUCE_CAT && !t->row_dynamic) {
    rank = t->rank; /* the catalogue fixes the rows' shape (a curve's preds: (n, num_classes)) */
    memcpy(sh, t->shape, sizeof sh);
  }
  if (reduce == KS_REDUCE_CAT && rank == 0) rank = 1; /* rows of scalars */
  if (reduce == KS_REDUCE_CAT) sh[0] = 0;
  st = ks__state_declare(m, own, reduce, dtype, rank, sh, 0.0, err);
  if (st) {
    ks__free(&m->alloc, own);
    return st;
  }
  ks__state *s = ks__state_last(m);
  s->legacy_name = t ? t->legacy_name : NULL;
  s->reshape_ok = t ? t->reshape_ok : 0;
  s->row_dynamic = reduce == KS_REDUCE_CAT && (!t || t->reduce != KS_REDUCE_CAT || t->row_dynamic);
  s->any_dtype = reduce == KS_REDUCE_CAT && (flags & KS_STATE_ANY_DTYPE);
  return KS_OK;
}

ks_status ks_metric_add_inner(ks_metric *m, const char *name, ks_metric *inner, ks_error *err) {
  if (!m || !m->described || !inner || !inner->described || inner == m || !name)
    return ks__err(err, KS_E_INVALID, "ks_metric_add_inner: both metrics must be described");
  return ks__metric_add_inner(m, name, inner, err);
}

/* A wrapper built by ks_metric_create (wrapper.c) holds a catalogue metric, which computes. */
ks_status ks__metric_add_inner(ks_metric *m, const char *name, ks_metric *inner, ks_error *err) {
  ks_status st = ks__name_check(name, err);
  if (st) return st;
  for (size_t i = 0; i < m->n_inner; i++)
    if (!strcmp(m->inner_names[i], name)) return ks__err(err, KS_E_EXISTS, "inner metric '%s' exists", name);
  size_t cap = m->cap_inner;
  st = ks__grow(&m->alloc, &m->inner, &cap, m->n_inner + 1, sizeof *m->inner);
  if (!st) st = ks__grow(&m->alloc, &m->inner_names, &m->cap_inner, m->n_inner + 1, sizeof *m->inner_names);
  char *own = st ? NULL : ks__strdup(&m->alloc, name);
  if (!own) return ks__err(err, KS_E_NOMEM, "out of memory adding inner metric '%s'", name);
  m->inner[m->n_inner] = inner;
  m->inner_names[m->n_inner++] = own;
  return KS_OK;
}

/* ---- attributes: what a wrapper keeps besides its states, checked and staged by a load ---- */

static KS_NODISCARD ks_status check_new_attr(const ks_metric *m, const char *name, ks_dtype dtype, int rank,
                                             const int64_t *shape, unsigned flags, int64_t min, int64_t max,
                                             ks_error *err) {
  if (!m || !m->described || !name)
    return ks__err(err, KS_E_INVALID, "ks_metric_describe_attr: not a described metric");
  ks_status st = ks__name_check(name, err);
  if (st) return st;
  if (flags & ~KS_ATTR_INT) return ks__err_at(err, KS_E_INVALID, NULL, name, -1, "attribute '%s': bad flags", name);
  if (flags & KS_ATTR_INT) {
    if (dtype != KS_I64 || rank != 0 || min > max)
      return ks__err_at(err, KS_E_INVALID, NULL, name, -1, "attribute '%s': an integer is I64 of rank 0, min <= max",
                        name);
  } else {
    uint64_t numel;
    if (rank < 0 || rank > KS_MAX_RANK || (rank && !shape) || ks_dtype_size(dtype) == 0 ||
        ks_shape_size(dtype, rank, shape, &numel, NULL))
      return ks__err_at(err, KS_E_INVALID, NULL, name, -1, "attribute '%s': bad dtype or shape", name);
  }
  for (size_t i = 0; i < m->n_attrs; i++)
    if (!strcmp(m->attrs[i].name, name))
      return ks__err_at(err, KS_E_INVALID, NULL, name, -1, "attribute '%s' is declared twice", name);
  if (m->n_attrs >= KS__MAX_ATTRS)
    return ks__err_at(err, KS_E_LIMIT, NULL, name, -1, "more than %d attributes", KS__MAX_ATTRS);
  return KS_OK;
}

ks_status ks_metric_describe_attr(ks_metric *m, const char *name, ks_dtype dtype, int rank, const int64_t *shape,
                                  unsigned flags, int64_t min, int64_t max, ks_error *err) {
  ks_status st = check_new_attr(m, name, dtype, rank, shape, flags, min, max, err);
  if (st) return st;
  st = ks__grow(&m->alloc, &m->attrs, &m->cap_attrs, m->n_attrs + 1, sizeof *m->attrs);
  char *own = st ? NULL : ks__strdup(&m->alloc, name);
  if (!own) return ks__err(err, KS_E_NOMEM, "out of memory describing attribute '%s'", name);
  ks__attr *a = &m->attrs[m->n_attrs++];
  memset(a, 0, sizeof *a);
  a->name = own;
  a->dtype = dtype;
  a->rank = rank;
  for (int i = 0; i < rank; i++) a->shape[i] = shape[i];
  a->flags = flags;
  a->min = min;
  a->max = max;
  return KS_OK;
}

void ks__attrs_unstage(ks_metric *m) {
  for (size_t i = 0; i < m->n_attrs; i++) {
    ks__free(&m->alloc, m->attrs[i].data);
    m->attrs[i].data = NULL;
    m->attrs[i].nbytes = 0;
    m->attrs[i].staged = 0;
  }
}

static const char *kind_name(ks_value_kind k) {
  static const char *const names[] = {"a tensor", "an integer", "a float", "a bool", "a string", "None"};
  return (unsigned)k < sizeof names / sizeof *names ? names[k] : "a value";
}

/* Whether the entry e fits attribute a; the refusal in err. */
static KS_NODISCARD ks_status attr_fits(const ks__attr *a, const char *key, const ks_entry *e, ks_error *err) {
  if (a->flags & KS_ATTR_INT) {
    if (e->kind != KS_VAL_INT)
      return ks__err_at(err, KS_E_DTYPE, NULL, key, -1, "attribute '%s': %s in the checkpoint, an integer in the "
                        "program", a->name, kind_name(e->kind));
    if (e->i < a->min || e->i > a->max)
      return ks__err_at(err, KS_E_MISMATCH, NULL, key, -1, "attribute '%s' is %lld in the checkpoint, outside "
                        "[%lld, %lld]", a->name, (long long)e->i, (long long)a->min, (long long)a->max);
    return KS_OK;
  }
  if (e->kind != KS_VAL_TENSOR)
    return ks__err_at(err, KS_E_DTYPE, NULL, key, -1, "attribute '%s': %s in the checkpoint, a %s tensor in the "
                      "program", a->name, kind_name(e->kind), ks_dtype_name(a->dtype));
  if (e->tensor.dtype != a->dtype)
    return ks__err_at(err, KS_E_DTYPE, NULL, key, -1, "attribute '%s': %s in the checkpoint, %s in the program",
                      a->name, ks_dtype_name(e->tensor.dtype), ks_dtype_name(a->dtype));
  int same = e->tensor.rank == a->rank;
  for (int i = 0; same && i < a->rank; i++) same = e->tensor.shape[i] == a->shape[i];
  if (!same)
    return ks__err_at(err, KS_E_SHAPE, NULL, key, -1, "attribute '%s': another shape in the checkpoint (rank %d) "
                      "than in the program (rank %d)", a->name, e->tensor.rank, a->rank);
  return KS_OK;
}

/* A copy of an attribute's n bytes (one byte for an empty one, so NULL only means out of memory). */
static void *attr_bytes(const ks_allocator *a, const void *p, size_t n) {
  void *c = ks__malloc(a, n ? n : 1);
  if (c && n) memcpy(c, p, n);
  return c;
}

ks_status ks_metric_load_attrs(ks_metric *m, const ks_statedict *src, const char *prefix, ks_error *err) {
  if (!m || !src || !prefix) return ks__err(err, KS_E_INVALID, "ks_metric_load_attrs: NULL argument");
  if (!m->cls->wrapper) ks__attrs_unstage(m); /* a refused load leaves a binding's metric none */
  char key[KS__KEY_MAX + 1];
  ks_entry e;
  for (size_t i = 0; i < m->n_attrs; i++) { /* every one checked before any is staged */
    const ks__attr *a = &m->attrs[i];
    if (ks__key(key, prefix, a->name)) return ks__key_limit(err, prefix, a->name);
    if (ks_statedict_get(src, key, &e))
      return ks__err_at(err, KS_E_NOTFOUND, NULL, key, -1, "attribute '%s' is not in the checkpoint", a->name);
    ks_status st = attr_fits(a, key, &e, err);
    if (st) return st;
  }
  /* Every copy is made before any value is replaced: a live wrapper (wrapper.c) keeps its values on
   * a refusal or a failure. */
  void *copies[KS__MAX_ATTRS] = {0};
  for (size_t i = 0; i < m->n_attrs; i++) {
    const ks__attr *a = &m->attrs[i];
    if (a->flags & KS_ATTR_INT || ks__key(key, prefix, a->name) || ks_statedict_get(src, key, &e)) continue;
    if (!(copies[i] = attr_bytes(&m->alloc, e.tensor.data, e.tensor.nbytes))) {
      for (size_t j = 0; j < i; j++) ks__free(&m->alloc, copies[j]);
      return ks__err_at(err, KS_E_NOMEM, NULL, key, -1, "out of memory staging attribute '%s'", a->name);
    }
  }
  ks__attrs_unstage(m);
  for (size_t i = 0; i < m->n_attrs; i++) {
    ks__attr *a = &m->attrs[i];
    if (ks__key(key, prefix, a->name) || ks_statedict_get(src, key, &e)) continue; /* checked above */
    if (a->flags & KS_ATTR_INT) {
      a->ival = e.i;
    } else {
      a->data = copies[i];
      a->nbytes = e.tensor.nbytes;
    }
    a->staged = 1;
  }
  return KS_OK;
}

ks_status ks_metric_attr_at(const ks_metric *m, size_t i, const char **name, unsigned *flags, ks_tensor *value) {
  if (!m || i >= m->n_attrs) return KS_E_NOTFOUND;
  const ks__attr *a = &m->attrs[i];
  if (name) *name = a->name;
  if (flags) *flags = a->flags;
  if (!value) return KS_OK;
  memset(value, 0, sizeof *value);
  value->dtype = a->dtype;
  value->rank = a->rank;
  for (int d = 0; d < a->rank; d++) value->shape[d] = a->shape[d];
  if (a->staged) {
    value->data = (a->flags & KS_ATTR_INT) ? (void *)(uintptr_t)&a->ival : a->data;
    value->nbytes = (a->flags & KS_ATTR_INT) ? sizeof a->ival : a->nbytes;
  }
  return KS_OK;
}

size_t ks_metric_inner_count(const ks_metric *m) { return m ? m->n_inner : 0; }

ks_metric *ks_metric_inner_at(const ks_metric *m, size_t i, const char **name) {
  if (!m || i >= m->n_inner) return NULL;
  if (name) *name = m->inner_names[i];
  return m->inner[i];
}

void ks__described_free(ks_metric *m) {
  if (m->st != m->st_inline) {
    for (size_t i = 0; m->described && i < m->n_states; i++) ks__free(&m->alloc, (char *)m->st[i].name);
    ks__free(&m->alloc, m->st);
    m->st = m->st_inline;
    m->n_states = 0;
  }
  ks__attrs_unstage(m);
  for (size_t i = 0; i < m->n_attrs; i++) ks__free(&m->alloc, m->attrs[i].name);
  ks__free(&m->alloc, m->attrs);
  m->attrs = NULL;
  m->n_attrs = m->cap_attrs = 0;
  if (!m->described) return;
  for (size_t i = 0; i < m->n_inner; i++) {
    ks_metric_free(m->inner[i]);
    ks__free(&m->alloc, m->inner_names[i]);
  }
  ks__free(&m->alloc, m->inner);
  ks__free(&m->alloc, m->inner_names);
  ks_metric_free(m->twin);
  ks__free(&m->alloc, m->described);
}

/* The attribute declarations of m into c (names owned; nothing staged, a clone serves merges, but
 * for a live wrapper, whose attributes are its values). */
static KS_NODISCARD ks_status clone_attrs(const ks_metric *m, ks_metric *c, const ks_allocator *a) {
  if (!m->n_attrs) return KS_OK;
  c->attrs = ks__calloc(a, m->n_attrs, sizeof *c->attrs);
  if (!c->attrs) return KS_E_NOMEM;
  c->cap_attrs = m->n_attrs;
  for (size_t i = 0; i < m->n_attrs; i++) {
    c->attrs[i] = m->attrs[i];
    c->attrs[i].staged = 0;
    c->attrs[i].data = NULL;
    c->attrs[i].nbytes = 0;
    if (!(c->attrs[i].name = ks__strdup(a, m->attrs[i].name))) return KS_E_NOMEM;
    c->n_attrs = i + 1;
    if (!m->cls->wrapper || !m->attrs[i].staged) continue;
    c->attrs[i].ival = m->attrs[i].ival;
    if (m->attrs[i].data) {
      if (!(c->attrs[i].data = attr_bytes(a, m->attrs[i].data, m->attrs[i].nbytes))) return KS_E_NOMEM;
      c->attrs[i].nbytes = m->attrs[i].nbytes;
    }
    c->attrs[i].staged = 1;
  }
  return KS_OK;
}

ks_status ks__described_clone(const ks_metric *m, ks_metric *c, const ks_allocator *a) {
  c->attrs = NULL; /* copied last: until then the clone owns none */
  c->n_attrs = c->cap_attrs = 0;
  c->st = c->st_inline; /* a catalogue metric's states are inline; a described one's get their own array */
  if (m->st != m->st_inline) {
    ks__state *st = ks__calloc(a, m->cap_states, sizeof *st);
    if (!st) {
      c->n_states = 0;
      c->described = NULL;
      c->twin = NULL;
      c->inner = NULL;
      c->inner_names = NULL;
      c->n_inner = 0;
      return KS_E_NOMEM;
    }
    memcpy(st, m->st, m->n_states * sizeof *st);
    c->st = st;
  }
  c->described = NULL;
  c->twin = NULL; /* the twin only serves ks_metric_describe_state, which a clone never needs */
  c->inner = NULL;
  c->inner_names = NULL;
  c->n_inner = c->cap_inner = 0;
  if (!m->described) return KS_OK;
  for (size_t i = 0; i < c->n_states; i++) c->st[i].name = NULL;
  if (!(c->described = ks__strdup(a, m->described))) return KS_E_NOMEM; /* no name owned yet */
  int fail = 0;
  for (size_t i = 0; !fail && i < m->n_states; i++) fail = !(c->st[i].name = ks__strdup(a, m->st[i].name));
  for (size_t i = 0; !fail && i < m->n_inner; i++) {
    ks_metric *in = NULL;
    if (ks_metric_clone(m->inner[i], a, &in, NULL) == KS_OK && ks__metric_add_inner(c, m->inner_names[i], in, NULL))
      ks_metric_free(in);
    fail = c->n_inner != i + 1;
  }
  if (!fail) fail = clone_attrs(m, c, a) != KS_OK;
  return fail ? KS_E_NOMEM : KS_OK;
}

ks_status ks_reduce_parse(const char *name, ks_reduce *out) {
  static const char *const names[] = {"sum", "mean", "max", "min", "cat"}; /* ks_reduce order */
  if (!name || !out) return KS_E_NOTFOUND;
  if (!strncmp(name, "dim_zero_", 9)) name += 9; /* torchmetrics.utilities.data's names */
  for (size_t i = 0; i < sizeof names / sizeof *names; i++)
    if (!strcmp(name, names[i])) {
      *out = (ks_reduce)i;
      return KS_OK;
    }
  return KS_E_NOTFOUND;
}
