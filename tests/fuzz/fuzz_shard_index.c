/*
 * libFuzzer target: the index of a sharded checkpoint (model.safetensors.index.json, untrusted)
 * through ks_shard_index_read, served from memory by an I/O table (the file system is never
 * touched). The input is the index's text. A parsed index is then walked through every accessor
 * (files, per-rank globs, sharded tensors and each of their chunks), and ks_shard_check's size
 * check runs against rank files that all "exist" with one size taken from the input, so the
 * comparisons of recorded and real sizes are reached too. The corpus (corpus/shard_index/) holds
 * the index tests/hostile/make_sharded.c writes and the malformed variants
 * tests/hostile/shard_index.py derives from it (`shard_index.py fuzz-corpus`).
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "keepsake/keepsake.h"
#include "keepsake/shard.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct mem_index {
  const uint8_t *text;
  size_t len;
  uint64_t file_size; /* what every other file of the directory measures */
} mem_index;

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && !strcmp(s + n - m, suffix);
}

static int mem_open(void *ctx, const char *path, int *fd, uint64_t *size) {
  const mem_index *m = ctx;
  if (!ends_with(path, "/" KS_SHARD_INDEX_NAME)) return ENOENT;
  *fd = 1;
  *size = m->len;
  return 0;
}

static int mem_read(void *ctx, int fd, void *buf, size_t n, uint64_t off, size_t *got) {
  const mem_index *m = ctx;
  (void)fd;
  size_t avail = off < m->len ? m->len - (size_t)off : 0;
  *got = n < avail ? n : avail;
  if (*got) memcpy(buf, m->text + off, *got);
  return 0;
}

static int mem_close(void *ctx, int fd) {
  (void)ctx, (void)fd;
  return 0;
}

static int mem_stat(void *ctx, const char *path, ks_io_stat *st) {
  const mem_index *m = ctx;
  memset(st, 0, sizeof *st);
  if (ends_with(path, "/" KS_SHARD_INDEX_NAME)) {
    st->kind = KS_IO_FILE;
    st->size = m->len;
    return 0;
  }
  if (!ends_with(path, ".keepsake")) return ENOENT;
  st->kind = KS_IO_FILE;
  st->size = m->file_size;
  return 0;
}

static int keep_going(void *ctx, const ks_error *problem) {
  (void)problem;
  return ++*(int *)ctx > 64; /* a few problems, not one per chunk of a huge index */
}

/* Reads every accessor of a parsed index; the sum keeps the reads from being optimised away. */
static uint64_t walk(const ks_shard_index *idx) {
  ks_shard_index_info ix = {.size = sizeof ix};
  ks_shard_index_get(idx, &ix);
  uint64_t sum = (uint64_t)ix.world_size + (uint64_t)ix.version + (uint64_t)ix.epoch + (uint64_t)ix.batch;
  for (int r = 0; r < ix.world_size; r++) {
    ks_shard_file_info info;
    const char *f = ks_shard_index_file(idx, r, &info);
    sum += f ? strlen(f) + info.size : 0;
  }
  for (size_t i = 0; i < ix.n_per_rank; i++) sum += strlen(ix.per_rank[i]);
  for (size_t i = 0; i < ix.n_sharded; i++) {
    ks_shard_chunk whole, chunk;
    ks_dtype dt;
    size_t chunks = 0;
    if (ks_shard_index_sharded_at(idx, i, &whole, &dt, &chunks) != KS_OK) continue;
    sum += strlen(whole.name) + (uint64_t)dt;
    for (size_t j = 0; j < chunks; j++) {
      int file = -1;
      if (ks_shard_index_chunk(idx, i, j, &chunk, &file) != KS_OK) continue;
      for (int d = 0; d < chunk.rank; d++) sum += (uint64_t)(chunk.offsets[d] + chunk.shape[d]);
      sum += (uint64_t)file;
    }
  }
  return sum;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  mem_index m = {data, size, 0};
  for (size_t i = 0; i < size && i < 8; i++) m.file_size = m.file_size << 8 | data[size - 1 - i];
  m.file_size %= (uint64_t)1 << 20;
  ks_io io = *ks_io_posix();
  io.ctx = &m;
  io.open_fn = mem_open;
  io.read_fn = mem_read;
  io.close_fn = mem_close;
  io.stat_fn = mem_stat;
  io.map_fn = NULL;
  io.unmap_fn = NULL;
  ks_shard_index *idx = NULL;
  ks_error err;
  if (ks_shard_index_read("/shard-fuzz", NULL, &io, &idx, &err) == KS_OK) {
    volatile uint64_t sum = walk(idx);
    (void)sum;
    int problems = 0;
    if (ks_shard_check("/shard-fuzz", idx, &io, KS_SHARD_CHECK_SIZES, keep_going, &problems, &err)) {
      /* Fuzzing: a size that differs is an expected outcome; only crashes and leaks matter. */
    }
  }
  ks_shard_index_free(idx);
  return 0;
}
