/*
 * Internals of the PyTorch bridge: the zip container, the pickle machine and
 * its node tree, known constructors, flattening and CRC32. Not installed.
 */
#ifndef KS_TORCH_INTERNAL_H
#define KS_TORCH_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/internal.h"
#include "core/keys.h"
#include "keepsake/statedict.h"
#include "keepsake/tensor.h"
#include "keepsake/torch.h"

/* ---- CRC32 (IEEE, as zip uses) ---- */
typedef struct ks__crc32 {
  uint32_t t[8][256];
} ks__crc32;
void ks__crc32_init(ks__crc32 *c);
uint32_t ks__crc32_update(const ks__crc32 *c, uint32_t crc, const void *p, size_t n);

/* ---- what a file is (load.c, dcp.c) ---- */
/* What the first bytes of a file say it is: KS_TORCH_ZIP, KS_TORCH_LEGACY or KS_TORCH_UNKNOWN. */
ks_torch_kind ks__torch_sniff(const void *buf, size_t len);
/* Nonzero when dir is a directory (or a link to one) holding a `.metadata` file: a torch DCP
   checkpoint. Only stats through io (NULL = ks_io_posix()). */
int ks__torch_dcp_dir(const char *dir, const ks_io *io);

/* ---- zip reader (zip.c) ---- */
typedef struct ks__zip_entry {
  const char *name; /* points into the central directory copy, NUL-terminated */
  uint64_t data_off;
  uint64_t size;
  uint32_t crc;
  uint16_t method;
  uint16_t flags;
  bool crc_checked; /* ks__zip_read verified it already: each BINPERSID of one storage must not pay again */
} ks__zip_entry;

typedef struct ks__zip ks__zip;
KS_NODISCARD ks_status ks__zip_open_buffer(const void *buf, size_t len, const ks_allocator *a, ks__zip **out,
                              ks_error *err);
KS_NODISCARD ks_status ks__zip_open_path(const char *path, const ks_io *io, const ks_allocator *a, ks__zip **out,
                                         ks_error *err);
void ks__zip_free(ks__zip *z);
/* Root folder of the archive including its trailing '/', e.g. "archive/". */
const char *ks__zip_root(const ks__zip *z);
size_t ks__zip_count(const ks__zip *z);
const ks__zip_entry *ks__zip_at(const ks__zip *z, size_t i);
/* Nonzero when the bytes live in a mapping owned by the zip (not the caller's buffer). */
int ks__zip_owns_data(const ks__zip *z);
/* Finds root+rel and returns its stored bytes; refuses compressed or encrypted entries. The CRC32 is checked
 * on the first read of an entry only. */
KS_NODISCARD ks_status ks__zip_read(const ks__zip *z, const char *rel, int verify_crc, const uint8_t **data,
                       size_t *len, ks_error *err);

/* ---- zip writer (zip_writer.c): stored entries, data aligned to 64 bytes ---- */
typedef ks_status (*ks__zw_write_fn)(void *ctx, const void *p, size_t n);
typedef struct ks__zw ks__zw;
KS_NODISCARD ks_status ks__zw_create(const ks_allocator *a, ks__zw_write_fn write, void *ctx, int force_zip64,
                                     ks__zw **out);
/* Appends one stored entry (CRC32 computed here). */
KS_NODISCARD ks_status ks__zw_add(ks__zw *z, const char *name, const void *data, size_t n, ks_error *err);
/* Writes the central directory (and zip64 records when needed). */
KS_NODISCARD ks_status ks__zw_finish(ks__zw *z, ks_error *err);
void ks__zw_free(ks__zw *z);
/* Writes sd as a torch archive through fn (pt_writer.c); force_zip64 writes zip64 records even when small. */
KS_NODISCARD ks_status ks__pt_write(const ks_statedict *sd, const ks_torch_write_opts *opts, int force_zip64,
                                    ks__zw_write_fn fn, void *ctx, ks_error *err);
/* ks_torch_save_buffer with zip64 records forced (tests of the zip64 path; not exported). */
KS_NODISCARD ks_status ks__torch_save_buffer_zip64(const ks_statedict *sd, const ks_torch_write_opts *opts, void **out,
                                      size_t *out_len, ks_error *err);

/* ---- pickle node tree (pickle_tree.c) ---- */
typedef enum ks__pk_kind {
  PK_NONE,
  PK_BOOL,
  PK_INT,
  PK_BIGINT, /* s: its decimal text, made once when read (NULL when longer than KS__PK_BIGINT_MAX bytes; n = byte
                length) */
  PK_FLOAT,
  PK_STR, /* bytes: UTF-8, NUL-terminated */
  PK_BYTES,
  PK_TUPLE,
  PK_LIST,
  PK_SET,
  PK_DICT,   /* seq holds key0, value0, key1, value1... */
  PK_GLOBAL, /* an unresolved reference module.name: never imported */
  PK_OBJECT, /* inert result of REDUCE/NEWOBJ on an unknown callable */
  PK_STORAGE,
  PK_TENSOR,
  PK_NPDTYPE
} ks__pk_kind;

typedef struct ks__pk_node ks__pk_node;
typedef struct ks__pk_seq {
  ks__pk_node **v;
  size_t n, cap; /* cap 0: the items live in the arena's chunks (all a tuple's; a list's first batch) */
} ks__pk_seq;

/* An inert object: the result of REDUCE/NEWOBJ on an unknown callable, and what BUILD and items added to it. */
typedef struct ks__pk_obj {
  ks__pk_node *cls, *args, *state, *items;
  bool state_owned; /* state is a dict merge_state made, referenced from nowhere else */
} ks__pk_obj;

/* 32 bytes: every opcode may make one, so the node stays small; objects and tensors live beside it. */
struct ks__pk_node {
  ks__pk_kind kind;
  union {
    int64_t i;
    double f;
    struct {
      char *p; /* in the arena's chunks */
      size_t n;
    } s;
    ks__pk_seq seq;
    struct {
      char *module, *name;
    } g;
    ks__pk_obj *obj; /* in the arena's chunks */
    struct {
      ks_dtype dtype;
      const uint8_t *data;
      uint64_t numel;
    } st;
    ks_tensor *t; /* in the arena's chunks */
    struct {
      ks_dtype dtype;
      int swap;
    } npd;
  } u;
};

typedef struct ks__pk_block ks__pk_block; /* nodes, made together and kept in the order they were made */
typedef struct ks__pk_chunk ks__pk_chunk; /* bytes handed out in order: strings, tuples' items, tensors */

/* Owns every node and every buffer materialised while reading one pickle.
 * Its memory besides materialised views (nodes, strings, items, the machine's stack, marks and memo) is
 * counted in `mem` and refused past `mem_max`: ks__pk_run sets it to KS__PK_MEM_PER_BYTE bytes per pickle
 * byte plus KS__PK_MEM_BASE for the time of one program. Views count against max_view_bytes instead. */
typedef struct ks__pk_arena {
  ks_allocator alloc;
  ks__pk_block *first, *last;
  ks__pk_chunk *chunks;
  ks__pk_node *none, *bools[2]; /* immutable leaves, made once and shared */
  ks__pk_node ***ints;           /* likewise ints 0..65535: 2048 pages of 32, made when first used */
  void **bufs;
  size_t nbufs, capbufs;
  uint64_t buf_bytes;
  uint64_t mem, mem_max, mem_peak;
  bool over_budget; /* an allocation was refused by mem_max (KS_E_LIMIT), not by the allocator */
  uint64_t work; /* items copied into sequences: the cost the pickle's opcodes cause (see max_work) */
  ks__zip *zip; /* kept alive when tensors point into its mapping */
} ks__pk_arena;

/* The machine's memory budget for one program of n bytes: KS__PK_MEM_PER_BYTE * n + KS__PK_MEM_BASE.
 * Real pickles take 2 to 6 bytes per byte (docs/DESIGN.md, "Hostile inputs"). */
#define KS__PK_MEM_PER_BYTE 16u
#define KS__PK_MEM_BASE ((uint64_t)1 << 20)

void ks__pk_arena_init(ks__pk_arena *ar, const ks_allocator *a);
void ks__pk_arena_release(ks__pk_arena *ar); /* frees nodes, buffers and the zip */
/* A zeroed node of kind (PK_OBJECT and PK_TENSOR nodes come from ks__pk_new_object and ks__pk_new_tensor). */
ks__pk_node *ks__pk_new(ks__pk_arena *ar, ks__pk_kind kind);
/* None, True/False, and ints 0..65535 are shared (nothing changes a leaf once made). */
ks__pk_node *ks__pk_new_none(ks__pk_arena *ar);
ks__pk_node *ks__pk_new_bool(ks__pk_arena *ar, bool v);
ks__pk_node *ks__pk_new_int(ks__pk_arena *ar, int64_t v);
ks__pk_node *ks__pk_new_str(ks__pk_arena *ar, ks__pk_kind kind, const void *p, size_t n);
ks__pk_node *ks__pk_new_global(ks__pk_arena *ar, const char *module, size_t mlen, const char *name,
                               size_t nlen);
/* A PK_OBJECT of cls(args), with no state or items yet. */
ks__pk_node *ks__pk_new_object(ks__pk_arena *ar, ks__pk_node *cls, ks__pk_node *args);
/* A PK_TENSOR with a zeroed tensor. */
ks__pk_node *ks__pk_new_tensor(ks__pk_arena *ar);
/* Turns n into a PK_TENSOR holding a copy of t (numpy's BUILD of an array object). */
bool ks__pk_make_tensor(ks__pk_arena *ar, ks__pk_node *n, const ks_tensor *t);
/* A sequence of kind holding a copy of items[0..n) (in the arena's chunks). */
ks__pk_node *ks__pk_new_seq(ks__pk_arena *ar, ks__pk_kind kind, ks__pk_node *const *items, size_t n);
/* Appends v[0..k) to a list, set or dict (k units of ar->work); ks__pk_push appends one. */
bool ks__pk_push_n(ks__pk_arena *ar, ks__pk_seq *s, ks__pk_node *const *v, size_t k);
bool ks__pk_push(ks__pk_arena *ar, ks__pk_seq *s, ks__pk_node *v);
/* n bytes of the arena's chunks (8-aligned), freed with the arena. */
void *ks__pk_bytes(ks__pk_arena *ar, size_t n);
/* Counts n more (or fewer) bytes of the machine's memory: false, with ar->over_budget set, past mem_max. */
bool ks__pk_charge(ks__pk_arena *ar, size_t n);
void ks__pk_uncharge(ks__pk_arena *ar, size_t n);
/* The error for a failed allocation: KS_E_LIMIT naming the budget when mem_max refused it, else KS_E_NOMEM. */
KS_NODISCARD ks_status ks__pk_nomem(const ks__pk_arena *ar, int64_t off, ks_error *err);
/* Longest integer (in bytes) converted to decimal; longer ones are kept without text. */
#define KS__PK_BIGINT_MAX 4096
/* A PK_BIGINT from n little-endian two's complement bytes, converted to decimal here, once,
 * however many times the pickle references it (the conversion is quadratic in n). */
ks__pk_node *ks__pk_new_bigint(ks__pk_arena *ar, const uint8_t *le, size_t n);
/* Allocates a buffer owned by the arena (freed with it): views, counted in buf_bytes, not in mem. */
void *ks__pk_buffer(ks__pk_arena *ar, size_t n);
/* Calls fn on each node in the order they were made; stops at, and returns, the first for which it is true. */
const ks__pk_node *ks__pk_find_node(const ks__pk_arena *ar, bool (*fn)(const ks__pk_node *n));
/* Nonzero when g is a PK_GLOBAL naming module.name. */
int ks__pk_is_global(const ks__pk_node *g, const char *module, const char *name);
const char *ks__pk_kind_name(ks__pk_kind k);

/* ---- pickle machine (pickle.c, rebuild.c) ---- */
typedef struct ks__pk_vm ks__pk_vm;
/* Resolves a storage key to its bytes (the zip's data/<key>). */
typedef ks_status (*ks__pk_storage_fn)(void *ctx, const char *key, const uint8_t **data, size_t *len,
                                       ks_error *err);

typedef struct ks__pk_limits {
  size_t max_memo;
  size_t max_stack;
  uint64_t max_string;
  uint64_t max_view_bytes;
  size_t max_depth;
  size_t max_entries;
  uint64_t max_work; /* opcodes run plus items copied by constructors; capped at 32 per pickle byte + 1M */
  uint64_t max_mem;  /* the machine's memory (see ks__pk_arena); 0: KS__PK_MEM_PER_BYTE per pickle byte + BASE */
  uint64_t max_output_bytes; /* bytes of flattened values (shared references count once per path) */
} ks__pk_limits;

void ks__pk_limits_from_opts(const ks_torch_read_opts *opts, size_t input_len, ks__pk_limits *out);

/* Runs a pickle program; on success *root is the value STOP returned (owned by ar). */
KS_NODISCARD ks_status ks__pk_run(const uint8_t *p, size_t n, ks__pk_arena *ar, const ks__pk_limits *lim,
                     ks__pk_storage_fn storage, void *storage_ctx, ks__pk_node **root, ks_error *err);

/* Known constructors (rebuild.c). `off` is the opcode's byte offset for errors. */
KS_NODISCARD ks_status ks__pk_reduce(ks__pk_arena *ar, const ks__pk_limits *lim, ks__pk_node *callable,
                        ks__pk_node *args, int64_t off, ks__pk_node **out, ks_error *err);
KS_NODISCARD ks_status ks__pk_build(ks__pk_arena *ar, const ks__pk_limits *lim, ks__pk_node *obj,
                       ks__pk_node *state, int64_t off, ks_error *err);
KS_NODISCARD ks_status ks__pk_persid(ks__pk_arena *ar, ks__pk_node *pid, ks__pk_storage_fn storage, void *ctx,
                        int64_t off, ks__pk_node **out, ks_error *err);
/* A view of `base` (base_numel elements of dt): borrowed when row-major and aligned,
 * otherwise materialised into an arena buffer (counted against max_view_bytes). */
KS_NODISCARD ks_status ks__pk_view(ks__pk_arena *ar, const ks__pk_limits *lim, ks_dtype dt, const uint8_t *base,
                      uint64_t base_numel, uint64_t offset, int rank, const int64_t *shape,
                      const int64_t *stride, int64_t off, ks_tensor *t, ks_error *err);
/* numpy (numpy.c): dtype and scalar constructors, BUILD of dtypes and arrays. */
KS_NODISCARD ks_status ks__pk_np_dtype(ks__pk_arena *ar, const ks__pk_limits *lim, ks__pk_node *args, int64_t off,
                          ks__pk_node **out, ks_error *err);
KS_NODISCARD ks_status ks__pk_np_scalar(ks__pk_arena *ar, const ks__pk_limits *lim, ks__pk_node *args, int64_t off,
                           ks__pk_node **out, ks_error *err);
KS_NODISCARD ks_status ks__pk_np_dtype_build(ks__pk_node *dt, const ks__pk_node *state, int64_t off, ks_error *err);
KS_NODISCARD ks_status ks__pk_np_array_build(ks__pk_arena *ar, const ks__pk_limits *lim, ks__pk_node *obj,
                                const ks__pk_node *state, int64_t off, ks_error *err);
const char *ks__pk_torch_dtype_name(ks_dtype dt);
const char *ks__pk_storage_dtype_text(const char *storage_class);
KS_NODISCARD ks_status ks__pk_ctor_tensor_v3(ks__pk_arena *ar, const ks__pk_limits *lim, ks__pk_node *args, int64_t off,
                                ks__pk_node **out, ks_error *err);
const char *ks__pk_storage_name(ks_dtype dt);

/* What flattening charges against max_output_bytes beyond names and values: for each path to a list,
 * tuple, set, dict or object (its record in the structure document, and a copy when another path reached it
 * first), and for each entry (its record in the state dict, about 250 bytes). */
#define KS__PK_CONTAINER_BYTES 512
#define KS__PK_ENTRY_BYTES 256

/* ---- structure of flattened values (structure.c) ---- */
/* Nesting of the flattened tree that ks_torch_load accepts by default; the writer refuses deeper names. */
#define KS__TORCH_MAX_DEPTH 64
typedef struct ks__structure ks__structure;
KS_NODISCARD ks_status ks__structure_create(ks__structure **out, ks_error *err);
void ks__structure_free(ks__structure *s);
/* Records the container n found at path (lists, tuples, sets, empty dicts). */
KS_NODISCARD ks_status ks__structure_container(ks__structure *s, const char *path, const ks__pk_node *n, ks_error *err);
/* Records that the dict at path has the non-str key `key`, printed as text[0..n). */
KS_NODISCARD ks_status ks__structure_key(ks__structure *s, const char *path, const ks__pk_node *key, const char *text,
                                         size_t n, ks_error *err);
/* Records that the file holds one bare value, flattened as the entry "value". */
KS_NODISCARD ks_status ks__structure_bare_value(ks__structure *s, ks_error *err);
KS_NODISCARD ks_status ks__structure_dump(const ks__structure *s, const ks_allocator *a, char **out, ks_error *err);
/* Key escaping is core's: ks__key_escape and friends (core/keys.h). */
/* KS_E_EXISTS when a name is both a value and the folder of another. */
KS_NODISCARD ks_status ks__torch_names_prefix_free(const ks_statedict *sd, ks_error *err);

/* ---- flattening (flatten.c) ---- */
/* Adds every leaf of root to sd under its '/'-joined path. Tensors whose data the
 * arena owns are added as KS_MAPPED_VIEW (the caller attaches the arena); others are copied.
 * shape, when not NULL, records container kinds. */
KS_NODISCARD ks_status ks__pk_flatten(const ks__pk_node *root, const ks__pk_arena *ar, const ks__pk_limits *lim,
                         ks_statedict *sd, ks_error *err);
KS_NODISCARD ks_status ks__pk_flatten_structured(const ks__pk_node *root, const ks__pk_limits *lim, ks_statedict *sd,
                                    ks__structure *shape, ks_error *err);

#endif
