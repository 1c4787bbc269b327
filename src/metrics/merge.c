/*
 * Cross-process reduction (merge) and deep copies. Both prepare every
 * allocation first and only then commit, so a failure leaves dst untouched.
 */
#include <math.h>
#include <string.h>

#include "metrics/internal.h"

/* Described metrics (described.c) must also declare the same states, in the same order. */
static int same_states(const ks_metric *dst, const ks_metric *src) {
  if (dst->n_states != src->n_states) return 0;
  for (size_t i = 0; i < dst->n_states; i++) {
    const ks__state *d = &dst->st[i], *s = &src->st[i];
    if (strcmp(d->name, s->name) || d->reduce != s->reduce) return 0;
    if (d->reduce != KS_REDUCE_CAT && d->nbytes != s->nbytes) return 0;
    if (d->reduce != KS_REDUCE_CAT && d->dtype != s->dtype) return 0;
  }
  return 1;
}

static KS_NODISCARD ks_status check_same_kind(const ks_metric *dst, const ks_metric *src, int inner_ok,
                                               ks_error *err) {
  const char *dc = ks_metric_class(dst), *sc = ks_metric_class(src);
  const char *da = dst->args_json ? dst->args_json : "", *sa = src->args_json ? src->args_json : "";
  if (dst->cls != src->cls || strcmp(dc, sc))
    return ks__err(err, KS_E_MISMATCH, "cannot merge %s into %s", sc, dc);
  if (strcmp(da, sa) != 0)
    return ks__err(err, KS_E_MISMATCH, "cannot merge %s%s into %s%s: arguments differ", sc, sa, dc, da);
  if (!same_states(dst, src))
    return ks__err(err, KS_E_MISMATCH, "cannot merge %s into %s: the states differ", sc, dc);
  if (!inner_ok && (dst->n_inner || src->n_inner))
    return ks__err(err, KS_E_UNSUPPORTED, "cannot merge %s: merge its inner metrics one by one", dc);
  return KS_OK;
}

/* Cat rows must agree in everything but the row count (CatMetric rows start unknown). A side with
 * no rows has no dtype to agree on either: a binding's empty list state says nothing of it. */
static KS_NODISCARD ks_status check_rows(const ks__state *d, const ks__state *s, ks_error *err) {
  if (s->shape[0] == 0 || d->shape[0] == 0) return KS_OK;
  if (d->dtype != s->dtype)
    return ks__err(err, KS_E_MISMATCH, "state '%s': rows of %s and of %s cannot be merged", d->name,
                   ks_dtype_name(s->dtype), ks_dtype_name(d->dtype));
  int same = d->rank == s->rank;
  for (int i = 1; same && i < d->rank; i++) same = d->shape[i] == s->shape[i];
  if (!same) return ks__err(err, KS_E_SHAPE, "state '%s': rows of different shapes cannot be merged", d->name);
  return KS_OK;
}

static void merge_cat(ks__state *d, const ks__state *s) {
  if (s->nbytes == 0) return;
  /* torchmetrics' merge_state puts the incoming rows first. */
  memmove((char *)d->data + s->nbytes, d->data, d->nbytes);
  memcpy(d->data, s->data, s->nbytes);
  if (d->shape[0] == 0) {
    d->dtype = s->dtype;
    d->rank = s->rank;
    memcpy(d->shape, s->shape, sizeof d->shape);
    d->shape[0] = 0;
    d->row_known = s->row_known;
  }
  d->shape[0] += s->shape[0];
  d->nbytes += s->nbytes;
}

static double reduce_one(ks_reduce r, double a, double b, double wa, double wb) {
  switch (r) {
    case KS_REDUCE_SUM: return a + b;
    case KS_REDUCE_MAX: return isnan(a) || isnan(b) ? NAN : fmax(a, b); /* torch.max propagates NaN */
    case KS_REDUCE_MIN: return isnan(a) || isnan(b) ? NAN : fmin(a, b);
    default: return (wa + wb) > 0 ? (a * wa + b * wb) / (wa + wb) : (a + b) / 2;
  }
}

static void merge_fixed(ks__state *d, const ks__state *s, double wd, double ws) {
  size_t n = d->nbytes / ks_dtype_size(d->dtype);
  if (d->dtype == KS_I64 && d->reduce == KS_REDUCE_SUM) {
    int64_t *a = d->data;
    const int64_t *b = s->data;
    for (size_t i = 0; i < n; i++) a[i] = (int64_t)((uint64_t)a[i] + (uint64_t)b[i]);
    return;
  }
  if (d->dtype == KS_F32 && d->reduce == KS_REDUCE_SUM) {
    float *a = d->data;
    const float *b = s->data;
    for (size_t i = 0; i < n; i++) a[i] += b[i];
    return;
  }
  for (size_t i = 0; i < n; i++) {
    double v = reduce_one(d->reduce, ks_dtype_get_f64(d->dtype, d->data, i),
                          ks_dtype_get_f64(s->dtype, s->data, i), wd, ws);
    ks_dtype_set_f64(d->dtype, d->data, i, v);
  }
}

/* ks_metric_merge of the metric's own states and update count; inner metrics, when inner_ok, are left
   to the caller (ks_metric_fold merges them part by part). */
static KS_NODISCARD ks_status merge_own(ks_metric *dst, const ks_metric *src, int inner_ok, ks_error *err) {
  if (!dst || !src) return ks__err(err, KS_E_INVALID, "ks_metric_merge: NULL argument");
  if (dst == src) return ks__err(err, KS_E_INVALID, "ks_metric_merge: a metric cannot merge itself");
  ks_status st = check_same_kind(dst, src, inner_ok, err);
  for (size_t i = 0; !st && i < dst->n_states; i++)
    if (dst->st[i].reduce == KS_REDUCE_CAT) st = check_rows(&dst->st[i], &src->st[i], err);
  for (size_t i = 0; !st && i < dst->n_states; i++) {
    ks__state *d = &dst->st[i];
    const ks__state *s = &src->st[i];
    if (d->reduce == KS_REDUCE_CAT && s->shape[0] > 0) {
      uint64_t rows = (uint64_t)s->nbytes / (ks__state_row_bytes(s) ? ks__state_row_bytes(s) : 1);
      if (d->shape[0] == 0) {
        /* d's row shape may still be unknown: size the buffer by bytes. */
        st = ks__cat_reserve(dst, d, 0, err);
        if (!st && s->nbytes > d->cap) {
          void *p = ks__realloc(&dst->alloc, d->data, s->nbytes);
          if (!p) st = ks__err(err, KS_E_NOMEM, "out of memory merging '%s'", d->name);
          else {
            d->data = p;
            d->cap = s->nbytes;
          }
        }
      } else
        st = ks__cat_reserve(dst, d, rows, err);
    }
  }
  if (st) return st;
  double wd = (double)dst->update_count, ws = (double)src->update_count;
  for (size_t i = 0; i < dst->n_states; i++) {
    if (dst->st[i].reduce == KS_REDUCE_CAT) merge_cat(&dst->st[i], &src->st[i]);
    else merge_fixed(&dst->st[i], &src->st[i], wd, ws);
  }
  ks__free(&dst->alloc, dst->computed.data);
  memset(&dst->computed, 0, sizeof dst->computed);
  dst->has_computed = 0;
  dst->update_count += src->update_count;
  return KS_OK;
}

ks_status ks_metric_merge(ks_metric *dst, const ks_metric *src, ks_error *err) { return merge_own(dst, src, 0, err); }

/* A wrapper folds part by part: its own states, then each inner metric's (the same names, in order). */
static KS_NODISCARD ks_status merge_parts(ks_metric *dst, const ks_metric *src, ks_error *err) {
  if (dst && src && dst->n_inner != src->n_inner)
    return ks__err(err, KS_E_MISMATCH, "cannot merge %s: %zu inner metrics into %zu", ks_metric_class(dst),
                   src->n_inner, dst->n_inner);
  ks_status st = merge_own(dst, src, 1, err);
  for (size_t i = 0; !st && i < dst->n_inner; i++) {
    if (strcmp(dst->inner_names[i], src->inner_names[i]))
      return ks__err(err, KS_E_MISMATCH, "cannot merge %s: inner metric '%s' against '%s'", ks_metric_class(dst),
                     src->inner_names[i], dst->inner_names[i]);
    st = merge_parts(dst->inner[i], src->inner[i], err);
  }
  return st;
}

static void *dup_bytes(const ks_allocator *a, const void *p, size_t n) {
  void *q = ks__malloc(a, n ? n : 1);
  if (q && n) memcpy(q, p, n);
  return q;
}

ks_status ks_metric_clone(const ks_metric *m, const ks_allocator *alloc, ks_metric **out, ks_error *err) {
  if (!m || !out) return ks__err(err, KS_E_INVALID, "ks_metric_clone: NULL argument");
  const ks_allocator *a = alloc ? alloc : &m->alloc;
  ks_metric *c = ks__calloc(a, 1, sizeof *c);
  if (!c) return ks__err(err, KS_E_NOMEM, "out of memory cloning %s", ks_metric_class(m));
  *c = *m;
  c->alloc = *a;
  int fail = ks__described_clone(m, c, a) != KS_OK;
  memset(&c->args, 0, sizeof c->args);
  c->args_json = NULL;
  c->has_computed = 0;
  memset(&c->computed, 0, sizeof c->computed);
  for (size_t i = 0; i < c->n_states; i++) {
    c->st[i].data = NULL;
    c->st[i].cap = 0;
  }
  if (!fail) fail = ks__args_copy(a, &m->args, &c->args) != KS_OK;
  if (!fail && m->args_json) fail = !(c->args_json = ks__strdup(a, m->args_json));
  for (size_t i = 0; !fail && i < c->n_states; i++) {
    c->st[i].data = dup_bytes(a, m->st[i].data, m->st[i].nbytes);
    c->st[i].cap = m->st[i].nbytes;
    fail = !c->st[i].data;
  }
  if (!fail && m->has_computed) {
    c->computed = m->computed;
    c->computed.data = dup_bytes(a, m->computed.data, m->computed.nbytes);
    fail = !c->computed.data;
    c->has_computed = !fail;
  }
  if (fail) {
    ks_metric_free(c);
    return ks__err(err, KS_E_NOMEM, "out of memory cloning %s", ks_metric_class(m));
  }
  *out = c;
  return KS_OK;
}

ks_status ks_metric_fold(const ks_metric *const *parts, size_t n, const ks_allocator *alloc, ks_metric **out,
                         ks_error *err) {
  if (!parts || !n || !out) return ks__err(err, KS_E_INVALID, "ks_metric_fold: no parts");
  for (size_t i = 0; i < n; i++)
    if (!parts[i]) return ks__err(err, KS_E_INVALID, "ks_metric_fold: part %zu is NULL", i);
  ks_metric *acc = NULL;
  ks_status st = ks_metric_clone(parts[n - 1], alloc, &acc, err);
  for (size_t i = n - 1; !st && i-- > 0;) st = merge_parts(acc, parts[i], err);
  if (st) {
    ks_metric_free(acc);
    return st;
  }
  *out = acc;
  return KS_OK;
}
