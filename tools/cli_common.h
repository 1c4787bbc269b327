/*
 * Helpers shared by the keepsake subcommands: error printing, an aligned text
 * table, and the sections of `keepsake inspect`, which other subcommands and
 * components reuse to show their own parts of a file.
 */
#ifndef KS_TOOLS_CLI_COMMON_H
#define KS_TOOLS_CLI_COMMON_H

#include <stdio.h>

#include <jansson.h>

#include "keepsake/binding.h"
#include "keepsake/format.h"
#include "keepsake/keepsake.h"

/* What a sharded checkpoint's index records (ks_shard_index_get), by value. */
static inline ks_shard_index_info ks_cli_shard_info(const ks_shard_index *idx) {
  ks_shard_index_info info = KS_OPTS_INIT(ks_shard_index_info);
  ks_shard_index_get(idx, &info);
  return info;
}

/* Exit codes shared by all subcommands. */
#define KS_EXIT_OK 0
#define KS_EXIT_BAD 1   /* verify: file is bad; diff: files differ */
#define KS_EXIT_USAGE 2 /* bad command line, or a file that cannot be read (diff) */

/* Prints "keepsake <cmd>: <file> [key 'k'] [at byte N]: message (KS_E_X)" to out, escaped
 * (ks_cli_esc): names and values in an error come from the file. */
void ks_cli_print_error(FILE *out, const char *cmd, const ks_error *err);

/*
 * Text for a terminal: s itself when it holds nothing to escape, else a copy in
 * which control characters (C0, DEL, C1), bidirectional overrides and bytes that
 * are not UTF-8 are written \xHH or \uHHHH, so that a name read from a file can
 * neither move the cursor, ring, recolour nor start a new line of output. JSON
 * output is never escaped this way (JSON has its own exact escapes).
 * The copy lives in one of 8 buffers reused in turn: valid until 8 more calls.
 * Not thread-safe (the CLI is single-threaded). NULL gives "(null)".
 */
const char *ks_cli_esc(const char *s);
/* Nonzero when s needs escaping (see ks_cli_esc). */
int ks_cli_needs_esc(const char *s);

/*
 * Flushes stdout and reports a write error ("keepsake <cmd>: cannot write output: ...")
 * on stderr: returns rc when all output was written, else KS_EXIT_USAGE (2).
 */
int ks_cli_finish_output(const char *cmd, int rc);

/* Read options for files the CLI is given: KS_READ_COPY, so that a file truncated
 * by another process while it is read gives an error, never SIGBUS (see format.h). */
ks_read_opts ks_cli_read_opts(void);
/* POSIX (ks_io_posix()) without map_fn, in *io: what the CLI hands the library for local files, so
 * that a file truncated by another process while it is read (a rank file of a sharded directory
 * that verify, diff or reshard reads) is a short read and an error, never SIGBUS. Returns io. */
const ks_io *ks_cli_read_io(ks_io *io);
/* Reads a whole regular file into memory with read(2) (never mapped). FIFOs, devices
 * and directories are refused at once. *buf is malloc'd. Returns 0, or -1 with err set. */
int ks_cli_read_file(const char *path, void **buf, size_t *len, ks_error *err);

/*
 * ---- file arguments that may be storage URLs ----
 * A file argument of a subcommand: a local path, or an s3:// or http(s):// URL
 * opened with ks_storage_open (the CLI parses no URL itself). Pass `path` and
 * `ro` (copy mode, with the location's I/O table) to ks_reader_open / ks_load,
 * and `io` to a writer. A remote input is read into memory like a local one.
 */
typedef struct ks_cli_input {
  ks_storage *st;
  const char *arg;  /* as given on the command line */
  const char *path; /* the path to use with io */
  const ks_io *io;  /* NULL for a local file (the library's POSIX default) */
  ks_read_opts ro;  /* ks_cli_read_opts() with io */
  ks_io local;      /* a local input's table: POSIX without map_fn (ks_cli_read_io) */
  const ks_io *read_io; /* every read of the input by the library: io, or &local for a local one */
} ks_cli_input;
/* Opens arg; prints "keepsake <cmd>: ..." and returns -1 when it cannot be (bad URL, no libcurl). */
int ks_cli_input_open(const char *cmd, const char *arg, ks_cli_input *in);
/* Makes err name the argument (not the key the table used) and adds the remote store's detail
   (URL, HTTP status, S3 error) of the last failure. */
void ks_cli_input_error(const ks_cli_input *in, ks_error *err);
/* Reads the whole file into memory (*buf malloc'd). Returns 0, or -1 with err set. */
int ks_cli_input_read(const ks_cli_input *in, void **buf, size_t *len, ks_error *err);
/* Up to n first bytes of the file into buf (never blocking on a FIFO); the count, 0 when it cannot be read. */
size_t ks_cli_input_head(const ks_cli_input *in, void *buf, size_t n);
void ks_cli_input_close(ks_cli_input *in);

/* ---- a string -> index map (a ks_statedict of ints: the core's hash index) ---- */
typedef struct ks_cli_index ks_cli_index;
ks_cli_index *ks_cli_index_new(void);
/* The index stored for key, or (when absent) stores `next` and returns it. SIZE_MAX on allocation failure. */
size_t ks_cli_index_get_or_add(ks_cli_index *x, const char *key, size_t next);
void ks_cli_index_free(ks_cli_index *x);
/* Nonzero when argv holds --help or -h. */
int ks_cli_wants_help(int argc, char **argv);
/* Writes a shape as "[2, 3]" into buf. */
const char *ks_cli_shape(const ks_tensor *t, char *buf, size_t cap);
/*
 * The training-state component a key belongs to (state/model, state/optimizers/AdamW,
 * state/eval_metrics/eval/MulticlassF1Score, rng/0, ...), following Composer's layout.
 */
void ks_cli_component_of(const char *key, char *out, size_t cap);
/* A scalar entry as text ("3", "0.5", "nan", "true", "\"run\"", "null"). */
const char *ks_cli_scalar_text(const ks_entry *e, char *buf, size_t cap);
/* A scalar entry as JSON (non-finite floats become the strings "nan", "inf", "-inf"). */
json_t *ks_cli_scalar_json(const ks_entry *e);

/* ---- an aligned text table ---- */
typedef struct ks_cli_table ks_cli_table;
/* A table with ncols columns titled `headers` (copied). NULL on allocation failure. */
ks_cli_table *ks_cli_table_new(size_t ncols, const char *const *headers);
/* Appends a row of ncols cells (copied). Returns 0, or -1 on allocation failure. */
int ks_cli_table_add(ks_cli_table *t, const char *const *cells);
size_t ks_cli_table_rows(const ks_cli_table *t);
/* Prints "title (N)" then the header and rows with aligned columns; cells never truncated. */
void ks_cli_table_print(const ks_cli_table *t, FILE *out, const char *title);
void ks_cli_table_free(ks_cli_table *t);

/*
 * ---- sections of `keepsake inspect` ----
 * Each prints its part of the file to `out`, or, when `json` is non-NULL, adds
 * it to that JSON object instead. They return 0, or -1 after printing an error.
 */
int ks_inspect_summary(const ks_reader *r, FILE *out, json_t *json);
int ks_inspect_tensors(const ks_reader *r, FILE *out, json_t *json);
int ks_inspect_scalars(const ks_reader *r, FILE *out, json_t *json);
int ks_inspect_metadata(const ks_reader *r, FILE *out, json_t *json);

/* The JSON object `keepsake inspect --json FILE` prints (path: a file or storage URL). Returns 0 with
   *out set (json_decref it), or -1 after printing an error. */
int ks_inspect_file_json(const char *path, json_t **out);
/* Prints json indented by 2 and a newline. Returns 0, or -1 when out of memory. */
int ks_cli_print_json(json_t *json);

/*
 * Extension points for components (metrics, training state). A component that
 * has its own view of a file defines these (strong symbols) in its own tools
 * file: ks_inspect_components prints its sections after the generic ones, and
 * metadata keys for which ks_inspect_component_owns_key returns nonzero are
 * left out of the generic metadata section.
 */
int ks_inspect_components(const ks_reader *r, FILE *out, json_t *json) __attribute__((weak));
int ks_inspect_component_owns_key(const char *key) __attribute__((weak));

#endif
