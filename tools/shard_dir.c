/*
 * `keepsake inspect DIR` and `keepsake verify DIR` for a sharded checkpoint
 * directory (rank files plus model.safetensors.index.json).
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli_common.h"
#include "commands.h"

int ks_cli_is_dir(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int open_index(const char *cmd, const char *dir, ks_shard_index **idx) {
  ks_error err;
  ks_status st = ks_shard_index_read(dir, NULL, idx, &err);
  if (st == KS_OK) return 0;
  ks_cli_print_error(stdout, cmd, &err);
  printf("%s: BAD (%s)\n", ks_cli_esc(dir), st == KS_E_NOTFOUND ? "not a complete sharded checkpoint" : "bad index");
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
  for (int r = 0; r < ks_shard_index_world_size(d->idx); r++)
    if (ends_with_file(problem->file, ks_shard_index_file(d->idx, r, NULL))) d->bad[r] = 1;
  return 0;
}

static int count_problem(void *ctx, const ks_error *problem) {
  (*(size_t *)ctx)++;
  ks_cli_print_error(stdout, "verify", problem);
  return 0;
}

/* One rank file: its whole-file hash against the index, then every tensor's checksum. */
static size_t verify_rank_file(const char *dir, const ks_shard_index *idx, int r) {
  ks_error err;
  if (ks_shard_verify_file(dir, idx, r, &err)) {
    ks_cli_print_error(stdout, "verify", &err);
    return 1;
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, ks_shard_index_file(idx, r, NULL));
  ks_reader *rd;
  if (ks_reader_open(path, NULL, &rd, &err)) {
    ks_cli_print_error(stdout, "verify", &err);
    return 1;
  }
  size_t problems = 0;
  if (ks_reader_verify_report(rd, count_problem, &problems, &err) && problems == 0) {
    ks_cli_print_error(stdout, "verify", &err);
    problems++;
  }
  ks_reader_free(rd);
  return problems;
}

/* The index (its sharded section tiles every tensor, sizes bound every chunk), the files against
   it (sizes, headers: ks_shard_check), then each good file's hash and tensor checksums. */
int ks_cli_verify_dir(const char *dir) {
  ks_shard_index *idx;
  if (open_index("verify", dir, &idx)) return KS_EXIT_BAD;
  int n = ks_shard_index_world_size(idx);
  dir_problems d = {idx, 0, calloc((size_t)n, 1)};
  ks_error err;
  if (!d.bad) {
    fprintf(stderr, "keepsake verify: out of memory\n");
    ks_shard_index_free(idx);
    return KS_EXIT_BAD;
  }
  ks_status st = ks_shard_check(dir, idx, NULL, KS_SHARD_CHECK_SIZES | KS_SHARD_CHECK_HEADERS, on_problem, &d, &err);
  if (st && d.n == 0) ks_cli_print_error(stdout, "verify", &err), d.n++; /* e.g. out of memory */
  size_t problems = d.n;
  for (int r = 0; r < n; r++)
    if (!d.bad[r]) problems += verify_rank_file(dir, idx, r);
  free(d.bad);
  if (problems)
    printf("%s: BAD (%zu problem%s)\n", ks_cli_esc(dir), problems, problems == 1 ? "" : "s");
  else
    printf("%s: OK (sharded checkpoint, %d rank file%s, epoch %lld batch %lld, index, files and checksums match)\n",
           ks_cli_esc(dir), n, n == 1 ? "" : "s", (long long)ks_shard_index_epoch(idx),
           (long long)ks_shard_index_batch(idx));
  ks_shard_index_free(idx);
  return problems ? KS_EXIT_BAD : KS_EXIT_OK;
}

static void print_dims(const char *label, int rank, const int64_t *v) {
  printf("%s[", label);
  for (int d = 0; d < rank; d++) printf(d ? ", %" PRId64 : "%" PRId64, v[d]);
  printf("]");
}

int ks_cli_inspect_dir(const char *dir) {
  ks_shard_index *idx;
  if (open_index("inspect", dir, &idx)) return KS_EXIT_BAD;
  int n = ks_shard_index_world_size(idx);
  printf("checkpoint: %s\nformat:     keepsake sharded, %d rank%s\ntimestamp:  epoch %lld batch %lld\n\n", dir, n,
         n == 1 ? "" : "s", (long long)ks_shard_index_epoch(idx), (long long)ks_shard_index_batch(idx));
  printf("files (%d)\n", n);
  for (int r = 0; r < n; r++) {
    ks_shard_file_info info;
    const char *f = ks_shard_index_file(idx, r, &info);
    printf("  rank %-5d %-32s %12" PRIu64 " bytes  %s %016" PRIx64 "\n", r, f, info.size,
           ks_shard_index_version(idx) >= 2 ? "header xxh3" : "xxh3", info.checksum);
  }
  size_t np;
  const char *const *pr = ks_shard_index_per_rank(idx, &np);
  printf("\nper-rank entries (saved by every rank):");
  for (size_t i = 0; i < np; i++) printf(" %s", pr[i]);
  printf("\n\nsharded tensors (%zu)\n", ks_shard_index_sharded_count(idx));
  for (size_t i = 0; i < ks_shard_index_sharded_count(idx); i++) {
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
  for (size_t i = 0; i < ks_shard_index_sharded_count(idx); i++) {
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
  json_object_set_new(one, "index_xxh3_of", json_string(ks_shard_index_version(idx) >= 2 ? "header" : "file"));
  return one;
}

int ks_cli_inspect_dir_json(const char *dir) {
  ks_shard_index *idx;
  ks_error err;
  if (ks_shard_index_read(dir, NULL, &idx, &err)) return ks_cli_print_error(stderr, "inspect", &err), KS_EXIT_BAD;
  if (ks_shard_check(dir, idx, NULL, KS_SHARD_CHECK_SIZES, NULL, NULL, &err)) {
    ks_cli_print_error(stderr, "inspect", &err);
    ks_shard_index_free(idx);
    return KS_EXIT_BAD;
  }
  int n = ks_shard_index_world_size(idx);
  size_t np;
  const char *const *pr = ks_shard_index_per_rank(idx, &np);
  json_t *per_rank = json_array(), *files = json_array();
  for (size_t i = 0; i < np; i++) json_array_append_new(per_rank, json_string(pr[i]));
  int rc = 0;
  for (int r = 0; !rc && r < n; r++) {
    json_t *one = rank_file_json(dir, idx, r);
    rc = one ? json_array_append_new(files, one) : -1;
  }
  int64_t ep = ks_shard_index_epoch(idx), ba = ks_shard_index_batch(idx);
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
