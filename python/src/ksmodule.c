/* Module definition, errors and value conversions shared by the extension's files. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ksext.h"

PyMODINIT_FUNC PyInit__keepsake(void);

/* status code -> exception class, filled by keepsake/_core/errors.py through _register_errors. */
static PyObject *error_classes;

static PyObject *error_class(ks_status st) {
  PyObject *cls = NULL;
  if (error_classes) {
    PyObject *k = PyLong_FromLong(st);
    if (k) cls = PyDict_GetItemWithError(error_classes, k);
    Py_XDECREF(k);
    if (!cls && !PyErr_Occurred()) cls = PyDict_GetItemString(error_classes, "default");
  }
  return cls ? cls : PyExc_RuntimeError;
}

/* A missing file is also Python's FileNotFoundError, which users catch: the I/O error's message
 * carries the OS's reason (strerror, which the library's messages end with). */
static PyObject *missing_file_class(ks_status st, const char *msg) {
  if (st != KS_E_IO || !error_classes || !strstr(msg, strerror(ENOENT))) return NULL;
  return PyDict_GetItemString(error_classes, "ENOENT"); /* borrowed, or NULL */
}

PyObject *ksp_raise(ks_status st, const ks_error *err) {
  const char *msg = err && err->message[0] ? err->message : ks_strerror(st);
  PyObject *cls = missing_file_class(st, msg);
  if (!cls) cls = error_class(st);
  if (cls == PyExc_RuntimeError) return PyErr_Format(cls, "%s (%s)", ks_strerror(st), ks_status_name(st));
  /* Messages and keys quote input bytes, which need not be UTF-8: decode leniently. */
  PyObject *m = PyUnicode_DecodeUTF8(msg, (Py_ssize_t)strlen(msg), "backslashreplace");
  PyObject *f = err ? PyUnicode_DecodeFSDefault(err->file) : PyUnicode_FromString("");
  PyObject *k = err ? PyUnicode_DecodeUTF8(err->key, (Py_ssize_t)strlen(err->key), "surrogateescape")
                    : PyUnicode_FromString("");
  PyObject *exc = m && f && k ? PyObject_CallFunction(cls, "iOOOL", st, m, f, k, (long long)(err ? err->offset : -1))
                              : NULL;
  Py_XDECREF(m);
  Py_XDECREF(f);
  Py_XDECREF(k);
  if (exc) {
    PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
    Py_DECREF(exc);
  }
  return NULL;
}

PyObject *ksp_raisef(ks_status st, const char *fmt, ...) {
  ks_error e;
  ks_error_clear(&e);
  e.code = st;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e.message, sizeof e.message, fmt, ap);
  va_end(ap);
  return ksp_raise(st, &e);
}

PyObject *ksp_call_unlocked(int *busy, ks_status (*fn)(void *obj, ks_error *err), void *obj) {
  ks_error err;
  ks_error_clear(&err);
  ks_status st;
  *busy = 1;
  Py_BEGIN_ALLOW_THREADS st = fn(obj, &err);
  Py_END_ALLOW_THREADS
  *busy = 0;
  if (st) return ksp_raise(st, &err);
  Py_RETURN_NONE;
}

void ksp_error_path(ks_error *err, const char *path) {
  if (err && (!err->file[0] || !strcmp(err->file, "<buffer>"))) snprintf(err->file, sizeof err->file, "%s", path);
}

static PyObject *register_errors(PyObject *self, PyObject *dict) {
  (void)self;
  if (!PyDict_Check(dict)) return PyErr_Format(PyExc_TypeError, "expected a dict");
  Py_INCREF(dict);
  Py_XSETREF(error_classes, dict);
  Py_RETURN_NONE;
}

static PyObject *status_names(PyObject *self, PyObject *unused) {
  (void)self;
  (void)unused;
  PyObject *d = PyDict_New();
  for (int c = 0; d && c < KS__STATUS_END; c++) {
    PyObject *v = Py_BuildValue("(ss)", ks_status_name(c), ks_strerror(c));
    PyObject *k = PyLong_FromLong(c);
    if (!v || !k || PyDict_SetItem(d, k, v)) Py_CLEAR(d);
    Py_XDECREF(v);
    Py_XDECREF(k);
  }
  return d;
}

PyObject *ksp_shape_tuple(int rank, const int64_t *shape) {
  PyObject *t = PyTuple_New(rank);
  for (int i = 0; t && i < rank; i++) {
    PyObject *d = PyLong_FromLongLong((long long)shape[i]);
    if (!d) Py_CLEAR(t);
    else PyTuple_SET_ITEM(t, i, d);
  }
  return t;
}

PyObject *ksp_tensor_copy(const ks_tensor *t) {
  PyObject *shape = ksp_shape_tuple(t->rank, t->shape);
  PyObject *data = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)t->nbytes);
  PyObject *out = NULL;
  if (shape && data) {
    if (t->nbytes) memcpy(PyByteArray_AS_STRING(data), t->data, t->nbytes);
    out = Py_BuildValue("(iOO)", (int)t->dtype, shape, data);
  }
  Py_XDECREF(shape);
  Py_XDECREF(data);
  return out;
}

PyObject *ksp_scalar_value(const ks_entry *e) {
  switch (e->kind) {
  case KS_VAL_TENSOR: return ksp_tensor_copy(&e->tensor);
  case KS_VAL_INT: return PyLong_FromLongLong((long long)e->i);
  case KS_VAL_FLOAT: return PyFloat_FromDouble(e->f);
  case KS_VAL_BOOL: return PyBool_FromLong(e->i != 0);
  case KS_VAL_STRING: return PyUnicode_DecodeUTF8(e->s, (Py_ssize_t)strlen(e->s), "surrogateescape");
  case KS_VAL_NULL: Py_RETURN_NONE;
  }
  return ksp_raisef(KS_E_INVALID, "entry '%s' has an unknown kind", e->name);
}

PyObject *ksp_statedict_items(const ks_statedict *sd) {
  size_t n = ks_statedict_count(sd);
  PyObject *list = PyList_New((Py_ssize_t)n);
  ks_entry e;
  for (size_t i = 0; list && i < n && ks_statedict_at(sd, i, &e) == KS_OK; i++) {
    /* torch files may name entries with any bytes: keep them, as os.fsdecode does */
    PyObject *v = ksp_scalar_value(&e);
    PyObject *k = v ? PyUnicode_DecodeUTF8(e.name, (Py_ssize_t)strlen(e.name), "surrogateescape") : NULL;
    PyObject *item = k ? Py_BuildValue("(NN)", k, v) : NULL;
    if (!k) Py_XDECREF(v);
    if (!item) Py_CLEAR(list);
    else PyList_SET_ITEM(list, (Py_ssize_t)i, item);
  }
  return list;
}

static int is_writer_key(const char *k) {
  static const char *const keys[] = {KS_META_FORMAT, KS_META_FORMAT_VERSION, KS_META_WRITER, KS_META_SCALARS,
                                     KS_META_CHECKSUMS};
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
    if (!strcmp(k, keys[i])) return 1;
  return 0;
}

PyObject *ksp_meta_dict(const ks_meta *m, int skip_writer) {
  PyObject *d = PyDict_New();
  const char *k, *v;
  for (size_t i = 0; d && m && ks_meta_at(m, i, &k, &v) == KS_OK; i++) {
    if (skip_writer && is_writer_key(k)) continue;
    PyObject *pv = PyUnicode_FromString(v);
    if (!pv || PyDict_SetItemString(d, k, pv)) Py_CLEAR(d);
    Py_XDECREF(pv);
  }
  return d;
}

ks_meta *ksp_meta_from(PyObject *dict) {
  ks_meta *m = NULL;
  ks_status st = ks_meta_create(NULL, &m, NULL);
  if (st) return (ks_meta *)ksp_raise(st, NULL);
  if (!dict || dict == Py_None) return m;
  if (!PyDict_Check(dict)) {
    ks_meta_free(m);
    return (ks_meta *)PyErr_Format(PyExc_TypeError, "metadata must be a dict of str to str");
  }
  PyObject *k, *v;
  Py_ssize_t pos = 0;
  while (PyDict_Next(dict, &pos, &k, &v)) {
    const char *ks = PyUnicode_Check(k) ? PyUnicode_AsUTF8(k) : NULL;
    const char *vs = PyUnicode_Check(v) ? PyUnicode_AsUTF8(v) : NULL;
    if (!ks || !vs) {
      ks_meta_free(m);
      if (!PyErr_Occurred()) PyErr_Format(PyExc_TypeError, "metadata must be a dict of str to str");
      return NULL;
    }
    if ((st = ks_meta_set(m, ks, vs, NULL)) != KS_OK) {
      ks_meta_free(m);
      return (ks_meta *)ksp_raisef(st, "cannot set metadata key '%s'", ks);
    }
  }
  return m;
}

/* The library's widening rule (ks_dtype_widens_to), so Python decides as C does. */
static PyObject *dtype_widens(PyObject *self, PyObject *args) {
  (void)self;
  int from, to;
  if (!PyArg_ParseTuple(args, "ii", &from, &to)) return NULL;
  return PyBool_FromLong(ks_dtype_widens_to((ks_dtype)from, (ks_dtype)to));
}

/* The library's glob (ks_path_match): the ignore= of load_checkpoint is ks_convert's. */
static PyObject *path_match(PyObject *self, PyObject *args) {
  (void)self;
  const char *glob, *path;
  if (!PyArg_ParseTuple(args, "ss", &glob, &path)) return NULL;
  return PyBool_FromLong(ks_path_match(glob, path));
}

/* The key of a part of a training state (ks_state_key): the package names no key itself. */
static PyObject *state_key(PyObject *self, PyObject *args) {
  (void)self;
  int part;
  const char *base = NULL, *name = NULL;
  if (!PyArg_ParseTuple(args, "i|zz", &part, &base, &name)) return NULL;
  char key[KS_MAX_NAME + 1];
  ks_error err;
  ks_status st = ks_state_key((ks_state_part)part, base, name, key, sizeof key, &err);
  if (st) return ksp_raise(st, &err);
  return PyUnicode_DecodeUTF8(key, (Py_ssize_t)strlen(key), "surrogateescape");
}

/* The value of a layout record keepsake writes (ks_layout_record): KeyError for another key. */
static PyObject *layout_record(PyObject *self, PyObject *args) {
  (void)self;
  const char *key;
  if (!PyArg_ParseTuple(args, "s", &key)) return NULL;
  const char *v = ks_layout_record(key);
  if (!v) return PyErr_Format(PyExc_KeyError, "no layout record named %s", key);
  return PyUnicode_FromString(v);
}

/* The parts ks_state_key names, as the module's PART_* constants. */
static int add_state_parts(PyObject *m) {
  static const struct {
    const char *name;
    ks_state_part part;
  } parts[] = {{"PART_MODEL", KS_PART_MODEL}, {"PART_OPTIMIZER", KS_PART_OPTIMIZER},
               {"PART_SCHEDULER", KS_PART_SCHEDULER}, {"PART_CALLBACK", KS_PART_CALLBACK},
               {"PART_DATASET_STATE", KS_PART_DATASET_STATE}, {"PART_RNG", KS_PART_RNG},
               {"PART_TIMESTAMP", KS_PART_TIMESTAMP}, {"PART_TRAIN_METRIC", KS_PART_TRAIN_METRIC},
               {"PART_EVAL_METRIC", KS_PART_EVAL_METRIC}, {"PART_EXTRA", KS_PART_EXTRA},
               {"PART_RANK_ZERO_SEED", KS_PART_RANK_ZERO_SEED}, {"PART_RUN_NAME", KS_PART_RUN_NAME},
               {"PART_METRIC_STATE", KS_PART_METRIC_STATE}, {"PART_METRIC_COMPUTED", KS_PART_METRIC_COMPUTED},
               {"PART_METRIC_ATTR", KS_PART_METRIC_ATTR}, {"PART_METRIC_INNER", KS_PART_METRIC_INNER},
               {"PART_METRIC_UPDATE_COUNT", KS_PART_METRIC_UPDATE_COUNT}, {"PART_LIGHTNING", KS_PART_LIGHTNING}};
  _Static_assert(sizeof parts / sizeof parts[0] == KS_PART_COUNT_, "every part has its constant");
  for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
    if (PyModule_AddIntConstant(m, parts[i].name, (long)parts[i].part) < 0) return -1;
  if (PyModule_AddStringConstant(m, "META_STATE", KS_META_STATE) < 0) return -1;
  /* A metric-sync blob (fold_metric) holds one metric's folder: its states and its update count. */
  if (PyModule_AddStringConstant(m, "SYNC_STATES", KS_KEY_METRIC_STATES) < 0) return -1;
  if (PyModule_AddStringConstant(m, "SYNC_UPDATE_COUNT", KS_KEY_METRIC_UPDATE_COUNT) < 0) return -1;
  return PyModule_AddStringConstant(m, "META_LIGHTNING", KS_META_LIGHTNING);
}

/* [(safetensors name, element size)] by keepsake dtype code: the library's table, not a copy. */
static PyObject *dtypes(PyObject *self, PyObject *unused) {
  (void)self, (void)unused;
  PyObject *out = PyList_New(KS_DTYPE_COUNT);
  for (int c = 0; out && c < KS_DTYPE_COUNT; c++) {
    PyObject *t = Py_BuildValue("(sn)", ks_dtype_name((ks_dtype)c), (Py_ssize_t)ks_dtype_size((ks_dtype)c));
    if (!t) Py_CLEAR(out);
    else PyList_SET_ITEM(out, c, t);
  }
  return out;
}

static PyObject *is_remote(PyObject *self, PyObject *arg) {
  (void)self;
  PyObject *fs = NULL; /* str, bytes or os.PathLike, as every location argument */
  if (!PyUnicode_FSConverter(arg, &fs)) return NULL;
  PyObject *out = PyBool_FromLong(ksp_is_remote(PyBytes_AS_STRING(fs)));
  Py_DECREF(fs);
  return out;
}

static PyMethodDef methods[] = {
    {"dtypes", dtypes, METH_NOARGS,
     "dtypes()\n--\n\n[(safetensors name, element size)] by keepsake dtype code (ks_dtype_name, ks_dtype_size)."},
    {"is_remote", is_remote, METH_O,
     "is_remote(location, /)\n--\n\nWhether the storage layer reads `location` (s3://, http(s)://), not a local path."},
    {"dtype_widens", dtype_widens, METH_VARARGS,
     "dtype_widens(from_code, to_code, /)\n--\n\nks_dtype_widens_to: every value of `from` fits `to` exactly."},
    {"state_key", state_key, METH_VARARGS,
     "state_key(part, base=None, name=None, /)\n--\n\nks_state_key: the key of a part (PART_*) of a training state."},
    {"layout_record", layout_record, METH_VARARGS,
     "layout_record(key, /)\n--\n\nks_layout_record: the value keepsake writes for the layout record `key`."},
    {"path_match", path_match, METH_VARARGS,
     "path_match(glob, path, /)\n--\n\nks_path_match: '*' any bytes ('/' included), '?' one, '/'-prefix aware."},
    {"_register_errors", register_errors, METH_O,
     "_register_errors(table, /)\n--\n\nRegisters the exception class of every status code."},
    {"status_names", status_names, METH_NOARGS,
     "status_names()\n--\n\n{code: (name, description)} for every status code."},
    {"save_file", (PyCFunction)(void (*)(void))ksp_save_file, METH_VARARGS | METH_KEYWORDS,
     "save_file(path, entries, metadata=None, metrics=None, fsync=True)\n--\n\n"
     "Writes entries to a keepsake file with the library's atomic, durable save."},
    {"save_bytes", (PyCFunction)(void (*)(void))ksp_save_bytes, METH_VARARGS | METH_KEYWORDS,
     "save_bytes(entries, metadata=None, metrics=None)\n--\n\nThe bytes of the keepsake file save_file would write."},
    {"torch_load", (PyCFunction)(void (*)(void))ksp_torch_load, METH_VARARGS | METH_KEYWORDS,
     "torch_load(source, verify_crc=False)\n--\n\n"
     "Reads a torch.save file (path or bytes) without executing it: ([(name, value)], structure JSON)."},
    {"structure_plan", ksp_structure_plan, METH_VARARGS,
     "structure_plan(document, pytree, items, prefix, /)\n--\n\n"
     "ks_structure_plan: how the entries of `items` under `prefix` rebuild, from the file's structure document "
     "(or 0.1.0 pytree table): (0, path, value, leaf kind) or (tag, [(key, child, ...)], int_keys)."},
    {"torch_save", (PyCFunction)(void (*)(void))ksp_torch_save, METH_VARARGS | METH_KEYWORDS,
     "torch_save(path, entries, fsync=True)\n--\n\nWrites entries as a torch.save-compatible file."},
    {"convert", (PyCFunction)(void (*)(void))ksp_convert, METH_VARARGS | METH_KEYWORDS,
     "convert(src, dst, ignore=(), salvage=False, torch_compat=False, hf=False, hf_shard_bytes=0)\n--\n\n"
     "As `keepsake convert SRC DST`: returns (kept, ignored)."},
    {"metric_info", ksp_metric_info, METH_VARARGS,
     "metric_info(description_json, /)\n--\n\nThe keepsake.metrics JSON the C library derives from a description."},
    {"compute_metrics", (PyCFunction)(void (*)(void))ksp_compute_metrics, METH_VARARGS | METH_KEYWORDS,
     "compute_metrics(path)\n--\n\nLoads the catalogue metrics of a checkpoint with the C library and computes them."},
    {"load_state", ksp_load_state, METH_VARARGS,
     "load_state(reader, spec, /)\n--\n\nks_state_load_state_dict against a description of the program's objects: "
     "{report, metrics, timestamp}."},
    {"fold_metric", ksp_fold_metric, METH_VARARGS,
     "fold_metric(description, blobs, /)\n--\n\nks_metric_fold of every rank's states (keepsake bytes, rank order)."},
    {"catalogue", ksp_catalogue, METH_NOARGS, "catalogue()\n--\n\nThe metric classes the C library implements."},
    {"preemption_install", ksp_preemption_install, METH_VARARGS,
     "preemption_install(signals, /)\n--\n\nks_preemption_install: these signals ask for a save at the next step "
     "(the handlers they had still run). Returns the signals, for preemption_uninstall."},
    {"preemption_uninstall", ksp_preemption_uninstall, METH_VARARGS,
     "preemption_uninstall(signals, /)\n--\n\nks_preemption_uninstall: undoes one preemption_install of these signals "
     "(the last one puts back the dispositions the first replaced); () does nothing."},
    {"preemption_signal", ksp_preemption_signal, METH_NOARGS,
     "preemption_signal()\n--\n\nThe preemption signal received (0 when none)."},
    {"report_text", ksp_report_text, METH_O,
     "report_text(items, /)\n--\n\nWhat ks_load_report_print prints for [(kind, path, reason), ...]."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_keepsake",
                                    "The C core of keepsake (use the keepsake package, not this module).", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyTypeObject *ksp_add_type(PyObject *m, PyType_Spec *spec) {
  PyObject *t = PyType_FromModuleAndSpec(m, spec, NULL);
  if (!t) return NULL;
  int rc = PyModule_AddType(m, (PyTypeObject *)t); /* takes its own reference */
  Py_DECREF(t);
  return rc < 0 ? NULL : (PyTypeObject *)t;
}

void ksp_free_self(PyObject *self) {
  PyTypeObject *tp = Py_TYPE(self);
  freefunc free_fn = (freefunc)(uintptr_t)PyType_GetSlot(tp, Py_tp_free);
  free_fn(self);
  Py_DECREF(tp);
}

const char *ksp_type_name(PyObject *o, char *buf, size_t size) {
  PyObject *name = PyType_GetName(Py_TYPE(o));
  const char *s = name ? PyUnicode_AsUTF8AndSize(name, NULL) : NULL;
  if (!s) PyErr_Clear();
  snprintf(buf, size, "%s", s ? s : "?");
  Py_XDECREF(name);
  return buf;
}

PyTypeObject *ksp_ReaderType;

PyMODINIT_FUNC PyInit__keepsake(void) {
  PyObject *m = PyModule_Create(&module);
  if (!m) return NULL;
  if (!(ksp_ReaderType = ksp_add_type(m, &ksp_ReaderSpec)) || !ksp_add_type(m, &ksp_ManagerSpec) ||
      PyModule_AddStringConstant(m, "version", KS_VERSION_STRING) < 0 ||
      PyModule_AddIntConstant(m, "format_version", KS_FORMAT_VERSION) < 0 || add_state_parts(m) < 0) {
    Py_DECREF(m);
    return NULL;
  }
  /* Sharded checkpoint directories (ksshard.c). */
  if (PyModule_AddFunctions(m, ksp_shard_methods) < 0 || PyModule_AddFunctions(m, ksp_dist_methods) < 0 ||
      !ksp_add_type(m, &ksp_ShardFileSpec)) {
    Py_DECREF(m);
    return NULL;
  }
  /* ksasync.c, ksearly.c, ksimage.c */
  if (ksp_async_add_type(m) < 0 || ksp_early_add_type(m) < 0 || ksp_image_add_type(m) < 0) {
    Py_DECREF(m);
    return NULL;
  }
  if (ksp_structure_add_type(m) < 0) { /* the structure document (ksstructure.c) */
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
