/* torch.save files through the non-executing reader, the .pt writer, and `keepsake convert`. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ksext.h"

PyObject *ksp_torch_load(PyObject *self, PyObject *args, PyObject *kw) {
  (void)self;
  static char *names[] = {"source", "verify_crc", NULL};
  PyObject *src;
  int crc = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|p", names, &src, &crc)) return NULL;
  ks_torch_read_opts o = {.verify_crc = crc};
  ks_statedict *sd = NULL;
  char *structure = NULL;
  ks_error err;
  ks_error_clear(&err);
  ks_status st;
  if (PyObject_CheckBuffer(src)) {
    Py_buffer v;
    if (PyObject_GetBuffer(src, &v, PyBUF_SIMPLE) < 0) return NULL;
    Py_BEGIN_ALLOW_THREADS st = ks_torch_load_buffer_with_structure(v.buf, (size_t)v.len, &o, &sd, &structure, &err);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&v);
  } else {
    PyObject *fs;
    if (!PyUnicode_FSConverter(src, &fs)) return NULL;
    const char *p = PyBytes_AS_STRING(fs);
    Py_BEGIN_ALLOW_THREADS st = ks_torch_load_with_structure(p, &o, &sd, &structure, &err);
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

/* ---- convert: the same steps as tools/cmd_convert.c (ks_torch_import, ks_load, ks_save / ks_torch_save) ---- */

static int is_zip_file(const char *path) {
  unsigned char head[4] = {0};
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return 0;
  ssize_t n = read(fd, head, sizeof head);
  close(fd);
  return n > 0 && ks_torch_is_zip(head, (size_t)n);
}

static int is_legacy_torch(const char *path) {
  unsigned char head[14] = {0};
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return 0;
  ssize_t n = read(fd, head, sizeof head);
  close(fd);
  return n > 0 && ks_torch_is_legacy(head, (size_t)n);
}

static ks_status keep_meta(const ks_meta *meta, ks_meta *extra) {
  const char *k, *v;
  for (size_t i = 0; meta && ks_meta_at(meta, i, &k, &v) == KS_OK; i++) {
    if (!strcmp(k, KS_META_FORMAT) || !strcmp(k, KS_META_FORMAT_VERSION) || !strcmp(k, KS_META_WRITER) ||
        !strcmp(k, KS_META_SCALARS) || !strcmp(k, KS_META_CHECKSUMS))
      continue;
    ks_status st = ks_meta_set(extra, k, v, NULL);
    if (st) return st;
  }
  return KS_OK;
}

static ks_status without_ignored(const ks_statedict *src, char **globs, size_t n, ks_statedict **out) {
  ks_statedict *dst;
  ks_status st = ks_statedict_create(NULL, &dst, NULL);
  ks_entry e;
  for (size_t i = 0; !st && ks_statedict_at(src, i, &e) == KS_OK; i++) {
    int drop = 0;
    for (size_t g = 0; g < n && !drop; g++) drop = ks_path_match(globs[g], e.name);
    if (!drop) st = ks_statedict_set_entry(dst, e.name, &e, KS_BORROW, NULL);
  }
  if (st) ks_statedict_free(dst);
  else *out = dst;
  return st;
}

/* As the CLI: the structure document without the containers the globs drop, kept in extra and in
   *out (malloc'd; NULL when there is none). */
static ks_status structure_without_ignored(ks_meta *extra, char **globs, size_t n, char **out) {
  const char *text = ks_meta_get(extra, KS_TORCH_STRUCTURE_META);
  *out = NULL;
  if (!text) return KS_OK;
  json_t *doc = json_loads(text, JSON_REJECT_DUPLICATES, NULL);
  json_t *containers = json_object_get(doc, "containers");
  const char *path;
  json_t *v, *tmp;
  json_object_foreach_safe(containers, tmp, path, v) {
    int drop = 0;
    for (size_t g = 0; g < n && !drop; g++) drop = *path && ks_path_match(globs[g], path);
    if (drop) json_object_del(containers, path);
  }
  *out = doc ? json_dumps(doc, JSON_COMPACT | JSON_PRESERVE_ORDER) : strdup(text);
  json_decref(doc);
  if (!*out) return KS_E_NOMEM;
  return ks_meta_set(extra, KS_TORCH_STRUCTURE_META, *out, NULL);
}

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && !strcmp(s + n - m, suffix);
}

typedef struct conv {
  const char *in, *out;
  char **globs;
  size_t n_globs;
  int salvage, torch_compat;
  size_t kept, total;
} conv;

/* As the CLI: OUT is replaced only when absent or a writable regular file (a symlink is not followed). */
static ks_status check_output(const char *out, ks_error *err) {
  struct stat sb;
  if (lstat(out, &sb) != 0) return errno == ENOENT ? KS_OK : KS_E_IO;
  if (S_ISREG(sb.st_mode) && access(out, W_OK) == 0) return KS_OK;
  ks_error_clear(err);
  err->code = KS_E_INVALID;
  snprintf(err->file, sizeof err->file, "%s", out);
  snprintf(err->message, sizeof err->message, "%s", S_ISREG(sb.st_mode) ? "output file is not writable: left alone"
           : "output is not a regular file (symlink, directory, device or FIFO): left alone");
  return KS_E_INVALID;
}

static ks_status run_convert(conv *c, ks_error *err) {
  ks_statedict *sd = NULL, *kept = NULL;
  ks_meta *meta = NULL, *extra = NULL;
  ks_status st = check_output(c->out, err);
  /* The input's integrity is checked first (zip CRC32s, keepsake checksums) unless salvaging. */
  ks_torch_read_opts tro = {.verify_crc = !c->salvage};
  ks_import_opts io = {.read = &tro};
  ks_read_opts ro = {.mode = KS_READ_COPY, .verify_checksums = !c->salvage};
  if (st) {
  } else if (is_zip_file(c->in) || is_legacy_torch(c->in)) {
    st = ks_torch_import(c->in, &io, &sd, &extra, err);
  } else {
    st = ks_meta_create(NULL, &extra, NULL);
    if (!st && (st = ks_load(c->in, &ro, &sd, &meta, err)) == KS_OK) st = keep_meta(meta, extra);
  }
  char *structure = NULL;
  if (!st) st = without_ignored(sd, c->globs, c->n_globs, &kept);
  if (!st) st = structure_without_ignored(extra, c->globs, c->n_globs, &structure);
  if (!st && (ends_with(c->out, ".pt") || ends_with(c->out, ".pth"))) {
    ks_torch_write_opts wo = {0};
    wo.torch_compat = c->torch_compat;
    wo.structure = structure;
    st = ks_torch_save(c->out, kept, &wo, err);
  } else if (!st) {
    st = ks_save(c->out, kept, extra, NULL, err);
  }
  if (!st) {
    c->kept = ks_statedict_count(kept);
    c->total = ks_statedict_count(sd);
  }
  free(structure);
  ks_statedict_free(kept);
  ks_statedict_free(sd);
  ks_meta_free(meta);
  ks_meta_free(extra);
  return st;
}

PyObject *ksp_convert(PyObject *self, PyObject *args, PyObject *kw) {
  (void)self;
  static char *names[] = {"src", "dst", "ignore", "salvage", "torch_compat", NULL};
  PyObject *in, *out, *ignore = NULL;
  int salvage = 0, compat = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O&|Opp", names, PyUnicode_FSConverter, &in, PyUnicode_FSConverter,
                                   &out, &ignore, &salvage, &compat))
    return NULL;
  PyObject *globs = !ignore || ignore == Py_None ? PyTuple_New(0) : (Py_INCREF(ignore), ignore);
  PyObject *seq = globs ? PySequence_Fast(globs, "ignore must be a sequence of str") : NULL;
  Py_XDECREF(globs);
  conv c = {PyBytes_AS_STRING(in), PyBytes_AS_STRING(out), NULL, 0, salvage, compat, 0, 0};
  PyObject *result = NULL;
  if (seq) {
    c.n_globs = (size_t)PySequence_Fast_GET_SIZE(seq);
    c.globs = PyMem_Calloc(c.n_globs + 1, sizeof *c.globs);
  }
  for (size_t i = 0; c.globs && i < c.n_globs; i++)
    if (!(c.globs[i] = (char *)PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(seq, (Py_ssize_t)i)))) break;
  if (c.globs && !PyErr_Occurred()) {
    ks_error err;
    ks_error_clear(&err);
    ks_status st;
    Py_BEGIN_ALLOW_THREADS st = run_convert(&c, &err);
    Py_END_ALLOW_THREADS
    if (st && !err.file[0]) snprintf(err.file, sizeof err.file, "%s", c.in);
    result = st ? ksp_raise(st, &err) : Py_BuildValue("(nn)", (Py_ssize_t)c.kept, (Py_ssize_t)(c.total - c.kept));
  } else if (!PyErr_Occurred()) {
    PyErr_NoMemory();
  }
  PyMem_Free(c.globs);
  Py_XDECREF(seq);
  Py_DECREF(in);
  Py_DECREF(out);
  return result;
}
