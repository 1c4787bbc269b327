#include "catalogue.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define ROWS 24

static const golden_metric entries[] = {
    {"MeanMetric", "MeanMetric", "{}"},
    {"SumMetric", "SumMetric", "{}"},
    {"MaxMetric", "MaxMetric", "{}"},
    {"MinMetric", "MinMetric", "{}"},
    {"CatMetric", "CatMetric", "{}"},
    {"BinaryAccuracy", "BinaryAccuracy", "{}"},
    {"BinaryPrecision", "BinaryPrecision", "{}"},
    {"BinaryRecall", "BinaryRecall", "{}"},
    {"BinaryF1Score", "BinaryF1Score", "{}"},
    {"BinaryConfusionMatrix", "BinaryConfusionMatrix", "{}"},
    {"BinaryAUROC", "BinaryAUROC", "{}"},
    {"BinaryAUROC_binned", "BinaryAUROC", "{\"thresholds\": 11}"},
    {"BinaryAveragePrecision", "BinaryAveragePrecision", "{}"},
    {"MulticlassAccuracy", "MulticlassAccuracy", "{\"num_classes\": 5}"},
    {"MulticlassAccuracy_micro_top2", "MulticlassAccuracy",
     "{\"num_classes\": 5, \"average\": \"micro\", \"top_k\": 2}"},
    {"MulticlassPrecision", "MulticlassPrecision", "{\"num_classes\": 5, \"average\": \"weighted\"}"},
    {"MulticlassRecall", "MulticlassRecall", "{\"num_classes\": 5, \"average\": \"none\"}"},
    {"MulticlassF1Score", "MulticlassF1Score", "{\"num_classes\": 5}"},
    {"MulticlassConfusionMatrix", "MulticlassConfusionMatrix", "{\"num_classes\": 5, \"normalize\": \"true\"}"},
    {"MulticlassAUROC", "MulticlassAUROC", "{\"num_classes\": 5}"},
    {"MulticlassAUROC_binned", "MulticlassAUROC", "{\"num_classes\": 5, \"thresholds\": 11}"},
    {"MulticlassJaccardIndex", "MulticlassJaccardIndex", "{\"num_classes\": 5}"},
    {"MultilabelAccuracy", "MultilabelAccuracy", "{\"num_labels\": 4}"},
    {"MultilabelF1Score", "MultilabelF1Score", "{\"num_labels\": 4, \"average\": \"micro\"}"},
    {"MeanSquaredError", "MeanSquaredError", "{}"},
    {"RootMeanSquaredError", "MeanSquaredError", "{\"squared\": false}"},
    {"MeanAbsoluteError", "MeanAbsoluteError", "{}"},
    {"R2Score", "R2Score", "{}"},
    {"LanguageCrossEntropy", "LanguageCrossEntropy", "{}"},
    {"LanguagePerplexity", "LanguagePerplexity", "{}"},
};

const golden_metric *golden_catalogue(size_t *n) {
  *n = sizeof entries / sizeof entries[0];
  return entries;
}

ks_status golden_catalogue_factory(void *ctx, const char *label, const ks_allocator *alloc,
                                   ks_metric_collection **out, ks_error *err) {
  (void)ctx;
  (void)label;
  ks_metric_collection *c;
  ks_status st = ks_metric_collection_create(alloc, &c, NULL);
  for (size_t i = 0; !st && i < sizeof entries / sizeof entries[0]; i++) {
    ks_metric *m;
    st = ks_metric_create(entries[i].cls, entries[i].args, alloc, &m, err);
    if (!st && (st = ks_metric_collection_add(c, entries[i].name, m, NULL)) != KS_OK) ks_metric_free(m);
  }
  if (st) {
    ks_metric_collection_free(c);
    return st;
  }
  *out = c;
  return KS_OK;
}

/* A fixed pseudo-random stream: the golden inputs must never change. */
static double unit(uint32_t *s) {
  *s = *s * 1664525u + 1013904223u;
  return (double)(*s >> 8) * 0x1p-24;
}

typedef struct batch {
  float f1[ROWS * 8];
  float f2[ROWS * 8];
  int64_t labels[ROWS * 8];
  ks_tensor in[2];
} batch;

static void fill(batch *b, int seed) {
  uint32_t s = 2024u + (uint32_t)seed * 7919u;
  for (int i = 0; i < ROWS * 8; i++) {
    b->f1[i] = (float)(unit(&s) * 4.0 - 2.0);
    b->f2[i] = (float)unit(&s);
    b->labels[i] = (int64_t)(unit(&s) * 5.0);
  }
}

static int starts(const char *s, const char *prefix) { return strncmp(s, prefix, strlen(prefix)) == 0; }

/* Shapes per family: preds then target. */
static void shape_inputs(batch *b, const char *cls) {
  int64_t rows[1] = {ROWS}, mc[2] = {ROWS, 5}, ml[2] = {ROWS, 4}, lm[2] = {ROWS, 7};
  if (starts(cls, "Binary")) {
    for (int i = 0; i < ROWS; i++) b->labels[i] = b->f2[i + ROWS] > 0.5f;
    if (ks_tensor_init(&b->in[0], KS_F32, 1, rows, b->f2)) abort(); /* fixed, valid shapes: cannot fail */
    if (ks_tensor_init(&b->in[1], KS_I64, 1, rows, b->labels)) abort(); /* fixed, valid shapes: cannot fail */
  } else if (starts(cls, "Multiclass")) {
    if (ks_tensor_init(&b->in[0], KS_F32, 2, mc, b->f1)) abort(); /* fixed, valid shapes: cannot fail */
    if (ks_tensor_init(&b->in[1], KS_I64, 1, rows, b->labels)) abort(); /* fixed, valid shapes: cannot fail */
  } else if (starts(cls, "Multilabel")) {
    for (int i = 0; i < ROWS * 4; i++) b->labels[i] = b->f2[i] > 0.4f;
    if (ks_tensor_init(&b->in[0], KS_F32, 2, ml, b->f1)) abort(); /* fixed, valid shapes: cannot fail */
    if (ks_tensor_init(&b->in[1], KS_I64, 2, ml, b->labels)) abort(); /* fixed, valid shapes: cannot fail */
  } else if (starts(cls, "Language")) {
    b->labels[3] = -100; /* an ignored token */
    if (ks_tensor_init(&b->in[0], KS_F32, 2, lm, b->f1)) abort(); /* fixed, valid shapes: cannot fail */
    if (ks_tensor_init(&b->in[1], KS_I64, 1, rows, b->labels)) abort(); /* fixed, valid shapes: cannot fail */
  } else if (strstr(cls, "Metric")) {
    if (ks_tensor_init(&b->in[0], KS_F32, 1, rows, b->f1)) abort(); /* fixed, valid shapes: cannot fail */
    if (ks_tensor_init(&b->in[1], KS_F32, 1, rows, b->f2)) abort(); /* fixed, valid shapes: cannot fail */
  } else {
    for (int i = 0; i < ROWS; i++) b->f2[i] = b->f1[i] + 0.3f * (b->f2[i] - 0.5f);
    if (ks_tensor_init(&b->in[0], KS_F32, 1, rows, b->f1)) abort(); /* fixed, valid shapes: cannot fail */
    if (ks_tensor_init(&b->in[1], KS_F32, 1, rows, b->f2)) abort(); /* fixed, valid shapes: cannot fail */
  }
}

ks_status golden_feed(ks_metric *m, const char *cls, int batch_index, ks_error *err) {
  batch b;
  fill(&b, batch_index);
  shape_inputs(&b, cls);
  size_t n = strstr(cls, "Metric") && strcmp(cls, "MeanMetric") != 0 ? 1 : 2;
  return ks_metric_update(m, b.in, n, err);
}
