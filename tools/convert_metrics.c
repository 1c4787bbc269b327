/*
 * What the state loader needs to fill a program's metrics from a converted
 * Composer checkpoint. The loader matches metrics by name and checks every
 * state's shape, so anything written here that is not certain is left out:
 * a wrong class or argument would make it refuse a metric it could load.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert_metrics.h"

/* Constructor arguments the catalogue takes that a pickled object keeps as plain attributes. */
static const char *const k_arg_attrs[] = {"average",     "ignore_index", "multidim_average", "nan_strategy",
                                          "normalize",   "num_classes",  "num_labels",       "num_outputs",
                                          "squared",     "threshold",    "thresholds",       "top_k"};

static ks_status fail(ks_error *err, ks_status code, const char *msg) {
  if (err) {
    ks_error_clear(err);
    err->code = code;
    snprintf(err->message, sizeof err->message, "%s", msg);
    snprintf(err->key, sizeof err->key, "keepsake.metrics");
  }
  return code;
}

static int in_catalogue(const char *name) {
  for (size_t i = 0; i < ks_metric_class_count(); i++)
    if (!strcmp(ks_metric_class_name(i), name)) return 1;
  return 0;
}

/* "torchmetrics.classification.accuracy.MulticlassAccuracy" -> "MulticlassAccuracy". */
static const char *class_of(const json_t *m) {
  const char *global = json_string_value(json_object_get(m, "class"));
  if (global) {
    const char *dot = strrchr(global, '.');
    return dot ? dot + 1 : global;
  }
  const char *name = json_string_value(json_object_get(m, "name"));
  return name && in_catalogue(name) ? name : NULL;
}

static int is_arg_attr(const char *key) {
  for (size_t i = 0; i < sizeof k_arg_attrs / sizeof k_arg_attrs[0]; i++)
    if (!strcmp(k_arg_attrs[i], key)) return 1;
  return 0;
}

/*
 * Whether the class takes a `thresholds` argument. A binned curve metric keeps
 * its thresholds as a tensor buffer, not as a plain attribute, so its arguments
 * cannot be read back from the attributes.
 */
static int takes_thresholds(const char *cls, const char *args) {
  json_t *probe = json_loads(args, 0, NULL);
  int takes = 0;
  if (probe && !json_object_set_new(probe, "thresholds", json_null())) {
    char *s = json_dumps(probe, JSON_COMPACT);
    ks_metric *m = NULL;
    takes = s && ks_metric_create(cls, s, NULL, &m, NULL) == KS_OK;
    ks_metric_free(m);
    free(s);
  }
  json_decref(probe);
  return takes;
}

/*
 * Attributes that are constructor arguments -> the catalogue's canonical JSON,
 * or NULL when they do not build a catalogue metric or may be incomplete.
 * Attributes the catalogue does not know (F1's beta = 1) are left out: they do
 * not change the states, and the loader's shape checks catch the rest.
 */
static json_t *rebuild_args(const char *cls, const json_t *attrs) {
  json_t *args = json_object();
  const char *key;
  json_t *v;
  int ok = args != NULL;
  json_object_foreach((json_t *)attrs, key, v) if (ok && is_arg_attr(key)) ok = !json_object_set(args, key, v);
  char *s = ok ? json_dumps(args, JSON_COMPACT) : NULL;
  int partial = !json_object_get(args, "thresholds");
  json_decref(args);
  ks_metric *m = NULL;
  json_t *out = NULL;
  if (s && ks_metric_create(cls, s, NULL, &m, NULL) == KS_OK && !(partial && takes_thresholds(cls, s)))
    out = json_loads(ks_metric_args_json(m), JSON_REJECT_DUPLICATES, NULL);
  ks_metric_free(m);
  free(s);
  return out;
}

static const ks_tensor *state_tensor(const ks_statedict *sd, const char *path, const char *state) {
  char key[KS_MAX_NAME + 64];
  int n = snprintf(key, sizeof key, "%s/state_dict/%s", path, state);
  return n > 0 && (size_t)n < sizeof key ? ks_statedict_tensor(sd, key) : NULL;
}

/*
 * torchmetrics < 1.1 named the aggregation states `value` (CatMetric still
 * does, unchanged) and kept the MSE sum as a 0-d tensor.
 */
static int schema_version_of(const ks_statedict *sd, const char *path, const char *cls) {
  int old_name = state_tensor(sd, path, "value") && !(cls && !strcmp(cls, "CatMetric"));
  const ks_tensor *sse = state_tensor(sd, path, "sum_squared_error");
  int old_shape = sse && sse->rank == 0 && (!cls || !strcmp(cls, "MeanSquaredError"));
  return old_name || old_shape ? 1 : KS_METRIC_SCHEMA_VERSION;
}

static json_t *metric_entry(const json_t *m, const char *path, const ks_statedict *sd) {
  const char *cls = class_of(m);
  const json_t *count = json_object_get(m, "update_count");
  json_int_t updates = json_is_integer(count) && json_integer_value(count) >= 0 ? json_integer_value(count) : 1;
  json_t *e = json_pack("{s:i, s:I}", "schema_version", schema_version_of(sd, path, cls), "update_count", updates);
  if (!e || !cls) return e;
  json_t *args = json_is_string(json_object_get(m, "class")) ? rebuild_args(cls, json_object_get(m, "attrs")) : NULL;
  if (json_object_set_new(e, "class", json_string(cls)) || (args && json_object_set_new(e, "args", args))) {
    json_decref(e);
    return NULL;
  }
  return e;
}

ks_status ks_convert_metrics_meta(const char *composer_json, const ks_statedict *sd, char **out, ks_error *err) {
  json_t *doc = json_loads(composer_json, JSON_REJECT_DUPLICATES, NULL);
  json_t *list = json_object_get(doc, "metrics");
  if (!json_is_array(list)) {
    json_decref(doc);
    return fail(err, KS_E_FORMAT, "Composer metric description is not {\"metrics\": [...]}");
  }
  json_t *meta = json_object();
  size_t i;
  json_t *m;
  ks_status st = meta ? KS_OK : KS_E_NOMEM;
  json_array_foreach(list, i, m) {
    const char *path = json_string_value(json_object_get(m, "path"));
    if (st || !path) continue;
    json_t *e = metric_entry(m, path, sd);
    if (!e || json_object_set_new(meta, path, e)) st = KS_E_NOMEM;
  }
  *out = st ? NULL : json_dumps(meta, JSON_COMPACT | JSON_SORT_KEYS);
  json_decref(meta);
  json_decref(doc);
  if (!st && !*out) st = KS_E_NOMEM;
  return st ? fail(err, st, "out of memory describing the metrics") : KS_OK;
}
