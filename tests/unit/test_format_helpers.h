/* Helpers shared by the format tests: hand-built safetensors bytes and sample state dicts. */
#ifndef KS_TEST_FORMAT_HELPERS_H
#define KS_TEST_FORMAT_HELPERS_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "keepsake/format.h"
#include "keepsake/keepsake.h"
#include "testutil.h"

/* A safetensors file from a header text and data bytes (malloc'd; *len receives its size). */
static inline uint8_t *fmt_build(const char *header, const void *data, size_t dlen, size_t *len) {
  size_t hl = strlen(header);
  uint8_t *b = malloc(8 + hl + dlen + 1);
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
  memcpy(b + 8, header, hl);
  if (dlen) memcpy(b + 8 + hl, data, dlen);
  *len = 8 + hl + dlen;
  return b;
}

/* A read-only ks_io over bytes in memory ("any path" is the bytes), without map: how
   KS_READ_LAZY sees a remote object. */
typedef struct fmt_mem_file {
  const uint8_t *data;
  size_t size;
} fmt_mem_file;

static inline int fmt_mem_open(void *ctx, const char *path, int *fd, uint64_t *size) {
  (void)path;
  *fd = 0;
  *size = ((fmt_mem_file *)ctx)->size;
  return 0;
}

static inline int fmt_mem_read(void *ctx, int fd, void *buf, size_t n, uint64_t off, size_t *got) {
  const fmt_mem_file *m = ctx;
  (void)fd;
  *got = off >= m->size ? 0 : m->size - off < n ? (size_t)(m->size - off) : n;
  if (*got) memcpy(buf, m->data + off, *got);
  return 0;
}

static inline int fmt_mem_close(void *ctx, int fd) {
  (void)ctx;
  (void)fd;
  return 0;
}

static inline ks_io fmt_mem_io(fmt_mem_file *m) {
  ks_io io = *ks_io_posix();
  io.ctx = m;
  io.open_fn = fmt_mem_open;
  io.read_fn = fmt_mem_read;
  io.close_fn = fmt_mem_close;
  io.map_fn = NULL;
  io.unmap_fn = NULL;
  return io;
}

/* Opens bytes with a buffer reader in `mode` (KS_READ_LAZY: lazily, as the file "<buffer>"
   of a table over them); returns the status and fills err. */
static inline ks_status fmt_open_status(const uint8_t *b, size_t len, ks_read_mode mode, ks_error *err) {
  ks_read_opts o = {.mode = mode};
  ks_reader *r = NULL;
  fmt_mem_file m = {b, len};
  ks_io io = fmt_mem_io(&m);
  if (mode == KS_READ_LAZY) o.io = &io;
  ks_status st =
      mode == KS_READ_LAZY ? ks_reader_open("<buffer>", &o, &r, err) : ks_reader_open_buffer(b, len, &o, &r, err);
  ks_reader_free(r);
  return st;
}

/* A small dict: two tensors and a scalar, values depending on `seed`. */
static inline ks_statedict *fmt_small_dict(int seed) {
  ks_statedict *sd;
  if (ks_statedict_create(NULL, &sd, NULL)) return NULL;
  int64_t shape[2] = {2, 3};
  float *w;
  int64_t *step;
  if (ks_statedict_new_tensor(sd, "model/w", KS_F32, 2, shape, (void **)&w, NULL) ||
      ks_statedict_new_tensor(sd, "step", KS_I64, 0, NULL, (void **)&step, NULL) ||
      ks_statedict_set_string(sd, "run", "small", NULL)) {
    ks_statedict_free(sd);
    return NULL;
  }
  for (int i = 0; i < 6; i++) w[i] = (float)(i * seed) + 0.5f;
  *step = seed;
  return sd;
}

#endif
