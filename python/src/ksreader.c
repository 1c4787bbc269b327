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
 *    library's KS_READ_COPY: on a few threads, each tensor hashed as its bytes
 *    land when verify is asked); nothing is mapped, so a file truncated or
 *    rewritten while it is read gives an error, never a signal, and the
 *    tensors never change afterwards.
 * A remote object (s3://, http(s)://) is read through the storage layer: whole ("read", and what
 * load_file asks), or with lazy=True (safe_open) in the library's KS_READ_LAZY mode: open reads
 * the header only, and tensor(name) fetches one tensor's byte range into memory the returned
 * bytearray owns, verified against its checksum (ks_reader_fetch). A lazy Reader exports no
 * buffer. cache_dir= reads a remote object through the library's read cache (io_cache.h).
 * A local file opens lazily too (load_checkpoint): fetch_block() then reads the tensors it names
 * into one new buffer, each verified as it arrives: one pass over the file, and the buffer holds
 * only what the caller keeps.
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
  int lazy;         /* KS_READ_LAZY over loc: no buffer; tensors through tensor() */
  ksp_loc loc;      /* a lazy reader's location (table, cache), open until dealloc */
  PyObject *stats;  /* a copying read's cache statistics (dict), or NULL */
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

/*
 * "read" backend of a local file: the library's KS_READ_COPY (header first, then every tensor on a
 * few threads, each hashed as its bytes land when verify is asked, into memory advised for huge
 * pages); the Reader hands out that copy (ks_reader_memory) and keeps it until it is freed.
 */
static KS_NODISCARD ks_status open_copy(ksp_Reader *self, const char *path, int verify, ks_reader **r,
                                        ks_error *err) {
  ks_read_opts o = {.size = sizeof o, .mode = KS_READ_COPY, .verify_checksums = verify};
  ks_status st = ks_reader_open(path, &o, r, err);
  const void *p = NULL;
  size_t len = 0;
  if (!st) st = ks_reader_memory(*r, &p, &len, err);
  if (st) {
    ks_reader_free(*r);
    *r = NULL;
    return st;
  }
  self->base = (uint8_t *)(uintptr_t)p; /* the reader's own copy, writable: tensors may be written */
  self->len = len;
  return KS_OK;
}

/*
 * read_copy of a location: a path through ks_io_posix(), s3:// or http(s):// through the storage
 * layer (and its read cache with cache_dir), closed afterwards; *stats gets the cache's counts.
 */
static KS_NODISCARD ks_status remote_or_local_copy(ksp_Reader *self, const char *loc, const char *cache_dir,
                                                   ks_io_cache_stats *stats, ks_error *err) {
  ksp_loc l;
  ks_status st = ksp_loc_open(loc, ks_io_posix(), cache_dir, &l, err);
  if (!st) st = read_copy(self, l.path, l.io, err);
  ks_io_cache_get_stats(l.cache, stats);
  ksp_loc_close(&l);
  return st;
}

/* KS_READ_LAZY over a remote location: the header now, the tensors on demand (self->loc stays open). */
static KS_NODISCARD ks_status open_lazy(ksp_Reader *self, const char *loc, const char *cache_dir, int verify,
                                        ks_reader **r, ks_error *err) {
  ks_status st = ksp_loc_open(loc, ks_io_posix(), cache_dir, &self->loc, err);
  if (st) return st;
  ks_read_opts o = {.size = sizeof o, .mode = KS_READ_LAZY, .verify_checksums = verify, .io = self->loc.io};
  st = ks_reader_open(self->loc.path, &o, r, err);
  if (st) ksp_loc_close(&self->loc);
  return st;
}

static int reader_init(ksp_Reader *self, PyObject *args, PyObject *kw) {
  static char *names[] = {"path", "verify", "backend", "data", "lazy", "cache_dir", NULL};
  PyObject *src = Py_None, *data = NULL, *cache = Py_None;
  int verify = 0, lazy = 0;
  const char *backend = "mmap";
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|OpsOpO", names, &src, &verify, &backend, &data, &lazy, &cache))
    return -1;
  if (self->r || self->base || self->path || self->opening || self->loc.io) {
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
  PyObject *fs = NULL, *cache_fs = NULL;
  ks_io_cache_stats stats = {0};
  int cached = 0; /* a remote copy read through a cache: keep its statistics */
  /* The reader is published in self->r only once complete and with the GIL held: another
   * thread calling a method meanwhile sees "not open", never a reader being built or freed. */
  ks_reader *r = NULL;
  if (src == Py_None) {
    /* Contents only through data=: a bytes object given as the path is a path, as for os.open. */
    st = copy_bytes(self, data);
    if (st == KS_E_INVALID) return -1;
  } else {
    if (!PyUnicode_FSConverter(src, &fs)) return -1;
    if (cache != Py_None && !PyUnicode_FSConverter(cache, &cache_fs)) return Py_DECREF(fs), -1;
    const char *p = PyBytes_AS_STRING(fs), *cache_dir = cache_fs ? PyBytes_AS_STRING(cache_fs) : NULL;
    self->opening = 1;
    if (lazy && !copy) { /* the header now, each tensor when asked */
      Py_BEGIN_ALLOW_THREADS st = open_lazy(self, p, cache_dir, verify, &r, &err);
      Py_END_ALLOW_THREADS
    } else if (copy && !ksp_is_remote(p)) {
      Py_BEGIN_ALLOW_THREADS st = open_copy(self, p, verify, &r, &err);
      Py_END_ALLOW_THREADS
    } else if (copy || ksp_is_remote(p)) { /* a remote object is otherwise read whole: nothing to map */
      Py_BEGIN_ALLOW_THREADS st = remote_or_local_copy(self, p, cache_dir, &stats, &err);
      Py_END_ALLOW_THREADS
      cached = cache_dir && ksp_is_remote(p);
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
  Py_XDECREF(cache_fs);
  const char *where = fs ? PyBytes_AS_STRING(fs) : "<buffer>";
  PyObject *path = st ? NULL : fs ? PyUnicode_DecodeFSDefault(where) : PyUnicode_FromString(where);
  if (!path) {
    if (st) {
      if (ksp_is_remote(where)) err.file[0] = '\0'; /* the library names the key: name the URL */
      ksp_error_path(&err, where);
      ksp_raise(st, &err);
    }
    ks_reader_free(r);
    ksp_loc_close(&self->loc);
    Py_XDECREF(fs);
    return -1;
  }
  if (cached && !(self->stats = ksp_cache_stats_dict(&stats))) {
    ks_reader_free(r);
    Py_DECREF(path);
    Py_XDECREF(fs);
    return -1;
  }
  self->lazy = self->loc.io != NULL;
  self->r = r; /* open only with every member set: the getters use them all */
  self->fspath = fs;
  self->path = path;
  return 0;
}

static void reader_dealloc(ksp_Reader *self) {
  ks_reader_free(self->r); /* closes its handle of a lazy reader's table: before the table goes */
  ksp_loc_close(&self->loc);
  Py_XDECREF(self->stats);
  if (self->map) munmap(self->map, self->map_len);
  free(self->heap);
  Py_XDECREF(self->path);
  Py_XDECREF(self->fspath);
  ksp_free_self((PyObject *)self);
}

static int reader_getbuffer(ksp_Reader *self, Py_buffer *view, int flags) {
  if (!self->r) {
    PyErr_SetString(PyExc_ValueError, "Reader is not open");
    return -1;
  }
  if (self->lazy) {
    PyErr_SetString(PyExc_BufferError, "a lazily opened remote file has no buffer: read tensors with tensor()");
    return -1;
  }
  return PyBuffer_FillInfo(view, (PyObject *)self, self->base, (Py_ssize_t)self->len, 0, flags);
}

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
  if (ks_reader_tensor_at(self->r, i, &name, NULL) || ks_reader_tensor_desc(self->r, i, &v) ||
      ks_reader_tensor_info(self->r, i, &info))
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

/* The index of the tensor `name`, or -1 with NotFoundError set (or the str's error). */
static long find_tensor(const ksp_Reader *self, PyObject *name) {
  const char *s = PyUnicode_AsUTF8(name);
  if (!s) return -1;
  long i = ks_reader_find(self->r, s);
  if (i < 0) {
    ks_error err;
    ks_error_clear(&err);
    snprintf(err.file, sizeof err.file, "%s", ks_reader_path(self->r));
    snprintf(err.key, sizeof err.key, "%s", s);
    snprintf(err.message, sizeof err.message, "no tensor named '%s'", s);
    ksp_error_path(&err, reader_cpath(self));
    ksp_raise(KS_E_NOTFOUND, &err);
  }
  return i;
}

static PyObject *reader_entry(ksp_Reader *self, PyObject *name) {
  if (check_open(self)) return NULL;
  long i = find_tensor(self, name);
  return i < 0 ? NULL : entry_tuple(self, (size_t)i);
}

/*
 * (dtype code, shape, bytearray): tensor `name`'s bytes copied into memory the bytearray owns and
 * verified against the file's checksum (ks_reader_fetch); a lazy reader reads only that range
 * through its table (and read cache). ChecksumError names the tensor and its offset.
 */
static PyObject *reader_tensor(ksp_Reader *self, PyObject *name) {
  if (check_open(self)) return NULL;
  long i = find_tensor(self, name);
  ks_tensor v;
  if (i < 0) return NULL;
  if (ks_reader_tensor_desc(self->r, (size_t)i, &v)) return ksp_raisef(KS_E_NOTFOUND, "no tensor %ld", i);
  if (v.nbytes > (size_t)PY_SSIZE_T_MAX) return ksp_raisef(KS_E_LIMIT, "tensor of %zu bytes", v.nbytes);
  PyObject *shape = ksp_shape_tuple(v.rank, v.shape);
  PyObject *buf = shape ? PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)v.nbytes) : NULL;
  if (!buf) return Py_XDECREF(shape), NULL;
  ks_error err;
  ks_error_clear(&err);
  ks_status st;
  char *p = PyByteArray_AS_STRING(buf); /* nobody else holds buf: it may be filled without the GIL */
  Py_BEGIN_ALLOW_THREADS st = ks_reader_fetch(self->r, (size_t)i, p, v.nbytes, &err);
  Py_END_ALLOW_THREADS
  if (st) {
    Py_DECREF(shape);
    Py_DECREF(buf);
    if (self->lazy) err.file[0] = '\0'; /* the library names the key: name the URL */
    ksp_error_path(&err, reader_cpath(self));
    return ksp_raise(st, &err);
  }
  return Py_BuildValue("(iNN)", (int)v.dtype, shape, buf);
}

/*
 * fetch_block(names, check=()) -> (bytearray, [offset]): the named tensors read into one new buffer,
 * each at a 64-byte aligned offset, verified against the file's checksums; the tensors named in
 * `check` are only checked in the same pass, nothing kept of them (ks_reader_fetch_many: on a few
 * threads, for the copy, the first touch of each page and XXH3 all cost CPU), without the GIL.
 * No huge-page hint here: with the kernel's usual "defrag=madvise", a hinted region's faults may
 * stall in compaction (measured: one load in three took 2.5-4 s instead of 0.66 s).
 */
static PyObject *reader_fetch_block(ksp_Reader *self, PyObject *args) {
  PyObject *names, *check = NULL;
  if (!PyArg_ParseTuple(args, "O|O:fetch_block", &names, &check) || check_open(self)) return NULL;
  PyObject *seq = PySequence_Fast(names, "fetch_block: names must be a sequence of str");
  if (!seq) return NULL;
  PyObject *cseq = check ? PySequence_Fast(check, "fetch_block: check must be a sequence of str") : PyTuple_New(0);
  if (!cseq) return Py_DECREF(seq), NULL;
  size_t n = (size_t)PySequence_Fast_GET_SIZE(seq), nc = (size_t)PySequence_Fast_GET_SIZE(cseq), total = 0;
  ks_fetch *job = PyMem_Calloc(n + nc + 1, sizeof *job);
  PyObject *offsets = job ? PyList_New((Py_ssize_t)n) : PyErr_NoMemory();
  for (size_t k = 0; offsets && k < n; k++) {
    long i = find_tensor(self, PySequence_Fast_GET_ITEM(seq, (Py_ssize_t)k));
    ks_tensor v;
    PyObject *off = NULL;
    if (i >= 0 && !ks_reader_tensor_desc(self->r, (size_t)i, &v)) {
      if (v.nbytes > (size_t)PY_SSIZE_T_MAX - total - 64) ksp_raisef(KS_E_LIMIT, "fetch_block: too large");
      else off = PyLong_FromSize_t(total);
      job[k] = (ks_fetch){(size_t)i, NULL, v.nbytes};
      total += (v.nbytes + 63) & ~(size_t)63;
    } else if (i >= 0) {
      ksp_raisef(KS_E_NOTFOUND, "fetch_block: no tensor %ld", i);
    }
    if (!off) Py_CLEAR(offsets);
    else PyList_SET_ITEM(offsets, (Py_ssize_t)k, off);
  }
  for (size_t k = 0; offsets && k < nc; k++) { /* checked only: no memory (ks_fetch) */
    long i = find_tensor(self, PySequence_Fast_GET_ITEM(cseq, (Py_ssize_t)k));
    if (i < 0) Py_CLEAR(offsets);
    else job[n + k] = (ks_fetch){(size_t)i, NULL, 0};
  }
  Py_DECREF(seq);
  Py_DECREF(cseq);
  /* PyByteArray over 64 bytes more, so that the offsets can start at a 64-aligned address */
  PyObject *buf = offsets ? PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)total + 64) : NULL;
  ks_status st = KS_OK;
  ks_error err;
  ks_error_clear(&err);
  size_t shift = 0;
  if (buf) {
    char *base = PyByteArray_AS_STRING(buf);
    shift = (64 - (uintptr_t)base % 64) % 64;
    size_t at = shift;
    for (size_t k = 0; k < n; k++) {
      job[k].buf = base + at;
      at += (job[k].cap + 63) & ~(size_t)63;
    }
    Py_BEGIN_ALLOW_THREADS st = ks_reader_fetch_many(self->r, job, n + nc, 0, &err);
    Py_END_ALLOW_THREADS
  }
  PyMem_Free(job);
  if (buf && st) {
    ksp_error_path(&err, reader_cpath(self));
    ksp_raise(st, &err);
    Py_CLEAR(buf);
  }
  if (!buf) {
    Py_XDECREF(offsets);
    return NULL;
  }
  for (size_t k = 0; k < n; k++) { /* offsets from the aligned start */
    PyObject *o = PyLong_FromSize_t(PyLong_AsSize_t(PyList_GET_ITEM(offsets, (Py_ssize_t)k)) + shift);
    if (!o) return Py_DECREF(buf), Py_DECREF(offsets), NULL;
    PyList_SetItem(offsets, (Py_ssize_t)k, o);
  }
  return Py_BuildValue("(NN)", buf, offsets);
}

/*
 * fetch_into(jobs): each job (name, address, nbytes) reads tensor `name` into the caller's memory
 * at `address` (nbytes there), verified as its bytes arrive; a job (name, 0, 0) only checks the
 * tensor against its checksum and keeps nothing (ks_reader_fetch_many, on a few threads, without
 * the GIL). For load_checkpoint: the program's own tensors are checked first and read into
 * afterwards, and new ones are read into memory allocated once for them. The caller owns the
 * memory, and nothing else may use it until the call returns.
 */
static PyObject *reader_fetch_into(ksp_Reader *self, PyObject *jobs) {
  if (check_open(self)) return NULL;
  PyObject *seq = PySequence_Fast(jobs, "fetch_into: jobs must be a sequence of (name, address, nbytes)");
  if (!seq) return NULL;
  size_t n = (size_t)PySequence_Fast_GET_SIZE(seq);
  ks_fetch *job = PyMem_Calloc(n + 1, sizeof *job);
  int bad = !job;
  if (bad) PyErr_NoMemory();
  for (size_t k = 0; !bad && k < n; k++) {
    PyObject *name;
    unsigned long long addr;
    Py_ssize_t cap;
    bad = !PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, (Py_ssize_t)k), "OKn", &name, &addr, &cap);
    long i = bad ? -1 : find_tensor(self, name);
    if (!bad && i >= 0 && (cap < 0 || (!addr && cap))) {
      ksp_raisef(KS_E_INVALID, "fetch_into: job %zu has no memory for %zd bytes", k, cap);
      i = -1;
    }
    bad = bad || i < 0;
    if (!bad) job[k] = (ks_fetch){(size_t)i, (void *)(uintptr_t)addr, (size_t)cap};
  }
  Py_DECREF(seq);
  ks_status st = KS_OK;
  ks_error err;
  ks_error_clear(&err);
  if (!bad) {
    Py_BEGIN_ALLOW_THREADS st = ks_reader_fetch_many(self->r, job, n, 0, &err);
    Py_END_ALLOW_THREADS
  }
  PyMem_Free(job);
  if (bad) return NULL;
  if (st) {
    ksp_error_path(&err, reader_cpath(self));
    return ksp_raise(st, &err);
  }
  Py_RETURN_NONE;
}

static PyObject *reader_cache_stats(ksp_Reader *self, PyObject *unused) {
  (void)unused;
  if (check_open(self)) return NULL;
  if (self->stats) return Py_NewRef(self->stats);
  return ksp_cache_stats(self->loc.cache);
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
  Py_BEGIN_ALLOW_THREADS st = ks_reader_verify(self->r, NULL, NULL, &err);
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
static PyObject *reader_lazy(ksp_Reader *self, void *c) {
  (void)c;
  if (check_open(self)) return NULL;
  return PyBool_FromLong(self->lazy);
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
     "entries($self)\n--\n\n[(name, dtype code, shape, begin, end)] of every tensor, in file order; begin/end are "
     "byte offsets into the buffer the reader exports."},
    {"keys", (PyCFunction)reader_keys, METH_NOARGS, "keys($self)\n--\n\nTensor names in file order."},
    {"entry", (PyCFunction)reader_entry, METH_O,
     "entry($self, name, /)\n--\n\n(name, dtype code, shape, begin, end) of one tensor."},
    {"tensor", (PyCFunction)reader_tensor, METH_O,
     "tensor($self, name, /)\n--\n\n"
     "(dtype code, shape, bytearray) of one tensor: its bytes copied (a lazy reader: read "
     "from the file's table) and verified against its checksum."},
    {"fetch_block", (PyCFunction)reader_fetch_block, METH_VARARGS,
     "fetch_block($self, names, check=(), /)\n--\n\n"
     "(bytearray, [offset]): the named tensors read into one new buffer at 64-aligned "
     "offsets, each verified against its checksum, and the tensors named in check only "
     "checked, in the same pass, without the GIL."},
    {"fetch_into", (PyCFunction)reader_fetch_into, METH_O,
     "fetch_into($self, jobs, /)\n--\n\n"
     "Each (name, address, nbytes) job reads that tensor into the caller's memory at address, "
     "verified as it arrives; (name, 0, 0) only checks it against its checksum. On a few threads, "
     "without the GIL; the earliest failure raises."},
    {"cache_stats", (PyCFunction)reader_cache_stats, METH_NOARGS,
     "cache_stats($self)\n--\n\n"
     "What the read cache (cache_dir=) did for this reader: hit_reads, hit_bytes, miss_reads, "
     "miss_bytes, stored, store_failures, rejected; None without a cache."},
    {"metadata", (PyCFunction)reader_metadata, METH_VARARGS,
     "metadata($self, all=False, /)\n--\n\n"
     "The __metadata__ pairs; without `all`, the five keys keepsake's writer owns are left "
     "out."},
    {"scalars", (PyCFunction)reader_scalars, METH_NOARGS,
     "scalars($self)\n--\n\n[(name, value)] of keepsake's scalars."},
    {"verify", (PyCFunction)reader_verify, METH_NOARGS,
     "verify($self)\n--\n\nChecks every checksum; raises ChecksumError or FormatError."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef reader_getset[] = {
    {"count", (getter)reader_len_obj, NULL, "number of tensors", NULL},
    {"is_keepsake", (getter)reader_is_keepsake, NULL, "the file carries keepsake's metadata", NULL},
    {"format_version", (getter)reader_format_version, NULL, "keepsake format version (0: plain safetensors)", NULL},
    {"path", (getter)reader_path, NULL, "the path opened (\"<buffer>\" for bytes)", NULL},
    {"data_offset", (getter)reader_data_offset, NULL, "byte offset of the data section", NULL},
    {"lazy", (getter)reader_lazy, NULL, "opened lazily (a remote file): no buffer, tensors through tensor()", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static const char reader_doc[] =
    "Reader(path=None, verify=False, backend='mmap', data=None, lazy=False, cache_dir=None)\n--\n\n"
    "An open keepsake or safetensors file, validated on open: a path (str, bytes or os.PathLike), "
    "mapped ('mmap') or read into memory ('read'), or the file's bytes given as data=. A remote "
    "location (s3://, http(s)://) is read whole, or with lazy=True header first and each tensor "
    "when tensor() asks; cache_dir= reads it through a local read cache.";

static PyType_Slot reader_slots[] = {
    {Py_tp_dealloc, KSP_SLOT_FN(reader_dealloc)},
    {Py_sq_length, KSP_SLOT_FN(reader_length)},
    {Py_bf_getbuffer, KSP_SLOT_FN(reader_getbuffer)},
    {Py_tp_doc, (void *)reader_doc},
    {Py_tp_methods, reader_methods},
    {Py_tp_getset, reader_getset},
    {Py_tp_init, KSP_SLOT_FN(reader_init)},
    {Py_tp_new, KSP_SLOT_FN(PyType_GenericNew)},
    {0, NULL}};

PyType_Spec ksp_ReaderSpec = {"keepsake._keepsake.Reader", sizeof(ksp_Reader), 0,
                              Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE, reader_slots};

const ks_reader *ksp_reader_get(PyObject *reader) {
  if (!PyObject_TypeCheck(reader, ksp_ReaderType) || !((ksp_Reader *)reader)->r) {
    PyErr_SetString(PyExc_TypeError, "expected an open keepsake._keepsake.Reader");
    return NULL;
  }
  return ((ksp_Reader *)reader)->r;
}
