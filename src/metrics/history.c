/*
 * What older torchmetrics releases leave behind, read back: the state schema
 * of states stored without keepsake metadata, and the constructor arguments of
 * a pickled torchmetrics object rebuilt from its attributes. Anything that is
 * not certain is left out: a wrong class or argument would make the state
 * loader refuse a metric it could fill.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "metrics/internal.h"

/*
 * Counts every byte the metrics being probed allocate, and refuses past `cap`:
 * the attributes are untrusted, and num_classes = 100000 asks a confusion
 * matrix for 80 GB. Reallocations count their full new size (an upper bound).
 */
typedef struct budget {
  const ks_allocator *a;
  int capped, over;
  uint64_t left, cap;
} budget;

static int charge(budget *b, size_t n) {
  if (b->capped && n > b->left) return b->over = 1, 0;
  if (b->capped) b->left -= n;
  return 1;
}

static void *budget_malloc(void *ctx, size_t n) {
  budget *b = ctx;
  return charge(b, n) ? ks__malloc(b->a, n) : NULL;
}

static void *budget_realloc(void *ctx, void *p, size_t n) {
  budget *b = ctx;
  return charge(b, n) ? ks__realloc(b->a, p, n) : NULL;
}

static void budget_free(void *ctx, void *p) { ks__free(((budget *)ctx)->a, p); }

static KS_NODISCARD ks_status over(ks_error *err, const char *cls, const char *args, uint64_t cap) {
  return ks__err(err, KS_E_LIMIT,
                 "%s(%s) would allocate more than the %llu bytes left for metrics rebuilt from untrusted attributes",
                 cls, args, (unsigned long long)cap);
}

/* Builds cls(args) within the budget; KS_OK with *out NULL when the arguments do not build it. */
static KS_NODISCARD ks_status probe(const char *cls, const char *args, budget *b, ks_metric **out, ks_error *err) {
  ks_allocator ba = {budget_malloc, budget_realloc, budget_free, b};
  ks_error e;
  *out = NULL;
  ks_status st = ks_metric_create(cls, args, &ba, out, &e);
  if (b->over) return over(err, cls, args, b->cap);
  if (st == KS_E_NOMEM) return ks__err(err, st, "out of memory rebuilding %s", cls);
  return KS_OK;
}

/*
 * Whether the class takes a `thresholds` argument. A binned curve metric keeps
 * its thresholds as a tensor buffer, not as a plain attribute, so its arguments
 * cannot be read back from the attributes.
 */
static KS_NODISCARD ks_status takes_thresholds(const char *cls, const ks__jv *args, budget *b, int *takes,
                                               ks_error *err) {
  ks__jv *probe_args = ks__jv_copy(b->a, args);
  char *s = probe_args && !ks__jv_set(b->a, probe_args, "thresholds", ks__jv_null(b->a))
                ? ks__jv_dump(b->a, probe_args, true)
                : NULL;
  ks__jv_free(b->a, probe_args);
  if (!s) return ks__err(err, KS_E_NOMEM, "out of memory rebuilding %s", cls);
  ks_metric *m = NULL;
  ks_status st = probe(cls, s, b, &m, err);
  *takes = m != NULL;
  ks_metric_free(m);
  ks__free(b->a, s);
  return st;
}

/* The attributes that are constructor arguments (free with ks__jv_free); NULL when out of memory. */
static ks__jv *arg_attrs(const ks_allocator *a, const ks__jv *attrs) {
  ks__jv *args = ks__jv_object(a);
  for (size_t i = 0; args && i < attrs->len; i++)
    if (ks__args_known(attrs->keys[i]) && ks__jv_set(a, args, attrs->keys[i], ks__jv_copy(a, attrs->items[i]))) {
      ks__jv_free(a, args);
      return NULL;
    }
  return args;
}

static KS_NODISCARD ks_status from_attrs(const char *cls, const ks__jv *attrs, budget *b, char **canonical,
                                         uint64_t *cost, ks_error *err) {
  ks__jv *args = arg_attrs(b->a, attrs);
  char *s = args ? ks__jv_dump(b->a, args, true) : NULL;
  if (!s) {
    ks__jv_free(b->a, args);
    return ks__err(err, KS_E_NOMEM, "out of memory rebuilding %s", cls);
  }
  ks_metric *m = NULL;
  uint64_t before = b->left;
  ks_status st = probe(cls, s, b, &m, err);
  *cost = before - b->left;
  int takes = 0;
  if (!st && m && !ks__jv_get(args, "thresholds")) st = takes_thresholds(cls, args, b, &takes, err);
  if (!st && m && !takes) {
    *canonical = ks__strdup(b->a, ks_metric_args_json(m));
    if (!*canonical) st = ks__err(err, KS_E_NOMEM, "out of memory rebuilding %s", cls);
  }
  ks_metric_free(m);
  ks__jv_free(b->a, args);
  ks__free(b->a, s);
  return st;
}

ks_status ks_metric_from_attributes(const char *class_name, const char *attrs_json, const ks_allocator *alloc,
                                    uint64_t *state_budget, ks_metric **out, ks_error *err) {
  if (!class_name || !attrs_json || !out) return ks__err(err, KS_E_INVALID, "ks_metric_from_attributes: NULL argument");
  *out = NULL;
  const ks_allocator *a = ks__alloc_or_default(alloc);
  ks__jv *attrs = NULL;
  ks_error je;
  ks_status ps = ks__jv_parse(a, attrs_json, strlen(attrs_json), "attributes", &attrs, &je);
  if (ps == KS_E_NOMEM) return ks__err(err, ps, "%s: out of memory reading the attributes", class_name);
  if (ps || !ks__jv_is(attrs, KS__JV_OBJECT)) {
    ks__jv_free(a, attrs);
    return ks__err(err, KS_E_INVALID, "%s: attributes are not a JSON object", class_name);
  }
  budget b = {ks__alloc_or_default(alloc), state_budget != NULL, 0, state_budget ? *state_budget : 0, 0};
  b.cap = b.left;
  char *canonical = NULL;
  uint64_t cost = 0;
  ks_status st = ks__class_find(class_name) ? from_attrs(class_name, attrs, &b, &canonical, &cost, err) : KS_OK;
  ks__jv_free(a, attrs);
  /* The metric handed back costs what its probe cost; it is charged too. */
  if (!st && canonical && !charge(&b, (size_t)cost)) st = over(err, class_name, canonical, b.cap);
  if (!st && canonical) st = ks_metric_create(class_name, canonical, alloc, out, err);
  ks__free(b.a, canonical);
  if (state_budget) *state_budget = b.left;
  return st;
}

ks_status ks_metric_create_bounded(const char *class_name, const char *args_json, const ks_allocator *alloc,
                                   uint64_t *state_budget, ks_metric **out, ks_error *err) {
  if (!class_name || !out) return ks__err(err, KS_E_INVALID, "ks_metric_create_bounded: NULL argument");
  if (!state_budget) return ks_metric_create(class_name, args_json, alloc, out, err);
  const char *args = args_json && *args_json ? args_json : "{}";
  budget b = {ks__alloc_or_default(alloc), 1, 0, *state_budget, *state_budget};
  ks_metric *m = NULL;
  ks_status st = probe(class_name, args, &b, &m, err); /* refuses past the budget before the real build */
  int built = m != NULL;
  ks_metric_free(m); /* the probe's allocator lives on this stack frame */
  if (st) return st;
  /* The metric handed back costs what its probe cost; it is charged too, as in ks_metric_from_attributes. */
  if (built && !charge(&b, (size_t)(*state_budget - b.left))) return over(err, class_name, args, b.cap);
  st = ks_metric_create(class_name, args, alloc, out, err); /* also says why the arguments do not build it */
  if (!st) *state_budget = b.left;
  return st;
}

static const ks_tensor *stored(const ks_statedict *src, const char *prefix, const char *state) {
  char key[KS_MAX_NAME + 1];
  int n = snprintf(key, sizeof key, "%s%s", prefix ? prefix : "", state);
  return n > 0 && (size_t)n < sizeof key ? ks_statedict_tensor(src, key) : NULL;
}

/*
 * torchmetrics < 1.1 named the aggregation states `value` (CatMetric still
 * does, unchanged) and kept the MSE sum as a 0-d tensor.
 */
int ks_metric_stored_schema_version(const char *class_name, const ks_statedict *src, const char *prefix) {
  if (!src) return KS_METRIC_SCHEMA_VERSION;
  int old_name = stored(src, prefix, "value") && !(class_name && !strcmp(class_name, "CatMetric"));
  const ks_tensor *sse = stored(src, prefix, "sum_squared_error");
  int old_shape = sse && sse->rank == 0 && (!class_name || !strcmp(class_name, "MeanSquaredError"));
  return old_name || old_shape ? 1 : KS_METRIC_SCHEMA_VERSION;
}
