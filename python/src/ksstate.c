/*
 * Metrics through the C library: the keepsake.metrics entry the library derives
 * for a metric (class, canonical args, schema version), and computing the
 * catalogue metrics a checkpoint records with ks_state_load, so the C side of
 * a file written from Python (or the other way round) can be checked.
 */
#include <stdlib.h>
#include <string.h>

#include "ksext.h"

ks_status ksp_metrics_meta(const char *desc, const ks_statedict *sd, char **out, ks_error *err) {
  return ks_metric_records_json(desc, sd, NULL, out, err);
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

static KS_NODISCARD ks_status run_job(job *j, ks_error *err) {
  /* One copying read: no mapping (a file truncated meanwhile gives an error, not SIGBUS), and
   * the records and the states come from the same bytes (no second open between them). */
  ks_read_opts ro = {.mode = KS_READ_COPY};
  ks_status s = ks_load(j->path, &ro, &j->sd, &j->meta, err);
  if (!s) s = ks_state_create("", 0, NULL, &j->st, err);
  if (!s) s = ks_load_report_create(NULL, &j->rep, err);
  if (!s) s = ks_state_build_recorded_metrics(j->st, j->meta, metric_budget(j->sd), err);
  ks_load_opts o = {.non_strict_model = 1};
  if (!s) s = ks_state_load_state_dict(j->st, j->sd, j->meta, &o, j->rep, err);
  return s;
}

PyObject *ksp_compute_metrics(PyObject *self, PyObject *args, PyObject *kw) {
  (void)self;
  static char *names[] = {"path", NULL};
  PyObject *path;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O&", names, PyUnicode_FSConverter, &path)) return NULL;
  job j = {PyBytes_AS_STRING(path), NULL, NULL, NULL, NULL};
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
    for (size_t i = 0; !bad && i < ks_state_eval_count(j.st); i++) {
      const char *label = ks_state_eval_label(j.st, i);
      char root[KS_MAX_NAME + 32];
      snprintf(root, sizeof root, "state/eval_metrics/%s/", label);
      bad = add_collection(metrics, ks_state_eval_metrics(j.st, label), root);
    }
    PyObject *rep = bad ? NULL : report_list(j.rep);
    if (rep) out = Py_BuildValue("{s:O,s:O}", "metrics", metrics, "report", rep);
    Py_XDECREF(metrics);
    Py_XDECREF(rep);
  }
  ks_load_report_free(j.rep);
  ks_state_free(j.st);
  ks_statedict_free(j.sd);
  ks_meta_free(j.meta);
  Py_DECREF(path);
  return out;
}
