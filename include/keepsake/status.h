/**
 * @file status.h
 * Status codes and detailed errors.
 *
 * Every fallible keepsake function returns a ks_status: 0 (KS_OK) on success,
 * a positive code otherwise. Codes are append-only: a code's number and meaning
 * never change once released, so they can be stored, logged and compared across
 * versions.
 *
 * Every public function that can fail for a reason the caller must see takes a
 * trailing `ks_error *err`: optional (NULL allowed), filled on failure with the
 * same code, the file, the key (entry, metric or component name), the byte
 * offset and what was expected vs found, where known; untouched on success.
 * The few that take none (look-ups by index or name, pure conversions) fail
 * only in ways their status says in full; tests/arch/error_params.py lists them
 * with the reason. Every function returning ks_status is marked KS_NODISCARD:
 * a dropped result is a compiler warning.
 */
#ifndef KEEPSAKE_STATUS_H
#define KEEPSAKE_STATUS_H

#include "keepsake/export.h"

#include <stddef.h>
#include <stdint.h>

KS_BEGIN_DECLS

/* Append new codes at the end only. Never renumber. */
#define KS_STATUS_LIST(X)                                                   \
  X(KS_OK, 0, "success")                                                    \
  X(KS_E_NOMEM, 1, "out of memory")                                         \
  X(KS_E_IO, 2, "input/output error")                                       \
  X(KS_E_FORMAT, 3, "data breaks the file format")                          \
  X(KS_E_LIMIT, 4, "a size or count exceeds a hard limit")                  \
  X(KS_E_INVALID, 5, "invalid argument")                                    \
  X(KS_E_NOTFOUND, 6, "no such entry")                                      \
  X(KS_E_DTYPE, 7, "dtype mismatch or unsupported dtype")                   \
  X(KS_E_SHAPE, 8, "shape mismatch")                                        \
  X(KS_E_CHECKSUM, 9, "checksum mismatch")                                  \
  X(KS_E_VERSION, 10, "unsupported format or schema version")              \
  X(KS_E_MISMATCH, 11, "incompatible definitions")                          \
  X(KS_E_UNSUPPORTED, 12, "unsupported feature")                            \
  X(KS_E_EXISTS, 13, "entry already exists")                                \
  X(KS_E_STATE, 14, "operation not valid in the current state")             \
  X(KS_E_VALUE, 15, "invalid value in input data")                          \
  X(KS_E_UNSAFE, 16, "refused: input asks for code execution")              \
  X(KS_E_NET, 17, "network or remote storage error")                       \
  X(KS_E_NOT_DURABLE, 18, "saved, but the directory fsync failed: durability unknown") \
  X(KS_E_LOCKED, 19, "held by another process")

typedef enum ks_status_code {
#define KS__STATUS_ENUM(name, num, text) name = num,
  KS_STATUS_LIST(KS__STATUS_ENUM)
#undef KS__STATUS_ENUM
  KS__STATUS_END
} ks_status_code;

/** A status: KS_OK (0) or one of ks_status_code. */
typedef int ks_status;

/**
 * Returns a short static description of a status code.
 * @param code any integer; unknown codes give "unknown status".
 * @return a static string, never NULL. Thread safety: safe from any thread.
 */
const char *ks_strerror(ks_status code);

/**
 * Returns the symbolic name of a status code, e.g. "KS_E_FORMAT".
 * @return a static string, never NULL ("KS_E_UNKNOWN" for unknown codes).
 */
const char *ks_status_name(ks_status code);

#define KS_ERROR_MSG_MAX 512
#define KS_ERROR_WHERE_MAX 256

/**
 * Detailed error: what failed, where, and what was expected.
 * Callers own it (usually on the stack); pass NULL wherever an error is optional.
 * Fields are empty strings / -1 when unknown.
 */
typedef struct ks_error {
  ks_status code;                  /**< same value the function returned */
  char message[KS_ERROR_MSG_MAX];  /**< human readable, includes expected vs found */
  char file[KS_ERROR_WHERE_MAX];   /**< path or object the error concerns */
  char key[KS_ERROR_WHERE_MAX];    /**< tensor or state name, if any */
  int64_t offset;                  /**< byte offset in the input, or -1 */
} ks_error;

/** Resets an error to "no error". Accepts NULL. */
void ks_error_clear(ks_error *err);

/**
 * Formats an error as one line: "[file] [key 'k'] [at byte N]: message (KS_E_X)".
 * @param buf output buffer, always NUL-terminated when cap > 0.
 * @return buf.
 */
char *ks_error_format(const ks_error *err, char *buf, size_t cap);

KS_END_DECLS
#endif
