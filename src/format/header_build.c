/*
 * Builds the header of a keepsake file in memory: the 8-byte length, the JSON
 * (keepsake metadata, then one entry per tensor in insertion order) and the
 * space padding that puts the data section on a KS_DATA_ALIGN boundary. Tensor
 * data never passes through here, only its checksums: hashed here in a pass of
 * their own, or left as placeholder digits that the writer fills in as it
 * streams the data (every checksum is 16 hex digits, so the header's length
 * does not depend on the values).
 */
#include <string.h>

#include "core/xxh.h"
#include "format/fmt_internal.h"
#include "keepsake/version.h"

uint64_t ks_checksum(const void *data, size_t n) { return ks__xxh3(data, n); }

static bool is_writer_key(const char *k) {
  static const char *const owned[] = {KS_META_FORMAT, KS_META_FORMAT_VERSION, KS_META_WRITER, KS_META_SCALARS,
                                      KS_META_CHECKSUMS};
  for (size_t i = 0; i < sizeof owned / sizeof owned[0]; i++)
    if (!strcmp(k, owned[i])) return true;
  return false;
}

static KS_NODISCARD ks_status check_names(const ks_statedict *sd, ks_error *err) {
  size_t n = ks_statedict_count(sd);
  for (size_t i = 0; i < n; i++) {
    ks_entry e;
    if (ks_statedict_at(sd, i, &e)) continue; /* index in range: cannot fail */
    if (!ks__utf8_valid((const uint8_t *)e.name, strlen(e.name)))
      return ks__err_at(err, KS_E_INVALID, NULL, e.name, -1, "entry name is not valid UTF-8");
    if (e.name[0] == '_' && !strcmp(e.name, "__metadata__"))
      return ks__err_at(err, KS_E_INVALID, NULL, e.name, -1, "'__metadata__' is reserved by safetensors");
  }
  return KS_OK;
}

void ks__put_sum_digits(char *dst, uint64_t v) {
  static const char hex[] = "0123456789abcdef";
  for (int i = 15; i >= 0; i--, v >>= 4) dst[i] = hex[v & 15];
}

/* The "keepsake.checksums" pair. Its value is a JSON object held in a JSON string,
   written already escaped so that 100,000 entries are not built twice. With sum_at,
   each checksum is placeholder digits whose offset in h goes to sum_at[k] (tensor k);
   without, the checksums are computed here in one pass over the tensor data. */
static void put_checksums(ks__sbuf *h, const ks_statedict *sd, size_t *sum_at) {
  size_t n = ks_statedict_count(sd), written = 0;
  ks__sbuf_put_json_str(h, KS_META_CHECKSUMS, strlen(KS_META_CHECKSUMS));
  ks__sbuf_put(h, ":\"{", 3);
  for (size_t i = 0; i < n; i++) {
    ks_entry e;
    if (ks_statedict_at(sd, i, &e)) continue; /* index in range: cannot fail */
    if (e.kind != KS_VAL_TENSOR) continue;
    if (written++) ks__sbuf_putc(h, ',');
    ks__sbuf_put_json_str_nested(h, e.name, strlen(e.name));
    ks__sbuf_put(h, ":\\\"", 3);
    if (sum_at) {
      sum_at[written - 1] = h->len;
      ks__sbuf_put(h, "0000000000000000", 16);
    } else {
      ks__sbuf_put_hex64(h, ks_checksum(e.tensor.data, e.tensor.nbytes));
    }
    ks__sbuf_put(h, "\\\"", 2);
  }
  ks__sbuf_put(h, "}\",", 3);
}

static void put_pair(ks__sbuf *h, const char *k, const char *v, size_t vlen) {
  ks__sbuf_put_json_str(h, k, strlen(k));
  ks__sbuf_putc(h, ':');
  ks__sbuf_put_json_str(h, v, vlen);
  ks__sbuf_putc(h, ',');
}

static KS_NODISCARD ks_status put_extra(ks__sbuf *h, const ks_meta *extra, ks_error *err) {
  for (size_t i = 0; i < ks_meta_count(extra); i++) {
    const char *k, *v;
    if (ks_meta_at(extra, i, &k, &v)) continue; /* index in range: cannot fail */
    if (is_writer_key(k))
      return ks__err_at(err, KS_E_INVALID, NULL, k, -1, "metadata key '%s' is written by keepsake itself", k);
    put_pair(h, k, v, strlen(v));
  }
  return KS_OK;
}

static KS_NODISCARD ks_status put_metadata(ks__sbuf *h, const ks_statedict *sd, const ks_meta *extra,
                                           const ks_allocator *a, size_t *sum_at, ks_error *err) {
  ks__sbuf scalars;
  ks__sbuf_init(&scalars, a);
  ks_status st = ks__scalars_encode(sd, &scalars, err);
  if (!st) {
    ks__sbuf_puts(h, "{\"__metadata__\":{");
    put_pair(h, KS_META_FORMAT, KS_FORMAT_NAME, strlen(KS_FORMAT_NAME));
    put_pair(h, KS_META_FORMAT_VERSION, "1", 1);
    put_pair(h, KS_META_WRITER, "keepsake " KS_VERSION_STRING, strlen("keepsake " KS_VERSION_STRING));
    put_pair(h, KS_META_SCALARS, scalars.p, scalars.len);
    put_checksums(h, sd, sum_at);
    st = put_extra(h, extra, err);
    if (!h->failed) h->len--; /* the last pair's comma */
    ks__sbuf_putc(h, '}');
  }
  ks__sbuf_free(&scalars);
  return st;
}

static void put_tensor(ks__sbuf *h, const ks_entry *e, uint64_t begin) {
  ks__sbuf_putc(h, ',');
  ks__sbuf_put_json_str(h, e->name, strlen(e->name));
  ks__sbuf_puts(h, ":{\"dtype\":\"");
  ks__sbuf_puts(h, ks_dtype_name(e->tensor.dtype));
  ks__sbuf_puts(h, "\",\"shape\":[");
  for (int d = 0; d < e->tensor.rank; d++) {
    if (d) ks__sbuf_putc(h, ',');
    ks__sbuf_put_i64(h, e->tensor.shape[d]);
  }
  ks__sbuf_puts(h, "],\"data_offsets\":[");
  ks__sbuf_put_u64(h, begin);
  ks__sbuf_putc(h, ',');
  ks__sbuf_put_u64(h, begin + e->tensor.nbytes);
  ks__sbuf_puts(h, "]}");
}

/* Pads with spaces so 8 + header length is a multiple of KS_DATA_ALIGN, then fills in the length. */
static void finish(ks__sbuf *h) {
  size_t pad = (KS_DATA_ALIGN - h->len % KS_DATA_ALIGN) % KS_DATA_ALIGN;
  for (size_t i = 0; i < pad; i++) ks__sbuf_putc(h, ' ');
  if (!h->failed) ks__put_le64((uint8_t *)h->p, (uint64_t)(h->len - 8));
}

ks_status ks__build_header(const ks_statedict *sd, const ks_meta *extra, const ks_allocator *a, ks__sbuf *h,
                           uint64_t *data_len, size_t *sum_at, ks_error *err) {
  ks_status st = check_names(sd, err);
  if (st) return st;
  ks__sbuf_put(h, "\0\0\0\0\0\0\0\0", 8);
  if ((st = put_metadata(h, sd, extra, a, sum_at, err)) != KS_OK) return st;
  uint64_t off = 0;
  for (size_t i = 0; i < ks_statedict_count(sd); i++) {
    ks_entry e;
    if (ks_statedict_at(sd, i, &e)) continue; /* index in range: cannot fail */
    if (e.kind != KS_VAL_TENSOR) continue;
    put_tensor(h, &e, off);
    off += e.tensor.nbytes;
  }
  ks__sbuf_putc(h, '}');
  finish(h);
  if (h->failed) return ks__err(err, KS_E_NOMEM, "out of memory building the header");
  if (h->len - 8 > KS_MAX_HEADER)
    return ks__err(err, KS_E_LIMIT, "header is %zu bytes, more than readers accept (%u)", h->len - 8,
                   KS_MAX_HEADER);
  *data_len = off;
  return KS_OK;
}
