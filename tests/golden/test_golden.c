/*
 * Frozen golden files (tests/golden/v<N>/, written once by format version N):
 * every version's files must keep loading, with the same values, forever.
 * A checksum guard fails if any golden file is changed, added or removed
 * without updating CHECKSUMS (which a reviewer should refuse).
 */
#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>
#include <xxhash.h>

#include "catalogue.h"
#include "keepsake/format.h"
#include "keepsake/keepsake.h"
#include "keepsake/state.h"
#include "testutil.h"

#define V1 KS_GOLDEN_DIR "/v1"

static char *v1_path(const char *name) { return ks_test_path(V1, name); }

static void hash_file(const char *path, char out[33]) {
  size_t len = 0;
  uint8_t *data = ks_test_read_file(path, &len);
  assert_non_null(data);
  XXH128_hash_t h = XXH3_128bits(data, len);
  snprintf(out, 33, "%016llx%016llx", (unsigned long long)h.high64, (unsigned long long)h.low64);
  free(data);
}

static int listed(json_t *sums, const char *name) { return json_object_get(sums, name) != NULL; }

static json_t *read_checksums(void) {
  char *p = v1_path("CHECKSUMS");
  FILE *f = fopen(p, "r");
  free(p);
  assert_non_null(f);
  json_t *sums = json_object();
  char hex[64], name[256];
  while (fscanf(f, "%63s %255s", hex, name) == 2) json_object_set_new(sums, name, json_string(hex));
  fclose(f);
  return sums;
}

static void golden_files_are_unchanged(void **s) {
  (void)s;
  json_t *sums = read_checksums();
  assert_true(json_object_size(sums) >= 5);
  const char *name;
  json_t *want;
  json_object_foreach(sums, name, want) {
    char *p = v1_path(name), got[33];
    hash_file(p, got);
    if (strcmp(got, json_string_value(want)) != 0) fail_msg("golden file %s changed (xxh3-128 %s)", name, got);
    free(p);
  }
  DIR *d = opendir(V1);
  assert_non_null(d);
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.' || !strcmp(e->d_name, "CHECKSUMS")) continue;
    if (!listed(sums, e->d_name)) fail_msg("golden file %s is not in CHECKSUMS", e->d_name);
  }
  closedir(d);
  json_decref(sums);
}

static json_t *expected(const char *name) {
  char *p = v1_path(name);
  json_error_t jerr;
  json_t *j = json_load_file(p, JSON_REJECT_DUPLICATES, &jerr);
  free(p);
  assert_non_null(j);
  return j;
}

static void assert_values(const ks_tensor *t, json_t *want, double rtol, const char *what) {
  assert_int_equal(ks_tensor_numel(t), json_array_size(want));
  for (size_t i = 0; i < json_array_size(want); i++) {
    double a = ks_dtype_get_f64(t->dtype, t->data, i), b = json_number_value(json_array_get(want, i));
    if (isnan(a) && isnan(b)) continue;
    if (fabs(a - b) > rtol * fabs(b) + 1e-7) fail_msg("%s[%zu]: got %.9g, want %.9g", what, i, a, b);
  }
}

static ks_state *load_catalogue_state(const char *file, ks_metrics_factory factory, ks_load_report *rep) {
  ks_state *st;
  ks_error err;
  ks_timestamp ts;
  ks_rng rng;
  assert_int_equal(ks_state_create("reader", 0, NULL, &st, NULL), KS_OK);
  ks_timestamp_init(&ts);
  ks_state_set_timestamp(st, NULL);
  ks_state_set_rng(st, NULL);
  (void)rng;
  assert_int_equal(ks_state_build_metrics(st, factory, NULL, NULL, 0, &err), KS_OK);
  char *p = v1_path(file);
  ks_load_opts o = {0};
  o.verify_checksums = 1;
  ks_status rc = ks_state_load(st, p, &o, rep, &err);
  if (rc) fail_msg("load %s: %s", file, err.message);
  free(p);
  return st;
}

static void catalogue_loads_by_name_with_the_same_results(void **s) {
  (void)s;
  ks_load_report *rep;
  assert_int_equal(ks_load_report_create(NULL, &rep, NULL), KS_OK);
  ks_state *st = load_catalogue_state("catalogue.keepsake", golden_catalogue_factory, rep);
  size_t n;
  const golden_metric *cat = golden_catalogue(&n);
  assert_int_equal(ks_load_report_count(rep, KS_LOAD_MISMATCHED), 0);
  assert_int_equal(ks_load_report_count(rep, KS_LOAD_MISSING), 0);
  json_t *want = expected("catalogue.expected.json");
  for (size_t i = 0; i < n; i++) {
    ks_metric *m = ks_metric_collection_get(ks_state_train_metrics(st), cat[i].name);
    const ks_tensor *out;
    ks_error err;
    assert_int_equal(ks_metric_update_count(m), 3);
    assert_int_equal(ks_metric_compute(m, &out, &err), KS_OK);
    assert_values(out, json_object_get(want, cat[i].name), 0.0, cat[i].name); /* restored cache: exact */
    /* The states alone must give the same result: recompute from a clone without the cache. */
    ks_metric *fresh;
    ks_statedict *sd;
    assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
    assert_int_equal(ks_metric_create(cat[i].cls, cat[i].args, NULL, &fresh, &err), KS_OK);
    assert_int_equal(ks_metric_to_state_dict(m, sd, "", &err), KS_OK);
    assert_int_equal(ks_metric_load_state_dict(fresh, sd, "", KS_METRIC_SCHEMA_VERSION, 0, NULL, NULL, &err), KS_OK);
    assert_int_equal(ks_metric_compute(fresh, &out, &err), KS_OK);
    assert_values(out, json_object_get(want, cat[i].name), 1e-6, cat[i].name);
    ks_metric_free(fresh);
    ks_statedict_free(sd);
  }
  json_decref(want);
  ks_load_report_free(rep);
  ks_state_free(st);
}

static ks_status legacy_factory(void *ctx, const char *label, const ks_allocator *alloc,
                                ks_metric_collection **out, ks_error *err) {
  (void)ctx;
  (void)label;
  static const char *names[] = {"MeanMetric", "SumMetric", "MaxMetric", "MinMetric", "MeanSquaredError"};
  ks_status st = ks_metric_collection_create(alloc, out, NULL);
  for (size_t i = 0; !st && i < 5; i++) {
    ks_metric *m;
    st = ks_metric_create(names[i], NULL, alloc, &m, err);
    if (!st && (st = ks_metric_collection_add(*out, names[i], m, NULL)) != KS_OK) ks_metric_free(m);
  }
  if (st) ks_metric_collection_free(*out), *out = NULL;
  return st;
}

static void legacy_schema_states_are_migrated(void **s) {
  (void)s;
  ks_load_report *rep;
  assert_int_equal(ks_load_report_create(NULL, &rep, NULL), KS_OK);
  ks_state *st = load_catalogue_state("legacy-schema.keepsake", legacy_factory, rep);
  const ks_load_item *it = ks_load_report_find(rep, "state/train_metrics/MeanMetric");
  assert_non_null(it);
  assert_int_equal(it->kind, KS_LOAD_MIGRATED);
  it = ks_load_report_find(rep, "state/train_metrics/MeanSquaredError");
  assert_non_null(it);
  assert_int_equal(it->kind, KS_LOAD_MIGRATED);
  json_t *want = expected("legacy-schema.expected.json");
  const char *name;
  json_t *vals;
  json_object_foreach(want, name, vals) {
    const ks_tensor *out;
    ks_error err;
    ks_metric *m = ks_metric_collection_get(ks_state_train_metrics(st), name);
    assert_int_equal(ks_metric_compute(m, &out, &err), KS_OK);
    assert_values(out, vals, 1e-6, name);
  }
  json_decref(want);
  ks_load_report_free(rep);
  ks_state_free(st);
}

static void a_newer_format_version_is_refused_by_name(void **s) {
  (void)s;
  char *p = v1_path("future-version.keepsake");
  ks_reader *r = NULL;
  ks_error err;
  assert_int_equal(ks_reader_open(p, NULL, &r, &err), KS_E_VERSION);
  assert_null(r);
  assert_non_null(strstr(err.message, "2"));
  free(p);
}

/* The demo checkpoint, read the way a program that knows nothing of the demo would. */
static void digits_demo_checkpoint_still_reads(void **s) {
  (void)s;
  char *p = v1_path("digits-demo.keepsake");
  ks_read_opts o = {.alloc = NULL, .mode = KS_READ_COPY, .verify_checksums = 1};
  ks_statedict *sd;
  ks_meta *meta;
  ks_error err;
  assert_int_equal(ks_load(p, &o, &sd, &meta, &err), KS_OK);
  ks_entry e;
  assert_int_equal(ks_statedict_get(sd, "state/timestamp/Timestamp/epoch", &e), KS_OK);
  assert_int_equal(e.i, 20);
  ks_rng rng; /* version 1 stored the PRNG words as U64; they must keep loading */
  assert_int_equal(ks_test_load(ks_rng_stateful(&rng), sd, "rng/0/", &err), KS_OK);
  json_error_t jerr;
  json_t *metrics = json_loads(ks_meta_get(meta, "keepsake.metrics"), JSON_REJECT_DUPLICATES, &jerr);
  assert_non_null(metrics);
  const char *path;
  json_t *info;
  size_t checked = 0;
  json_object_foreach(metrics, path, info) {
    ks_metric *m;
    char *args = json_dumps(json_object_get(info, "args"), JSON_COMPACT);
    assert_int_equal(ks_metric_create(json_string_value(json_object_get(info, "class")), args, NULL, &m, &err), KS_OK);
    free(args);
    char prefix[512], computed[512];
    snprintf(prefix, sizeof prefix, "%s/state_dict/", path);
    snprintf(computed, sizeof computed, "%s/_computed", path);
    int version = (int)json_integer_value(json_object_get(info, "schema_version"));
    assert_int_equal(ks_metric_load_state_dict(m, sd, prefix, version, 0, NULL, NULL, &err), KS_OK);
    const ks_tensor *out, *stored = ks_statedict_tensor(sd, computed);
    assert_non_null(stored);
    assert_int_equal(ks_metric_compute(m, &out, &err), KS_OK);
    assert_int_equal(out->nbytes, stored->nbytes);
    assert_memory_equal(out->data, stored->data, out->nbytes);
    if (!strcmp(path, "state/eval_metrics/eval/MulticlassAccuracy"))
      assert_true(ks_dtype_get_f64(out->dtype, out->data, 0) >= 0.95);
    ks_metric_free(m);
    checked++;
  }
  assert_int_equal(checked, 5);
  json_decref(metrics);
  ks_meta_free(meta);
  ks_statedict_free(sd);
  free(p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(golden_files_are_unchanged),
      cmocka_unit_test(catalogue_loads_by_name_with_the_same_results),
      cmocka_unit_test(legacy_schema_states_are_migrated),
      cmocka_unit_test(a_newer_format_version_is_refused_by_name),
      cmocka_unit_test(digits_demo_checkpoint_still_reads),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
