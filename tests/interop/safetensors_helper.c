/*
 * Test helper for the safetensors differential suite: writes keepsake files
 * with known contents through the library, and reports what the library reads
 * from any file, one JSON object per line, so the Python side can compare it
 * with the reference safetensors implementation.
 *
 *   safetensors_helper write-dtypes OUT [DTYPE...]
 *        every dtype (or only those named) in shapes (), (0,), (7,), (3,5), (2,0,4), (2,3,4),
 *        named "<DTYPE>/s<shape index>", plus three scalars and two caller metadata pairs
 *   safetensors_helper write-many OUT N      N tensors, dtypes and shapes cycling
 *   safetensors_helper read FILE...          ks_load each file; print status, tensors, metadata
 *
 * Tensor bytes come from splitmix64 (BOOL bytes masked to 0/1), seeded with
 * dtype * 6 + shape index + 1 (write-dtypes) or the tensor's position + 1
 * (write-many), so the reader of the file can recompute them independently.
 * Exit status: 0 done (read reports per-file status in its output), 1 an error, 2 usage.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "keepsake/format.h"
#include "keepsake/keepsake.h"

static uint64_t splitmix_next(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Fills n bytes with the little-endian splitmix64 stream of `seed`. */
static void fill(uint8_t *p, size_t n, uint64_t seed, ks_dtype dt) {
  uint64_t s = seed, w = 0;
  for (size_t i = 0; i < n; i++) {
    if (i % 8 == 0) w = splitmix_next(&s);
    p[i] = (uint8_t)(w >> (8 * (i % 8)));
    if (dt == KS_BOOL) p[i] &= 1;
  }
}

static int add(ks_statedict *sd, const char *name, ks_dtype dt, int rank, const int64_t *shape, uint64_t seed) {
  void *data = NULL;
  ks_status st = ks_statedict_new_tensor(sd, name, dt, rank, shape, &data, NULL);
  if (st) {
    fprintf(stderr, "helper: cannot add %s: %s\n", name, ks_strerror(st));
    return 1;
  }
  size_t nbytes = 0;
  if (ks_shape_size(dt, rank, shape, NULL, &nbytes) == KS_OK && nbytes) fill(data, nbytes, seed, dt);
  return 0;
}

static int save(const char *path, ks_statedict *sd, const ks_meta *extra) {
  ks_error err;
  ks_status st = ks_save(path, sd, extra, NULL, &err);
  if (st) fprintf(stderr, "helper: saving %s: %s\n", path, err.message);
  return st != KS_OK;
}

static const struct {
  int rank;
  int64_t shape[3];
} SHAPES[] = {{0, {0}}, {1, {0}}, {1, {7}}, {2, {3, 5}}, {3, {2, 0, 4}}, {3, {2, 3, 4}}};
#define NSHAPES (sizeof SHAPES / sizeof SHAPES[0])

/* True when dtype d is to be written: no names given, or d among them. */
static int wanted(ks_dtype d, int n, char **names) {
  for (int i = 0; i < n; i++)
    if (!strcmp(names[i], ks_dtype_name(d))) return 1;
  return n == 0;
}

static int write_dtypes(const char *path, int nnames, char **names) {
  ks_statedict *sd;
  ks_meta *extra;
  if (ks_statedict_create(NULL, &sd, NULL)) return 1;
  if (ks_meta_create(NULL, &extra, NULL)) return ks_statedict_free(sd), 1;
  int rc = 0;
  char name[64];
  for (int d = 0; d < KS_DTYPE_COUNT && !rc; d++)
    for (size_t k = 0; k < NSHAPES && !rc && wanted((ks_dtype)d, nnames, names); k++) {
      snprintf(name, sizeof name, "%s/s%zu", ks_dtype_name((ks_dtype)d), k);
      rc = add(sd, name, (ks_dtype)d, SHAPES[k].rank, SHAPES[k].shape, (uint64_t)d * NSHAPES + k + 1);
    }
  /* Scalars live in the metadata; caller pairs are kept as is. */
  if (!rc) rc = ks_statedict_set_int(sd, "step", -9223372036854775807 - 1, NULL) != KS_OK;
  if (!rc) rc = ks_statedict_set_float(sd, "lr", 0.1, NULL) != KS_OK;
  if (!rc) rc = ks_statedict_set_string(sd, "run", "caf\xc3\xa9 \"quoted\"\n", NULL) != KS_OK;
  if (!rc) rc = ks_meta_set(extra, "note", "h\xc3\xa9llo, \xf0\x9f\x98\x80 {\"json\": [1]}", NULL) != KS_OK;
  if (!rc) rc = ks_meta_set(extra, "empty", "", NULL) != KS_OK;
  if (!rc) rc = save(path, sd, extra);
  ks_meta_free(extra);
  ks_statedict_free(sd);
  return rc;
}

static int write_many(const char *path, long n) {
  ks_statedict *sd;
  if (ks_statedict_create(NULL, &sd, NULL)) return 1;
  int rc = 0;
  char name[64];
  for (long i = 0; i < n && !rc; i++) {
    int64_t shape[2] = {i % 3, 1 + i % 2};
    snprintf(name, sizeof name, "layers.%ld/w", i);
    rc = add(sd, name, (ks_dtype)(i % KS_DTYPE_COUNT), (int)(i % 3), shape, (uint64_t)i + 1);
  }
  if (!rc) rc = save(path, sd, NULL);
  ks_statedict_free(sd);
  return rc;
}

/* Prints s as a JSON string: names and values are UTF-8 already; escape what JSON requires. */
static void put_json_str(const char *s) {
  putchar('"');
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\')
      printf("\\%c", *p);
    else if (*p < 0x20)
      printf("\\u%04x", *p);
    else
      putchar(*p);
  }
  putchar('"');
}

static void put_tensor(const ks_entry *e) {
  const ks_tensor *t = &e->tensor;
  printf("{\"name\":");
  put_json_str(e->name);
  printf(",\"dtype\":\"%s\",\"shape\":[", ks_dtype_name(t->dtype));
  for (int i = 0; i < t->rank; i++) printf("%s%lld", i ? "," : "", (long long)t->shape[i]);
  printf("],\"hex\":\"");
  const uint8_t *p = t->data;
  for (size_t i = 0; i < t->nbytes; i++) printf("%02x", p[i]);
  printf("\"}");
}

static void put_loaded(const ks_statedict *sd, const ks_meta *meta) {
  printf(",\"tensors\":[");
  int first = 1;
  for (size_t i = 0; i < ks_statedict_count(sd); i++) {
    ks_entry e;
    if (ks_statedict_at(sd, i, &e)) continue; /* index in range: cannot fail */
    if (e.kind != KS_VAL_TENSOR) continue;
    printf("%s", first ? "" : ",");
    first = 0;
    put_tensor(&e);
  }
  printf("],\"metadata\":[");
  for (size_t i = 0; i < ks_meta_count(meta); i++) {
    const char *k, *v;
    if (ks_meta_at(meta, i, &k, &v)) continue; /* index in range: cannot fail */
    printf("%s[", i ? "," : "");
    put_json_str(k);
    putchar(',');
    put_json_str(v);
    putchar(']');
  }
  putchar(']');
}

static void read_one(const char *path) {
  ks_statedict *sd = NULL;
  ks_meta *meta = NULL;
  ks_error err;
  ks_error_clear(&err);
  ks_status st = ks_load(path, NULL, &sd, &meta, &err);
  printf("{\"file\":");
  put_json_str(path);
  printf(",\"status\":\"%s\",\"message\":", ks_status_name(st));
  put_json_str(st ? err.message : "");
  if (!st) put_loaded(sd, meta);
  printf("}\n");
  ks_statedict_free(sd);
  ks_meta_free(meta);
}

int main(int argc, char **argv) {
  if (argc >= 3 && !strcmp(argv[1], "write-dtypes")) return write_dtypes(argv[2], argc - 3, argv + 3);
  if (argc >= 4 && !strcmp(argv[1], "write-many")) return write_many(argv[2], atol(argv[3]));
  if (argc >= 2 && !strcmp(argv[1], "read")) {
    for (int i = 2; i < argc; i++) read_one(argv[i]);
    return fflush(stdout) != 0;
  }
  fprintf(stderr, "usage: safetensors_helper write-dtypes OUT [DTYPE...] | write-many OUT N | read FILE...\n");
  return 2;
}
