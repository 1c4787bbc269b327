/*
 * torch.save / Composer import: the flat dict from the torch module, the
 * metric layout from the Composer mapping (composer.c), and the "keepsake.metrics"
 * metadata the state loader needs, from what the metrics module knows about
 * older torchmetrics states. Uses torch, metrics and format (for ks_meta);
 * none of them knows this module. One byte budget, from the input's size,
 * bounds what untrusted metric data can make it allocate: list states joined
 * (their items may all view one shared storage) and metrics rebuilt from
 * pickled attributes (num_classes sizes a confusion matrix).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "core/io_ops.h"
#include "core/json.h"
#include "import/import_internal.h"
#include "keepsake/binding.h"
#include "keepsake/import.h"
#include "keepsake/layout.h"
#include "keepsake/metric.h"

#define DEFAULT_METRIC_SLACK ((uint64_t)64 << 20)

static KS_NODISCARD ks_status nomem(ks_error *err) {
  return ks__err(err, KS_E_NOMEM, "import: out of memory describing the metrics");
}

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
static const char *class_of(const ks__jv *m) {
  const char *global = ks__jv_string(ks__jv_get(m, "class"));
  if (global) {
    const char *dot = strrchr(global, '.');
    return dot ? dot + 1 : global;
  }
  const char *name = ks__jv_string(ks__jv_get(m, "name"));
  return name && in_catalogue(name) ? name : NULL;
}

typedef struct describe_ctx {
  const ks_statedict *sd;
  const ks_allocator *alloc;
  uint64_t budget; /* bytes left for rebuilding metrics from attributes */
  ks_error *err;
} describe_ctx;

/* The canonical arguments rebuilt from a pickled object's attributes; *args NULL when they cannot be. */
static KS_NODISCARD ks_status rebuilt_args(describe_ctx *c, const char *cls, const ks__jv *m, const char *path,
                                           ks__jv **args) {
  const ks__jv *a = ks__jv_get(m, "attrs");
  *args = NULL;
  if (!a) return KS_OK; /* nothing to rebuild from: the arguments are left out */
  char *attrs = ks__jv_dump(c->alloc, a, true);
  if (!attrs) return nomem(c->err);
  ks_metric *metric = NULL;
  ks_status st = ks_metric_from_attributes(cls, attrs, c->alloc, &c->budget, &metric, c->err);
  ks__free(c->alloc, attrs);
  if (st) {
    ks__err_set_key(c->err, path);
    return st;
  }
  if (metric) {
    const char *txt = ks_metric_args_json(metric);
    st = ks__jv_parse(c->alloc, txt, strlen(txt), "metric arguments", args, c->err);
  }
  ks_metric_free(metric);
  return st;
}

static KS_NODISCARD ks_status metric_entry(describe_ctx *c, const ks__jv *m, const char *path, ks__jv **out) {
  const char *cls = class_of(m);
  int64_t updates = 1;
  if (!ks__jv_is_int(ks__jv_get(m, "update_count"), &updates) || updates < 0) updates = 1;
  char prefix[KS_MAX_NAME + 1];
  int n = snprintf(prefix, sizeof prefix, "%s/%s", path, KS_KEY_METRIC_STATES);
  if (n < 0 || (size_t)n >= sizeof prefix)
    return ks__err_at(c->err, KS_E_LIMIT, NULL, path, -1, "metric name too long");
  int version = ks_metric_stored_schema_version(cls, c->sd, prefix);
  ks__jv *args = NULL;
  const ks_allocator *a = c->alloc;
  ks_status st = cls && ks__jv_is(ks__jv_get(m, "class"), KS__JV_STRING) ? rebuilt_args(c, cls, m, path, &args) : KS_OK;
  if (st) return st;
  ks__jv *e = ks__jv_object(a);
  st = e ? KS_OK : KS_E_NOMEM;
  if (!st) st = ks__jv_set(a, e, "schema_version", ks__jv_int(a, version));
  if (!st) st = ks__jv_set(a, e, "update_count", ks__jv_int(a, updates));
  if (!st && cls) st = ks__jv_set(a, e, "class", ks__jv_str(a, cls));
  if (!st && args) st = ks__jv_set(a, e, "args", args), args = NULL;
  const ks__jv *lists = ks__jv_get(m, "lists"); /* the states that were lists, for a .pt export */
  if (!st && lists) st = ks__jv_set(a, e, "lists", ks__jv_copy(a, lists));
  ks__jv_free(a, args);
  if (st) ks__jv_free(a, e), e = NULL;
  *out = e;
  return e ? KS_OK : nomem(c->err);
}

/* KS_META_METRICS ({path: {class, args, schema_version, update_count}}) from normalize's description. */
static KS_NODISCARD ks_status metrics_meta(describe_ctx *c, const char *composer_json, char **out) {
  const ks_allocator *a = c->alloc;
  ks__jv *doc = NULL, *meta = ks__jv_object(a);
  ks_status st = ks__jv_parse(a, composer_json, strlen(composer_json), KS_META_COMPOSER_METRICS, &doc, c->err);
  if (!st && !meta) st = nomem(c->err);
  const ks__jv *list = ks__jv_get(doc, "metrics");
  for (size_t i = 0; !st && ks__jv_is(list, KS__JV_ARRAY) && i < list->len; i++) {
    const ks__jv *m = list->items[i];
    const char *path = ks__jv_string(ks__jv_get(m, "path"));
    ks__jv *e = NULL;
    if (path && !(st = metric_entry(c, m, path, &e)) && ks__jv_set(a, meta, path, e)) st = nomem(c->err);
  }
  *out = st ? NULL : ks__jv_dump(a, meta, true);
  ks__jv_free(a, meta);
  ks__jv_free(a, doc);
  return !st && !*out ? nomem(c->err) : st;
}

static KS_NODISCARD ks_status set_meta(ks_meta *meta, const char *key, const char *value, ks_error *err) {
  ks_status st = ks_meta_set(meta, key, value, err);
  return st ? ks__err_at(err, st, NULL, key, -1, "import: cannot set metadata") : KS_OK;
}

static void release_dict(void *sd) { ks_statedict_free(sd); }

/* Maps the metrics of raw (which *sd then owns) and describes them in meta. */
static KS_NODISCARD ks_status import_metrics(ks_statedict *raw, uint64_t budget, ks_statedict **sd, ks_meta *meta,
                                             ks_error *err) {
  char *json = NULL, *metrics = NULL;
  ks_status st = ks__composer_normalize(raw, KS_BORROW, &budget, sd, &json, err);
  if (st) {
    ks_statedict_free(raw);
    return st;
  }
  if (ks__statedict_attach(*sd, raw, release_dict, err)) {
    ks_statedict_free(raw);
    st = nomem(err);
  }
  describe_ctx c = {*sd, ks__statedict_allocator(*sd), budget, err};
  if (!st) st = set_meta(meta, KS_META_COMPOSER_METRICS, json, err);
  if (!st) st = metrics_meta(&c, json, &metrics);
  if (!st) st = set_meta(meta, KS_META_METRICS, metrics, err);
  ks__free(c.alloc, metrics);
  ks_torch_free(ks__statedict_allocator(*sd), json);
  if (st) {
    ks_statedict_free(*sd);
    *sd = NULL;
  }
  return st;
}

/* KS_TORCH_STRUCTURE_META: the container kinds of the file, without the metric subtrees when
   the Composer mapping rewrote them (their records would describe no entry). */
static int metric_path(void *ctx, const char *path) {
  (void)ctx;
  return !strncmp(path, KS_KEY_TRAIN_METRICS, strlen(KS_KEY_TRAIN_METRICS)) ||
         !strncmp(path, KS_KEY_EVAL_METRICS, strlen(KS_KEY_EVAL_METRICS));
}

static KS_NODISCARD ks_status structure_meta(ks_meta *meta, const ks_allocator *a, const char *structure,
                                             int normalized, ks_error *err) {
  if (!structure) return KS_OK;
  if (!normalized) return set_meta(meta, KS_TORCH_STRUCTURE_META, structure, err);
  ks__jv *doc = NULL;
  ks_status st = ks__jv_parse(a, structure, strlen(structure), KS_TORCH_STRUCTURE_META, &doc, err);
  if (st) return st;
  ks__jv *trimmed = ks__jv_copy_pruned(a, doc, "containers", metric_path, NULL);
  char *text = trimmed ? ks__jv_dump(a, trimmed, false) : NULL;
  ks__jv_free(a, trimmed);
  ks__jv_free(a, doc);
  st = text ? set_meta(meta, KS_TORCH_STRUCTURE_META, text, err) : nomem(err);
  ks__free(a, text);
  return st;
}

/* Takes raw (freed on failure). */
static KS_NODISCARD ks_status finish(ks_statedict *raw, const char *structure, uint64_t input_bytes,
                                     const ks_import_opts *opts, ks_statedict **out, ks_meta **meta, ks_error *err) {
  ks_meta *m = NULL;
  if (ks_meta_create(ks__statedict_allocator(raw), &m, err)) {
    ks_statedict_free(raw);
    return nomem(err);
  }
  int normalized = has_metrics(raw);
  ks_status sst = structure_meta(m, ks__statedict_allocator(raw), structure, normalized, err);
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

/* The size of the file behind path (links followed) through the table it was read with; 0 if unknown. */
static uint64_t file_size(const ks_io *table, const char *path) {
  const ks_io *io = ks__io_v2(table);
  int fd;
  uint64_t size = 0;
  if (io->open_fn(io->ctx, path, &fd, &size)) return 0;
  io->close_fn(io->ctx, fd);
  return size;
}

ks_status ks_torch_import(const char *path, const ks_import_opts *opts, ks_statedict **out, ks_meta **meta,
                          ks_error *err) {
  if (!out) return ks__err(err, KS_E_INVALID, "ks_torch_import: NULL argument");
  const ks_torch_read_opts *ro = opts ? opts->read : NULL;
  KS__TAKE_OPTS(ks_torch_read_opts, ro, KS__V1_SIZE(ks_torch_read_opts, max_entries), err);
  ks_statedict *raw = NULL;
  char *structure = NULL;
  ks_status st = ks_torch_load(path, ro, &raw, &structure, err);
  if (st) return st;
  uint64_t bytes = path ? file_size(ro->io, path) : ro->data_len;
  st = finish(raw, structure, bytes, opts, out, meta, err);
  ks_torch_free(ro->alloc, structure);
  if (st && path) ks__err_set_file(err, path);
  return st;
}
