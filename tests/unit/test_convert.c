/* ks_convert (convert.h): list states in .pt exports, the metric budget, salvage warnings in the
   report, the output check, and allocation failures. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/json.h"
#include "keepsake/convert.h"
#include "keepsake/layout.h"
#include "testutil.h"

#define CATALOGUE KS_SOURCE_DIR "/tests/golden/v1/catalogue.keepsake"
#define TRAINER KS_FIXTURES_DIR "/composer/composer-0.32.1-trainer.pt"
#define TM "state/train_metrics/"

/* The cat states of the golden catalogue: CatMetric and the exact (thresholds=None) curve metrics. */
static const char *const k_lists[] = {
    TM "CatMetric/state_dict/value",          TM "BinaryAUROC/state_dict/preds",
    TM "BinaryAUROC/state_dict/target",       TM "BinaryAveragePrecision/state_dict/preds",
    TM "BinaryAveragePrecision/state_dict/target", TM "MulticlassAUROC/state_dict/preds",
    TM "MulticlassAUROC/state_dict/target",
};
#define N_LISTS (sizeof k_lists / sizeof k_lists[0])

static ks_status convert(const char *in, const char *out, ks_convert_opts *o, ks_convert_report **rep, ks_error *e) {
  ks_convert_opts dflt = {0};
  if (!o) o = &dflt;
  o->io = ks_test_io_nosync();
  return ks_convert(in, out, o, rep, e);
}

/* The .pt at path read back: its entries and its parsed structure document's "containers". */
typedef struct pt {
  ks_statedict *sd;
  char *structure;
  ks__jv *doc;
} pt;

static void pt_read(pt *p, const char *path) {
  ks_error err;
  if (ks_torch_load(path, NULL, &p->sd, &p->structure, &err)) fail_msg("%s", err.message);
  assert_non_null(p->structure);
  assert_int_equal(ks__jv_parse(NULL, p->structure, strlen(p->structure), "structure", &p->doc, &err), KS_OK);
}

static const ks__jv *pt_container(const pt *p, const char *path) {
  return ks__jv_get(ks__jv_get(p->doc, "containers"), path);
}

static void pt_free(pt *p) {
  ks__jv_free(NULL, p->doc);
  ks_torch_free(NULL, p->structure);
  ks_statedict_free(p->sd);
}

/* `key` is a list of `len` items in the .pt, its item the tensor `rows` rows long. */
static void assert_list(const pt *p, const char *key, int64_t len, int64_t rows) {
  const ks__jv *rec = pt_container(p, key);
  int64_t n = -1;
  if (!rec || strcmp(ks__jv_string(ks__jv_get(rec, "kind")), "list") || !ks__jv_is_int(ks__jv_get(rec, "len"), &n) ||
      n != len)
    fail_msg("%s: not a list of %lld items", key, (long long)len);
  char item[KS_MAX_NAME + 3];
  snprintf(item, sizeof item, "%s/0", key);
  const ks_tensor *t = ks_statedict_tensor(p->sd, item);
  assert_null(ks_statedict_tensor(p->sd, key));
  if (!len) {
    assert_null(t);
    return;
  }
  if (!t) fail_msg("%s: no item 0", key);
  assert_int_equal(t->shape[0], rows);
}

static void catalogue_cat_states_export_as_lists(void **s) {
  (void)s;
  char *dir = ks_test_tmpdir("convert-lists");
  char *out = ks_test_path(dir, "cat.pt");
  ks_convert_report *rep = NULL;
  ks_error err;
  if (convert(CATALOGUE, out, NULL, &rep, &err)) fail_msg("%s", err.message);
  assert_int_equal(ks_convert_report_list_states(rep), N_LISTS);
  assert_int_equal(ks_convert_report_warning_count(rep), 0);
  pt p = {0};
  pt_read(&p, out);
  for (size_t i = 0; i < N_LISTS; i++) assert_list(&p, k_lists[i], 1, 72);
  /* with thresholds the curve metrics keep a confusion matrix: a tensor, no list */
  assert_non_null(ks_statedict_tensor(p.sd, TM "BinaryAUROC_binned/state_dict/confmat"));
  assert_null(pt_container(&p, TM "BinaryAUROC_binned/state_dict/confmat"));
  assert_non_null(ks_statedict_tensor(p.sd, TM "MeanMetric/state_dict/mean_value"));
  pt_free(&p);
  ks_convert_report_free(rep);
  free(out);
  ks_test_rmtree(dir);
  free(dir);
}

/* .pt -> keepsake -> .pt (and a Composer file through both) keeps the lists as lists. */
static void lists_survive_the_round_trip(void **s) {
  (void)s;
  char *dir = ks_test_tmpdir("convert-trip");
  char *a = ks_test_path(dir, "a.pt"), *b = ks_test_path(dir, "b.keepsake"), *c = ks_test_path(dir, "c.pt");
  ks_error err;
  ks_convert_report *rep = NULL;
  if (convert(CATALOGUE, a, NULL, NULL, &err) || convert(a, b, NULL, NULL, &err) || convert(b, c, NULL, &rep, &err))
    fail_msg("%s", err.message);
  assert_int_equal(ks_convert_report_list_states(rep), N_LISTS);
  pt p = {0};
  pt_read(&p, c);
  for (size_t i = 0; i < N_LISTS; i++) assert_list(&p, k_lists[i], 1, 72);
  pt_free(&p);
  ks_convert_report_free(rep);
  /* a Composer checkpoint with list states, straight to .pt */
  if (convert(TRAINER, c, NULL, &rep, &err)) fail_msg("%s", err.message);
  assert_int_equal(ks_convert_report_list_states(rep), 9);
  pt_read(&p, c);
  assert_list(&p, TM "CatMetric/state_dict/value", 1, 4);
  assert_list(&p, "state/eval_metrics/val/holdout/BinaryAUROC/state_dict/preds", 1, 8);
  pt_free(&p);
  ks_convert_report_free(rep);
  free(a), free(b), free(c);
  ks_test_rmtree(dir);
  free(dir);
}

/* Writes a keepsake file holding one metric's state entries and its KS_META_METRICS record. */
static void write_metric_file(const char *path, const char *record, const char *state, int64_t rows) {
  ks_statedict *sd;
  ks_meta *meta;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  assert_int_equal(ks_meta_create(NULL, &meta, NULL), KS_OK);
  int64_t shape[1] = {rows};
  float *data = NULL;
  assert_int_equal(ks_statedict_new_tensor(sd, state, KS_F32, 1, shape, (void **)&data, NULL), KS_OK);
  for (int64_t i = 0; i < rows; i++) data[i] = (float)i;
  assert_int_equal(ks_meta_set(meta, KS_META_METRICS, record, NULL), KS_OK);
  ks_error err;
  if (ks_save(path, sd, meta, NULL, &err)) fail_msg("%s", err.message);
  ks_meta_free(meta);
  ks_statedict_free(sd);
}

static void an_empty_cat_state_exports_as_an_empty_list(void **s) {
  (void)s;
  char *dir = ks_test_tmpdir("convert-empty");
  char *in = ks_test_path(dir, "empty.keepsake"), *out = ks_test_path(dir, "empty.pt");
  write_metric_file(in, "{\"m/CatMetric\":{\"class\":\"CatMetric\",\"schema_version\":2,\"update_count\":0}}",
                    "m/CatMetric/state_dict/value", 0);
  ks_error err;
  if (convert(in, out, NULL, NULL, &err)) fail_msg("%s", err.message);
  pt p = {0};
  pt_read(&p, out);
  assert_list(&p, "m/CatMetric/state_dict/value", 0, 0);
  assert_int_equal(ks_statedict_count(p.sd), 0);
  pt_free(&p);
  free(in), free(out);
  ks_test_rmtree(dir);
  free(dir);
}

/* Writes a keepsake file with one tensor entry and the given structure document. */
static void write_structure_file(const char *path, const char *structure) {
  ks_statedict *sd;
  ks_meta *meta;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  assert_int_equal(ks_meta_create(NULL, &meta, NULL), KS_OK);
  int64_t shape[1] = {2};
  float *data = NULL;
  assert_int_equal(ks_statedict_new_tensor(sd, "w", KS_F32, 1, shape, (void **)&data, NULL), KS_OK);
  data[0] = 1, data[1] = 2;
  assert_int_equal(ks_meta_set(meta, KS_TORCH_STRUCTURE_META, structure, NULL), KS_OK);
  ks_error err;
  if (ks_save(path, sd, meta, NULL, &err)) fail_msg("%s", err.message);
  ks_meta_free(meta);
  ks_statedict_free(sd);
}

/* A structure record whose name component is longer than any name (it once overflowed a stack
 * buffer while the writer measured what the reader would call it) is refused as too long. */
static void an_overlong_structure_component_is_refused(void **s) {
  (void)s;
  char *dir = ks_test_tmpdir("convert-longname");
  char *in = ks_test_path(dir, "in.keepsake"), *out = ks_test_path(dir, "out.pt");
  size_t n = 4 * KS_MAX_NAME;
  char *doc = malloc(n + 128);
  assert_non_null(doc);
  int k = snprintf(doc, 64, "{\"version\":1,\"containers\":{\"x/");
  for (size_t i = 0; i < n; i++) doc[(size_t)k + i] = i % 7 ? 'a' : '%'; /* '%' escapes too: 3x on reread */
  snprintf(doc + (size_t)k + n, 64, "\":{\"kind\":\"list\",\"len\":0}}}");
  write_structure_file(in, doc);
  ks_error err;
  assert_int_equal(convert(in, out, NULL, NULL, &err), KS_E_LIMIT);
  assert_non_null(strstr(err.message, "longer than"));
  assert_int_not_equal(access(out, F_OK), 0);
  free(doc), free(in), free(out);
  ks_test_rmtree(dir);
  free(dir);
}

/* Many lists that each stay under the per-list cap must not add up to an output out of all
 * proportion to the input: empty items have one budget for the whole file. */
static void list_items_have_one_budget_for_the_file(void **s) {
  (void)s;
  char *dir = ks_test_tmpdir("convert-amplify");
  char *in = ks_test_path(dir, "in.keepsake"), *out = ks_test_path(dir, "out.pt");
  const size_t lists = 1000;
  size_t cap = 64 + lists * 64, len = 0;
  char *doc = malloc(cap);
  assert_non_null(doc);
  len += (size_t)snprintf(doc, cap, "{\"version\":1,\"containers\":{");
  for (size_t i = 0; i < lists; i++)
    len += (size_t)snprintf(doc + len, cap - len, "%s\"l%zu\":{\"kind\":\"list\",\"len\":60000}", i ? "," : "", i);
  snprintf(doc + len, cap - len, "}}");
  write_structure_file(in, doc); /* about 40 KB of records asking for 60 million items */
  ks_error err;
  assert_int_equal(convert(in, out, NULL, NULL, &err), KS_E_LIMIT);
  assert_non_null(strstr(err.message, "empty items"));
  assert_int_not_equal(access(out, F_OK), 0);
  free(doc), free(in), free(out);
  ks_test_rmtree(dir);
  free(dir);
}

/* Arguments from the file that ask for a huge state are refused before anything is built. */
static void metric_args_from_the_file_are_bounded(void **s) {
  (void)s;
  char *dir = ks_test_tmpdir("convert-budget");
  char *in = ks_test_path(dir, "big.keepsake"), *out = ks_test_path(dir, "big.pt");
  write_metric_file(in,
                    "{\"m/AUROC\":{\"class\":\"MulticlassAUROC\",\"args\":{\"num_classes\":100000,"
                    "\"thresholds\":1000},\"schema_version\":2,\"update_count\":1}}",
                    "m/AUROC/state_dict/preds", 4);
  ks_error err;
  assert_int_equal(convert(in, out, NULL, NULL, &err), KS_E_LIMIT);
  assert_string_equal(err.key, "m/AUROC");
  assert_non_null(strstr(err.message, "MulticlassAUROC"));
  assert_false(ks_test_exists(out));
  /* a budget that admits it: MulticlassAUROC(num_classes=3, thresholds=None) keeps lists */
  write_metric_file(in,
                    "{\"m/AUROC\":{\"class\":\"MulticlassAUROC\",\"args\":{\"num_classes\":3},"
                    "\"schema_version\":2,\"update_count\":1}}",
                    "m/AUROC/state_dict/preds", 4);
  ks_convert_opts o = {0};
  o.max_metric_bytes = 64;
  assert_int_equal(convert(in, out, &o, NULL, &err), KS_E_LIMIT);
  o.max_metric_bytes = 1 << 20;
  if (convert(in, out, &o, NULL, &err)) fail_msg("%s", err.message);
  pt p = {0};
  pt_read(&p, out);
  assert_list(&p, "m/AUROC/state_dict/preds", 1, 4);
  pt_free(&p);
  /* a class the catalogue does not know keeps its tensor */
  write_metric_file(in, "{\"m/X\":{\"class\":\"NoSuchMetric\",\"args\":{}}}", "m/X/state_dict/preds", 4);
  if (convert(in, out, NULL, NULL, &err)) fail_msg("%s", err.message);
  pt_read(&p, out);
  assert_non_null(ks_statedict_tensor(p.sd, "m/X/state_dict/preds"));
  pt_free(&p);
  free(in), free(out);
  ks_test_rmtree(dir);
  free(dir);
}

/* Flips a byte of the file's last tensor (its checksum then fails). */
static void flip_last_byte(const char *path) {
  size_t n;
  uint8_t *b = ks_test_read_file(path, &n);
  assert_non_null(b);
  b[n - 1] ^= 1;
  assert_int_equal(ks_test_write_file(path, b, n), 0);
  free(b);
}

static void salvage_warnings_come_back_in_the_report(void **s) {
  (void)s;
  char *dir = ks_test_tmpdir("convert-salvage");
  char *in = ks_test_path(dir, "bad.keepsake"), *out = ks_test_path(dir, "out.keepsake");
  write_metric_file(in, "{}", "w", 8);
  flip_last_byte(in);
  ks_convert_report *rep = NULL;
  ks_error err;
  assert_int_equal(convert(in, out, NULL, &rep, &err), KS_E_CHECKSUM);
  assert_non_null(rep);
  assert_int_equal(ks_convert_report_warning_count(rep), 0);
  assert_false(ks_test_exists(out));
  ks_convert_report_free(rep);
  ks_convert_opts o = {0};
  o.salvage = 1;
  if (convert(in, out, &o, &rep, &err)) fail_msg("%s", err.message);
  assert_int_equal(ks_convert_report_warning_count(rep), 1);
  const ks_error *w = ks_convert_report_warning(rep, 0);
  assert_non_null(w);
  assert_int_equal(w->code, KS_E_CHECKSUM);
  assert_string_equal(w->file, in);
  assert_string_equal(w->key, "w");
  assert_null(ks_convert_report_warning(rep, 1));
  assert_int_equal(ks_convert_report_written(rep), 1);
  ks_convert_report_free(rep);
  free(in), free(out);
  ks_test_rmtree(dir);
  free(dir);
}

static void outputs_that_are_not_regular_files_are_refused(void **s) {
  (void)s;
  char *dir = ks_test_tmpdir("convert-out");
  char *link = ks_test_path(dir, "link.pt"), *target = ks_test_path(dir, "target");
  assert_int_equal(ks_test_write_file(target, "keep", 4), 0);
  assert_int_equal(symlink(target, link), 0);
  ks_error err;
  assert_int_equal(convert(CATALOGUE, link, NULL, NULL, &err), KS_E_INVALID);
  assert_non_null(strstr(err.message, "output exists and is a symbolic link"));
  assert_string_equal(err.file, link);
  assert_int_equal(convert(CATALOGUE, dir, NULL, NULL, &err), KS_E_INVALID);
  assert_non_null(strstr(err.message, "a directory"));
  size_t n;
  uint8_t *b = ks_test_read_file(target, &n);
  assert_true(n == 4 && !memcmp(b, "keep", 4));
  free(b);
  assert_int_equal(ks_convert(NULL, link, NULL, NULL, &err), KS_E_INVALID);
  ks_convert_opts bad = {0};
  bad.n_ignore = 1;
  assert_int_equal(ks_convert(CATALOGUE, target, &bad, NULL, &err), KS_E_INVALID);
  free(link), free(target);
  ks_test_rmtree(dir);
  free(dir);
}

/* --ignore leaves out entries and the structure records of what it matches. */
static void ignored_cat_states_leave_no_record(void **s) {
  (void)s;
  char *dir = ks_test_tmpdir("convert-ignore");
  char *out = ks_test_path(dir, "i.pt");
  const char *globs[] = {TM "CatMetric", TM "*AUROC/state_dict/target"};
  ks_convert_opts o = {0};
  o.ignore = globs;
  o.n_ignore = 2;
  ks_convert_report *rep = NULL;
  ks_error err;
  if (convert(CATALOGUE, out, &o, &rep, &err)) fail_msg("%s", err.message);
  assert_int_equal(ks_convert_report_list_states(rep), N_LISTS - 3);
  assert_true(ks_convert_report_ignored(rep) >= 4);
  pt p = {0};
  pt_read(&p, out);
  assert_null(pt_container(&p, TM "CatMetric/state_dict/value"));
  assert_null(pt_container(&p, TM "BinaryAUROC/state_dict/target"));
  assert_list(&p, TM "BinaryAUROC/state_dict/preds", 1, 72);
  pt_free(&p);
  ks_convert_report_free(rep);
  free(out);
  ks_test_rmtree(dir);
  free(dir);
}

/* Every allocation of a conversion to .pt (import, metric builds, lists, writer) failed in turn. */
static void every_allocation_failure_is_reported(void **s) {
  (void)s;
  char *dir = ks_test_tmpdir("convert-nomem");
  char *ks = ks_test_path(dir, "small.keepsake"), *in = ks_test_path(dir, "small.pt"), *out = ks_test_path(dir, "n.pt");
  write_metric_file(ks, "{\"" TM "CatMetric\":{\"class\":\"CatMetric\",\"schema_version\":2,\"update_count\":2}}",
                    TM "CatMetric/state_dict/value", 6);
  ks_error e0;
  if (convert(ks, in, NULL, NULL, &e0)) fail_msg("%s", e0.message); /* a Composer-layout .pt with a list state */
  long n_ok = 0;
  for (long n = 1;; n++) {
    ks_test_alloc ta;
    ks_test_alloc_init(&ta, n);
    ks_convert_opts o = {0};
    o.alloc = &ta.a;
    ks_convert_report *rep = NULL;
    ks_error err;
    ks_status st = convert(in, out, &o, &rep, &err);
    if (st == KS_OK) assert_int_equal(ks_convert_report_list_states(rep), 1);
    ks_convert_report_free(rep);
    assert_int_equal(ta.live, 0);
    if (st == KS_OK) {
      n_ok = n;
      break;
    }
    if (st != KS_E_NOMEM) fail_msg("allocation %ld: %s (%s)", n, ks_strerror(st), err.message);
    assert_false(ks_test_exists(out));
  }
  print_message("ks_convert succeeded at allocation limit %ld\n", n_ok);
  assert_true(n_ok > 20);
  free(ks), free(in), free(out);
  ks_test_rmtree(dir);
  free(dir);
}

/* `keepsake convert` adds nothing to ks_convert: the same bytes, for keepsake inputs too. */
static void cli_writes_what_ks_convert_writes(void **s) {
  (void)s;
  static const char *const inputs[] = {CATALOGUE, KS_SOURCE_DIR "/tests/golden/v1/digits-demo.keepsake",
                                       KS_SOURCE_DIR "/tests/golden/v1/legacy-schema.keepsake", TRAINER};
  static const char *const outs[] = {"o.keepsake", "o.pt"};
  char *dir = ks_test_tmpdir("convert-cli");
  for (size_t i = 0; i < sizeof inputs / sizeof *inputs; i++)
    for (size_t k = 0; k < 2; k++) {
      char *a = ks_test_path(dir, outs[k]), *b = ks_test_path(dir, k ? "cli.pt" : "cli.keepsake");
      ks_error err;
      if (ks_convert(inputs[i], a, NULL, NULL, &err)) fail_msg("%s: %s", inputs[i], err.message);
      char cmd[4096];
      snprintf(cmd, sizeof cmd, "'%s' convert '%s' '%s'", KS_CLI_PATH, inputs[i], b);
      assert_int_equal(ks_test_run(cmd, NULL), 0);
      size_t na, nb;
      uint8_t *x = ks_test_read_file(a, &na), *y = ks_test_read_file(b, &nb);
      if (!x || !y || na != nb || memcmp(x, y, na)) fail_msg("%s -> %s: CLI and ks_convert differ", inputs[i], outs[k]);
      free(x), free(y), free(a), free(b);
    }
  ks_test_rmtree(dir);
  free(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(catalogue_cat_states_export_as_lists),
      cmocka_unit_test(lists_survive_the_round_trip),
      cmocka_unit_test(an_empty_cat_state_exports_as_an_empty_list),
      cmocka_unit_test(metric_args_from_the_file_are_bounded),
      cmocka_unit_test(an_overlong_structure_component_is_refused),
      cmocka_unit_test(list_items_have_one_budget_for_the_file),
      cmocka_unit_test(salvage_warnings_come_back_in_the_report),
      cmocka_unit_test(outputs_that_are_not_regular_files_are_refused),
      cmocka_unit_test(ignored_cat_states_leave_no_record),
      cmocka_unit_test(every_allocation_failure_is_reported),
      cmocka_unit_test(cli_writes_what_ks_convert_writes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
