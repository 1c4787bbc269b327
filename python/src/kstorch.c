/* torch.save files through the non-executing reader, the .pt writer, and `keepsake convert`. */
#include <stdlib.h>
#include <string.h>

#include "ksext.h"

PyObject *ksp_torch_load(PyObject *self, PyObject *args, PyObject *kw) {
  (void)self;
  static char *names[] = {"source", "verify_crc", NULL};
  PyObject *src;
  int crc = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|p", names, &src, &crc)) return NULL;
  /* The POSIX table without map_fn: the file is read into memory (torch.h), never mapped, so a
   * file another program truncates meanwhile gives an error, not SIGBUS. Every value is copied
   * out for Python anyway. */
  ks_io io = *ks_io_posix();
  io.map_fn = NULL;
  io.unmap_fn = NULL;
  ks_torch_read_opts o = {.verify_crc = crc, .io = &io};
  ks_statedict *sd = NULL;
  char *structure = NULL;
  ks_error err;
  ks_error_clear(&err);
  ks_status st;
  if (PyObject_CheckBuffer(src)) {
    Py_buffer v;
    if (PyObject_GetBuffer(src, &v, PyBUF_SIMPLE) < 0) return NULL;
    o.data = v.buf;
    o.data_len = (size_t)v.len;
    Py_BEGIN_ALLOW_THREADS st = ks_torch_load(NULL, &o, &sd, &structure, &err);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&v);
  } else {
    PyObject *fs;
    if (!PyUnicode_FSConverter(src, &fs)) return NULL;
    const char *p = PyBytes_AS_STRING(fs);
    Py_BEGIN_ALLOW_THREADS st = ks_torch_load(p, &o, &sd, &structure, &err);
    Py_END_ALLOW_THREADS
    ksp_error_path(&err, p);
    Py_DECREF(fs);
  }
  if (st) return ksp_raise(st, &err);
  PyObject *items = ksp_statedict_items(sd);
  PyObject *doc = items && structure ? PyUnicode_FromString(structure) : NULL;
  PyObject *out = items && (doc || !structure) ? Py_BuildValue("(OO)", items, doc ? doc : Py_None) : NULL;
  Py_XDECREF(items);
  Py_XDECREF(doc);
  ks_torch_free(NULL, structure);
  ks_statedict_free(sd);
  return out;
}

PyObject *ksp_torch_save(PyObject *self, PyObject *args, PyObject *kw) {
  (void)self;
  static char *names[] = {"path", "entries", "fsync", NULL};
  PyObject *path, *entries;
  int fsync = 1;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O|p", names, PyUnicode_FSConverter, &path, &entries, &fsync))
    return NULL;
  ks_statedict *sd = ksp_statedict_from(entries);
  if (!sd) {
    Py_DECREF(path);
    return NULL;
  }
  ks_io io;
  ks_torch_write_opts o = {.io = ksp_io_posix(fsync, &io)};
  ks_error err;
  ks_error_clear(&err);
  ks_status st;
  const char *p = PyBytes_AS_STRING(path);
  Py_BEGIN_ALLOW_THREADS st = ks_torch_save(p, sd, &o, &err);
  Py_END_ALLOW_THREADS
  ks_statedict_free(sd);
  Py_DECREF(path);
  if (st) return ksp_raise(st, &err);
  Py_RETURN_NONE;
}

/* ---- convert: the library's ks_convert (convert.h), as `keepsake convert` ---- */

/* What --salvage prints on stderr, as RuntimeWarnings; -1 when a warning was turned into an error. */
static int warn_salvaged(const ks_convert_report *rep) {
  size_t n = ks_convert_report_warning_count(rep);
  char line[KS_ERROR_MSG_MAX + 3 * KS_ERROR_WHERE_MAX];
  for (size_t i = 0; i < n; i++) {
    const ks_error *w = ks_convert_report_warning(rep, i);
    if (w && PyErr_WarnFormat(PyExc_RuntimeWarning, 1, "salvaged despite: %s", ks_error_format(w, line, sizeof line)))
      return -1;
  }
  if (n > KS_CONVERT_MAX_WARNINGS &&
      PyErr_WarnFormat(PyExc_RuntimeWarning, 1, "salvaged despite %zu more problems", n - KS_CONVERT_MAX_WARNINGS))
    return -1;
  return 0;
}

PyObject *ksp_convert(PyObject *self, PyObject *args, PyObject *kw) {
  (void)self;
  static char *names[] = {"src", "dst", "ignore", "salvage", "torch_compat", "hf", "hf_shard_bytes", NULL};
  PyObject *in, *out, *ignore = NULL;
  int salvage = 0, compat = 0, hf = 0;
  unsigned long long hf_shard_bytes = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O&|OpppK", names, PyUnicode_FSConverter, &in, PyUnicode_FSConverter,
                                   &out, &ignore, &salvage, &compat, &hf, &hf_shard_bytes))
    return NULL;
  PyObject *globs = !ignore || ignore == Py_None ? PyTuple_New(0) : (Py_INCREF(ignore), ignore);
  PyObject *seq = globs ? PySequence_Fast(globs, "ignore must be a sequence of str") : NULL;
  Py_XDECREF(globs);
  ks_convert_opts o = {0};
  o.size = sizeof o;
  o.salvage = salvage;
  o.torch_compat = compat ? KS_TORCH_COMPAT_1_13 : 0;
  o.hf = hf;
  o.hf_shard_bytes = hf_shard_bytes;
  const char **g = NULL;
  PyObject *result = NULL;
  if (seq) {
    o.n_ignore = (size_t)PySequence_Fast_GET_SIZE(seq);
    g = PyMem_Calloc(o.n_ignore + 1, sizeof *g);
  }
  for (size_t i = 0; g && i < o.n_ignore; i++)
    if (!(g[i] = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(seq, (Py_ssize_t)i)))) break;
  o.ignore = g;
  if (g && !PyErr_Occurred()) {
    ks_error err;
    ks_error_clear(&err);
    ks_convert_report *rep = NULL;
    ks_status st;
    ks_storage *src = NULL, *dst = NULL;
    const char *src_path = NULL, *dst_path = NULL;
    /* Either side may be a storage location (s3://, http(s):// for the input): its table and path. */
    Py_BEGIN_ALLOW_THREADS st = ksp_location(PyBytes_AS_STRING(in), NULL, &src, &o.in_io, &src_path, &err);
    if (!st) st = ksp_location(PyBytes_AS_STRING(out), NULL, &dst, &o.io, &dst_path, &err);
    if (!st) st = ks_convert(src_path, dst_path, &o, &rep, &err);
    ks_storage_free(src);
    ks_storage_free(dst);
    Py_END_ALLOW_THREADS
    if (warn_salvaged(rep)) result = NULL;
    else result = st ? ksp_raise(st, &err)
                     : Py_BuildValue("(nn)", (Py_ssize_t)ks_convert_report_written(rep),
                                (Py_ssize_t)ks_convert_report_ignored(rep));
    ks_convert_report_free(rep);
  } else if (!PyErr_Occurred()) {
    PyErr_NoMemory();
  }
  PyMem_Free(g);
  Py_XDECREF(seq);
  Py_DECREF(in);
  Py_DECREF(out);
  return result;
}
