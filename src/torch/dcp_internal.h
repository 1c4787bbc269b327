/*
 * Checkpoint directories that ks_torch_dcp_load reads: the model of a torch
 * DCP `.metadata` pickle (dcp_meta.c) and the reader of the items it points at
 * (dcp.c); a directory keepsake's DCP StorageWriter wrote (dcp_keepsake.c); a
 * Hugging Face safetensors layout (dcp_hf.c). Each fills the entries of one
 * ks__dcp_rd; ks__dcp_finish names and flattens them the same way for all three
 * (docs/FORMAT.md 9.1 and 12). Not installed.
 */
#ifndef KS_TORCH_DCP_INTERNAL_H
#define KS_TORCH_DCP_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/json.h"
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

/* Reads planner_data ({fqn: (path components)}, a PK_DICT; NULL or anything else: none) into the entries' paths. */
KS_NODISCARD ks_status ks__dcp_read_paths(ks__dcp *d, const ks__pk_node *pd, ks_error *err);

/* Elements of a box (a zero dim makes it empty); false on overflow. */
bool ks__dcp_volume(int rank, const int64_t *size, uint64_t *out);

/* Calls fn for every row (run along the last dimension) of the box off/size inside a tensor of `shape`, with the
 * row's first element index in the tensor, its index in the box and its length. Stops at fn's first nonzero result. */
typedef int (*ks__dcp_row_fn)(void *ctx, uint64_t start, uint64_t row, uint64_t len);
int ks__dcp_for_rows(int rank, const int64_t *shape, const int64_t *off, const int64_t *size, ks__dcp_row_fn fn,
                     void *ctx);

/* Longest path of a file of the directory. */
#define KS__DCP_PATH_CAP 4096

/* A directory being read: what one reader fills (the entries with their values) before ks__dcp_finish. */
typedef struct ks__dcp_rd {
  const ks_torch_read_opts *opts;
  const ks_allocator *a;
  const ks_io *io;   /* version 2 or newer */
  ks__pk_arena *ar;  /* values, tensors' buffers; given to the state dict by ks__dcp_finish */
  ks__dcp d;
  const char *dir;
  ks_error *err;
  size_t *order; /* used items, by file then offset */
  size_t norder;
  uint64_t input_bytes, budget, tensor_bytes;
  size_t nobjects, nskipped;
  size_t nfiles, nchecksummed; /* data files read; of them, those whose tensors carry keepsake checksums */
  const char *format;          /* "format" of the info document */
  char path[KS__DCP_PATH_CAP];
} ks__dcp_rd;

/* r->path = dir/name (KS_E_LIMIT when too long). */
KS_NODISCARD ks_status ks__dcp_set_path(ks__dcp_rd *r, const char *name);
/* A plain file name of the directory: no separators, not "." or "..", at most 255 bytes. */
int ks__dcp_plain_file_name(const char *s);
/* Sets r->budget from r->input_bytes (or opts) and holds every tensor entry's bytes to it. */
KS_NODISCARD ks_status ks__dcp_check_budget(ks__dcp_rd *r);
/* Checks that every tensor's chunks cover it at most once (with volumes that add up: exactly once) and
   gives it a zeroed whole buffer in the arena (its value). */
KS_NODISCARD ks_status ks__dcp_alloc_tensors(ks__dcp_rd *r);
/* Copies a chunk's bytes (row-major, its own sizes) into its box of the whole tensor of e. */
void ks__dcp_copy_chunk(const ks__dcp_entry *e, const ks__dcp_chunk *k, const uint8_t *src);
/* Why a value is not plain data (None, bool, int, float, str, bytes, tensors, and lists, tuples, sets and
   dicts of them with keys that name entries), or NULL. buf holds the text of some reasons. */
const char *ks__dcp_not_plain(const ks__pk_node *n, size_t max_visits, char *buf, size_t cap);
/* Puts the entries' values back into the nesting their paths record (when every entry has a usable one; else
   each is named by its key) and flattens it like a torch.save file of that state dict: *out (owning the
   arena), the structure document and the info document (both optional; free with ks_torch_free). */
KS_NODISCARD ks_status ks__dcp_finish(ks__dcp_rd *r, ks_statedict **out, char **structure, char **info);

/* A directory keepsake's DCP StorageWriter (keepsake.distributed.KeepsakeWriter) wrote: its index and rank
   files, as the state dict they hold (dcp_keepsake.c). KS_E_UNSUPPORTED for a sharded directory without the
   `keepsake.dcp` record (one the C library wrote). */
KS_NODISCARD ks_status ks__dcp_keepsake_load(ks__dcp_rd *r, ks_statedict **out, char **structure, char **info);
/* A Hugging Face safetensors layout: the files `index` (a parsed model.safetensors.index.json without a
   keepsake member, or NULL: every *.safetensors file of the directory) names (dcp_hf.c). */
KS_NODISCARD ks_status ks__dcp_hf_load(ks__dcp_rd *r, const ks__jv *index, ks_statedict **out,
                                       char **structure, char **info);

#endif
