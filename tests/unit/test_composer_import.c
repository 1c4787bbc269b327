/*
 * ks_torch_import on what Composer really writes and on what an attacker
 * writes: a checkpoint from Composer's own Trainer (list states, '/' in a
 * metric name and in an eval label), list states of every cat-state class in
 * the {state_dict, _computed} layout, pickled metric objects under names with
 * '/', metric arguments that ask for gigabytes, and 8,000 metrics.
 * Composer-layout inputs are written here with ks_torch_save, which nests the
 * '/'-joined names into dicts exactly as torch.save of Composer's state would.
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
#include <time.h>

#include <cmocka.h>

#include "keepsake/keepsake.h"
#include "testutil.h"

#define FIXTURES KS_FIXTURES_DIR "/composer/"
#define REAL FIXTURES "composer-0.32.1-trainer"
#define OLD FIXTURES "composer-0.13.5-pickled-metrics.pt"

static void ok(ks_status s, const ks_error *err, const char *what) {
  if (s) fail_msg("%s: %s (%s)", what, err ? err->message : "", ks_strerror(s));
}

static json_t *metrics_meta(const ks_meta *meta) {
  const char *txt = ks_meta_get(meta, KS_META_METRICS);
  assert_non_null(txt);
  json_t *j = json_loads(txt, JSON_REJECT_DUPLICATES, NULL);
  assert_true(json_is_object(j));
  return j;
}

static void import_file(const char *path, const ks_import_opts *o, ks_statedict **sd, ks_meta **meta) {
  ks_error err;
  ok(ks_torch_import(path, o, sd, meta, &err), &err, path);
}

/* Writes sd as a .pt in dir; returns the malloc'd path. */
static char *write_pt(const char *dir, const char *name, const ks_statedict *sd) {
  char *path = ks_test_path(dir, name);
  ks_torch_write_opts wo = {0};
  wo.io = ks_test_io_nosync();
  ks_error err;
  ok(ks_torch_save(path, sd, &wo, &err), &err, "ks_torch_save");
  return path;
}

/* Schema version and class that keepsake.metrics gives `path`. */
static int meta_version(const json_t *j, const char *path) {
  json_t *v = json_object_get(json_object_get(j, path), "schema_version");
  if (!json_is_integer(v)) fail_msg("keepsake.metrics has no entry %s", path);
  return (int)json_integer_value(v);
}

static const char *meta_class(const json_t *j, const char *path) {
  return json_string_value(json_object_get(json_object_get(j, path), "class"));
}

/* A fresh metric filled from the imported states of `path` (no cached result). */
static ks_metric *fresh(const char *cls, const char *args, const ks_statedict *sd, const json_t *meta,
                        const char *path) {
  ks_metric *m;
  ks_error err;
  ok(ks_metric_create(cls, args, NULL, &m, &err), &err, cls);
  char prefix[1200];
  snprintf(prefix, sizeof prefix, "%s/state_dict/", path);
  ok(ks_metric_load_state_dict(m, sd, prefix, meta_version(meta, path), 0, NULL, NULL, &err), &err, path);
  return m;
}

static double scalar_of(ks_metric *m) {
  const ks_tensor *t;
  ks_error err;
  ok(ks_metric_compute(m, &t, &err), &err, "compute");
  assert_int_equal(ks_tensor_numel(t), 1);
  return ks_dtype_get_f64(t->dtype, t->data, 0);
}

/* ---- Composer's own Trainer ---- */

typedef struct real_metric {
  const char *path, *cls, *args;
} real_metric;

/* The generator's metrics (tests/fixtures/composer/gen_composer_real.py). */
static const real_metric k_real[] = {
    {"state/train_metrics/MulticlassAccuracy", "MulticlassAccuracy", "{\"num_classes\":3,\"average\":\"micro\"}"},
    {"state/train_metrics/acc/top1", "MulticlassAccuracy", "{\"num_classes\":3,\"average\":\"micro\",\"top_k\":1}"},
    {"state/train_metrics/CatMetric", "CatMetric", "{}"},
    {"state/train_metrics/BinaryAUROC", "BinaryAUROC", "{}"},
    {"state/train_metrics/BinaryAveragePrecision", "BinaryAveragePrecision", "{}"},
    {"state/eval_metrics/eval/MulticlassAccuracy", "MulticlassAccuracy", "{\"num_classes\":3,\"average\":\"micro\"}"},
    {"state/eval_metrics/eval/MulticlassConfusionMatrix", "MulticlassConfusionMatrix", "{\"num_classes\":3}"},
    {"state/eval_metrics/eval/MeanMetric", "MeanMetric", "{}"},
    {"state/eval_metrics/eval/BinaryAUROC", "BinaryAUROC", "{}"},
    {"state/eval_metrics/val/holdout/MulticlassAccuracy", "MulticlassAccuracy",
     "{\"num_classes\":3,\"average\":\"micro\"}"},
    {"state/eval_metrics/val/holdout/MulticlassConfusionMatrix", "MulticlassConfusionMatrix", "{\"num_classes\":3}"},
    {"state/eval_metrics/val/holdout/MeanMetric", "MeanMetric", "{}"},
    {"state/eval_metrics/val/holdout/BinaryAUROC", "BinaryAUROC", "{}"},
};
#define N_REAL (sizeof k_real / sizeof k_real[0])

static json_t *load_expected(const char *stem) {
  char file[1024];
  snprintf(file, sizeof file, "%s.expected.json", stem);
  json_error_t je;
  json_t *doc = json_load_file(file, JSON_REJECT_DUPLICATES, &je);
  if (!doc) fail_msg("cannot read %s: %s", file, je.text);
  return doc;
}

/* The values of an expected state: a tensor's data, or a list's items concatenated. */
static json_t *flat_values(const json_t *v) {
  json_t *list = json_object_get(v, "list"), *item, *x;
  if (!list) return json_incref(json_object_get(v, "data"));
  json_t *out = json_array();
  size_t i, k;
  json_array_foreach(list, i, item) json_array_foreach(json_object_get(item, "data"), k, x) json_array_append(out, x);
  return out;
}

static void check_state(const ks_statedict *sd, const char *path, const char *state, const json_t *want) {
  char key[1200];
  snprintf(key, sizeof key, "%s/state_dict/%s", path, state);
  const ks_tensor *t = ks_statedict_tensor(sd, key);
  if (!t) fail_msg("%s is not a tensor after import", key);
  json_t *vals = flat_values(want);
  if ((size_t)ks_tensor_numel(t) != json_array_size(vals))
    fail_msg("%s: %lld values, want %zu", key, (long long)ks_tensor_numel(t), json_array_size(vals));
  for (size_t i = 0; i < json_array_size(vals); i++)
    assert_true(ks_dtype_get_f64(t->dtype, t->data, i) == (double)(float)json_number_value(json_array_get(vals, i)) ||
                ks_dtype_get_f64(t->dtype, t->data, i) == json_number_value(json_array_get(vals, i)));
  json_decref(vals);
}

/* compute() from the imported states equals what torchmetrics cached in _computed. */
static void check_compute(const real_metric *rm, const ks_statedict *sd, const json_t *meta, const json_t *computed) {
  ks_metric *m = fresh(rm->cls, rm->args, sd, meta, rm->path);
  const ks_tensor *t;
  ks_error err;
  ok(ks_metric_compute(m, &t, &err), &err, rm->path);
  json_t *want = json_object_get(computed, "data");
  assert_int_equal((size_t)ks_tensor_numel(t), json_array_size(want));
  for (size_t i = 0; i < json_array_size(want); i++) {
    double got = ks_dtype_get_f64(t->dtype, t->data, i), w = json_number_value(json_array_get(want, i));
    if (!(fabs(got - w) <= 1e-6 * fmax(1.0, fabs(w))))
      fail_msg("%s[%zu]: got %.9g, torchmetrics %.9g", rm->path, i, got, w);
  }
  ks_metric_free(m);
}

static void real_trainer_checkpoint_imports_exactly(void **s) {
  (void)s;
  ks_statedict *sd;
  ks_meta *meta;
  import_file(REAL ".pt", NULL, &sd, &meta);
  json_t *doc = load_expected(REAL), *exp = json_object_get(doc, "metrics"), *mj = metrics_meta(meta);
  assert_int_equal(json_object_size(exp), N_REAL);
  assert_int_equal(json_object_size(mj), N_REAL);
  for (size_t i = 0; i < N_REAL; i++) {
    json_t *e = json_object_get(exp, k_real[i].path), *v;
    if (!e) fail_msg("expected.json has no metric %s", k_real[i].path);
    const char *state;
    json_object_foreach(json_object_get(e, "state_dict"), state, v) check_state(sd, k_real[i].path, state, v);
    check_compute(&k_real[i], sd, mj, json_object_get(e, "_computed"));
    /* The class is known by name; "acc/top1" names no class. */
    const char *cls = meta_class(mj, k_real[i].path);
    if (strstr(k_real[i].path, "acc/top1")) assert_null(cls);
    else assert_string_equal(cls, k_real[i].cls);
  }
  json_decref(mj);
  json_decref(doc);
  ks_meta_free(meta);
  ks_statedict_free(sd);
}

static ks_status real_factory(void *ctx, const char *label, const ks_allocator *a, ks_metric_collection **out,
                              ks_error *err) {
  (void)ctx;
  char root[256];
  snprintf(root, sizeof root, label ? "state/eval_metrics/%s/" : "state/train_metrics/", label);
  ks_status st = ks_metric_collection_create(a, out, NULL);
  for (size_t i = 0; i < N_REAL && !st; i++) {
    const char *p = k_real[i].path;
    if (strncmp(p, root, strlen(root)) || (label && strchr(p + strlen(root), '/'))) continue;
    ks_metric *m = NULL;
    st = ks_metric_create(k_real[i].cls, k_real[i].args, a, &m, err);
    if (!st) st = ks_metric_collection_add(*out, p + strlen(root), m, NULL);
    if (st) ks_metric_free(m);
  }
  if (st) ks_metric_collection_free(*out);
  return st;
}

/*
 * A program defining the generator's metrics fills every one of them from the
 * import. ks_state takes no '/' in an evaluator label, so the program defines
 * "eval" only and the val/holdout metrics are reported as not in the program.
 */
static void real_trainer_checkpoint_fills_a_program(void **s) {
  (void)s;
  ks_statedict *sd;
  ks_meta *meta;
  import_file(REAL ".pt", NULL, &sd, &meta);
  ks_state *st;
  ks_error err;
  ok(ks_state_create("real", 0, NULL, &st, NULL), NULL, "state");
  const char *labels[] = {"eval"};
  ok(ks_state_build_metrics(st, real_factory, NULL, labels, 1, &err), &err, "metrics");
  ks_load_report *rep;
  ok(ks_load_report_create(NULL, &rep, NULL), NULL, "report");
  ks_load_opts lo = {0};
  lo.non_strict_model = 1;
  ok(ks_state_load_state_dict(st, sd, meta, &lo, rep, &err), &err, "load");
  for (size_t i = 0; i < N_REAL; i++) {
    const ks_load_item *it = ks_load_report_find(rep, k_real[i].path);
    ks_load_kind want = strstr(k_real[i].path, "val/holdout") ? KS_LOAD_SKIPPED : KS_LOAD_LOADED;
    if (!it || it->kind != want) {
      ks_load_report_print(rep, stderr);
      fail_msg("%s: not %s", k_real[i].path, want == KS_LOAD_LOADED ? "loaded" : "skipped");
    }
  }
  assert_int_equal(ks_load_report_count(rep, KS_LOAD_MISMATCHED), 0);
  ks_load_report_free(rep);
  ks_state_free(st);
  ks_meta_free(meta);
  ks_statedict_free(sd);
}

/* ---- list states in the {state_dict, _computed} layout ---- */

typedef struct cat_case {
  const char *cls, *args;
  int classes; /* preds columns; 0 = 1-d preds */
} cat_case;

static void batch(const cat_case *c, int b, ks_tensor *in, float *preds, int64_t *target, int64_t n) {
  int cols = c->classes ? c->classes : 1;
  for (int64_t i = 0; i < n; i++) {
    target[i] = (i * 7 + b * 3) % (c->classes ? c->classes : 2);
    for (int k = 0; k < cols; k++) preds[i * cols + k] = (float)((i * 37 + k * 11 + b * 5) % 17) / 17.0f;
  }
  int64_t ps[2] = {n, c->classes}, ts[1] = {n};
  assert_int_equal(ks_tensor_init(&in[0], KS_F32, c->classes ? 2 : 1, ps, preds), KS_OK);
  assert_int_equal(ks_tensor_init(&in[1], KS_I64, 1, ts, target), KS_OK);
}

/*
 * Composer >= 0.14 saves a list state as state_dict/<state>/0, /1, ... (one
 * tensor per update). Each class's states are split per batch as torchmetrics
 * keeps them; the import must join them so that compute() matches a metric
 * that saw the same batches.
 */
static void dict_layout_list_states_are_joined(void **s) {
  (void)s;
  static const cat_case cases[] = {{"CatMetric", "{}", 0},
                                   {"BinaryAUROC", "{}", 0},
                                   {"BinaryAveragePrecision", "{}", 0},
                                   {"MulticlassAUROC", "{\"num_classes\":3}", 3}};
  char *dir = ks_test_tmpdir("composer-cat");
  ks_statedict *flat;
  assert_int_equal(ks_statedict_create(NULL, &flat, NULL), KS_OK);
  ks_metric *ref[4];
  static const int64_t sizes[3] = {5, 3, 6};
  for (size_t c = 0; c < 4; c++) {
    ok(ks_metric_create(cases[c].cls, cases[c].args, NULL, &ref[c], NULL), NULL, cases[c].cls);
    for (int b = 0; b < 3; b++) {
      float preds[18];
      int64_t target[6];
      ks_tensor in[2];
      batch(&cases[c], b, in, preds, target, sizes[b]);
      ok(ks_metric_update(ref[c], in, c == 0 ? 1 : 2, NULL), NULL, "update");
      for (int k = 0; k < (c == 0 ? 1 : 2); k++) {
        char key[256];
        snprintf(key, sizeof key, "state/train_metrics/%s/state_dict/%s/%d", cases[c].cls,
                 c == 0 ? "value" : k == 0 ? "preds" : "target", b);
        assert_int_equal(ks_statedict_set_tensor(flat, key, &in[k], KS_COPY, NULL), KS_OK);
      }
    }
    char key[256];
    snprintf(key, sizeof key, "state/train_metrics/%s/_computed", cases[c].cls);
    assert_int_equal(ks_statedict_set_null(flat, key, NULL), KS_OK);
  }
  char *pt = write_pt(dir, "cat.pt", flat);
  ks_statedict *sd;
  ks_meta *meta;
  import_file(pt, NULL, &sd, &meta);
  json_t *mj = metrics_meta(meta);
  for (size_t c = 0; c < 4; c++) {
    char path[256], key[300];
    snprintf(path, sizeof path, "state/train_metrics/%s", cases[c].cls);
    snprintf(key, sizeof key, "%s/state_dict/%s/0", path, c == 0 ? "value" : "preds");
    assert_null(ks_statedict_tensor(sd, key));
    snprintf(key, sizeof key, "%s/state_dict/%s", path, c == 0 ? "value" : "preds");
    const ks_tensor *t = ks_statedict_tensor(sd, key);
    assert_non_null(t);
    assert_int_equal(t->shape[0], 14);
    ks_metric *m = fresh(cases[c].cls, cases[c].args, sd, mj, path);
    if (c == 0) {
      ks_tensor got, want;
      assert_int_equal(ks_metric_state_info(m, 0, NULL, NULL, &got), KS_OK);
      assert_int_equal(ks_metric_state_info(ref[c], 0, NULL, NULL, &want), KS_OK);
      assert_int_equal(got.nbytes, want.nbytes);
      assert_memory_equal(got.data, want.data, got.nbytes);
    } else {
      assert_true(scalar_of(m) == scalar_of(ref[c]));
    }
    ks_metric_free(m);
    ks_metric_free(ref[c]);
  }
  json_decref(mj);
  ks_meta_free(meta);
  ks_statedict_free(sd);
  ks_statedict_free(flat);
  free(pt);
  ks_test_rmtree(dir);
  free(dir);
}

/* ---- '/' in names of the pickled layout ---- */

/* The 0.13.5 fixture with its train MulticlassAccuracy renamed acc/top1 and label eval renamed val/holdout. */
static ks_statedict *renamed_old(void) {
  ks_statedict *raw, *out;
  ks_error err;
  ok(ks_torch_load(OLD, NULL, &raw, NULL, &err), &err, OLD);
  assert_int_equal(ks_statedict_create(NULL, &out, NULL), KS_OK);
  ks_entry e;
  for (size_t i = 0; ks_statedict_at(raw, i, &e) == KS_OK; i++) {
    char name[1200];
    const char *acc = "state/train_metrics/MulticlassAccuracy/", *ev = "state/eval_metrics/eval/";
    if (!strncmp(e.name, acc, strlen(acc)))
      snprintf(name, sizeof name, "state/train_metrics/acc/top1/%s", e.name + strlen(acc));
    else if (!strncmp(e.name, ev, strlen(ev)))
      snprintf(name, sizeof name, "state/eval_metrics/val/holdout/%s", e.name + strlen(ev));
    else snprintf(name, sizeof name, "%s", e.name);
    assert_int_equal(ks_statedict_set_entry(out, name, &e, KS_COPY, NULL), KS_OK);
  }
  ks_statedict_free(raw);
  return out;
}

static void slash_in_pickled_metric_names_and_labels(void **s) {
  (void)s;
  char *dir = ks_test_tmpdir("composer-slash");
  ks_statedict *flat = renamed_old();
  char *pt = write_pt(dir, "slash.pt", flat);
  ks_statedict *sd;
  ks_meta *meta;
  import_file(pt, NULL, &sd, &meta);
  json_t *mj = metrics_meta(meta);
  assert_int_equal(json_object_size(mj), 6);
  assert_string_equal(meta_class(mj, "state/train_metrics/acc/top1"), "MulticlassAccuracy");
  assert_string_equal(meta_class(mj, "state/eval_metrics/val/holdout/MeanMetric"), "MeanMetric");
  assert_int_equal(meta_version(mj, "state/eval_metrics/val/holdout/MeanMetric"), 1);
  assert_null(ks_statedict_tensor(sd, "state/train_metrics/acc/top1/_defaults/tp"));
  assert_non_null(ks_statedict_tensor(sd, "state/train_metrics/acc/top1/state_dict/tp"));
  ks_metric *acc = fresh("MulticlassAccuracy", "{\"num_classes\":10,\"average\":\"micro\"}", sd, mj,
                         "state/train_metrics/acc/top1");
  ks_metric *mean;
  ok(ks_metric_create("MeanMetric", "{}", NULL, &mean, NULL), NULL, "mean");
  int migrated = 0;
  const char *prefix = "state/eval_metrics/val/holdout/MeanMetric/state_dict/";
  ok(ks_metric_load_state_dict(mean, sd, prefix, 1, 0, &migrated, NULL, NULL), NULL, "mean");
  assert_true(migrated);
  ks_metric_free(mean);
  ks_metric_free(acc);
  json_decref(mj);
  ks_meta_free(meta);
  ks_statedict_free(sd);
  ks_statedict_free(flat);
  free(pt);
  ks_test_rmtree(dir);
  free(dir);
}

/* ---- untrusted metric arguments ---- */

/* A pickled MulticlassConfusionMatrix object whose attributes say num_classes = n. */
static char *confmat_file(const char *dir, int64_t n) {
  ks_statedict *flat;
  assert_int_equal(ks_statedict_create(NULL, &flat, NULL), KS_OK);
  const char *r = "state/eval_metrics/eval/MulticlassConfusionMatrix/";
  char k[256];
  int64_t cm[4] = {1, 0, 0, 1}, shape[2] = {2, 2};
  ks_tensor t;
  assert_int_equal(ks_tensor_init(&t, KS_I64, 2, shape, cm), KS_OK);
#define KEY(x) (snprintf(k, sizeof k, "%s%s", r, x), k)
  const char *cls = "torchmetrics.classification.confusion_matrix.MulticlassConfusionMatrix";
  assert_int_equal(ks_statedict_set_string(flat, KEY("__class__"), cls, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_int(flat, KEY("num_classes"), n, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_tensor(flat, KEY("_defaults/confmat"), &t, KS_COPY, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_tensor(flat, KEY("confmat"), &t, KS_COPY, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_int(flat, KEY("_update_count"), 1, NULL), KS_OK);
#undef KEY
  char name[64];
  snprintf(name, sizeof name, "confmat-%lld.pt", (long long)n);
  char *pt = write_pt(dir, name, flat);
  ks_statedict_free(flat);
  return pt;
}

/* 12000 classes would make a 1.1 GB matrix from a file of a few hundred bytes: refused, and said so. */
static void metric_arguments_cannot_drive_memory(void **s) {
  (void)s;
  char *dir = ks_test_tmpdir("composer-hostile");
  char *big = confmat_file(dir, 12000), *small = confmat_file(dir, 2);
  size_t len;
  uint8_t *bytes = ks_test_read_file(big, &len);
  assert_non_null(bytes);
  assert_true(len < 4096);
  free(bytes);
  ks_statedict *sd = NULL;
  ks_meta *meta = NULL;
  ks_error err;
  assert_int_equal(ks_torch_import(big, NULL, &sd, &meta, &err), KS_E_LIMIT);
  assert_null(sd);
  assert_non_null(strstr(err.message, "MulticlassConfusionMatrix"));
  assert_non_null(strstr(err.message, "12000"));
  assert_string_equal(err.key, "state/eval_metrics/eval/MulticlassConfusionMatrix");
  /* The CLI says the same and writes nothing. */
  char cmd[2048], *out = NULL, *dst = ks_test_path(dir, "out.keepsake");
  snprintf(cmd, sizeof cmd, "'%s' convert '%s' '%s'", KS_CLI_PATH, big, dst);
  assert_int_equal(ks_test_run(cmd, &out), 1);
  assert_non_null(strstr(out, "12000"));
  assert_false(ks_test_exists(dst));
  free(out);
  /* Two classes are fine, and the budget is an option. */
  import_file(small, NULL, &sd, &meta);
  json_t *mj = metrics_meta(meta);
  json_t *args = json_object_get(json_object_get(mj, "state/eval_metrics/eval/MulticlassConfusionMatrix"), "args");
  assert_int_equal(json_integer_value(json_object_get(args, "num_classes")), 2);
  json_decref(mj);
  ks_meta_free(meta);
  ks_statedict_free(sd);
  ks_import_opts o = {0};
  o.max_metric_bytes = 16;
  assert_int_equal(ks_torch_import(small, &o, &sd, &meta, &err), KS_E_LIMIT);
  free(dst);
  free(big);
  free(small);
  ks_test_rmtree(dir);
  free(dir);
}

/*
 * 384 references to one 256 KiB storage in a list state: joining them copies
 * 96 MiB out of a 260 KB file. The join shares the import's byte budget.
 */
static void joined_list_states_are_bounded(void **s) {
  (void)s;
  ks_statedict *sd = NULL;
  ks_meta *meta = NULL;
  ks_error err;
  assert_int_equal(ks_torch_import(FIXTURES "hostile-shared-list-state.pt", NULL, &sd, &meta, &err), KS_E_LIMIT);
  assert_null(sd);
  assert_null(meta);
  /* Refused while flattening (the torch reader's output budget stops the 259th copy of the
     shared storage) or, under a larger read budget, by the join: the key names the state. */
  assert_true(!strncmp(err.key, "state/train_metrics/CatMetric/state_dict/value", 46));
  /* The same budget is an option: a real checkpoint's joins fit the default, not 64 bytes. */
  ks_import_opts o = {0};
  o.max_metric_bytes = 64;
  assert_int_equal(ks_torch_import(REAL ".pt", &o, &sd, &meta, &err), KS_E_LIMIT);
  assert_non_null(strstr(err.message, "list state"));
  o.max_metric_bytes = 1 << 20;
  import_file(REAL ".pt", &o, &sd, &meta);
  ks_meta_free(meta);
  ks_statedict_free(sd);
}

/* One budget bounds every metric of an import: it shrinks by what each rebuild allocated. */
static void attribute_budget_is_shared_and_exact(void **s) {
  (void)s;
  const char *attrs = "{\"num_classes\":100,\"normalize\":null,\"ignore_index\":null,\"training\":true}";
  uint64_t budget = UINT64_C(1) << 30;
  ks_metric *m = NULL;
  ks_error err;
  ok(ks_metric_from_attributes("MulticlassConfusionMatrix", attrs, NULL, &budget, &m, &err), &err, "rebuild");
  assert_non_null(m);
  uint64_t used = (UINT64_C(1) << 30) - budget;
  assert_true(used >= 2 * 100 * 100 * 8); /* probe and result, each a 100x100 I64 matrix */
  ks_metric_free(m);
  uint64_t tight = used - 1;
  assert_int_equal(ks_metric_from_attributes("MulticlassConfusionMatrix", attrs, NULL, &tight, &m, &err), KS_E_LIMIT);
  assert_null(m);
  assert_non_null(strstr(err.message, "num_classes"));
  ok(ks_metric_from_attributes("MulticlassConfusionMatrix", attrs, NULL, NULL, &m, &err), &err, "uncapped");
  assert_non_null(m);
  ks_metric_free(m);
  /* Not a catalogue class, or attributes that do not build it: no metric, no error. */
  ok(ks_metric_from_attributes("NoSuchMetric", "{}", NULL, NULL, &m, &err), &err, "unknown");
  assert_null(m);
  ok(ks_metric_from_attributes("MulticlassAccuracy", "{\"num_classes\":-3}", NULL, NULL, &m, &err), &err, "bad");
  assert_null(m);
  assert_int_equal(ks_metric_from_attributes("MeanMetric", "[1]", NULL, NULL, &m, &err), KS_E_INVALID);
}

/* ---- scale ---- */

#define MANY 8000

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* 8,000 pickled MeanMetric objects: the import stays linear in the entries (time printed, not asserted). */
static void many_metrics_import(void **s) {
  (void)s;
  char *dir = ks_test_tmpdir("composer-many");
  ks_statedict *flat;
  assert_int_equal(ks_statedict_create(NULL, &flat, NULL), KS_OK);
  float one = 1.0f;
  ks_tensor t;
  assert_int_equal(ks_tensor_init(&t, KS_F32, 0, NULL, &one), KS_OK);
  for (int i = 0; i < MANY; i++) {
    char k[128];
#define KEY(x) (snprintf(k, sizeof k, "state/eval_metrics/l%d/Mean%d/%s", i % 80, i, x), k)
    assert_int_equal(ks_statedict_set_string(flat, KEY("__class__"), "torchmetrics.aggregation.MeanMetric", NULL),
                     KS_OK);
    assert_int_equal(ks_statedict_set_string(flat, KEY("nan_strategy"), "warn", NULL), KS_OK);
    assert_int_equal(ks_statedict_set_tensor(flat, KEY("_defaults/mean_value"), &t, KS_COPY, NULL), KS_OK);
    assert_int_equal(ks_statedict_set_tensor(flat, KEY("_defaults/weight"), &t, KS_COPY, NULL), KS_OK);
    assert_int_equal(ks_statedict_set_tensor(flat, KEY("mean_value"), &t, KS_COPY, NULL), KS_OK);
    assert_int_equal(ks_statedict_set_tensor(flat, KEY("weight"), &t, KS_COPY, NULL), KS_OK);
    assert_int_equal(ks_statedict_set_int(flat, KEY("_update_count"), i, NULL), KS_OK);
#undef KEY
  }
  char *pt = write_pt(dir, "many.pt", flat);
  ks_statedict *sd;
  ks_meta *meta;
  double t0 = now();
  ks_statedict *raw;
  ok(ks_torch_load(pt, NULL, &raw, NULL, NULL), NULL, "load");
  double t1 = now();
  import_file(pt, NULL, &sd, &meta);
  double t2 = now();
  ks_statedict_free(raw);
  print_message("%d metrics (%zu entries): ks_torch_load %.3f s, ks_torch_import %.3f s\n", MANY,
                ks_statedict_count(flat), t1 - t0, t2 - t1);
  json_t *mj = metrics_meta(meta);
  assert_int_equal(json_object_size(mj), MANY);
  json_t *last = json_object_get(mj, "state/eval_metrics/l79/Mean7999");
  assert_int_equal(json_integer_value(json_object_get(last, "update_count")), 7999);
  assert_string_equal(json_string_value(json_object_get(json_object_get(last, "args"), "nan_strategy")), "warn");
  assert_non_null(ks_statedict_tensor(sd, "state/eval_metrics/l79/Mean7999/state_dict/weight"));
  assert_int_equal(ks_statedict_count(sd), 3 * MANY);
  json_decref(mj);
  ks_meta_free(meta);
  ks_statedict_free(sd);
  ks_statedict_free(flat);
  free(pt);
  ks_test_rmtree(dir);
  free(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(real_trainer_checkpoint_imports_exactly),
      cmocka_unit_test(real_trainer_checkpoint_fills_a_program),
      cmocka_unit_test(dict_layout_list_states_are_joined),
      cmocka_unit_test(slash_in_pickled_metric_names_and_labels),
      cmocka_unit_test(metric_arguments_cannot_drive_memory),
      cmocka_unit_test(joined_list_states_are_bounded),
      cmocka_unit_test(attribute_budget_is_shared_and_exact),
      cmocka_unit_test(many_metrics_import),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
