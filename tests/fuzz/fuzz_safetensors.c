/*
 * Fuzz target for the safetensors/keepsake reader: opens the input from a
 * buffer in both modes, walks every tensor (touching every data byte), looks
 * each up by name, verifies checksums and decodes scalars; then opens it in
 * lazy mode through a table over the bytes that cannot map (the shape of a
 * remote store), which must give the same status as a copy, and fetches and
 * loads through it. Any input must be either rejected with a status or read
 * without a crash.
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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
  ks_status ignored = ks_reader_verify(r, ignore_problem, &problems, NULL);
  ks_statedict *sd;
  if (ks_statedict_create(NULL, &sd, NULL) == KS_OK) {
    ignored = ks_reader_scalars(r, sd, NULL);
    ks_statedict_free(sd);
  }
  (void)ignored;
  ks_reader_free(r);
}

/* A read-only table over the input bytes: one "file", no map. */
typedef struct mem_file {
  const uint8_t *data;
  size_t size;
} mem_file;

static int mem_open(void *ctx, const char *path, int *fd, uint64_t *size) {
  (void)path;
  *fd = 3;
  *size = ((mem_file *)ctx)->size;
  return 0;
}

static int mem_read(void *ctx, int fd, void *buf, size_t n, uint64_t off, size_t *got) {
  const mem_file *m = ctx;
  (void)fd;
  *got = off >= m->size ? 0 : m->size - off < n ? (size_t)(m->size - off) : n;
  if (*got) memcpy(buf, m->data + off, *got);
  return 0;
}

static int mem_close(void *ctx, int fd) {
  (void)ctx;
  (void)fd;
  return 0;
}

static void exercise_lazy(const uint8_t *data, size_t size) {
  mem_file m = {data, size};
  ks_io io = *ks_io_posix();
  io.ctx = &m;
  io.open_fn = mem_open;
  io.read_fn = mem_read;
  io.close_fn = mem_close;
  io.map_fn = NULL;
  io.unmap_fn = NULL;
  ks_read_opts copy = {.mode = KS_READ_COPY}, lazy = {.mode = KS_READ_LAZY, .io = &io};
  ks_reader *r = NULL, *c = NULL;
  ks_status sc = ks_reader_open_buffer(data, size, &copy, &c, NULL);
  ks_status sl = ks_reader_open("<fuzz>", &lazy, &r, NULL);
  ks_reader_free(c);
  if (sc != sl) __builtin_trap(); /* lazy validates exactly as the other modes */
  if (sl) return;
  for (size_t i = 0; i < ks_reader_count(r); i++) {
    ks_tensor_info info;
    ks_tensor v;
    if (ks_reader_tensor_info(r, i, &info)) __builtin_trap();
    size_t n = (size_t)(info.end - info.begin);
    void *buf = malloc(n ? n : 1);
    ks_status fetched = buf ? ks_reader_fetch(r, i, buf, n, NULL) : KS_E_NOMEM; /* failing is expected */
    (void)fetched;
    free(buf);
    if (ks_reader_tensor_at(r, i, NULL, &v) == KS_OK && v.nbytes != n) __builtin_trap();
  }
  int problems = 0;
  ks_status ignored = ks_reader_verify(r, ignore_problem, &problems, NULL); /* failing is expected */
  (void)ignored;
  ks_reader_free(r);
  ks_statedict *sd = NULL;
  if (ks_load("<fuzz>", &lazy, &sd, NULL, NULL) == KS_OK) ks_statedict_free(sd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  exercise(data, size, KS_READ_MMAP);
  exercise(data, size, KS_READ_COPY);
  exercise_lazy(data, size);
  ks_read_opts opts = {.alloc = NULL, .mode = KS_READ_MMAP, .verify_checksums = 1};
  ks_statedict *sd = NULL;
  ks_meta *meta = NULL;
  if (ks_load_buffer(data, size, &opts, &sd, &meta, NULL) == KS_OK) {
    ks_statedict_free(sd);
    ks_meta_free(meta);
  }
  return 0;
}
