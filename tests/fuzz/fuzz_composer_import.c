/*
 * libFuzzer target: a torch.save archive through the whole import (zip reader,
 * pickle machine, flattening, Composer metric layout, and metrics rebuilt from
 * pickled attributes under the import's byte budget), then a load of the
 * result into a state that defines a few catalogue metrics.
 */
#include <stddef.h>
#include <stdint.h>

#include "keepsake/keepsake.h"
#include "testutil.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static ks_status factory(void *ctx, const char *label, const ks_allocator *a, ks_metric_collection **out,
                         ks_error *err) {
  (void)ctx, (void)label;
  static const char *const defs[][3] = {{"MulticlassAccuracy", "MulticlassAccuracy", "{\"num_classes\":10}"},
                                        {"MeanMetric", "MeanMetric", "{}"},
                                        {"CatMetric", "CatMetric", "{}"},
                                        {"BinaryAUROC", "BinaryAUROC", "{}"}};
  ks_status st = ks_metric_collection_create(a, out, NULL);
  for (size_t i = 0; i < 4 && !st; i++) {
    ks_metric *m = NULL;
    st = ks_metric_create(defs[i][1], defs[i][2], a, &m, err);
    if (!st) st = ks_metric_collection_add(*out, defs[i][0], m, NULL);
    if (st) ks_metric_free(m);
  }
  if (st) ks_metric_collection_free(*out);
  return st;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ks_torch_read_opts ro = {0};
  ro.max_view_bytes = (uint64_t)1 << 26;
  ks_import_opts o = {0};
  o.read = &ro;
  ks_statedict *sd = NULL;
  ks_meta *meta = NULL;
  if (ks_test_torch_import_buffer(data, size, &o, &sd, &meta, NULL) == KS_OK) {
    ks_state *st = NULL;
    const char *labels[] = {"eval"};
    ks_load_opts lo = {0};
    lo.non_strict_model = 1;
    if (ks_state_create("fuzz", 0, NULL, &st, NULL) == KS_OK &&
        ks_state_build_metrics(st, factory, NULL, labels, 1, NULL) == KS_OK)
      if (ks_state_load_state_dict(st, sd, meta, &lo, NULL, NULL)) {
        /* Fuzzing: refusing the input is an expected outcome; only crashes and leaks matter. */
      }
    ks_state_free(st);
  }
  ks_meta_free(meta);
  ks_statedict_free(sd);
  return 0;
}
