/**
 * @file binding/dcpvalue.h
 * The typed JSON that keeps a torch.distributed.checkpoint non-tensor value (an int, a float,
 * a string, bytes, an io.BytesIO, and lists, tuples and dicts of them) without pickle:
 * docs/FORMAT.md section 9.1. A binding walks its own objects and calls the encoder, and
 * turns the decoded tree back into objects; every rule (the type tags, what is refused, the
 * nesting and size limits, the float and string forms) is here.
 *
 * Encoding: ks_dcp_encoder_create, then one value (containers opened with
 * ks_dcp_encoder_begin and closed with ks_dcp_encoder_end, a dict's items given as key, value,
 * key, value...), then ks_dcp_encoder_result. The first failure latches: every later call
 * returns it. Decoding: ks_dcp_doc_parse, then the tree under ks_dcp_doc_root.
 */
#ifndef KEEPSAKE_DCPVALUE_H
#define KEEPSAKE_DCPVALUE_H

#include "keepsake/export.h"

#include <stddef.h>
#include <stdint.h>

#include "keepsake/alloc.h"
#include "keepsake/status.h"

KS_BEGIN_BINDING_DECLS

/** Deepest value nesting kept: the top value is level 0, each container's items one deeper. */
#define KS_DCP_MAX_DEPTH 100
/** Most decimal digits of an integer (Python's default int_max_str_digits). */
#define KS_DCP_MAX_DIGITS 4300

/** The kinds of value. */
typedef enum ks_dcp_kind {
  KS_DCP_NONE = 0, /**< null */
  KS_DCP_BOOL,     /**< i is 0 or 1 */
  KS_DCP_INT,      /**< i (any int64) */
  KS_DCP_BIGINT,   /**< an integer outside int64: s holds its decimal digits, '-' first when negative */
  KS_DCP_FLOAT,    /**< f (any double: NaN and the infinities too) */
  KS_DCP_STR,      /**< s, len: UTF-8, NULs allowed; a lone surrogate (a Python str may hold one) in its
                        3-byte form (WTF-8, Python's "surrogatepass") */
  KS_DCP_BYTES,    /**< s, len: raw bytes */
  KS_DCP_BYTESIO,  /**< s, len: the bytes of an io.BytesIO */
  KS_DCP_LIST,     /**< items, count */
  KS_DCP_TUPLE,    /**< items, count */
  KS_DCP_DICT      /**< items, count pairs: items[2k] the key, items[2k+1] its value, in order */
} ks_dcp_kind;

/** A decoded value (owned by its ks_dcp_doc). */
typedef struct ks_dcp_value ks_dcp_value;
struct ks_dcp_value {
  ks_dcp_kind kind;
  int64_t i;                  /**< KS_DCP_BOOL, KS_DCP_INT */
  double f;                   /**< KS_DCP_FLOAT */
  const char *s;              /**< KS_DCP_BIGINT, KS_DCP_STR, KS_DCP_BYTES, KS_DCP_BYTESIO (NUL-terminated too) */
  size_t len;                 /**< bytes of s */
  const ks_dcp_value *items;  /**< KS_DCP_LIST, KS_DCP_TUPLE (count items), KS_DCP_DICT (2 * count) */
  size_t count;               /**< items, or pairs of a dict */
};

/* ------------------------------------------------------------------------ */
/* Encoding.                                                                 */
/* ------------------------------------------------------------------------ */

typedef struct ks_dcp_encoder ks_dcp_encoder;

/** Creates an encoder. @return KS_OK or KS_E_NOMEM. Free with ks_dcp_encoder_free. */
KS_NODISCARD ks_status ks_dcp_encoder_create(const ks_allocator *alloc, ks_dcp_encoder **out, ks_error *err);
/** Frees an encoder and its result. Accepts NULL. */
void ks_dcp_encoder_free(ks_dcp_encoder *e);

/**
 * Adds a scalar value: the whole value, an item of the open list or tuple, or the next key or
 * value of the open dict.
 * @return KS_OK; KS_E_STATE (a value already complete); KS_E_LIMIT (deeper than
 *         KS_DCP_MAX_DEPTH, more than KS_DCP_MAX_DIGITS digits, output over SIZE_MAX);
 *         KS_E_INVALID (a string that is not UTF-8 (lone surrogates allowed, see KS_DCP_STR), digits
 *         that are no decimal integer, a kind that is no scalar);
 *         KS_E_NOMEM. After a failure every call returns the same status.
 */
KS_NODISCARD ks_status ks_dcp_encoder_none(ks_dcp_encoder *e, ks_error *err);
KS_NODISCARD ks_status ks_dcp_encoder_bool(ks_dcp_encoder *e, int v, ks_error *err);
KS_NODISCARD ks_status ks_dcp_encoder_int(ks_dcp_encoder *e, int64_t v, ks_error *err);
/** An integer (one outside int64, usually) as decimal digits: optional '-', no leading zeros. */
KS_NODISCARD ks_status ks_dcp_encoder_bigint(ks_dcp_encoder *e, const char *digits, size_t n, ks_error *err);
KS_NODISCARD ks_status ks_dcp_encoder_float(ks_dcp_encoder *e, double v, ks_error *err);
KS_NODISCARD ks_status ks_dcp_encoder_str(ks_dcp_encoder *e, const char *utf8, size_t n, ks_error *err);
/** kind is KS_DCP_BYTES or KS_DCP_BYTESIO. */
KS_NODISCARD ks_status ks_dcp_encoder_bytes(ks_dcp_encoder *e, ks_dcp_kind kind, const void *p, size_t n,
                                            ks_error *err);
/**
 * Opens a container: kind is KS_DCP_LIST, KS_DCP_TUPLE or KS_DCP_DICT. A list or dict (or a
 * tuple holding one) cannot be a dict key: KS_E_UNSUPPORTED, as it has no hash.
 */
KS_NODISCARD ks_status ks_dcp_encoder_begin(ks_dcp_encoder *e, ks_dcp_kind kind, ks_error *err);
/** Closes the innermost container. @return KS_OK, KS_E_STATE (none open, a dict key without value). */
KS_NODISCARD ks_status ks_dcp_encoder_end(ks_dcp_encoder *e, ks_error *err);
/**
 * The typed JSON of the one complete value: ASCII, compact; owned by the encoder (valid until
 * it is freed). @return KS_OK, KS_E_STATE (no value, or containers still open), or the latched failure.
 */
KS_NODISCARD ks_status ks_dcp_encoder_result(ks_dcp_encoder *e, const char **json, size_t *len, ks_error *err);

/* ------------------------------------------------------------------------ */
/* Decoding (untrusted bytes).                                               */
/* ------------------------------------------------------------------------ */

typedef struct ks_dcp_doc ks_dcp_doc;

/**
 * Decodes typed JSON (the bytes of a `keepsake.dcp.object/` tensor, or planner data). Accepts
 * exactly what section 9.1 describes, and what the encoder writes: null, true, false, an integer
 * of at most KS_DCP_MAX_DIGITS digits, a finite number, a string (UTF-8, escapes, \\u0000 and lone
 * surrogate escapes too), an
 * array, or an object of one member: "float" ("nan", "inf", "-inf"), "tuple" (array), "dict"
 * (array of [key, value] arrays, no key a list or dict or a tuple holding one, no two keys equal
 * as Python compares them: 1, true and 1.0 are one key; a NaN equals nothing), "bytes" or
 * "bytesio" (standard base64 with padding, canonical: the bits under the padding are zero).
 * @return KS_OK; KS_E_FORMAT (anything else: not UTF-8, not JSON, trailing bytes, an unknown or
 *         malformed tag, bad or non-canonical base64, a repeated dict key (the message names the key
 *         and both items' positions), a number out of range of a double), the offset in err;
 *         KS_E_LIMIT (nested deeper than KS_DCP_MAX_DEPTH, too many digits); KS_E_NOMEM.
 *         Free *out with ks_dcp_doc_free.
 */
KS_NODISCARD ks_status ks_dcp_doc_parse(const void *buf, size_t len, const ks_allocator *alloc, ks_dcp_doc **out,
                                        ks_error *err);
/** The decoded value (owned by the document). */
const ks_dcp_value *ks_dcp_doc_root(const ks_dcp_doc *d);
/** Frees a document. Accepts NULL. */
void ks_dcp_doc_free(ks_dcp_doc *d);

KS_END_BINDING_DECLS
#endif
