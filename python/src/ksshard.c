/*
 * Sharded checkpoint directories from Python (keepsake.distributed, the torch DCP storage backend):
 * thin bindings over include/keepsake/shard.h. The layout, the index, the commit and every check
 * are the C library's; this file converts arguments and results and releases the GIL around I/O.
 * Every function takes a location: a local directory (or file://), s3://bucket/prefix or
 * http(s)://host/path (read only), opened by ksp_loc_open, so every read and write goes through
 * the storage layer's table (ks_storage_io) and the library's own rules for it: on S3 a file is
 * staged in memory and uploaded when the library renames it onto its name, so the rank files
 * and then the index appear whole, in the library's order.
 *
 *  - shard_write_rank / shard_write_index: one rank's file, then the commit (the index).
 *  - shard_index: the validated index (and, on request, every rank file's header held against
 *    it) as plain Python values.
 *  - shard_verify: rank files against the index (every byte: the header hash and each tensor's
 *    checksum; the whole-file XXH3 of a version 1 index).
 *  - dcp_encode / dcp_decode: DCP non-tensor values to and from the library's typed JSON.
 *  - shard_location: a location checked (and, for writing, refused when read only).
 *  - ShardFile: one rank file opened lazily (header only); fetch() reads one tensor's bytes
 *    through the table (pread, a ranged GET) into a caller's writable buffer and verifies its
 *    checksum, so a load reads only the tensors its plan names and never maps a file another
 *    process could truncate.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ksext.h"
#include "io_nosync.h" /* internal: resolved in keepsake_static, see src/core/nosync/ */

/* What the index records (ks_shard_index_get), by value. */
static ks_shard_index_info index_info(const ks_shard_index *idx) {
  ks_shard_index_info info = KS_OPTS_INIT(ks_shard_index_info);
  ks_shard_index_get(idx, &info);
  return info;
}

/* Per-rank globs: none. DCP decides who writes what, so no entry is per-rank by name. */
static const char *const no_globs[1] = {NULL};

/* err->file names a path of the table (a key under the storage path `path`, as the library
 * derives it): name it by the location `loc` the caller gave instead (s3://bucket/prefix/...),
 * as the Reader does. Nothing changes for a local directory, whose path is its location. */
static void error_location(ks_error *err, const char *loc, const char *path) {
  if (!path || !strcmp(loc, path)) return;
  size_t n = strlen(path), m = strlen(loc);
  if (strncmp(err->file, path, n) || (err->file[n] && err->file[n] != '/')) return;
  while (m && loc[m - 1] == '/') m--;
  char rest[sizeof err->file];
  size_t r = strlen(err->file + n);
  memcpy(rest, err->file + n, r + 1);
  if (m + r >= sizeof err->file) return; /* would not fit: the key stays */
  memcpy(err->file, loc, m);
  memcpy(err->file + m, rest, r + 1);
}

/* A location's table and path: ksp_loc_open over `local` for a local directory, the storage
 * layer's table for s3:// and http(s)://. Errors name the location. No GIL needed; close with
 * ksp_loc_close in any case. */
static KS_NODISCARD ks_status loc_open(const char *loc, const ks_io *local, ksp_loc *l, ks_error *err) {
  ks_status st = ksp_loc_open(loc, local, NULL, l, err);
  if (st) ksp_error_path(err, loc);
  return st;
}

/* A sequence of ints as dims; -1 with an exception set on error. */
static int dims_from(PyObject *obj, const char *what, int64_t *dims, int *rank) {
  PyObject *seq = PySequence_Fast(obj, "dims must be a sequence of ints");
  if (!seq) return -1;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  if (n > KS_MAX_RANK) {
    Py_DECREF(seq);
    ksp_raisef(KS_E_LIMIT, "%s has %zd dimensions (at most %d)", what, n, KS_MAX_RANK);
    return -1;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    dims[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
    if (dims[i] == -1 && PyErr_Occurred()) {
      Py_DECREF(seq);
      return -1;
    }
  }
  Py_DECREF(seq);
  *rank = (int)n;
  return 0;
}

/* One (name, global_shape, offsets) of `chunks` into the map; the chunk's shape is its tensor's. */
static int add_chunk(ks_shard_map *map, const ks_statedict *sd, PyObject *item) {
  const char *name;
  PyObject *gobj, *oobj;
  if (!PyArg_ParseTuple(item, "sOO", &name, &gobj, &oobj)) return -1;
  int64_t g[KS_MAX_RANK] = {0}, off[KS_MAX_RANK] = {0};
  int grank = 0, orank = 0;
  if (dims_from(gobj, "global shape", g, &grank) || dims_from(oobj, "offsets", off, &orank)) return -1;
  const ks_tensor *t = ks_statedict_tensor(sd, name);
  if (!t) {
    ksp_raisef(KS_E_INVALID, "chunk '%s' names no tensor of the entries", name);
    return -1;
  }
  if (grank != t->rank || orank != t->rank) {
    ksp_raisef(KS_E_SHAPE, "chunk '%s': %d-d tensor with a %d-d global shape and %d offsets", name, t->rank, grank,
               orank);
    return -1;
  }
  ks_error err;
  ks_error_clear(&err);
  ks_status st = ks_shard_map_add(map, name, t->rank, g, off, t->shape, &err);
  if (st) ksp_raise(st, &err);
  return st ? -1 : 0;
}

static ks_shard_map *map_from(PyObject *chunks, const ks_statedict *sd) {
  PyObject *seq = PySequence_Fast(chunks, "chunks must be a sequence of (name, global_shape, offsets)");
  if (!seq) return NULL;
  ks_shard_map *map = NULL;
  ks_status st = ks_shard_map_create(NULL, &map, NULL);
  if (st) ksp_raise(st, NULL);
  for (Py_ssize_t i = 0; map && i < PySequence_Fast_GET_SIZE(seq); i++) {
    if (add_chunk(map, sd, PySequence_Fast_GET_ITEM(seq, i)) < 0) {
      ks_shard_map_free(map);
      map = NULL;
    }
  }
  Py_DECREF(seq);
  return map;
}

static PyObject *shard_file_name(PyObject *self, PyObject *args) {
  (void)self;
  int rank, world;
  if (!PyArg_ParseTuple(args, "ii", &rank, &world)) return NULL;
  char buf[64];
  if (ks_shard_file_name(rank, world, buf, sizeof buf))
    return ksp_raisef(KS_E_INVALID, "no rank file for rank %d of %d (world size 1..%d)", rank, world,
                      KS_SHARD_MAX_WORLD);
  return PyUnicode_FromString(buf);
}

static PyObject *shard_write_rank(PyObject *self, PyObject *args, PyObject *kw) {
  (void)self;
  static char *names[] = {"dir", "rank", "world_size", "entries", "chunks", "metadata", "fsync", NULL};
  PyObject *dir, *entries, *chunks, *metadata = Py_None;
  int rank, world, fsync = 1;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O&iiOO|Op", names, PyUnicode_FSConverter, &dir, &rank, &world,
                                   &entries, &chunks, &metadata, &fsync))
    return NULL;
  ks_statedict *sd;
  ks_meta *meta;
  ks_shard_map *map = NULL;
  if (ksp_save_prepare(entries, metadata, NULL, &sd, &meta) == 0 && !(map = map_from(chunks, sd))) {
    ks_meta_free(meta);
    ks_statedict_free(sd);
  }
  if (!map) {
    Py_DECREF(dir);
    return NULL;
  }
  ks_io io;
  const ks_io *local = ksp_io_posix(fsync, &io);
  ksp_loc l;
  ks_save_opts o = {0};
  ks_shard_file_info info = {0, 0};
  ks_error err;
  ks_error_clear(&err);
  ks_status st;
  const char *d = PyBytes_AS_STRING(dir);
  Py_BEGIN_ALLOW_THREADS st = loc_open(d, local, &l, &err);
  if (!st) {
    o.io = l.io;
    st = ks_shard_write_rank(l.path, rank, world, sd, meta, map, no_globs, 0, &o, &info, &err);
    error_location(&err, d, l.path);
  }
  ksp_loc_close(&l);
  Py_END_ALLOW_THREADS
  ks_shard_map_free(map);
  ks_meta_free(meta);
  ks_statedict_free(sd);
  Py_DECREF(dir);
  if (st) return ksp_raise(st, &err);
  return Py_BuildValue("(KK)", (unsigned long long)info.size, (unsigned long long)info.checksum);
}

/* infos (one (size, xxh3) per rank) as a PyMem array; NULL with an exception set. */
static ks_shard_file_info *infos_from(PyObject *infos, int *world) {
  PyObject *seq = PySequence_Fast(infos, "infos must be a sequence of (size, xxh3), one per rank");
  if (!seq) return NULL;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  ks_shard_file_info *fi = NULL;
  if (n < 1 || n > KS_SHARD_MAX_WORLD)
    ksp_raisef(KS_E_INVALID, "%zd rank files (world size 1..%d)", n, KS_SHARD_MAX_WORLD);
  else if (!(fi = PyMem_Calloc((size_t)n, sizeof *fi))) PyErr_NoMemory();
  for (Py_ssize_t i = 0; fi && i < n; i++) {
    unsigned long long size, sum;
    if (PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "KK", &size, &sum)) {
      fi[i] = (ks_shard_file_info){size, sum};
    } else {
      PyMem_Free(fi);
      fi = NULL;
    }
  }
  Py_DECREF(seq);
  *world = (int)n;
  return fi;
}

static PyObject *shard_write_index(PyObject *self, PyObject *args, PyObject *kw) {
  (void)self;
  static char *names[] = {"dir", "infos", "fsync", NULL};
  PyObject *dir, *infos;
  int fsync = 1, world = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O|p", names, PyUnicode_FSConverter, &dir, &infos, &fsync))
    return NULL;
  ks_shard_file_info *fi = infos_from(infos, &world);
  if (!fi) {
    Py_DECREF(dir);
    return NULL;
  }
  ks_io io;
  const ks_io *local = ksp_io_posix(fsync, &io);
  ksp_loc l;
  ks_save_opts o = {0};
  ks_error err;
  ks_error_clear(&err);
  ks_status st;
  const char *d = PyBytes_AS_STRING(dir);
  Py_BEGIN_ALLOW_THREADS st = loc_open(d, local, &l, &err);
  if (!st) {
    o.io = l.io;
    st = ks_shard_write_index(l.path, world, fi, &o, &err);
    error_location(&err, d, l.path);
  }
  ksp_loc_close(&l);
  Py_END_ALLOW_THREADS
  PyMem_Free(fi);
  Py_DECREF(dir);
  if (st) return ksp_raise(st, &err);
  Py_RETURN_NONE;
}

/* [(file rank, offsets, shape)] of sharded tensor i. */
static PyObject *chunks_list(const ks_shard_index *idx, size_t i, size_t n) {
  PyObject *list = PyList_New((Py_ssize_t)n);
  for (size_t j = 0; list && j < n; j++) {
    ks_shard_chunk c;
    int file = -1;
    PyObject *off = NULL, *shape = NULL, *item = NULL;
    if (ks_shard_index_chunk(idx, i, j, &c, &file) == KS_OK) {
      off = ksp_shape_tuple(c.rank, c.offsets);
      shape = off ? ksp_shape_tuple(c.rank, c.shape) : NULL;
      item = shape ? Py_BuildValue("(iOO)", file, off, shape) : NULL;
    } else {
      ksp_raisef(KS_E_NOTFOUND, "index: no chunk %zu of sharded tensor %zu", j, i);
    }
    Py_XDECREF(off);
    Py_XDECREF(shape);
    if (!item) Py_CLEAR(list);
    else PyList_SET_ITEM(list, (Py_ssize_t)j, item);
  }
  return list;
}

/* [(name, dtype code, global shape, chunks)] of every sharded tensor. */
static PyObject *sharded_list(const ks_shard_index *idx) {
  size_t n = index_info(idx).n_sharded;
  PyObject *list = PyList_New((Py_ssize_t)n);
  for (size_t i = 0; list && i < n; i++) {
    ks_shard_chunk whole;
    ks_dtype dt;
    size_t nc = 0;
    PyObject *item = NULL;
    if (ks_shard_index_sharded_at(idx, i, &whole, &dt, &nc) == KS_OK) {
      PyObject *g = ksp_shape_tuple(whole.rank, whole.global_shape);
      PyObject *cl = g ? chunks_list(idx, i, nc) : NULL;
      item = cl ? Py_BuildValue("(siOO)", whole.name, (int)dt, g, cl) : NULL;
      Py_XDECREF(g);
      Py_XDECREF(cl);
    } else {
      ksp_raisef(KS_E_NOTFOUND, "index: no sharded tensor %zu", i);
    }
    if (!item) Py_CLEAR(list);
    else PyList_SET_ITEM(list, (Py_ssize_t)i, item);
  }
  return list;
}

/* [(file name, size, xxh3)] per saved rank. */
static PyObject *files_list(const ks_shard_index *idx) {
  int world = index_info(idx).world_size;
  PyObject *list = PyList_New(world);
  for (int r = 0; list && r < world; r++) {
    ks_shard_file_info fi = {0, 0};
    const char *f = ks_shard_index_file(idx, r, &fi);
    PyObject *item = f ? Py_BuildValue("(sKK)", f, (unsigned long long)fi.size, (unsigned long long)fi.checksum)
                       : ksp_raisef(KS_E_NOTFOUND, "index: no file for rank %d", r);
    if (!item) Py_CLEAR(list);
    else PyList_SET_ITEM(list, r, item);
  }
  return list;
}

static PyObject *per_rank_list(const ks_shard_index *idx) {
  size_t n = index_info(idx).n_per_rank;
  const char *const *g = index_info(idx).per_rank;
  PyObject *list = PyList_New((Py_ssize_t)n);
  for (size_t i = 0; list && i < n; i++) {
    PyObject *s = PyUnicode_FromString(g[i]);
    if (!s) Py_CLEAR(list);
    else PyList_SET_ITEM(list, (Py_ssize_t)i, s);
  }
  return list;
}

static PyObject *index_dict(const ks_shard_index *idx) {
  PyObject *files = files_list(idx), *sharded = files ? sharded_list(idx) : NULL;
  PyObject *globs = sharded ? per_rank_list(idx) : NULL;
  PyObject *out = globs ? Py_BuildValue("{s:i,s:L,s:L,s:O,s:O,s:O}", "world_size", index_info(idx).world_size,
                                        "epoch", (long long)index_info(idx).epoch, "batch",
                                        (long long)index_info(idx).batch, "files", files, "sharded", sharded,
                                        "per_rank", globs)
                        : NULL;
  Py_XDECREF(files);
  Py_XDECREF(sharded);
  Py_XDECREF(globs);
  return out;
}

/* The KS_SHARD_CHECK_* bits of shard_index's `check`: True (sizes and headers), False (none),
 * "sizes" or "headers"; -1 with an exception set for anything else. */
static int check_bits(PyObject *check, unsigned *what) {
  if (PyUnicode_Check(check)) {
    const char *s = PyUnicode_AsUTF8(check);
    if (!s) return -1;
    if (!strcmp(s, "sizes")) *what = KS_SHARD_CHECK_SIZES;
    else if (!strcmp(s, "headers")) *what = KS_SHARD_CHECK_SIZES | KS_SHARD_CHECK_HEADERS;
    else return ksp_raisef(KS_E_INVALID, "check='%s': True, False, 'sizes' or 'headers'", s), -1;
    return 0;
  }
  int t = PyObject_IsTrue(check);
  if (t < 0) return -1;
  *what = t ? KS_SHARD_CHECK_SIZES | KS_SHARD_CHECK_HEADERS : 0u;
  return 0;
}

/* The index of `dir`, validated; with `check`, every rank file's size (and header) against it. */
static PyObject *shard_index(PyObject *self, PyObject *args, PyObject *kw) {
  (void)self;
  static char *names[] = {"dir", "check", NULL};
  PyObject *dir, *check = Py_True;
  unsigned what = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|O", names, PyUnicode_FSConverter, &dir, &check)) return NULL;
  if (check_bits(check, &what)) {
    Py_DECREF(dir);
    return NULL;
  }
  ks_shard_index *idx = NULL;
  ks_error err;
  ks_error_clear(&err);
  ks_status st;
  ksp_loc l;
  const char *d = PyBytes_AS_STRING(dir);
  Py_BEGIN_ALLOW_THREADS st = loc_open(d, ks_io_posix(), &l, &err);
  if (!st) st = ks_shard_index_read(l.path, NULL, l.io, &idx, &err);
  if (!st && what) st = ks_shard_check(l.path, idx, l.io, what, NULL, NULL, &err);
  if (st) error_location(&err, d, l.path);
  ksp_loc_close(&l);
  Py_END_ALLOW_THREADS
  Py_DECREF(dir);
  PyObject *out = st ? ksp_raise(st, &err) : index_dict(idx);
  ks_shard_index_free(idx);
  return out;
}

/* Verifies rank r's file of location `loc` (opened as l); -1 with an exception set. */
static int verify_one(const char *loc, const ksp_loc *l, const ks_shard_index *idx, long r) {
  int world = index_info(idx).world_size;
  if (r < 0 || r >= world) {
    ksp_raisef(KS_E_INVALID, "rank %ld is not in 0..%d", r, world - 1);
    return -1;
  }
  ks_error err;
  ks_error_clear(&err);
  ks_status st;
  Py_BEGIN_ALLOW_THREADS st = ks_shard_verify_file(l->path, idx, (int)r, l->io, &err);
  Py_END_ALLOW_THREADS
  if (st) {
    error_location(&err, loc, l->path);
    ksp_raise(st, &err);
  }
  return st ? -1 : 0;
}

/* The rank files `ranks` (all when None) against the index (ks_shard_verify_file). */
static PyObject *shard_verify(PyObject *self, PyObject *args, PyObject *kw) {
  (void)self;
  static char *names[] = {"dir", "ranks", NULL};
  PyObject *dir, *ranks = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|O", names, PyUnicode_FSConverter, &dir, &ranks)) return NULL;
  ks_shard_index *idx = NULL;
  ks_error err;
  ks_error_clear(&err);
  ks_status st;
  ksp_loc l;
  const char *d = PyBytes_AS_STRING(dir);
  Py_BEGIN_ALLOW_THREADS st = loc_open(d, ks_io_posix(), &l, &err);
  if (!st) st = ks_shard_index_read(l.path, NULL, l.io, &idx, &err);
  if (st) error_location(&err, d, l.path);
  Py_END_ALLOW_THREADS
  int failed = st ? (ksp_raise(st, &err), 1) : 0;
  PyObject *seq = NULL;
  if (!failed && ranks != Py_None && !(seq = PySequence_Fast(ranks, "ranks must be a sequence of ints"))) failed = 1;
  Py_ssize_t n = seq ? PySequence_Fast_GET_SIZE(seq) : (idx ? index_info(idx).world_size : 0);
  for (Py_ssize_t i = 0; !failed && i < n; i++) {
    long r = seq ? PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i)) : (long)i;
    failed = (r == -1 && PyErr_Occurred()) || verify_one(d, &l, idx, r);
  }
  Py_XDECREF(seq);
  ks_shard_index_free(idx);
  ksp_loc_close(&l);
  Py_DECREF(dir);
  if (failed) return NULL;
  Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------ */
/* The checkpoint directory: created durably, committed or not.             */
/* ------------------------------------------------------------------------ */

/* dir/name into buf; 0, or -1 with an exception set when it does not fit. */
static int join_path(char *buf, size_t cap, const char *dir, const char *name) {
  int n = snprintf(buf, cap, "%s/%s", dir, name);
  if (n >= 0 && (size_t)n < cap) return 0;
  ksp_raisef(KS_E_LIMIT, "path '%s/%s' is too long", dir, name);
  return -1;
}

/* Creates `path` and its missing parents (mkdir -p); each new entry's parent is fsynced, so the
 * directory the rank files go into survives a crash along with them. 0 or an errno. */
static int mkdirs(const ks_io *io, char *path, int fsync) {
  size_t len = strlen(path);
  while (len > 1 && path[len - 1] == '/') path[--len] = '\0';
  for (size_t i = 1; i <= len; i++) {
    if (path[i] != '/' && path[i] != '\0') continue;
    char c = path[i];
    path[i] = '\0';
    int rc = io->mkdir_fn(io->ctx, path);
    if (!rc && fsync) {
      char *slash = strrchr(path, '/');
      if (slash && slash != path) *slash = '\0';
      rc = io->fsync_dir_fn(io->ctx, slash == path ? "/" : slash ? path : ".");
      if (slash && slash != path) *slash = '/';
    }
    path[i] = c;
    if (rc && rc != EEXIST) return rc;
  }
  return 0;
}

/* "cannot VERB 'WHAT': strerror(rc)", raised as KS_E_IO; a remote table's own detail (the request,
 * the HTTP status, S3's code) is added in parentheses. Returns NULL. */
static PyObject *table_fail(const ksp_loc *l, int rc, const char *verb, const char *what) {
  char detail[512] = "";
  if (l->store && ks_storage_last_error(l->store, detail + 2, sizeof detail - 3)) {
    detail[0] = ' ';
    detail[1] = '(';
    strcat(detail, ")");
  }
  return ksp_raisef(KS_E_IO, "cannot %s '%s': %s%s", verb, what, strerror(rc), detail);
}

/* shard_prepare_dir(dir, fsync=True): the checkpoint directory, created when missing (on S3, a
 * key prefix, which needs no creation: the table's mkdir does nothing). */
static PyObject *shard_prepare_dir(PyObject *self, PyObject *args, PyObject *kw) {
  (void)self;
  static char *names[] = {"dir", "fsync", NULL};
  PyObject *dir;
  int fsync = 1;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|p", names, PyUnicode_FSConverter, &dir, &fsync)) return NULL;
  const char *d = PyBytes_AS_STRING(dir);
  ksp_loc l;
  ks_error err;
  ks_error_clear(&err);
  ks_status st;
  Py_BEGIN_ALLOW_THREADS st = loc_open(d, ks_io_posix(), &l, &err);
  Py_END_ALLOW_THREADS
  char path[4096];
  PyObject *out = NULL;
  if (st) {
    ksp_raise(st, &err);
  } else if (strlen(l.path) >= sizeof path) {
    ksp_raisef(KS_E_LIMIT, "path '%s' is too long", d);
  } else {
    snprintf(path, sizeof path, "%s", l.path);
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = mkdirs(l.io, path, fsync);
    Py_END_ALLOW_THREADS
    if (rc) table_fail(&l, rc, "create the checkpoint directory", d);
    else out = Py_NewRef(Py_None);
  }
  ksp_loc_close(&l);
  Py_DECREF(dir);
  return out;
}

/* Opens `dir` as l and puts the path of its index (for the table) into path; 0, or -1 with an
 * exception set (and l closed). */
static int open_index_path(const char *dir, ksp_loc *l, char *path, size_t cap) {
  ks_error err;
  ks_error_clear(&err);
  ks_status st;
  Py_BEGIN_ALLOW_THREADS st = loc_open(dir, ks_io_posix(), l, &err);
  Py_END_ALLOW_THREADS
  if (st) {
    ksp_raise(st, &err);
    return -1;
  }
  if (join_path(path, cap, l->path, KS_SHARD_INDEX_NAME)) {
    ksp_loc_close(l);
    return -1;
  }
  return 0;
}

/* ------------------------------------------------------------------------ */
/* DCP saves and loads in the one sharded layout (binding.h, FORMAT.md 9.1).  */
/* ------------------------------------------------------------------------ */

/* One (entry, object, whole, global_shape, offsets) of a plan into *it; its tensor is in sd under the
 * entry's name. 0, or -1 with an exception set. */
static int dcp_item_from(PyObject *tuple, const ks_statedict *sd, ks_shard_dcp_item *it) {
  PyObject *entry, *gobj, *oobj;
  int object, whole;
  if (!PyArg_ParseTuple(tuple, "OppOO", &entry, &object, &whole, &gobj, &oobj)) return -1;
  PyObject *name = PyTuple_Check(entry) && PyTuple_GET_SIZE(entry) ? PyTuple_GET_ITEM(entry, 0) : NULL;
  const char *fqn = name && PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : NULL;
  const ks_tensor *t = fqn ? ks_statedict_tensor(sd, fqn) : NULL;
  if (!t) {
    if (!PyErr_Occurred()) ksp_raisef(KS_E_INVALID, "a DCP item whose entry is no tensor");
    return -1;
  }
  int grank = 0, orank = 0;
  memset(it, 0, sizeof *it);
  it->fqn = fqn;
  it->object = object;
  it->whole = whole;
  it->data = *t;
  if (whole || object) return 0;
  if (dims_from(gobj, "global shape", it->global_shape, &grank) || dims_from(oobj, "offsets", it->offsets, &orank))
    return -1;
  if (grank != t->rank || orank != t->rank) {
    ksp_raisef(KS_E_SHAPE, "chunk '%s': %d-d tensor with a %d-d global shape and %d offsets", fqn, t->rank, grank,
               orank);
    return -1;
  }
  return 0;
}

/* shard_dcp_write_rank(dir, rank, world_size, items, entries, metadata, metrics, per_rank, dcp, planner_data,
 * fsync): ks_shard_dcp_write_rank; (size, header xxh3). */
static PyObject *shard_dcp_write_rank(PyObject *self, PyObject *args, PyObject *kw) {
  (void)self;
  static char *names[] = {"dir",     "rank",  "world_size",   "items", "entries", "metadata",
                          "metrics", "per_rank", "dcp", "planner_data", "fsync", NULL};
  PyObject *dir, *items, *entries, *metadata = Py_None;
  const char *metrics = NULL, *planner_data = NULL;
  int rank, world, per_rank = 0, dcp = 0, fsync = 1;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O&iiOO|Ozppzp", names, PyUnicode_FSConverter, &dir, &rank, &world,
                                   &items, &entries, &metadata, &metrics, &per_rank, &dcp, &planner_data, &fsync))
    return NULL;
  PyObject *seq = PySequence_Fast(items, "items must be a sequence of (entry, object, whole, global_shape, offsets)");
  Py_ssize_t n = seq ? PySequence_Fast_GET_SIZE(seq) : 0;
  PyObject *item_entries = seq ? PyList_New(n) : NULL;
  for (Py_ssize_t i = 0; item_entries && i < n; i++) {
    PyObject *t = PySequence_Fast_GET_ITEM(seq, i);
    PyObject *e = PyTuple_Check(t) && PyTuple_GET_SIZE(t) == 5 ? PyTuple_GET_ITEM(t, 0) : NULL;
    if (!e) {
      ksp_raisef(KS_E_INVALID, "items must be a sequence of (entry, object, whole, global_shape, offsets)");
      Py_CLEAR(item_entries);
    } else {
      PyList_SET_ITEM(item_entries, i, Py_NewRef(e));
    }
  }
  ks_statedict *isd = item_entries ? ksp_statedict_from(item_entries) : NULL, *sd = NULL;
  ks_meta *meta = NULL;
  ks_shard_dcp_item *its = isd ? PyMem_Calloc((size_t)n + 1, sizeof *its) : NULL;
  if (isd && !its) PyErr_NoMemory();
  int bad = !its;
  for (Py_ssize_t i = 0; !bad && i < n; i++) bad = dcp_item_from(PySequence_Fast_GET_ITEM(seq, i), isd, &its[i]);
  if (!bad) bad = ksp_save_prepare(entries, metadata, metrics, &sd, &meta) != 0;
  PyObject *out = NULL;
  if (!bad) {
    ks_io io;
    const ks_io *local = ksp_io_posix(fsync, &io);
    ksp_loc l;
    ks_save_opts o = {0};
    ks_shard_file_info info = {0, 0};
    ks_shard_dcp_rank r = {rank, world, its, (size_t)n, sd, meta, per_rank, dcp, planner_data};
    ks_error err;
    ks_error_clear(&err);
    ks_status st;
    const char *d = PyBytes_AS_STRING(dir);
    Py_BEGIN_ALLOW_THREADS st = loc_open(d, local, &l, &err);
    if (!st) {
      o.io = l.io;
      st = ks_shard_dcp_write_rank(l.path, &r, &o, &info, &err);
      error_location(&err, d, l.path);
    }
    ksp_loc_close(&l);
    Py_END_ALLOW_THREADS
    out = st ? ksp_raise(st, &err)
             : Py_BuildValue("(KK)", (unsigned long long)info.size, (unsigned long long)info.checksum);
  }
  ks_meta_free(meta);
  ks_statedict_free(sd);
  ks_statedict_free(isd);
  PyMem_Free(its);
  Py_XDECREF(item_entries);
  Py_XDECREF(seq);
  Py_DECREF(dir);
  return out;
}

/* One listed item: (fqn, stored name, kind, dtype code, global shape, chunks or None, scalar value or None). */
typedef struct dcp_listing {
  const ks_shard_index *idx;
  PyObject *list;
} dcp_listing;

static const char *const dcp_kinds[] = {"tensor", "object", "scalar"};

static int on_dcp_entry(void *ctx, const ks_shard_dcp_entry *e) {
  dcp_listing *L = ctx;
  PyObject *g = NULL, *chunks = NULL, *value = NULL, *item = NULL;
  if (e->kind == KS_SHARD_DCP_SCALAR) {
    value = ksp_scalar_value(e->scalar);
    g = value ? PyTuple_New(0) : NULL;
    chunks = g ? Py_NewRef(Py_None) : NULL;
  } else {
    g = ksp_shape_tuple(e->rank, e->global_shape);
    value = g ? Py_NewRef(Py_None) : NULL;
    if (value && e->sharded >= 0) {
      ks_shard_chunk whole;
      ks_dtype dt;
      size_t nc = 0;
      chunks = ks_shard_index_sharded_at(L->idx, (size_t)e->sharded, &whole, &dt, &nc) == KS_OK
                   ? chunks_list(L->idx, (size_t)e->sharded, nc)
                   : ksp_raisef(KS_E_NOTFOUND, "index: no sharded tensor %ld", e->sharded);
    } else if (value) {
      chunks = Py_NewRef(Py_None);
    }
  }
  if (chunks)
    item = Py_BuildValue("(sssiOOO)", e->fqn, e->name, dcp_kinds[e->kind],
                         e->kind == KS_SHARD_DCP_SCALAR ? -1 : (int)e->dtype, g, chunks, value);
  Py_XDECREF(g);
  Py_XDECREF(chunks);
  Py_XDECREF(value);
  int fail = !item || PyList_Append(L->list, item);
  Py_XDECREF(item);
  return fail;
}

/* shard_dcp_list(dir): what a DCP load of `dir` can ask for (ks_shard_dcp_list) and rank 0's planner data:
 * ([(fqn, name, kind, dtype, global shape, chunks [(file, offsets, shape)] or None for rank 0's, scalar)], str | None,
 * [rank file names]).
 * The index is checked against every rank file's size and header first (ks_shard_check). */
static PyObject *shard_dcp_list(PyObject *self, PyObject *args) {
  (void)self;
  PyObject *dir;
  if (!PyArg_ParseTuple(args, "O&", PyUnicode_FSConverter, &dir)) return NULL;
  ks_shard_index *idx = NULL;
  ks_error err;
  ks_error_clear(&err);
  ks_status st;
  ksp_loc l;
  const char *d = PyBytes_AS_STRING(dir);
  Py_BEGIN_ALLOW_THREADS st = loc_open(d, ks_io_posix(), &l, &err);
  if (!st) st = ks_shard_index_read(l.path, NULL, l.io, &idx, &err);
  if (!st) st = ks_shard_check(l.path, idx, l.io, KS_SHARD_CHECK_SIZES | KS_SHARD_CHECK_HEADERS, NULL, NULL, &err);
  if (st) error_location(&err, d, l.path);
  Py_END_ALLOW_THREADS
  PyObject *out = NULL;
  dcp_listing L = {idx, st ? NULL : PyList_New(0)};
  char *pd = NULL;
  if (st) {
    ksp_raise(st, &err);
  } else if (L.list) {
    /* The visitor makes Python objects: the GIL stays held (rank 0's header only is read). */
    st = ks_shard_dcp_list(l.path, idx, l.io, NULL, on_dcp_entry, &L, &pd, &err);
    if (st && !PyErr_Occurred()) {
      error_location(&err, d, l.path);
      ksp_raise(st, &err);
    } else if (!st) {
      PyObject *files = PyList_New(index_info(idx).world_size);
      for (int r = 0; files && r < index_info(idx).world_size; r++) {
        PyObject *f = PyUnicode_FromString(ks_shard_index_file(idx, r, NULL));
        if (!f) Py_CLEAR(files);
        else PyList_SET_ITEM(files, r, f);
      }
      out = files ? Py_BuildValue("(OzO)", L.list, pd, files) : NULL;
      Py_XDECREF(files);
    }
  }
  free(pd);
  Py_XDECREF(L.list);
  ks_shard_index_free(idx);
  ksp_loc_close(&l);
  Py_DECREF(dir);
  return out;
}

/* The program's metrics by path, for ks_shard_load_local. */
typedef struct metric_table {
  char **paths;
  ks_metric **metrics;
  size_t n, cap;
} metric_table;

static const ks_metric *table_metric(void *ctx, const char *path) {
  const metric_table *t = ctx;
  for (size_t i = 0; i < t->n; i++)
    if (!strcmp(t->paths[i], path)) return t->metrics[i];
  return NULL;
}

static void table_free(metric_table *t) {
  for (size_t i = 0; i < t->n; i++) {
    PyMem_Free(t->paths[i]);
    ks_metric_free(t->metrics[i]);
  }
  PyMem_Free(t->paths);
  PyMem_Free(t->metrics);
}

/* Adds the described metrics of `descs` (keepsake._state.load.describe_metric's) under `root`. 0 or -1. */
static int table_add(metric_table *t, const char *root, PyObject *descs) {
  Py_ssize_t n = PySequence_Size(descs);
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *d = PySequence_GetItem(descs, i);
    PyObject *name = d && PyTuple_Check(d) && PyTuple_GET_SIZE(d) ? PyTuple_GET_ITEM(d, 0) : NULL;
    const char *s = name && PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : NULL;
    size_t len = s ? strlen(root) + strlen(s) + 1 : 0;
    if (s && t->n == t->cap) {
      size_t cap = t->cap ? 2 * t->cap : 8;
      char **p = PyMem_Realloc(t->paths, cap * sizeof *p);
      if (p) t->paths = p;
      ks_metric **m = p ? PyMem_Realloc(t->metrics, cap * sizeof *m) : NULL;
      if (m) t->metrics = m, t->cap = cap;
      else s = NULL, PyErr_NoMemory();
    }
    char *path = s ? PyMem_Malloc(len) : NULL;
    ks_metric *m = NULL;
    ks_error err;
    ks_error_clear(&err);
    ks_status st = path ? ksp_describe_metric(d, &m, &err) : KS_E_INVALID;
    Py_XDECREF(d);
    if (st) {
      PyMem_Free(path);
      if (!PyErr_Occurred()) ksp_raise(st, &err);
      return -1;
    }
    snprintf(path, len, "%s%s", root, s);
    t->paths[t->n] = path;
    t->metrics[t->n++] = m;
  }
  return n < 0 ? -1 : 0;
}

/* shard_load_local(dir, rank, world_size, train=(), evals=(), verify=False): this rank's keepsake entries
 * (ks_shard_load_local) as ([(name, value)], metadata dict): its replicated and per-rank entries, without DCP's
 * items, the metrics of the saved ranks it takes folded with the program's described metrics (train: their
 * descriptions; evals: [(label, descriptions)]). */
static PyObject *shard_load_local(PyObject *self, PyObject *args, PyObject *kw) {
  (void)self;
  static char *names[] = {"dir", "rank", "world_size", "train", "evals", "verify", NULL};
  PyObject *dir, *train = NULL, *evals = NULL;
  int rank, world, verify = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O&ii|OOp", names, PyUnicode_FSConverter, &dir, &rank, &world, &train,
                                   &evals, &verify))
    return NULL;
  metric_table t = {0};
  int bad = train && table_add(&t, KS_KEY_TRAIN_METRICS, train);
  Py_ssize_t ne = !bad && evals ? PySequence_Size(evals) : 0;
  bad = bad || ne < 0;
  for (Py_ssize_t i = 0; !bad && i < ne; i++) {
    PyObject *g = PySequence_GetItem(evals, i), *descs;
    const char *label;
    char root[KS_MAX_NAME + 1];
    bad = !g || !PyArg_ParseTuple(g, "sO", &label, &descs);
    if (!bad && snprintf(root, sizeof root, "%s%s/", KS_KEY_EVAL_METRICS, label) >= (int)sizeof root)
      bad = (ksp_raisef(KS_E_LIMIT, "eval label '%s' is too long", label), 1);
    if (!bad) bad = table_add(&t, root, descs);
    Py_XDECREF(g);
  }
  PyObject *out = NULL;
  if (!bad) {
    ks_shard_index *idx = NULL;
    ks_statedict *sd = NULL;
    ks_meta *meta = NULL;
    ks_error err;
    ks_error_clear(&err);
    ks_status st;
    ksp_loc l;
    const char *d = PyBytes_AS_STRING(dir);
    Py_BEGIN_ALLOW_THREADS st = loc_open(d, ks_io_posix(), &l, &err);
    if (!st) st = ks_shard_index_read(l.path, NULL, l.io, &idx, &err);
    ks_shard_local_opts o = {.io = l.io, .verify = verify, .metric = table_metric, .metric_ctx = &t};
    if (!st) st = ks_shard_load_local(l.path, idx, rank, world, &o, &sd, &meta, &err);
    if (st) error_location(&err, d, l.path);
    ksp_loc_close(&l);
    Py_END_ALLOW_THREADS
    PyObject *items = st ? ksp_raise(st, &err) : ksp_statedict_items(sd);
    PyObject *md = items ? ksp_meta_dict(meta, 1) : NULL;
    out = md ? Py_BuildValue("(OO)", items, md) : NULL;
    Py_XDECREF(items);
    Py_XDECREF(md);
    ks_statedict_free(sd);
    ks_meta_free(meta);
    ks_shard_index_free(idx);
  }
  table_free(&t);
  Py_DECREF(dir);
  return out;
}

/* shard_layout(dir): where the directory keeps per-rank entries (ks_shard_local_layout): "named" (under the names
 * of a C program's state, the index's per-rank globs) or "dcp02" (keepsake 0.2's DCP items under rank<r>/). */
static PyObject *shard_layout(PyObject *self, PyObject *args) {
  (void)self;
  PyObject *dir;
  if (!PyArg_ParseTuple(args, "O&", PyUnicode_FSConverter, &dir)) return NULL;
  ks_shard_index *idx = NULL;
  ks_shard_local_kind kind = KS_SHARD_LOCAL_NAMED;
  ks_error err;
  ks_error_clear(&err);
  ks_status st;
  ksp_loc l;
  const char *d = PyBytes_AS_STRING(dir);
  Py_BEGIN_ALLOW_THREADS st = loc_open(d, ks_io_posix(), &l, &err);
  if (!st) st = ks_shard_index_read(l.path, NULL, l.io, &idx, &err);
  if (!st) st = ks_shard_local_layout(l.path, idx, l.io, &kind, &err);
  if (st) error_location(&err, d, l.path);
  ksp_loc_close(&l);
  Py_END_ALLOW_THREADS
  ks_shard_index_free(idx);
  Py_DECREF(dir);
  if (st) return ksp_raise(st, &err);
  return PyUnicode_FromString(kind == KS_SHARD_LOCAL_DCP02 ? "dcp02" : "named");
}

/* shard_names(): the names keepsake reserves in a DCP save (binding.h): {"object": prefix of a non-tensor value's
 * entry, "local": prefix of the key of the item that carries a rank's per-rank entries}. */
static PyObject *shard_names(PyObject *self, PyObject *unused) {
  (void)self;
  (void)unused;
  return Py_BuildValue("{s:s,s:s}", "object", KS_SHARD_DCP_OBJECT, "local", KS_SHARD_DCP_LOCAL);
}

/* shard_committed(dir): whether `dir` holds an index (the commit marker), valid or not. */
static PyObject *shard_committed(PyObject *self, PyObject *args) {
  (void)self;
  PyObject *dir;
  if (!PyArg_ParseTuple(args, "O&", PyUnicode_FSConverter, &dir)) return NULL;
  const char *d = PyBytes_AS_STRING(dir);
  char path[4096], shown[4096 + sizeof KS_SHARD_INDEX_NAME];
  ksp_loc l;
  PyObject *out = NULL;
  if (open_index_path(d, &l, path, sizeof path) == 0) {
    ks_io_stat sb;
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = l.io->stat_fn(l.io->ctx, path, &sb);
    Py_END_ALLOW_THREADS
    snprintf(shown, sizeof shown, "%s/%s", d, KS_SHARD_INDEX_NAME);
    if (rc && rc != ENOENT) table_fail(&l, rc, "stat", shown);
    else out = PyBool_FromLong(rc == 0);
    ksp_loc_close(&l);
  }
  Py_DECREF(dir);
  return out;
}

/* shard_uncommit(dir, fsync=True): removes the index durably, so that from now on the directory is
 * no checkpoint (a save over it that dies leaves none). True when there was one (a stat first:
 * an S3 DELETE succeeds whether or not the object was there). */
static PyObject *shard_uncommit(PyObject *self, PyObject *args, PyObject *kw) {
  (void)self;
  static char *names[] = {"dir", "fsync", NULL};
  PyObject *dir;
  int fsync = 1;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|p", names, PyUnicode_FSConverter, &dir, &fsync)) return NULL;
  const char *d = PyBytes_AS_STRING(dir);
  char path[4096], shown[4096 + sizeof KS_SHARD_INDEX_NAME];
  ksp_loc l;
  if (open_index_path(d, &l, path, sizeof path)) {
    Py_DECREF(dir);
    return NULL;
  }
  snprintf(shown, sizeof shown, "%s/%s", d, KS_SHARD_INDEX_NAME);
  const ks_io *io = l.io;
  ks_io_stat sb;
  int rc, sync_rc = 0;
  Py_BEGIN_ALLOW_THREADS rc = io->stat_fn(io->ctx, path, &sb);
  if (!rc) rc = io->unlink_fn(io->ctx, path);
  if (!rc && fsync) sync_rc = io->fsync_dir_fn(io->ctx, l.path);
  Py_END_ALLOW_THREADS
  PyObject *out = NULL;
  if (rc && rc != ENOENT) table_fail(&l, rc, "remove", shown);
  else if (sync_rc) ksp_raisef(KS_E_NOT_DURABLE, "removed '%s' but cannot fsync '%s': %s", shown, d, strerror(sync_rc));
  else out = PyBool_FromLong(rc == 0);
  ksp_loc_close(&l);
  Py_DECREF(dir);
  return out;
}

/* shard_location(dir, write=False): the location as every shard_* function reads it (a local
 * directory's path, file:// taken off; a remote location unchanged), once the storage layer has
 * opened it (no request is made); with `write`, a location it cannot write (http(s)://) is
 * refused with UnsupportedError. */
static PyObject *shard_location(PyObject *self, PyObject *args, PyObject *kw) {
  (void)self;
  static char *names[] = {"dir", "write", NULL};
  PyObject *dir;
  int write = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|p", names, PyUnicode_FSConverter, &dir, &write)) return NULL;
  const char *d = PyBytes_AS_STRING(dir);
  ks_storage *store = NULL;
  ks_error err;
  ks_error_clear(&err);
  ks_status st = ks_storage_open(d, NULL, &store, &err);
  PyObject *out = NULL;
  if (st) {
    ksp_error_path(&err, d);
    ksp_raise(st, &err);
  } else if (write && ks_storage_is_read_only(store)) {
    ksp_raisef(KS_E_UNSUPPORTED, "%s: the storage layer reads this location only (http, https); write the "
               "checkpoint to a local directory or s3://bucket/prefix", d);
  } else {
    out = PyUnicode_DecodeFSDefault(ks_storage_is_remote(store) ? d : ks_storage_path(store));
  }
  ks_storage_free(store);
  Py_DECREF(dir);
  return out;
}

/* ------------------------------------------------------------------------ */
/* DCP non-tensor values: Python objects to and from the C library's typed    */
/* JSON (keepsake/binding/dcpvalue.h). Every rule is the library's; this only */
/* maps each exact Python type onto an encoder call and each decoded kind     */
/* back onto an object.                                                       */
/* ------------------------------------------------------------------------ */

/* io.BytesIO (a new reference), or NULL with an exception set. */
static PyObject *bytesio_type(void) {
  PyObject *io = PyImport_ImportModule("io");
  PyObject *t = io ? PyObject_GetAttrString(io, "BytesIO") : NULL;
  Py_XDECREF(io);
  return t;
}

/* -1 with an exception set (ksp_raise of the encoder's status, or Python's own). */
static int enc_fail(ks_status st, const ks_error *err) {
  if (!PyErr_Occurred()) ksp_raise(st, err);
  return -1;
}

static int enc_value(ks_dcp_encoder *e, PyObject *v, PyObject *bio, ks_error *err);

static int enc_items(ks_dcp_encoder *e, ks_dcp_kind kind, PyObject *seq, PyObject *bio, ks_error *err) {
  ks_status st = ks_dcp_encoder_begin(e, kind, err);
  if (st) return enc_fail(st, err);
  /* A snapshot: converting an item may run Python code (a BytesIO subclass) that changes the container. */
  PyObject *items = kind == KS_DCP_DICT ? PyDict_Items(seq) : PySequence_Tuple(seq);
  if (!items) return -1;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(items);
  int rc = 0;
  for (Py_ssize_t i = 0; !rc && i < n; i++) {
    PyObject *it = PySequence_Fast_GET_ITEM(items, i);
    if (kind != KS_DCP_DICT) {
      rc = enc_value(e, it, bio, err);
    } else {
      rc = enc_value(e, PyTuple_GET_ITEM(it, 0), bio, err);
      if (!rc) rc = enc_value(e, PyTuple_GET_ITEM(it, 1), bio, err);
    }
  }
  Py_DECREF(items);
  if (rc) return rc;
  st = ks_dcp_encoder_end(e, err);
  return st ? enc_fail(st, err) : 0;
}

static int enc_int(ks_dcp_encoder *e, PyObject *v, ks_error *err) {
  int overflow = 0;
  long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
  if (x == -1 && PyErr_Occurred()) return -1;
  ks_status st;
  if (!overflow) {
    st = ks_dcp_encoder_int(e, (int64_t)x, err);
  } else {
    PyObject *digits = PyObject_Str(v); /* ValueError past sys.get_int_max_str_digits() */
    if (!digits) {
      if (!PyErr_ExceptionMatches(PyExc_ValueError)) return -1;
      PyErr_Clear();
      ksp_raisef(KS_E_LIMIT, "an integer with more than %d digits is not stored", KS_DCP_MAX_DIGITS);
      return -1;
    }
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(digits, &n);
    st = s ? ks_dcp_encoder_bigint(e, s, (size_t)n, err) : KS_OK;
    Py_DECREF(digits);
    if (!s) return -1;
  }
  return st ? enc_fail(st, err) : 0;
}

static int enc_str(ks_dcp_encoder *e, PyObject *v, ks_error *err) {
  Py_ssize_t n;
  const char *s = PyUnicode_AsUTF8AndSize(v, &n);
  ks_status st;
  if (s) {
    st = ks_dcp_encoder_str(e, s, (size_t)n, err);
  } else { /* a lone surrogate: the library takes its 3-byte form */
    if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) return -1;
    PyErr_Clear();
    PyObject *b = PyUnicode_AsEncodedString(v, "utf-8", "surrogatepass");
    if (!b) return -1;
    st = ks_dcp_encoder_str(e, PyBytes_AS_STRING(b), (size_t)PyBytes_GET_SIZE(b), err);
    Py_DECREF(b);
  }
  return st ? enc_fail(st, err) : 0;
}

static int enc_value(ks_dcp_encoder *e, PyObject *v, PyObject *bio, ks_error *err) {
  ks_status st;
  if (v == Py_None) st = ks_dcp_encoder_none(e, err);
  else if (PyBool_Check(v)) st = ks_dcp_encoder_bool(e, v == Py_True, err);
  else if (PyLong_CheckExact(v)) return enc_int(e, v, err);
  else if (PyFloat_CheckExact(v)) st = ks_dcp_encoder_float(e, PyFloat_AS_DOUBLE(v), err);
  else if (PyUnicode_CheckExact(v)) return enc_str(e, v, err);
  else if (PyList_CheckExact(v)) return enc_items(e, KS_DCP_LIST, v, bio, err);
  else if (PyTuple_CheckExact(v)) return enc_items(e, KS_DCP_TUPLE, v, bio, err);
  else if (PyDict_CheckExact(v)) return enc_items(e, KS_DCP_DICT, v, bio, err);
  else if (PyBytes_CheckExact(v))
    st = ks_dcp_encoder_bytes(e, KS_DCP_BYTES, PyBytes_AS_STRING(v), (size_t)PyBytes_GET_SIZE(v), err);
  else {
    int is_bio = PyObject_IsInstance(v, bio);
    if (is_bio < 0) return -1;
    if (!is_bio) {
      char tname[128];
      PyObject *mod = PyObject_GetAttrString((PyObject *)Py_TYPE(v), "__module__");
      const char *m = mod && PyUnicode_Check(mod) ? PyUnicode_AsUTF8(mod) : NULL;
      PyErr_Clear();
      ksp_raisef(KS_E_UNSUPPORTED, "a %s.%s is not stored: keepsake keeps None, bool, int, float, str, bytes, "
                 "io.BytesIO, and lists, tuples and dicts of them (no pickle)", m ? m : "?",
                 ksp_type_name(v, tname, sizeof tname));
      Py_XDECREF(mod);
      return -1;
    }
    PyObject *b = PyObject_CallMethod(v, "getvalue", NULL);
    if (!b) return -1;
    if (!PyBytes_Check(b)) {
      Py_DECREF(b);
      ksp_raisef(KS_E_UNSUPPORTED, "an io.BytesIO whose getvalue() is not bytes is not stored");
      return -1;
    }
    st = ks_dcp_encoder_bytes(e, KS_DCP_BYTESIO, PyBytes_AS_STRING(b), (size_t)PyBytes_GET_SIZE(b), err);
    Py_DECREF(b);
  }
  return st ? enc_fail(st, err) : 0;
}

/* dcp_encode(value) -> bytes: the typed JSON of a non-tensor value (ks_dcp_encoder). */
static PyObject *dcp_encode(PyObject *self, PyObject *value) {
  (void)self;
  PyObject *bio = bytesio_type();
  if (!bio) return NULL;
  ks_dcp_encoder *e = NULL;
  ks_error err;
  ks_error_clear(&err);
  ks_status st = ks_dcp_encoder_create(NULL, &e, &err);
  PyObject *out = NULL;
  if (st) {
    ksp_raise(st, &err);
  } else if (enc_value(e, value, bio, &err) == 0) {
    const char *json;
    size_t n;
    st = ks_dcp_encoder_result(e, &json, &n, &err);
    out = st ? ksp_raise(st, &err) : PyBytes_FromStringAndSize(json, (Py_ssize_t)n);
  }
  ks_dcp_encoder_free(e);
  Py_DECREF(bio);
  return out;
}

/* The object of a decoded value (a new reference), or NULL with an exception set. */
static PyObject *dec_value(const ks_dcp_value *v, PyObject *bio, const char *key) {
  switch (v->kind) {
    case KS_DCP_NONE: Py_RETURN_NONE;
    case KS_DCP_BOOL: return PyBool_FromLong(v->i != 0);
    case KS_DCP_INT: return PyLong_FromLongLong((long long)v->i);
    case KS_DCP_FLOAT: return PyFloat_FromDouble(v->f);
    case KS_DCP_STR: return PyUnicode_DecodeUTF8(v->s, (Py_ssize_t)v->len, "surrogatepass");
    case KS_DCP_BYTES: return PyBytes_FromStringAndSize(v->s, (Py_ssize_t)v->len);
    case KS_DCP_BIGINT: {
      PyObject *i = PyLong_FromString(v->s, NULL, 10); /* ValueError past sys.get_int_max_str_digits() */
      if (!i && PyErr_ExceptionMatches(PyExc_ValueError)) {
        PyErr_Clear();
        ksp_raisef(KS_E_LIMIT, "%s: an integer of %zu digits is more than this interpreter converts", key, v->len);
      }
      return i;
    }
    case KS_DCP_BYTESIO: {
      PyObject *b = PyBytes_FromStringAndSize(v->s, (Py_ssize_t)v->len);
      PyObject *o = b ? PyObject_CallOneArg(bio, b) : NULL;
      Py_XDECREF(b);
      return o;
    }
    default: break;
  }
  Py_ssize_t n = (Py_ssize_t)v->count;
  PyObject *out = v->kind == KS_DCP_LIST ? PyList_New(n) : v->kind == KS_DCP_TUPLE ? PyTuple_New(n) : PyDict_New();
  for (Py_ssize_t i = 0; out && i < n; i++) {
    if (v->kind == KS_DCP_DICT) {
      PyObject *k = dec_value(&v->items[2 * i], bio, key);
      PyObject *x = k ? dec_value(&v->items[2 * i + 1], bio, key) : NULL;
      if (!x || PyDict_SetItem(out, k, x) < 0) Py_CLEAR(out);
      Py_XDECREF(k);
      Py_XDECREF(x);
      continue;
    }
    PyObject *x = dec_value(&v->items[i], bio, key);
    if (!x) Py_CLEAR(out);
    else if (v->kind == KS_DCP_LIST) PyList_SET_ITEM(out, i, x);
    else PyTuple_SET_ITEM(out, i, x);
  }
  return out;
}

/* dcp_decode(data, key="") -> value: a value from typed JSON (ks_dcp_doc_parse); never unpickles. */
static PyObject *dcp_decode(PyObject *self, PyObject *args, PyObject *kw) {
  (void)self;
  static char *names[] = {"data", "key", NULL};
  Py_buffer data;
  const char *key = "";
  if (!PyArg_ParseTupleAndKeywords(args, kw, "y*|s", names, &data, &key)) return NULL;
  ks_dcp_doc *doc = NULL;
  ks_error err;
  ks_error_clear(&err);
  ks_status st;
  Py_BEGIN_ALLOW_THREADS st = ks_dcp_doc_parse(data.buf, (size_t)data.len, NULL, &doc, &err);
  Py_END_ALLOW_THREADS
  PyBuffer_Release(&data);
  if (st) {
    if (!err.key[0]) snprintf(err.key, sizeof err.key, "%s", key);
    return ksp_raise(st, &err);
  }
  PyObject *bio = bytesio_type();
  PyObject *out = bio ? dec_value(ks_dcp_doc_root(doc), bio, key) : NULL;
  Py_XDECREF(bio);
  ks_dcp_doc_free(doc);
  return out;
}

/* ------------------------------------------------------------------------ */
/* ShardFile: one rank file read lazily.                                     */
/* ------------------------------------------------------------------------ */

typedef struct {
  PyObject_HEAD
  ks_reader *r;
  ksp_loc loc;    /* the file's location (its table), open while r is */
  PyObject *path; /* bytes, for messages */
} ksp_ShardFile;

static int shardfile_init(ksp_ShardFile *self, PyObject *args, PyObject *kw) {
  static char *names[] = {"path", NULL};
  PyObject *fs;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O&", names, PyUnicode_FSConverter, &fs)) return -1;
  if (self->r) {
    Py_DECREF(fs);
    PyErr_SetString(PyExc_RuntimeError, "ShardFile is already open");
    return -1;
  }
  ks_reader *r = NULL;
  ksp_loc l;
  ks_error err;
  ks_error_clear(&err);
  ks_status st;
  const char *p = PyBytes_AS_STRING(fs);
  Py_BEGIN_ALLOW_THREADS st = loc_open(p, ks_io_posix(), &l, &err);
  if (!st) {
    ks_read_opts o = {.size = sizeof o, .mode = KS_READ_LAZY, .io = l.io};
    st = ks_reader_open(l.path, &o, &r, &err);
    if (st) {
      error_location(&err, p, l.path);
      ksp_loc_close(&l);
    }
  }
  Py_END_ALLOW_THREADS
  if (st) {
    ksp_error_path(&err, p);
    Py_DECREF(fs);
    ksp_raise(st, &err);
    return -1;
  }
  self->r = r;
  self->loc = l;
  self->path = fs;
  return 0;
}

static void shardfile_dealloc(ksp_ShardFile *self) {
  ks_reader_free(self->r); /* its handle of the table first */
  ksp_loc_close(&self->loc);
  Py_XDECREF(self->path);
  ksp_free_self((PyObject *)self);
}

static int shardfile_open(const ksp_ShardFile *self) {
  if (self->r) return 0;
  PyErr_SetString(PyExc_ValueError, "ShardFile is not open");
  return -1;
}

static PyObject *shardfile_close(ksp_ShardFile *self, PyObject *unused) {
  (void)unused;
  ks_reader_free(self->r);
  self->r = NULL;
  ksp_loc_close(&self->loc);
  Py_RETURN_NONE;
}

/* Byte count of tensor `name` (the size fetch needs). */
static PyObject *shardfile_nbytes(ksp_ShardFile *self, PyObject *name) {
  if (shardfile_open(self)) return NULL;
  const char *s = PyUnicode_AsUTF8(name);
  if (!s) return NULL;
  long i = ks_reader_find(self->r, s);
  ks_tensor_info info;
  if (i < 0 || ks_reader_tensor_info(self->r, (size_t)i, &info)) {
    ks_error err;
    ks_error_clear(&err);
    snprintf(err.file, sizeof err.file, "%s", PyBytes_AS_STRING(self->path));
    snprintf(err.key, sizeof err.key, "%s", s);
    snprintf(err.message, sizeof err.message, "no tensor named '%s'", s);
    return ksp_raise(KS_E_NOTFOUND, &err);
  }
  return PyLong_FromUnsignedLongLong((unsigned long long)(info.end - info.begin));
}

/* fetch(name, buffer): the tensor's bytes read into a writable buffer of exactly its size, verified. */
static PyObject *shardfile_fetch(ksp_ShardFile *self, PyObject *args) {
  const char *name;
  PyObject *dst;
  if (!PyArg_ParseTuple(args, "sO", &name, &dst) || shardfile_open(self)) return NULL;
  Py_buffer view;
  if (PyObject_GetBuffer(dst, &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return NULL;
  ks_error err;
  ks_error_clear(&err);
  ks_status st;
  long i = ks_reader_find(self->r, name);
  ks_tensor_info info;
  if (i < 0 || ks_reader_tensor_info(self->r, (size_t)i, &info)) {
    st = KS_E_NOTFOUND;
    snprintf(err.key, sizeof err.key, "%s", name);
    snprintf(err.message, sizeof err.message, "no tensor named '%s'", name);
  } else if (info.end - info.begin != (uint64_t)view.len) {
    st = KS_E_SHAPE;
    snprintf(err.key, sizeof err.key, "%s", name);
    snprintf(err.message, sizeof err.message, "tensor '%s' holds %llu bytes, the buffer %zd", name,
             (unsigned long long)(info.end - info.begin), view.len);
  } else {
    ks_reader *r = self->r;
    Py_BEGIN_ALLOW_THREADS st = ks_reader_fetch(r, (size_t)i, view.buf, (size_t)view.len, &err);
    Py_END_ALLOW_THREADS
  }
  PyBuffer_Release(&view);
  if (st) {
    error_location(&err, PyBytes_AS_STRING(self->path), self->loc.path);
    ksp_error_path(&err, PyBytes_AS_STRING(self->path));
    return ksp_raise(st, &err);
  }
  Py_RETURN_NONE;
}

static PyObject *shardfile_metadata(ksp_ShardFile *self, PyObject *unused) {
  (void)unused;
  if (shardfile_open(self)) return NULL;
  return ksp_meta_dict(ks_reader_meta(self->r), 0);
}

static PyMethodDef shardfile_methods[] = {
    {"nbytes", (PyCFunction)shardfile_nbytes, METH_O, "nbytes($self, name, /)\n--\n\nByte count of tensor `name`."},
    {"fetch", (PyCFunction)shardfile_fetch, METH_VARARGS,
     "fetch($self, name, buffer, /)\n--\n\nReads tensor `name` into a writable buffer of its exact size (only its byte "
     "range is read) and verifies its checksum; raises ChecksumError, FormatError, IOError."},
    {"metadata", (PyCFunction)shardfile_metadata, METH_NOARGS, "metadata($self)\n--\n\nEvery __metadata__ pair."},
    {"close", (PyCFunction)shardfile_close, METH_NOARGS, "close($self)\n--\n\nCloses the file."},
    {NULL, NULL, 0, NULL}};

static const char shardfile_doc[] =
    "ShardFile(path)\n--\n\nA keepsake file (a path, s3:// or http(s)://) opened lazily: its header is read "
    "and validated, tensors are read on demand (pread, ranged GETs) and verified.";

static PyType_Slot shardfile_slots[] = {
    {Py_tp_dealloc, KSP_SLOT_FN(shardfile_dealloc)},
    {Py_tp_methods, shardfile_methods},
    {Py_tp_init, KSP_SLOT_FN(shardfile_init)},
    {Py_tp_new, KSP_SLOT_FN(PyType_GenericNew)},
    {Py_tp_doc, (void *)shardfile_doc},
    {0, NULL}};

PyType_Spec ksp_ShardFileSpec = {"keepsake._keepsake.ShardFile", sizeof(ksp_ShardFile), 0,
                                 Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE, shardfile_slots};

PyMethodDef ksp_shard_methods[] = {
    {"shard_file_name", shard_file_name, METH_VARARGS,
     "shard_file_name(rank, world_size, /)\n--\n\nks_shard_file_name: 'rank-XXXXX-of-YYYYY.keepsake'."},
    {"shard_write_rank", (PyCFunction)(void (*)(void))shard_write_rank, METH_VARARGS | METH_KEYWORDS,
     "shard_write_rank(dir, rank, world_size, entries, chunks, metadata=None, fsync=True)\n--\n\n"
     "ks_shard_write_rank with no per-rank globs: entries as save_file takes them, chunks as (name, global_shape, "
     "offsets) of the entries that are chunks of a larger tensor. Returns (size, header xxh3) of the file, what the "
     "index records."},
    {"shard_write_index", (PyCFunction)(void (*)(void))shard_write_index, METH_VARARGS | METH_KEYWORDS,
     "shard_write_index(dir, infos, fsync=True)\n--\n\nks_shard_write_index: the commit, from one (size, header "
     "xxh3) per rank."},
    {"shard_index", (PyCFunction)(void (*)(void))shard_index, METH_VARARGS | METH_KEYWORDS,
     "shard_index(dir, check=True)\n--\n\nThe validated index as a dict (world_size, epoch, batch, files, sharded, "
     "per_rank); with check, every rank file's size and header are held against it (ks_shard_check; 'sizes': the "
     "sizes only). dir: a directory, s3:// or http(s)://."},
    {"shard_prepare_dir", (PyCFunction)(void (*)(void))shard_prepare_dir, METH_VARARGS | METH_KEYWORDS,
     "shard_prepare_dir(dir, fsync=True)\n--\n\nCreates the checkpoint directory and its missing parents, each new "
     "entry's parent fsynced (an s3:// prefix needs nothing)."},
    {"shard_committed", shard_committed, METH_VARARGS,
     "shard_committed(dir, /)\n--\n\nWhether `dir` holds an index file (valid or not)."},
    {"shard_uncommit", (PyCFunction)(void (*)(void))shard_uncommit, METH_VARARGS | METH_KEYWORDS,
     "shard_uncommit(dir, fsync=True)\n--\n\nRemoves the index durably (the directory is then no checkpoint); "
     "True when there was one."},
    {"shard_verify", (PyCFunction)(void (*)(void))shard_verify, METH_VARARGS | METH_KEYWORDS,
     "shard_verify(dir, ranks=None)\n--\n\nks_shard_verify_file for each rank (all when None)."},
    {"shard_location", (PyCFunction)(void (*)(void))shard_location, METH_VARARGS | METH_KEYWORDS,
     "shard_location(dir, write=False)\n--\n\nThe location as the shard functions take it (a local path without "
     "file://, a remote location unchanged); UnsupportedError for a scheme the storage layer does not open, and "
     "with write for a read-only one (http, https)."},
    {"shard_dcp_write_rank", (PyCFunction)(void (*)(void))shard_dcp_write_rank, METH_VARARGS | METH_KEYWORDS,
     "shard_dcp_write_rank(dir, rank, world_size, items, entries, metadata=None, metrics=None, per_rank=False, "
     "dcp=False, planner_data=None, fsync=True)\n--\n\nks_shard_dcp_write_rank: one rank's file of a DCP save (items: "
     "(entry, object, whole, global_shape, offsets)); returns (size, header xxh3)."},
    {"shard_dcp_list", shard_dcp_list, METH_VARARGS,
     "shard_dcp_list(dir, /)\n--\n\nks_shard_dcp_list: ([(fqn, name, kind, dtype, global_shape, chunks, scalar)], "
     "planner_data, [rank file names])."},
    {"shard_load_local", (PyCFunction)(void (*)(void))shard_load_local, METH_VARARGS | METH_KEYWORDS,
     "shard_load_local(dir, rank, world_size, train=(), evals=(), verify=False)\n--\n\nks_shard_load_local: this "
     "rank's keepsake entries and metadata."},
    {"shard_layout", shard_layout, METH_VARARGS,
     "shard_layout(dir, /)\n--\n\nks_shard_local_layout: \"named\" or \"dcp02\"."},
    {"shard_names", shard_names, METH_NOARGS,
     "shard_names()\n--\n\nThe names keepsake reserves in a DCP save: {\"object\": ..., \"local\": ...}."},
    {"dcp_encode", dcp_encode, METH_O,
     "dcp_encode(value, /)\n--\n\nThe typed JSON (ASCII bytes) of a DCP non-tensor value: None, bool, int, float, str, "
     "bytes, io.BytesIO, and lists, tuples and dicts of them (docs/FORMAT.md 9.1). UnsupportedError for anything "
     "else, LimitError past the nesting or digit limits."},
    {"dcp_decode", (PyCFunction)(void (*)(void))dcp_decode, METH_VARARGS | METH_KEYWORDS,
     "dcp_decode(data, key='')\n--\n\nThe value of dcp_encode's bytes; FormatError (or LimitError) naming `key` for "
     "anything else. Never unpickles."},
    {NULL, NULL, 0, NULL}};
