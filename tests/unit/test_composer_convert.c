/*
 * Composer import end to end: `keepsake convert` of both Composer layouts, then
 * a training state with the catalogue's metrics loads the result. compute() must
 * give what torchmetrics gives for the original states, worked out here from the
 * fixtures' expected values; weights, AdamW state and timestamp must come back.
 */
#include <jansson.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <dirent.h>

#include "keepsake/convert.h"
#include "keepsake/import.h"
#include "keepsake/layout.h"
#include "keepsake/state.h"
#include "testutil.h"

#define FIXTURES KS_FIXTURES_DIR "/composer/"
#define OLD "composer-0.13.5-pickled-metrics"
#define NEW "composer-0.14-dict-metrics"
#define MAX_MODEL 16

typedef struct mdef {
  const char *label, *name, *cls, *args; /* label NULL: train metrics */
} mdef;

/* The program's get_metrics(), as the fixtures' training run defined them. */
static const mdef k_metrics[] = {
    {NULL, "MulticlassAccuracy", "MulticlassAccuracy", "{\"num_classes\":10,\"average\":\"micro\"}"},
    {NULL, "MulticlassF1Score", "MulticlassF1Score", "{\"num_classes\":10}"},
    {"eval", "MulticlassAccuracy", "MulticlassAccuracy", "{\"num_classes\":10,\"average\":\"micro\"}"},
    {"eval", "MulticlassConfusionMatrix", "MulticlassConfusionMatrix", "{\"num_classes\":10}"},
    {"eval", "MeanMetric", "MeanMetric", "{}"},
    {"holdout", "MeanSquaredError", "MeanSquaredError", "{}"},
};
#define N_METRICS (sizeof k_metrics / sizeof k_metrics[0])

typedef struct prog {
  const mdef *defs;
  size_t n_defs;
  json_t *doc, *exp; /* the fixture's expected.json and its "entries" */
  void *data[MAX_MODEL];
  float *grad[MAX_MODEL];
  size_t n_model;
  ks_optimizer *opt;
  ks_timestamp ts;
  ks_state *st;
} prog;

static int same_label(const char *a, const char *b) { return (!a && !b) || (a && b && !strcmp(a, b)); }

static ks_status factory(void *ctx, const char *label, const ks_allocator *a, ks_metric_collection **out,
                         ks_error *err) {
  const prog *p = ctx;
  ks_status s = ks_metric_collection_create(a, out, NULL);
  for (size_t i = 0; i < p->n_defs && !s; i++) {
    if (!same_label(p->defs[i].label, label)) continue;
    ks_metric *m = NULL;
    s = ks_metric_create(p->defs[i].cls, p->defs[i].args, a, &m, err);
    if (!s) s = ks_metric_collection_add(*out, p->defs[i].name, m, NULL);
    if (s) ks_metric_free(m);
  }
  if (s) ks_metric_collection_free(*out);
  return s;
}

/* ---- expected values ---- */

static json_t *entry(const prog *p, const char *key) {
  json_t *e = json_object_get(p->exp, key);
  if (!e) fail_msg("expected.json has no entry %s", key);
  return e;
}

/* The entry named a+b+c. */
static json_t *entry3(const prog *p, const char *a, const char *b, const char *c) {
  char key[512];
  snprintf(key, sizeof key, "%s%s%s", a, b, c);
  return entry(p, key);
}

static double value_at(const json_t *e, size_t i) {
  json_t *v = json_array_get(json_object_get(e, "data"), i);
  assert_true(json_is_number(v));
  return json_number_value(v);
}

static size_t numel(const json_t *e) { return json_array_size(json_object_get(e, "data")); }

static int shape_of(const json_t *e, int64_t *shape) {
  json_t *s = json_object_get(e, "shape");
  int rank = (int)json_array_size(s);
  assert_true(rank <= 4);
  for (int i = 0; i < rank; i++) shape[i] = json_integer_value(json_array_get(s, (size_t)i));
  return rank;
}

static double scalar(const prog *p, const char *key) {
  return json_number_value(json_object_get(entry(p, key), "scalar"));
}

/* ---- the program ---- */

static int is_buffer(const char *name) { return strstr(name, "running_") || strstr(name, "num_batches_tracked"); }

/* One model tensor of the fixture's shape and dtype, zero-filled; parameters also join AdamW. */
static void add_model_tensor(prog *p, const char *key, const json_t *e) {
  int64_t shape[4];
  int rank = shape_of(e, shape);
  ks_dtype dt = !strcmp(json_string_value(json_object_get(e, "dtype")), "I64") ? KS_I64 : KS_F32;
  size_t i = p->n_model++;
  assert_true(i < MAX_MODEL);
  p->data[i] = calloc(numel(e) + 1, ks_dtype_size(dt));
  ks_tensor t;
  assert_int_equal(ks_tensor_init(&t, dt, rank, shape, p->data[i]), KS_OK);
  assert_int_equal(ks_state_add_tensor(p->st, key + strlen("state/model/"), &t, NULL), KS_OK);
  if (dt != KS_F32 || is_buffer(key)) return;
  p->grad[i] = calloc(numel(e) + 1, sizeof(float));
  assert_int_equal(ks_optimizer_add_param(p->opt, p->data[i], p->grad[i], rank, shape, NULL), KS_OK);
}

static void prog_init(prog *p, const char *stem, const mdef *defs, size_t n_defs) {
  memset(p, 0, sizeof *p);
  p->defs = defs, p->n_defs = n_defs;
  json_error_t je;
  char file[1024];
  snprintf(file, sizeof file, "%s%s.expected.json", FIXTURES, stem);
  p->doc = json_load_file(file, JSON_REJECT_DUPLICATES, &je);
  if (!p->doc) fail_msg("cannot read expected.json: %s", je.text);
  p->exp = json_object_get(p->doc, "entries");
  ks_adamw_opts ao = {1e-3, 0.9, 0.999, 1e-8, 1e-2};
  assert_int_equal(ks_optimizer_create_adamw(&ao, NULL, &p->opt, NULL), KS_OK);
  assert_int_equal(ks_state_create("convert", 0, NULL, &p->st, NULL), KS_OK);
  const char *key;
  json_t *e;
  json_object_foreach(p->exp, key, e) if (!strncmp(key, "state/model/", 12)) add_model_tensor(p, key, e);
  assert_int_equal(ks_state_add_optimizer(p->st, "AdamW", p->opt, NULL), KS_OK);
  ks_timestamp_init(&p->ts);
  ks_state_set_timestamp(p->st, &p->ts);
  const char *labels[] = {"eval", "holdout"};
  assert_int_equal(ks_state_build_metrics(p->st, factory, p, labels, 2, NULL), KS_OK);
}

static void prog_free(prog *p) {
  ks_state_free(p->st);
  ks_optimizer_free(p->opt);
  for (size_t i = 0; i < p->n_model; i++) free(p->data[i]), free(p->grad[i]);
  json_decref(p->doc);
}

/* ---- convert with the CLI ---- */

static int cli(const char *sub, const char *a, const char *b) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "'%s' %s '%s' %s%s%s", KS_CLI_PATH, sub, a, b ? "'" : "", b ? b : "", b ? "'" : "");
  char *out = NULL;
  int rc = ks_test_run(cmd, &out);
  if (rc) print_message("%s\n%s", cmd, out ? out : "");
  free(out);
  return rc;
}

/* Converts the fixture `stem` into dir with the CLI and checks that the result verifies. */
static char *convert(const char *dir, const char *stem) {
  char in[1024], name[256];
  snprintf(in, sizeof in, "%s%s.pt", FIXTURES, stem);
  snprintf(name, sizeof name, "%s.keepsake", stem);
  char *out = ks_test_path(dir, name);
  assert_int_equal(cli("convert", in, out), 0);
  assert_int_equal(cli("verify", out, NULL), 0);
  return out;
}

static void load(prog *p, const char *path, ks_load_report *rep) {
  ks_error err;
  ks_status s = ks_state_load(p->st, path, NULL, rep, &err);
  if (s) fail_msg("load failed: %s", err.message);
}

static ks_load_kind kind_of(const ks_load_report *r, const char *path) {
  const ks_load_item *it = ks_load_report_find(r, path);
  if (!it) fail_msg("no report item for %s", path);
  return it->kind;
}

static ks_metric *metric(const prog *p, const char *label, const char *name) {
  ks_metric_collection *mc = label ? ks_state_eval_metrics(p->st, label) : ks_state_train_metrics(p->st);
  assert_non_null(mc);
  ks_metric *m = ks_metric_collection_get(mc, name);
  assert_non_null(m);
  return m;
}

static const ks_tensor *compute(const prog *p, const char *label, const char *name) {
  const ks_tensor *t = NULL;
  ks_error err;
  if (ks_metric_compute(metric(p, label, name), &t, &err)) fail_msg("compute %s: %s", name, err.message);
  return t;
}

static void assert_close(double got, double want, const char *what) {
  if (!(fabs(got - want) <= 1e-6 * fmax(1.0, fabs(want)))) fail_msg("%s: got %.9g, want %.9g", what, got, want);
}

/* compute() of a scalar metric equals `want`, and the saved `_computed` when there is one. */
static void check_scalar(const prog *p, const char *root, const char *label, const char *name, double want) {
  const ks_tensor *t = compute(p, label, name);
  assert_int_equal(ks_tensor_numel(t), 1);
  assert_close(ks_dtype_get_f64(t->dtype, t->data, 0), want, name);
  json_t *cached = entry3(p, root, name, "/_computed");
  if (json_object_get(cached, "data")) assert_close(value_at(cached, 0), want, "_computed");
}

/* ---- torchmetrics' compute(), from the stored states ---- */

/* MulticlassAccuracy(average='micro'): sum tp / (sum tp + sum fn). */
static double accuracy_micro(const prog *p, const char *root) {
  json_t *tp = entry3(p, root, "MulticlassAccuracy/state_dict/", "tp");
  json_t *fn = entry3(p, root, "MulticlassAccuracy/state_dict/", "fn");
  double t = 0, f = 0;
  for (size_t i = 0; i < numel(tp); i++) t += value_at(tp, i), f += value_at(fn, i);
  return t / (t + f);
}

/*
 * MulticlassF1Score(average='macro'): the mean over classes of 2tp/(2tp+fp+fn),
 * 0/0 = 0. torchmetrics leaves classes with tp+fp+fn = 0 out of the mean; the
 * fixtures have none, which is asserted so the formula stays exact.
 */
static double f1_macro(const prog *p) {
  const char *m = "state/train_metrics/MulticlassF1Score/state_dict/";
  json_t *tp = entry3(p, m, "tp", "");
  json_t *fp = entry3(p, m, "fp", "");
  json_t *fn = entry3(p, m, "fn", "");
  size_t n = numel(tp);
  assert_int_equal(n, 10);
  double sum = 0;
  for (size_t i = 0; i < n; i++) {
    double t = value_at(tp, i), den = 2 * t + value_at(fp, i) + value_at(fn, i);
    assert_true(den > 0);
    sum += 2 * t / den;
  }
  return sum / (double)n;
}

/* MeanMetric: value / weight; the value state is `mean_value`, or `value` before torchmetrics 1.1. */
static double mean_metric(const prog *p) {
  const char *root = "state/eval_metrics/eval/MeanMetric/state_dict/";
  json_t *v = json_object_get(p->exp, "state/eval_metrics/eval/MeanMetric/state_dict/mean_value");
  if (!v) v = entry3(p, root, "value", "");
  return value_at(v, 0) / value_at(entry3(p, root, "weight", ""), 0);
}

/* MeanSquaredError: sum_squared_error / total. */
static double mse(const prog *p) {
  const char *root = "state/eval_metrics/holdout/MeanSquaredError/state_dict/";
  return value_at(entry3(p, root, "sum_squared_error", ""), 0) / value_at(entry3(p, root, "total", ""), 0);
}

static void check_confmat(const prog *p) {
  const ks_tensor *t = compute(p, "eval", "MulticlassConfusionMatrix");
  json_t *want = entry(p, "state/eval_metrics/eval/MulticlassConfusionMatrix/state_dict/confmat");
  assert_int_equal(t->rank, 2);
  assert_int_equal(t->shape[0], 10);
  assert_int_equal(t->shape[1], 10);
  assert_int_equal(ks_tensor_numel(t), numel(want));
  for (size_t i = 0; i < numel(want); i++) assert_true(ks_dtype_get_f64(t->dtype, t->data, i) == value_at(want, i));
}

static void check_metrics(const prog *p) {
  check_scalar(p, "state/train_metrics/", NULL, "MulticlassAccuracy", accuracy_micro(p, "state/train_metrics/"));
  check_scalar(p, "state/train_metrics/", NULL, "MulticlassF1Score", f1_macro(p));
  check_scalar(p, "state/eval_metrics/eval/", "eval", "MulticlassAccuracy",
               accuracy_micro(p, "state/eval_metrics/eval/"));
  check_scalar(p, "state/eval_metrics/eval/", "eval", "MeanMetric", mean_metric(p));
  check_scalar(p, "state/eval_metrics/holdout/", "holdout", "MeanSquaredError", mse(p));
  check_confmat(p);
}

/* ---- the rest of the state ---- */

static void check_tensor(const json_t *want, ks_dtype dt, const void *data, size_t n, const char *what) {
  assert_int_equal(numel(want), n);
  for (size_t i = 0; i < n; i++) {
    double w = dt == KS_F32 ? (double)(float)value_at(want, i) : value_at(want, i);
    if (ks_dtype_get_f64(dt, data, i) != w) fail_msg("%s[%zu] differs", what, i);
  }
}

static void check_model(const prog *p) {
  size_t i = 0;
  const char *key;
  json_t *e;
  json_object_foreach(p->exp, key, e) {
    if (strncmp(key, "state/model/", 12)) continue;
    ks_dtype dt = !strcmp(json_string_value(json_object_get(e, "dtype")), "I64") ? KS_I64 : KS_F32;
    check_tensor(e, dt, p->data[i++], numel(e), key);
  }
  assert_int_equal(i, p->n_model);
}

static void check_adamw(const prog *p) {
  ks_statedict *sd;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  assert_int_equal(ks_test_save(ks_optimizer_stateful(p->opt), sd, "", NULL), KS_OK);
  assert_int_equal(ks_optimizer_param_count(p->opt), 6);
  for (size_t i = 0; i < ks_optimizer_param_count(p->opt); i++) {
    char key[64], exp_key[128];
    static const char *const fields[] = {"exp_avg", "exp_avg_sq", "step"};
    for (size_t f = 0; f < 3; f++) {
      snprintf(key, sizeof key, "state/%zu/%s", i, fields[f]);
      snprintf(exp_key, sizeof exp_key, "state/optimizers/AdamW/%s", key);
      const ks_tensor *t = ks_statedict_tensor(sd, key);
      assert_non_null(t);
      check_tensor(entry(p, exp_key), t->dtype, t->data, (size_t)ks_tensor_numel(t), exp_key);
    }
  }
  assert_close(ks_optimizer_lr(p->opt), scalar(p, "state/optimizers/AdamW/param_groups/0/lr"), "lr");
  ks_statedict_free(sd);
}

static void check_timestamp(const prog *p) {
  const char *ts = "state/timestamp/Timestamp/";
  char k[128];
#define TS(field) (snprintf(k, sizeof k, "%s%s", ts, field), scalar(p, k))
  assert_true(p->ts.epoch == (int64_t)TS("epoch"));
  assert_true(p->ts.batch == (int64_t)TS("batch"));
  assert_true(p->ts.sample == (int64_t)TS("sample"));
  assert_true(p->ts.token == (int64_t)TS("token"));
  assert_true(p->ts.batch_in_epoch == (int64_t)TS("batch_in_epoch"));
  assert_true(p->ts.sample_in_epoch == (int64_t)TS("sample_in_epoch"));
  assert_true(p->ts.token_in_epoch == (int64_t)TS("token_in_epoch"));
  assert_true(p->ts.total_wct == TS("total_wct"));
  assert_true(p->ts.epoch_wct == TS("epoch_wct"));
  assert_true(p->ts.batch_wct == TS("batch_wct"));
#undef TS
  assert_int_equal(p->ts.batch, 40);
}

/* ---- tests ---- */

static const char *const k_paths[N_METRICS] = {
    "state/train_metrics/MulticlassAccuracy",        "state/train_metrics/MulticlassF1Score",
    "state/eval_metrics/eval/MulticlassAccuracy",    "state/eval_metrics/eval/MulticlassConfusionMatrix",
    "state/eval_metrics/eval/MeanMetric",            "state/eval_metrics/holdout/MeanSquaredError",
};

/* Old-schema states in the pickled torchmetrics 0.11.4 objects: MeanMetric `value`, MSE sum of shape (). */
static int migrated_in_old_file(const char *path) { return strstr(path, "MeanMetric") || strstr(path, "MeanSquared"); }

static void converted_checkpoint_restores_everything(const char *stem) {
  char *dir = ks_test_tmpdir("composer");
  char *path = convert(dir, stem);
  prog p;
  prog_init(&p, stem, k_metrics, N_METRICS);
  ks_load_report *rep;
  assert_int_equal(ks_load_report_create(NULL, &rep, NULL), KS_OK);
  load(&p, path, rep);
  int old = !strcmp(stem, OLD);
  for (size_t i = 0; i < N_METRICS; i++) {
    ks_load_kind want = old && migrated_in_old_file(k_paths[i]) ? KS_LOAD_MIGRATED : KS_LOAD_LOADED;
    if (kind_of(rep, k_paths[i]) != want) ks_load_report_print(rep, stderr);
    assert_int_equal(kind_of(rep, k_paths[i]), want);
  }
  assert_int_equal(ks_load_report_count(rep, KS_LOAD_MISMATCHED), 0);
  assert_int_equal(ks_load_report_count(rep, KS_LOAD_MISSING), 0);
  assert_int_equal(kind_of(rep, "state/optimizers/AdamW"), KS_LOAD_LOADED);
  /* Composer's count when it is unknown; the pickled objects kept theirs. */
  assert_int_equal(ks_metric_update_count(metric(&p, NULL, "MulticlassF1Score")), old ? 4 : 1);
  check_metrics(&p);
  check_model(&p);
  check_adamw(&p);
  check_timestamp(&p);
  ks_load_report_free(rep);
  prog_free(&p);
  free(path);
  ks_test_rmtree(dir);
  free(dir);
}

static void pickled_metrics_checkpoint_converts_and_loads(void **s) {
  (void)s;
  converted_checkpoint_restores_everything(OLD);
}

static void dict_metrics_checkpoint_converts_and_loads(void **s) {
  (void)s;
  converted_checkpoint_restores_everything(NEW);
}

/* The "keepsake.metrics" entry of a converted file, parsed. */
static json_t *converted_metrics_meta(const char *stem) {
  char *dir = ks_test_tmpdir("composer-meta");
  char *path = convert(dir, stem);
  ks_statedict *sd = NULL;
  ks_meta *meta = NULL;
  assert_int_equal(ks_load(path, NULL, &sd, &meta, NULL), KS_OK);
  const char *txt = ks_meta_get(meta, KS_META_METRICS);
  assert_non_null(txt);
  json_t *j = json_loads(txt, JSON_REJECT_DUPLICATES, NULL);
  assert_non_null(j);
  ks_meta_free(meta);
  ks_statedict_free(sd);
  free(path);
  ks_test_rmtree(dir);
  free(dir);
  return j;
}

static json_int_t meta_int(const json_t *j, const char *path, const char *field) {
  json_t *v = json_object_get(json_object_get(j, path), field);
  assert_true(json_is_integer(v));
  return json_integer_value(v);
}

static const char *meta_class(const json_t *j, const char *path) {
  return json_string_value(json_object_get(json_object_get(j, path), "class"));
}

static void pickled_objects_give_class_args_schema_and_count(void **s) {
  (void)s;
  json_t *j = converted_metrics_meta(OLD);
  assert_int_equal(json_object_size(j), N_METRICS);
  for (size_t i = 0; i < N_METRICS; i++) {
    assert_string_equal(meta_class(j, k_paths[i]), strrchr(k_paths[i], '/') + 1);
    assert_int_equal(meta_int(j, k_paths[i], "schema_version"), migrated_in_old_file(k_paths[i]) ? 1 : 2);
    assert_int_equal(meta_int(j, k_paths[i], "update_count"), 4);
    assert_true(json_is_object(json_object_get(json_object_get(j, k_paths[i]), "args")));
  }
  json_t *acc = json_object_get(json_object_get(j, k_paths[0]), "args");
  assert_string_equal(json_string_value(json_object_get(acc, "average")), "micro");
  assert_int_equal(json_integer_value(json_object_get(acc, "num_classes")), 10);
  json_decref(j);
}

static void state_dict_layout_gives_class_by_name_and_no_args(void **s) {
  (void)s;
  json_t *j = converted_metrics_meta(NEW);
  assert_int_equal(json_object_size(j), N_METRICS);
  for (size_t i = 0; i < N_METRICS; i++) {
    assert_string_equal(meta_class(j, k_paths[i]), strrchr(k_paths[i], '/') + 1);
    assert_int_equal(meta_int(j, k_paths[i], "schema_version"), 2);
    assert_int_equal(meta_int(j, k_paths[i], "update_count"), 1);
    assert_null(json_object_get(json_object_get(j, k_paths[i]), "args"));
  }
  json_decref(j);
}

/* Loads stem's converted file into a program that defines `defs`; returns the kind reported for `path`. */
static ks_load_kind load_kind(const char *stem, const mdef *defs, size_t n, const char *path) {
  char *dir = ks_test_tmpdir("composer-kind");
  char *file = convert(dir, stem);
  prog p;
  prog_init(&p, stem, defs, n);
  ks_load_report *rep;
  assert_int_equal(ks_load_report_create(NULL, &rep, NULL), KS_OK);
  load(&p, file, rep);
  ks_load_kind k = kind_of(rep, path);
  ks_load_report_free(rep);
  prog_free(&p);
  free(file);
  ks_test_rmtree(dir);
  free(dir);
  return k;
}

/* Recall has Accuracy's states and shapes: only the recorded class tells them apart. */
static void other_class_under_the_same_name_is_not_filled(void **s) {
  (void)s;
  mdef defs[N_METRICS];
  memcpy(defs, k_metrics, sizeof defs);
  defs[0].cls = "MulticlassRecall";
  assert_int_equal(load_kind(OLD, defs, N_METRICS, k_paths[0]), KS_LOAD_MISMATCHED);
  assert_int_equal(load_kind(NEW, defs, N_METRICS, k_paths[0]), KS_LOAD_MISMATCHED);
}

/*
 * normalize does not change the confusion matrix state. Pickled objects record
 * their arguments, so a change is caught; the state-dict layout does not, and
 * the load then goes by the shapes alone.
 */
static void recorded_args_are_checked_and_missing_args_fall_back_to_shapes(void **s) {
  (void)s;
  mdef defs[N_METRICS];
  memcpy(defs, k_metrics, sizeof defs);
  defs[3].args = "{\"num_classes\":10,\"normalize\":\"true\"}";
  assert_int_equal(load_kind(OLD, defs, N_METRICS, k_paths[3]), KS_LOAD_MISMATCHED);
  assert_int_equal(load_kind(NEW, defs, N_METRICS, k_paths[3]), KS_LOAD_LOADED);
  defs[3].args = "{\"num_classes\":12}";
  assert_int_equal(load_kind(NEW, defs, N_METRICS, k_paths[3]), KS_LOAD_MISMATCHED);
}

/* ---- the library import writes what the CLI writes ---- */

/* The report of loading `file` into stem's program (or into an empty state when stem is NULL), as text. */
static char *report_text(const char *stem, const char *file) {
  prog p;
  ks_state *empty = NULL;
  if (stem) prog_init(&p, stem, k_metrics, N_METRICS);
  else assert_int_equal(ks_state_create("empty", 0, NULL, &empty, NULL), KS_OK);
  ks_load_report *rep;
  assert_int_equal(ks_load_report_create(NULL, &rep, NULL), KS_OK);
  ks_load_opts lo = {0};
  lo.non_strict_model = 1;
  ks_error err;
  ks_status st = ks_state_load(stem ? p.st : empty, file, &lo, rep, &err);
  if (st) fail_msg("load %s: %s", file, err.message);
  char *txt = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&txt, &len);
  assert_non_null(f);
  ks_load_report_print(rep, f);
  fclose(f);
  ks_load_report_free(rep);
  if (stem) prog_free(&p);
  ks_state_free(empty);
  return txt;
}

/* Files a and b hold the same bytes. */
static void same_bytes(const char *a, const char *b, const char *what) {
  size_t na, nb;
  uint8_t *x = ks_test_read_file(a, &na), *y = ks_test_read_file(b, &nb);
  assert_non_null(x);
  assert_non_null(y);
  if (na != nb || memcmp(x, y, na)) fail_msg("%s differ", what);
  free(x), free(y);
}

/* One input: `keepsake convert`, ks_convert and ks_torch_import + ks_save give the same bytes and the
   same load report; `keepsake convert` and ks_convert the same .pt. */
static void same_as_cli(const char *dir, const char *in, const char *stem) {
  char *a = ks_test_path(dir, "cli.keepsake"), *b = ks_test_path(dir, "lib.keepsake"),
       *c = ks_test_path(dir, "conv.keepsake");
  char *pa = ks_test_path(dir, "cli.pt"), *pc = ks_test_path(dir, "conv.pt");
  int rc = cli("convert", in, a), prc = cli("convert", in, pa);
  ks_statedict *sd = NULL;
  ks_meta *meta = NULL;
  ks_error err;
  ks_status st = ks_torch_import(in, NULL, &sd, &meta, &err);
  if (!st) st = ks_save(b, sd, meta, NULL, &err);
  ks_status cst = ks_convert(in, c, NULL, NULL, &err), pst = ks_convert(in, pc, NULL, NULL, &err);
  if ((rc == 0) != (st == KS_OK) || (rc == 0) != (cst == KS_OK) || (prc == 0) != (pst == KS_OK))
    fail_msg("%s: convert exit %d/%d, library %s, ks_convert %s/%s", in, rc, prc, ks_strerror(st), ks_strerror(cst),
             ks_strerror(pst));
  if (!st) {
    same_bytes(a, b, "convert and ks_torch_import + ks_save");
    same_bytes(a, c, "convert and ks_convert");
    char *ra = report_text(stem, a), *rb = report_text(stem, b), *rc2 = report_text(stem, c);
    assert_string_equal(ra, rb);
    assert_string_equal(ra, rc2);
    free(ra), free(rb), free(rc2);
  }
  if (!pst) same_bytes(pa, pc, "convert and ks_convert to .pt");
  ks_meta_free(meta);
  ks_statedict_free(sd);
  remove(a), remove(b), remove(c), remove(pa), remove(pc);
  free(a), free(b), free(c), free(pa), free(pc);
}

static void library_import_writes_what_convert_writes(void **s) {
  (void)s;
  char *dir = ks_test_tmpdir("composer-same");
  static const char *const folders[] = {KS_FIXTURES_DIR "/composer", KS_FIXTURES_DIR "/torch",
                                        KS_FIXTURES_DIR "/torch213"};
  int n = 0;
  for (size_t f = 0; f < sizeof folders / sizeof *folders; f++) {
    DIR *d = opendir(folders[f]);
    assert_non_null(d);
    for (struct dirent *de; (de = readdir(d));) {
      size_t len = strlen(de->d_name);
      if (len < 4 || strcmp(de->d_name + len - 3, ".pt")) continue;
      char in[1024], stem[256];
      snprintf(in, sizeof in, "%s/%s", folders[f], de->d_name);
      snprintf(stem, sizeof stem, "%.*s", (int)(len - 3), de->d_name);
      same_as_cli(dir, in, !strcmp(stem, OLD) || !strcmp(stem, NEW) ? stem : NULL);
      n++;
    }
    closedir(d);
  }
  assert_true(n >= 25);
  ks_test_rmtree(dir);
  free(dir);
}

/* Through the library, the 0.13.5 file's old-schema MeanMetric is migrated, as through the CLI. */
static void library_path_migrates_old_schema_states(void **s) {
  (void)s;
  char *dir = ks_test_tmpdir("composer-lib");
  char in[1024], *out = ks_test_path(dir, "lib.keepsake");
  snprintf(in, sizeof in, "%s%s.pt", FIXTURES, OLD);
  ks_statedict *sd;
  ks_meta *meta;
  ks_error err;
  if (ks_torch_import(in, NULL, &sd, &meta, &err) || ks_save(out, sd, meta, NULL, &err)) fail_msg("%s", err.message);
  prog p;
  prog_init(&p, OLD, k_metrics, N_METRICS);
  ks_load_report *rep;
  assert_int_equal(ks_load_report_create(NULL, &rep, NULL), KS_OK);
  load(&p, out, rep);
  assert_int_equal(kind_of(rep, "state/eval_metrics/eval/MeanMetric"), KS_LOAD_MIGRATED);
  assert_int_equal(kind_of(rep, "state/eval_metrics/holdout/MeanSquaredError"), KS_LOAD_MIGRATED);
  assert_int_equal(ks_load_report_count(rep, KS_LOAD_MISMATCHED), 0);
  check_metrics(&p);
  ks_load_report_free(rep);
  prog_free(&p);
  ks_meta_free(meta);
  ks_statedict_free(sd);
  free(out);
  ks_test_rmtree(dir);
  free(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(pickled_metrics_checkpoint_converts_and_loads),
      cmocka_unit_test(dict_metrics_checkpoint_converts_and_loads),
      cmocka_unit_test(pickled_objects_give_class_args_schema_and_count),
      cmocka_unit_test(state_dict_layout_gives_class_by_name_and_no_args),
      cmocka_unit_test(other_class_under_the_same_name_is_not_filled),
      cmocka_unit_test(recorded_args_are_checked_and_missing_args_fall_back_to_shapes),
      cmocka_unit_test(library_import_writes_what_convert_writes),
      cmocka_unit_test(library_path_migrates_old_schema_states),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
