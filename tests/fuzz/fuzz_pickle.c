/* libFuzzer target: raw pickle programs (or templates, see expand.h) through the safe pickle
 * machine and flattening. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "expand.h"
#include "keepsake/keepsake.h"
#include "torch/torch_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Every storage key resolves to the same 4 KiB of bytes, so tensor rebuilds run their checks. */
static ks_status storage(void *ctx, const char *key, const uint8_t **out, size_t *len, ks_error *err) {
  (void)key, (void)err;
  *out = ctx;
  *len = 4096;
  return KS_OK;
}

static void run(const uint8_t *data, size_t size) {
  static const uint8_t zeros[4096];
  ks__pk_arena ar;
  ks__pk_limits lim;
  ks_torch_read_opts o = {0};
  o.max_view_bytes = (uint64_t)1 << 24;
  ks__pk_arena_init(&ar, NULL);
  ks__pk_limits_from_opts(&o, size, &lim);
  lim.max_entries = size * 8 + 4096;
  ks__pk_node *root = NULL;
  ks_error err;
  if (ks__pk_run(data, size, &ar, &lim, storage, (void *)(uintptr_t)zeros, &root, &err) == KS_OK) {
    ks_statedict *sd;
    if (ks_statedict_create(NULL, &sd, NULL) == KS_OK) {
      if (ks__pk_flatten(root, &ar, &lim, sd, &err)) {
        /* Fuzzing: refusing the input is an expected outcome; only crashes and leaks matter. */
      }
      ks_statedict_free(sd);
    }
  }
  ks__pk_arena_release(&ar);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const uint8_t *prog;
  size_t len;
  int owned;
  if (ks_fuzz_expand(data, size, &prog, &len, &owned)) return 0;
  run(prog, len);
  if (owned) free((void *)(uintptr_t)prog);
  return 0;
}
