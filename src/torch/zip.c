/*
 * Zip reader for torch.save archives: stored entries, zip64, data descriptors
 * (sizes come from the central directory, never from local headers). Every
 * offset and size read from the file is checked against the bytes we hold.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fmap.h"
#include "torch/torch_internal.h"

#define SIG_LOCAL 0x04034b50u
#define SIG_CENTRAL 0x02014b50u
#define SIG_EOCD 0x06054b50u
#define SIG_EOCD64 0x06064b50u
#define SIG_LOC64 0x07064b50u
#define CENTRAL_MIN 46u
#define EOCD_MIN 22u

struct ks__zip {
  ks_allocator alloc;
  const uint8_t *data;
  size_t len;
  ks__fmap file; /* the file's bytes (mapped or read through the table); zero for a buffer */
  char *names;
  ks__zip_entry *entries; /* sorted by name */
  size_t count;
  char *root;
};

typedef struct cd_info {
  uint64_t count, size, off;
  size_t eocd_pos;
} cd_info;

static KS_NODISCARD ks_status fmt(ks_error *err, int64_t off, const char *what) {
  return ks__err_at(err, KS_E_FORMAT, NULL, NULL, off, "zip: %s", what);
}

static int find_eocd(const uint8_t *d, size_t len, size_t *pos) {
  if (len < EOCD_MIN) return 0;
  size_t lo = len - EOCD_MIN > 65535 ? len - EOCD_MIN - 65535 : 0;
  for (size_t p = len - EOCD_MIN + 1; p-- > lo;)
    if (ks__le32(d + p) == SIG_EOCD) {
      *pos = p;
      return 1;
    }
  return 0;
}

static KS_NODISCARD ks_status read_eocd64(const ks__zip *z, size_t eocd, cd_info *ci, ks_error *err) {
  ks__cursor c;
  uint32_t sig, disk, total_disks;
  uint64_t off64, rec_size;
  ks__cursor_init(&c, z->data, z->len);
  if (!ks__seek(&c, eocd - 20) || !ks__read_u32(&c, &sig) || sig != SIG_LOC64)
    return fmt(err, (int64_t)eocd, "zip64 fields without a zip64 locator");
  if (!ks__read_u32(&c, &disk) || !ks__read_u64(&c, &off64) || !ks__read_u32(&c, &total_disks))
    return fmt(err, (int64_t)eocd - 20, "truncated zip64 locator");
  if (disk != 0 || total_disks > 1) return fmt(err, (int64_t)eocd - 20, "multi-disk archive");
  if (off64 > z->len || !ks__seek(&c, (size_t)off64) || !ks__read_u32(&c, &sig) || sig != SIG_EOCD64)
    return fmt(err, (int64_t)off64, "zip64 end record not found where the locator points");
  const uint8_t *rec;
  if (!ks__read_u64(&c, &rec_size) || !ks__take(&c, 44, &rec))
    return fmt(err, (int64_t)off64, "truncated zip64 end record");
  ci->count = ks__le64(rec + 20);
  ci->size = ks__le64(rec + 28);
  ci->off = ks__le64(rec + 36);
  return KS_OK;
}

static KS_NODISCARD ks_status read_eocd(const ks__zip *z, cd_info *ci, ks_error *err) {
  size_t p;
  if (!find_eocd(z->data, z->len, &p)) return fmt(err, -1, "no end of central directory record (not a zip)");
  const uint8_t *e = z->data + p;
  if (ks__le16(e + 4) != 0 || ks__le16(e + 6) != 0) return fmt(err, (int64_t)p, "multi-disk archive");
  ci->count = ks__le16(e + 10);
  ci->size = ks__le32(e + 12);
  ci->off = ks__le32(e + 16);
  ci->eocd_pos = p;
  int z64 = ci->count == 0xFFFF || ci->size == 0xFFFFFFFFu || ci->off == 0xFFFFFFFFu;
  if (p >= 20 && ks__le32(z->data + p - 20) == SIG_LOC64) z64 = 1;
  ks_status st = z64 ? read_eocd64(z, p, ci, err) : KS_OK;
  if (st) return st;
  uint64_t end;
  if (!ks__add_u64(ci->off, ci->size, &end) || end > z->len)
    return fmt(err, (int64_t)p, "central directory lies outside the file");
  if (ci->count > ci->size / CENTRAL_MIN) return fmt(err, (int64_t)p, "entry count exceeds central directory size");
  return KS_OK;
}

/* Applies the zip64 extra field: replaces each 0xFFFFFFFF field, in the fixed order. */
static KS_NODISCARD ks_status apply_zip64(const uint8_t *x, size_t xlen, uint64_t *usize, uint64_t *csize,
                             uint64_t *lho, int64_t off, ks_error *err) {
  ks__cursor c;
  ks__cursor_init(&c, x, xlen);
  while (ks__cursor_left(&c) >= 4) {
    uint16_t id = 0, n = 0;
    const uint8_t *body;
    ks__read_u16(&c, &id);
    ks__read_u16(&c, &n);
    if (!ks__take(&c, n, &body)) return fmt(err, off, "extra field overruns the header");
    if (id != 0x0001) continue;
    ks__cursor b;
    ks__cursor_init(&b, body, n);
    uint64_t *fields[3] = {usize, csize, lho};
    for (int i = 0; i < 3; i++)
      if (*fields[i] == 0xFFFFFFFFu && !ks__read_u64(&b, fields[i]))
        return fmt(err, off, "zip64 extra field too short");
  }
  return KS_OK;
}

static KS_NODISCARD ks_status locate_data(const ks__zip *z, ks__zip_entry *e, uint64_t lho, uint64_t csize,
                             ks_error *err) {
  ks__cursor c;
  const uint8_t *h;
  ks__cursor_init(&c, z->data, z->len);
  if (lho > z->len || !ks__seek(&c, (size_t)lho) || !ks__take(&c, 30, &h) || ks__le32(h) != SIG_LOCAL)
    return fmt(err, (int64_t)lho, "local header missing");
  uint64_t start = lho + 30 + ks__le16(h + 26) + ks__le16(h + 28), end;
  if (!ks__add_u64(start, csize, &end) || end > z->len)
    return ks__err_at(err, KS_E_FORMAT, NULL, e->name, (int64_t)lho, "zip: entry data runs past the end of the file");
  e->data_off = start;
  return KS_OK;
}

static KS_NODISCARD ks_status read_central(ks__zip *z, ks__cursor *c, char **names, ks__zip_entry *e, ks_error *err) {
  const uint8_t *h, *name, *extra, *comment;
  int64_t off = (int64_t)c->pos;
  if (!ks__take(c, CENTRAL_MIN, &h) || ks__le32(h) != SIG_CENTRAL) return fmt(err, off, "bad central directory header");
  uint16_t nlen = ks__le16(h + 28), xlen = ks__le16(h + 30), clen = ks__le16(h + 32);
  if (!ks__take(c, nlen, &name) || !ks__take(c, xlen, &extra) || !ks__take(c, clen, &comment))
    return fmt(err, off, "central directory header overruns the directory");
  if (memchr(name, 0, nlen)) return fmt(err, off, "entry name contains a NUL byte");
  memcpy(*names, name, nlen);
  (*names)[nlen] = 0;
  e->name = *names;
  *names += nlen + 1;
  e->flags = ks__le16(h + 8);
  e->method = ks__le16(h + 10);
  e->crc = ks__le32(h + 16);
  uint64_t csize = ks__le32(h + 20), usize = ks__le32(h + 24), lho = ks__le32(h + 42);
  ks_status st = apply_zip64(extra, xlen, &usize, &csize, &lho, off, err);
  if (st) return st;
  if (e->method == 0 && csize != usize)
    return ks__err_at(err, KS_E_FORMAT, NULL, e->name, off, "zip: stored entry with compressed size %llu != size %llu",
                      (unsigned long long)csize, (unsigned long long)usize);
  e->size = csize;
  return locate_data(z, e, lho, csize, err);
}

static int cmp_entry(const void *a, const void *b) {
  return strcmp(((const ks__zip_entry *)a)->name, ((const ks__zip_entry *)b)->name);
}

static KS_NODISCARD ks_status set_root(ks__zip *z, ks_error *err) {
  const char *first = z->count ? z->entries[0].name : "";
  const char *slash = strchr(first, '/');
  size_t n = slash ? (size_t)(slash - first) + 1 : 0;
  z->root = ks__strndup(&z->alloc, first, n);
  return z->root ? KS_OK : ks__err(err, KS_E_NOMEM, "zip: out of memory");
}

static KS_NODISCARD ks_status read_directory(ks__zip *z, ks_error *err) {
  cd_info ci = {0};
  ks_status st = read_eocd(z, &ci, err);
  if (st) return st;
  size_t bytes;
  if (!ks__mul_size((size_t)ci.count, sizeof(ks__zip_entry), &bytes)) return fmt(err, -1, "too many entries");
  z->entries = ks__calloc(&z->alloc, 1, bytes ? bytes : 1);
  z->names = ks__malloc(&z->alloc, (size_t)ci.size + (size_t)ci.count + 1);
  if (!z->entries || !z->names) return ks__err(err, KS_E_NOMEM, "zip: out of memory");
  ks__cursor c;
  ks__cursor_init(&c, z->data + ci.off, (size_t)ci.size);
  char *names = z->names;
  for (z->count = 0; z->count < ci.count; z->count++) {
    if ((st = read_central(z, &c, &names, &z->entries[z->count], err)) != KS_OK) {
      if (err && err->offset >= 0 && err->offset < (int64_t)ci.size) err->offset += (int64_t)ci.off;
      return st;
    }
  }
  if ((st = set_root(z, err)) != KS_OK) return st;
  qsort(z->entries, z->count, sizeof *z->entries, cmp_entry);
  for (size_t i = 1; i < z->count; i++)
    if (!strcmp(z->entries[i - 1].name, z->entries[i].name))
      return ks__err_at(err, KS_E_FORMAT, NULL, z->entries[i].name, -1, "zip: duplicate entry name");
  return KS_OK;
}

static KS_NODISCARD ks_status zip_new(const ks_allocator *a, ks__zip **out, ks_error *err) {
  *out = ks__calloc(a, 1, sizeof(ks__zip));
  if (!*out) return ks__err(err, KS_E_NOMEM, "zip: out of memory");
  (*out)->alloc = *ks__alloc_or_default(a);
  return KS_OK;
}

ks_status ks__zip_open_buffer(const void *buf, size_t len, const ks_allocator *a, ks__zip **out,
                              ks_error *err) {
  ks__zip *z;
  ks_status st = zip_new(a, &z, err);
  if (st) return st;
  z->data = buf;
  z->len = buf ? len : 0;
  if ((st = read_directory(z, err)) != KS_OK) {
    ks__zip_free(z);
    return st;
  }
  *out = z;
  return KS_OK;
}

/* The whole file, mapped (or read, by a table that cannot map) by the core mapper; an empty
   file is not a zip (a format error). */
static KS_NODISCARD ks_status map_file(const char *path, const ks_io *io, const ks_allocator *a, ks__fmap *m,
                                       ks_error *err) {
  ks_status st = ks__fmap_open(m, path, io, false, 1, a, err);
  if (st) return st;
  if (m->size == 0) {
    ks__fmap_close(m, a);
    return ks__err_at(err, KS_E_FORMAT, path, NULL, 0, "empty file: not a zip archive");
  }
  return KS_OK;
}

ks_status ks__zip_open_path(const char *path, const ks_io *io, const ks_allocator *a, ks__zip **out, ks_error *err) {
  ks__zip *z;
  ks_status st = zip_new(a, &z, err);
  if (st) return st;
  if ((st = map_file(path, io, &z->alloc, &z->file, err)) != KS_OK) {
    ks__zip_free(z);
    return st;
  }
  z->data = z->file.bytes;
  z->len = z->file.size;
  if ((st = read_directory(z, err)) != KS_OK) {
    ks__err_set_file(err, path);
    ks__zip_free(z);
    return st;
  }
  *out = z;
  return KS_OK;
}

void ks__zip_free(ks__zip *z) {
  if (!z) return;
  ks__fmap_close(&z->file, &z->alloc);
  ks__free(&z->alloc, z->names);
  ks__free(&z->alloc, z->entries);
  ks__free(&z->alloc, z->root);
  ks_allocator a = z->alloc;
  ks__free(&a, z);
}

const char *ks__zip_root(const ks__zip *z) { return z->root; }
size_t ks__zip_count(const ks__zip *z) { return z->count; }
const ks__zip_entry *ks__zip_at(const ks__zip *z, size_t i) { return i < z->count ? &z->entries[i] : NULL; }
int ks__zip_owns_data(const ks__zip *z) { return z->file.bytes != NULL; }

static const ks__zip_entry *find(const ks__zip *z, const char *rel) {
  size_t lo = 0, hi = z->count, rl = strlen(z->root);
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    const char *n = z->entries[mid].name;
    int c = strncmp(n, z->root, rl);
    if (c == 0) c = strcmp(n + rl, rel);
    if (c == 0) return &z->entries[mid];
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  return NULL;
}

ks_status ks__zip_read(const ks__zip *z, const char *rel, int verify_crc, const uint8_t **data,
                       size_t *len, ks_error *err) {
  const ks__zip_entry *e = find(z, rel);
  if (!e) return ks__err_at(err, KS_E_NOTFOUND, NULL, rel, -1, "zip: no entry '%s%s'", z->root, rel);
  if (e->flags & 1)
    return ks__err_at(err, KS_E_UNSUPPORTED, NULL, e->name, (int64_t)e->data_off, "zip: entry is encrypted");
  if (e->method != 0)
    return ks__err_at(err, KS_E_UNSUPPORTED, NULL, e->name, (int64_t)e->data_off,
                      "zip: entry is compressed (method %u); torch.save archives store entries uncompressed",
                      (unsigned)e->method);
  *data = z->data + e->data_off;
  *len = (size_t)e->size;
  if (verify_crc && !e->crc_checked) {
    ks__crc32 t;
    ks__crc32_init(&t);
    uint32_t crc = ks__crc32_update(&t, 0, *data, *len);
    if (crc != e->crc)
      return ks__err_at(err, KS_E_CHECKSUM, NULL, e->name, (int64_t)e->data_off,
                        "zip: CRC32 mismatch: expected %08x, found %08x", e->crc, crc);
    z->entries[e - z->entries].crc_checked = true; /* the entries are the zip's own, sorted once */
  }
  return KS_OK;
}
