/* libFuzzer target: a whole torch.save archive through the zip reader, pickle machine and flattening. */
#include <stddef.h>
#include <stdint.h>

#include "import/import_internal.h"
#include "keepsake/keepsake.h"
#include "testutil.h"
#include "keepsake/torch.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ks_torch_read_opts o = {0};
  o.verify_crc = size % 2; /* exercise both paths */
  o.max_view_bytes = (uint64_t)1 << 26;
  ks_statedict *sd = NULL;
  ks_error err;
  if (ks_test_torch_load_buffer(data, size, &o, &sd, NULL, &err) == KS_OK) {
    ks_entry e;
    uint64_t sum = 0;
    for (size_t i = 0; ks_statedict_at(sd, i, &e) == KS_OK; i++) /* touch every byte we return */
      for (size_t k = 0; e.kind == KS_VAL_TENSOR && k < e.tensor.nbytes; k++)
        sum += ((const uint8_t *)e.tensor.data)[k];
    (void)sum;
    ks_statedict *norm = NULL;
    char *json = NULL;
    if (ks__composer_normalize(sd, KS_BORROW, NULL, &norm, &json, NULL) == KS_OK) ks_torch_free(NULL, json);
    ks_statedict_free(norm);
  }
  ks_statedict_free(sd);
  return 0;
}
