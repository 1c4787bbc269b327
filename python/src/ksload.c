/*
 * keepsake._keepsake.load_state: the C load engine (ks_state_load_state_dict)
 * run against a description of the program's objects.
 *
 * Python describes; the engine decides; Python installs. The description names
 * the model's tensors (their memory, which the engine fills in place), the
 * components (optimizers, schedulers, data positions, callbacks, the random
 * generators) as callables the engine calls with their prefix when the file has
 * them, and every torchmetrics metric as a described metric (ks_metric_describe):
 * class, attributes, states and inner metrics. The engine matches the file to
 * them, migrates, widens or refuses, and writes the one ks_load_report. What it
 * staged for each metric it loaded goes back to Python to install.
 */
#include <string.h>

#include "ksext.h"

typedef struct load_job load_job;

/* What the engine calls for one component: the program's callable, and the job to report to. */
typedef struct component {
  PyObject *fn;
  load_job *job;
} component;

struct load_job {
  ks_state *st;
  ks_load_report *rep;
  ks_statedict *sd;       /* the entries, tensors borrowed */
  ks_meta *meta;          /* (entries, metadata): the metadata, ours */
  const ks_meta *file_meta; /* the metadata the engine reads (the reader's, or meta) */
  component *comps; /* one per component, the ctx of its ks_stateful */
  size_t n_comps;
  PyObject *train, *evals; /* metric descriptions (borrowed from the spec) */
  PyObject *fatal;         /* a BaseException a callable raised that is not an Exception: re-raised */
  ks_timestamp ts;
};

/* ---- components: the engine calls the program's callable with the prefix ---- */

static KS_NODISCARD ks_status no_save(void *ctx, ks_statedict *dst, const char *prefix, ks_error *err) {
  (void)ctx;
  (void)dst;
  (void)prefix;
  ks_error_clear(err);
  err->code = KS_E_UNSUPPORTED;
  snprintf(err->message, sizeof err->message, "load_state components are never saved through this state");
  return KS_E_UNSUPPORTED;
}

/* The callable's refusal as the engine's error: "<Type>: <message>" (KS_E_MISMATCH). */
static KS_NODISCARD ks_status refusal(load_job *job, ks_error *err) {
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  if (value && !PyErr_GivenExceptionMatches(value, PyExc_Exception) && !job->fatal) {
    job->fatal = value; /* KeyboardInterrupt and the like: not a refusal */
    Py_INCREF(value);
  }
  PyObject *s = value ? PyObject_Str(value) : NULL;
  const char *msg = s ? PyUnicode_AsUTF8(s) : NULL;
  char tname[128];
  ks_error_clear(err);
  err->code = KS_E_MISMATCH;
  snprintf(err->message, sizeof err->message, "%s: %s", value ? ksp_type_name(value, tname, sizeof tname) : "Error",
           msg ? msg : "?");
  PyErr_Clear();
  Py_XDECREF(s);
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
  return KS_E_MISMATCH;
}

static KS_NODISCARD ks_status call_loader(void *ctx, const ks_statedict *src, const char *prefix, ks_error *err) {
  (void)src;
  component *c = ctx;
  if (c->job->fatal) return KS_E_STATE; /* interrupted: call nothing more */
  PyObject *r = PyObject_CallFunction(c->fn, "s", prefix);
  if (!r) {
    ks_status s = refusal(c->job, err);
    size_t n = strlen(prefix); /* the component's path names the error, as the engine's own do */
    snprintf(err->key, sizeof err->key, "%.*s", (int)(n ? n - 1 : 0), prefix);
    return s;
  }
  Py_DECREF(r);
  return KS_OK;
}

/* The ks_state_root of a component kind, named as its layout folder; 0 for none. */
static int root_of(const char *kind) {
  static const struct {
    const char *name;
    ks_state_root root;
  } roots[] = {{"optimizers", KS_ROOT_OPTIMIZERS},
               {"schedulers", KS_ROOT_SCHEDULERS},
               {"callbacks", KS_ROOT_CALLBACKS},
               {"dataset_state", KS_ROOT_DATASET_STATE},
               {"rng", KS_ROOT_RNG}};
  for (size_t i = 0; i < sizeof roots / sizeof *roots; i++)
    if (!strcmp(kind, roots[i].name)) return (int)roots[i].root;
  return 0;
}

static int add_components(load_job *j, PyObject *comps, ks_error *err) {
  Py_ssize_t n = comps && comps != Py_None ? PySequence_Size(comps) : 0;
  if (n < 0) return -1;
  j->comps = PyMem_Calloc((size_t)n + 1, sizeof *j->comps);
  if (!j->comps) return PyErr_NoMemory(), -1;
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *item = PySequence_GetItem(comps, i);
    const char *kind, *name;
    PyObject *fn;
    int ok = item && PyArg_ParseTuple(item, "ssO", &kind, &name, &fn);
    Py_XDECREF(item); /* fn stays alive in the spec */
    if (!ok) return -1;
    int root = root_of(kind);
    if (!root) return ksp_raisef(KS_E_INVALID, "load_state: no component kind '%s'", kind), -1;
    j->comps[i] = (component){fn, j};
    ks_stateful cb = {&j->comps[i], no_save, call_loader};
    ks_status s = ks_state_add_component(j->st, (ks_state_root)root, name, &cb, err);
    if (s) return ksp_raise(s, err), -1;
    j->n_comps++;
  }
  return 0;
}

/* A shape (a sequence of ints) into dims; 0 with an exception set, or rank out of 0..KS_MAX_RANK. */
static int shape_of(PyObject *shape, int64_t *dims, int *rank) {
  Py_ssize_t n = PySequence_Size(shape);
  if (n < 0 || n > KS_MAX_RANK) return 0;
  for (Py_ssize_t d = 0; d < n; d++) {
    PyObject *v = PySequence_GetItem(shape, d);
    dims[d] = v ? PyLong_AsLongLong(v) : -1;
    Py_XDECREF(v);
    if (PyErr_Occurred()) return 0;
  }
  *rank = (int)n;
  return 1;
}

/* ---- model tensors: (name, dtype code, shape, address), filled in place ---- */

static int add_model(load_job *j, PyObject *model, ks_error *err) {
  Py_ssize_t n = model && model != Py_None ? PySequence_Size(model) : 0;
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *item = PySequence_GetItem(model, i), *shape;
    const char *name;
    int code;
    unsigned long long addr;
    int ok = item && PyArg_ParseTuple(item, "siOK", &name, &code, &shape, &addr);
    int64_t dims[KS_MAX_RANK];
    int rank = 0;
    ok = ok && shape_of(shape, dims, &rank);
    Py_XDECREF(item);
    if (!ok) return PyErr_Occurred() ? -1 : (ksp_raisef(KS_E_INVALID, "bad model tensor description"), -1);
    ks_tensor t;
    ks_status s = ks_tensor_init(&t, (ks_dtype)code, rank, dims, (void *)(uintptr_t)addr);
    if (!s) s = ks_state_add_tensor(j->st, name, &t, err);
    if (s) return ksp_raise(s, err), -1;
  }
  return 0;
}

/* ---- metrics: (name, class, attrs JSON or None, [(state, reduction name or None, dtype or -1, shape)],
 *      [(inner, desc)], optionally [(attribute, dtype or -1, shape, min, max)]); dtype -1: a list
 *      state, an int attribute ---- */

static KS_NODISCARD ks_status describe(PyObject *desc, const ks_allocator *alloc, ks_metric **out, ks_error *err);

static KS_NODISCARD ks_status describe_states(ks_metric *m, PyObject *states, ks_error *err) {
  Py_ssize_t n = PySequence_Size(states);
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *item = PySequence_GetItem(states, i), *shape;
    const char *name, *fx;
    int code;
    int ok = item && PyArg_ParseTuple(item, "sziO", &name, &fx, &code, &shape);
    int64_t dims[KS_MAX_RANK];
    int rank = 0;
    ok = ok && shape_of(shape, dims, &rank);
    Py_XDECREF(item);
    if (!ok) return KS_E_INVALID;
    /* A list state is a cat state whose rows keep their dtype. A tensor state folds by its named
       reduction; one declared "cat" or custom (or None) keeps a fixed shape, so it is summed, as
       keepsake 0.1.0 did. */
    ks_reduce reduce = KS_REDUCE_SUM;
    if (code < 0) reduce = KS_REDUCE_CAT;
    else if (ks_reduce_parse(fx, &reduce) || reduce == KS_REDUCE_CAT) reduce = KS_REDUCE_SUM;
    unsigned flags = code < 0 ? KS_STATE_ANY_DTYPE : 0;
    ks_status s = ks_metric_describe_state(m, name, reduce, code < 0 ? KS_F32 : (ks_dtype)code, rank,
                                           dims, flags, err);
    if (s) return s;
  }
  return n < 0 ? KS_E_INVALID : KS_OK;
}

static KS_NODISCARD ks_status describe_inner(ks_metric *m, PyObject *inner, const ks_allocator *alloc,
                                             ks_error *err) {
  Py_ssize_t n = PySequence_Size(inner);
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *item = PySequence_GetItem(inner, i), *desc;
    const char *name;
    ks_metric *in = NULL;
    int ok = item && PyArg_ParseTuple(item, "sO", &name, &desc);
    ks_status s = ok ? describe(desc, alloc, &in, err) : KS_E_INVALID;
    if (!s && (s = ks_metric_add_inner(m, name, in, err))) ks_metric_free(in);
    Py_XDECREF(item);
    if (s) return s;
  }
  return n < 0 ? KS_E_INVALID : KS_OK;
}

/* A wrapper's attributes: (name, dtype code or -1 for an int, shape, min, max); the engine checks them. */
static KS_NODISCARD ks_status describe_attrs(ks_metric *m, PyObject *attrs, ks_error *err) {
  Py_ssize_t n = attrs && attrs != Py_None ? PySequence_Size(attrs) : 0;
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *item = PySequence_GetItem(attrs, i), *shape;
    const char *name;
    int code;
    long long lo, hi;
    int ok = item && PyArg_ParseTuple(item, "siOLL", &name, &code, &shape, &lo, &hi);
    int64_t dims[KS_MAX_RANK];
    int rank = 0;
    ok = ok && shape_of(shape, dims, &rank);
    Py_XDECREF(item);
    if (!ok) return KS_E_INVALID;
    ks_status s = code < 0 ? ks_metric_describe_attr(m, name, KS_I64, 0, NULL, KS_ATTR_INT, lo, hi, err)
                           : ks_metric_describe_attr(m, name, (ks_dtype)code, rank, dims, 0, 0, 0, err);
    if (s) return s;
  }
  return n < 0 ? KS_E_INVALID : KS_OK;
}

static KS_NODISCARD ks_status describe(PyObject *desc, const ks_allocator *alloc, ks_metric **out,
                                       ks_error *err) {
  const char *name, *cls, *attrs;
  PyObject *states, *inner, *kept = NULL;
  if (!PyArg_ParseTuple(desc, "sszOO|O", &name, &cls, &attrs, &states, &inner, &kept)) return KS_E_INVALID;
  ks_metric *m = NULL;
  ks_status s = ks_metric_describe(cls, attrs, alloc, &m, err);
  if (!s) s = describe_states(m, states, err);
  if (!s) s = describe_attrs(m, kept, err);
  if (!s) s = describe_inner(m, inner, alloc, err);
  if (s) {
    ks_metric_free(m);
    return s;
  }
  *out = m;
  return KS_OK;
}

ks_status ksp_describe_metric(PyObject *desc, ks_metric **out, ks_error *err) { return describe(desc, NULL, out, err); }

/* The descriptions of one label (NULL: the train metrics). */
static PyObject *descs_of(load_job *j, const char *label) {
  if (!label) return j->train;
  for (Py_ssize_t i = 0; j->evals && i < PySequence_Size(j->evals); i++) {
    PyObject *item = PySequence_GetItem(j->evals, i);
    PyObject *lab = item ? PySequence_GetItem(item, 0) : NULL;
    const char *s = lab ? PyUnicode_AsUTF8(lab) : NULL;
    PyObject *d = s && !strcmp(s, label) ? PySequence_GetItem(item, 1) : NULL;
    Py_XDECREF(lab);
    Py_XDECREF(item);
    if (d) {
      Py_DECREF(d); /* still referenced by the spec */
      return d;
    }
  }
  return NULL;
}

static KS_NODISCARD ks_status factory(void *ctx, const char *label, const ks_allocator *alloc,
                                      ks_metric_collection **out, ks_error *err) {
  PyObject *descs = descs_of(ctx, label);
  ks_metric_collection *c = NULL;
  ks_status s = ks_metric_collection_create(alloc, &c, err);
  Py_ssize_t n = !s && descs && descs != Py_None ? PySequence_Size(descs) : 0;
  for (Py_ssize_t i = 0; !s && i < n; i++) {
    PyObject *d = PySequence_GetItem(descs, i);
    PyObject *nm = d ? PySequence_GetItem(d, 0) : NULL;
    const char *name = nm ? PyUnicode_AsUTF8(nm) : NULL;
    ks_metric *m = NULL;
    s = name ? describe(d, alloc, &m, err) : KS_E_INVALID;
    if (!s && (s = ks_metric_collection_add(c, name, m, err))) ks_metric_free(m);
    Py_XDECREF(nm);
    Py_XDECREF(d);
  }
  if (s) {
    ks_metric_collection_free(c); /* a failing factory frees what it built (state.h) */
    if (!err->code) snprintf(err->message, sizeof err->message, "bad metric description");
    err->code = s;
    return s;
  }
  *out = c;
  return KS_OK;
}

static int add_metrics(load_job *j, PyObject *spec, ks_error *err) {
  j->train = PyDict_GetItemString(spec, "train");
  j->evals = PyDict_GetItemString(spec, "evals");
  Py_ssize_t n = j->evals && j->evals != Py_None ? PySequence_Size(j->evals) : 0;
  if ((!j->train || j->train == Py_None) && n == 0) return 0;
  const char **labels = PyMem_Calloc((size_t)n + 1, sizeof *labels);
  PyObject *keep = PyList_New(0);
  int bad = !labels || !keep;
  for (Py_ssize_t i = 0; !bad && i < n; i++) {
    PyObject *item = PySequence_GetItem(j->evals, i);
    PyObject *lab = item ? PySequence_GetItem(item, 0) : NULL;
    labels[i] = lab ? PyUnicode_AsUTF8(lab) : NULL;
    bad = !labels[i] || PyList_Append(keep, lab);
    Py_XDECREF(lab);
    Py_XDECREF(item);
  }
  ks_status s = bad ? KS_E_INVALID : ks_state_build_metrics(j->st, factory, j, labels, (size_t)n, err);
  PyMem_Free(labels);
  Py_XDECREF(keep);
  if (PyErr_Occurred()) return -1;
  if (s) return ksp_raise(s, err), -1;
  return 0;
}

/* ---- results ---- */

/* The attribute values the engine staged: {name: int or (dtype, shape, bytearray)}. */
static PyObject *attr_values(const ks_metric *m) {
  PyObject *out = PyDict_New();
  const char *name;
  unsigned flags;
  ks_tensor v;
  for (size_t i = 0; out && ks_metric_attr_at(m, i, &name, &flags, &v) == KS_OK; i++) {
    if (!v.data) continue; /* nothing staged */
    PyObject *x = (flags & KS_ATTR_INT) ? PyLong_FromLongLong(*(const int64_t *)v.data) : ksp_tensor_copy(&v);
    if (!x || PyDict_SetItemString(out, name, x)) Py_CLEAR(out);
    Py_XDECREF(x);
  }
  return out;
}

static PyObject *metric_values(ks_metric *m) {
  PyObject *states = PyDict_New(), *inner = PyDict_New(), *attrs = attr_values(m);
  int bad = !states || !inner || !attrs;
  for (size_t i = 0; !bad && i < ks_metric_state_count(m); i++) {
    const char *name;
    ks_tensor cur;
    if (ks_metric_state_info(m, i, &name, NULL, &cur)) continue;
    PyObject *v = ksp_tensor_copy(&cur);
    bad = !v || PyDict_SetItemString(states, name, v);
    Py_XDECREF(v);
  }
  for (size_t i = 0; !bad && i < ks_metric_inner_count(m); i++) {
    const char *name;
    PyObject *v = metric_values(ks_metric_inner_at(m, i, &name));
    bad = !v || PyDict_SetItemString(inner, name, v);
    Py_XDECREF(v);
  }
  PyObject *out = bad ? NULL : Py_BuildValue("{s:O,s:L,s:O,s:O}", "states", states, "update_count",
                                             (long long)ks_metric_update_count(m), "inner", inner, "attrs", attrs);
  Py_XDECREF(states);
  Py_XDECREF(inner);
  Py_XDECREF(attrs);
  return out;
}

/* Whether the engine filled the metric at `path` (loaded, migrated or converted). */
static int filled(const ks_load_report *rep, const char *path) {
  const ks_load_item *it = ks_load_report_find(rep, path);
  return it && (it->kind == KS_LOAD_LOADED || it->kind == KS_LOAD_MIGRATED || it->kind == KS_LOAD_CONVERTED);
}

static int put_collection(PyObject *out, const ks_load_report *rep, ks_metric_collection *c, const char *root) {
  for (size_t i = 0; c && i < ks_metric_collection_count(c); i++) {
    const char *name;
    ks_metric *m = ks_metric_collection_at(c, i, &name);
    PyObject *path = PyUnicode_FromFormat("%s%s", root, name);
    const char *p = path ? PyUnicode_AsUTF8(path) : NULL;
    PyObject *v = p && filled(rep, p) ? metric_values(m) : NULL;
    int bad = !p || (v && PyDict_SetItem(out, path, v)) || PyErr_Occurred();
    Py_XDECREF(v);
    Py_XDECREF(path);
    if (bad) return -1;
  }
  return 0;
}

static PyObject *timestamp_dict(const ks_timestamp *t) {
  return Py_BuildValue("{s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:d,s:d,s:d}", "epoch", (long long)t->epoch, "batch",
                       (long long)t->batch, "sample", (long long)t->sample, "token", (long long)t->token,
                       "batch_in_epoch", (long long)t->batch_in_epoch, "sample_in_epoch",
                       (long long)t->sample_in_epoch, "token_in_epoch", (long long)t->token_in_epoch, "total_wct",
                       t->total_wct, "epoch_wct", t->epoch_wct, "batch_wct", t->batch_wct);
}

static PyObject *results(load_job *j) {
  PyObject *metrics = PyDict_New();
  int bad = !metrics || put_collection(metrics, j->rep, ks_state_train_metrics(j->st), KS_KEY_TRAIN_METRICS);
  Py_ssize_t n = j->evals && j->evals != Py_None ? PySequence_Size(j->evals) : 0;
  for (Py_ssize_t i = 0; !bad && i < n; i++) {
    PyObject *item = PySequence_GetItem(j->evals, i);
    PyObject *lab = item ? PySequence_GetItem(item, 0) : NULL;
    const char *l = lab ? PyUnicode_AsUTF8(lab) : NULL;
    PyObject *root = l ? PyUnicode_FromFormat(KS_KEY_EVAL_METRICS "%s/", l) : NULL;
    bad = !root || put_collection(metrics, j->rep, ks_state_eval_metrics(j->st, l), PyUnicode_AsUTF8(root));
    Py_XDECREF(root);
    Py_XDECREF(lab);
    Py_XDECREF(item);
  }
  PyObject *rep = bad ? NULL : PyList_New(0);
  ks_load_item it;
  for (size_t i = 0; rep && ks_load_report_at(j->rep, i, &it) == KS_OK; i++) {
    PyObject *t = Py_BuildValue("(sss)", ks_load_kind_name(it.kind), it.path, it.reason ? it.reason : "");
    if (!t || PyList_Append(rep, t)) Py_CLEAR(rep);
    Py_XDECREF(t);
  }
  PyObject *ts = rep && filled(j->rep, "state/timestamp/Timestamp") ? timestamp_dict(&j->ts) : Py_None;
  if (ts == Py_None) Py_INCREF(ts);
  PyObject *out = rep && ts ? Py_BuildValue("{s:O,s:O,s:O}", "report", rep, "metrics", metrics, "timestamp", ts)
                            : NULL;
  Py_XDECREF(ts);
  Py_XDECREF(rep);
  Py_XDECREF(metrics);
  return out;
}

/* ---- the call ---- */

/* The entries the engine reads: a Reader's (borrowed), or (entries, metadata) as save_file takes. */
static int borrow_entries(load_job *j, PyObject *source, ks_error *err) {
  if (PyTuple_Check(source) && PyTuple_GET_SIZE(source) == 2) {
    j->sd = ksp_statedict_from(PyTuple_GET_ITEM(source, 0));
    j->meta = j->sd ? ksp_meta_from(PyTuple_GET_ITEM(source, 1)) : NULL;
    return j->meta ? 0 : -1;
  }
  const ks_reader *r = ksp_reader_get(source);
  if (!r) return -1;
  ks_status s = ks_statedict_create(NULL, &j->sd, err);
  for (size_t i = 0; !s && i < ks_reader_count(r); i++) {
    const char *name;
    ks_tensor view;
    s = ks_reader_tensor_at(r, i, &name, &view);
    if (!s) s = ks_statedict_set_tensor(j->sd, name, &view, KS_BORROW, err);
  }
  if (!s) s = ks_reader_scalars(r, j->sd, err);
  j->file_meta = ks_reader_meta(r);
  return s ? (ksp_raise(s, err), -1) : 0;
}

static int flag(PyObject *spec, const char *key) {
  PyObject *v = PyDict_GetItemString(spec, key);
  return v && PyObject_IsTrue(v) == 1;
}

static KS_NODISCARD ks_status run(load_job *j, PyObject *spec, const ks_meta *meta, ks_error *err) {
  PyObject *ignore = PyDict_GetItemString(spec, "ignore");
  Py_ssize_t n = ignore && ignore != Py_None ? PySequence_Size(ignore) : 0;
  const char **globs = PyMem_Calloc((size_t)n + 1, sizeof *globs);
  if (!globs) return KS_E_NOMEM;
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *g = PySequence_GetItem(ignore, i); /* a list of str: the list keeps them alive */
    globs[i] = g ? PyUnicode_AsUTF8(g) : NULL;
    Py_XDECREF(g);
    if (!globs[i]) {
      PyMem_Free(globs);
      return KS_E_INVALID;
    }
  }
  ks_load_opts o = {.size = sizeof o, .non_strict_model = !flag(spec, "strict"),
                    .weights_only = flag(spec, "weights_only"), .ignore = globs, .n_ignore = (size_t)n,
                    .allow_narrowing = flag(spec, "allow_narrowing"), .model_absent = flag(spec, "model_absent")};
  ks_status s = ks_state_load_state_dict(j->st, j->sd, meta, &o, j->rep, err);
  PyMem_Free(globs);
  return s;
}

PyObject *ksp_load_state(PyObject *self, PyObject *args) {
  (void)self;
  PyObject *reader, *spec, *out = NULL;
  if (!PyArg_ParseTuple(args, "OO!", &reader, &PyDict_Type, &spec)) return NULL;
  load_job j;
  memset(&j, 0, sizeof j);
  ks_timestamp_init(&j.ts);
  ks_error err;
  ks_error_clear(&err);
  ks_status s = ks_state_create("", 0, NULL, &j.st, &err);
  if (!s) s = ks_load_report_create(NULL, &j.rep, &err);
  int bad = s && (ksp_raise(s, &err), 1);
  if (!bad) bad = borrow_entries(&j, reader, &err);
  if (!bad && j.meta) j.file_meta = j.meta;
  if (!bad) bad =  add_model(&j, PyDict_GetItemString(spec, "model"), &err) ||
                  add_components(&j, PyDict_GetItemString(spec, "components"), &err) ||
                  add_metrics(&j, spec, &err);
  if (!bad && flag(spec, "timestamp")) ks_state_set_timestamp(j.st, &j.ts);
  if (!bad) {
    s = run(&j, spec, j.file_meta, &err);
    if (j.fatal) {
      PyErr_SetObject((PyObject *)Py_TYPE(j.fatal), j.fatal);
      bad = 1;
    } else if (s) {
      PyObject *path = PyDict_GetItemString(spec, "path");
      const char *p = path && PyUnicode_Check(path) ? PyUnicode_AsUTF8(path) : NULL;
      if (p && !err.file[0]) snprintf(err.file, sizeof err.file, "%s", p);
      ksp_raise(s, &err);
      bad = 1;
    }
  }
  if (!bad) out = results(&j);
  Py_XDECREF(j.fatal);
  PyMem_Free(j.comps);
  ks_load_report_free(j.rep);
  ks_state_free(j.st);
  ks_statedict_free(j.sd);
  ks_meta_free(j.meta);
  return out;
}

/* ---- metric sync: one metric's states from every rank, folded by the library's rule ---- */

/* Rank r's copy of the described metric: its states (KS_KEY_METRIC_STATES + <state>) and its update count
   (KS_KEY_METRIC_UPDATE_COUNT), named as a metric's folder names them; the module's SYNC_STATES and
   SYNC_UPDATE_COUNT give the encoder (keepsake._distributed.sync) the same names. */
static KS_NODISCARD ks_status part_of(PyObject *desc, PyObject *blob, ks_metric **out, ks_error *err) {
  Py_buffer view;
  if (PyObject_GetBuffer(blob, &view, PyBUF_SIMPLE)) return KS_E_INVALID;
  ks_statedict *sd = NULL;
  ks_meta *meta = NULL;
  ks_metric *m = NULL;
  ks_status s = ks_load_buffer(view.buf, (size_t)view.len, NULL, &sd, &meta, err);
  if (!s) s = describe(desc, NULL, &m, err);
  if (!s) s = ks_metric_load_state_dict(m, sd, KS_KEY_METRIC_STATES, KS_METRIC_SCHEMA_VERSION, 0, NULL, NULL, err);
  ks_entry e;
  int64_t count = ks_statedict_get(sd, KS_KEY_METRIC_UPDATE_COUNT, &e) == KS_OK && e.kind == KS_VAL_INT ? e.i : 0;
  if (!s) s = ks_metric_restore_computed(m, NULL, count < 0 ? 0 : count, err);
  ks_statedict_free(sd);
  ks_meta_free(meta);
  PyBuffer_Release(&view);
  if (s) {
    ks_metric_free(m);
    return s;
  }
  *out = m;
  return KS_OK;
}

PyObject *ksp_fold_metric(PyObject *self, PyObject *args) {
  (void)self;
  PyObject *desc, *blobs, *out = NULL;
  if (!PyArg_ParseTuple(args, "OO", &desc, &blobs)) return NULL;
  Py_ssize_t n = PySequence_Size(blobs);
  if (n <= 0) return n < 0 ? NULL : ksp_raisef(KS_E_INVALID, "fold_metric: no parts");
  ks_metric **parts = PyMem_Calloc((size_t)n, sizeof *parts);
  if (!parts) return PyErr_NoMemory();
  ks_error err;
  ks_error_clear(&err);
  ks_status s = KS_OK;
  for (Py_ssize_t i = 0; !s && i < n; i++) {
    PyObject *b = PySequence_GetItem(blobs, i);
    s = b ? part_of(desc, b, &parts[i], &err) : KS_E_INVALID;
    Py_XDECREF(b);
  }
  ks_metric *acc = NULL;
  if (!s) s = ks_metric_fold((const ks_metric *const *)parts, (size_t)n, NULL, &acc, &err);
  if (!s) out = metric_values(acc);
  else if (!PyErr_Occurred()) ksp_raise(s, &err);
  ks_metric_free(acc);
  for (Py_ssize_t i = 0; i < n; i++) ks_metric_free(parts[i]);
  PyMem_Free(parts);
  return out;
}
