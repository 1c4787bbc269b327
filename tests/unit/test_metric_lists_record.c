/* Every writer names list ("cat") states in keepsake.metrics: the C state layer records "lists"
   for each metric with KS_REDUCE_CAT states (and none for a metric without), so a reader needs
   no metric catalogue to give torchmetrics its lists back (docs/FORMAT.md §10). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/json.h"
#include "keepsake/keepsake.h"
#include "keepsake/layout.h"
#include "testutil.h"

static ks_status factory(void *ctx, const char *label, const ks_allocator *a, ks_metric_collection **out,
                         ks_error *err) {
  (void)ctx, (void)label;
  static const char *const cls[][2] = {{"CatMetric", "{}"}, {"BinaryAUROC", "{}"}, {"MeanMetric", "{}"}};
  ks_status s = ks_metric_collection_create(a, out, err);
  for (size_t i = 0; !s && i < 3; i++) {
    ks_metric *m = NULL;
    s = ks_metric_create(cls[i][0], cls[i][1], a, &m, err);
    if (!s && (s = ks_metric_collection_add(*out, cls[i][0], m, err)) != KS_OK) ks_metric_free(m);
  }
  if (s) ks_metric_collection_free(*out), *out = NULL;
  return s;
}

static const ks__jv *record(const ks__jv *doc, const char *path) {
  const ks__jv *r = ks__jv_get(doc, path);
  if (!r) fail_msg("no keepsake.metrics record for %s", path);
  return r;
}

static void assert_lists(const ks__jv *rec, const char *a, const char *b) {
  const ks__jv *l = ks__jv_get(rec, "lists");
  assert_non_null(l);
  assert_int_equal(l->type, KS__JV_ARRAY);
  assert_int_equal(l->len, b ? 2 : 1);
  assert_string_equal(ks__jv_string(l->items[0]), a);
  if (b) assert_string_equal(ks__jv_string(l->items[1]), b);
}

static void c_state_records_list_states(void **s) {
  (void)s;
  char *dir = ks_test_tmpdir("lists-record");
  char *path = ks_test_path(dir, "ck.keepsake");
  ks_state *st = NULL;
  ks_error e;
  assert_int_equal(ks_state_create("run", 0, NULL, &st, NULL), KS_OK);
  if (ks_state_build_metrics(st, factory, NULL, NULL, 0, &e)) fail_msg("%s", e.message);
  ks_save_opts so = {.io = ks_test_io_nosync()};
  if (ks_state_save(st, path, &so, &e)) fail_msg("%s", e.message);
  ks_reader *r = NULL;
  if (ks_reader_open(path, NULL, &r, &e)) fail_msg("%s", e.message);
  const char *txt = ks_meta_get(ks_reader_meta(r), KS_META_METRICS);
  assert_non_null(txt);
  ks__jv *doc = NULL;
  assert_int_equal(ks__jv_parse(NULL, txt, strlen(txt), "metrics", &doc, &e), KS_OK);
  assert_lists(record(doc, "state/train_metrics/CatMetric"), "value", NULL);
  assert_lists(record(doc, "state/train_metrics/BinaryAUROC"), "preds", "target");
  assert_null(ks__jv_get(record(doc, "state/train_metrics/MeanMetric"), "lists"));
  ks__jv_free(NULL, doc);
  ks_reader_free(r);
  ks_state_free(st);
  free(path);
  ks_test_rmtree(dir);
  free(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(c_state_records_list_states)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
