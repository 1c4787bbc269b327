/*
 * libFuzzer target: a torch.distributed.checkpoint directory through
 * ks_torch_dcp_load, served from memory by an I/O table (the file system is
 * never touched). Input: a 4-byte little-endian length L, then L bytes of
 * `.metadata`, then the bytes every `*.distcp` file of the directory holds.
 * The metadata pickle (globals allow-list, dataclasses, chunks, storage items,
 * planner paths), the item checks, the chunk tiling and the item archives are
 * all reached. The corpus (corpus/dcp_metadata/) holds the fixtures of
 * tests/fixtures/dcp/ in this layout.
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "keepsake/keepsake.h"
#include "keepsake/torch.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct mem_dir {
  const uint8_t *meta, *distcp;
  size_t meta_len, distcp_len;
} mem_dir;

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && !strcmp(s + n - m, suffix);
}

static int mem_open(void *ctx, const char *path, int *fd, uint64_t *size) {
  const mem_dir *m = ctx;
  if (ends_with(path, "/.metadata")) *fd = 1, *size = m->meta_len;
  else if (ends_with(path, ".distcp")) *fd = 2, *size = m->distcp_len;
  else return ENOENT;
  return 0;
}

static int mem_read(void *ctx, int fd, void *buf, size_t n, uint64_t off, size_t *got) {
  const mem_dir *m = ctx;
  const uint8_t *p = fd == 1 ? m->meta : m->distcp;
  size_t len = fd == 1 ? m->meta_len : m->distcp_len, avail = off < len ? len - (size_t)off : 0;
  *got = n < avail ? n : avail;
  if (*got) memcpy(buf, p + off, *got);
  return 0;
}

static int mem_close(void *ctx, int fd) {
  (void)ctx, (void)fd;
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 4) return 0;
  size_t l = (size_t)data[0] | (size_t)data[1] << 8 | (size_t)data[2] << 16 | (size_t)data[3] << 24;
  if (l > size - 4) l = size - 4;
  mem_dir m = {data + 4, data + 4 + l, l, size - 4 - l};
  ks_io io = *ks_io_posix();
  io.ctx = &m;
  io.open_fn = mem_open;
  io.read_fn = mem_read;
  io.close_fn = mem_close;
  io.map_fn = NULL;
  io.unmap_fn = NULL;
  ks_torch_read_opts o = {0};
  o.io = &io;
  o.verify_crc = size % 2; /* exercise both paths */
  o.max_view_bytes = (uint64_t)1 << 26;
  o.max_output_bytes = (uint64_t)1 << 26;
  ks_statedict *sd = NULL;
  char *structure = NULL, *info = NULL;
  ks_error err;
  if (ks_torch_dcp_load("/dcp-fuzz", &o, &sd, &structure, &info, &err) == KS_OK) {
    ks_entry e;
    uint64_t sum = 0;
    for (size_t i = 0; ks_statedict_at(sd, i, &e) == KS_OK; i++) /* touch every byte we return */
      for (size_t k = 0; e.kind == KS_VAL_TENSOR && k < e.tensor.nbytes; k++)
        sum += ((const uint8_t *)e.tensor.data)[k];
    (void)sum;
  }
  ks_torch_free(NULL, structure);
  ks_torch_free(NULL, info);
  ks_statedict_free(sd);
  return 0;
}
