/* A collection of metrics keyed by name, in insertion order (MetricCollection / get_metrics()). */
#include <string.h>

#include "metrics/internal.h"

typedef struct coll_item {
  char *name;
  ks_metric *m;
} coll_item;

struct ks_metric_collection {
  ks_allocator alloc;
  coll_item *items;
  size_t count, cap;
};

ks_status ks_metric_collection_create(const ks_allocator *a, ks_metric_collection **out, ks_error *err) {
  if (!out) return ks__err(err, KS_E_INVALID, "ks_metric_collection_create: NULL out");
  *out = NULL;
  ks_metric_collection *c = ks__calloc(a, 1, sizeof *c);
  if (!c) return ks__err(err, KS_E_NOMEM, "out of memory for a metric collection");
  c->alloc = *ks__alloc_or_default(a);
  *out = c;
  return KS_OK;
}

void ks_metric_collection_free(ks_metric_collection *c) {
  if (!c) return;
  for (size_t i = 0; i < c->count; i++) {
    ks__free(&c->alloc, c->items[i].name);
    ks_metric_free(c->items[i].m);
  }
  ks__free(&c->alloc, c->items);
  ks_allocator a = c->alloc;
  ks__free(&a, c);
}

ks_metric *ks_metric_collection_get(const ks_metric_collection *c, const char *name) {
  if (!c || !name) return NULL;
  for (size_t i = 0; i < c->count; i++)
    if (!strcmp(c->items[i].name, name)) return c->items[i].m;
  return NULL;
}

ks_status ks_metric_collection_add(ks_metric_collection *c, const char *name, ks_metric *m, ks_error *err) {
  if (!c || !m)
    return ks__err_at(err, KS_E_INVALID, NULL, name, -1, "ks_metric_collection_add: NULL collection or metric");
  ks_status s = ks__name_check(name, err);
  if (s) return s;
  if (ks_metric_collection_get(c, name))
    return ks__err_at(err, KS_E_EXISTS, NULL, name, -1, "the collection already has a metric '%.200s'", name);
  if ((s = ks__grow(&c->alloc, &c->items, &c->cap, c->count + 1, sizeof *c->items)))
    return ks__err_at(err, s, NULL, name, -1, "cannot add metric '%.200s': %s", name, ks_strerror(s));
  char *copy = ks__strdup(&c->alloc, name);
  if (!copy) return ks__err_at(err, KS_E_NOMEM, NULL, name, -1, "out of memory adding metric '%.200s'", name);
  c->items[c->count].name = copy;
  c->items[c->count].m = m;
  c->count++;
  return KS_OK;
}

size_t ks_metric_collection_count(const ks_metric_collection *c) { return c ? c->count : 0; }

ks_metric *ks_metric_collection_at(const ks_metric_collection *c, size_t i, const char **name) {
  if (!c || i >= c->count) return NULL;
  if (name) *name = c->items[i].name;
  return c->items[i].m;
}
