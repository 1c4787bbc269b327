/*
 * Zip writer for torch.save-compatible archives: stored entries whose data
 * starts on a 64-byte boundary (padded with an 'FB' extra field, as torch does),
 * zip64 records whenever a size, an offset or the entry count needs them.
 */
#include "torch/torch_internal.h"

#define ALIGN 64u
#define U32_MAX_FIELD 0xFFFFFFFFu

typedef struct zw_entry {
  char *name;
  uint64_t size, lho;
  uint32_t crc;
} zw_entry;

struct ks__zw {
  ks_allocator alloc;
  ks__zw_write_fn write;
  void *ctx;
  int force64;
  uint64_t pos;
  zw_entry *e;
  size_t n, cap;
  ks__crc32 crc;
};

ks_status ks__zw_create(const ks_allocator *a, ks__zw_write_fn write, void *ctx, int force_zip64, ks__zw **out) {
  ks__zw *z = ks__calloc(a, 1, sizeof *z);
  if (!z) return KS_E_NOMEM;
  z->alloc = *ks__alloc_or_default(a);
  z->write = write;
  z->ctx = ctx;
  z->force64 = force_zip64;
  ks__crc32_init(&z->crc);
  *out = z;
  return KS_OK;
}

void ks__zw_free(ks__zw *z) {
  if (!z) return;
  for (size_t i = 0; i < z->n; i++) ks__free(&z->alloc, z->e[i].name);
  ks__free(&z->alloc, z->e);
  ks_allocator a = z->alloc;
  ks__free(&a, z);
}

static KS_NODISCARD ks_status emit(ks__zw *z, const void *p, size_t n, ks_error *err) {
  ks_status st = n ? z->write(z->ctx, p, n) : KS_OK;
  if (st) return ks__err(err, st, "zip: write failed at byte %llu", (unsigned long long)z->pos);
  z->pos += n;
  return KS_OK;
}

static KS_NODISCARD ks_status record(ks__zw *z, const char *name, uint64_t size, uint32_t crc, ks_error *err) {
  ks_status g = ks__grow(&z->alloc, &z->e, &z->cap, z->n + 1, sizeof *z->e);
  if (g) return ks__err(err, g, g == KS_E_LIMIT ? "zip: too many entries" : "zip: out of memory");
  char *copy = ks__strdup(&z->alloc, name);
  if (!copy) return ks__err(err, KS_E_NOMEM, "zip: out of memory");
  z->e[z->n++] = (zw_entry){copy, size, z->pos, crc};
  return KS_OK;
}

ks_status ks__zw_add(ks__zw *z, const char *name, const void *data, size_t n, ks_error *err) {
  size_t nlen = strlen(name);
  if (nlen > 0xFFFF) return ks__err(err, KS_E_LIMIT, "zip: entry name too long");
  uint32_t crc = ks__crc32_update(&z->crc, 0, data, n);
  ks_status st = record(z, name, n, crc, err);
  if (st) return st;
  int z64 = z->force64 || (uint64_t)n >= U32_MAX_FIELD;
  uint8_t h[30 + 20 + 4 + ALIGN];
  size_t x64 = z64 ? 20 : 0, fixed = 30 + x64 + 4;
  size_t pad = (ALIGN - (size_t)((z->pos + fixed + nlen) % ALIGN)) % ALIGN;
  memset(h, 0, sizeof h);
  ks__put_le32(h, 0x04034b50u);
  ks__put_le16(h + 4, z64 ? 45 : 20);
  ks__put_le32(h + 14, crc);
  ks__put_le32(h + 18, z64 ? U32_MAX_FIELD : (uint32_t)n);
  ks__put_le32(h + 22, z64 ? U32_MAX_FIELD : (uint32_t)n);
  ks__put_le16(h + 26, (uint16_t)nlen);
  ks__put_le16(h + 28, (uint16_t)(x64 + 4 + pad));
  if ((st = emit(z, h, 30, err)) || (st = emit(z, name, nlen, err))) return st;
  uint8_t *x = h + 30;
  if (z64) {
    ks__put_le16(x, 1);
    ks__put_le16(x + 2, 16);
    ks__put_le64(x + 4, n);
    ks__put_le64(x + 12, n);
  }
  ks__put_le16(x + x64, 0x4246); /* "FB": padding so the data is aligned */
  ks__put_le16(x + x64 + 2, (uint16_t)pad);
  memset(x + x64 + 4, 'Z', pad);
  if ((st = emit(z, x, x64 + 4 + pad, err))) return st;
  return emit(z, data, n, err);
}

static KS_NODISCARD ks_status central(ks__zw *z, const zw_entry *e, ks_error *err) {
  uint8_t h[46], x[28];
  size_t nlen = strlen(e->name), xl = 4;
  int big_size = z->force64 || e->size >= U32_MAX_FIELD, big_off = z->force64 || e->lho >= U32_MAX_FIELD;
  if (big_size) ks__put_le64(x + xl, e->size), ks__put_le64(x + xl + 8, e->size), xl += 16;
  if (big_off) ks__put_le64(x + xl, e->lho), xl += 8;
  if (xl == 4) xl = 0;
  ks__put_le16(x, 1);
  ks__put_le16(x + 2, (uint16_t)(xl ? xl - 4 : 0));
  memset(h, 0, sizeof h);
  ks__put_le32(h, 0x02014b50u);
  ks__put_le16(h + 4, 45);
  ks__put_le16(h + 6, xl ? 45 : 20);
  ks__put_le32(h + 16, e->crc);
  ks__put_le32(h + 20, big_size ? U32_MAX_FIELD : (uint32_t)e->size);
  ks__put_le32(h + 24, big_size ? U32_MAX_FIELD : (uint32_t)e->size);
  ks__put_le16(h + 28, (uint16_t)nlen);
  ks__put_le16(h + 30, (uint16_t)xl);
  ks__put_le32(h + 42, big_off ? U32_MAX_FIELD : (uint32_t)e->lho);
  ks_status st = emit(z, h, sizeof h, err);
  if (!st) st = emit(z, e->name, nlen, err);
  if (!st) st = emit(z, x, xl, err);
  return st;
}

static KS_NODISCARD ks_status zip64_end(ks__zw *z, uint64_t cd_off, uint64_t cd_size, ks_error *err) {
  uint8_t r[56 + 20];
  uint64_t at = z->pos;
  ks__put_le32(r, 0x06064b50u);
  ks__put_le64(r + 4, 44);
  ks__put_le16(r + 12, 45);
  ks__put_le16(r + 14, 45);
  ks__put_le32(r + 16, 0);
  ks__put_le32(r + 20, 0);
  ks__put_le64(r + 24, z->n);
  ks__put_le64(r + 32, z->n);
  ks__put_le64(r + 40, cd_size);
  ks__put_le64(r + 48, cd_off);
  ks__put_le32(r + 56, 0x07064b50u);
  ks__put_le32(r + 60, 0);
  ks__put_le64(r + 64, at);
  ks__put_le32(r + 72, 1);
  return emit(z, r, sizeof r, err);
}

ks_status ks__zw_finish(ks__zw *z, ks_error *err) {
  uint64_t cd_off = z->pos;
  ks_status st = KS_OK;
  for (size_t i = 0; i < z->n && !st; i++) st = central(z, &z->e[i], err);
  if (st) return st;
  uint64_t cd_size = z->pos - cd_off;
  int z64 = z->force64 || z->n >= 0xFFFF || cd_off >= U32_MAX_FIELD || cd_size >= U32_MAX_FIELD;
  if (z64 && (st = zip64_end(z, cd_off, cd_size, err))) return st;
  uint8_t r[22] = {0};
  uint16_t count = z64 ? 0xFFFF : (uint16_t)z->n;
  ks__put_le32(r, 0x06054b50u);
  ks__put_le16(r + 8, count);
  ks__put_le16(r + 10, count);
  ks__put_le32(r + 12, z64 ? U32_MAX_FIELD : (uint32_t)cd_size);
  ks__put_le32(r + 16, z64 ? U32_MAX_FIELD : (uint32_t)cd_off);
  return emit(z, r, sizeof r, err);
}
