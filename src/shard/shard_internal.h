/* Private to the shard module: the parsed index and helpers shared by its files. */
#ifndef KS_SHARD_INTERNAL_H
#define KS_SHARD_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "core/internal.h"
#include "core/json.h"
#include "core/keys.h"
#include "keepsake/binding.h"
#include "keepsake/binding/dcpvalue.h"
#include "keepsake/shard.h"

/* Metadata keys of a rank file. */
#define KS__SHARD_META "keepsake.shard"       /* {"rank","world_size","per_rank","timestamp"} */
#define KS__DCP_INFO "DCP_SHARDING_INFO"      /* torch DCP: {fqn: {"saved_offsets": [...]}} */
#define KS__DCP_VERSION "DCP_VERSION"
#define KS__METRICS_META "keepsake.metrics"
/* Name prefix of a DCP non-tensor value: a 1-d U8 tensor of typed JSON (FORMAT.md 9.1). */
#define KS__DCP_OBJECT KS_SHARD_DCP_OBJECT

/* Counters of the timestamp, or has = 0. */
typedef struct ks__shard_ts {
  int has;
  int64_t epoch, batch, sample, token;
} ks__shard_ts;

/* A chunk's offsets and shape hold `rank` values each, in its tensor's `dims`: an index may list
   millions of chunks, and a chunk then costs about what its JSON text does. */
typedef struct ks__saved_chunk {
  int file; /* rank whose file holds it */
  int64_t *offsets;
  int64_t *shape;
} ks__saved_chunk;

typedef struct ks__sharded {
  char *name;
  ks_dtype dtype;
  int rank;
  int64_t global_shape[KS_MAX_RANK];
  size_t n_chunks;
  ks__saved_chunk *chunks;
  int64_t *dims; /* 2 * rank values per chunk */
} ks__sharded;

struct ks_shard_index {
  ks_allocator alloc;
  int version; /* 1: infos[].checksum hashes each whole file; 2: its length and header (FORMAT.md 9.3) */
  int world_size;
  ks__shard_ts ts;
  size_t n_per_rank;
  char **per_rank;
  char **files;
  ks_shard_file_info *infos;
  size_t n_sharded;
  ks__sharded *sharded;
};

/* Caps of the index's `sharded` section (each chunk is in one rank file, a file holds one chunk of a
   tensor: so at most world_size chunks a tensor). */
#define KS__SHARD_MAX_CHUNKS (1u << 22)   /* chunks of all tensors together */
#define KS__SHARD_MAX_PAIRS (1ull << 26)  /* chunk pairs compared by the overlap sweep of one tensor */

/* What the tiling check carries from one sharded tensor to the next. */
typedef struct ks__shard_tally {
  uint64_t *bytes; /* per rank file: bytes of the chunks it holds so far */
  size_t *seen;    /* per rank file: 1 + the index of the last tensor with a chunk there */
  size_t chunks;   /* chunks of all tensors so far */
} ks__shard_tally;

/* Checks that sharded tensor `ti` has chunks (a DCP value exactly one, of a 1-d U8 tensor), that they
   tile its global shape exactly (overflow-checked volumes adding up to the global volume, no two
   overlapping, one a rank file at most) and that each file's chunks hold at most its recorded size.
   KS_E_FORMAT or KS_E_LIMIT naming `path` and the tensor; KS_E_NOMEM. Allocates nothing from the shapes. */
KS_NODISCARD ks_status ks__shard_check_tiling(const ks_shard_index *idx, size_t ti, ks__shard_tally *t,
                                              const char *path, ks_error *err);

/* Parses and validates index text (parse.c) into idx (alloc set, the rest zero); on failure idx holds
   what was parsed so far, for ks_shard_index_free. */
KS_NODISCARD ks_status ks__shard_index_parse(ks_shard_index *idx, const char *text, size_t len, const char *path,
                                             ks_error *err);

/* ks_shard_check's size check of the files whose `only` entry is nonzero (NULL: all), stopping at
   the first problem: what a load that reads only some files needs before it allocates. */
KS_NODISCARD ks_status ks__shard_check_sizes(const char *dir, const ks_shard_index *idx, const ks_io *io,
                                             const unsigned char *only, ks_error *err);

/* What the index records of the rank file at `path` (read.c): its size and the XXH3-64 of its first
   8 + N bytes (the length and the header, which holds every tensor's checksum), read back through
   `io` (NULL = POSIX): the header only, never the data. KS_E_IO, KS_E_NOMEM, KS_E_FORMAT (no valid
   header length). */
KS_NODISCARD ks_status ks__shard_file_facts(const ks_io *io, const ks_allocator *a, const char *path,
                                            ks_shard_file_info *info, ks_error *err);

/* The same hash of the file at `path` through `io` (NULL = POSIX): *size its size, *hash the XXH3-64 of its
   first 8 + N bytes, read (never mapped). errno-style result; *opened tells a failed open (nonzero result,
   *opened 0) from a failed read; *bad set (0 returned) when the length prefix is not one a valid file has. */
int ks__shard_header_hash(const ks_io *io, const ks_allocator *a, const char *path, uint64_t *size, uint64_t *hash,
                          int *bad, int *opened);

/* "dir/name" through the allocator; NULL when out of memory. */
char *ks__shard_join(const ks_allocator *a, const char *dir, const char *name);
/* The timestamp counters of a state dict (has = 0 when there is none). */
void ks__shard_ts_of(const ks_statedict *sd, ks__shard_ts *ts);
/* The timestamp as JSON (null when there is none); NULL when out of memory. */
ks__jv *ks__shard_ts_json(const ks_allocator *a, const ks__shard_ts *ts);
/* Parses what ks__shard_ts_json wrote; 0 on a malformed or missing value. */
int ks__shard_ts_parse(const ks__jv *j, ks__shard_ts *ts);
int ks__shard_ts_equal(const ks__shard_ts *a, const ks__shard_ts *b);
void ks__shard_ts_format(const ks__shard_ts *ts, char *buf, size_t cap);
/* Nonzero when name matches one of the globs. */
int ks__shard_matches(const char *name, const char *const *globs, size_t n);
/* Parses a JSON array of at most KS_MAX_RANK non-negative integers; returns its length or -1. */
int ks__shard_dims(const ks__jv *j, int64_t *out);
/* A JSON array of v[0..rank); NULL when out of memory. */
ks__jv *ks__shard_dims_json(const ks_allocator *a, int rank, const int64_t *v);
/* obj[key] = val with a latched status: after the first failure (or a NULL obj or val:
   out of memory) nothing more is set and val is freed. Builds an object in straight lines. */
void ks__shard_put(const ks_allocator *a, ks__jv *obj, const char *key, ks__jv *val, ks_status *st);
/* The same for appending to an array. */
void ks__shard_push(const ks_allocator *a, ks__jv *arr, ks__jv *val, ks_status *st);
/* Parses one metadata JSON value of a rank file; NULL text gives NULL with KS_OK. */
KS_NODISCARD ks_status ks__shard_parse_meta(const ks_allocator *a, const char *text, const char *key, ks__jv **out,
                               ks_error *err);

/* Whether the n keys of a decoded dict (items[2k], dcpkeys.c) are distinct as Python compares them
   (True == 1 == 1.0; a NaN or an io.BytesIO equals nothing). KS_OK; KS_E_EXISTS with the pair numbers of
   the first repeated key in *second and of its first occurrence in *first; KS_E_NOMEM. */
KS_NODISCARD ks_status ks__dcp_dict_keys_distinct(const ks_allocator *a, const ks_dcp_value *items, size_t n,
                                                  size_t *first, size_t *second);

/* Rank 0's planner data (its keepsake.dcp record, FORMAT.md 9.1): the typed JSON text, and each key of the
   flattening map it holds with its path (a tuple of str and int), sorted for look-ups. */
typedef struct ks__planner_key {
  const char *key;
  const ks_dcp_value *path;
} ks__planner_key;
typedef struct ks__planner {
  int recorded;     /* the file has the record */
  char *text;       /* its planner data (NULL: null, or no record) */
  ks_dcp_doc *doc;  /* text decoded */
  ks__planner_key *keys;
  size_t n;
} ks__planner;

/* Reads the keepsake.dcp record of `meta` (none: all zero); KS_E_FORMAT naming `path`, KS_E_NOMEM. */
KS_NODISCARD ks_status ks__planner_read(const ks_allocator *a, const ks_meta *meta, const char *path, ks__planner *out,
                                        ks_error *err);
void ks__planner_free(const ks_allocator *a, ks__planner *p);
/* The path planner data gives `fqn`, or NULL. */
const ks_dcp_value *ks__planner_path(const ks__planner *p, const char *fqn);
/* Whether entry `name` of a rank file is a DCP item: a non-tensor value, or a key the planner data names. */
int ks__shard_dcp_item(const ks__planner *p, const char *name);

/* Whether `name` is one of saved rank `rank`'s items in keepsake 0.2's per-rank layout (dcp02.c): `rank<r>/...`
   or KS_SHARD_DCP_OBJECT + `rank<r>/...`. */
int ks__shard_dcp02_item(const char *name, int rank);
/* Adds those items of `file` (saved rank `rank`'s entries) to `out` under the per-rank names, and the
   update count of each metric to `records` (path -> {"update_count", "schema_version"}). planner data names the
   keys of data positions; `metric` the program's metrics, whose inner metrics name a metric's parts above 0 (a
   part no program metric names is left out). KS_E_FORMAT naming `path` and the item; KS_E_LIMIT; KS_E_NOMEM. */
KS_NODISCARD ks_status ks__shard_dcp02_convert(const ks_allocator *a, const ks_statedict *file, int rank,
                                               const ks__planner *pd, ks_shard_metric_fn metric, void *metric_ctx,
                                               const char *path, ks_statedict *out, ks__jv *records, ks_error *err);

#endif
