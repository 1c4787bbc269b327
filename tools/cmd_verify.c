/* keepsake verify FILE: full validation and checksums; exit 0 good, 1 bad. */
#include <inttypes.h>
#include <string.h>

#include "cli_common.h"
#include "commands.h"

static void verify_usage(FILE *out) {
  fprintf(out,
          "usage: keepsake verify FILE\n\n"
          "Validates FILE completely: the safetensors structure (header, dtypes, shapes,\n"
          "offsets that tile the data exactly) and, for keepsake files, every tensor's\n"
          "XXH3-64 checksum and the scalar table. Any safetensors file is accepted.\n"
          "Prints each problem with the file, key and byte offset (control characters in\n"
          "names escaped). FILE is read into memory, not mapped: a file truncated by\n"
          "another process meanwhile is reported BAD, never a crash.\n"
          "A directory: a sharded checkpoint (the index against every file, every\n"
          "checksum), a torch.distributed.checkpoint (.metadata read without running it\n"
          "and held against the items, every item read, zip CRC-32s: DCP records no\n"
          "checksums) or a Hugging Face safetensors layout (structure, index, chunks;\n"
          "checksums where keepsake wrote them).\n\n"
          "exit status: 0 the file is good, 1 it is not, 2 bad command line\n");
}

static int print_problem(void *ctx, const ks_error *problem) {
  (*(size_t *)ctx)++;
  ks_cli_print_error(stdout, "verify", problem);
  return 0; /* keep going: report every problem */
}

static int verify_file(const char *file) {
  ks_reader *r;
  ks_error err;
  ks_cli_input in; /* copy mode: a file truncated meanwhile is an error, not SIGBUS */
  const char *path = ks_cli_esc(file); /* printed: names from the file cannot start a line */
  if (ks_cli_input_open("verify", file, &in)) return KS_EXIT_BAD;
  if (ks_reader_open(in.path, &in.ro, &r, &err)) {
    ks_cli_input_error(&in, &err);
    ks_cli_print_error(stdout, "verify", &err);
    printf("%s: BAD\n", path);
    ks_cli_input_close(&in);
    return KS_EXIT_BAD;
  }
  size_t problems = 0;
  ks_status st = ks_reader_verify(r, print_problem, &problems, &err);
  if (st && problems == 0) ks_cli_print_error(stdout, "verify", &err); /* e.g. out of memory */
  if (st)
    printf("%s: BAD (%zu problem%s)\n", path, problems, problems == 1 ? "" : "s");
  else if (ks_reader_is_keepsake(r))
    printf("%s: OK (keepsake format %d, %zu tensors, %" PRIu64 " data bytes, all checksums match)\n", path,
           ks_reader_format_version(r), ks_reader_count(r), ks_reader_file_size(r) - ks_reader_data_offset(r));
  else
    printf("%s: OK (safetensors, %zu tensors, %" PRIu64 " data bytes; no keepsake checksums to check)\n", path,
           ks_reader_count(r), ks_reader_file_size(r) - ks_reader_data_offset(r));
  ks_reader_free(r);
  ks_cli_input_close(&in);
  return st ? KS_EXIT_BAD : KS_EXIT_OK;
}

int ks_cmd_verify(int argc, char **argv) {
  if (ks_cli_wants_help(argc, argv)) return verify_usage(stdout), KS_EXIT_OK;
  if (argc != 2 || (argv[1][0] == '-' && argv[1][1])) {
    if (argc == 2) fprintf(stderr, "keepsake verify: unknown option '%s'\n", argv[1]);
    return verify_usage(stderr), KS_EXIT_USAGE;
  }
  return ks_cli_is_dir(argv[1]) ? ks_cli_verify_dir(argv[1]) : verify_file(argv[1]);
}
