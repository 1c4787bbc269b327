/*
 * keepsake._keepsake.EarlyStop: the library's early-stopping rule (ks_early_stop, train.h) for
 * Python programs. The rule (improve by more than min_delta in the mode's direction, else count
 * toward patience; NaN never improves) and the saved form (ks_early_stop_stateful: monitor,
 * mode, patience, min_delta, best_score, wait_count, stopped_epoch; a different monitor or mode
 * refused on load, nothing changed) are the C library's, so a checkpoint of a C program's early
 * stopper loads into a Python one and back.
 */
#include <string.h>

#include "ksext.h"

typedef struct {
  PyObject_HEAD
  ks_early_stop es;
  int ready;
} ksp_EarlyStop;

static int EarlyStop_init(ksp_EarlyStop *self, PyObject *args, PyObject *kw) {
  static char *names[] = {"monitor", "mode", "patience", "min_delta", NULL};
  const char *monitor, *mode = "min";
  long long patience = 3;
  double min_delta = 0.0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "s|sLd", names, &monitor, &mode, &patience, &min_delta)) return -1;
  if (strcmp(mode, "min") && strcmp(mode, "max")) {
    PyErr_SetString(PyExc_ValueError, "mode: 'min' or 'max'");
    return -1;
  }
  ks_error err;
  ks_error_clear(&err);
  ks_status st = ks_early_stop_init(&self->es, monitor, strcmp(mode, "max") ? KS_BEST_MIN : KS_BEST_MAX,
                                    (int64_t)patience, min_delta, &err);
  if (st) return ksp_raise(st, &err), -1;
  self->ready = 1;
  return 0;
}

static int ready(ksp_EarlyStop *self) {
  if (self->ready) return 1;
  PyErr_SetString(PyExc_RuntimeError, "EarlyStop is not initialised");
  return 0;
}

static PyObject *EarlyStop_update(ksp_EarlyStop *self, PyObject *args) {
  double value;
  long long epoch;
  if (!ready(self) || !PyArg_ParseTuple(args, "dL", &value, &epoch)) return NULL;
  return PyBool_FromLong(ks_early_stop_update(&self->es, value, (int64_t)epoch));
}

/* A Python value of a scalar entry (the kinds ks_early_stop_stateful writes). */
static PyObject *scalar(const ks_entry *e) {
  switch (e->kind) {
  case KS_VAL_NULL: Py_RETURN_NONE;
  case KS_VAL_INT: return PyLong_FromLongLong(e->i);
  case KS_VAL_FLOAT: return PyFloat_FromDouble(e->f);
  case KS_VAL_STRING: return PyUnicode_FromString(e->s);
  default: return ksp_raisef(KS_E_UNSUPPORTED, "early stopping: unexpected entry '%s'", e->name);
  }
}

static PyObject *EarlyStop_state_dict(ksp_EarlyStop *self, PyObject *unused) {
  (void)unused;
  if (!ready(self)) return NULL;
  ks_statedict *sd = NULL;
  ks_error err;
  ks_error_clear(&err);
  ks_status st = ks_statedict_create(NULL, &sd, &err);
  ks_stateful sf = ks_early_stop_stateful(&self->es);
  if (!st) st = sf.to_state_dict(sf.ctx, sd, "", &err);
  PyObject *d = st ? ksp_raise(st, &err) : PyDict_New();
  for (size_t i = 0; d && i < ks_statedict_count(sd); i++) {
    ks_entry e;
    PyObject *v = ks_statedict_at(sd, i, &e) ? NULL : scalar(&e);
    if (!v || PyDict_SetItemString(d, e.name, v)) Py_CLEAR(d);
    Py_XDECREF(v);
  }
  ks_statedict_free(sd);
  return d;
}

static PyObject *EarlyStop_load_state_dict(ksp_EarlyStop *self, PyObject *arg) {
  if (!ready(self)) return NULL;
  if (!PyDict_Check(arg)) return PyErr_Format(PyExc_TypeError, "load_state_dict takes a dict");
  PyObject *items = PyList_New(0);
  PyObject *k, *v;
  Py_ssize_t pos = 0;
  while (items && PyDict_Next(arg, &pos, &k, &v)) {
    if (!PyUnicode_Check(k)) {
      Py_CLEAR(items);
      return PyErr_Format(PyExc_TypeError, "early stopping state: keys are strings");
    }
    PyObject *t = PyTuple_Pack(2, k, v);
    if (!t || PyList_Append(items, t)) Py_CLEAR(items);
    Py_XDECREF(t);
  }
  ks_statedict *sd = items ? ksp_statedict_from(items) : NULL;
  Py_XDECREF(items);
  if (!sd) return NULL;
  ks_error err;
  ks_error_clear(&err);
  ks_stateful sf = ks_early_stop_stateful(&self->es);
  ks_status st = sf.load_state_dict(sf.ctx, sd, "", &err); /* checks all before it changes anything */
  ks_statedict_free(sd);
  if (st) return ksp_raise(st, &err);
  Py_RETURN_NONE;
}

static PyObject *get_monitor(ksp_EarlyStop *self, void *c) {
  (void)c;
  return ready(self) ? PyUnicode_FromString(self->es.monitor) : NULL;
}
static PyObject *get_mode(ksp_EarlyStop *self, void *c) {
  (void)c;
  return ready(self) ? PyUnicode_FromString(self->es.mode == KS_BEST_MIN ? "min" : "max") : NULL;
}
static PyObject *get_patience(ksp_EarlyStop *self, void *c) {
  (void)c;
  return ready(self) ? PyLong_FromLongLong(self->es.patience) : NULL;
}
static PyObject *get_min_delta(ksp_EarlyStop *self, void *c) {
  (void)c;
  return ready(self) ? PyFloat_FromDouble(self->es.min_delta) : NULL;
}
static PyObject *get_best(ksp_EarlyStop *self, void *c) {
  (void)c;
  if (!ready(self)) return NULL;
  if (!self->es.has_best) Py_RETURN_NONE;
  return PyFloat_FromDouble(self->es.best_score);
}
static PyObject *get_wait(ksp_EarlyStop *self, void *c) {
  (void)c;
  return ready(self) ? PyLong_FromLongLong(self->es.wait_count) : NULL;
}
static PyObject *get_stopped(ksp_EarlyStop *self, void *c) {
  (void)c;
  return ready(self) ? PyLong_FromLongLong(self->es.stopped_epoch) : NULL;
}

static PyMethodDef EarlyStop_methods[] = {
    {"update", (PyCFunction)EarlyStop_update, METH_VARARGS,
     "update($self, value, epoch, /)\n--\n\nRecords the monitored value at the end of epoch; True when training should "
     "stop now (ks_early_stop_update)."},
    {"state_dict", (PyCFunction)EarlyStop_state_dict, METH_NOARGS,
     "state_dict($self)\n--\n\n{monitor, mode, patience, min_delta, best_score, wait_count, stopped_epoch}, as the "
     "library saves them."},
    {"load_state_dict", (PyCFunction)EarlyStop_load_state_dict, METH_O,
     "load_state_dict($self, d, /)\n--\n\nRestores a saved state; another monitor or mode raises MismatchError and "
     "changes nothing."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef EarlyStop_getset[] = {
    {"monitor", (getter)get_monitor, NULL, "the monitored metric", NULL},
    {"mode", (getter)get_mode, NULL, "'min' or 'max'", NULL},
    {"patience", (getter)get_patience, NULL, "epochs without improvement before stopping", NULL},
    {"min_delta", (getter)get_min_delta, NULL, "the least change that counts as an improvement", NULL},
    {"best_score", (getter)get_best, NULL, "the best value so far, or None", NULL},
    {"wait_count", (getter)get_wait, NULL, "epochs since the last improvement", NULL},
    {"stopped_epoch", (getter)get_stopped, NULL, "the epoch at which it fired, or -1", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static const char EarlyStop_doc[] =
    "EarlyStop(monitor, mode='min', patience=3, min_delta=0.0)\n--\n\nThe library's early stopping.";

static PyType_Slot EarlyStop_slots[] = {
    {Py_tp_methods, EarlyStop_methods},
    {Py_tp_getset, EarlyStop_getset},
    {Py_tp_init, KSP_SLOT_FN(EarlyStop_init)},
    {Py_tp_new, KSP_SLOT_FN(PyType_GenericNew)},
    {Py_tp_doc, (void *)EarlyStop_doc},
    {0, NULL}};

static PyType_Spec EarlyStopSpec = {"keepsake._keepsake.EarlyStop", sizeof(ksp_EarlyStop), 0,
                                    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_IMMUTABLETYPE,
                                    EarlyStop_slots};

int ksp_early_add_type(PyObject *m) {
  return ksp_add_type(m, &EarlyStopSpec) ? 0 : -1;
}
