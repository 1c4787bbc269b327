/*
 * `keepsake inspect DIR` and `keepsake verify DIR` for a sharded checkpoint
 * directory (rank files plus model.safetensors.index.json). DIR may be a local
 * directory, s3://bucket/prefix or http(s)://host/path: every read goes through
 * the location's table (ks_storage), as for single files.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli_common.h"
#include "commands.h"

/* A remote location is a directory when its table says so (an S3 prefix with objects under it) or
   when it holds an index (HTTP, whose URLs name files only). No request for a local path. */
static int remote_is_dir(const char *loc) {
  ks_storage *st = NULL;
  if (ks_storage_open(loc, NULL, &st, NULL)) return 0;
  const ks_io *io = ks_storage_io(st);
  const char *p = ks_storage_path(st);
  char index[4096];
  ks_io_stat sb;
  int yes = io->stat_fn(io->ctx, p, &sb) == 0 && sb.kind == KS_IO_DIR;
  if (!yes && snprintf(index, sizeof index, "%s/%s", p, KS_SHARD_INDEX_NAME) < (int)sizeof index)
    yes = io->stat_fn(io->ctx, index, &sb) == 0 && sb.kind == KS_IO_FILE;
  ks_storage_free(st);
  return yes;
}

int ks_cli_is_dir(const char *path) {
  if (strstr(path, "://") && strncmp(path, "file://", 7)) return remote_is_dir(path);
  struct stat sb;
  return stat(strncmp(path, "file://", 7) ? path : path + 7, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int open_index(const char *cmd, const ks_cli_input *in, ks_shard_index **idx) {
  ks_error err;
  ks_status st = ks_shard_index_read(in->path, NULL, in->read_io, idx, &err);
  if (st == KS_OK) return 0;
  ks_cli_input_error(in, &err);
  ks_cli_print_error(stdout, cmd, &err);
  printf("%s: BAD (%s)\n", ks_cli_esc(in->arg),
         st == KS_E_NOTFOUND ? "not a complete sharded checkpoint" : "bad index");
  return 1;
}

/* Problems of ks_shard_check, printed as they come; the files they name are not hashed again. */
typedef struct dir_problems {
  const ks_shard_index *idx;
  size_t n;
  unsigned char *bad; /* per rank file */
} dir_problems;

static int ends_with_file(const char *path, const char *name) {
  size_t n = strlen(path), m = strlen(name);
  return n > m && path[n - m - 1] == '/' && !strcmp(path + n - m, name);
}

static int on_problem(void *ctx, const ks_error *problem) {
  dir_problems *d = ctx;
  d->n++;
  ks_cli_print_error(stdout, "verify", problem);
  for (int r = 0; r < ks_cli_shard_info(d->idx).world_size; r++)
    if (ends_with_file(problem->file, ks_shard_index_file(d->idx, r, NULL))) d->bad[r] = 1;
  return 0;
}

static int count_problem(void *ctx, const ks_error *problem) {
  (*(size_t *)ctx)++;
  ks_cli_print_error(stdout, "verify", problem);
  return 0;
}

/* One rank file: its whole-file hash against the index, then every tensor's checksum. */
static size_t verify_rank_file(const ks_cli_input *in, const ks_shard_index *idx, int r) {
  ks_error err;
  if (ks_shard_verify_file(in->path, idx, r, in->read_io, &err)) {
    ks_cli_input_error(in, &err);
    ks_cli_print_error(stdout, "verify", &err);
    return 1;
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", in->path, ks_shard_index_file(idx, r, NULL));
  /* read, never mapped: a remote file on demand, a local one whole (the CLI's copy mode) */
  ks_read_opts ro = {.io = in->read_io, .mode = in->io ? KS_READ_LAZY : KS_READ_COPY};
  ks_reader *rd;
  if (ks_reader_open(path, &ro, &rd, &err)) {
    ks_cli_input_error(in, &err);
    ks_cli_print_error(stdout, "verify", &err);
    return 1;
  }
  size_t problems = 0;
  if (ks_reader_verify(rd, count_problem, &problems, &err) && problems == 0) {
    ks_cli_print_error(stdout, "verify", &err);
    problems++;
  }
  ks_reader_free(rd);
  return problems;
}

/* The index (its sharded section tiles every tensor, sizes bound every chunk), the files against
   it (sizes, headers: ks_shard_check), then each good file's hash and tensor checksums. */
static int verify_dir_at(const ks_cli_input *in) {
  const char *dir = in->arg;
  ks_shard_index *idx;
  if (open_index("verify", in, &idx)) return KS_EXIT_BAD;
  int n = ks_cli_shard_info(idx).world_size;
  dir_problems d = {idx, 0, calloc((size_t)n, 1)};
  ks_error err;
  if (!d.bad) {
    fprintf(stderr, "keepsake verify: out of memory\n");
    ks_shard_index_free(idx);
    return KS_EXIT_BAD;
  }
  ks_status st =
      ks_shard_check(in->path, idx, in->read_io, KS_SHARD_CHECK_SIZES | KS_SHARD_CHECK_HEADERS, on_problem, &d, &err);
  if (st && d.n == 0) ks_cli_input_error(in, &err), ks_cli_print_error(stdout, "verify", &err), d.n++; /* e.g. ENOMEM */
  size_t problems = d.n;
  for (int r = 0; r < n; r++)
    if (!d.bad[r]) problems += verify_rank_file(in, idx, r);
  free(d.bad);
  if (problems)
    printf("%s: BAD (%zu problem%s)\n", ks_cli_esc(dir), problems, problems == 1 ? "" : "s");
  else
    printf("%s: OK (sharded checkpoint, %d rank file%s, epoch %lld batch %lld, index, files and checksums match)\n",
           ks_cli_esc(dir), n, n == 1 ? "" : "s", (long long)ks_cli_shard_info(idx).epoch,
           (long long)ks_cli_shard_info(idx).batch);
  ks_shard_index_free(idx);
  return problems ? KS_EXIT_BAD : KS_EXIT_OK;
}

int ks_cli_verify_dir(const char *dir) {
  ks_cli_input in;
  if (ks_cli_input_open("verify", dir, &in)) return KS_EXIT_BAD;
  ks_cli_dir_kind kind = ks_cli_dir_kind_of(&in);
  int rc = kind == KS_CLI_DIR_TORCH_DCP || kind == KS_CLI_DIR_HF ? ks_cli_verify_import(&in, kind) : verify_dir_at(&in);
  ks_cli_input_close(&in);
  return rc;
}

static void print_dims(const char *label, int rank, const int64_t *v) {
  printf("%s[", label);
  for (int d = 0; d < rank; d++) printf(d ? ", %" PRId64 : "%" PRId64, v[d]);
  printf("]");
}

/* A torch DCP directory or a Hugging Face layout: what the import reads. -1 for any other directory. */
static int inspect_import(const char *dir, int as_json) {
  ks_cli_input in;
  if (ks_cli_input_open("inspect", dir, &in)) return KS_EXIT_BAD;
  ks_cli_dir_kind kind = ks_cli_dir_kind_of(&in);
  int rc = kind == KS_CLI_DIR_TORCH_DCP || kind == KS_CLI_DIR_HF ? ks_cli_inspect_import(&in, kind, as_json) : -1;
  ks_cli_input_close(&in);
  return rc;
}

int ks_cli_inspect_dir(const char *dir) {
  ks_shard_index *idx;
  ks_cli_input in;
  int imported = inspect_import(dir, 0);
  if (imported >= 0) return imported;
  if (ks_cli_input_open("inspect", dir, &in)) return KS_EXIT_BAD;
  ks_cli_dir_kind kind = ks_cli_dir_kind_of(&in);
  int bad = open_index("inspect", &in, &idx);
  ks_cli_input_close(&in); /* the index is in memory */
  if (bad) return KS_EXIT_BAD;
  int n = ks_cli_shard_info(idx).world_size;
  printf("checkpoint: %s\nformat:     keepsake sharded, %d rank%s\ntimestamp:  epoch %lld batch %lld\n\n", dir, n,
         n == 1 ? "" : "s", (long long)ks_cli_shard_info(idx).epoch, (long long)ks_cli_shard_info(idx).batch);
  printf("files (%d)\n", n);
  for (int r = 0; r < n; r++) {
    ks_shard_file_info info;
    const char *f = ks_shard_index_file(idx, r, &info);
    printf("  rank %-5d %-32s %12" PRIu64 " bytes  %s %016" PRIx64 "\n", r, f, info.size,
           ks_cli_shard_info(idx).version >= 2 ? "header xxh3" : "xxh3", info.checksum);
  }
  size_t np = ks_cli_shard_info(idx).n_per_rank;
  const char *const *pr = ks_cli_shard_info(idx).per_rank;
  printf("\nper-rank entries (saved by every rank):");
  for (size_t i = 0; i < np; i++) printf(" %s", pr[i]);
  printf("\n\nsharded tensors (%zu)\n", ks_cli_shard_info(idx).n_sharded);
  for (size_t i = 0; i < ks_cli_shard_info(idx).n_sharded; i++) {
    ks_shard_chunk whole;
    ks_dtype dt;
    size_t nc;
    if (ks_shard_index_sharded_at(idx, i, &whole, &dt, &nc)) continue; /* index in range: cannot fail */
    printf("  %s %s ", whole.name, ks_dtype_name(dt));
    print_dims("", whole.rank, whole.global_shape);
    printf(", %zu chunk%s\n", nc, nc == 1 ? "" : "s");
    for (size_t j = 0; j < nc; j++) {
      ks_shard_chunk c;
      int file;
      if (ks_shard_index_chunk(idx, i, j, &c, &file)) continue; /* index in range: cannot fail */
      printf("    rank %-5d", file);
      print_dims(" offsets ", c.rank, c.offsets);
      print_dims(" shape ", c.rank, c.shape);
      printf("\n");
    }
  }
  printf("\nEach rank file is a keepsake file: run 'keepsake inspect %s/<file>' for its contents.\n", dir);
  if (kind == KS_CLI_DIR_KEEPSAKE_DCP)
    printf("It is a torch.distributed.checkpoint (KeepsakeWriter): its files hold DCP's keys; 'keepsake diff' and\n"
           "'keepsake convert' name its state by each key's path in the saved state dict, as for torch's own.\n");
  ks_shard_index_free(idx);
  return KS_EXIT_OK;
}

static json_t *dims_json(int rank, const int64_t *v) {
  json_t *a = json_array();
  for (int d = 0; d < rank; d++) json_array_append_new(a, json_integer((json_int_t)v[d]));
  return a;
}

static json_t *sharded_json(const ks_shard_index *idx) {
  json_t *arr = json_array();
  for (size_t i = 0; i < ks_cli_shard_info(idx).n_sharded; i++) {
    ks_shard_chunk whole;
    ks_dtype dt;
    size_t nc;
    if (ks_shard_index_sharded_at(idx, i, &whole, &dt, &nc)) continue; /* index in range: cannot fail */
    json_t *chunks = json_array();
    for (size_t j = 0; j < nc; j++) {
      ks_shard_chunk c;
      int file;
      if (ks_shard_index_chunk(idx, i, j, &c, &file)) continue; /* index in range: cannot fail */
      json_array_append_new(chunks, json_pack("{s:i, s:o, s:o}", "rank", file, "offsets", dims_json(c.rank, c.offsets),
                                              "shape", dims_json(c.rank, c.shape)));
    }
    json_array_append_new(arr, json_pack("{s:s, s:s, s:o, s:o}", "name", whole.name, "dtype", ks_dtype_name(dt),
                                         "global_shape", dims_json(whole.rank, whole.global_shape), "chunks", chunks));
  }
  return arr;
}

/* Rank file r as inspect --json FILE shows it, plus what the index records of it. NULL after an error. */
static json_t *rank_file_json(const char *dir, const ks_shard_index *idx, int r) {
  ks_shard_file_info info;
  const char *name = ks_shard_index_file(idx, r, &info);
  char path[4096], hex[17];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  snprintf(hex, sizeof hex, "%016" PRIx64, info.checksum);
  json_t *one;
  if (ks_inspect_file_json(path, &one)) return NULL;
  json_object_set_new(one, "rank", json_integer(r));
  json_object_set_new(one, "name", json_string(name));
  json_object_set_new(one, "index_size", json_integer((json_int_t)info.size));
  json_object_set_new(one, "index_xxh3", json_string(hex));
  /* what index_xxh3 hashes: the length and header (index version 2) or the whole file (version 1) */
  json_object_set_new(one, "index_xxh3_of", json_string(ks_cli_shard_info(idx).version >= 2 ? "header" : "file"));
  return one;
}

/* The index, held against every file's size, or NULL after printing why. */
static ks_shard_index *checked_index(const char *dir) {
  ks_shard_index *idx = NULL;
  ks_error err;
  ks_cli_input in;
  if (ks_cli_input_open("inspect", dir, &in)) return NULL;
  ks_status st = ks_shard_index_read(in.path, NULL, in.read_io, &idx, &err);
  if (!st) st = ks_shard_check(in.path, idx, in.read_io, KS_SHARD_CHECK_SIZES, NULL, NULL, &err);
  if (st) {
    ks_cli_input_error(&in, &err);
    ks_cli_print_error(stderr, "inspect", &err);
    ks_shard_index_free(idx);
    idx = NULL;
  }
  ks_cli_input_close(&in);
  return idx;
}

int ks_cli_inspect_dir_json(const char *dir) {
  int imported = inspect_import(dir, 1);
  if (imported >= 0) return imported;
  ks_shard_index *idx = checked_index(dir);
  if (!idx) return KS_EXIT_BAD;
  int n = ks_cli_shard_info(idx).world_size;
  size_t np = ks_cli_shard_info(idx).n_per_rank;
  const char *const *pr = ks_cli_shard_info(idx).per_rank;
  json_t *per_rank = json_array(), *files = json_array();
  for (size_t i = 0; i < np; i++) json_array_append_new(per_rank, json_string(pr[i]));
  int rc = 0;
  for (int r = 0; !rc && r < n; r++) {
    json_t *one = rank_file_json(dir, idx, r);
    rc = one ? json_array_append_new(files, one) : -1;
  }
  int64_t ep = ks_cli_shard_info(idx).epoch, ba = ks_cli_shard_info(idx).batch;
  json_t *ts =
      ep < 0 && ba < 0 ? json_null() : json_pack("{s:I, s:I}", "epoch", (json_int_t)ep, "batch", (json_int_t)ba);
  json_t *root =
      json_pack("{s:s, s:s, s:i, s:o, s:o, s:o, s:o}", "checkpoint", dir, "format", "keepsake-sharded", "world_size", n,
                "timestamp", ts, "per_rank", per_rank, "sharded", sharded_json(idx), "files", files);
  if (!rc) rc = root ? ks_cli_print_json(root) : -1;
  json_decref(root);
  ks_shard_index_free(idx);
  return rc ? KS_EXIT_BAD : KS_EXIT_OK;
}
