/*
 * Fuzz target for the safetensors/keepsake reader: opens the input from a
 * buffer in both modes, walks every tensor (touching every data byte), looks
 * each up by name, verifies checksums and decodes scalars. Any input must be
 * either rejected with a status or read without a crash.
 */
#include <stddef.h>
#include <stdint.h>

#include "keepsake/format.h"
#include "keepsake/keepsake.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int ignore_problem(void *ctx, const ks_error *e) {
  (void)e;
  (*(int *)ctx)++;
  return 0;
}

static uint8_t walk(const ks_reader *r) {
  uint8_t acc = 0;
  for (size_t i = 0; i < ks_reader_count(r); i++) {
    const char *name;
    ks_tensor v, w;
    if (ks_reader_tensor_at(r, i, &name, &v)) __builtin_trap();
    const uint8_t *p = v.data;
    for (size_t k = 0; k < v.nbytes; k++) acc ^= p[k];
    if (ks_reader_tensor(r, name, &w, NULL) || w.data != v.data) __builtin_trap();
  }
  return acc;
}

static void exercise(const uint8_t *data, size_t size, ks_read_mode mode) {
  ks_read_opts opts = {.alloc = NULL, .mode = mode, .verify_checksums = 0};
  ks_reader *r;
  ks_error err;
  if (ks_reader_open_buffer(data, size, &opts, &r, &err) != KS_OK) return;
  volatile uint8_t sink = walk(r);
  (void)sink;
  int problems = 0;
  /* Fuzzing: failing is an expected outcome of these calls; only crashes and leaks matter. */
  ks_status ignored = ks_reader_verify_report(r, ignore_problem, &problems, NULL);
  ks_statedict *sd;
  if (ks_statedict_create(NULL, &sd, NULL) == KS_OK) {
    ignored = ks_reader_scalars(r, sd, NULL);
    ks_statedict_free(sd);
  }
  (void)ignored;
  ks_reader_free(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  exercise(data, size, KS_READ_MMAP);
  exercise(data, size, KS_READ_COPY);
  ks_read_opts opts = {.alloc = NULL, .mode = KS_READ_MMAP, .verify_checksums = 1};
  ks_statedict *sd = NULL;
  ks_meta *meta = NULL;
  if (ks_load_buffer(data, size, &opts, &sd, &meta, NULL) == KS_OK) {
    ks_statedict_free(sd);
    ks_meta_free(meta);
  }
  return 0;
}
