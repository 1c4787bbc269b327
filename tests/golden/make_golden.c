/*
 * Writes the golden files of the current format version into a directory.
 * Golden files are written ONCE, by the version that introduces them, and
 * committed; they are never regenerated (tests/golden/README.md). This program
 * stays so the next version can write its own set the same way.
 *
 *   ks_make_golden OUTDIR
 * writes catalogue.keepsake (+ .expected.json), legacy-schema.keepsake
 * (+ .expected.json) and future-version.keepsake.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "catalogue.h"
#include "keepsake/format.h"
#include "keepsake/keepsake.h"
#include "keepsake/state.h"

static int fail(const char *what, const ks_error *err) {
  char buf[1024];
  fprintf(stderr, "make_golden: %s: %s\n", what, ks_error_format(err, buf, sizeof buf));
  return 1;
}

static json_t *tensor_values(const ks_tensor *t) {
  json_t *a = json_array();
  for (uint64_t i = 0; i < ks_tensor_numel(t); i++)
    json_array_append_new(a, json_real(ks_dtype_get_f64(t->dtype, t->data, (size_t)i)));
  return a;
}

static int write_json(const char *dir, const char *name, json_t *j) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  int rc = json_dump_file(j, path, JSON_INDENT(1) | JSON_SORT_KEYS);
  json_decref(j);
  return rc;
}

static int make_catalogue(const char *dir) {
  ks_state *st;
  ks_error err;
  ks_timestamp ts;
  ks_rng rng;
  if (ks_state_create("golden-catalogue", 17, NULL, &st, NULL)) return 1;
  ks_timestamp_init(&ts);
  ks_rng_seed(&rng, 17);
  ks_state_set_timestamp(st, &ts);
  ks_state_set_rng(st, &rng);
  if (ks_state_build_metrics(st, golden_catalogue_factory, NULL, NULL, 0, &err)) return fail("build", &err);
  size_t n;
  const golden_metric *cat = golden_catalogue(&n);
  json_t *expected = json_object();
  for (size_t i = 0; i < n; i++) {
    ks_metric *m = ks_metric_collection_get(ks_state_train_metrics(st), cat[i].name);
    const ks_tensor *out;
    for (int b = 0; b < 3; b++)
      if (golden_feed(m, cat[i].cls, b, &err)) return fail(cat[i].name, &err);
    if (ks_metric_compute(m, &out, &err)) return fail(cat[i].name, &err);
    json_object_set_new(expected, cat[i].name, tensor_values(out));
    ks_timestamp_batch_done(&ts, 24, 0, 0.0);
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/catalogue.keepsake", dir);
  if (ks_state_save(st, path, NULL, &err)) return fail("save", &err);
  ks_state_free(st);
  return write_json(dir, "catalogue.expected.json", expected);
}

/* States as keepsake schema 1 wrote them: torchmetrics < 1.1 names and MSE's () sum. */
static int make_legacy(const char *dir) {
  ks_statedict *sd;
  ks_meta *meta;
  ks_error err;
  if (ks_statedict_create(NULL, &sd, NULL) || ks_meta_create(NULL, &meta, NULL)) return 1;
  float *v;
  int64_t *count;
  int64_t one[1] = {1};
  ks_statedict_new_tensor(sd, "state/train_metrics/MeanMetric/state_dict/value", KS_F32, 0, NULL, (void **)&v, NULL);
  *v = 7.5f;
  ks_statedict_new_tensor(sd, "state/train_metrics/MeanMetric/state_dict/weight", KS_F32, 0, NULL, (void **)&v, NULL);
  *v = 3.0f;
  ks_statedict_new_tensor(sd, "state/train_metrics/SumMetric/state_dict/value", KS_F32, 0, NULL, (void **)&v, NULL);
  *v = -4.25f;
  ks_statedict_new_tensor(sd, "state/train_metrics/MaxMetric/state_dict/value", KS_F32, 0, NULL, (void **)&v, NULL);
  *v = 9.0f;
  ks_statedict_new_tensor(sd, "state/train_metrics/MinMetric/state_dict/value", KS_F32, 0, NULL, (void **)&v, NULL);
  *v = -1.5f;
  ks_statedict_new_tensor(sd, "state/train_metrics/MeanSquaredError/state_dict/sum_squared_error", KS_F32, 0,
                          NULL, (void **)&v, NULL);
  *v = 12.0f;
  ks_statedict_new_tensor(sd, "state/train_metrics/MeanSquaredError/state_dict/total", KS_I64, 0, NULL,
                          (void **)&count, NULL);
  *count = 4;
  (void)one;
  const char *names[] = {"MeanMetric", "SumMetric", "MaxMetric", "MinMetric", "MeanSquaredError"};
  char key[256];
  for (size_t i = 0; i < 5; i++) {
    snprintf(key, sizeof key, "state/train_metrics/%s/_computed", names[i]);
    ks_statedict_set_null(sd, key, NULL);
  }
  ks_statedict_set_string(sd, "state/run_name", "golden-legacy", NULL);
  ks_meta_set(meta, "keepsake.metrics",
              "{\"state/train_metrics/MeanMetric\":{\"class\":\"MeanMetric\",\"schema_version\":1,\"update_count\":2},"
              "\"state/train_metrics/SumMetric\":{\"class\":\"SumMetric\",\"schema_version\":1,\"update_count\":2},"
              "\"state/train_metrics/MaxMetric\":{\"class\":\"MaxMetric\",\"schema_version\":1,\"update_count\":2},"
              "\"state/train_metrics/MinMetric\":{\"class\":\"MinMetric\",\"schema_version\":1,\"update_count\":2},"
              "\"state/train_metrics/MeanSquaredError\":{\"class\":\"MeanSquaredError\",\"schema_version\":1,"
              "\"update_count\":2}}", NULL);
  char path[4096];
  snprintf(path, sizeof path, "%s/legacy-schema.keepsake", dir);
  if (ks_save(path, sd, meta, NULL, &err)) return fail("save legacy", &err);
  ks_statedict_free(sd);
  ks_meta_free(meta);
  json_t *expected = json_pack("{s:[f],s:[f],s:[f],s:[f],s:[f]}", "MeanMetric", 2.5, "SumMetric", -4.25,
                               "MaxMetric", 9.0, "MinMetric", -1.5, "MeanSquaredError", 3.0);
  return write_json(dir, "legacy-schema.expected.json", expected);
}

/* A file from a future writer: format version 2, which this version must refuse by name. */
static int make_future(const char *dir) {
  const char *header =
      "{\"__metadata__\":{\"keepsake.format\":\"keepsake\",\"keepsake.format_version\":\"2\","
      "\"keepsake.writer\":\"keepsake 9.0.0\",\"keepsake.features\":\"[\\\"chunked-tensors\\\"]\"},"
      "\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
  size_t hlen = strlen(header), padded = (hlen + 8 + 63) / 64 * 64 - 8;
  unsigned char buf[1024] = {0};
  for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(padded >> (8 * i));
  memcpy(buf + 8, header, hlen);
  memset(buf + 8 + hlen, ' ', padded - hlen);
  float w[2] = {1.0f, 2.0f};
  memcpy(buf + 8 + padded, w, sizeof w);
  char path[4096];
  snprintf(path, sizeof path, "%s/future-version.keepsake", dir);
  FILE *f = fopen(path, "wb");
  if (!f) return 1;
  size_t total = 8 + padded + sizeof w;
  int bad = fwrite(buf, 1, total, f) != total;
  return fclose(f) != 0 || bad;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: ks_make_golden OUTDIR\n");
    return 2;
  }
  return make_catalogue(argv[1]) || make_legacy(argv[1]) || make_future(argv[1]);
}
