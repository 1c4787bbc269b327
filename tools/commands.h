/* Subcommands of the keepsake CLI. Each returns the process exit code. */
#ifndef KS_TOOLS_COMMANDS_H
#define KS_TOOLS_COMMANDS_H

/* Declared weak so a build without a subcommand's module still links and says so. */
#define KS__CMD(fn) int fn(int argc, char **argv) __attribute__((weak))
KS__CMD(ks_cmd_inspect);
KS__CMD(ks_cmd_verify);
KS__CMD(ks_cmd_diff);
KS__CMD(ks_cmd_eval_vectors);
KS__CMD(ks_cmd_convert);
#undef KS__CMD

#endif
