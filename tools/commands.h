/*
 * Subcommands of the keepsake CLI. Each takes argv from the subcommand's name
 * on and returns the process exit code. main.c lists them in a plain table, so
 * a missing command is a link error, never a silently absent feature.
 */
#ifndef KS_TOOLS_COMMANDS_H
#define KS_TOOLS_COMMANDS_H

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

#endif
