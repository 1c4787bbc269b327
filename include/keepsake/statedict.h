/**
 * @file statedict.h
 * An ordered state dict: '/'-joined names mapped to tensors or typed scalars.
 *
 * Tensors hold the numeric state of a run; scalars (int, float, bool, string,
 * null) hold the non-tensor leaves (counters, run name, a `_computed` of None).
 * Insertion order is kept and is the order files are written in. Lookup by name
 * is O(1) on average.
 *
 * Thread safety: a state dict may be read from many threads at once; any
 * mutation needs exclusive access.
 */
#ifndef KEEPSAKE_STATEDICT_H
#define KEEPSAKE_STATEDICT_H

#include "keepsake/export.h"

#include <stddef.h>
#include <stdint.h>

#include "keepsake/alloc.h"
#include "keepsake/status.h"
#include "keepsake/tensor.h"

KS_BEGIN_DECLS

/**
 * Longest name accepted, in bytes (excluding the terminator): the one limit of
 * every name the library stores or builds (tensor and entry keys, metric names,
 * the keys built from a prefix and a name). Checked wherever a name enters
 * (KS_E_INVALID for NULL or empty, KS_E_LIMIT for too long), and every key built
 * from parts is checked against it (KS_E_LIMIT naming the key), never truncated.
 */
#define KS_MAX_NAME 1024

typedef struct ks_statedict ks_statedict;

typedef enum ks_value_kind {
  KS_VAL_TENSOR = 0,
  KS_VAL_INT = 1,
  KS_VAL_FLOAT = 2,
  KS_VAL_BOOL = 3,
  KS_VAL_STRING = 4,
  KS_VAL_NULL = 5
} ks_value_kind;

/** A read-only view of one entry; valid until the entry is replaced or removed. */
typedef struct ks_entry {
  const char *name;
  ks_value_kind kind;
  ks_tensor tensor; /**< KS_VAL_TENSOR */
  int64_t i;        /**< KS_VAL_INT, and KS_VAL_BOOL (0/1) */
  double f;         /**< KS_VAL_FLOAT */
  const char *s;    /**< KS_VAL_STRING, NUL-terminated */
} ks_entry;

/** How ks_statedict_set_tensor takes the data. */
typedef enum ks_take {
  KS_COPY = 0,   /**< copy the bytes into memory owned by the dict */
  KS_BORROW = 1, /**< keep the pointer; the caller keeps the data alive */
  KS_MAPPED_VIEW = 2 /**< keep the pointer; data lives in a mapping the dict keeps (the library's own readers) */
} ks_take;

/**
 * Creates an empty state dict.
 * @param alloc NULL for malloc; copied, its ctx must outlive the dict.
 * @param out   receives the dict; untouched on failure.
 * @return KS_OK or KS_E_NOMEM. Free with ks_statedict_free.
 */
KS_NODISCARD ks_status ks_statedict_create(const ks_allocator *alloc, ks_statedict **out, ks_error *err);

/** Frees the dict, its owned data and its attached owners. Accepts NULL. */
void ks_statedict_free(ks_statedict *sd);

/**
 * Inserts or replaces a tensor entry.
 * @param name NUL-terminated, 1..KS_MAX_NAME bytes.
 * @param t    descriptor; with KS_COPY the data is copied and t may be discarded.
 * @return KS_OK, KS_E_NOMEM, KS_E_INVALID (bad name) or KS_E_LIMIT. On failure the
 *         dict is unchanged.
 */
KS_NODISCARD ks_status ks_statedict_set_tensor(ks_statedict *sd, const char *name, const ks_tensor *t, ks_take take,
                                               ks_error *err);

/**
 * Inserts or replaces a tensor entry with fresh zeroed owned data.
 * @param out_data optional; receives the data pointer for filling.
 */
KS_NODISCARD ks_status ks_statedict_new_tensor(ks_statedict *sd, const char *name, ks_dtype dtype, int rank,
                                  const int64_t *shape, void **out_data, ks_error *err);

/** Scalar setters: insert or replace. Same errors as ks_statedict_set_tensor. */
KS_NODISCARD ks_status ks_statedict_set_int(ks_statedict *sd, const char *name, int64_t v, ks_error *err);
KS_NODISCARD ks_status ks_statedict_set_float(ks_statedict *sd, const char *name, double v, ks_error *err);
KS_NODISCARD ks_status ks_statedict_set_bool(ks_statedict *sd, const char *name, int v, ks_error *err);
KS_NODISCARD ks_status ks_statedict_set_string(ks_statedict *sd, const char *name, const char *v, ks_error *err);
KS_NODISCARD ks_status ks_statedict_set_null(ks_statedict *sd, const char *name, ks_error *err);

/**
 * Inserts or replaces an entry of any kind, copied from a view such as one
 * ks_statedict_at returned (possibly from another dict).
 * @param take for tensors, as in ks_statedict_set_tensor; ignored for scalars (always copied).
 * @return as ks_statedict_set_tensor; KS_E_INVALID for an unknown kind.
 */
KS_NODISCARD ks_status ks_statedict_set_entry(ks_statedict *sd, const char *name, const ks_entry *e, ks_take take,
                                              ks_error *err);

/** Number of entries. */
size_t ks_statedict_count(const ks_statedict *sd);

/**
 * Entry at insertion position i (0-based).
 * @return KS_OK or KS_E_NOTFOUND when i >= count.
 */
KS_NODISCARD ks_status ks_statedict_at(const ks_statedict *sd, size_t i, ks_entry *out);

/**
 * Looks an entry up by name.
 * @return KS_OK or KS_E_NOTFOUND (out untouched).
 */
KS_NODISCARD ks_status ks_statedict_get(const ks_statedict *sd, const char *name, ks_entry *out);

/** Convenience: the tensor named `name`, or NULL. The pointer is valid until the entry changes. */
const ks_tensor *ks_statedict_tensor(const ks_statedict *sd, const char *name);

/** A leaf that is stored as something else and restored as itself (the structure document's
 *  `leaves`, docs/FORMAT.md §10). Values are stable. */
typedef enum ks_leaf_kind {
  KS_LEAF_BIGINT = 1,  /**< an int outside int64: stored as its decimal text */
  KS_LEAF_NDARRAY = 2, /**< a numpy array: stored as a tensor */
  KS_LEAF_BYTES = 3    /**< bytes: stored as a U8 tensor */
} ks_leaf_kind;

/**
 * Marks entry `name` as standing for a leaf of another type: KS_LEAF_NDARRAY or KS_LEAF_BYTES
 * for a tensor (a numpy array, Python bytes), KS_LEAF_BIGINT for a string (an int outside int64).
 * A component's to_state_dict marks its entries so (numpy's generator words, `rng/0/numpy/keys`);
 * ks_state_save records each mark in the torch structure document's `leaves`, as the Python
 * package records the same values. Replacing the entry drops the mark.
 * @return KS_OK, KS_E_NOTFOUND (no such entry), KS_E_INVALID (a kind the entry cannot stand for).
 */
KS_NODISCARD ks_status ks_statedict_mark_leaf(ks_statedict *sd, const char *name, ks_leaf_kind kind,
                                              ks_error *err);

/** Removes an entry, keeping the order of the rest. @return KS_OK or KS_E_NOTFOUND. */
KS_NODISCARD ks_status ks_statedict_remove(ks_statedict *sd, const char *name);

KS_END_DECLS
#endif
