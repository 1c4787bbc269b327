/*
 * Moving states in and out of state dicts: names exactly torchmetrics', the
 * schema-1 migration (`value` -> mean_value...), the () <-> (n,) reshape of
 * MSE/MAE sums and the dtype policy (widen freely, narrow only when allowed).
 * A load validates and converts every state into fresh buffers before it
 * installs any of them.
 */
#include <stdio.h>
#include <string.h>

#include "metrics/inputs.h"
#include "metrics/internal.h"

static KS_NODISCARD ks_status full_name(const char *prefix, const char *name, char *buf, size_t cap, ks_error *err) {
  int n = snprintf(buf, cap, "%s%s", prefix ? prefix : "", name);
  if (n < 0 || (size_t)n >= cap || n > KS_MAX_NAME)
    return ks__err_at(err, KS_E_LIMIT, NULL, prefix, -1,
                      "state key '%.200s...%s' is longer than %d bytes (KS_MAX_NAME)", prefix ? prefix : "", name,
                      KS_MAX_NAME);
  return KS_OK;
}

ks_status ks_metric_to_state_dict(const ks_metric *m, ks_statedict *dst, const char *prefix, ks_error *err) {
  if (!m || !dst) return ks__err(err, KS_E_INVALID, "ks_metric_to_state_dict: NULL argument");
  char name[KS_MAX_NAME + 2];
  for (size_t i = 0; i < m->n_states; i++) {
    const ks__state *s = &m->st[i];
    ks_status st = full_name(prefix, s->name, name, sizeof name, err);
    if (st) return st;
    ks_tensor t;
    if ((st = ks_tensor_init(&t, s->dtype, s->rank, s->shape, s->data)))
      return ks__err_at(err, st, NULL, name, -1, "state '%s' has a bad shape", name);
    st = ks_statedict_set_tensor(dst, name, &t, KS_COPY, err);
    if (st) return ks__err_at(err, st, NULL, name, -1, "cannot store state: %s", ks_strerror(st));
  }
  return KS_OK;
}

/* A state ready to be installed. */
typedef struct staged {
  void *data;
  size_t nbytes;
  ks_dtype dtype; /* the state's, or the stored one for an any-dtype cat state */
  int rank;
  int64_t shape[KS_MAX_RANK];
} staged;

static KS_NODISCARD ks_status find_entry(const ks_statedict *src, const char *prefix, const ks__state *s, int version,
                            ks_entry *e, int *migrated, char *name, ks_error *err) {
  ks_status st;
  if (version < 2 && s->legacy_name) {
    if ((st = full_name(prefix, s->legacy_name, name, KS_MAX_NAME + 2, err))) return st;
    if (ks_statedict_get(src, name, e) == KS_OK) {
      *migrated = 1;
      return KS_OK;
    }
  }
  if ((st = full_name(prefix, s->name, name, KS_MAX_NAME + 2, err))) return st;
  if (ks_statedict_get(src, name, e) != KS_OK)
    return ks__err_at(err, KS_E_NOTFOUND, NULL, name, -1, "state '%s' is missing (looked for '%s')", s->name, name);
  if (e->kind != KS_VAL_TENSOR)
    return ks__err_at(err, KS_E_INVALID, NULL, name, -1, "state '%s' is not a tensor", s->name);
  return KS_OK;
}

static KS_NODISCARD ks_status check_fixed_shape(const ks__state *s, const ks_tensor *t, int *migrated, const char *name,
                                   ks_error *err) {
  if (t->rank == s->rank) {
    int same = 1;
    for (int i = 0; i < s->rank; i++) same &= t->shape[i] == s->shape[i];
    if (same) return KS_OK;
  }
  uint64_t want = 1;
  for (int i = 0; i < s->rank; i++) want *= (uint64_t)s->shape[i];
  int counts_agree = ks_tensor_numel(t) == want, broadcast = s->reshape_ok == 2 && t->rank == 0;
  if (s->reshape_ok && t->rank <= 1 && s->rank <= 1 && (counts_agree || broadcast)) {
    *migrated = 1;
    return KS_OK;
  }
  char a[128], b[128];
  return ks__err_at(err, KS_E_SHAPE, NULL, name, -1, "state '%s': expected shape %s, found %s", s->name,
                    ks_shape_format(s->rank, s->shape, a, sizeof a), ks_shape_format(t->rank, t->shape, b, sizeof b));
}

/* No rows at all: an empty list, which a writer that does not know the row shape stores as [0]. */
static int no_rows(const ks_tensor *t) { return t->rank == 1 && t->shape[0] == 0; }

static KS_NODISCARD ks_status check_cat_shape(const ks__state *s, const ks_tensor *t, const char *name, ks_error *err) {
  if (no_rows(t)) return KS_OK;
  int ok = t->rank >= 1;
  if (ok && !s->row_dynamic) {
    ok = t->rank == s->rank;
    for (int i = 1; ok && i < s->rank; i++) ok = t->shape[i] == s->shape[i];
  }
  if (ok) return KS_OK;
  char b[128];
  return ks__err_at(err, KS_E_SHAPE, NULL, name, -1, "state '%s': rows of shape %s do not fit", s->name,
                    ks_shape_format(t->rank, t->shape, b, sizeof b));
}

static KS_NODISCARD ks_status check_dtype(const ks__state *s, ks_dtype found, int allow_narrowing, int *converted,
                             const char *name, ks_error *err) {
  if (found == s->dtype || s->any_dtype) return KS_OK;
  if (!ks_dtype_widens_to(found, s->dtype) && !allow_narrowing)
    return ks__err_at(err, KS_E_DTYPE, NULL, name, -1,
                      "state '%s' is %s; converting it to %s would lose precision (narrowing not allowed)",
                      s->name, ks_dtype_name(found), ks_dtype_name(s->dtype));
  *converted = 1;
  return KS_OK;
}

/* Copies a state's value, converting its dtype; a fixed state given one value for n broadcasts it. */
static KS_NODISCARD ks_status stage_one(const ks_metric *m, const ks__state *s, const ks_tensor *t, staged *out,
                           const char *name, ks_error *err) {
  ks_dtype dt = s->any_dtype ? t->dtype : s->dtype;
  size_t n = ks__numel(t), nbytes;
  if (s->reduce != KS_REDUCE_CAT && n == 1) n = s->nbytes / ks_dtype_size(dt);
  if (!ks__mul_size(n, ks_dtype_size(dt), &nbytes))
    return ks__err_at(err, KS_E_LIMIT, NULL, name, -1, "state too large");
  out->data = ks__malloc(&m->alloc, nbytes ? nbytes : 1);
  if (!out->data) return ks__err_at(err, KS_E_NOMEM, NULL, name, -1, "out of memory loading the state");
  out->dtype = dt;
  size_t src_n = ks__numel(t), esz = ks_dtype_size(dt);
  if (t->dtype == dt) {
    if (src_n) memcpy(out->data, t->data, src_n * esz);
  } else if (ks_dtype_convert(dt, out->data, t->dtype, t->data, src_n)) {
    ks__free(&m->alloc, out->data);
    out->data = NULL;
    return ks__err_at(err, KS_E_DTYPE, NULL, name, -1, "cannot convert %s to %s", ks_dtype_name(t->dtype),
                      ks_dtype_name(s->dtype));
  }
  for (size_t i = src_n; i < n; i++) memcpy((char *)out->data + i * esz, out->data, esz); /* broadcast */
  out->nbytes = nbytes;
  if (s->reduce == KS_REDUCE_CAT && no_rows(t)) {
    out->rank = s->rank; /* the declared rows, none of them */
    memcpy(out->shape, s->shape, sizeof out->shape);
    out->shape[0] = 0;
  } else if (s->reduce == KS_REDUCE_CAT) {
    out->rank = t->rank;
    memcpy(out->shape, t->shape, sizeof out->shape);
  } else {
    out->rank = s->rank;
    memcpy(out->shape, s->shape, sizeof out->shape);
  }
  return KS_OK;
}

static KS_NODISCARD ks_status stage_state(const ks_metric *m, const ks_statedict *src, const char *prefix, int version,
                             int allow_narrowing, size_t i, staged *out, int *migrated, int *converted,
                             ks_error *err) {
  const ks__state *s = &m->st[i];
  char name[KS_MAX_NAME + 2];
  ks_entry e;
  ks_status st = find_entry(src, prefix, s, version, &e, migrated, name, err);
  if (!st) st = ks__check_input(&e.tensor, name, err);
  if (!st && s->reduce == KS_REDUCE_CAT) st = check_cat_shape(s, &e.tensor, name, err);
  else if (!st) st = check_fixed_shape(s, &e.tensor, migrated, name, err);
  /* No rows: no value to lose, whatever dtype the writer gave its empty list (bindings cannot know it). */
  int empty = s->reduce == KS_REDUCE_CAT && no_rows(&e.tensor);
  if (!st && !empty) st = check_dtype(s, e.tensor.dtype, allow_narrowing, converted, name, err);
  if (!st) st = stage_one(m, s, &e.tensor, out, name, err);
  return st;
}

/* Cat states of one metric (preds and target of a curve) hold one row per sample each. */
static KS_NODISCARD ks_status check_cat_rows(const ks_metric *m, const staged *sg, const char *prefix, ks_error *err) {
  const ks__state *first = NULL;
  int64_t rows = 0;
  for (size_t i = 0; i < m->n_states; i++) {
    if (m->st[i].reduce != KS_REDUCE_CAT) continue;
    if (!first) {
      first = &m->st[i];
      rows = sg[i].shape[0];
    } else if (sg[i].shape[0] != rows) {
      char name[KS_MAX_NAME + 2];
      if (full_name(prefix, m->st[i].name, name, sizeof name, NULL)) /* too long: the state's own name */
        snprintf(name, sizeof name, "%s", m->st[i].name);
      return ks__err_at(err, KS_E_SHAPE, NULL, name, -1, "state '%s' has %lld rows but '%s' has %lld",
                        m->st[i].name, (long long)sg[i].shape[0], first->name, (long long)rows);
    }
  }
  return KS_OK;
}

static void install(ks_metric *m, staged *sg) {
  for (size_t i = 0; i < m->n_states; i++) {
    ks__state *s = &m->st[i];
    ks__free(&m->alloc, s->data);
    s->data = sg[i].data;
    s->nbytes = sg[i].nbytes;
    s->dtype = sg[i].dtype;
    s->cap = sg[i].nbytes;
    s->rank = sg[i].rank;
    memcpy(s->shape, sg[i].shape, sizeof s->shape);
    if (s->reduce == KS_REDUCE_CAT && s->row_dynamic) s->row_known = s->shape[0] > 0 || s->rank > 1;
  }
  ks__free(&m->alloc, m->computed.data);
  memset(&m->computed, 0, sizeof m->computed);
  m->has_computed = 0;
}

ks_status ks_metric_load_state_dict(ks_metric *m, const ks_statedict *src, const char *prefix,
                                    int schema_version, int allow_narrowing, int *migrated, int *converted,
                                    ks_error *err) {
  if (!m || !src) return ks__err(err, KS_E_INVALID, "ks_metric_load_state_dict: NULL argument");
  if (schema_version < 1 || schema_version > KS_METRIC_SCHEMA_VERSION)
    return ks__err(err, KS_E_VERSION, "metric state schema version %d is not supported (1..%d)",
                   schema_version, KS_METRIC_SCHEMA_VERSION);
  staged sg[KS__MAX_DESCRIBED_STATES];
  memset(sg, 0, sizeof sg);
  int mig = 0, conv = 0;
  ks_status st = KS_OK;
  for (size_t i = 0; !st && i < m->n_states; i++)
    st = stage_state(m, src, prefix, schema_version, allow_narrowing, i, &sg[i], &mig, &conv, err);
  if (!st) st = check_cat_rows(m, sg, prefix, err);
  if (st) {
    for (size_t i = 0; i < m->n_states; i++) ks__free(&m->alloc, sg[i].data);
    return st;
  }
  install(m, sg);
  if (migrated) *migrated = mig;
  if (converted) *converted = conv;
  return KS_OK;
}

ks_status ks_metric_restore_computed(ks_metric *m, const ks_tensor *computed, int64_t update_count,
                                     ks_error *err) {
  if (!m) return ks__err(err, KS_E_INVALID, "ks_metric_restore_computed: NULL metric");
  if (update_count < 0) return ks__err(err, KS_E_INVALID, "update count %lld is negative", (long long)update_count);
  ks_tensor copy;
  memset(&copy, 0, sizeof copy);
  if (computed) {
    ks_status st = ks__check_input(computed, "_computed", err);
    if (st) return st;
    void *p = ks__malloc(&m->alloc, computed->nbytes ? computed->nbytes : 1);
    if (!p) return ks__err(err, KS_E_NOMEM, "out of memory restoring _computed");
    if (computed->nbytes) memcpy(p, computed->data, computed->nbytes);
    if ((st = ks_tensor_init(&copy, computed->dtype, computed->rank, computed->shape, p))) {
      ks__free(&m->alloc, p);
      return ks__err(err, st, "_computed has a bad shape");
    }
    copy.ownership = KS_OWNED;
  }
  ks__free(&m->alloc, m->computed.data);
  m->computed = copy;
  m->has_computed = computed != NULL;
  m->update_count = update_count;
  return KS_OK;
}
