/* Helpers shared by the tests: a failing allocator, temp dirs, file I/O, running the CLI. */
#ifndef KS_TESTUTIL_H
#define KS_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

#include "keepsake/binding.h"
#include "keepsake/keepsake.h"

/*
 * An allocator that fails the Nth call (1-based) and every call after it when
 * fail_at > 0, and counts live blocks so a test can assert nothing leaked.
 */
typedef struct ks_test_alloc {
  ks_allocator a;
  long calls;
  long fail_at;
  long live;
  int sticky; /* nonzero: keep failing after the first failure */
} ks_test_alloc;

void ks_test_alloc_init(ks_test_alloc *ta, long fail_at);

/* Creates a fresh empty directory under $TMPDIR; returns a malloc'd path. */
char *ks_test_tmpdir(const char *tag);
/* Removes a directory tree (best effort). */
void ks_test_rmtree(const char *path);
/* Joins dir and name into a malloc'd path. */
char *ks_test_path(const char *dir, const char *name);
/* The POSIX I/O table with no-op fsyncs: fast saves for tests that do not test durability. */
const ks_io *ks_test_io_nosync(void);
/* Reads a whole file; returns malloc'd bytes (NULL on error). */
uint8_t *ks_test_read_file(const char *path, size_t *len);
/* Writes bytes to a file; returns 0 on success. */
int ks_test_write_file(const char *path, const void *data, size_t len);
/*
 * Runs a shell command, capturing stdout+stderr into a malloc'd string (*out may be NULL).
 * Returns the exit status (or -1).
 */
int ks_test_run(const char *cmd, char **out);
/* Number of entries in a directory other than . and .. (0 when it cannot be read). */
int ks_test_dir_entries(const char *dir);
/* Nonzero when path exists. */
int ks_test_exists(const char *path);
/* One float32 as the bits of float dtype dt (F16, BF16: 16 bits; the F8 formats: 8), through
   ks_dtype_set_f64 (exact for a float32 argument), and back through ks_dtype_get_f64. */
uint32_t ks_test_to_bits(ks_dtype dt, float f);
float ks_test_from_bits(ks_dtype dt, uint32_t bits);
/* A component's save and load through its ks_stateful: ks_test_save(ks_rng_stateful(&r), sd, "rng/0/", &err). */
KS_NODISCARD ks_status ks_test_save(ks_stateful cb, ks_statedict *dst, const char *prefix, ks_error *err);
KS_NODISCARD ks_status ks_test_load(ks_stateful cb, const ks_statedict *src, const char *prefix, ks_error *err);
/* ks_torch_load / ks_torch_import of bytes in memory: opts (NULL = defaults) with data set. */
KS_NODISCARD ks_status ks_test_torch_load_buffer(const void *buf, size_t len, const ks_torch_read_opts *opts,
                                                 ks_statedict **out, char **structure, ks_error *err);
KS_NODISCARD ks_status ks_test_torch_import_buffer(const void *buf, size_t len, const ks_import_opts *opts,
                                                   ks_statedict **out, ks_meta **meta, ks_error *err);

#endif
