#include "testprog.h"

#include <string.h>

#include "keepsake/metric.h"

static ks_status factory(void *ctx, const char *label, const ks_allocator *a, ks_metric_collection **out,
                         ks_error *err) {
  (void)ctx;
  ks_metric *m = NULL;
  ks_status s = ks_metric_collection_create(a, out, NULL);
  if (!s && label) s = ks_metric_create("MeanMetric", "{}", a, &m, err);
  if (!s && label && (s = ks_metric_collection_add(*out, "MeanMetric", m, NULL)) != KS_OK) ks_metric_free(m);
  if (s) ks_metric_collection_free(*out), *out = NULL;
  return s;
}

ks_status ks_test_prog_init(ks_test_prog *p) {
  memset(p, 0, sizeof *p);
  p->shape[0] = 4;
  ks_tensor t;
  ks_status s = ks_state_create("run", 1, NULL, &p->st, NULL);
  if (!s) s = ks_tensor_init(&t, KS_F32, 1, p->shape, p->w);
  if (!s) s = ks_state_add_tensor(p->st, "w", &t, NULL);
  if (s) return s;
  ks_timestamp_init(&p->ts);
  ks_state_set_timestamp(p->st, &p->ts);
  const char *labels[] = {"eval"};
  return ks_state_build_metrics(p->st, factory, NULL, labels, 1, NULL);
}

ks_status ks_test_prog_set_metric(ks_test_prog *p, double v) {
  ks_metric *m = ks_metric_collection_get(ks_state_eval_metrics(p->st, "eval"), "MeanMetric");
  ks_metric_reset(m);
  float x = (float)v;
  int64_t one[1] = {1};
  ks_tensor in;
  const ks_tensor *out;
  ks_status s = ks_tensor_init(&in, KS_F32, 1, one, &x);
  if (!s) s = ks_metric_update(m, &in, 1, NULL);
  if (!s) s = ks_metric_compute(m, &out, NULL);
  return s;
}
