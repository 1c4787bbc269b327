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
 * the keys built from a prefix and a name). Checked by
 * ks_name_check wherever a name enters, and every key built from parts is
 * checked against it (KS_E_LIMIT naming the key), never truncated.
 */
#define KS_MAX_NAME 1024

typedef struct ks_statedict ks_statedict;

/**
 * Checks a name against the library's one name rule: non-NULL, 1..KS_MAX_NAME bytes.
 * @param err optional (NULL allowed): the key and the length found vs allowed.
 * @return KS_OK, KS_E_INVALID (NULL or empty) or KS_E_LIMIT (too long). Thread safe.
 */
KS_NODISCARD ks_status ks_name_check(const char *name, ks_error *err);

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
  KS_MAPPED_VIEW = 2 /**< keep the pointer; data lives in a mapping kept by an attached owner */
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

/** The allocator the dict was created with (never NULL: a copy of the defaults). */
const ks_allocator *ks_statedict_allocator(const ks_statedict *sd);

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

/**
 * Matches a '/'-joined path against a glob ('*' any run of bytes, '/' included;
 * '?' one byte). The glob also matches when it matches a '/'-prefix of the path,
 * so "rng" matches "rng/0/state", and "state/optimizers/" followed by a star matches every
 * optimizer entry.
 * @return nonzero on a match; 0 when either argument is NULL. Pure; thread safe.
 */
int ks_path_match(const char *glob, const char *path);

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

/** Removes an entry, keeping the order of the rest. @return KS_OK or KS_E_NOTFOUND. */
KS_NODISCARD ks_status ks_statedict_remove(ks_statedict *sd, const char *name);

/**
 * Attaches an owner released when the dict is freed, e.g. a reader whose mapping
 * KS_MAPPED_VIEW tensors point into.
 * @return KS_OK or KS_E_NOMEM (then `release` is NOT called).
 */
KS_NODISCARD ks_status ks_statedict_attach(ks_statedict *sd, void *owner, void (*release)(void *owner), ks_error *err);

/**
 * Copies every entry of src whose name starts with `prefix` into dst, with the
 * prefix replaced by `new_prefix` (either may be ""). Tensor data is copied.
 * @return KS_OK, KS_E_NOMEM or KS_E_INVALID; on failure dst may hold some entries.
 */
KS_NODISCARD ks_status ks_statedict_copy_prefix(ks_statedict *dst, const ks_statedict *src, const char *prefix,
                                   const char *new_prefix, ks_error *err);

KS_END_DECLS
#endif
