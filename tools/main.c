/* keepsake: inspect, verify, compare and convert training-state checkpoints. */
#include <stdio.h>
#include <string.h>

#include "cli_common.h"
#include "commands.h"
#include "keepsake/version.h"

typedef struct command {
  const char *name;
  int (*fn)(int argc, char **argv);
  const char *summary;
} command;

static const command table[] = {
    {"inspect", ks_cmd_inspect, "show tensors, scalars, metrics and metadata of a file"},
    {"verify", ks_cmd_verify, "validate a file fully, checksums included"},
    {"diff", ks_cmd_diff, "compare two files key by key"},
    {"convert", ks_cmd_convert, "convert between keepsake, torch.save and Composer files"},
    {"eval-vectors", ks_cmd_eval_vectors, "replay metric reference vectors"},
    {"reshard", ks_cmd_reshard, "rewrite a sharded checkpoint directory for another world size"},
};
#define N_COMMANDS (sizeof table / sizeof table[0])

static int usage(FILE *out) {
  fprintf(out, "usage: keepsake <command> [options]\n\ncommands:\n");
  for (size_t i = 0; i < N_COMMANDS; i++) fprintf(out, "  %-13s %s\n", table[i].name, table[i].summary);
  fprintf(out, "\nRun 'keepsake <command> --help' for a command's options.\n"
               "Every command exits 2 when its standard output cannot be written (e.g. a full disk).\n");
  return out == stderr ? 2 : 0;
}

int main(int argc, char **argv) {
  if (argc < 2) return usage(stderr);
  if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help"))
    return ks_cli_finish_output("help", usage(stdout));
  if (!strcmp(argv[1], "--version")) {
    /* The Python distribution's name, as the package index knows it (pyproject.toml): its
       "keepsake" is another project, with a command of the same name. */
    printf("keepsake %s (" KS_DIST_NAME ")\n", ks_version());
    return ks_cli_finish_output("--version", 0);
  }
  for (size_t i = 0; i < N_COMMANDS; i++)
    if (!strcmp(argv[1], table[i].name)) return ks_cli_finish_output(table[i].name, table[i].fn(argc - 1, argv + 1));
  fprintf(stderr, "keepsake: unknown command '%s'\n", ks_cli_esc(argv[1]));
  return usage(stderr);
}
