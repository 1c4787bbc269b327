/*
 * libFuzzer target: the metadata a .pt export reads to find metric list states
 * (keepsake.metrics, then after a NUL byte a structure document), both
 * untrusted, over a fixed set of metric
 * entries; the metrics it builds stay within a small byte budget, and whatever
 * it returns must be a state dict and structure the .pt writer accepts or
 * refuses cleanly.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "convert/convert_internal.h"
#include "keepsake/keepsake.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static ks_statedict *entries(void) {
  static const char *const names[] = {"m/CatMetric/state_dict/value", "m/A/state_dict/preds", "m/A/state_dict/target",
                                      "m/A/state_dict/confmat", "m/A/_computed"};
  ks_statedict *sd = NULL;
  if (ks_statedict_create(NULL, &sd, NULL)) return NULL;
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
    int64_t shape[2] = {(int64_t)i % 3, 2};
    void *p = NULL;
    if (ks_statedict_new_tensor(sd, names[i], KS_F32, 1 + (int)(i % 2), shape, &p, NULL)) break;
  }
  return sd;
}

/* Part k (0-based) of the NUL-separated input, as a string; NULL when there is none. */
static char *part(const uint8_t *data, size_t size, int k) {
  size_t b = 0;
  for (int i = 0; i < k; i++) {
    const uint8_t *z = b < size ? memchr(data + b, 0, size - b) : NULL;
    if (!z) return NULL;
    b = (size_t)(z - data) + 1;
  }
  const uint8_t *z = b < size ? memchr(data + b, 0, size - b) : NULL;
  size_t n = (z ? (size_t)(z - data) : size) - b;
  char *s = malloc(n + 1);
  if (s) memcpy(s, data + b, n), s[n] = 0;
  return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ks_statedict *sd = entries();
  ks_meta *meta = NULL;
  if (!sd || ks_meta_create(NULL, &meta, NULL)) goto done;
  static const char *const keys[] = {KS_META_METRICS, KS_TORCH_STRUCTURE_META};
  for (int k = 0; k < 2; k++) {
    char *s = part(data, size, k);
    ks_status ms = s && *s ? ks_meta_set(meta, keys[k], s, NULL) : KS_OK;
    (void)ms; /* a key that cannot be set (bad UTF-8) is simply absent */
    free(s);
  }
  uint64_t budget = (uint64_t)1 << 24;
  ks_statedict *out = NULL;
  char *structure = NULL;
  size_t n = 0;
  if (ks__convert_pt_lists(NULL, sd, meta, &budget, &out, &structure, &n, NULL) == KS_OK) {
    ks_torch_write_opts wo = {0};
    wo.structure = structure ? structure : ks_meta_get(meta, KS_TORCH_STRUCTURE_META);
    void *buf = NULL;
    size_t len = 0;
    if (ks_torch_save_buffer(out ? out : sd, &wo, &buf, &len, NULL) == KS_OK) ks_torch_free(NULL, buf);
  }
  ks_statedict_free(out);
  ks__free(NULL, structure);
done:
  ks_meta_free(meta);
  ks_statedict_free(sd);
  return 0;
}
