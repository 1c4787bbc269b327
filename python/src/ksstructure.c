/*
 * Structure: the library's structure document (include/keepsake/binding/structure.h) for the Python
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
    "Structure()\n--\n\nThe structure document of the values being flattened (include/keepsake/binding/structure.h).";

static PyType_Slot structure_slots[] = {
    {Py_tp_dealloc, KSP_SLOT_FN(structure_dealloc)},
    {Py_tp_methods, structure_methods},
    {Py_tp_new, KSP_SLOT_FN(structure_new)},
    {Py_tp_doc, (void *)structure_doc},
    {0, NULL}};

static PyType_Spec StructureSpec = {"keepsake._keepsake.Structure", sizeof(StructureObject), 0,
                                    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE, structure_slots};

/* ---- the read side: ks_structure_plan as nested tuples ---- */

static PyObject *key_object(const ks_key *k) {
  switch (k->type) {
    case KS_KEY_INT: return PyLong_FromLongLong((long long)k->i);
    case KS_KEY_BOOL: return PyBool_FromLong(k->i != 0);
    case KS_KEY_FLOAT: return PyFloat_FromDouble(k->f);
    case KS_KEY_STR: return PyUnicode_DecodeUTF8(k->str, (Py_ssize_t)k->len, "surrogatepass");
    default: Py_RETURN_NONE;
  }
}

typedef struct plan_ctx {
  const ks_plan *plan;
  PyObject **values; /* the items' values, by name index (borrowed) */
  const char *const *names;
  const size_t *lens;
  size_t prefix_len;
} plan_ctx;

/* (0, path, value, leaf kind or None); (tag, [(key, child)], int_keys) for containers, a
   KS_PLAN_GUESS folder's children as (key, child, name as str, decimal value or None); (7,). */
static PyObject *plan_object(const plan_ctx *c, size_t id) {
  static const char *const leaf_kinds[] = {NULL, "bigint", "ndarray", "bytes"};
  const ks_plan_node *n = ks_plan_at(c->plan, id);
  if (n->tag == KS_PLAN_NONE) return Py_BuildValue("(i)", (int)n->tag);
  if (n->tag == KS_PLAN_LEAF) {
    const char *kind = n->leaf_kind > 0 && n->leaf_kind < 4 ? leaf_kinds[n->leaf_kind] : NULL;
    return Py_BuildValue("(is#Oz)", 0, c->names[n->name] + c->prefix_len,
                         (Py_ssize_t)(c->lens[n->name] - c->prefix_len), c->values[n->name], kind);
  }
  PyObject *kids = PyList_New((Py_ssize_t)n->n);
  for (size_t i = 0; kids && i < n->n; i++) {
    size_t kid = ks_plan_child(c->plan, n->first + i);
    const ks_plan_node *k = ks_plan_at(c->plan, kid);
    PyObject *key = key_object(&k->key), *child = key ? plan_object(c, kid) : NULL, *item = NULL;
    if (child && n->tag == KS_PLAN_GUESS) {
      PyObject *text = key_object(&k->text);
      PyObject *index = k->index >= 0 ? PyLong_FromLongLong((long long)k->index) : Py_NewRef(Py_None);
      item = text && index ? PyTuple_Pack(4, key, child, text, index) : NULL;
      Py_XDECREF(text);
      Py_XDECREF(index);
    } else if (child) {
      item = PyTuple_Pack(2, key, child);
    }
    Py_XDECREF(key);
    Py_XDECREF(child);
    if (!item) Py_CLEAR(kids);
    else if (PyList_SetItem(kids, (Py_ssize_t)i, item) < 0) Py_CLEAR(kids);
  }
  if (!kids) return NULL;
  PyObject *out = Py_BuildValue("(iNO)", (int)n->tag, kids, n->int_keys ? Py_True : Py_False);
  return out;
}

/* structure_plan(document, pytree, items, prefix): ks_structure_plan over the str keys of `items`. */
PyObject *ksp_structure_plan(PyObject *self, PyObject *args) {
  (void)self;
  const char *doc = NULL, *table = NULL, *prefix = "";
  Py_ssize_t doc_len = 0, table_len = 0;
  PyObject *items;
  if (!PyArg_ParseTuple(args, "z#z#O!s", &doc, &doc_len, &table, &table_len, &PyDict_Type, &items, &prefix))
    return NULL;
  size_t n = (size_t)PyDict_Size(items);
  const char **names = PyMem_Calloc(n ? n : 1, sizeof *names);
  size_t *lens = PyMem_Calloc(n ? n : 1, sizeof *lens);
  PyObject **values = PyMem_Calloc(n ? n : 1, sizeof *values);
  PyObject *out = NULL, *k, *v;
  if (!names || !lens || !values) {
    PyErr_NoMemory();
    goto done;
  }
  Py_ssize_t pos = 0;
  for (size_t i = 0; PyDict_Next(items, &pos, &k, &v) && i < n; i++) {
    Py_ssize_t len = 0;
    if (!PyUnicode_Check(k)) continue; /* not a name: not in the tree */
    if (!(names[i] = PyUnicode_AsUTF8AndSize(k, &len))) goto done;
    lens[i] = (size_t)len, values[i] = v;
  }
  ks_plan *plan = NULL;
  ks_error err;
  ks_error_clear(&err);
  ks_status st = ks_structure_plan(doc, (size_t)doc_len, table, (size_t)table_len, names, lens, n, prefix, NULL,
                                   &plan, &err);
  if (st) {
    ksp_raise(st, &err);
    goto done;
  }
  plan_ctx c = {plan, values, names, lens, strlen(prefix)};
  out = plan_object(&c, 0);
  ks_plan_free(plan);
done:
  PyMem_Free(names);
  PyMem_Free(lens);
  PyMem_Free(values);
  return out;
}

int ksp_structure_add_type(PyObject *m) {
  return ksp_add_type(m, &StructureSpec) ? 0 : -1;
}
