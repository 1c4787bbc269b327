/*
 * The metric catalogue as the golden files use it: one metric per class and a
 * few extra configurations, each fed deterministic batches. Shared by the
 * generator (make_golden.c) and the test (test_golden.c) so the program that
 * reads a golden file defines its metrics exactly as the one that wrote it.
 */
#ifndef KS_GOLDEN_CATALOGUE_H
#define KS_GOLDEN_CATALOGUE_H

#include "keepsake/metric.h"
#include "keepsake/state.h"

typedef struct golden_metric {
  const char *name; /* key in the collection */
  const char *cls;
  const char *args;
} golden_metric;

/* The catalogue's entries; *n receives the count. */
const golden_metric *golden_catalogue(size_t *n);

/* ks_metrics_factory building the whole catalogue (ctx unused). */
ks_status golden_catalogue_factory(void *ctx, const char *label, const ks_allocator *alloc,
                                   ks_metric_collection **out, ks_error *err);

/* Feeds batch number `batch` (deterministic) to a metric of class `cls`. */
ks_status golden_feed(ks_metric *m, const char *cls, int batch, ks_error *err);

#endif
