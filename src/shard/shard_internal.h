/* Private to the shard module: the parsed index and helpers shared by its files. */
#ifndef KS_SHARD_INTERNAL_H
#define KS_SHARD_INTERNAL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "core/internal.h"
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
ks_status ks__shard_hash_file(const char *path, ks_shard_file_info *info, ks_error *err);
/* The timestamp counters of a state dict (has = 0 when there is none). */
void ks__shard_ts_of(const ks_statedict *sd, ks__shard_ts *ts);
json_t *ks__shard_ts_json(const ks__shard_ts *ts);
/* Parses what ks__shard_ts_json wrote; 0 on a malformed value. */
int ks__shard_ts_parse(const json_t *j, ks__shard_ts *ts);
int ks__shard_ts_equal(const ks__shard_ts *a, const ks__shard_ts *b);
void ks__shard_ts_format(const ks__shard_ts *ts, char *buf, size_t cap);
/* Nonzero when name matches one of the globs. */
int ks__shard_matches(const char *name, const char *const *globs, size_t n);
/* Parses a JSON array of at most KS_MAX_RANK non-negative integers; returns its length or -1. */
int ks__shard_dims(const json_t *j, int64_t *out);
json_t *ks__shard_dims_json(int rank, const int64_t *v);

#endif
