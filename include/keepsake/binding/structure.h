/**
 * @file binding/structure.h
 * The structure document (metadata key KS_TORCH_STRUCTURE_META, docs/FORMAT.md §10): what flat
 * '/'-joined names cannot say about a nested value. Which folders were lists, tuples or sets
 * and how long, which dict keys were ints, bools, None or floats, which containers were empty,
 * and which leaves were a big int, an array or bytes. Every writer records it the same way: the
 * torch import, the C state layer and the Python package (which describes its objects here
 * instead of keeping a table of its own).
 *
 * Names of dict items follow one rule, ks_key_text: a str key as written with '%' and '/'
 * escaped, an int in decimal, True / False / None, a float as "%.17g". Two keys of one dict
 * with the same text are refused: nothing is merged or dropped silently.
 *
 *   ks_structure *s;
 *   if (ks_structure_create(NULL, &s, &err)) ...
 *   ks_key keys[2] = {{.type = KS_KEY_INT, .i = 0}, {.type = KS_KEY_INT, .i = 1}};
 *   ks_structure_add_dict(s, "optimizer/state", keys, 2, &err);
 *   ks_structure_add_sequence(s, "optimizer/param_groups", KS_CONTAINER_LIST, 1, &err);
 *   char *json; ks_structure_dump(s, &json, &err);   // free with ks_structure_text_free
 */
#ifndef KEEPSAKE_STRUCTURE_H
#define KEEPSAKE_STRUCTURE_H

#include <stddef.h>
#include <stdint.h>

#include "keepsake/alloc.h"
#include "keepsake/export.h"
#include "keepsake/statedict.h" /* ks_leaf_kind */
#include "keepsake/status.h"

KS_BEGIN_BINDING_DECLS

/** A container kind. Values are stable. */
typedef enum ks_container_kind {
  KS_CONTAINER_LIST = 1,
  KS_CONTAINER_TUPLE = 2,
  KS_CONTAINER_SET = 3, /**< items named by index, in the writer's order */
  KS_CONTAINER_DICT = 4
} ks_container_kind;

/* ks_leaf_kind (a leaf stored as something else) is in statedict.h: ks_statedict_mark_leaf takes it. */

/** The type of a dict key. Values are stable. */
typedef enum ks_key_type {
  KS_KEY_STR = 0,
  KS_KEY_INT = 1,
  KS_KEY_BOOL = 2,
  KS_KEY_NONE = 3,
  KS_KEY_FLOAT = 4
} ks_key_type;

/** One dict key. Only the members its type names are read. */
typedef struct ks_key {
  ks_key_type type;
  const char *str; /**< KS_KEY_STR: UTF-8 text, `len` bytes (need not be NUL-terminated) */
  size_t len;
  int64_t i;       /**< KS_KEY_INT; KS_KEY_BOOL: 0 or not */
  double f;        /**< KS_KEY_FLOAT: finite */
} ks_key;

/**
 * The name component of a dict item: a str key with '%' written "%25" and '/' written "%2F",
 * an int in decimal, "True" / "False" / "None", a float as "%.17g".
 * @param dst receives the text and a NUL when it fits in `cap` bytes (may be NULL with cap 0).
 * @param len receives the text's length, whether or not it fit (measure, then write).
 * @return KS_OK; KS_E_VALUE for a str key that is not UTF-8 or a float key that is not finite;
 *         KS_E_INVALID for an unknown key type or NULL len; KS_E_LIMIT when it does not fit.
 */
KS_NODISCARD ks_status ks_key_text(const ks_key *key, char *dst, size_t cap, size_t *len, ks_error *err);

/** A structure document being recorded. */
typedef struct ks_structure ks_structure;

/**
 * An empty document.
 * @param alloc its memory; NULL for malloc.
 * @return KS_OK or KS_E_NOMEM.
 */
KS_NODISCARD ks_status ks_structure_create(const ks_allocator *alloc, ks_structure **out, ks_error *err);

/** Frees a document. Accepts NULL. */
void ks_structure_free(ks_structure *s);

/**
 * Records the list, tuple or set at `path` ('/'-joined escaped components; "" is the root) and
 * its item count. Items are named "0", "1", ... by the writer.
 * @return KS_OK; KS_E_INVALID for another kind; KS_E_EXISTS when `path` is already recorded;
 *         KS_E_VALUE for a path that is not UTF-8; KS_E_NOMEM.
 */
KS_NODISCARD ks_status ks_structure_add_sequence(ks_structure *s, const char *path, ks_container_kind kind,
                                                        uint64_t len, ks_error *err);

/**
 * Records the dict at `path`, given its keys in order. A dict with only str keys and at least
 * one key needs no record (§10), so none is made; an empty dict, or one with any other key, is
 * recorded with the typed keys.
 * @return KS_OK; KS_E_EXISTS for two keys with the same text (1 and "1") or a path already
 *         recorded; KS_E_VALUE as ks_key_text; KS_E_NOMEM.
 */
KS_NODISCARD ks_status ks_structure_add_dict(ks_structure *s, const char *path, const ks_key *keys, size_t n,
                                                    ks_error *err);

/**
 * Records that the value at `path` is a leaf of `kind`.
 * @return KS_OK; KS_E_INVALID for an unknown kind; KS_E_EXISTS when `path` is already recorded;
 *         KS_E_VALUE for a path that is not UTF-8; KS_E_NOMEM.
 */
KS_NODISCARD ks_status ks_structure_add_leaf(ks_structure *s, const char *path, ks_leaf_kind kind,
                                                    ks_error *err);

/** Whether anything has been recorded (a document with nothing in it is not written). */
int ks_structure_is_empty(const ks_structure *s);

/**
 * The document as compact JSON text (the value of KS_TORCH_STRUCTURE_META).
 * @param json receives the NUL-terminated text; free it with ks_structure_text_free.
 * @return KS_OK or KS_E_NOMEM.
 */
KS_NODISCARD ks_status ks_structure_dump(const ks_structure *s, char **json, ks_error *err);

/** Frees text from ks_structure_dump. Accepts NULL. */
void ks_structure_text_free(const ks_structure *s, char *json);

KS_END_BINDING_DECLS

#endif
