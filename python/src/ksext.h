/*
 * The keepsake CPython extension (keepsake._keepsake): a thin layer over the
 * public C API. It knows nothing of torch or numpy: tensors cross the boundary
 * as (dtype code, shape, address, byte count) going out and as buffer-protocol
 * objects coming back, which the pure-Python modules wrap with
 * torch.frombuffer / numpy.frombuffer.
 */
#ifndef KS_PYEXT_H
#define KS_PYEXT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "keepsake/binding.h"
#include "keepsake/keepsake.h"

#ifdef Py_LIMITED_API
/*
 * The stable ABI (Py_LIMITED_API, python/CMakeLists.txt) has these only as functions: the macros
 * the sources use name them. Each costs a call where the macro read a field, per entry, never per
 * byte (the save_file and load_file rows of bench/python_bench.py, docs/BENCHMARKS.md). The SET_ITEM
 * forms fill new tuples and lists, where the functions cannot fail.
 */
#define PyBytes_AS_STRING(o) PyBytes_AsString(o)
#define PyBytes_GET_SIZE(o) PyBytes_Size(o)
#define PyByteArray_AS_STRING(o) PyByteArray_AsString(o)
#define PyFloat_AS_DOUBLE(o) PyFloat_AsDouble(o)
#define PyTuple_GET_ITEM(o, i) PyTuple_GetItem(o, i)
#define PyTuple_GET_SIZE(o) PyTuple_Size(o)
#define PyList_GET_ITEM(o, i) PyList_GetItem(o, i)
#define PyList_GET_SIZE(o) PyList_Size(o)
#define PyTuple_SET_ITEM(o, i, v) ((void)PyTuple_SetItem(o, i, v))
#define PyList_SET_ITEM(o, i, v) ((void)PyList_SetItem(o, i, v))
#define PyUnicode_AsUTF8(o) PyUnicode_AsUTF8AndSize(o, NULL)
#define PyObject_CallOneArg(f, a) PyObject_CallFunctionObjArgs(f, a, NULL)
#define Py_XSETREF(dst, src)                                                                                      \
  do {                                                                                                         \
    PyObject *ksp_old_ = (PyObject *)(dst);                                                                    \
    (dst) = (src);                                                                                             \
    Py_XDECREF(ksp_old_);                                                                                      \
  } while (0)
#endif

/*
 * The module's types are heap types made from a PyType_Spec, which the stable ABI requires (it has
 * no static PyTypeObject). ksp_add_type makes one and adds it to the module under the last part of
 * its spec's name; it returns the type (the module holds it), or NULL with an exception set.
 */
PyTypeObject *ksp_add_type(PyObject *m, PyType_Spec *spec);
/* A function in a PyType_Slot, whose pfunc is a void *: through uintptr_t, as ISO C has no conversion
 * from a function pointer to an object pointer (-Wpedantic) and POSIX makes them the same size. */
#define KSP_SLOT_FN(f) ((void *)(uintptr_t)(f))
/* The end of such a type's tp_dealloc: frees the object and drops the reference to its type that
 * every instance of a heap type holds. */
void ksp_free_self(PyObject *self);
/* The name of o's type ("float", "Tensor"), copied into buf: the stable ABI has no tp_name. */
const char *ksp_type_name(PyObject *o, char *buf, size_t size);

/* Sets the Python exception for a failed call: keepsake.KeepsakeError's subclass for `st`. */
PyObject *ksp_raise(ks_status st, const ks_error *err);
/* As ksp_raise with a formatted message and no location. */
PyObject *ksp_raisef(ks_status st, const char *fmt, ...);
/* Runs fn(obj, err) with the GIL released and *busy set meanwhile (the object refuses other calls);
 * returns None, or NULL with fn's error raised. */
PyObject *ksp_call_unlocked(int *busy, ks_status (*fn)(void *obj, ks_error *err), void *obj);
/* Replaces "<buffer>" in err->file with `path` (readers opened over a mapping we made). */
void ksp_error_path(ks_error *err, const char *path);

/* One entry of a state dict as a Python value: a scalar, or (dtype, shape, bytes) for a tensor. */
PyObject *ksp_scalar_value(const ks_entry *e);
/* A shape as a tuple of ints. */
PyObject *ksp_shape_tuple(int rank, const int64_t *shape);
/* report_text(items): the text ks_load_report_print prints for (kind, path, reason) items. */
PyObject *ksp_report_text(PyObject *self, PyObject *items);
/* A tensor copied into (dtype code, shape, bytearray). */
PyObject *ksp_tensor_copy(const ks_tensor *t);

/*
 * Builds a state dict from a sequence of entries: (name, dtype, shape, address, nbytes)
 * for tensors (borrowed: the caller keeps the memory alive) and (name, value) for
 * scalars (bool, int, float, str or None). Returns NULL with an exception set.
 */
ks_statedict *ksp_statedict_from(PyObject *entries);
/* Builds metadata from a dict of str -> str (None gives an empty map). */
ks_meta *ksp_meta_from(PyObject *dict);
/* Metadata pairs as a dict; `skip_writer` leaves out the five keys the writer owns. */
PyObject *ksp_meta_dict(const ks_meta *m, int skip_writer);
/* Every entry of a state dict as a list of (name, value) with tensors copied. */
PyObject *ksp_statedict_items(const ks_statedict *sd);

/* keepsake.metrics (JSON, malloc'd) for a description of metrics ({"metrics": [{path, class,
 * update_count, attrs}]}) and the states in sd, through the public metric API. */
KS_NODISCARD ks_status ksp_metrics_meta(const char *desc, const ks_statedict *sd, char **out, ks_error *err);

/*
 * The pieces every save needs: the entries as a state dict (tensors borrowed), the metadata
 * and keepsake.metrics from a metric description (may be NULL). 0, or -1 with an exception set
 * and both NULL.
 */
int ksp_save_prepare(PyObject *entries, PyObject *metadata, const char *metrics, ks_statedict **sd, ks_meta **meta);

/* Nonzero when `loc` names a remote location (s3://, http(s)://; not a path or file://). */
int ksp_is_remote(const char *loc);
/*
 * The table and path for a location (ksstorage.c): a local one keeps `local_io` and its own
 * path (file:// stripped); a remote one opens the storage layer (*st, to free with
 * ks_storage_free after the last use of *io and *path). No GIL needed.
 */
KS_NODISCARD ks_status ksp_location(const char *loc, const ks_io *local_io, ks_storage **st, const ks_io **io,
                                    const char **path, ks_error *err);

/*
 * A location with an optional read cache (include/keepsake/io_cache.h): with `cache_dir`, a
 * remote location's table is wrapped by ks_io_cache_create(cache_dir), so bytes read once are
 * read from cache_dir afterwards; a local location is never cached. Close with ksp_loc_close
 * after the last use of io and path (the cache before the store it wraps). No GIL needed.
 */
typedef struct ksp_loc {
  ks_storage *store; /* the remote location, or NULL */
  ks_io *cache;      /* the cache over it, or NULL */
  const ks_io *io;   /* what to read and write through */
  const char *path;  /* the path to use with io */
} ksp_loc;
KS_NODISCARD ks_status ksp_loc_open(const char *loc, const ks_io *local_io, const char *cache_dir, ksp_loc *out,
                                    ks_error *err);
void ksp_loc_close(ksp_loc *l);
/* A dict of the statistics of a read cache: of ks_io_cache_get_stats(cache), None when cache is NULL. */
PyObject *ksp_cache_stats_dict(const ks_io_cache_stats *s);
PyObject *ksp_cache_stats(const ks_io *cache);

/* The open file of a keepsake._keepsake.Reader, or NULL with TypeError set. */
const ks_reader *ksp_reader_get(PyObject *reader);

/* Module functions, by file. The Reader and Manager types: their specs, and the types made from
 * them when the module was initialised. */
extern PyType_Spec ksp_ReaderSpec;
extern PyType_Spec ksp_ManagerSpec;
extern PyTypeObject *ksp_ReaderType;
PyObject *ksp_preemption_install(PyObject *self, PyObject *args);
PyObject *ksp_preemption_uninstall(PyObject *self, PyObject *args);
PyObject *ksp_preemption_signal(PyObject *self, PyObject *unused);
/* Fills *io with the POSIX table, or without fsync ks__io_posix_nosync() (fast, not durable). */
const ks_io *ksp_io_posix(int fsync, ks_io *io);
PyObject *ksp_save_file(PyObject *self, PyObject *args, PyObject *kw);
PyObject *ksp_save_bytes(PyObject *self, PyObject *args, PyObject *kw);
PyObject *ksp_torch_load(PyObject *self, PyObject *args, PyObject *kw);
PyObject *ksp_structure_plan(PyObject *self, PyObject *args);
PyObject *ksp_torch_save(PyObject *self, PyObject *args, PyObject *kw);
PyObject *ksp_convert(PyObject *self, PyObject *args, PyObject *kw);
PyObject *ksp_metric_info(PyObject *self, PyObject *args);
PyObject *ksp_compute_metrics(PyObject *self, PyObject *args, PyObject *kw);
PyObject *ksp_catalogue(PyObject *self, PyObject *unused);
PyObject *ksp_load_state(PyObject *self, PyObject *args);
PyObject *ksp_fold_metric(PyObject *self, PyObject *args);
/* A described metric (ks_metric_describe) from the description keepsake._state.load.describe_metric makes;
   KS_E_INVALID with a Python exception set for a malformed one. */
KS_NODISCARD ks_status ksp_describe_metric(PyObject *desc, ks_metric **out, ks_error *err);

/* Sharded checkpoint directories (ksshard.c, for keepsake.distributed): the functions, added to the
 * module with PyModule_AddFunctions, and the lazy rank file reader type. */
/* Adds the Structure type (ksstructure.c) to the module; 0, or -1 with an exception set. */
int ksp_structure_add_type(PyObject *m);
/* keepsake._keepsake.AsyncSaver (ksasync.c): 0, or -1 with an exception. */
int ksp_async_add_type(PyObject *m);
/* keepsake._keepsake.EarlyStop (ksearly.c): 0, or -1 with an exception. */
int ksp_early_add_type(PyObject *m);
/* keepsake._keepsake.Image (ksimage.c): 0, or -1 with an exception. */
int ksp_image_add_type(PyObject *m);
/* The file image of an Image, or NULL with an exception (not an Image, or closed). */
ks_image *ksp_image_get(PyObject *image);
/* Makes *slot (a manager's or saver's image of its save in flight) `image` (NULL: none): the image
 * is held (Image.close refuses, and it stays alive) until the slot moves on. Only once the
 * library no longer writes from the old one (a new save started, or the saver ended). */
void ksp_image_hold(PyObject **slot, PyObject *image);
/* (need, {name: offset}) for the next save of entries through image: ks_image_get with the state
 * (after a save writing from the image: *busy set meanwhile, the GIL released); (need, None) when
 * the image's memory is too small for it. NULL with an exception. */
PyObject *ksp_image_place(int *busy, PyObject *image, PyObject *entries, PyObject *metadata, const char *metrics);
/* entries with each tensor at address 0 (a placeholder) pointed at a stand-in: for layouts only. */
PyObject *ksp_layout_entries(PyObject *entries);
/* ksp_save_prepare of ksp_layout_entries(entries). 0, or -1 with an exception. */
int ksp_layout_prepare(PyObject *entries, PyObject *metadata, const char *metrics, ks_statedict **sd, ks_meta **meta);
extern PyMethodDef ksp_shard_methods[];
extern PyType_Spec ksp_ShardFileSpec;

/* torch.distributed helpers (ksdist.c): the per-rank rules of the library, added with
 * PyModule_AddFunctions. */
extern PyMethodDef ksp_dist_methods[];

#endif
