/*
 * Metrics through the C library: the keepsake.metrics entry the library derives
 * for a metric (class, canonical args, schema version), and computing the
 * catalogue metrics a checkpoint records with ks_state_load, so the C side of
 * a file written from Python (or the other way round) can be checked.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "ksext.h"

static int in_catalogue(const char *name) {
  for (size_t i = 0; i < ks_metric_class_count(); i++)
    if (!strcmp(ks_metric_class_name(i), name)) return 1;
  return 0;
}

/* One metric's keepsake.metrics entry: class, update count, schema version; args for catalogue metrics. */
static json_t *metric_entry(const json_t *d, const char *path, const ks_statedict *sd, ks_error *err) {
  const char *global = json_string_value(json_object_get(d, "class"));
  const char *dot = global ? strrchr(global, '.') : NULL;
  const char *cls = dot ? dot + 1 : global;
  int known = cls && in_catalogue(cls);
  const json_t *count = json_object_get(d, "update_count");
  json_int_t n = json_is_integer(count) && json_integer_value(count) >= 0 ? json_integer_value(count) : 1;
  char prefix[KS_MAX_NAME + 32];
  snprintf(prefix, sizeof prefix, "%s/" KS_KEY_METRIC_STATES, path);
  int schema = ks_metric_stored_schema_version(known ? cls : NULL, sd, prefix);
  json_t *e = json_pack("{s:i, s:I}", "schema_version", schema, "update_count", n);
  if (e && cls && json_object_set_new(e, "class", json_string(cls))) e = (json_decref(e), NULL);
  json_t *lists = json_object_get(d, "lists"); /* list states: a .pt export writes them as lists */
  if (e && json_is_array(lists) && json_object_set(e, "lists", lists)) e = (json_decref(e), NULL);
  json_t *attrs = json_object_get(d, "attrs");
  if (!e || !known || !json_is_object(attrs)) return e;
  char *a = json_dumps(attrs, JSON_COMPACT);
  ks_metric *m = NULL;
  ks_status st = a ? ks_metric_from_attributes(cls, a, NULL, NULL, &m, err) : KS_E_NOMEM;
  free(a);
  json_t *args = m ? json_loads(ks_metric_args_json(m), JSON_REJECT_DUPLICATES, NULL) : NULL;
  ks_metric_free(m);
  if (st == KS_E_NOMEM || (args && json_object_set_new(e, "args", args))) e = (json_decref(e), NULL);
  return e;
}

ks_status ksp_metrics_meta(const char *desc, const ks_statedict *sd, char **out, ks_error *err) {
  json_t *doc = json_loads(desc, JSON_REJECT_DUPLICATES, NULL);
  json_t *list = json_object_get(doc, "metrics");
  json_t *meta = json_object();
  ks_status st = !json_is_array(list) ? KS_E_INVALID : meta ? KS_OK : KS_E_NOMEM;
  size_t i;
  json_t *d;
  json_array_foreach(list, i, d) {
    const char *path = json_string_value(json_object_get(d, "path"));
    json_t *e = st || !path ? NULL : metric_entry(d, path, sd, err);
    if (!st && path && (!e || json_object_set_new(meta, path, e))) st = KS_E_NOMEM;
  }
  *out = st ? NULL : json_dumps(meta, JSON_COMPACT | JSON_SORT_KEYS);
  if (!st && !*out) st = KS_E_NOMEM;
  json_decref(meta);
  json_decref(doc);
  if (st && err && !err->code) {
    err->code = st;
    snprintf(err->message, sizeof err->message, "%s", st == KS_E_INVALID ? "metric description is not "
             "{\"metrics\": [...]}" : "out of memory describing the metrics");
  }
  return st;
}

PyObject *ksp_metric_info(PyObject *self, PyObject *args) {
  (void)self;
  const char *desc;
  if (!PyArg_ParseTuple(args, "s", &desc)) return NULL;
  ks_statedict *sd = NULL;
  char *json = NULL;
  ks_error err;
  ks_error_clear(&err);
  ks_status st = ks_statedict_create(NULL, &sd, NULL);
  if (!st) st = ksp_metrics_meta(desc, sd, &json, &err);
  ks_statedict_free(sd);
  PyObject *out = st ? ksp_raise(st, &err) : PyUnicode_FromString(json);
  free(json);
  return out;
}

PyObject *ksp_catalogue(PyObject *self, PyObject *unused) {
  (void)self;
  (void)unused;
  size_t n = ks_metric_class_count();
  PyObject *list = PyList_New((Py_ssize_t)n);
  for (size_t i = 0; list && i < n; i++) {
    PyObject *s = PyUnicode_FromString(ks_metric_class_name(i));
    if (!s) Py_CLEAR(list);
    else PyList_SET_ITEM(list, (Py_ssize_t)i, s);
  }
  return list;
}

/* The metrics of one label (NULL: train) that keepsake.metrics gives a catalogue class and args for. */
typedef struct factory_ctx {
  json_t *metrics; /* keepsake.metrics */
  uint64_t budget; /* bytes the metrics' states may still allocate: the arguments come from the file */
} factory_ctx;

/* "state/train_metrics/<Name>" -> label NULL; "state/eval_metrics/<label>/<Name>" -> label. */
static const char *split_path(const char *path, char *label, size_t cap) {
  const char *name = NULL;
  if (!strncmp(path, "state/train_metrics/", 20)) {
    label[0] = 0;
    name = path + 20;
  } else if (!strncmp(path, "state/eval_metrics/", 19)) {
    const char *slash = strchr(path + 19, '/');
    size_t n = slash ? (size_t)(slash - (path + 19)) : 0;
    if (!slash || !n || n + 1 > cap) return NULL; /* "state/eval_metrics//M" is no train metric */
    memcpy(label, path + 19, n);
    label[n] = 0;
    name = slash + 1;
  }
  return name && *name && !strchr(name, '/') ? name : NULL;
}

static KS_NODISCARD ks_status build_collection(void *ctx, const char *label, const ks_allocator *alloc,
                                  ks_metric_collection **out, ks_error *err) {
  factory_ctx *f = ctx;
  *out = NULL; /* so the failure path below frees nothing it did not build, whatever create leaves */
  ks_status st = ks_metric_collection_create(alloc, out, err);
  const char *path;
  json_t *m;
  json_object_foreach(f->metrics, path, m) {
    char lab[KS_MAX_NAME + 1];
    const char *name = split_path(path, lab, sizeof lab);
    const char *cls = json_string_value(json_object_get(m, "class"));
    json_t *args = json_object_get(m, "args");
    if (st || !name || !cls || !json_is_object(args) || strcmp(lab, label ? label : "")) continue;
    char *a = json_dumps(args, JSON_COMPACT);
    ks_metric *metric = NULL;
    /* Bounded: a record asking for num_classes = 10^6 must fail with KS_E_LIMIT, not allocate
     * terabytes (as ks_convert builds the same records). */
    st = a ? ks_metric_create_bounded(cls, a, alloc, &f->budget, &metric, err) : KS_E_NOMEM;
    free(a);
    if (!st) st = ks_metric_collection_add(*out, name, metric, err);
    if (st) ks_metric_free(metric); /* the collection takes the metric on success only (metric.h) */
  }
  if (st) {
    ks_metric_collection_free(*out); /* ours to free on failure (state.h); the library ignores *out */
    *out = NULL;
  }
  return st;
}

/* The eval labels keepsake.metrics names, as a NULL-free array of borrowed strings. */
static size_t eval_labels(json_t *metrics, json_t *labels) {
  const char *path;
  json_t *m;
  json_object_foreach(metrics, path, m) {
    char lab[KS_MAX_NAME + 1];
    if (split_path(path, lab, sizeof lab) && lab[0] && !json_object_get(labels, lab))
      json_object_set_new(labels, lab, json_true());
  }
  return json_object_size(labels);
}

/* Keys and messages quote the file's bytes, which need not be UTF-8: decode them leniently. */
static PyObject *lenient(const char *s) {
  return PyUnicode_DecodeUTF8(s, (Py_ssize_t)strlen(s), "surrogateescape");
}

static PyObject *metric_result(ks_metric *m) {
  const ks_tensor *v = NULL;
  ks_error err;
  ks_error_clear(&err);
  ks_status st = ks_metric_compute(m, &v, &err);
  PyObject *value = st ? Py_None : ksp_tensor_copy(v);
  if (st) Py_INCREF(value);
  if (!value) return NULL;
  PyObject *msg = lenient(st ? err.message : "");
  if (!msg) {
    Py_DECREF(value);
    return NULL;
  }
  return Py_BuildValue("{s:s,s:N,s:L,s:N}", "class", ks_metric_class(m), "value", value, "update_count",
                       (long long)ks_metric_update_count(m), "error", msg);
}

static int add_collection(PyObject *out, ks_metric_collection *c, const char *root) {
  for (size_t i = 0; c && i < ks_metric_collection_count(c); i++) {
    const char *name;
    ks_metric *m = ks_metric_collection_at(c, i, &name);
    PyObject *r = metric_result(m);
    PyObject *leaf = r ? lenient(name) : NULL;
    PyObject *key = leaf ? PyUnicode_FromFormat("%s%U", root, leaf) : NULL;
    Py_XDECREF(leaf);
    int bad = !key || PyDict_SetItem(out, key, r);
    Py_XDECREF(r);
    Py_XDECREF(key);
    if (bad) return -1;
  }
  return 0;
}

static PyObject *report_list(const ks_load_report *rep) {
  PyObject *list = PyList_New(0);
  ks_load_item it;
  for (size_t i = 0; list && ks_load_report_at(rep, i, &it) == KS_OK; i++) {
    PyObject *p = lenient(it.path), *why = p ? lenient(it.reason ? it.reason : "") : NULL;
    PyObject *t = why ? Py_BuildValue("(sNN)", ks_load_kind_name(it.kind), p, why) : NULL;
    if (!why) Py_XDECREF(p);
    if (!t || PyList_Append(list, t)) Py_CLEAR(list);
    Py_XDECREF(t);
  }
  return list;
}

typedef struct job {
  const char *path;
  ks_statedict *sd; /* the file, read once into memory (never mapped) */
  ks_meta *meta;
  json_t *metrics, *labels;
  const char **label_list;
  size_t n_labels;
  ks_state *st;
  ks_load_report *rep;
} job;

/* What the metrics built from the file's records may allocate: twice the tensor bytes the file
 * holds (their states come from there) plus 64 MiB, as ks_convert bounds the same records. */
static uint64_t metric_budget(const ks_statedict *sd) {
  uint64_t total = 0;
  ks_entry e;
  for (size_t i = 0; ks_statedict_at(sd, i, &e) == KS_OK; i++)
    if (e.kind == KS_VAL_TENSOR) total += e.tensor.nbytes < UINT64_MAX - total ? e.tensor.nbytes : UINT64_MAX - total;
  uint64_t slack = (uint64_t)64 << 20;
  return total > (UINT64_MAX - slack) / 2 ? UINT64_MAX : 2 * total + slack;
}

static KS_NODISCARD ks_status fail(ks_error *err, ks_status st, const char *key, const char *msg) {
  ks_error_clear(err);
  err->code = st;
  snprintf(err->key, sizeof err->key, "%s", key);
  snprintf(err->message, sizeof err->message, "%s", msg);
  return st;
}

static KS_NODISCARD ks_status run_job(job *j, ks_error *err) {
  /* One copying read: no mapping (a file truncated meanwhile gives an error, not SIGBUS), and
   * the records and the states come from the same bytes (no second open between them). */
  ks_read_opts ro = {.mode = KS_READ_COPY};
  ks_status s = ks_load(j->path, &ro, &j->sd, &j->meta, err);
  const char *txt = s ? NULL : ks_meta_get(j->meta, KS_META_METRICS);
  if (!s) j->metrics = txt ? json_loads(txt, JSON_REJECT_DUPLICATES, NULL) : json_object();
  if (!s && !json_is_object(j->metrics))
    s = fail(err, KS_E_FORMAT, KS_META_METRICS, "metadata 'keepsake.metrics' is not a JSON object");
  j->labels = s ? NULL : json_object();
  if (!s && !j->labels) s = KS_E_NOMEM;
  if (!s) j->n_labels = eval_labels(j->metrics, j->labels);
  j->label_list = s ? NULL : calloc(j->n_labels + 1, sizeof *j->label_list);
  if (!s && !j->label_list) s = KS_E_NOMEM;
  const char *lab;
  json_t *v;
  size_t k = 0;
  if (!s) json_object_foreach(j->labels, lab, v) if (k < j->n_labels) j->label_list[k++] = lab;
  if (!s) s = ks_state_create("", 0, NULL, &j->st, err);
  if (!s) s = ks_load_report_create(NULL, &j->rep, err);
  factory_ctx f = {j->metrics, s ? 0 : metric_budget(j->sd)};
  if (!s) s = ks_state_build_metrics(j->st, build_collection, &f, j->label_list, j->n_labels, err);
  ks_load_opts o = {.non_strict_model = 1};
  if (!s) s = ks_state_load_state_dict(j->st, j->sd, j->meta, &o, j->rep, err);
  return s;
}

PyObject *ksp_compute_metrics(PyObject *self, PyObject *args, PyObject *kw) {
  (void)self;
  static char *names[] = {"path", NULL};
  PyObject *path;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O&", names, PyUnicode_FSConverter, &path)) return NULL;
  job j = {PyBytes_AS_STRING(path), NULL, NULL, NULL, NULL, NULL, 0, NULL, NULL};
  ks_error err;
  ks_error_clear(&err);
  ks_status s;
  Py_BEGIN_ALLOW_THREADS s = run_job(&j, &err);
  Py_END_ALLOW_THREADS
  PyObject *out = NULL;
  if (s) {
    ksp_error_path(&err, j.path);
    ksp_raise(s, &err);
  } else {
    PyObject *metrics = PyDict_New();
    int bad = !metrics || add_collection(metrics, ks_state_train_metrics(j.st), "state/train_metrics/");
    for (size_t i = 0; !bad && i < j.n_labels; i++) {
      char root[KS_MAX_NAME + 32];
      snprintf(root, sizeof root, "state/eval_metrics/%s/", j.label_list[i]);
      bad = add_collection(metrics, ks_state_eval_metrics(j.st, j.label_list[i]), root);
    }
    PyObject *rep = bad ? NULL : report_list(j.rep);
    if (rep) out = Py_BuildValue("{s:O,s:O}", "metrics", metrics, "report", rep);
    Py_XDECREF(metrics);
    Py_XDECREF(rep);
  }
  ks_load_report_free(j.rep);
  ks_state_free(j.st);
  free(j.label_list);
  json_decref(j.labels);
  json_decref(j.metrics);
  ks_statedict_free(j.sd);
  ks_meta_free(j.meta);
  Py_DECREF(path);
  return out;
}
