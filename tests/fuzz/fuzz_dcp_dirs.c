/*
 * libFuzzer target: a checkpoint directory without `.metadata` through
 * ks_torch_dcp_load, served from memory by an I/O table (the file system is
 * never touched): a directory keepsake's DCP writer wrote (an index with a
 * keepsake member and rank files, rank 0 recording keepsake.dcp, whose planner
 * data and typed JSON values are decoded and named) or a Hugging Face layout
 * (an index with a weight_map, or *.safetensors files, whose DCP_SHARDING_INFO
 * chunks are put together). Input: files, each a 1-byte name length, the name,
 * a 4-byte little-endian length and the bytes (at most 8 files; a name with '/'
 * or NUL ends the list). The corpus (corpus/dcp_dirs/, made by
 * tests/fixtures/dcp/make_fuzz_dirs.py) holds the keepsake fixtures and Hugging
 * Face layouts of tests/fixtures/dcp/ in this layout.
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "keepsake/keepsake.h"
#include "keepsake/torch.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define DIR "/dcp-fuzz"
#define MAX_FILES 8

typedef struct mem_file {
  char name[256];
  const uint8_t *p;
  size_t len;
} mem_file;

typedef struct mem_dir {
  mem_file f[MAX_FILES];
  int n;
} mem_dir;

static const mem_file *find(const mem_dir *m, const char *path) {
  size_t d = strlen(DIR);
  if (strncmp(path, DIR "/", d + 1)) return NULL;
  for (int i = 0; i < m->n; i++)
    if (!strcmp(path + d + 1, m->f[i].name)) return &m->f[i];
  return NULL;
}

static int mem_open(void *ctx, const char *path, int *fd, uint64_t *size) {
  const mem_dir *m = ctx;
  const mem_file *f = find(m, path);
  if (!f) return ENOENT;
  *fd = (int)(f - m->f) + 1;
  *size = f->len;
  return 0;
}

static int mem_read(void *ctx, int fd, void *buf, size_t n, uint64_t off, size_t *got) {
  const mem_dir *m = ctx;
  if (fd < 1 || fd > m->n) return EBADF;
  const mem_file *f = &m->f[fd - 1];
  size_t avail = off < f->len ? f->len - (size_t)off : 0;
  *got = n < avail ? n : avail;
  if (*got) memcpy(buf, f->p + off, *got);
  return 0;
}

static int mem_close(void *ctx, int fd) {
  (void)ctx, (void)fd;
  return 0;
}

static int mem_stat(void *ctx, const char *path, ks_io_stat *st) {
  const mem_dir *m = ctx;
  if (!strcmp(path, DIR)) {
    st->kind = KS_IO_DIR;
    st->size = 0;
    return 0;
  }
  const mem_file *f = find(m, path);
  if (!f) return ENOENT;
  st->kind = KS_IO_FILE;
  st->size = f->len;
  return 0;
}

static int mem_list(void *ctx, const char *dir, const char *prefix, ks_io_list_cb cb, void *cb_ctx) {
  const mem_dir *m = ctx;
  if (strcmp(dir, DIR)) return ENOENT;
  for (int i = 0; i < m->n; i++) {
    if (strncmp(m->f[i].name, prefix, strlen(prefix))) continue;
    int rc = cb(cb_ctx, m->f[i].name, KS_IO_FILE);
    if (rc) return rc;
  }
  return 0;
}

static size_t parse(const uint8_t *data, size_t size, mem_dir *m) {
  size_t at = 0;
  m->n = 0;
  while (m->n < MAX_FILES && at < size) {
    size_t nl = data[at++];
    if (!nl || nl > size - at || memchr(data + at, '/', nl) || memchr(data + at, 0, nl)) break;
    mem_file *f = &m->f[m->n];
    memcpy(f->name, data + at, nl);
    f->name[nl] = 0;
    at += nl;
    if (size - at < 4) break;
    size_t l = (size_t)data[at] | (size_t)data[at + 1] << 8 | (size_t)data[at + 2] << 16 | (size_t)data[at + 3] << 24;
    at += 4;
    if (l > size - at) l = size - at;
    f->p = data + at;
    f->len = l;
    at += l;
    m->n++;
  }
  return at;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  mem_dir m;
  parse(data, size, &m);
  ks_io io = *ks_io_posix();
  io.ctx = &m;
  io.open_fn = mem_open;
  io.read_fn = mem_read;
  io.close_fn = mem_close;
  io.stat_fn = mem_stat;
  io.list_fn = mem_list;
  io.map_fn = NULL;
  io.unmap_fn = NULL;
  io.caps &= ~(KS_IO_CAP_MAP | KS_IO_CAP_LOCAL);
  ks_torch_read_opts o = {0};
  o.io = &io;
  o.verify_crc = size % 2; /* exercise both paths */
  o.max_view_bytes = (uint64_t)1 << 26;
  o.max_output_bytes = (uint64_t)1 << 26;
  ks_statedict *sd = NULL;
  char *structure = NULL, *info = NULL;
  ks_error err;
  if (ks_torch_dcp_load(DIR, &o, &sd, &structure, &info, &err) == KS_OK) {
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
