/* Private to the shard module: the parsed index and helpers shared by its files. */
#ifndef KS_SHARD_INTERNAL_H
#define KS_SHARD_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "core/internal.h"
#include "core/json.h"
#include "core/keys.h"
#include "keepsake/shard.h"

/* Metadata keys of a rank file. */
#define KS__SHARD_META "keepsake.shard"       /* {"rank","world_size","per_rank","timestamp"} */
#define KS__DCP_INFO "DCP_SHARDING_INFO"      /* torch DCP: {fqn: {"saved_offsets": [...]}} */
#define KS__DCP_VERSION "DCP_VERSION"
#define KS__METRICS_META "keepsake.metrics"

/* Counters of the timestamp, or has = 0. */
typedef struct ks__shard_ts {
  int has;
  int64_t epoch, batch, sample, token;
} ks__shard_ts;

typedef struct ks__saved_chunk {
  int file; /* rank whose file holds it */
  int64_t offsets[KS_MAX_RANK];
  int64_t shape[KS_MAX_RANK];
} ks__saved_chunk;

typedef struct ks__sharded {
  char *name;
  ks_dtype dtype;
  int rank;
  int64_t global_shape[KS_MAX_RANK];
  size_t n_chunks;
  ks__saved_chunk *chunks;
} ks__sharded;

struct ks_shard_index {
  ks_allocator alloc;
  int world_size;
  ks__shard_ts ts;
  size_t n_per_rank;
  char **per_rank;
  char **files;
  ks_shard_file_info *infos;
  size_t n_sharded;
  ks__sharded *sharded;
};

/* "dir/name" through the allocator; NULL when out of memory. */
char *ks__shard_join(const ks_allocator *a, const char *dir, const char *name);
/* XXH3-64 and size of a whole file (mapped, read once). */
KS_NODISCARD ks_status ks__shard_hash_file(const char *path, ks_shard_file_info *info, ks_error *err);
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

#endif
