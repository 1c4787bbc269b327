/*
 * libFuzzer target: the metric catalogue's constructor arguments, as a file's keepsake.metrics record
 * or a program hands them to ks_metric_create (the class name, a NUL, then the arguments' JSON),
 * wrappers (MinMaxMetric's base_metric, nested) included. A created metric is updated with a small
 * batch (predictions and integer targets, then values alone), computed, cloned, merged into its
 * clone, reset and computed again. Any input is refused with a status or built, without a crash, a
 * leak, unbounded recursion or a read outside the input.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "keepsake/keepsake.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void exercise(ks_metric *m) {
  float preds[6] = {0.9f, 0.1f, 0.2f, 0.8f, 0.6f, 0.4f};
  int64_t target[3] = {0, 1, 1}, s2[2] = {3, 2}, s1[1] = {3};
  ks_tensor in[2];
  const ks_tensor *r;
  /* Fuzzing: a class may refuse any of these inputs; only crashes and leaks matter. */
  if (!ks_tensor_init(&in[0], KS_F32, 2, s2, preds) && !ks_tensor_init(&in[1], KS_I64, 1, s1, target)) {
    if (ks_metric_update(m, in, 2, NULL)) {
    }
    if (ks_metric_update(m, in, 1, NULL)) {
    }
  }
  if (!ks_tensor_init(&in[0], KS_F32, 1, s1, preds) && !ks_tensor_init(&in[1], KS_F32, 1, s1, preds + 3)) {
    if (ks_metric_update(m, in, 2, NULL)) {
    }
    if (ks_metric_update(m, in, 1, NULL)) {
    }
  }
  if (ks_metric_compute(m, &r, NULL)) {
  }
  ks_metric *c = NULL;
  if (ks_metric_clone(m, NULL, &c, NULL) == KS_OK) {
    if (ks_metric_merge(c, m, NULL)) {
    }
    if (ks_metric_compute(c, &r, NULL)) {
    }
  }
  ks_metric_free(c);
  ks_metric_reset(m);
  if (ks_metric_compute(m, &r, NULL)) {
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const uint8_t *nul = memchr(data, 0, size);
  if (!nul) return 0;
  size_t cls_len = (size_t)(nul - data), args_len = size - cls_len - 1;
  char *cls = malloc(cls_len + 1), *args = malloc(args_len + 1);
  if (cls && args) {
    memcpy(cls, data, cls_len);
    cls[cls_len] = 0;
    memcpy(args, nul + 1, args_len);
    args[args_len] = 0;
    ks_metric *m = NULL;
    if (ks_metric_create(cls, args, NULL, &m, NULL) == KS_OK) exercise(m);
    ks_metric_free(m);
  }
  free(cls);
  free(args);
  return 0;
}
