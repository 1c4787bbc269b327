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

ks_status ks_metric_collection_create(const ks_allocator *a, ks_metric_collection **out) {
  if (!out) return KS_E_INVALID;
  ks_metric_collection *c = ks__calloc(a, 1, sizeof *c);
  if (!c) return KS_E_NOMEM;
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

ks_status ks_metric_collection_add(ks_metric_collection *c, const char *name, ks_metric *m) {
  if (!c || !name || !m) return KS_E_INVALID;
  size_t len = strlen(name);
  if (len == 0 || len > KS_MAX_NAME) return KS_E_INVALID;
  if (ks_metric_collection_get(c, name)) return KS_E_EXISTS;
  ks_status s = ks__grow(&c->alloc, &c->items, &c->cap, c->count + 1, sizeof *c->items);
  if (s) return s;
  char *copy = ks__strdup(&c->alloc, name);
  if (!copy) return KS_E_NOMEM;
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
