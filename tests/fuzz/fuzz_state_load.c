/*
 * libFuzzer target: a keepsake file, from bytes, loaded into a C training state through the one load
 * engine (ks_load_buffer, then ks_state_load_state_dict): a 4 -> 2 model, AdamW over it, the
 * warmup-cosine scheduler, a timestamp, a data position, and train metrics that include the
 * MinMaxMetric wrapper (inner metric and declared attributes) and a list-state metric, eval
 * metrics under "val". The seeds are a C program's state file (tests/interop/state_header_c.c).
 * Any input is refused with a status or loaded (components before a refused one keep their new
 * values, as state.h says), without a crash, a leak or a read outside the input.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "keepsake/keepsake.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static ks_status metrics(void *ctx, const char *label, const ks_allocator *a, ks_metric_collection **out,
                         ks_error *err) {
  (void)ctx;
  static const char *const train[][2] = {
      {"acc", "MulticlassAccuracy"}, {"minmax", "MinMaxMetric"}, {"cat", "CatMetric"}};
  static const char *const args[] = {"{\"num_classes\":2}", "{\"base_metric\":{\"class\":\"MeanMetric\",\"args\":{}}}",
                                     "{}"};
  ks_status s = ks_metric_collection_create(a, out, err);
  for (size_t i = 0; !s && i < (label ? 1u : 3u); i++) {
    ks_metric *m = NULL;
    s = label ? ks_metric_create("MeanSquaredError", "{}", a, &m, err)
              : ks_metric_create(train[i][1], args[i], a, &m, err);
    if (!s) s = ks_metric_collection_add(*out, label ? "mse" : train[i][0], m, err);
    if (s) ks_metric_free(m);
  }
  return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  float weight[8] = {0.1f, -0.2f, 0.3f, 0.4f, -0.5f, 0.6f, 0.7f, -0.8f}, bias[2] = {0.01f, -0.02f};
  float grads[10] = {0};
  const int64_t ws[2] = {2, 4}, bs[1] = {2};
  ks_read_opts ro = {.mode = KS_READ_COPY, .verify_checksums = 1};
  ks_statedict *sd = NULL;
  ks_meta *meta = NULL;
  if (ks_load_buffer(data, size, &ro, &sd, &meta, NULL)) return 0;
  ks_state *st = NULL;
  ks_optimizer *opt = NULL;
  ks_scheduler sched;
  ks_timestamp ts;
  ks_dataset_state ds = {1, 5, 7};
  ks_adamw_opts ao = {0.01, 0.9, 0.999, 1e-8, 0.01};
  const char *labels[] = {"val"};
  ks_tensor w, b;
  ks_status s = ks_state_create("fuzz", 0, NULL, &st, NULL);
  if (!s) s = ks_tensor_init(&w, KS_F32, 2, ws, weight);
  if (!s) s = ks_tensor_init(&b, KS_F32, 1, bs, bias);
  if (!s) s = ks_state_add_tensor(st, "fc.weight", &w, NULL);
  if (!s) s = ks_state_add_tensor(st, "fc.bias", &b, NULL);
  if (!s) s = ks_optimizer_create_adamw(&ao, NULL, &opt, NULL);
  if (!s) s = ks_optimizer_add_param(opt, weight, grads, 2, ws, NULL);
  if (!s) s = ks_optimizer_add_param(opt, bias, grads + 8, 1, bs, NULL);
  if (!s) {
    ks_scheduler_init(&sched, opt, 0.01, 2, 10, 0.0);
    ks_timestamp_init(&ts);
    ks_state_set_timestamp(st, &ts);
    s = ks_state_add_optimizer(st, "AdamW", opt, NULL);
  }
  if (!s) s = ks_state_add_scheduler(st, "Sched", &sched, NULL);
  if (!s) s = ks_state_add_dataset(st, "loader", &ds, NULL);
  if (!s) s = ks_state_build_metrics(st, metrics, NULL, labels, 1, NULL);
  if (!s) {
    ks_load_opts lo = {0};
    lo.non_strict_model = 1;
    ks_load_report *rep = NULL;
    if (ks_load_report_create(NULL, &rep, NULL) == KS_OK) {
      /* Fuzzing: refusing the input is an expected outcome; only crashes and leaks matter. */
      if (ks_state_load_state_dict(st, sd, meta, &lo, rep, NULL)) {
      }
      size_t sum = 0; /* every item's text is readable */
      for (size_t i = 0; i < ks_load_report_count(rep, KS_LOAD_ANY); i++) {
        ks_load_item it;
        if (ks_load_report_at(rep, i, &it) == KS_OK) sum += strlen(it.path) + strlen(it.reason);
      }
      volatile size_t sink = sum;
      (void)sink;
    }
    ks_load_report_free(rep);
  }
  ks_state_free(st);
  ks_optimizer_free(opt);
  ks_meta_free(meta);
  ks_statedict_free(sd);
  return 0;
}
