/*
 * Structure: the library's structure document (include/keepsake/structure.h) for the Python
 * flattener. Python walks its objects; every container, dict key and special leaf it meets is
 * handed here, and the library names the keys, refuses what cannot be told apart and writes the
 * document. The binding only converts Python keys to ks_key.
 */
#include <string.h>

#include "ksext.h"

typedef struct {
  PyObject_HEAD
  ks_structure *s;
} StructureObject;

static PyObject *structure_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  (void)args, (void)kw;
  StructureObject *self = (StructureObject *)PyType_GenericAlloc(type, 0);
  if (!self) return NULL;
  ks_error err;
  ks_error_clear(&err);
  ks_status st = ks_structure_create(NULL, &self->s, &err);
  if (st) {
    Py_DECREF(self);
    return ksp_raise(st, &err);
  }
  return (PyObject *)self;
}

static void structure_dealloc(StructureObject *self) {
  ks_structure_free(self->s);
  ksp_free_self((PyObject *)self);
}

/* k from a Python key; 0, or -1 with an exception naming `path`. Borrows str data from `o`. */
static int to_key(PyObject *o, const char *path, ks_key *k) {
  *k = (ks_key){.type = KS_KEY_STR};
  if (PyUnicode_Check(o)) {
    Py_ssize_t n;
    k->str = PyUnicode_AsUTF8AndSize(o, &n);
    if (!k->str) {
      PyErr_Clear();
      ksp_raisef(KS_E_VALUE, "a str key of the dict at '%s' is not valid UTF-8", path);
      return -1;
    }
    k->len = (size_t)n;
  } else if (o == Py_None) {
    k->type = KS_KEY_NONE;
  } else if (PyBool_Check(o)) {
    k->type = KS_KEY_BOOL, k->i = o == Py_True;
  } else if (PyLong_Check(o)) {
    int overflow = 0;
    k->type = KS_KEY_INT, k->i = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (k->i == -1 && PyErr_Occurred())) {
      PyErr_Clear();
      ksp_raisef(KS_E_UNSUPPORTED, "an int key of the dict at '%s' is outside int64", path);
      return -1;
    }
  } else if (PyFloat_Check(o)) {
    k->type = KS_KEY_FLOAT, k->f = PyFloat_AS_DOUBLE(o);
  } else {
    char tname[128];
    ksp_raisef(KS_E_UNSUPPORTED, "cannot store a dict key of type %s (the dict at '%s'): str, int, bool, None and "
               "float keys are stored", ksp_type_name(o, tname, sizeof tname), path);
    return -1;
  }
  return 0;
}

/* The name component of key k (the Python object o): o itself when it is a str needing no escape. */
static PyObject *key_text(PyObject *o, const ks_key *k) {
  if (k->type == KS_KEY_STR && !memchr(k->str, '/', k->len) && !memchr(k->str, '%', k->len)) {
    Py_INCREF(o);
    return o;
  }
  size_t cap = k->type == KS_KEY_STR ? 3 * k->len + 1 : 48, len;
  char *buf = PyMem_Malloc(cap);
  if (!buf) return PyErr_NoMemory();
  ks_error err;
  ks_error_clear(&err);
  ks_status st = ks_key_text(k, buf, cap, &len, &err);
  PyObject *out = st ? ksp_raise(st, &err) : PyUnicode_DecodeUTF8(buf, (Py_ssize_t)len, "strict");
  PyMem_Free(buf);
  return out;
}

/* dict(path, keys) -> [name component of each key]: ks_structure_add_dict. */
static PyObject *structure_dict(StructureObject *self, PyObject *args) {
  const char *path;
  PyObject *keys;
  if (!PyArg_ParseTuple(args, "sO:dict", &path, &keys)) return NULL;
  PyObject *seq = PySequence_Fast(keys, "dict: keys must be a sequence");
  if (!seq) return NULL;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  ks_key small[16], *k = n <= 16 ? small : PyMem_Calloc((size_t)n, sizeof *k);
  PyObject *texts = k ? PyList_New(n) : PyErr_NoMemory();
  for (Py_ssize_t i = 0; texts && i < n; i++) {
    PyObject *o = PySequence_Fast_GET_ITEM(seq, i), *t = NULL;
    if (!to_key(o, path, &k[i])) t = key_text(o, &k[i]);
    if (!t) Py_CLEAR(texts);
    else PyList_SET_ITEM(texts, i, t);
  }
  if (texts) {
    ks_error err;
    ks_error_clear(&err);
    ks_status st = ks_structure_add_dict(self->s, path, k, (size_t)n, &err);
    if (st) {
      Py_CLEAR(texts);
      ksp_raise(st, &err);
    }
  }
  if (k != small) PyMem_Free(k);
  Py_DECREF(seq);
  return texts;
}

/* The value of `name` in names[] (NULL-terminated) as its 1-based position; 0 when absent. */
static int lookup(const char *name, const char *const *names) {
  for (int i = 0; names[i]; i++)
    if (!strcmp(name, names[i])) return i + 1;
  return 0;
}

static PyObject *done(ks_status st, const ks_error *err) {
  if (st) return ksp_raise(st, err);
  Py_RETURN_NONE;
}

/* seq(path, kind, n): ks_structure_add_sequence; kind "list", "tuple" or "set". */
static PyObject *structure_seq(StructureObject *self, PyObject *args) {
  static const char *const kinds[] = {"list", "tuple", "set", NULL};
  const char *path, *kind;
  unsigned long long n;
  if (!PyArg_ParseTuple(args, "ssK:seq", &path, &kind, &n)) return NULL;
  ks_error err;
  ks_error_clear(&err);
  int k = lookup(kind, kinds); /* KS_CONTAINER_LIST = 1, TUPLE = 2, SET = 3 */
  return done(ks_structure_add_sequence(self->s, path, (ks_container_kind)(k ? k : -1), n, &err), &err);
}

/* leaf(path, kind): ks_structure_add_leaf; kind "bigint", "ndarray" or "bytes". */
static PyObject *structure_leaf(StructureObject *self, PyObject *args) {
  static const char *const kinds[] = {"bigint", "ndarray", "bytes", NULL};
  const char *path, *kind;
  if (!PyArg_ParseTuple(args, "ss:leaf", &path, &kind)) return NULL;
  ks_error err;
  ks_error_clear(&err);
  int k = lookup(kind, kinds); /* KS_LEAF_BIGINT = 1, NDARRAY = 2, BYTES = 3 */
  return done(ks_structure_add_leaf(self->s, path, (ks_leaf_kind)(k ? k : -1), &err), &err);
}

/* dump() -> the document's JSON text, or None when nothing was recorded. */
static PyObject *structure_dump(StructureObject *self, PyObject *unused) {
  (void)unused;
  if (ks_structure_is_empty(self->s)) Py_RETURN_NONE;
  char *json = NULL;
  ks_error err;
  ks_error_clear(&err);
  ks_status st = ks_structure_dump(self->s, &json, &err);
  PyObject *out = st ? ksp_raise(st, &err) : PyUnicode_FromString(json);
  ks_structure_text_free(self->s, json);
  return out;
}

static PyMethodDef structure_methods[] = {
    {"dict", (PyCFunction)structure_dict, METH_VARARGS,
     "dict($self, path, keys, /)\n--\n\n"
     "Records the dict at path; returns the name component of each key (ks_key_text)."},
    {"seq", (PyCFunction)structure_seq, METH_VARARGS,
     "seq($self, path, kind, n, /)\n--\n\nRecords the list, tuple or set at path and its item count."},
    {"leaf", (PyCFunction)structure_leaf, METH_VARARGS,
     "leaf($self, path, kind, /)\n--\n\nRecords that path holds a bigint, ndarray or bytes leaf."},
    {"dump", (PyCFunction)structure_dump, METH_NOARGS,
     "dump($self)\n--\n\nThe structure document (keepsake.torch_structure) as JSON, or None when empty."},
    {NULL, NULL, 0, NULL}};

static const char structure_doc[] =
    "Structure()\n--\n\nThe structure document of the values being flattened (include/keepsake/structure.h).";

static PyType_Slot structure_slots[] = {
    {Py_tp_dealloc, KSP_SLOT_FN(structure_dealloc)},
    {Py_tp_methods, structure_methods},
    {Py_tp_new, KSP_SLOT_FN(structure_new)},
    {Py_tp_doc, (void *)structure_doc},
    {0, NULL}};

static PyType_Spec StructureSpec = {"keepsake._keepsake.Structure", sizeof(StructureObject), 0,
                                    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE, structure_slots};

int ksp_structure_add_type(PyObject *m) {
  return ksp_add_type(m, &StructureSpec) ? 0 : -1;
}
