/*
 * The "keepsake.scalars" metadata value: a JSON object mapping each scalar
 * entry's name to its value. Ints are JSON integers (exact over all of int64),
 * finite floats JSON numbers with a '.' or exponent (shortest exact form),
 * non-finite floats {"float": "nan"|"inf"|"-inf", "bits": "<16 hex>"}, bools,
 * strings and null as themselves.
 */
#include <math.h>
#include <string.h>

#include "format/fmt_internal.h"

static void put_nonfinite(ks__sbuf *b, double f) {
  uint64_t bits;
  memcpy(&bits, &f, sizeof bits);
  ks__sbuf_puts(b, "{\"float\":");
  ks__sbuf_puts(b, isnan(f) ? "\"nan\"" : f > 0 ? "\"inf\"" : "\"-inf\"");
  ks__sbuf_puts(b, ",\"bits\":\"");
  ks__sbuf_put_hex64(b, bits);
  ks__sbuf_puts(b, "\"}");
}

static KS_NODISCARD ks_status put_value(ks__sbuf *b, const ks_entry *e, ks_error *err) {
  switch (e->kind) {
    case KS_VAL_INT: ks__sbuf_put_i64(b, e->i); break;
    case KS_VAL_FLOAT:
      if (isfinite(e->f))
        ks__sbuf_put_double(b, e->f);
      else
        put_nonfinite(b, e->f);
      break;
    case KS_VAL_BOOL: ks__sbuf_puts(b, e->i ? "true" : "false"); break;
    case KS_VAL_NULL: ks__sbuf_puts(b, "null"); break;
    case KS_VAL_STRING: {
      size_t n = strlen(e->s);
      if (!ks__utf8_valid((const uint8_t *)e->s, n))
        return ks__err_at(err, KS_E_INVALID, NULL, e->name, -1, "string value is not valid UTF-8");
      ks__sbuf_put_json_str(b, e->s, n);
      break;
    }
    default: return ks__err_at(err, KS_E_INVALID, NULL, e->name, -1, "unknown scalar kind %d", (int)e->kind);
  }
  return KS_OK;
}

ks_status ks__scalars_encode(const ks_statedict *sd, ks__sbuf *out, ks_error *err) {
  size_t n = ks_statedict_count(sd), written = 0;
  ks__sbuf_putc(out, '{');
  for (size_t i = 0; i < n; i++) {
    ks_entry e;
    if (ks_statedict_at(sd, i, &e)) continue; /* index in range: cannot fail */
    if (e.kind == KS_VAL_TENSOR) continue;
    if (written++) ks__sbuf_putc(out, ',');
    ks__sbuf_put_json_str(out, e.name, strlen(e.name));
    ks__sbuf_putc(out, ':');
    ks_status st = put_value(out, &e, err);
    if (st) return st;
  }
  ks__sbuf_putc(out, '}');
  return out->failed ? ks__err(err, KS_E_NOMEM, "out of memory encoding scalars") : KS_OK;
}

/* Decodes {"float": ..., "bits": ...}; the bits are authoritative when present. */
static bool decode_nonfinite(const ks__jv *v, double *out) {
  const char *kind = ks__jv_string(ks__jv_get(v, "float"));
  const char *bits = ks__jv_string(ks__jv_get(v, "bits"));
  if (!kind) return false;
  uint64_t u;
  if (bits && ks__parse_hex64(bits, strlen(bits), &u)) {
    memcpy(out, &u, sizeof u);
    return !isfinite(*out);
  }
  if (!strcmp(kind, "nan")) *out = NAN;
  else if (!strcmp(kind, "inf")) *out = INFINITY;
  else if (!strcmp(kind, "-inf")) *out = -INFINITY;
  else return false;
  return true;
}

static KS_NODISCARD ks_status put_scalar(ks_statedict *dst, const char *name, const ks__jv *v) {
  double f;
  switch (v->type) {
    case KS__JV_INT: return ks_statedict_set_int(dst, name, v->i, NULL);
    case KS__JV_REAL: return ks_statedict_set_float(dst, name, v->d, NULL);
    case KS__JV_BOOL: return ks_statedict_set_bool(dst, name, v->b, NULL);
    case KS__JV_NULL: return ks_statedict_set_null(dst, name, NULL);
    case KS__JV_STRING:
      if (memchr(v->s, '\0', v->len)) return KS_E_FORMAT; /* the state dict holds C strings */
      return ks_statedict_set_string(dst, name, v->s, NULL);
    case KS__JV_OBJECT:
      if (!decode_nonfinite(v, &f)) return KS_E_FORMAT;
      return ks_statedict_set_float(dst, name, f, NULL);
    case KS__JV_ARRAY: break;
  }
  return KS_E_FORMAT;
}

ks_status ks__scalars_decode(const char *json, const char *file, int64_t offset, ks_statedict *dst,
                             ks_error *err) {
  const ks_allocator *a = ks__statedict_allocator(dst);
  ks_error jerr;
  ks_error_clear(&jerr);
  ks__jv *root = NULL;
  ks_status st = ks__jv_parse(a, json, strlen(json), KS_META_SCALARS, &root, &jerr);
  if (st == KS_E_NOMEM) return ks__err_at(err, st, file, KS_META_SCALARS, offset, "out of memory decoding scalars");
  if (st || root->type != KS__JV_OBJECT) {
    ks__jv_free(a, root);
    return ks__err_at(err, KS_E_FORMAT, file, KS_META_SCALARS, offset,
                      "metadata value is not a JSON object: %s", st ? jerr.message : "wrong type");
  }
  for (size_t i = 0; i < root->len; i++) {
    const char *name = root->keys[i];
    st = put_scalar(dst, name, root->items[i]);
    if (st == KS_E_FORMAT) {
      ks__err_at(err, st, file, name, offset, "scalar in '%s' has an unsupported JSON form", KS_META_SCALARS);
      break;
    }
    if (st) {
      ks__err_at(err, st, file, name, offset, "cannot store scalar: %s", ks_strerror(st));
      break;
    }
  }
  ks__jv_free(a, root);
  return st;
}
