/* keepsake reshard DIR --world-size M OUT: rewrite a sharded checkpoint for M ranks, without MPI. */
#include <stdlib.h>
#include <string.h>

#include "cli_common.h"
#include "commands.h"

static void reshard_usage(FILE *out) {
  fprintf(out,
          "usage: keepsake reshard DIR --world-size M OUT\n\n"
          "Rewrites the sharded checkpoint directory DIR (rank files plus\n"
          "" KS_SHARD_INDEX_NAME ", written by N ranks) as a checkpoint for M ranks in\n"
          "OUT, as M ranks loading DIR would see it: sharded tensors split evenly along\n"
          "their first dimension, replicated entries kept once, and the local metric\n"
          "states of the N ranks merged by their reduction rules into the M ranks (at\n"
          "M = N each rank keeps its own). Every file of DIR is verified first; OUT gets\n"
          "its index last. Needs no MPI.\n\n"
          "exit status: 0 done, 1 DIR is not a good checkpoint or OUT cannot be written,\n"
          "2 bad command line\n");
}

static int parse_world(const char *s, int *out) {
  char *end;
  long v = strtol(s, &end, 10);
  if (!*s || *end || v < 1 || v > KS_SHARD_MAX_WORLD) return 0;
  *out = (int)v;
  return 1;
}

int ks_cmd_reshard(int argc, char **argv) {
  if (ks_cli_wants_help(argc, argv)) return reshard_usage(stdout), KS_EXIT_OK;
  const char *pos[2] = {NULL, NULL};
  int n_pos = 0, world = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--world-size") && i + 1 < argc) {
      if (!parse_world(argv[++i], &world)) {
        fprintf(stderr, "keepsake reshard: --world-size needs an integer from 1 to %d\n", KS_SHARD_MAX_WORLD);
        return KS_EXIT_USAGE;
      }
    } else if (!strncmp(a, "--world-size=", 13)) {
      if (!parse_world(a + 13, &world)) {
        fprintf(stderr, "keepsake reshard: --world-size needs an integer from 1 to %d\n", KS_SHARD_MAX_WORLD);
        return KS_EXIT_USAGE;
      }
    } else if (a[0] == '-' && a[1]) {
      fprintf(stderr, "keepsake reshard: unknown option '%s'\n", a);
      return reshard_usage(stderr), KS_EXIT_USAGE;
    } else if (n_pos < 2)
      pos[n_pos++] = a;
    else
      return reshard_usage(stderr), KS_EXIT_USAGE;
  }
  if (n_pos != 2 || world == 0) return reshard_usage(stderr), KS_EXIT_USAGE;
  ks_error err;
  ks_shard_index *idx = NULL;
  ks_io local; /* DIR's files are read, never mapped: one truncated meanwhile is an error, not SIGBUS */
  ks_save_opts so = {.size = sizeof so, .io = ks_cli_read_io(&local)};
  ks_status st = ks_shard_index_read(pos[0], NULL, so.io, &idx, &err);
  ks_shard_index_info info = ks_cli_shard_info(idx); /* none read: world size 0, epoch and batch -1 */
  int from = info.world_size;
  long long ep = (long long)info.epoch, ba = (long long)info.batch;
  ks_shard_index_free(idx);
  if (!st) st = ks_shard_reshard(pos[0], world, pos[1], &so, &err);
  if (st) {
    ks_cli_print_error(stderr, "reshard", &err);
    return KS_EXIT_BAD;
  }
  printf("%s: %d rank%s (epoch %lld, batch %lld) -> %s: %d rank%s\n", pos[0], from, from == 1 ? "" : "s", ep, ba,
         pos[1], world, world == 1 ? "" : "s");
  return KS_EXIT_OK;
}
