/*
 * Prefixed state dict keys and typed scalar reads with errors that name the
 * key. Shared by every module that flattens a component into a state dict
 * (train, state, manager).
 */
#ifndef KS_CORE_KEYS_H
#define KS_CORE_KEYS_H

#include <stdint.h>

#include "core/internal.h"
#include "keepsake/statedict.h"

/* Longest key the modules build. */
#define KS__KEY_MAX KS_MAX_NAME

/* Joins prefix and name into buf (KS__KEY_MAX+1 bytes). @return KS_OK or KS_E_LIMIT. */
KS_NODISCARD ks_status ks__key(char *buf, const char *prefix, const char *name);
KS_NODISCARD ks_status ks__keyf(char *buf, const char *prefix, const char *fmt, ...) KS__PRINTF(3, 4);

/* KS_E_LIMIT naming the key prefix+name that does not fit in KS_MAX_NAME bytes. */
KS_NODISCARD ks_status ks__key_limit(ks_error *err, const char *prefix, const char *name);
/* ks__key, filling err when the key is too long. */
KS_NODISCARD ks_status ks__key_err(char *buf, const char *prefix, const char *name, ks_error *err);

/* prefix+name = v; errors (key too long, out of memory) name the key in err. */
KS_NODISCARD ks_status ks__put_int(ks_statedict *dst, const char *prefix, const char *name, int64_t v, ks_error *err);
KS_NODISCARD ks_status ks__put_float(ks_statedict *dst, const char *prefix, const char *name, double v, ks_error *err);

/* Integer scalar (or integral 0-d tensor). KS_E_NOTFOUND / KS_E_VALUE name the key in err. */
KS_NODISCARD ks_status ks__get_int(const ks_statedict *src, const char *prefix, const char *name, int64_t *out,
                      ks_error *err);
/* Float scalar, int scalar or 0-d tensor of any numeric dtype. */
KS_NODISCARD ks_status ks__get_float(const ks_statedict *src, const char *prefix, const char *name, double *out,
                        ks_error *err);

/* Escaped key text (src/core/structure.c): '%' as "%25" and '/' as "%2F" inside one name
   component, so a key's own slashes stay its own (docs/FORMAT.md §10). */
size_t ks__key_escaped_len(const char *s, size_t n);
size_t ks__key_escape(const char *s, size_t n, char *dst); /* dst: ks__key_escaped_len bytes; returns them */
size_t ks__key_unescape(const char *s, size_t n, char *dst);
/* ks__key_escaped_len of what ks__key_unescape makes of s[0..n), without a buffer. */
size_t ks__key_reread_len(const char *s, size_t n);

#endif
