/*
 * keepsake._keepsake.Image: a file image (ks_image, format.h) for the staged saves of a manager
 * or a background saver: the state's layout computed once, in the image's own memory (allocated
 * and touched when it is made: a manager's reserve()) or in the caller's (a HostStaging's
 * page-locked buffer, which device tensors are copied into at the offsets Manager.place gives).
 * A manager or saver that starts a background save from an image holds it (and, through it, the
 * memory's owner) until its next save or its close, so an image is never freed under a save.
 */
#include <string.h>

#include "ksext.h"

typedef struct {
  PyObject_HEAD
  ks_image *im;
  PyObject *owner; /* what holds the caller's memory: kept until the image is freed */
  size_t need;     /* bytes of memory the layout wants (headroom included), at creation */
  int held;        /* managers and savers whose save in flight may write from it */
} ksp_Image;

PyTypeObject *ksp_ImageType;

/* entries with every tensor at address 0 (a device tensor not yet staged) pointed at `stand_in`
 * instead: a layout reads sizes, never data, and the state dict refuses tensors without data. */
PyObject *ksp_layout_entries(PyObject *entries) {
  static const unsigned char stand_in;
  PyObject *seq = PySequence_Fast(entries, "entries must be a sequence");
  PyObject *out = seq ? PyList_New(PySequence_Fast_GET_SIZE(seq)) : NULL;
  for (Py_ssize_t i = 0; out && i < PySequence_Fast_GET_SIZE(seq); i++) {
    PyObject *e = PySequence_Fast_GET_ITEM(seq, i), *addr = NULL;
    int zero = PyTuple_Check(e) && PyTuple_GET_SIZE(e) == 5 && PyLong_Check(addr = PyTuple_GET_ITEM(e, 3)) &&
               PyLong_AsUnsignedLongLong(addr) == 0;
    PyObject *item = zero ? Py_BuildValue("(OOOKO)", PyTuple_GET_ITEM(e, 0), PyTuple_GET_ITEM(e, 1),
                                          PyTuple_GET_ITEM(e, 2), (unsigned long long)(uintptr_t)&stand_in,
                                          PyTuple_GET_ITEM(e, 4))
                        : (Py_INCREF(e), e);
    if (!item || PyErr_Occurred()) {
      Py_XDECREF(item);
      Py_CLEAR(out);
      break;
    }
    PyList_SET_ITEM(out, i, item);
  }
  Py_XDECREF(seq);
  return out;
}

/* The state dict (placeholders as ksp_layout_entries makes them) and metadata of a save. 0, or -1. */
int ksp_layout_prepare(PyObject *entries, PyObject *metadata, const char *metrics, ks_statedict **sd,
                       ks_meta **meta) {
  PyObject *sized = ksp_layout_entries(entries);
  int rc = !sized || ksp_save_prepare(sized, metadata, metrics, sd, meta) ? -1 : 0;
  Py_XDECREF(sized);
  return rc;
}

static int Image_init(ksp_Image *self, PyObject *args, PyObject *kw) {
  static char *names[] = {"entries", "metadata", "metrics", "address", "size", "owner", "layout_only", NULL};
  PyObject *entries, *metadata = Py_None, *owner = Py_None;
  const char *metrics = NULL;
  unsigned long long addr = 0, size = 0;
  int layout_only = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OzKKOp", names, &entries, &metadata, &metrics, &addr, &size, &owner,
                                   &layout_only))
    return -1;
  if (self->im) return ksp_raisef(KS_E_STATE, "Image is already initialised"), -1;
  ks_statedict *sd = NULL;
  ks_meta *meta = NULL;
  if (ksp_layout_prepare(entries, metadata, metrics, &sd, &meta)) return -1;
  ks_image_opts o = {.size = sizeof o, .buf = (void *)(uintptr_t)addr, .buf_size = (size_t)size,
                     .layout_only = layout_only};
  ks_image_info info = {.size = sizeof info};
  ks_error err;
  ks_error_clear(&err);
  ks_status st;
  /* Its own memory is touched page by page here (a reserve()): without the GIL. */
  Py_BEGIN_ALLOW_THREADS st = ks_image_create(sd, meta, &o, &self->im, &err);
  if (!st) st = ks_image_get(self->im, NULL, NULL, &info, &err);
  Py_END_ALLOW_THREADS
  ks_meta_free(meta);
  ks_statedict_free(sd);
  if (st) return ksp_raise(st, &err), -1;
  self->need = info.need;
  Py_INCREF(owner);
  Py_XSETREF(self->owner, owner);
  return 0;
}

/* Frees the image; its owner (the caller's memory) after it. */
static void release(ksp_Image *self) {
  ks_image *im = self->im;
  self->im = NULL;
  if (im) {
    Py_BEGIN_ALLOW_THREADS ks_image_free(im); /* no save writes from it: none holds it (see held) */
    Py_END_ALLOW_THREADS
  }
  Py_CLEAR(self->owner);
}

static void Image_dealloc(ksp_Image *self) {
  release(self);
  ksp_free_self((PyObject *)self);
}

static PyObject *Image_close(ksp_Image *self, PyObject *unused) {
  (void)unused;
  if (self->held)
    return ksp_raisef(KS_E_STATE, "this image is a checkpoint manager's or background saver's (a save may write from "
                                  "it): it is freed once that one saves through another image or is closed");
  release(self);
  Py_RETURN_NONE;
}

static PyObject *Image_get_need(ksp_Image *self, void *closure) {
  (void)closure;
  return PyLong_FromSize_t(self->need);
}

static PyObject *Image_get_closed(ksp_Image *self, void *closure) {
  (void)closure;
  return PyBool_FromLong(!self->im);
}

ks_image *ksp_image_get(PyObject *o) {
  if (!PyObject_TypeCheck(o, ksp_ImageType)) {
    PyErr_SetString(PyExc_TypeError, "image: expected a keepsake._keepsake.Image or None");
    return NULL;
  }
  if (!((ksp_Image *)o)->im) {
    ksp_raisef(KS_E_STATE, "the image is closed");
    return NULL;
  }
  return ((ksp_Image *)o)->im;
}

void ksp_image_hold(PyObject **slot, PyObject *image) {
  if (*slot == image) return;
  if (image) {
    ((ksp_Image *)image)->held++;
    Py_INCREF(image);
  }
  PyObject *old = *slot;
  *slot = image;
  if (old) {
    ((ksp_Image *)old)->held--;
    Py_DECREF(old);
  }
}

/* {name: offset} of the tensor entries of sd, from the image's offsets. */
static PyObject *offsets_dict(const ks_statedict *sd, const ks_image_info *info) {
  PyObject *d = PyDict_New();
  for (size_t i = 0; d && i < ks_statedict_count(sd) && i < info->count; i++) {
    ks_entry e;
    if (info->offsets[i] == UINT64_MAX || ks_statedict_at(sd, i, &e)) continue;
    PyObject *v = PyLong_FromUnsignedLongLong(info->offsets[i]);
    if (!v || PyDict_SetItemString(d, e.name, v)) Py_CLEAR(d);
    Py_XDECREF(v);
  }
  return d;
}

PyObject *ksp_image_place(int *busy, PyObject *image, PyObject *entries, PyObject *metadata, const char *metrics) {
  ks_image *im = ksp_image_get(image);
  ks_statedict *sd = NULL;
  ks_meta *meta = NULL;
  if (!im || ksp_layout_prepare(entries, metadata, metrics, &sd, &meta)) return NULL;
  ks_image_info info = {.size = sizeof info};
  ks_error err;
  ks_error_clear(&err);
  ks_status st;
  *busy = 1;
  Py_BEGIN_ALLOW_THREADS st = ks_image_get(im, sd, meta, &info, &err);
  Py_END_ALLOW_THREADS
  *busy = 0;
  PyObject *res = NULL;
  if (st == KS_E_LIMIT) {
    res = Py_BuildValue("(nO)", (Py_ssize_t)info.need, Py_None); /* the caller's memory is too small */
  } else if (st) {
    ksp_raise(st, &err);
  } else {
    PyObject *d = offsets_dict(sd, &info);
    res = d ? Py_BuildValue("(nN)", (Py_ssize_t)info.need, d) : NULL;
  }
  ks_meta_free(meta);
  ks_statedict_free(sd);
  return res;
}

static PyMethodDef Image_methods[] = {
    {"close", (PyCFunction)Image_close, METH_NOARGS,
     "close($self)\n--\n\nFrees the image (and releases its memory's owner); refused while a manager or saver holds "
     "it."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Image_getset[] = {
    {"need", (getter)Image_get_need, NULL, "bytes of memory the image wants for the state it was made for", NULL},
    {"closed", (getter)Image_get_closed, NULL, "the image was freed", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static const char Image_doc[] =
    "Image(entries, metadata=None, metrics=None, address=0, size=0, owner=None, layout_only=False)\n--\n\n"
    "ks_image_create: the file image of a state (entries at address 0 count by their size), in its own memory "
    "(touched now), the caller's (address, size; owner kept alive) or none (layout_only: need only).";

static PyType_Slot Image_slots[] = {
    {Py_tp_dealloc, KSP_SLOT_FN(Image_dealloc)},
    {Py_tp_methods, Image_methods},
    {Py_tp_getset, Image_getset},
    {Py_tp_init, KSP_SLOT_FN(Image_init)},
    {Py_tp_new, KSP_SLOT_FN(PyType_GenericNew)},
    {Py_tp_doc, (void *)Image_doc},
    {0, NULL}};

static PyType_Spec ImageSpec = {"keepsake._keepsake.Image", sizeof(ksp_Image), 0,
                                Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE, Image_slots};

int ksp_image_add_type(PyObject *m) {
  return (ksp_ImageType = ksp_add_type(m, &ImageSpec)) ? 0 : -1;
}
