/*
 * LoadReport's text: the library's own ks_load_report_print over the report's items, so a
 * Python report prints exactly as a C program's does (one printer, not two).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ksext.h"

/* The ks_load_kind named `name` ("loaded", ...); -1 when none is. */
static int kind_of(const char *name) {
  for (int k = KS_LOAD_LOADED; k <= KS_LOAD_MISMATCHED; k++)
    if (!strcmp(ks_load_kind_name((ks_load_kind)k), name)) return k;
  return -1;
}

/* Adds (kind, path, reason) tuples to r; 0, or -1 with a Python exception set. */
static int add_items(ks_load_report *r, PyObject *items) {
  PyObject *seq = PySequence_Fast(items, "report_text: items must be a sequence of (kind, path, reason)");
  if (!seq) return -1;
  int rc = 0;
  for (Py_ssize_t i = 0; !rc && i < PySequence_Fast_GET_SIZE(seq); i++) {
    const char *kind, *path, *reason;
    PyObject *t = PySequence_Fast_GET_ITEM(seq, i);
    if (!PyArg_ParseTuple(t, "sss", &kind, &path, &reason)) {
      rc = -1;
      break;
    }
    int k = kind_of(kind);
    ks_error err;
    ks_error_clear(&err);
    ks_status st = k < 0 ? KS_E_INVALID : ks_load_report_add(r, (ks_load_kind)k, path, reason, &err);
    if (st) {
      if (k < 0) ksp_raisef(KS_E_INVALID, "report_text: '%s' is not a load report kind", kind);
      else ksp_raise(st, &err);
      rc = -1;
    }
  }
  Py_DECREF(seq);
  return rc;
}

PyObject *ksp_report_text(PyObject *self, PyObject *items) {
  (void)self;
  ks_load_report *r = NULL;
  ks_error err;
  ks_error_clear(&err);
  ks_status st = ks_load_report_create(NULL, &r, &err);
  if (st) return ksp_raise(st, &err);
  PyObject *out = NULL;
  if (!add_items(r, items)) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) {
      ksp_raisef(KS_E_NOMEM, "report_text: out of memory");
    } else {
      ks_load_report_print(r, f);
      if (fclose(f) == 0) out = PyUnicode_DecodeUTF8(buf, (Py_ssize_t)len, "replace");
      else ksp_raisef(KS_E_NOMEM, "report_text: out of memory");
    }
    free(buf);
  }
  ks_load_report_free(r);
  return out;
}
