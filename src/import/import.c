/*
 * torch.save / Composer import: the flat dict from the torch module, the
 * metric layout from ks_composer_normalize, and the "keepsake.metrics"
 * metadata the state loader needs, from what the metrics module knows about
 * older torchmetrics states. Uses torch, metrics and format (for ks_meta);
 * none of them knows this module. One byte budget, from the input's size,
 * bounds what untrusted metric data can make it allocate: list states joined
 * (their items may all view one shared storage) and metrics rebuilt from
 * pickled attributes (num_classes sizes a confusion matrix).
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/internal.h"
#include "keepsake/import.h"
#include "keepsake/layout.h"
#include "keepsake/metric.h"

#define DEFAULT_METRIC_SLACK ((uint64_t)64 << 20)

static ks_status nomem(ks_error *err) { return ks__err(err, KS_E_NOMEM, "import: out of memory describing the metrics"); }

static int has_metrics(const ks_statedict *sd) {
  ks_entry e;
  for (size_t i = 0; ks_statedict_at(sd, i, &e) == KS_OK; i++)
    if (!strncmp(e.name, KS_KEY_TRAIN_METRICS, strlen(KS_KEY_TRAIN_METRICS)) ||
        !strncmp(e.name, KS_KEY_EVAL_METRICS, strlen(KS_KEY_EVAL_METRICS)))
      return 1;
  return 0;
}

static int in_catalogue(const char *name) {
  for (size_t i = 0; i < ks_metric_class_count(); i++)
    if (!strcmp(ks_metric_class_name(i), name)) return 1;
  return 0;
}

/*
 * Catalogue class: the last part of a pickled object's class
 * ("torchmetrics.classification.accuracy.MulticlassAccuracy"), or the metric's
 * name when that is a catalogue class (Composer names metrics by class).
 */
static const char *class_of(const json_t *m) {
  const char *global = json_string_value(json_object_get(m, "class"));
  if (global) {
    const char *dot = strrchr(global, '.');
    return dot ? dot + 1 : global;
  }
  const char *name = json_string_value(json_object_get(m, "name"));
  return name && in_catalogue(name) ? name : NULL;
}

typedef struct describe_ctx {
  const ks_statedict *sd;
  const ks_allocator *alloc;
  uint64_t budget; /* bytes left for rebuilding metrics from attributes */
  ks_error *err;
} describe_ctx;

/* The canonical arguments rebuilt from a pickled object's attributes; *args NULL when they cannot be. */
static ks_status rebuilt_args(describe_ctx *c, const char *cls, const json_t *m, const char *path, json_t **args) {
  char *attrs = json_dumps(json_object_get(m, "attrs"), JSON_COMPACT | JSON_SORT_KEYS);
  if (!attrs) return nomem(c->err);
  ks_metric *metric = NULL;
  ks_status st = ks_metric_from_attributes(cls, attrs, c->alloc, &c->budget, &metric, c->err);
  free(attrs);
  if (st) {
    ks__err_set_key(c->err, path);
    return st;
  }
  *args = metric ? json_loads(ks_metric_args_json(metric), JSON_REJECT_DUPLICATES, NULL) : NULL;
  ks_metric_free(metric);
  return metric && !*args ? nomem(c->err) : KS_OK;
}

static ks_status metric_entry(describe_ctx *c, const json_t *m, const char *path, json_t **out) {
  const char *cls = class_of(m);
  const json_t *count = json_object_get(m, "update_count");
  json_int_t updates = json_is_integer(count) && json_integer_value(count) >= 0 ? json_integer_value(count) : 1;
  char prefix[KS_MAX_NAME + 1];
  int n = snprintf(prefix, sizeof prefix, "%s/%s", path, KS_KEY_METRIC_STATES);
  if (n < 0 || (size_t)n >= sizeof prefix) return ks__err_at(c->err, KS_E_LIMIT, NULL, path, -1, "metric name too long");
  int version = ks_metric_stored_schema_version(cls, c->sd, prefix);
  json_t *args = NULL;
  ks_status st = cls && json_is_string(json_object_get(m, "class")) ? rebuilt_args(c, cls, m, path, &args) : KS_OK;
  if (st) return st;
  json_t *e = json_pack("{s:i, s:I}", "schema_version", version, "update_count", updates);
  if (!e || (cls && json_object_set_new(e, "class", json_string(cls))) || (args && json_object_set(e, "args", args))) {
    json_decref(e);
    e = NULL;
  }
  json_decref(args);
  *out = e;
  return e ? KS_OK : nomem(c->err);
}

/* KS_META_METRICS ({path: {class, args, schema_version, update_count}}) from normalize's description. */
static ks_status metrics_meta(describe_ctx *c, const char *composer_json, char **out) {
  json_t *doc = json_loads(composer_json, JSON_REJECT_DUPLICATES, NULL);
  json_t *list = json_object_get(doc, "metrics"), *meta = json_object();
  size_t i;
  json_t *m;
  ks_status st = !doc || !meta ? nomem(c->err) : KS_OK;
  json_array_foreach(list, i, m) {
    const char *path = json_string_value(json_object_get(m, "path"));
    json_t *e = NULL;
    if (!st && path && !(st = metric_entry(c, m, path, &e)) && json_object_set_new(meta, path, e)) st = nomem(c->err);
  }
  *out = st ? NULL : json_dumps(meta, JSON_COMPACT | JSON_SORT_KEYS);
  json_decref(meta);
  json_decref(doc);
  return !st && !*out ? nomem(c->err) : st;
}

static ks_status set_meta(ks_meta *meta, const char *key, const char *value, ks_error *err) {
  ks_status st = ks_meta_set(meta, key, value);
  return st ? ks__err_at(err, st, NULL, key, -1, "import: cannot set metadata") : KS_OK;
}

static void release_dict(void *sd) { ks_statedict_free(sd); }

/* Maps the metrics of raw (which *sd then owns) and describes them in meta. */
static ks_status import_metrics(ks_statedict *raw, uint64_t budget, ks_statedict **sd, ks_meta *meta, ks_error *err) {
  char *json = NULL, *metrics = NULL;
  ks_status st = ks_composer_normalize_bounded(raw, KS_BORROW, &budget, sd, &json, err);
  if (st) {
    ks_statedict_free(raw);
    return st;
  }
  if (ks_statedict_attach(*sd, raw, release_dict)) {
    ks_statedict_free(raw);
    st = nomem(err);
  }
  describe_ctx c = {*sd, ks_statedict_allocator(*sd), budget, err};
  if (!st) st = set_meta(meta, KS_META_COMPOSER_METRICS, json, err);
  if (!st) st = metrics_meta(&c, json, &metrics);
  if (!st) st = set_meta(meta, KS_META_METRICS, metrics, err);
  free(metrics);
  ks_torch_free(ks_statedict_allocator(*sd), json);
  if (st) {
    ks_statedict_free(*sd);
    *sd = NULL;
  }
  return st;
}

/* KS_TORCH_STRUCTURE_META: the container kinds of the file, without the metric subtrees when
   ks_composer_normalize rewrote them (their records would describe no entry). */
static ks_status structure_meta(ks_meta *meta, const char *structure, int normalized, ks_error *err) {
  if (!structure) return KS_OK;
  if (!normalized) return set_meta(meta, KS_TORCH_STRUCTURE_META, structure, err);
  json_t *doc = json_loads(structure, JSON_REJECT_DUPLICATES, NULL);
  json_t *containers = json_object_get(doc, "containers"), *v, *tmp;
  const char *path;
  json_object_foreach_safe(containers, tmp, path, v) {
    if (!strncmp(path, KS_KEY_TRAIN_METRICS, strlen(KS_KEY_TRAIN_METRICS)) ||
        !strncmp(path, KS_KEY_EVAL_METRICS, strlen(KS_KEY_EVAL_METRICS)))
      json_object_del(containers, path);
  }
  char *text = doc ? json_dumps(doc, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
  json_decref(doc);
  ks_status st = text ? set_meta(meta, KS_TORCH_STRUCTURE_META, text, err) : nomem(err);
  free(text);
  return st;
}

/* Takes raw (freed on failure). */
static ks_status finish(ks_statedict *raw, const char *structure, uint64_t input_bytes, const ks_import_opts *opts,
                        ks_statedict **out, ks_meta **meta, ks_error *err) {
  ks_meta *m = NULL;
  if (ks_meta_create(ks_statedict_allocator(raw), &m)) {
    ks_statedict_free(raw);
    return nomem(err);
  }
  int normalized = has_metrics(raw);
  ks_status sst = structure_meta(m, structure, normalized, err);
  if (sst) {
    ks_meta_free(m);
    ks_statedict_free(raw);
    return sst;
  }
  uint64_t budget = opts && opts->max_metric_bytes ? opts->max_metric_bytes
                                                   : (input_bytes > (UINT64_MAX - DEFAULT_METRIC_SLACK) / 2
                                                          ? UINT64_MAX
                                                          : 2 * input_bytes + DEFAULT_METRIC_SLACK);
  ks_statedict *sd = raw;
  ks_status st = normalized ? import_metrics(raw, budget, &sd, m, err) : KS_OK;
  if (st || !meta) ks_meta_free(m);
  if (st) return st;
  *out = sd;
  if (meta) *meta = m;
  return KS_OK;
}

ks_status ks_torch_import(const char *path, const ks_import_opts *opts, ks_statedict **out, ks_meta **meta,
                          ks_error *err) {
  if (!path || !out) return ks__err(err, KS_E_INVALID, "ks_torch_import: NULL argument");
  ks_statedict *raw = NULL;
  char *structure = NULL;
  const ks_torch_read_opts *ro = opts ? opts->read : NULL;
  ks_status st = ks_torch_load_with_structure(path, ro, &raw, &structure, err);
  if (st) return st;
  struct stat sb;
  uint64_t bytes = stat(path, &sb) == 0 && sb.st_size > 0 ? (uint64_t)sb.st_size : 0;
  st = finish(raw, structure, bytes, opts, out, meta, err);
  ks_torch_free(ro ? ro->alloc : NULL, structure);
  if (st) ks__err_set_file(err, path);
  return st;
}

ks_status ks_torch_import_buffer(const void *buf, size_t len, const ks_import_opts *opts, ks_statedict **out,
                                 ks_meta **meta, ks_error *err) {
  if (!buf || !out) return ks__err(err, KS_E_INVALID, "ks_torch_import_buffer: NULL argument");
  ks_statedict *raw = NULL;
  char *structure = NULL;
  const ks_torch_read_opts *ro = opts ? opts->read : NULL;
  ks_status st = ks_torch_load_buffer_with_structure(buf, len, ro, &raw, &structure, err);
  if (!st) st = finish(raw, structure, len, opts, out, meta, err);
  ks_torch_free(ro ? ro->alloc : NULL, structure);
  return st;
}
