/*
 * torch.distributed.checkpoint (DCP) directories: the model of a `.metadata`
 * pickle (dcp_meta.c) and the reader of the items it points at (dcp.c). Not
 * installed.
 */
#ifndef KS_TORCH_DCP_INTERNAL_H
#define KS_TORCH_DCP_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "torch/torch_internal.h"

/* The largest `.metadata` read: a million tensors of a thousand chunks each stay far below it. */
#define KS__DCP_MAX_METADATA ((uint64_t)1 << 30)

/* One chunk of a tensor: the box offsets[d] .. offsets[d] + sizes[d] of its global shape. */
typedef struct ks__dcp_chunk {
  int64_t off[KS_MAX_RANK];
  int64_t size[KS_MAX_RANK];
  size_t item; /* the storage item holding it */
} ks__dcp_chunk;

/* One entry of state_dict_metadata, in the pickle's order. */
typedef struct ks__dcp_entry {
  const char *fqn;          /* owned by the arena */
  const ks__pk_node *path;  /* planner_data's path tuple of this fqn, or NULL */
  bool tensor;              /* TensorStorageMetadata; else BytesStorageMetadata */
  ks_dtype dtype;           /* tensors */
  int rank;                 /* tensors */
  int64_t shape[KS_MAX_RANK];
  size_t chunk0, nchunks;   /* tensors: chunks[chunk0 .. chunk0 + nchunks) */
  size_t item;              /* bytes: the storage item holding the object */
  ks__pk_node *value;       /* set by the reader: the tensor or the object; NULL when skipped */
  const char *skipped;      /* set by the reader: why the object is left out (arena string) */
} ks__dcp_entry;

/* One entry of storage_data: MetadataIndex(fqn, offset) -> _StorageInfo(relative_path, offset, length). */
typedef struct ks__dcp_item {
  const char *fqn;
  bool has_off;
  int rank;
  int64_t off[KS_MAX_RANK];
  const char *file; /* a plain file name inside the checkpoint directory */
  uint64_t offset, length;
  size_t entry;     /* the entry it serves (when used) */
  size_t chunk;     /* tensors: the chunk it serves */
  bool used;
} ks__dcp_item;

/* A parsed `.metadata`: every string and node is owned by the arena it was read into. */
typedef struct ks__dcp {
  const ks_allocator *alloc;
  ks__dcp_entry *entries;
  size_t nentries;
  ks__dcp_chunk *chunks;
  size_t nchunks;
  ks__dcp_item *items;
  size_t nitems;
  const char *version; /* Metadata.version, or NULL */
} ks__dcp;

/*
 * Runs the `.metadata` pickle p[0..n) in ar (nothing is imported or called), refuses any
 * global that is not part of DCP's metadata (KS_E_UNSAFE: the program asks for code), and
 * fills *d: the entries, their chunks, and the storage item of every chunk and object
 * (KS_E_FORMAT when one is missing, used twice, or the chunks of a tensor do not cover it
 * exactly once; KS_E_UNSUPPORTED for transformed items). d->alloc, when set, allocates its
 * arrays (else the arena's allocator). On failure *d holds what must be freed with ks__dcp_free.
 */
KS_NODISCARD ks_status ks__dcp_parse(const uint8_t *p, size_t n, ks__pk_arena *ar, const ks__pk_limits *lim,
                                     ks__dcp *d, ks_error *err);
void ks__dcp_free(ks__dcp *d);

/* Elements of a box (a zero dim makes it empty); false on overflow. */
bool ks__dcp_volume(int rank, const int64_t *size, uint64_t *out);

/* Calls fn for every row (run along the last dimension) of the box off/size inside a tensor of `shape`, with the
 * row's first element index in the tensor, its index in the box and its length. Stops at fn's first nonzero result. */
typedef int (*ks__dcp_row_fn)(void *ctx, uint64_t start, uint64_t row, uint64_t len);
int ks__dcp_for_rows(int rank, const int64_t *shape, const int64_t *off, const int64_t *size, ks__dcp_row_fn fn,
                     void *ctx);

#endif
