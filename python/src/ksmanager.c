/*
 * keepsake._keepsake.Manager: the C checkpoint manager (ks_ckpt_manager) for Python programs.
 * Every rule is the library's: file names, `latest`, the retention policies, the run directory
 * lock, the save triggers, autoresume's choice of the newest checkpoint that verifies (corrupt
 * ones set aside), background saves (the state is copied before save() returns, the write runs
 * on the library's thread) and storage locations. Python flattens the program's objects into
 * entries, as for save_file, and fills them back with load_checkpoint from the path autoresume
 * returns.
 */
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "ksext.h"

typedef struct {
  PyObject_HEAD
  ks_ckpt_manager *m;
  ks_storage *store, *upload;
  ks_io *cache[2]; /* cache_dir: read caches over a remote run directory and upload store, or NULL */
  int busy; /* a call is running with the GIL released: refuse a second one and close() */
  PyObject *image; /* the Image of the last background save, which may still write from it */
} ksp_Manager;

static PyObject *closed_error(void) { return ksp_raisef(KS_E_STATE, "the checkpoint manager is closed"); }

static int usable(ksp_Manager *self) {
  if (!self->m) return closed_error(), 0;
  if (self->busy) return ksp_raisef(KS_E_STATE, "the checkpoint manager is busy in another thread"), 0;
  return 1;
}

static void release(ksp_Manager *self) {
  ks_ckpt_manager_free(self->m); /* finishes a save in flight, then drops the run directory's lock */
  ks_io_cache_free(self->cache[0]); /* before the stores they wrap */
  ks_io_cache_free(self->cache[1]);
  self->cache[0] = self->cache[1] = NULL;
  ks_storage_free(self->store);
  ks_storage_free(self->upload);
  self->m = NULL, self->store = self->upload = NULL;
}

static void Manager_dealloc(ksp_Manager *self) {
  if (self->m) {
    Py_BEGIN_ALLOW_THREADS release(self);
    Py_END_ALLOW_THREADS
  }
  ksp_image_hold(&self->image, NULL); /* after the saver that wrote from it is gone */
  ksp_free_self((PyObject *)self);
}

/* A ks_timestamp from a dict of Timestamp fields (missing ones are 0). 0, or -1 with an exception. */
static int timestamp_from(PyObject *d, ks_timestamp *ts) {
  ks_timestamp_init(ts);
  if (d == Py_None) return 0;
  if (!PyDict_Check(d)) return PyErr_SetString(PyExc_TypeError, "timestamp: expected a dict of fields"), -1;
  struct {
    const char *name;
    int64_t *i;
    double *f;
  } fields[] = {{"epoch", &ts->epoch, NULL},
                {"batch", &ts->batch, NULL},
                {"sample", &ts->sample, NULL},
                {"token", &ts->token, NULL},
                {"batch_in_epoch", &ts->batch_in_epoch, NULL},
                {"sample_in_epoch", &ts->sample_in_epoch, NULL},
                {"token_in_epoch", &ts->token_in_epoch, NULL},
                {"total_wct", NULL, &ts->total_wct},
                {"epoch_wct", NULL, &ts->epoch_wct},
                {"batch_wct", NULL, &ts->batch_wct}};
  for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
    PyObject *v = PyDict_GetItemString(d, fields[i].name); /* borrowed */
    if (!v) continue;
    if (fields[i].i) {
      long long x = PyLong_AsLongLong(v);
      if (x == -1 && PyErr_Occurred()) return -1;
      *fields[i].i = (int64_t)x;
    } else {
      double x = PyFloat_AsDouble(v);
      if (x == -1.0 && PyErr_Occurred()) return -1;
      *fields[i].f = x;
    }
  }
  return 0;
}

static int enum_arg(const char *what, const char *v, const char *const *names, int n, int *out) {
  for (int i = 0; v && i < n; i++)
    if (!strcmp(v, names[i])) return *out = i, 0;
  if (!v) return 0;
  PyErr_Format(PyExc_ValueError, "%s: '%s' is not one of the choices", what, v);
  return -1;
}

static int open_store(PyObject *loc, ks_storage **out) {
  ks_error err;
  ks_error_clear(&err);
  ks_status st = ks_storage_open(PyBytes_AS_STRING(loc), NULL, out, &err);
  if (st) ksp_raise(st, &err);
  return st ? -1 : 0;
}

/*
 * cache_dir: a remote store's table wrapped by the library's read cache in cache_dir/<which>, as
 * keepsake-digits --cache-dir does: autoresume's reads and upload-mode downloads of bytes read
 * before come from the cache; writes go through unchanged. A local store is not cached.
 */
static int with_cache(ksp_Manager *self, int i, PyObject *cache_dir, const char *which) {
  ks_storage *st = i ? self->upload : self->store;
  if (!cache_dir || !st || !ks_storage_is_remote(st)) return 0;
  PyObject *dir = PyBytes_FromFormat("%s/%s", PyBytes_AS_STRING(cache_dir), which);
  if (!dir) return -1;
  ks_error err;
  ks_error_clear(&err);
  ks_status s = ks_io_cache_create(ks_storage_io(st), PyBytes_AS_STRING(dir), NULL, &self->cache[i], &err);
  Py_DECREF(dir);
  if (s) ksp_raise(s, &err);
  return s ? -1 : 0;
}

/* save_interval: "100ba", "2ep", None, or an int: that many batches. A new reference to the str, or NULL. */
static PyObject *interval_arg(PyObject *v) {
  if (v == Py_None || PyUnicode_Check(v)) return Py_INCREF(v), v;
  if (PyLong_Check(v) && !PyBool_Check(v)) return PyUnicode_FromFormat("%Sba", v); /* the library checks n > 0 */
  char tname[128];
  PyErr_Format(PyExc_TypeError, "save_every: expected \"<n>ba\", \"<n>ep\" or an int (batches), not %s",
               ksp_type_name(v, tname, sizeof tname));
  return NULL;
}

/* metrics: the program's metric paths (a sequence of str) for ks_ckpt_opts.metrics, or None. PyMem. */
static int metrics_arg(PyObject *seq, PyObject **fast, const char ***paths, size_t *n) {
  *fast = NULL, *paths = NULL, *n = 0;
  if (seq == Py_None) return 0;
  *fast = PySequence_Fast(seq, "metrics: expected a sequence of metric paths");
  if (!*fast) return -1;
  Py_ssize_t len = PySequence_Fast_GET_SIZE(*fast);
  *paths = PyMem_Calloc((size_t)len + 1, sizeof **paths);
  if (!*paths) return PyErr_NoMemory(), -1;
  for (Py_ssize_t i = 0; i < len; i++)
    if (!((*paths)[i] = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(*fast, i)))) return -1;
  *n = (size_t)len;
  return 0;
}

static int Manager_init(ksp_Manager *self, PyObject *args, PyObject *kw) {
  static char *names[] = {"run_dir", "save_interval", "filename", "keep", "keep_best", "best_metric", "best_mode",
                          "keep_every", "keep_period_seconds", "save_every_seconds", "async_busy", "lock",
                          "upload_to", "upload_retention", "retention_log", "sharded", "cache_dir", "metrics", NULL};
  PyObject *run_dir, *upload_to = Py_None, *cache = Py_None, *interval_o = Py_None, *metrics_o = Py_None;
  const char *filename = NULL, *best_metric = NULL, *best_mode = NULL, *keep_every = NULL;
  const char *busy = NULL, *lock = NULL;
  int keep = 0, keep_best = 0, upload_retention = 0, retention_log = 0, sharded = 0;
  double period = 0, every_s = 0;
  if (self->m || self->busy) return ksp_raisef(KS_E_STATE, "Manager is already initialised"), -1;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|OziizzzddzzOpppOO", names, PyUnicode_FSConverter, &run_dir,
                                   &interval_o, &filename, &keep, &keep_best, &best_metric, &best_mode, &keep_every,
                                   &period, &every_s, &busy, &lock, &upload_to, &upload_retention, &retention_log,
                                   &sharded, &cache, &metrics_o))
    return -1;
  PyObject *interval_s = interval_arg(interval_o), *metrics_fast = NULL;
  const char *interval = interval_s && interval_s != Py_None ? PyUnicode_AsUTF8(interval_s) : NULL;
  const char **metric_paths = NULL;
  size_t n_metrics = 0;
  if (!interval_s || (interval_s != Py_None && !interval) ||
      metrics_arg(metrics_o, &metrics_fast, &metric_paths, &n_metrics)) {
    Py_XDECREF(interval_s);
    Py_XDECREF(metrics_fast);
    PyMem_Free(metric_paths);
    Py_DECREF(run_dir);
    return -1;
  }
  static const char *const modes[] = {"max", "min"}, *const busies[] = {"wait", "fail"},
                           *const locks[] = {"auto", "require", "off"};
  int mode = 0, busy_mode = 0, lock_mode = 0;
  PyObject *up = NULL, *cache_dir = NULL;
  int rc = enum_arg("best_mode", best_mode, modes, 2, &mode) || enum_arg("async_busy", busy, busies, 2, &busy_mode) ||
           enum_arg("lock", lock, locks, 3, &lock_mode);
  if (!rc && upload_to != Py_None && !PyUnicode_FSConverter(upload_to, &up)) rc = -1;
  if (!rc) rc = open_store(run_dir, &self->store);
  if (!rc && up) rc = open_store(up, &self->upload);
  if (!rc && cache != Py_None && !PyUnicode_FSConverter(cache, &cache_dir)) rc = -1;
  if (!rc) rc = with_cache(self, 0, cache_dir, "run");
  if (!rc) rc = with_cache(self, 1, cache_dir, "upload");
  Py_DECREF(run_dir);
  Py_XDECREF(up);
  Py_XDECREF(cache_dir);
  if (rc) {
    Py_XDECREF(interval_s);
    Py_XDECREF(metrics_fast);
    PyMem_Free(metric_paths);
    return release(self), -1;
  }
  ks_ckpt_opts co = {.run_dir = ks_storage_path(self->store),
                     .io = self->cache[0] ? self->cache[0] : ks_storage_io(self->store),
                     .save_interval = interval,
                     .filename = filename,
                     .keep = keep,
                     .keep_best = keep_best,
                     .best_metric = best_metric,
                     .best_mode = mode ? KS_BEST_MIN : KS_BEST_MAX,
                     .keep_every = keep_every,
                     .keep_period_seconds = period,
                     .save_every_seconds = every_s,
                     .async_busy = busy_mode ? KS_ASYNC_FAIL_BUSY : KS_ASYNC_WAIT,
                     .retention_log = retention_log ? stdout : NULL,
                     .sharded = sharded,
                     .lock = lock_mode == 1   ? KS_CKPT_LOCK_REQUIRE
                             : lock_mode == 2 ? KS_CKPT_LOCK_OFF
                                              : KS_CKPT_LOCK_AUTO,
                     .metrics = metric_paths,
                     .n_metrics = n_metrics};
  if (self->upload) {
    co.upload_io = self->cache[1] ? self->cache[1] : ks_storage_io(self->upload);
    co.upload_dir = ks_storage_path(self->upload);
    co.upload_retention = upload_retention;
  }
  ks_error err;
  ks_error_clear(&err);
  ks_status st;
  Py_BEGIN_ALLOW_THREADS st = ks_ckpt_manager_create(&co, &self->m, &err);
  Py_END_ALLOW_THREADS
  Py_XDECREF(interval_s); /* the options are copied or used by now */
  Py_XDECREF(metrics_fast);
  PyMem_Free(metric_paths);
  if (st) {
    release(self);
    ksp_raise(st, &err);
    return -1;
  }
  return 0;
}

static PyObject *Manager_should_save(ksp_Manager *self, PyObject *args) {
  PyObject *ts_d;
  int epoch_end = 0;
  if (!PyArg_ParseTuple(args, "O|p", &ts_d, &epoch_end) || !usable(self)) return NULL;
  ks_timestamp ts;
  if (timestamp_from(ts_d, &ts)) return NULL;
  return PyBool_FromLong(ks_ckpt_manager_should_save(self->m, &ts, epoch_end));
}

static PyObject *Manager_save(ksp_Manager *self, PyObject *args, PyObject *kw) {
  static char *names[] = {"entries", "metadata", "metrics", "timestamp", "blocking", "image", NULL};
  PyObject *entries, *metadata = Py_None, *ts_d = Py_None, *image = Py_None;
  const char *metrics = NULL;
  int blocking = 1;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OzOpO", names, &entries, &metadata, &metrics, &ts_d, &blocking,
                                   &image) ||
      !usable(self))
    return NULL;
  ks_image *im = image == Py_None ? NULL : ksp_image_get(image);
  if (image != Py_None && !im) return NULL;
  ks_timestamp ts;
  ks_statedict *sd;
  ks_meta *meta;
  if (timestamp_from(ts_d, &ts) || ksp_save_prepare(entries, metadata, metrics, &sd, &meta)) return NULL;
  ks_error err;
  ks_error_clear(&err);
  ks_status st;
  const char *saved = NULL;
  /* The entries list holds every tensor alive for the whole call: the GIL may go, even for the
   * copy of a background save (done before save_image returns). */
  self->busy = 1;
  Py_BEGIN_ALLOW_THREADS st = ks_ckpt_manager_save_image(self->m, im, sd, meta, &ts, !blocking, &saved, &err);
  if (!st && blocking) st = ks_ckpt_manager_wait(self->m, &err);
  Py_END_ALLOW_THREADS
  self->busy = 0;
  /* The last background save's image is held while it may write from it: a started one's, until
   * the next save (which waits for it first) or close; a blocking save has waited for them all. */
  if (!st || blocking) ksp_image_hold(&self->image, !st && !blocking && im ? image : NULL);
  ks_meta_free(meta);
  ks_statedict_free(sd);
  if (st) return ksp_raise(st, &err);
  return PyUnicode_DecodeFSDefault(saved);
}

static PyObject *Manager_place(ksp_Manager *self, PyObject *args, PyObject *kw) {
  static char *names[] = {"image", "entries", "metadata", "metrics", NULL};
  PyObject *image, *entries, *metadata = Py_None;
  const char *metrics = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|Oz", names, &image, &entries, &metadata, &metrics) || !usable(self))
    return NULL;
  return ksp_image_place(&self->busy, image, entries, metadata, metrics);
}

static KS_NODISCARD ks_status wait_for(void *m, ks_error *err) { return ks_ckpt_manager_wait(m, err); }

static PyObject *Manager_wait(ksp_Manager *self, PyObject *unused) {
  (void)unused;
  return usable(self) ? ksp_call_unlocked(&self->busy, wait_for, self->m) : NULL;
}

/* Where to resume from: the newest checkpoint that fully verifies (the library's choice; corrupt
 * ones are set aside with a warning), loaded into an empty state so nothing of the program is
 * touched here; Python then fills its objects from the path. */
static KS_NODISCARD ks_status resume_path(ks_ckpt_manager *m, const char **path, ks_error *err) {
  ks_state *st = NULL;
  ks_load_report *rep = NULL;
  int resumed = 0;
  *path = NULL;
  ks_status s = ks_state_create("", 0, NULL, &st, err);
  if (!s) s = ks_load_report_create(NULL, &rep, err);
  ks_load_opts o = {.non_strict_model = 1};
  if (!s) s = ks_ckpt_manager_autoresume(m, st, &o, rep, &resumed, path, err);
  if (!resumed) *path = NULL;
  ks_load_report_free(rep);
  ks_state_free(st);
  return s;
}

/* (path or None, how many corrupt checkpoints the search set aside): what a resume search found. */
static PyObject *path_and_skipped(ksp_Manager *self, const char *path) {
  Py_ssize_t skipped = (Py_ssize_t)ks_ckpt_manager_skipped(self->m);
  if (!path) return Py_BuildValue("(On)", Py_None, skipped);
  return Py_BuildValue("(Nn)", PyUnicode_DecodeFSDefault(path), skipped);
}

static PyObject *Manager_resume_path(ksp_Manager *self, PyObject *unused) {
  (void)unused;
  if (!usable(self)) return NULL;
  ks_error err;
  ks_error_clear(&err);
  ks_status st;
  const char *path = NULL;
  self->busy = 1;
  Py_BEGIN_ALLOW_THREADS st = resume_path(self->m, &path, &err);
  Py_END_ALLOW_THREADS
  self->busy = 0;
  if (st) return ksp_raise(st, &err);
  return path_and_skipped(self, path);
}

static PyObject *Manager_close(ksp_Manager *self, PyObject *unused) {
  (void)unused;
  if (self->busy) return ksp_raisef(KS_E_STATE, "the checkpoint manager is busy in another thread");
  if (!self->m) Py_RETURN_NONE;
  ks_error err;
  ks_error_clear(&err);
  ks_status st;
  self->busy = 1;
  Py_BEGIN_ALLOW_THREADS st = ks_ckpt_manager_wait(self->m, &err); /* its error is the caller's to see */
  release(self);
  Py_END_ALLOW_THREADS
  self->busy = 0;
  ksp_image_hold(&self->image, NULL);
  if (st) return ksp_raise(st, &err);
  Py_RETURN_NONE;
}

static PyObject *Manager_storage_path(ksp_Manager *self, void *closure) {
  (void)closure;
  if (!self->store) return closed_error();
  return PyUnicode_DecodeFSDefault(ks_storage_path(self->store));
}

/* ---- sharded checkpoint directories (sharded=True): the ranks of a torch.distributed run write
 * each directory (keepsake.distributed's DCP storage); the manager names it, removes dead saves,
 * points `latest` at a committed one, applies retention and picks the newest that verifies. ---- */

static PyObject *Manager_dir_begin(ksp_Manager *self, PyObject *args) {
  PyObject *ts_d;
  if (!PyArg_ParseTuple(args, "O", &ts_d) || !usable(self)) return NULL;
  ks_timestamp ts;
  if (timestamp_from(ts_d, &ts)) return NULL;
  ks_error err;
  ks_error_clear(&err);
  ks_status st;
  const char *dir = NULL;
  size_t removed = 0;
  self->busy = 1;
  Py_BEGIN_ALLOW_THREADS st = ks_ckpt_manager_dir_begin(self->m, &ts, &dir, &removed, &err);
  Py_END_ALLOW_THREADS
  self->busy = 0;
  if (st) return ksp_raise(st, &err);
  return Py_BuildValue("(Nn)", PyUnicode_DecodeFSDefault(dir), (Py_ssize_t)removed);
}

static PyObject *Manager_dir_path(ksp_Manager *self, PyObject *args) {
  PyObject *ts_d;
  if (!PyArg_ParseTuple(args, "O", &ts_d) || !usable(self)) return NULL;
  ks_timestamp ts;
  if (timestamp_from(ts_d, &ts)) return NULL;
  ks_error err;
  ks_error_clear(&err);
  const char *dir = NULL;
  ks_status st = ks_ckpt_manager_dir_path(self->m, &ts, &dir, &err);
  if (st) return ksp_raise(st, &err);
  return PyUnicode_DecodeFSDefault(dir);
}

static PyObject *Manager_dir_commit(ksp_Manager *self, PyObject *args) {
  PyObject *dir;
  if (!PyArg_ParseTuple(args, "O&", PyUnicode_FSConverter, &dir)) return NULL;
  if (!usable(self)) return Py_DECREF(dir), NULL;
  ks_error err;
  ks_error_clear(&err);
  ks_status st;
  const char *d = PyBytes_AS_STRING(dir);
  self->busy = 1;
  Py_BEGIN_ALLOW_THREADS st = ks_ckpt_manager_dir_commit(self->m, d, &err);
  Py_END_ALLOW_THREADS
  self->busy = 0;
  Py_DECREF(dir);
  if (st) return ksp_raise(st, &err);
  Py_RETURN_NONE;
}

static PyObject *Manager_dir_latest(ksp_Manager *self, PyObject *unused) {
  (void)unused;
  if (!usable(self)) return NULL;
  ks_error err;
  ks_error_clear(&err);
  ks_status st;
  const char *dir = NULL;
  self->busy = 1;
  Py_BEGIN_ALLOW_THREADS st = ks_ckpt_manager_dir_latest(self->m, &dir, &err);
  Py_END_ALLOW_THREADS
  self->busy = 0;
  if (st) return ksp_raise(st, &err);
  return path_and_skipped(self, dir);
}

static PyMethodDef Manager_methods[] = {
    {"should_save", (PyCFunction)Manager_should_save, METH_VARARGS,
     "should_save($self, timestamp, epoch_end=False, /)\n--\n\n"
     "ks_ckpt_manager_should_save: the interval, the clock or a "
     "preemption signal says save now."},
    {"save", (PyCFunction)(void (*)(void))Manager_save, METH_VARARGS | METH_KEYWORDS,
     "save($self, entries, metadata=None, metrics=None, timestamp=None, blocking=True, image=None)\n--\n\n"
     "ks_ckpt_manager_save_image: saves entries (as save_file takes them) under the templated name, through "
     "image (an Image) when given, then latest and retention; blocking=False returns once they are copied. "
     "Returns the path."},
    {"place", (PyCFunction)(void (*)(void))Manager_place, METH_VARARGS | METH_KEYWORDS,
     "place($self, image, entries, metadata=None, metrics=None)\n--\n\nks_image_get for the next save of entries "
     "through image (after a save writing from it): (bytes the image wants, {tensor name: offset in its memory}), "
     "or (bytes, None) when its memory is too small. Entries at address 0 count by their size."},
    {"wait", (PyCFunction)Manager_wait, METH_NOARGS,
     "wait($self)\n--\n\nWaits for a background save; raises its error."},
    {"resume_path", (PyCFunction)Manager_resume_path, METH_NOARGS,
     "resume_path($self)\n--\n\n(path of the newest checkpoint that verifies, or None; checkpoints set aside)."},
    {"close", (PyCFunction)Manager_close, METH_NOARGS,
     "close($self)\n--\n\nFinishes a save in flight, releases the run directory's lock."},
    {"dir_begin", (PyCFunction)Manager_dir_begin, METH_VARARGS,
     "dir_begin($self, timestamp, /)\n--\n\nks_ckpt_manager_dir_begin (sharded=True, one process while no save is in "
     "flight): removes dead saves; returns (the directory to write, how many were removed)."},
    {"dir_path", (PyCFunction)Manager_dir_path, METH_VARARGS,
     "dir_path($self, timestamp, /)\n--\n\n"
     "ks_ckpt_manager_dir_path: the directory a sharded save at timestamp writes."},
    {"dir_commit", (PyCFunction)Manager_dir_commit, METH_VARARGS,
     "dir_commit($self, dir, /)\n--\n\nks_ckpt_manager_dir_commit: `latest` and retention after the index is durable."},
    {"dir_latest", (PyCFunction)Manager_dir_latest, METH_NOARGS,
     "dir_latest($self)\n--\n\nks_ckpt_manager_dir_latest: (the newest directory whose files verify, or None; "
     "directories skipped); dead saves are removed."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Manager_getset[] = {
    {"path", (getter)Manager_storage_path, NULL, "the run directory, as the storage location names it", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static const char Manager_doc[] =
    "Manager(run_dir, save_interval=None, filename=None, keep=0, keep_best=0, best_metric=None, best_mode='max', "
    "keep_every=None, keep_period_seconds=0.0, save_every_seconds=0.0, async_busy='wait', lock='auto', "
    "upload_to=None, upload_retention=False, retention_log=False, sharded=False, cache_dir=None, metrics=None)"
    "\n--\n\nThe C checkpoint manager (use keepsake.CheckpointManager).";

static PyType_Slot Manager_slots[] = {
    {Py_tp_dealloc, KSP_SLOT_FN(Manager_dealloc)},
    {Py_tp_methods, Manager_methods},
    {Py_tp_getset, Manager_getset},
    {Py_tp_init, KSP_SLOT_FN(Manager_init)},
    {Py_tp_new, KSP_SLOT_FN(PyType_GenericNew)},
    {Py_tp_doc, (void *)Manager_doc},
    {0, NULL}};

PyType_Spec ksp_ManagerSpec = {"keepsake._keepsake.Manager", sizeof(ksp_Manager), 0,
                               Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE, Manager_slots};

/* The signal numbers of a sequence (1 to 16 of them) into sigs; 0, or -1 with an exception set. */
static int signals_of(PyObject *seq, int *sigs, size_t *n, const char *what) {
  PyObject *fast = PySequence_Fast(seq, "expected a sequence of signal numbers");
  if (!fast) return -1;
  Py_ssize_t len = PySequence_Fast_GET_SIZE(fast);
  if (len < 1 || len > 16) {
    Py_DECREF(fast);
    return ksp_raisef(KS_E_INVALID, "%s: give 1 to 16 signals", what), -1;
  }
  for (Py_ssize_t i = 0; i < len; i++) {
    long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(fast, i));
    if (v == -1 && PyErr_Occurred()) return Py_DECREF(fast), -1;
    sigs[i] = v < INT_MIN || v > INT_MAX ? -1 : (int)v;
  }
  Py_DECREF(fast);
  *n = (size_t)len;
  return 0;
}

PyObject *ksp_preemption_install(PyObject *self, PyObject *args) {
  (void)self;
  PyObject *seq;
  int sigs[16];
  size_t n = 0;
  if (!PyArg_ParseTuple(args, "O", &seq) || signals_of(seq, sigs, &n, "preemption_install")) return NULL;
  ks_error err;
  ks_error_clear(&err);
  ks_status st = ks_preemption_install(sigs, n, &err);
  if (st) return ksp_raise(st, &err);
  PyObject *out = PyTuple_New((Py_ssize_t)n); /* what preemption_uninstall takes back */
  for (size_t i = 0; out && i < n; i++) {
    PyObject *v = PyLong_FromLong(sigs[i]);
    if (!v) Py_CLEAR(out);
    else PyTuple_SET_ITEM(out, (Py_ssize_t)i, v);
  }
  if (!out) { /* undone here: the caller gets no signals to give back (the exception is out of memory) */
    ks_status undone = ks_preemption_uninstall(sigs, n, NULL);
    (void)undone;
  }
  return out;
}

PyObject *ksp_preemption_uninstall(PyObject *self, PyObject *args) {
  (void)self;
  PyObject *seq;
  int sigs[16];
  size_t n = 0;
  if (!PyArg_ParseTuple(args, "O", &seq)) return NULL;
  int any = PyObject_IsTrue(seq);
  if (any == 0) Py_RETURN_NONE; /* () or None: nothing was installed */
  if (any < 0 || signals_of(seq, sigs, &n, "preemption_uninstall")) return NULL;
  ks_error err;
  ks_error_clear(&err);
  ks_status st = ks_preemption_uninstall(sigs, n, &err);
  if (st) return ksp_raise(st, &err);
  Py_RETURN_NONE;
}

PyObject *ksp_preemption_signal(PyObject *self, PyObject *unused) {
  (void)self, (void)unused;
  return PyLong_FromLong(ks_preemption_signal());
}
