/*
 * The inputs of `keepsake convert`, read so that corruption is not laundered
 * into a fresh, valid-looking file: by default every keepsake checksum and
 * every zip CRC32 of the input is checked first, and a mismatch stops the
 * conversion. With salvage, the input is converted anyway and each problem is
 * printed to stderr as "keepsake convert: salvaged despite: ..." first.
 * Inputs are read into memory (never mapped), so a file that another process
 * truncates meanwhile gives an error, not SIGBUS.
 */
#ifndef KS_TOOLS_CONVERT_INPUT_H
#define KS_TOOLS_CONVERT_INPUT_H

#include "cli_common.h"
#include "keepsake/keepsake.h"

/* A torch.save / Composer file, through the library's import (ks_torch_import_buffer). */
ks_status ks_convert_read_torch(const ks_cli_input *in, int salvage, ks_statedict **out, ks_meta **meta,
                                ks_error *err);
/* A keepsake or safetensors file (see ks_load); tensors are copies in memory. */
ks_status ks_convert_read_keepsake(const ks_cli_input *in, int salvage, ks_statedict **sd, ks_meta **meta,
                                   ks_error *err);

#endif
