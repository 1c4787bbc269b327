/*
 * `keepsake inspect DIR` and `keepsake verify DIR` for a sharded checkpoint
 * directory (rank files plus model.safetensors.index.json).
 */
#include <inttypes.h>
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
  if (ks_shard_index_read(dir, NULL, idx, &err) == KS_OK) return 0;
  ks_cli_print_error(stdout, cmd, &err);
  printf("%s: BAD (not a complete sharded checkpoint)\n", dir);
  return 1;
}

static int count_problem(void *ctx, const ks_error *problem) {
  (*(size_t *)ctx)++;
  ks_cli_print_error(stdout, "verify", problem);
  return 0;
}

/* Every file against the index (size, whole-file hash), then every tensor's checksum inside it. */
int ks_cli_verify_dir(const char *dir) {
  ks_shard_index *idx;
  if (open_index("verify", dir, &idx)) return KS_EXIT_BAD;
  int n = ks_shard_index_world_size(idx);
  size_t problems = 0;
  for (int r = 0; r < n; r++) {
    ks_error err;
    if (ks_shard_verify_file(dir, idx, r, &err)) {
      ks_cli_print_error(stdout, "verify", &err);
      problems++;
      continue;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, ks_shard_index_file(idx, r, NULL));
    ks_reader *rd;
    if (ks_reader_open(path, NULL, &rd, &err)) {
      ks_cli_print_error(stdout, "verify", &err);
      problems++;
      continue;
    }
    size_t before = problems;
    if (ks_reader_verify_report(rd, count_problem, &problems, &err) && problems == before) {
      ks_cli_print_error(stdout, "verify", &err);
      problems++;
    }
    ks_reader_free(rd);
  }
  if (problems)
    printf("%s: BAD (%zu problem%s)\n", dir, problems, problems == 1 ? "" : "s");
  else
    printf("%s: OK (sharded checkpoint, %d rank file%s, epoch %lld batch %lld, all files and checksums match)\n", dir, n,
           n == 1 ? "" : "s", (long long)ks_shard_index_epoch(idx), (long long)ks_shard_index_batch(idx));
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
    printf("  rank %-5d %-32s %12" PRIu64 " bytes  xxh3 %016" PRIx64 "\n", r, f, info.size, info.checksum);
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
