/*
 * Subcommands of the keepsake CLI. Each takes argv from the subcommand's name
 * on and returns the process exit code. main.c lists them in a plain table, so
 * a missing command is a link error, never a silently absent feature.
 */
#ifndef KS_TOOLS_COMMANDS_H
#define KS_TOOLS_COMMANDS_H

#include "cli_common.h"

int ks_cmd_inspect(int argc, char **argv);
int ks_cmd_verify(int argc, char **argv);
int ks_cmd_diff(int argc, char **argv);
int ks_cmd_eval_vectors(int argc, char **argv);
int ks_cmd_convert(int argc, char **argv);
int ks_cmd_reshard(int argc, char **argv);

/* Sharded checkpoint directories (shard_dir.c), for inspect and verify. */
int ks_cli_is_dir(const char *path);
int ks_cli_inspect_dir(const char *dir);
/* inspect --json DIR: the index, and each rank file as inspect --json FILE shows it. */
int ks_cli_inspect_dir_json(const char *dir);
int ks_cli_verify_dir(const char *dir);

/*
 * Checkpoint directories read through the library's import (dcp_dir.c): torch DCP directories,
 * KeepsakeWriter's, Hugging Face safetensors layouts.
 */
typedef enum ks_cli_dir_kind {
  KS_CLI_DIR_SHARDED,      /* a keepsake sharded checkpoint of the C library (or no checkpoint: its reader says) */
  KS_CLI_DIR_KEEPSAKE_DCP, /* written by keepsake.distributed.KeepsakeWriter: rank 0 records keepsake.dcp */
  KS_CLI_DIR_TORCH_DCP,    /* torch's FileSystemWriter: .metadata */
  KS_CLI_DIR_HF            /* a Hugging Face index (weight_map) or *.safetensors files */
} ks_cli_dir_kind;
ks_cli_dir_kind ks_cli_dir_kind_of(const ks_cli_input *in);
/* The state the directory holds (ks_dcp_import), verified (checksums, CRC-32s) when `verify`. */
KS_NODISCARD ks_status ks_cli_import(const ks_cli_input *in, int verify, ks_statedict **sd, ks_meta **meta,
                                     ks_error *err);
int ks_cli_inspect_import(const ks_cli_input *in, ks_cli_dir_kind kind, int as_json);
int ks_cli_verify_import(const ks_cli_input *in, ks_cli_dir_kind kind);

#endif
