/*
 * Checkpoint directories that are not keepsake sharded checkpoints of the C
 * library, read through the library's import (ks_dcp_import, import.h): a torch
 * DCP directory (FileSystemWriter: `.metadata` and `*.distcp` files, whose
 * pickle is run on the non-executing machine and held to DCP's own classes), a
 * directory keepsake's DCP writer (keepsake.distributed.KeepsakeWriter) wrote,
 * shown as the state it holds, and a Hugging Face safetensors layout. `inspect`
 * shows what the import found, `verify` what can be checked, `diff` compares
 * the state (cmd_diff.c).
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cli_common.h"
#include "commands.h"
#include "keepsake/import.h"
#include "keepsake/layout.h"
#include "keepsake/shard.h"

/* Whether dir/name exists through the input's table. */
static int has(const ks_cli_input *in, const char *name) {
  char path[4096];
  ks_io_stat s;
  if (snprintf(path, sizeof path, "%s/%s", in->path, name) >= (int)sizeof path) return 0;
  return in->read_io->stat_fn(in->read_io->ctx, path, &s) == 0 && (s.kind == KS_IO_FILE || s.kind == KS_IO_LINK);
}

static int is_safetensors(void *ctx, const char *name, ks_io_kind kind) {
  size_t n = strlen(name);
  if ((kind == KS_IO_FILE || kind == KS_IO_LINK) && n > 12 && !strcmp(name + n - 12, ".safetensors"))
    *(int *)ctx = 1;
  return 0;
}

/* The rank 0 file's name: the directory's `rank-00000-of-*.keepsake`, listed (the index is not parsed here: a
   command parses it once, and a hostile one can be large). */
typedef struct rank0 {
  char name[256];
} rank0;

static int on_rank0(void *ctx, const char *name, ks_io_kind kind) {
  rank0 *r = ctx;
  size_t n = strlen(name);
  if ((kind == KS_IO_FILE || kind == KS_IO_LINK) && n < sizeof r->name && n > 9 && !strcmp(name + n - 9, ".keepsake"))
    snprintf(r->name, sizeof r->name, "%s", name);
  return 0;
}

/* Whether rank 0's file records `keepsake.dcp` (KeepsakeWriter's planner data): its header only. */
static int keepsake_dcp(const ks_cli_input *in) {
  rank0 r0 = {{0}};
  char path[4096];
  if (in->read_io->list_fn(in->read_io->ctx, in->path, "rank-00000-of-", on_rank0, &r0) || !r0.name[0] ||
      snprintf(path, sizeof path, "%s/%s", in->path, r0.name) >= (int)sizeof path)
    return 0;
  int yes = 0;
  ks_reader *r = NULL;
  ks_read_opts ro = {.mode = KS_READ_LAZY, .io = in->read_io};
  if (!ks_reader_open(path, &ro, &r, NULL)) yes = ks_meta_get(ks_reader_meta(r), "keepsake.dcp") != NULL;
  ks_reader_free(r);
  return yes;
}

/* Whether the index names keepsake's part (the text `"keepsake"`, read in windows, never parsed here); one that
   cannot be read is keepsake's too: its reader says why. A Hugging Face index has no such member. */
static int keepsake_index(const ks_cli_input *in) {
  char path[4096], buf[65536 + 16];
  if (snprintf(path, sizeof path, "%s/%s", in->path, KS_SHARD_INDEX_NAME) >= (int)sizeof path) return 1;
  const ks_io *io = in->read_io;
  int fd;
  uint64_t size, off = 0;
  if (io->open_fn(io->ctx, path, &fd, &size)) return 1;
  static const char needle[] = "\"keepsake\"";
  size_t keep = 0, got = 0;
  int yes = 0;
  while (!yes && off < size && !io->read_fn(io->ctx, fd, buf + keep, 65536, off, &got) && got) {
    size_t n = keep + got;
    for (size_t i = 0; !yes && i + sizeof needle - 1 <= n; i++) yes = !memcmp(buf + i, needle, sizeof needle - 1);
    keep = n < sizeof needle - 1 ? n : sizeof needle - 1; /* a match across two windows */
    memmove(buf, buf + n - keep, keep);
    off += got;
  }
  io->close_fn(io->ctx, fd);
  return yes;
}

ks_cli_dir_kind ks_cli_dir_kind_of(const ks_cli_input *in) {
  if (has(in, ".metadata")) return KS_CLI_DIR_TORCH_DCP;
  if (has(in, KS_SHARD_INDEX_NAME)) {
    if (!keepsake_index(in)) return KS_CLI_DIR_HF;
    return keepsake_dcp(in) ? KS_CLI_DIR_KEEPSAKE_DCP : KS_CLI_DIR_SHARDED;
  }
  int any = 0;
  in->read_io->list_fn(in->read_io->ctx, in->path, "", is_safetensors, &any);
  return any ? KS_CLI_DIR_HF : KS_CLI_DIR_SHARDED; /* the sharded reader says what is missing */
}

ks_status ks_cli_import(const ks_cli_input *in, int verify, ks_statedict **sd, ks_meta **meta, ks_error *err) {
  ks_torch_read_opts ro = {0};
  ro.size = sizeof ro;
  ro.io = in->read_io;
  ro.verify_crc = verify;
  ks_import_opts io = {.read = &ro};
  ks_status st = ks_dcp_import(in->path, &io, sd, meta, err);
  if (st) ks_cli_input_error(in, err);
  return st;
}

/* ---- what the import read: its info document (KS_META_DCP_IMPORT) ---- */

typedef struct info {
  json_t *doc;
  const char *format, *version;
  json_int_t tensors, chunks, objects, files, checksummed;
  json_t *skipped;
} info;

static void info_read(const ks_meta *meta, info *x) {
  memset(x, 0, sizeof *x);
  const char *text = ks_meta_get(meta, KS_META_DCP_IMPORT);
  x->doc = text ? json_loads(text, 0, NULL) : NULL;
  x->format = json_string_value(json_object_get(x->doc, "format"));
  x->version = json_string_value(json_object_get(x->doc, "version"));
  x->tensors = json_integer_value(json_object_get(x->doc, "tensors"));
  x->chunks = json_integer_value(json_object_get(x->doc, "chunks"));
  x->objects = json_integer_value(json_object_get(x->doc, "objects"));
  x->files = json_integer_value(json_object_get(x->doc, "files"));
  x->checksummed = json_integer_value(json_object_get(x->doc, "checksummed"));
  x->skipped = json_object_get(x->doc, "skipped");
  if (!x->format) x->format = "?";
}

static const char *kind_text(ks_cli_dir_kind k) {
  switch (k) {
    case KS_CLI_DIR_TORCH_DCP: return "torch.distributed.checkpoint (torch's FileSystemWriter)";
    case KS_CLI_DIR_KEEPSAKE_DCP: return "torch.distributed.checkpoint written by keepsake (KeepsakeWriter)";
    case KS_CLI_DIR_HF: return "Hugging Face safetensors layout";
    default: return "?";
  }
}

/* ---- inspect ---- */

static uint64_t tensor_bytes(const ks_statedict *sd, size_t *ntensors) {
  uint64_t b = 0;
  *ntensors = 0;
  for (size_t i = 0; i < ks_statedict_count(sd); i++) {
    ks_entry e;
    if (!ks_statedict_at(sd, i, &e) && e.kind == KS_VAL_TENSOR) b += e.tensor.nbytes, (*ntensors)++;
  }
  return b;
}

static const char *kind_name(ks_value_kind k) {
  static const char *const names[] = {"tensor", "int", "float", "bool", "string", "null"};
  return (unsigned)k < 6 ? names[k] : "?";
}

static void print_entries(const ks_statedict *sd) {
  static const char *const th[] = {"NAME", "DTYPE", "SHAPE", "BYTES"}, *const vh[] = {"NAME", "TYPE", "VALUE"};
  ks_cli_table *t = ks_cli_table_new(4, th), *v = ks_cli_table_new(3, vh);
  for (size_t i = 0; t && v && i < ks_statedict_count(sd); i++) {
    ks_entry e;
    if (ks_statedict_at(sd, i, &e)) continue; /* index in range: cannot fail */
    char shape[160], bytes[24], val[512];
    if (e.kind == KS_VAL_TENSOR) {
      snprintf(bytes, sizeof bytes, "%zu", e.tensor.nbytes);
      const char *row[] = {e.name, ks_dtype_name(e.tensor.dtype), ks_cli_shape(&e.tensor, shape, sizeof shape), bytes};
      ks_cli_table_add(t, row);
    } else {
      const char *row[] = {e.name, kind_name(e.kind), ks_cli_scalar_text(&e, val, sizeof val)};
      ks_cli_table_add(v, row);
    }
  }
  if (t) ks_cli_table_print(t, stdout, "tensors");
  if (v && ks_cli_table_rows(v)) fputc('\n', stdout), ks_cli_table_print(v, stdout, "values");
  ks_cli_table_free(t);
  ks_cli_table_free(v);
}

static void print_text(const char *dir, ks_cli_dir_kind kind, const ks_statedict *sd, const ks_meta *meta,
                       const info *x) {
  size_t nt;
  uint64_t bytes = tensor_bytes(sd, &nt);
  printf("checkpoint: %s\nformat:     %s", ks_cli_esc(dir), kind_text(kind));
  if (x->version && kind == KS_CLI_DIR_TORCH_DCP) printf(", Metadata version %s", ks_cli_esc(x->version));
  printf("\nread:       %lld file%s; %zu tensors (%" PRIu64 " bytes, from %lld chunks), %zu values",
         (long long)x->files, x->files == 1 ? "" : "s", nt, bytes, (long long)x->chunks, ks_statedict_count(sd) - nt);
  if (kind != KS_CLI_DIR_HF) printf(" (%lld non-tensor items)", (long long)x->objects);
  printf("\nnames:      %s\n\n",
         kind == KS_CLI_DIR_HF ? "the stored keys, each one name ('/' and '%' escaped), or the names keepsake recorded"
                               : "each item's path in the saved state dict (planner_data)");
  print_entries(sd);
  size_t nskip = json_object_size(x->skipped);
  if (nskip) {
    printf("\nleft out (%zu): not plain data, kept only in the DCP files\n", nskip);
    const char *k;
    json_t *v;
    json_object_foreach(x->skipped, k, v) printf("  %s: %s\n", ks_cli_esc(k), ks_cli_esc(json_string_value(v)));
  }
  const char *structure = ks_meta_get(meta, KS_TORCH_STRUCTURE_META);
  if (structure) printf("\nmetadata\n  %s: %s\n", KS_TORCH_STRUCTURE_META, ks_cli_esc(structure));
}

static json_t *entries_json(const ks_statedict *sd) {
  json_t *tensors = json_array(), *values = json_object();
  for (size_t i = 0; i < ks_statedict_count(sd); i++) {
    ks_entry e;
    if (ks_statedict_at(sd, i, &e)) continue; /* index in range: cannot fail */
    if (e.kind != KS_VAL_TENSOR) {
      json_object_set_new(values, e.name, ks_cli_scalar_json(&e));
      continue;
    }
    json_t *shape = json_array();
    for (int d = 0; d < e.tensor.rank; d++) json_array_append_new(shape, json_integer((json_int_t)e.tensor.shape[d]));
    json_array_append_new(tensors, json_pack("{s:s, s:s, s:o, s:I}", "name", e.name, "dtype",
                                             ks_dtype_name(e.tensor.dtype), "shape", shape, "bytes",
                                             (json_int_t)e.tensor.nbytes));
  }
  return json_pack("{s:o, s:o}", "tensors", tensors, "values", values);
}

int ks_cli_inspect_import(const ks_cli_input *in, ks_cli_dir_kind kind, int as_json) {
  ks_statedict *sd = NULL;
  ks_meta *meta = NULL;
  ks_error err;
  if (ks_cli_import(in, 0, &sd, &meta, &err)) {
    ks_cli_print_error(stderr, "inspect", &err);
    return KS_EXIT_BAD;
  }
  info x;
  info_read(meta, &x);
  int rc = KS_EXIT_OK;
  if (as_json) {
    json_t *root = entries_json(sd), *md = json_object();
    for (size_t i = 0; i < ks_meta_count(meta); i++) {
      const char *k, *v;
      if (!ks_meta_at(meta, i, &k, &v)) json_object_set_new(md, k, json_string(v));
    }
    json_object_set_new(root, "checkpoint", json_string(in->arg));
    json_object_set_new(root, "format", json_string(x.format));
    json_object_set_new(root, "metadata", md);
    rc = ks_cli_print_json(root) ? KS_EXIT_BAD : KS_EXIT_OK;
    json_decref(root);
  } else {
    print_text(in->arg, kind, sd, meta, &x);
  }
  json_decref(x.doc);
  ks_statedict_free(sd);
  ks_meta_free(meta);
  return rc;
}

/* ---- verify ---- */

int ks_cli_verify_import(const ks_cli_input *in, ks_cli_dir_kind kind) {
  ks_statedict *sd = NULL;
  ks_meta *meta = NULL;
  ks_error err;
  const char *dir = ks_cli_esc(in->arg);
  if (ks_cli_import(in, 1, &sd, &meta, &err)) {
    ks_cli_print_error(stdout, "verify", &err);
    printf("%s: BAD (1 problem)\n", dir);
    return KS_EXIT_BAD;
  }
  info x;
  info_read(meta, &x);
  size_t nt;
  tensor_bytes(sd, &nt);
  size_t nskip = json_object_size(x.skipped);
  printf("%s: OK (%s, %lld file%s, %zu tensors from %lld chunks, %zu values", dir, kind_text(kind),
         (long long)x.files, x.files == 1 ? "" : "s", nt, (long long)x.chunks, ks_statedict_count(sd) - nt);
  if (nskip) printf(", %zu non-tensor items left out: not plain data", nskip);
  printf(")\n");
  if (kind == KS_CLI_DIR_TORCH_DCP)
    printf("  checked: .metadata (read without running it: DCP's own classes only) is consistent: every tensor's\n"
           "           chunks cover it exactly once, every item lies inside its file; every item was read and\n"
           "           its zip CRC-32s match\n"
           "  no checksums: DCP records none of its own; nothing but the items' zip CRC-32s vouches for the bytes\n");
  else if (x.checksummed == x.files)
    printf("  checked: the index against the files, every tensor's keepsake checksum\n");
  else
    printf("  checked: the index against the files, each file's safetensors structure, chunks that cover each\n"
           "           tensor exactly once%s\n"
           "  no checksums: %lld of the %lld files are plain safetensors, which carry none; nothing vouches for\n"
           "           their bytes\n", x.checksummed ? ", keepsake checksums where a file has them" : "",
           (long long)(x.files - x.checksummed), (long long)x.files);
  json_decref(x.doc);
  ks_statedict_free(sd);
  ks_meta_free(meta);
  return KS_EXIT_OK;
}
