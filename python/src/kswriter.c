/*
 * Writing: Python entries -> a ks_statedict that borrows the tensors' memory ->
 * ks_save (atomic, durable). save_bytes runs the same writer through a ks_io
 * that collects the bytes in memory, so both produce identical files.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ksext.h"
#include "io_nosync.h" /* internal: resolved in keepsake_static, see src/core/nosync/ */

static int add_tensor(ks_statedict *sd, const char *name, PyObject *item) {
  int dtype;
  PyObject *shape;
  unsigned long long addr, nbytes;
  if (!PyArg_ParseTuple(item, "siOKK", &name, &dtype, &shape, &addr, &nbytes)) return -1;
  PyObject *seq = PySequence_Fast(shape, "shape must be a sequence of ints");
  if (!seq) return -1;
  Py_ssize_t rank = PySequence_Fast_GET_SIZE(seq);
  int64_t dims[KS_MAX_RANK] = {0};
  ks_status st = rank > KS_MAX_RANK ? KS_E_LIMIT : KS_OK;
  for (Py_ssize_t i = 0; !st && i < rank; i++) {
    dims[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
    if (dims[i] == -1 && PyErr_Occurred()) st = KS_E_INVALID;
  }
  Py_DECREF(seq);
  if (PyErr_Occurred()) return -1;
  ks_tensor t;
  if (dtype < 0 || dtype >= KS_DTYPE_COUNT) st = KS_E_DTYPE;
  if (!st) st = ks_tensor_init(&t, (ks_dtype)dtype, (int)rank, dims, (void *)(uintptr_t)addr);
  if (!st && t.nbytes != nbytes) st = KS_E_SHAPE;
  if (!st) st = ks_statedict_set_tensor(sd, name, &t, KS_BORROW, NULL);
  if (st) {
    ks_error e;
    ks_error_clear(&e);
    e.code = st;
    snprintf(e.key, sizeof e.key, "%s", name);
    snprintf(e.message, sizeof e.message, "cannot add tensor '%s' (dtype %d, rank %zd, %llu bytes): %s", name,
             dtype, rank, nbytes, ks_strerror(st));
    ksp_raise(st, &e);
    return -1;
  }
  return 0;
}

static KS_NODISCARD ks_status add_scalar(ks_statedict *sd, const char *name, PyObject *v) {
  if (v == Py_None) return ks_statedict_set_null(sd, name, NULL);
  if (PyBool_Check(v)) return ks_statedict_set_bool(sd, name, v == Py_True, NULL);
  if (PyLong_Check(v)) {
    int overflow = 0;
    long long i = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow) return KS_E_LIMIT;
    return ks_statedict_set_int(sd, name, (int64_t)i, NULL);
  }
  if (PyFloat_Check(v)) return ks_statedict_set_float(sd, name, PyFloat_AS_DOUBLE(v), NULL);
  if (PyUnicode_Check(v)) {
    const char *s = PyUnicode_AsUTF8(v);
    return s ? ks_statedict_set_string(sd, name, s, NULL) : KS_E_VALUE;
  }
  return KS_E_UNSUPPORTED;
}

static int add_item(ks_statedict *sd, PyObject *item) {
  if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) < 2) {
    PyErr_SetString(PyExc_TypeError, "entries are (name, value) or (name, dtype, shape, address, nbytes)");
    return -1;
  }
  const char *name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(item, 0));
  if (!name) return -1;
  if (PyTuple_GET_SIZE(item) == 5) return add_tensor(sd, name, item);
  ks_status st = add_scalar(sd, name, PyTuple_GET_ITEM(item, 1));
  if (PyErr_Occurred()) return -1;
  if (st) {
    ks_error e;
    char tname[128];
    ks_error_clear(&e);
    e.code = st;
    snprintf(e.key, sizeof e.key, "%s", name);
    snprintf(e.message, sizeof e.message, "cannot store '%s' (a %s): %s", name,
             ksp_type_name(PyTuple_GET_ITEM(item, 1), tname, sizeof tname),
             st == KS_E_LIMIT ? "integer beyond 64 bits" : ks_strerror(st));
    ksp_raise(st, &e);
    return -1;
  }
  return 0;
}

ks_statedict *ksp_statedict_from(PyObject *entries) {
  PyObject *seq = PySequence_Fast(entries, "entries must be a sequence");
  if (!seq) return NULL;
  ks_statedict *sd = NULL;
  ks_status st = ks_statedict_create(NULL, &sd, NULL);
  if (st) ksp_raise(st, NULL);
  for (Py_ssize_t i = 0; sd && i < PySequence_Fast_GET_SIZE(seq); i++) {
    if (add_item(sd, PySequence_Fast_GET_ITEM(seq, i)) < 0) {
      ks_statedict_free(sd);
      sd = NULL;
    }
  }
  Py_DECREF(seq);
  return sd;
}

/* keepsake.metrics from a description of the metrics (see keepsake/_state/metrics.py), as `keepsake convert` does,
 * with the layout record: in the order ks_state_to_state_dict sets them (layout, then metrics), so a rank file
 * a torch.distributed job writes has the header an MPI program's has. */
static int add_metrics_meta(ks_meta *meta, const char *desc, const ks_statedict *sd) {
  if (!desc) return 0;
  char *json = NULL;
  ks_error err;
  ks_error_clear(&err);
  ks_status st = ksp_metrics_meta(desc, sd, &json, &err);
  if (!st) st = ks_meta_set(meta, KS_META_STATE, ks_layout_record(KS_META_STATE), NULL);
  if (!st) st = ks_meta_set(meta, KS_META_METRICS, json, NULL);
  free(json);
  if (st) ksp_raise(st, &err);
  return st ? -1 : 0;
}

int ksp_save_prepare(PyObject *entries, PyObject *metadata, const char *metrics, ks_statedict **sd, ks_meta **meta) {
  *sd = ksp_statedict_from(entries);
  *meta = *sd ? ksp_meta_from(metadata) : NULL;
  if (*meta && add_metrics_meta(*meta, metrics, *sd) == 0) return 0;
  ks_meta_free(*meta);
  ks_statedict_free(*sd);
  return -1;
}

PyObject *ksp_save_file(PyObject *self, PyObject *args, PyObject *kw) {
  (void)self;
  static char *names[] = {"path", "entries", "metadata", "metrics", "fsync", NULL};
  PyObject *path, *entries, *metadata = Py_None;
  const char *metrics = NULL;
  int fsync = 1;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O|Ozp", names, PyUnicode_FSConverter, &path, &entries, &metadata,
                                   &metrics, &fsync))
    return NULL;
  ks_statedict *sd;
  ks_meta *meta;
  if (ksp_save_prepare(entries, metadata, metrics, &sd, &meta)) {
    Py_DECREF(path);
    return NULL;
  }
  ks_io io;
  ks_save_opts o = {0};
  ks_error err;
  ks_error_clear(&err);
  ks_status st;
  const char *p = PyBytes_AS_STRING(path), *where = NULL;
  ks_storage *store = NULL;
  const ks_io *local = ksp_io_posix(fsync, &io);
  Py_BEGIN_ALLOW_THREADS st = ksp_location(p, local, &store, &o.io, &where, &err);
  if (!st) st = ks_save(where, sd, meta, &o, &err);
  ks_storage_free(store);
  Py_END_ALLOW_THREADS
  ks_meta_free(meta);
  ks_statedict_free(sd);
  Py_DECREF(path);
  if (st) return ksp_raise(st, &err);
  Py_RETURN_NONE;
}

/* A ks_io that collects what the writer writes. The writer's first write is the whole header,
   whose first 8 bytes give its length; with the data's length (from the state dict) that is the
   file's size, so the bytes object to return is allocated then, at that size (the GIL taken for
   the allocation only), and written into: the file is never copied out of a buffer again. */
typedef struct membuf {
  char *p;
  size_t len, cap;
  PyObject *bytes; /* when set, p is its buffer and cap its exact size */
  uint64_t data_len;
} membuf;

static void mem_take_bytes(membuf *m, const void *buf, size_t n) {
  if (m->bytes || m->p || n < 8) return;
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | ((const uint8_t *)buf)[i];
  if (hlen > (uint64_t)PY_SSIZE_T_MAX - 8 || m->data_len > (uint64_t)PY_SSIZE_T_MAX - 8 - hlen) return;
  uint64_t total = 8 + hlen + m->data_len;
  if (total < n) return;
  PyGILState_STATE g = PyGILState_Ensure();
  m->bytes = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
  if (!m->bytes) PyErr_Clear(); /* the growing buffer below is tried instead */
  PyGILState_Release(g);
  if (m->bytes) {
    m->p = PyBytes_AS_STRING(m->bytes);
    m->cap = (size_t)total;
  }
}

static int mem_create(void *ctx, const char *path, int *fd) {
  (void)path;
  ((membuf *)ctx)->len = 0;
  *fd = 0;
  return 0;
}
static int mem_write(void *ctx, int fd, const void *buf, size_t n, size_t *written) {
  (void)fd;
  membuf *m = ctx;
  mem_take_bytes(m, buf, n);
  if (n > m->cap - m->len) {
    if (m->bytes) return EFBIG; /* more than the header and the tensors add up to: never */
    size_t cap = m->cap ? m->cap : 4096;
    while (cap - m->len < n) {
      if (cap > SIZE_MAX / 2) return 12; /* ENOMEM */
      cap *= 2;
    }
    char *p = realloc(m->p, cap);
    if (!p) return 12;
    m->p = p;
    m->cap = cap;
  }
  memcpy(m->p + m->len, buf, n);
  m->len += n;
  *written = n;
  return 0;
}
/* Patches bytes already written (the writer fills in the header's checksums last). */
static int mem_pwrite(void *ctx, int fd, const void *buf, size_t n, uint64_t off, size_t *written) {
  (void)fd;
  membuf *m = ctx;
  if (off > m->len || n > m->len - off) return EINVAL; /* beyond what was written */
  memcpy(m->p + off, buf, n);
  *written = n;
  return 0;
}
/* The reading, listing and linking members a version 2+ table must have: a buffer has none of them
   (the writer only asks stat_fn whether the destination is a directory: ENOENT, it is not there). */
static int mem_open(void *ctx, const char *path, int *fd, uint64_t *size) {
  (void)ctx, (void)path, (void)fd, (void)size;
  return ENOTSUP;
}
static int mem_read(void *ctx, int fd, void *buf, size_t n, uint64_t off, size_t *got) {
  (void)ctx, (void)fd, (void)buf, (void)n, (void)off, (void)got;
  return ENOTSUP;
}
static int mem_stat(void *ctx, const char *path, ks_io_stat *st) {
  (void)ctx, (void)path, (void)st;
  return ENOENT;
}
static int mem_list(void *ctx, const char *dir, const char *prefix, ks_io_list_cb cb, void *cb_ctx) {
  (void)ctx, (void)dir, (void)prefix, (void)cb, (void)cb_ctx;
  return ENOTSUP;
}
static int mem_symlink(void *ctx, const char *target, const char *path) {
  (void)ctx, (void)target, (void)path;
  return ENOTSUP;
}
static int mem_readlink(void *ctx, const char *path, char *buf, size_t cap, size_t *len) {
  (void)ctx, (void)path, (void)buf, (void)cap, (void)len;
  return ENOTSUP;
}
static int mem_noop_fd(void *ctx, int fd) {
  (void)ctx;
  (void)fd;
  return 0;
}
static int mem_noop_path(void *ctx, const char *path) {
  (void)ctx;
  (void)path;
  return 0;
}
static int mem_rename(void *ctx, const char *from, const char *to) {
  (void)ctx;
  (void)from;
  (void)to;
  return 0;
}

const ks_io *ksp_io_posix(int fsync, ks_io *io) {
  *io = fsync ? *ks_io_posix() : *ks__io_posix_nosync();
  return io;
}

PyObject *ksp_save_bytes(PyObject *self, PyObject *args, PyObject *kw) {
  (void)self;
  static char *names[] = {"entries", "metadata", "metrics", NULL};
  PyObject *entries, *metadata = Py_None;
  const char *metrics = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|Oz", names, &entries, &metadata, &metrics)) return NULL;
  ks_statedict *sd;
  ks_meta *meta;
  if (ksp_save_prepare(entries, metadata, metrics, &sd, &meta)) return NULL;
  membuf mb = {0};
  for (size_t i = 0; i < ks_statedict_count(sd); i++) {
    ks_entry e;
    if (!ks_statedict_at(sd, i, &e) && e.kind == KS_VAL_TENSOR) mb.data_len += e.tensor.nbytes;
  }
  /* The writer's steps only, with the positioned write (io.h version 5) that lets it hash each
     tensor as it copies it instead of in a pass of its own; nothing touches the file system. */
  ks_io io = {.version = KS_IO_VERSION, .ctx = &mb, .create_fn = mem_create, .write_fn = mem_write,
              .fsync_fn = mem_noop_fd, .close_fn = mem_noop_fd, .rename_fn = mem_rename, .unlink_fn = mem_noop_path,
              .fsync_dir_fn = mem_noop_path, .open_fn = mem_open, .read_fn = mem_read, .stat_fn = mem_stat,
              .list_fn = mem_list, .mkdir_fn = mem_noop_path, .symlink_fn = mem_symlink,
              .readlink_fn = mem_readlink, .pwrite_fn = mem_pwrite};
  ks_save_opts o = {.io = &io};
  ks_error err;
  ks_error_clear(&err);
  ks_status st;
  Py_BEGIN_ALLOW_THREADS st = ks_save("<bytes>", sd, meta, &o, &err);
  Py_END_ALLOW_THREADS
  ks_meta_free(meta);
  ks_statedict_free(sd);
  PyObject *out;
  if (st) {
    out = ksp_raise(st, &err);
    Py_XDECREF(mb.bytes);
  } else if (mb.bytes) {
    out = mb.bytes; /* written in place; copied only if the sizes disagreed, which they never do (the stable
                       ABI cannot shrink a bytes object in place) */
    if (mb.len != mb.cap) {
      out = PyBytes_FromStringAndSize(PyBytes_AS_STRING(mb.bytes), (Py_ssize_t)mb.len);
      Py_DECREF(mb.bytes);
    }
  } else {
    out = PyBytes_FromStringAndSize(mb.p ? mb.p : "", (Py_ssize_t)mb.len);
  }
  if (!mb.bytes) free(mb.p);
  return out;
}
