/* keepsake: inspect, verify, compare and convert training-state checkpoints. */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "keepsake/version.h"

typedef struct command {
  const char *name;
  int (*fn)(int argc, char **argv);
  const char *summary;
} command;

static const command *commands(size_t *n) {
  static const command table[] = {
      {"inspect", ks_cmd_inspect, "show tensors, scalars, metrics and metadata of a file"},
      {"verify", ks_cmd_verify, "validate a file fully, checksums included"},
      {"diff", ks_cmd_diff, "compare two files key by key"},
      {"convert", ks_cmd_convert, "convert between keepsake, torch.save and Composer files"},
      {"eval-vectors", ks_cmd_eval_vectors, "replay metric reference vectors"},
  };
  *n = sizeof table / sizeof table[0];
  return table;
}

static int usage(FILE *out) {
  size_t n;
  const command *cmds = commands(&n);
  fprintf(out, "usage: keepsake <command> [options]\n\ncommands:\n");
  for (size_t i = 0; i < n; i++)
    if (cmds[i].fn) fprintf(out, "  %-13s %s\n", cmds[i].name, cmds[i].summary);
  fprintf(out, "\nRun 'keepsake <command> --help' for a command's options.\n");
  return out == stderr ? 2 : 0;
}

int main(int argc, char **argv) {
  if (argc < 2) return usage(stderr);
  if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help"))
    return usage(stdout);
  if (!strcmp(argv[1], "--version")) {
    printf("keepsake %s\n", ks_version());
    return 0;
  }
  size_t n;
  const command *cmds = commands(&n);
  for (size_t i = 0; i < n; i++) {
    if (strcmp(argv[1], cmds[i].name) != 0) continue;
    if (!cmds[i].fn) {
      fprintf(stderr, "keepsake: '%s' is not part of this build\n", argv[1]);
      return 2;
    }
    return cmds[i].fn(argc - 1, argv + 1);
  }
  fprintf(stderr, "keepsake: unknown command '%s'\n", argv[1]);
  return usage(stderr);
}
