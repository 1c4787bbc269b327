/*
 * keepsake._keepsake.Reader: an open keepsake or safetensors file.
 *
 * Two backends, as safetensors 0.8 has "mmap" and "pread":
 *  - "mmap" (the default): the file is mapped privately and writable (copy on
 *    write): tensors built over the mapping with torch.frombuffer /
 *    numpy.frombuffer are zero-copy, may be written to, and never change the
 *    file. The reader validates the mapping with ks_reader_open_buffer, so every
 *    structural rule of the format is checked before any tensor is handed out.
 *    A mapping promises the file's pages only while nobody truncates the file:
 *    touching a view past a new end raises SIGBUS (format.h, "What the mapped
 *    mode promises").
 *  - "read": the whole file is read into memory the reader owns (the
 *    library's POSIX table: open_fn, read_fn); nothing is mapped, so a file
 *    truncated or rewritten while it is read gives an error, never a signal,
 *    and the tensors never change afterwards.
 * The Reader exports the file's bytes (the mapping or the copy) through the
 * buffer protocol; every consumer holds a reference, so the memory lives as long
 * as the last tensor over it.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ksext.h"

typedef struct {
  PyObject_HEAD
  ks_reader *r;
  void *map;     /* our mapping of the file, or NULL */
  size_t map_len;
  char *heap;    /* our copy of the bytes (data=, or the "read" backend), malloc'd, or NULL */
  uint8_t *base; /* start of the file's bytes (ours, or the reader's copy in "read" mode) */
  size_t len;
  PyObject *path;   /* str, for Python (surrogate-escaped like os.fsdecode) */
  PyObject *fspath; /* bytes, the same path for C messages (or "<buffer>") */
  int opening;      /* __init__ runs without the GIL: a second __init__ meanwhile is refused */
} ksp_Reader;

/* The path for ks_error messages: never NULL, never raises (a str path may hold surrogates). */
static const char *reader_cpath(const ksp_Reader *self) {
  return self->fspath ? PyBytes_AS_STRING(self->fspath) : "<buffer>";
}

static int fail_io(ks_error *err, const char *path, const char *what) {
  ks_error_clear(err);
  err->code = KS_E_IO;
  snprintf(err->file, sizeof err->file, "%s", path);
  snprintf(err->message, sizeof err->message, "%s: %s", what, strerror(errno));
  return KS_E_IO;
}

/* Maps `path` copy-on-write. Refuses anything but a regular file (a FIFO would block). */
static KS_NODISCARD ks_status map_file(ksp_Reader *self, const char *path, ks_error *err) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return fail_io(err, path, "cannot open file");
  struct stat sb;
  ks_status st = KS_OK;
  if (fstat(fd, &sb) != 0) st = fail_io(err, path, "cannot stat file");
  else if (!S_ISREG(sb.st_mode)) {
    errno = EINVAL;
    st = fail_io(err, path, "not a regular file");
  } else if (sb.st_size == 0) {
    self->heap = malloc(1); /* an empty file: the reader reports it as truncated (no GIL: not PyMem) */
    self->base = (uint8_t *)self->heap;
    if (!self->heap) st = KS_E_NOMEM;
  } else {
    void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) st = fail_io(err, path, "cannot map file");
    else {
      self->map = p;
      self->map_len = (size_t)sb.st_size;
      self->base = p;
      self->len = (size_t)sb.st_size;
    }
  }
  close(fd);
  return st;
}

static KS_NODISCARD ks_status copy_bytes(ksp_Reader *self, PyObject *src) {
  Py_buffer view;
  if (PyObject_GetBuffer(src, &view, PyBUF_SIMPLE) < 0) return KS_E_INVALID;
  self->heap = malloc(view.len ? (size_t)view.len : 1);
  if (self->heap) memcpy(self->heap, view.buf, (size_t)view.len);
  self->base = (uint8_t *)self->heap;
  self->len = (size_t)view.len;
  PyBuffer_Release(&view);
  return self->heap ? KS_OK : KS_E_NOMEM;
}

/*
 * A large copy costs its first-touch page faults more than its read(): transparent huge pages
 * over the buffer cut them 512-fold where the kernel allows it (a hint; the library's own copies
 * in src/core/fmap.c ask the same).
 */
static void advise_huge(void *p, size_t size) {
#ifdef MADV_HUGEPAGE
  const uintptr_t huge = (uintptr_t)2 << 20;
  uintptr_t begin = ((uintptr_t)p + huge - 1) & ~(huge - 1), end = ((uintptr_t)p + size) & ~(huge - 1);
  if (end > begin) (void)madvise((void *)begin, end - begin, MADV_HUGEPAGE);
#else
  (void)p;
  (void)size;
#endif
}

/*
 * "read" backend: the whole file read into memory the reader owns, through the library's POSIX
 * table (open_fn, then read_fn until the size open_fn gave), never mapped. The bytes are then
 * validated and served exactly as a mapping's are. A file that shrinks while it is read gives
 * KS_E_IO ("changed while it was read"), never a signal.
 */
static KS_NODISCARD ks_status read_copy(ksp_Reader *self, const char *path, const ks_io *io, ks_error *err) {
  int fd = -1;
  uint64_t size = 0;
  int rc = io->open_fn(io->ctx, path, &fd, &size);
  if (rc) return errno = rc, fail_io(err, path, "cannot open file");
  ks_status st = size > (uint64_t)(SIZE_MAX - 1) ? KS_E_LIMIT : KS_OK;
  self->heap = st ? NULL : malloc(size ? (size_t)size : 1); /* no GIL here: not PyMem */
  if (!st && !self->heap) st = KS_E_NOMEM;
  if (!st) advise_huge(self->heap, (size_t)size);
  size_t off = 0;
  while (!st && off < size) {
    size_t got = 0;
    rc = io->read_fn(io->ctx, fd, self->heap + off, (size_t)size - off, off, &got);
    if (rc) st = (errno = rc, fail_io(err, path, "cannot read file"));
    else if (!got) st = (errno = EIO, fail_io(err, path, "file shrank while it was read"));
    off += got;
  }
  (void)io->close_fn(io->ctx, fd);
  if (st == KS_E_LIMIT) {
    ks_error_clear(err);
    err->code = st;
    snprintf(err->file, sizeof err->file, "%s", path);
    snprintf(err->message, sizeof err->message, "file of %llu bytes does not fit in memory", (unsigned long long)size);
  }
  if (st == KS_E_NOMEM) {
    ks_error_clear(err);
    err->code = st;
    snprintf(err->message, sizeof err->message, "out of memory for a copy of %llu bytes", (unsigned long long)size);
  }
  self->base = (uint8_t *)self->heap;
  self->len = (size_t)size;
  return st;
}

/* read_copy of a location: a path through ks_io_posix(), s3:// or http(s):// through the storage layer. */
static KS_NODISCARD ks_status remote_or_local_copy(ksp_Reader *self, const char *loc, ks_error *err) {
  ks_storage *store = NULL;
  const ks_io *io = NULL;
  const char *path = NULL;
  ks_status st = ksp_location(loc, ks_io_posix(), &store, &io, &path, err);
  if (!st) st = read_copy(self, path, io, err);
  ks_storage_free(store);
  return st;
}

static int reader_init(ksp_Reader *self, PyObject *args, PyObject *kw) {
  static char *names[] = {"path", "verify", "backend", "data", NULL};
  PyObject *src = Py_None, *data = NULL;
  int verify = 0;
  const char *backend = "mmap";
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|OpsO", names, &src, &verify, &backend, &data)) return -1;
  if (self->r || self->base || self->path || self->opening) {
    PyErr_SetString(PyExc_RuntimeError, "Reader is already open");
    return -1;
  }
  int copy = !strcmp(backend, "read");
  if (!copy && strcmp(backend, "mmap")) {
    ksp_raisef(KS_E_INVALID, "backend '%s': use 'mmap' (map the file) or 'read' (copy it into memory)", backend);
    return -1;
  }
  if ((src == Py_None) == (data == NULL || data == Py_None)) {
    PyErr_SetString(PyExc_TypeError, "Reader takes a path or data=, exactly one of them");
    return -1;
  }
  ks_error err;
  ks_error_clear(&err);
  ks_status st;
  PyObject *fs = NULL;
  /* The reader is published in self->r only once complete and with the GIL held: another
   * thread calling a method meanwhile sees "not open", never a reader being built or freed. */
  ks_reader *r = NULL;
  if (src == Py_None) {
    /* Contents only through data=: a bytes object given as the path is a path, as for os.open. */
    st = copy_bytes(self, data);
    if (st == KS_E_INVALID) return -1;
  } else {
    if (!PyUnicode_FSConverter(src, &fs)) return -1;
    const char *p = PyBytes_AS_STRING(fs);
    self->opening = 1;
    if (copy || ksp_is_remote(p)) { /* a remote object is always read: nothing to map */
      Py_BEGIN_ALLOW_THREADS st = remote_or_local_copy(self, p, &err);
      Py_END_ALLOW_THREADS
    } else {
      Py_BEGIN_ALLOW_THREADS st = map_file(self, p, &err);
      Py_END_ALLOW_THREADS
    }
  }
  if (!st && !r) {
    ks_read_opts o = {.mode = KS_READ_MMAP, .verify_checksums = verify};
    self->opening = 1;
    Py_BEGIN_ALLOW_THREADS st = ks_reader_open_buffer(self->base, self->len, &o, &r, &err);
    Py_END_ALLOW_THREADS
  }
  self->opening = 0;
  const char *where = fs ? PyBytes_AS_STRING(fs) : "<buffer>";
  PyObject *path = st ? NULL : fs ? PyUnicode_DecodeFSDefault(where) : PyUnicode_FromString(where);
  if (!path) {
    if (st) {
      ksp_error_path(&err, where);
      ksp_raise(st, &err);
    }
    ks_reader_free(r);
    Py_XDECREF(fs);
    return -1;
  }
  self->r = r; /* open only with every member set: the getters use them all */
  self->fspath = fs;
  self->path = path;
  return 0;
}

static void reader_dealloc(ksp_Reader *self) {
  ks_reader_free(self->r);
  if (self->map) munmap(self->map, self->map_len);
  free(self->heap);
  Py_XDECREF(self->path);
  Py_XDECREF(self->fspath);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static int reader_getbuffer(ksp_Reader *self, Py_buffer *view, int flags) {
  if (!self->r) {
    PyErr_SetString(PyExc_ValueError, "Reader is not open");
    return -1;
  }
  return PyBuffer_FillInfo(view, (PyObject *)self, self->base, (Py_ssize_t)self->len, 0, flags);
}

static PyBufferProcs reader_buffer = {(getbufferproc)reader_getbuffer, NULL};

static int check_open(const ksp_Reader *self) {
  if (self->r) return 0;
  PyErr_SetString(PyExc_ValueError, "Reader is not open");
  return -1;
}

/* (name, dtype, shape, begin, end) of tensor i: absolute byte offsets into the exported buffer. */
static PyObject *entry_tuple(const ksp_Reader *self, size_t i) {
  const char *name;
  ks_tensor v;
  ks_tensor_info info;
  if (ks_reader_tensor_at(self->r, i, &name, &v) || ks_reader_tensor_info(self->r, i, &info))
    return ksp_raisef(KS_E_NOTFOUND, "no tensor %zu", i);
  PyObject *shape = ksp_shape_tuple(v.rank, v.shape);
  if (!shape) return NULL;
  return Py_BuildValue("(siNKK)", name, (int)v.dtype, shape, (unsigned long long)info.begin,
                       (unsigned long long)info.end);
}

static PyObject *reader_entries(ksp_Reader *self, PyObject *unused) {
  (void)unused;
  if (check_open(self)) return NULL;
  size_t n = ks_reader_count(self->r);
  PyObject *list = PyList_New((Py_ssize_t)n);
  for (size_t i = 0; list && i < n; i++) {
    PyObject *t = entry_tuple(self, i);
    if (!t) Py_CLEAR(list);
    else PyList_SET_ITEM(list, (Py_ssize_t)i, t);
  }
  return list;
}

static PyObject *reader_keys(ksp_Reader *self, PyObject *unused) {
  (void)unused;
  if (check_open(self)) return NULL;
  size_t n = ks_reader_count(self->r);
  PyObject *list = PyList_New((Py_ssize_t)n);
  for (size_t i = 0; list && i < n; i++) {
    const char *name;
    PyObject *s = ks_reader_tensor_at(self->r, i, &name, NULL) ? NULL : PyUnicode_FromString(name);
    if (!s) Py_CLEAR(list);
    else PyList_SET_ITEM(list, (Py_ssize_t)i, s);
  }
  return list;
}

static PyObject *reader_entry(ksp_Reader *self, PyObject *name) {
  if (check_open(self)) return NULL;
  const char *s = PyUnicode_AsUTF8(name);
  if (!s) return NULL;
  long i = ks_reader_find(self->r, s);
  if (i < 0) {
    ks_error err;
    ks_error_clear(&err);
    snprintf(err.file, sizeof err.file, "%s", ks_reader_path(self->r));
    snprintf(err.key, sizeof err.key, "%s", s);
    snprintf(err.message, sizeof err.message, "no tensor named '%s'", s);
    ksp_error_path(&err, reader_cpath(self));
    return ksp_raise(KS_E_NOTFOUND, &err);
  }
  return entry_tuple(self, (size_t)i);
}

static PyObject *reader_metadata(ksp_Reader *self, PyObject *args) {
  int all = 0;
  if (!PyArg_ParseTuple(args, "|p", &all) || check_open(self)) return NULL;
  return ksp_meta_dict(ks_reader_meta(self->r), !all);
}

static PyObject *reader_scalars(ksp_Reader *self, PyObject *unused) {
  (void)unused;
  if (check_open(self)) return NULL;
  ks_statedict *sd = NULL;
  ks_error err;
  ks_error_clear(&err);
  ks_status st = ks_statedict_create(NULL, &sd, NULL);
  if (!st) st = ks_reader_scalars(self->r, sd, &err);
  PyObject *out = NULL;
  if (st) {
    ksp_error_path(&err, reader_cpath(self));
    ksp_raise(st, &err);
  } else {
    out = ksp_statedict_items(sd);
  }
  ks_statedict_free(sd);
  return out;
}

static PyObject *reader_verify(ksp_Reader *self, PyObject *unused) {
  (void)unused;
  if (check_open(self)) return NULL;
  ks_error err;
  ks_error_clear(&err);
  ks_status st;
  Py_BEGIN_ALLOW_THREADS st = ks_reader_verify(self->r, &err);
  Py_END_ALLOW_THREADS
  if (st) {
    ksp_error_path(&err, reader_cpath(self));
    return ksp_raise(st, &err);
  }
  Py_RETURN_NONE;
}

static PyObject *reader_len_obj(ksp_Reader *self, void *c) {
  (void)c;
  if (check_open(self)) return NULL;
  return PyLong_FromSize_t(ks_reader_count(self->r));
}
static PyObject *reader_is_keepsake(ksp_Reader *self, void *c) {
  (void)c;
  if (check_open(self)) return NULL;
  return PyBool_FromLong(ks_reader_is_keepsake(self->r));
}
static PyObject *reader_format_version(ksp_Reader *self, void *c) {
  (void)c;
  if (check_open(self)) return NULL;
  return PyLong_FromLong(ks_reader_format_version(self->r));
}
static PyObject *reader_path(ksp_Reader *self, void *c) {
  (void)c;
  if (check_open(self)) return NULL;
  Py_INCREF(self->path);
  return self->path;
}
static PyObject *reader_data_offset(ksp_Reader *self, void *c) {
  (void)c;
  if (check_open(self)) return NULL;
  return PyLong_FromUnsignedLongLong((unsigned long long)ks_reader_data_offset(self->r));
}

static Py_ssize_t reader_length(ksp_Reader *self) {
  return self->r ? (Py_ssize_t)ks_reader_count(self->r) : 0;
}

static PyMethodDef reader_methods[] = {
    {"entries", (PyCFunction)reader_entries, METH_NOARGS,
     "entries()\n--\n\n[(name, dtype code, shape, begin, end)] of every tensor, in file order; begin/end are "
     "byte offsets into the buffer the reader exports."},
    {"keys", (PyCFunction)reader_keys, METH_NOARGS, "keys()\n--\n\nTensor names in file order."},
    {"entry", (PyCFunction)reader_entry, METH_O,
     "entry(name)\n--\n\n(name, dtype code, shape, begin, end) of one tensor."},
    {"metadata", (PyCFunction)reader_metadata, METH_VARARGS,
     "metadata(all=False)\n--\n\nThe __metadata__ pairs; without `all`, the five keys keepsake's writer owns are left "
     "out."},
    {"scalars", (PyCFunction)reader_scalars, METH_NOARGS, "scalars()\n--\n\n[(name, value)] of keepsake's scalars."},
    {"verify", (PyCFunction)reader_verify, METH_NOARGS,
     "verify()\n--\n\nChecks every checksum; raises ChecksumError or FormatError."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef reader_getset[] = {
    {"count", (getter)reader_len_obj, NULL, "number of tensors", NULL},
    {"is_keepsake", (getter)reader_is_keepsake, NULL, "the file carries keepsake's metadata", NULL},
    {"format_version", (getter)reader_format_version, NULL, "keepsake format version (0: plain safetensors)", NULL},
    {"path", (getter)reader_path, NULL, "the path opened (\"<buffer>\" for bytes)", NULL},
    {"data_offset", (getter)reader_data_offset, NULL, "byte offset of the data section", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PySequenceMethods reader_seq = {.sq_length = (lenfunc)reader_length};

PyTypeObject ksp_ReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "keepsake._keepsake.Reader",
    .tp_basicsize = sizeof(ksp_Reader),
    .tp_dealloc = (destructor)reader_dealloc,
    .tp_as_sequence = &reader_seq,
    .tp_as_buffer = &reader_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Reader(path=None, verify=False, backend='mmap', data=None)\n--\n\n"
              "An open keepsake or safetensors file, validated on open: a path (str, bytes or os.PathLike), "
              "mapped ('mmap') or read into memory ('read'), or the file's bytes given as data=.",
    .tp_methods = reader_methods,
    .tp_getset = reader_getset,
    .tp_init = (initproc)reader_init,
    .tp_new = PyType_GenericNew,
};

const ks_reader *ksp_reader_get(PyObject *reader) {
  if (!PyObject_TypeCheck(reader, &ksp_ReaderType) || !((ksp_Reader *)reader)->r) {
    PyErr_SetString(PyExc_TypeError, "expected an open keepsake._keepsake.Reader");
    return NULL;
  }
  return ((ksp_Reader *)reader)->r;
}
