/*
 * keepsake._keepsake.AsyncSaver: the library's background writer (ks_async_saver, the one the
 * checkpoint manager uses) for saves to paths the caller names, such as Lightning's. start()
 * copies every tensor into a file image (the caller's Image, or the saver's own, reused) and
 * returns; a library thread writes the file from it with ks_save's atomic, durable replace. At
 * most one save is in flight (a second start waits for it, or with when_busy="fail" is refused);
 * its error is raised by the next start(), wait() or close(), once. A remote location's store is
 * kept here until its save has ended.
 */
#include <string.h>

#include "ksext.h"

typedef struct {
  PyObject_HEAD
  ks_async_saver *sv;
  ks_io posix[2];    /* the local tables, without and with fsync: fixed, so a save in flight keeps its own */
  ks_storage *store; /* the remote store of the last save started, while it may run */
  PyObject *image;   /* the Image of the last save started, which it may still write from */
  int busy;          /* a call runs with the GIL released */
} ksp_AsyncSaver;

static int usable(ksp_AsyncSaver *self) {
  if (!self->sv) return ksp_raisef(KS_E_STATE, "the background saver is closed"), 0;
  if (self->busy) return ksp_raisef(KS_E_STATE, "the background saver is busy in another thread"), 0;
  return 1;
}

static int AsyncSaver_init(ksp_AsyncSaver *self, PyObject *args, PyObject *kw) {
  static char *names[] = {"when_busy", NULL};
  const char *busy = "wait";
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|s", names, &busy)) return -1;
  if (strcmp(busy, "wait") && strcmp(busy, "fail")) {
    PyErr_SetString(PyExc_ValueError, "when_busy: 'wait' or 'fail'");
    return -1;
  }
  if (self->sv) {
    PyErr_SetString(PyExc_RuntimeError, "AsyncSaver is already initialised");
    return -1;
  }
  (void)ksp_io_posix(0, &self->posix[0]);
  (void)ksp_io_posix(1, &self->posix[1]);
  ks_async_opts o = {.busy = strcmp(busy, "fail") ? KS_ASYNC_WAIT : KS_ASYNC_FAIL_BUSY};
  ks_error err;
  ks_error_clear(&err);
  ks_status st = ks_async_saver_create(&o, &self->sv, &err);
  if (st) return ksp_raise(st, &err), -1;
  return 0;
}

/* Ends the saver: the save in flight finishes (committed, or its temporary file removed). */
static void release(ksp_AsyncSaver *self) {
  ks_async_saver_free(self->sv);
  ks_storage_free(self->store);
  self->sv = NULL;
  self->store = NULL;
}

static void AsyncSaver_dealloc(ksp_AsyncSaver *self) {
  if (self->sv) {
    Py_BEGIN_ALLOW_THREADS release(self);
    Py_END_ALLOW_THREADS
  }
  ksp_image_hold(&self->image, NULL); /* after the saver that wrote from it is gone */
  ksp_free_self((PyObject *)self);
}

static PyObject *AsyncSaver_start(ksp_AsyncSaver *self, PyObject *args, PyObject *kw) {
  static char *names[] = {"path", "entries", "metadata", "metrics", "fsync", "image", NULL};
  PyObject *path, *entries, *metadata = Py_None, *image = Py_None;
  const char *metrics = NULL;
  int fsync = 1;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O|OzpO", names, PyUnicode_FSConverter, &path, &entries, &metadata,
                                   &metrics, &fsync, &image))
    return NULL;
  ks_statedict *sd = NULL;
  ks_meta *meta = NULL;
  ks_image *im = NULL;
  if (!usable(self) || (image != Py_None && !(im = ksp_image_get(image))) ||
      ksp_save_prepare(entries, metadata, metrics, &sd, &meta)) {
    Py_DECREF(path);
    return NULL;
  }
  ks_error err;
  ks_error_clear(&err);
  ks_status st;
  const char *where = NULL;
  ks_save_opts o = {0};
  ks_storage *store = NULL;
  self->busy = 1;
  /* The entries keep every tensor alive for the whole call: the copy into staging runs without
   * the GIL and ends before start_image returns. start_image first waits for (or refuses beside)
   * the save in flight, so once it has started this one, the last one's store and image can go. */
  Py_BEGIN_ALLOW_THREADS st = ksp_location(PyBytes_AS_STRING(path), &self->posix[fsync != 0], &store, &o.io, &where,
                                           &err);
  if (!st) st = ks_async_saver_start_image(self->sv, im, sd, meta, where, &o, NULL, NULL, &err);
  if (!st) {
    ks_storage_free(self->store);
    self->store = store;
    store = NULL;
  }
  ks_storage_free(store);
  Py_END_ALLOW_THREADS
  self->busy = 0;
  if (!st) ksp_image_hold(&self->image, im ? image : NULL);
  ks_meta_free(meta);
  ks_statedict_free(sd);
  Py_DECREF(path);
  if (st) return ksp_raise(st, &err);
  Py_RETURN_NONE;
}

static KS_NODISCARD ks_status wait_for(void *sv, ks_error *err) { return ks_async_saver_wait(sv, err); }

static PyObject *AsyncSaver_wait(ksp_AsyncSaver *self, PyObject *unused) {
  (void)unused;
  return usable(self) ? ksp_call_unlocked(&self->busy, wait_for, self->sv) : NULL;
}

static PyObject *AsyncSaver_close(ksp_AsyncSaver *self, PyObject *unused) {
  (void)unused;
  if (self->busy) return ksp_raisef(KS_E_STATE, "the background saver is busy in another thread");
  if (!self->sv) Py_RETURN_NONE;
  ks_error err;
  ks_error_clear(&err);
  ks_status st;
  self->busy = 1;
  Py_BEGIN_ALLOW_THREADS st = ks_async_saver_wait(self->sv, &err); /* its error is the caller's to see */
  release(self);
  Py_END_ALLOW_THREADS
  self->busy = 0;
  ksp_image_hold(&self->image, NULL);
  if (st) return ksp_raise(st, &err);
  Py_RETURN_NONE;
}

static PyObject *AsyncSaver_get_busy(ksp_AsyncSaver *self, void *closure) {
  (void)closure;
  return PyBool_FromLong(self->sv && ks_async_saver_busy(self->sv));
}

static PyMethodDef AsyncSaver_methods[] = {
    {"start", (PyCFunction)(void (*)(void))AsyncSaver_start, METH_VARARGS | METH_KEYWORDS,
     "start($self, path, entries, metadata=None, metrics=None, fsync=True, image=None)\n--\n\n"
     "ks_async_saver_start_image: copies the entries (as save_file takes them) into image (an Image; None: the "
     "saver's own) and returns; the library's thread writes path, atomically and durably. Raises the error of "
     "the last save, once, instead of starting."},
    {"wait", (PyCFunction)AsyncSaver_wait, METH_NOARGS,
     "wait($self)\n--\n\nWaits for the save in flight; raises its error."},
    {"close", (PyCFunction)AsyncSaver_close, METH_NOARGS,
     "close($self)\n--\n\nFinishes the save in flight (raising its error), then frees the saver."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef AsyncSaver_getset[] = {
    {"busy", (getter)AsyncSaver_get_busy, NULL, "a save is still being written", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static const char AsyncSaver_doc[] =
    "AsyncSaver(when_busy='wait')\n--\n\nThe library's background writer for saves to named paths.";

static PyType_Slot AsyncSaver_slots[] = {
    {Py_tp_dealloc, KSP_SLOT_FN(AsyncSaver_dealloc)},
    {Py_tp_methods, AsyncSaver_methods},
    {Py_tp_getset, AsyncSaver_getset},
    {Py_tp_init, KSP_SLOT_FN(AsyncSaver_init)},
    {Py_tp_new, KSP_SLOT_FN(PyType_GenericNew)},
    {Py_tp_doc, (void *)AsyncSaver_doc},
    {0, NULL}};

static PyType_Spec AsyncSaverSpec = {"keepsake._keepsake.AsyncSaver", sizeof(ksp_AsyncSaver), 0,
                                     Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE, AsyncSaver_slots};

int ksp_async_add_type(PyObject *m) {
  return ksp_add_type(m, &AsyncSaverSpec) ? 0 : -1;
}
