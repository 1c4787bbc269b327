/*
 * The typed JSON of DCP non-tensor values (docs/FORMAT.md section 9.1, include/keepsake/binding/dcpvalue.h).
 *
 * The encoder writes one value as the binding walks it: a stack of the open containers (at most
 * KS_DCP_MAX_DEPTH deep, so the stack is a fixed array) decides the separators, the dict pairs
 * and what may be a key. The decoder reads untrusted bytes with the library's streaming JSON
 * reader into a tree of values that the binding turns back into objects; it accepts exactly what
 * the encoder writes (and what Python's json wrote before the rules moved here: any spacing,
 * raw UTF-8, any finite number form).
 */
#include <locale.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "core/json.h"
#include "keepsake/binding/dcpvalue.h"
#include "shard/shard_internal.h"

#define MAX_REAL 400 /* bytes of a number literal with a fraction or exponent */

/* ------------------------------------------------------------------------ */
/* Encoding.                                                                 */
/* ------------------------------------------------------------------------ */

typedef struct frame {
  ks_dcp_kind kind; /* LIST, TUPLE or DICT */
  size_t count;     /* values written into it (a dict's keys and values both count) */
  int in_key;       /* the container is (inside) a dict key */
} frame;

struct ks_dcp_encoder {
  const ks_allocator *alloc;
  ks__sbuf out;
  frame stack[KS_DCP_MAX_DEPTH + 1];
  int depth;      /* open containers */
  int done;       /* the top value is complete */
  ks_status fail; /* latched */
  ks_error fail_err;
};

ks_status ks_dcp_encoder_create(const ks_allocator *alloc, ks_dcp_encoder **out, ks_error *err) {
  ks_error_clear(err);
  if (!out) return ks__err(err, KS_E_INVALID, "ks_dcp_encoder_create: out is required");
  const ks_allocator *a = ks__alloc_or_default(alloc);
  ks_dcp_encoder *e = ks__calloc(a, 1, sizeof *e);
  if (!e) return ks__err(err, KS_E_NOMEM, "out of memory");
  e->alloc = a;
  ks__sbuf_init(&e->out, a);
  *out = e;
  return KS_OK;
}

void ks_dcp_encoder_free(ks_dcp_encoder *e) {
  if (!e) return;
  ks__sbuf_free(&e->out);
  ks__free(e->alloc, e);
}

/* Latches the first failure; later calls return it with its details. */
static KS_NODISCARD ks_status latch(ks_dcp_encoder *e, ks_status st, ks_error *err) {
  if (!e->fail) {
    e->fail = st;
    if (err) e->fail_err = *err;
    else ks_error_clear(&e->fail_err);
  }
  return st;
}

static KS_NODISCARD ks_status failed(const ks_dcp_encoder *e, ks_error *err) {
  if (err) *err = e->fail_err;
  return e->fail;
}

/* Whether the next value goes into a dict key (directly or inside a tuple that is one). */
static int next_is_key(const ks_dcp_encoder *e) {
  if (!e->depth) return 0;
  const frame *f = &e->stack[e->depth - 1];
  return f->in_key || (f->kind == KS_DCP_DICT && f->count % 2 == 0);
}

/* Everything a value needs before its own bytes: room for it, its separator, a dict pair's '['. */
static KS_NODISCARD ks_status before_value(ks_dcp_encoder *e, ks_error *err) {
  if (e->fail) return failed(e, err);
  if (e->done) return latch(e, ks__err(err, KS_E_STATE, "object: the value is already complete"), err);
  if (e->depth > KS_DCP_MAX_DEPTH)
    return latch(e, ks__err(err, KS_E_LIMIT, "value nested deeper than %d levels", KS_DCP_MAX_DEPTH), err);
  if (!e->depth) return KS_OK;
  frame *f = &e->stack[e->depth - 1];
  if (f->kind == KS_DCP_DICT && f->count % 2) return KS_OK; /* a pair's value: after_value wrote the ',' */
  if (f->count) ks__sbuf_putc(&e->out, ',');
  if (f->kind == KS_DCP_DICT) ks__sbuf_putc(&e->out, '[');
  return KS_OK;
}

/* After a value's bytes: counts it, closes a dict pair, and checks the buffer. */
static KS_NODISCARD ks_status after_value(ks_dcp_encoder *e, ks_error *err) {
  if (e->out.failed) return latch(e, ks__err(err, KS_E_NOMEM, "out of memory encoding an object"), err);
  if (!e->depth) {
    e->done = 1;
    return KS_OK;
  }
  frame *f = &e->stack[e->depth - 1];
  f->count++;
  if (f->kind == KS_DCP_DICT && f->count % 2 == 1) ks__sbuf_putc(&e->out, ',');
  else if (f->kind == KS_DCP_DICT) ks__sbuf_putc(&e->out, ']');
  return e->out.failed ? latch(e, ks__err(err, KS_E_NOMEM, "out of memory encoding an object"), err) : KS_OK;
}

static KS_NODISCARD ks_status put_literal(ks_dcp_encoder *e, const char *text, ks_error *err) {
  ks_status st = before_value(e, err);
  if (st) return st;
  ks__sbuf_puts(&e->out, text);
  return after_value(e, err);
}

ks_status ks_dcp_encoder_none(ks_dcp_encoder *e, ks_error *err) {
  if (!e) return ks__err(err, KS_E_INVALID, "ks_dcp_encoder_none: no encoder");
  return put_literal(e, "null", err);
}

ks_status ks_dcp_encoder_bool(ks_dcp_encoder *e, int v, ks_error *err) {
  if (!e) return ks__err(err, KS_E_INVALID, "ks_dcp_encoder_bool: no encoder");
  return put_literal(e, v ? "true" : "false", err);
}

ks_status ks_dcp_encoder_int(ks_dcp_encoder *e, int64_t v, ks_error *err) {
  if (!e) return ks__err(err, KS_E_INVALID, "ks_dcp_encoder_int: no encoder");
  ks_status st = before_value(e, err);
  if (st) return st;
  ks__sbuf_put_i64(&e->out, v);
  return after_value(e, err);
}

/* Decimal digits of an integer: optional '-', 1 to KS_DCP_MAX_DIGITS digits, no leading zero
   (but "0"), no "-0". KS_E_INVALID (grammar) or KS_E_LIMIT (digits). */
static KS_NODISCARD ks_status check_digits(const char *s, size_t n, ks_error *err) {
  if (!s || !n) return ks__err(err, KS_E_INVALID, "an integer has no digits");
  size_t neg = s[0] == '-';
  size_t digits = n - neg;
  if (!digits) return ks__err(err, KS_E_INVALID, "an integer has no digits");
  for (size_t i = neg; i < n; i++)
    if (s[i] < '0' || s[i] > '9') return ks__err(err, KS_E_INVALID, "an integer holds a byte that is no digit");
  if (s[neg] == '0' && (digits > 1 || neg)) return ks__err(err, KS_E_INVALID, "an integer has a leading zero");
  if (digits > KS_DCP_MAX_DIGITS)
    return ks__err(err, KS_E_LIMIT, "an integer of %zu digits (at most %d)", digits, KS_DCP_MAX_DIGITS);
  return KS_OK;
}

ks_status ks_dcp_encoder_bigint(ks_dcp_encoder *e, const char *digits, size_t n, ks_error *err) {
  if (!e) return ks__err(err, KS_E_INVALID, "ks_dcp_encoder_bigint: no encoder");
  ks_status st = before_value(e, err);
  if (st) return st;
  if ((st = check_digits(digits, n, err)) != KS_OK) return latch(e, st, err);
  ks__sbuf_put(&e->out, digits, n);
  return after_value(e, err);
}

ks_status ks_dcp_encoder_float(ks_dcp_encoder *e, double v, ks_error *err) {
  if (!e) return ks__err(err, KS_E_INVALID, "ks_dcp_encoder_float: no encoder");
  ks_status st = before_value(e, err);
  if (st) return st;
  if (isnan(v)) ks__sbuf_puts(&e->out, "{\"float\":\"nan\"}");
  else if (isinf(v)) ks__sbuf_puts(&e->out, v > 0 ? "{\"float\":\"inf\"}" : "{\"float\":\"-inf\"}");
  else ks__sbuf_put_double(&e->out, v); /* shortest round trip, with a '.' or an exponent */
  return after_value(e, err);
}

static void put_u_escape(ks__sbuf *b, unsigned u) {
  static const char hex[] = "0123456789abcdef";
  char esc[6] = {'\\', 'u', hex[(u >> 12) & 15], hex[(u >> 8) & 15], hex[(u >> 4) & 15], hex[u & 15]};
  ks__sbuf_put(b, esc, sizeof esc);
}

/* A JSON string of valid UTF-8, ASCII only: what Python's json.dumps(ensure_ascii=True) writes. */
static void put_ascii_str(ks__sbuf *b, const uint8_t *s, size_t n) {
  ks__sbuf_putc(b, '"');
  size_t run = 0;
  for (size_t i = 0; i < n;) {
    uint8_t c = s[i];
    if (c >= 0x20 && c < 0x80 && c != '"' && c != '\\') {
      i++;
      continue;
    }
    ks__sbuf_put(b, s + run, i - run);
    if (c < 0x80) {
      char sh = c == '"' ? '"' : c == '\\' ? '\\' : c == '\n' ? 'n' : c == '\r' ? 'r' : c == '\t' ? 't'
                : c == '\b' ? 'b' : c == '\f' ? 'f' : 0;
      if (sh) ks__sbuf_put(b, (char[2]){'\\', sh}, 2);
      else put_u_escape(b, c);
      i++;
    } else { /* valid UTF-8 or a lone surrogate's 3 bytes (checked): 2 to 4 bytes, one \u escape or a pair */
      size_t k = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
      uint32_t cp = c & (k == 4 ? 0x07u : k == 3 ? 0x0Fu : 0x1Fu);
      for (size_t j = 1; j < k; j++) cp = cp << 6 | (s[i + j] & 0x3Fu);
      if (cp >= 0x10000) {
        cp -= 0x10000;
        put_u_escape(b, 0xD800u | (cp >> 10));
        put_u_escape(b, 0xDC00u | (cp & 0x3FFu));
      } else {
        put_u_escape(b, cp);
      }
      i += k;
    }
    run = i;
  }
  ks__sbuf_put(b, s + run, n - run);
  ks__sbuf_putc(b, '"');
}

/* UTF-8 in which a surrogate code point may stand alone in its 3-byte form (WTF-8: what Python's
   "surrogatepass" makes of a str), no overlong forms, nothing past U+10FFFF. */
static bool wtf8_valid(const uint8_t *s, size_t n) {
  for (size_t i = 0; i < n;) {
    uint8_t c = s[i];
    if (c < 0x80) {
      i++;
      continue;
    }
    size_t k = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    if (!k || n - i < k) return false;
    for (size_t j = 1; j < k; j++)
      if ((s[i + j] & 0xC0) != 0x80) return false;
    if ((c == 0xE0 && s[i + 1] < 0xA0) || (c == 0xF0 && s[i + 1] < 0x90) || (c == 0xF4 && s[i + 1] > 0x8F))
      return false; /* overlong, or past U+10FFFF */
    i += k;
  }
  return true;
}

ks_status ks_dcp_encoder_str(ks_dcp_encoder *e, const char *utf8, size_t n, ks_error *err) {
  if (!e) return ks__err(err, KS_E_INVALID, "ks_dcp_encoder_str: no encoder");
  ks_status st = before_value(e, err);
  if (st) return st;
  if ((!utf8 && n) || !wtf8_valid((const uint8_t *)(utf8 ? utf8 : ""), n))
    return latch(e, ks__err(err, KS_E_INVALID, "a string that is not UTF-8 is not stored"), err);
  put_ascii_str(&e->out, (const uint8_t *)(utf8 ? utf8 : ""), n);
  return after_value(e, err);
}

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

ks_status ks_dcp_encoder_bytes(ks_dcp_encoder *e, ks_dcp_kind kind, const void *p, size_t n, ks_error *err) {
  if (!e) return ks__err(err, KS_E_INVALID, "ks_dcp_encoder_bytes: no encoder");
  ks_status st = before_value(e, err);
  if (st) return st;
  if ((kind != KS_DCP_BYTES && kind != KS_DCP_BYTESIO) || (!p && n))
    return latch(e, ks__err(err, KS_E_INVALID, "ks_dcp_encoder_bytes: kind is not bytes or bytesio"), err);
  if (n / 3 >= SIZE_MAX / 4 - 32)
    return latch(e, ks__err(err, KS_E_LIMIT, "%zu bytes do not fit in an object's base64", n), err);
  ks__sbuf_puts(&e->out, kind == KS_DCP_BYTES ? "{\"bytes\":\"" : "{\"bytesio\":\"");
  const uint8_t *s = p;
  char q[4];
  for (size_t i = 0; i + 3 <= n; i += 3) {
    uint32_t v = (uint32_t)s[i] << 16 | (uint32_t)s[i + 1] << 8 | s[i + 2];
    q[0] = b64[v >> 18], q[1] = b64[(v >> 12) & 63], q[2] = b64[(v >> 6) & 63], q[3] = b64[v & 63];
    ks__sbuf_put(&e->out, q, 4);
  }
  size_t rest = n % 3;
  if (rest) {
    uint32_t v = (uint32_t)s[n - rest] << 16 | (rest == 2 ? (uint32_t)s[n - 1] << 8 : 0u);
    q[0] = b64[v >> 18], q[1] = b64[(v >> 12) & 63], q[2] = rest == 2 ? b64[(v >> 6) & 63] : '=', q[3] = '=';
    ks__sbuf_put(&e->out, q, 4);
  }
  ks__sbuf_puts(&e->out, "\"}");
  return after_value(e, err);
}

ks_status ks_dcp_encoder_begin(ks_dcp_encoder *e, ks_dcp_kind kind, ks_error *err) {
  if (!e) return ks__err(err, KS_E_INVALID, "ks_dcp_encoder_begin: no encoder");
  if (kind != KS_DCP_LIST && kind != KS_DCP_TUPLE && kind != KS_DCP_DICT) {
    if (e->fail) return failed(e, err);
    return latch(e, ks__err(err, KS_E_INVALID, "ks_dcp_encoder_begin: kind is not list, tuple or dict"), err);
  }
  int key = next_is_key(e);
  ks_status st = before_value(e, err);
  if (st) return st;
  if (key && kind != KS_DCP_TUPLE)
    return latch(e, ks__err(err, KS_E_UNSUPPORTED, "a %s as a dict key (it has no hash) is not stored",
                            kind == KS_DCP_LIST ? "list" : "dict"), err);
  ks__sbuf_puts(&e->out, kind == KS_DCP_LIST ? "[" : kind == KS_DCP_TUPLE ? "{\"tuple\":[" : "{\"dict\":[");
  e->stack[e->depth++] = (frame){kind, 0, key};
  return e->out.failed ? latch(e, ks__err(err, KS_E_NOMEM, "out of memory encoding an object"), err) : KS_OK;
}

ks_status ks_dcp_encoder_end(ks_dcp_encoder *e, ks_error *err) {
  if (!e) return ks__err(err, KS_E_INVALID, "ks_dcp_encoder_end: no encoder");
  if (e->fail) return failed(e, err);
  if (!e->depth) return latch(e, ks__err(err, KS_E_STATE, "ks_dcp_encoder_end: no container is open"), err);
  const frame *f = &e->stack[e->depth - 1];
  if (f->kind == KS_DCP_DICT && f->count % 2)
    return latch(e, ks__err(err, KS_E_STATE, "ks_dcp_encoder_end: a dict key has no value"), err);
  ks__sbuf_puts(&e->out, f->kind == KS_DCP_LIST ? "]" : "]}");
  e->depth--;
  return after_value(e, err);
}

ks_status ks_dcp_encoder_result(ks_dcp_encoder *e, const char **json, size_t *len, ks_error *err) {
  if (!e || !json || !len) return ks__err(err, KS_E_INVALID, "ks_dcp_encoder_result: bad argument");
  if (e->fail) return failed(e, err);
  if (!e->done) return ks__err(err, KS_E_STATE, "ks_dcp_encoder_result: the value is not complete");
  *json = e->out.p;
  *len = e->out.len;
  return KS_OK;
}

/* ------------------------------------------------------------------------ */
/* Decoding.                                                                 */
/* ------------------------------------------------------------------------ */

struct ks_dcp_doc {
  const ks_allocator *alloc;
  ks_dcp_value root;
};

static void value_free(const ks_allocator *a, ks_dcp_value *v) {
  if (v->kind == KS_DCP_LIST || v->kind == KS_DCP_TUPLE || v->kind == KS_DCP_DICT) {
    size_t n = v->kind == KS_DCP_DICT ? 2 * v->count : v->count;
    ks_dcp_value *items = (ks_dcp_value *)(uintptr_t)v->items;
    for (size_t i = 0; i < n; i++) value_free(a, &items[i]);
    ks__free(a, items);
  } else {
    ks__free(a, (void *)(uintptr_t)v->s);
  }
  memset(v, 0, sizeof *v);
}

void ks_dcp_doc_free(ks_dcp_doc *d) {
  if (!d) return;
  value_free(d->alloc, &d->root);
  ks__free(d->alloc, d);
}

const ks_dcp_value *ks_dcp_doc_root(const ks_dcp_doc *d) { return d ? &d->root : NULL; }

typedef struct decoder {
  ks__json j;
  const ks_allocator *a;
} decoder;

static KS_NODISCARD ks_status nomem(decoder *d) {
  return ks__err(d->j.err, KS_E_NOMEM, "out of memory decoding an object");
}

static KS_NODISCARD ks_status bad(decoder *d, const char *what) {
  return ks__json_fail(&d->j, KS_E_FORMAT, NULL, "object: %s", what);
}

static KS_NODISCARD ks_status parse_value(decoder *d, int depth, int key, ks_dcp_value *out);

/* A copy of s[0..n), NUL-terminated, into v->s. */
static KS_NODISCARD ks_status take_bytes(decoder *d, ks_dcp_value *v, const void *s, size_t n) {
  if (n == SIZE_MAX) return nomem(d);
  char *c = ks__malloc(d->a, n + 1);
  if (!c) return nomem(d);
  if (n) memcpy(c, s, n);
  c[n] = '\0';
  v->s = c;
  v->len = n;
  return KS_OK;
}

static bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }

/* An integer literal into int64; false on overflow. */
static bool parse_i64(const uint8_t *t, size_t n, int64_t *out) {
  bool neg = n && *t == '-';
  uint64_t v = 0, lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
  for (size_t i = neg; i < n; i++) {
    uint64_t dg = (uint64_t)(t[i] - '0');
    if (v > (lim - dg) / 10) return false;
    v = v * 10 + dg;
  }
  *out = neg ? (int64_t)(0 - v) : (int64_t)v;
  return true;
}

static KS_NODISCARD ks_status parse_number(decoder *d, ks_dcp_value *v) {
  ks__json *j = &d->j;
  bool real;
  const uint8_t *s = j->s + j->pos;
  size_t n = ks__json_number_len(s, j->n - j->pos, &real);
  if (!n) return bad(d, "malformed number");
  if (!real) {
    size_t digits = n - (s[0] == '-');
    if (digits > KS_DCP_MAX_DIGITS)
      return ks__json_fail(j, KS_E_LIMIT, NULL, "object: an integer of %zu digits (at most %d)", digits,
                           KS_DCP_MAX_DIGITS);
    if (parse_i64(s, n, &v->i)) {
      v->kind = KS_DCP_INT;
    } else {
      v->kind = KS_DCP_BIGINT;
      ks_status st = take_bytes(d, v, s, n);
      if (st) return st;
    }
    j->pos += n;
    return KS_OK;
  }
  if (n > MAX_REAL) return bad(d, "a number literal longer than 400 bytes");
  if (ks__json_number_out_of_range(s, n)) return bad(d, "a number out of range of a double");
  char t[MAX_REAL + 1];
  memcpy(t, s, n);
  t[n] = '\0';
  const char *dp = localeconv()->decimal_point; /* strtod reads the locale's separator */
  char *q = dp && dp[0] && dp[0] != '.' && !dp[1] ? strchr(t, '.') : NULL;
  if (q) *q = dp[0];
  v->kind = KS_DCP_FLOAT;
  v->f = strtod(t, NULL);
  if (!isfinite(v->f)) return bad(d, "a number out of range of a double");
  j->pos += n;
  return KS_OK;
}

/* Up to 40 bytes of s as a Python literal would show them ('...' or b'...'), for a message. */
static void quoted(char *buf, size_t cap, const char *prefix, const char *s, size_t n) {
  size_t w = (size_t)snprintf(buf, cap, "%s'", prefix);
  for (size_t i = 0; i < n && i < 40 && w + 8 < cap; i++) {
    uint8_t c = (uint8_t)s[i];
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') buf[w++] = (char)c;
    else w += (size_t)snprintf(buf + w, cap - w, "\\x%02x", c);
  }
  snprintf(buf + w, cap - w, "%s'", n > 40 ? "..." : "");
}

/* A float as Python shows it: the shortest digits that read back, with ".0" when they look integral. */
static void float_text(double f, char *buf, size_t cap) {
  for (int p = 1; p <= 17; p++) {
    snprintf(buf, cap, "%.*g", p, f);
    if (!isfinite(f) || strtod(buf, NULL) == f) break;
  }
  if (!strpbrk(buf, ".eni")) snprintf(buf + strlen(buf), cap - strlen(buf), ".0");
}

/* A dict key as a message shows it. */
static void key_text(const ks_dcp_value *v, char *buf, size_t cap) {
  switch (v->kind) {
    case KS_DCP_NONE: snprintf(buf, cap, "None"); break;
    case KS_DCP_BOOL: snprintf(buf, cap, "%s", v->i ? "True" : "False"); break;
    case KS_DCP_INT: snprintf(buf, cap, "%lld", (long long)v->i); break;
    case KS_DCP_FLOAT: float_text(v->f, buf, cap); break;
    case KS_DCP_BIGINT: snprintf(buf, cap, "%.40s%s", v->s, v->len > 40 ? "..." : ""); break;
    case KS_DCP_STR: quoted(buf, cap, "", v->s, v->len); break;
    case KS_DCP_BYTES: quoted(buf, cap, "b", v->s, v->len); break;
    default: snprintf(buf, cap, "(a tuple of %zu items)", v->count); break;
  }
}

/* A Python dict never holds two equal keys: a second one would silently replace the first's value. */
static KS_NODISCARD ks_status distinct_keys(decoder *d, const ks_dcp_value *items, size_t n) {
  size_t first = 0, second = 0;
  ks_status st = ks__dcp_dict_keys_distinct(d->a, items, n, &first, &second);
  if (st == KS_E_NOMEM) return nomem(d);
  if (!st) return KS_OK;
  char a[200], b[200];
  key_text(&items[2 * first], a, sizeof a);
  key_text(&items[2 * second], b, sizeof b);
  if (!strcmp(a, b))
    return ks__json_fail(&d->j, KS_E_FORMAT, NULL, "object: a dict holds the key %s twice (items %zu and %zu)", a,
                         first, second);
  return ks__json_fail(&d->j, KS_E_FORMAT, NULL,
                       "object: a dict holds equal keys %s and %s (items %zu and %zu): a Python dict keeps one", a, b,
                       first, second);
}

/* Items of a JSON array, each parsed by parse_value (pair: each a [key, value] array) into a
   growing array; *n gets the count of items (or pairs). */
static KS_NODISCARD ks_status parse_items(decoder *d, int depth, int key, int pairs, ks_dcp_value **items,
                                          size_t *n) {
  ks__json *j = &d->j;
  ks_status st = ks__json_expect(j, '[');
  size_t cap = 0, len = 0;
  *items = NULL;
  *n = 0;
  for (bool first = true; !st; first = false) {
    if (ks__json_peek(j, ']')) {
      j->pos++;
      break;
    }
    if (!first && (st = ks__json_expect(j, ',')) != KS_OK) break;
    if ((st = ks__grow(d->a, items, &cap, len + (pairs ? 2 : 1), sizeof **items)) != KS_OK) {
      st = nomem(d);
      break;
    }
    if (pairs) {
      memset(&(*items)[len], 0, 2 * sizeof **items);
      if ((st = ks__json_expect(j, '[')) != KS_OK) break;
      st = parse_value(d, depth, 1, &(*items)[len]);
      len++;
      if (!st) st = ks__json_expect(j, ',');
      if (!st) st = parse_value(d, depth, key, &(*items)[len]);
      len++;
      if (!st && !ks__json_peek(j, ']')) st = bad(d, "a dict item is not a [key, value] pair");
      if (!st) j->pos++;
    } else {
      memset(&(*items)[len], 0, sizeof **items);
      st = parse_value(d, depth, key, &(*items)[len]);
      len++;
    }
  }
  if (!st && pairs) st = distinct_keys(d, *items, len / 2);
  if (st) {
    for (size_t i = 0; i < len; i++) value_free(d->a, &(*items)[i]);
    ks__free(d->a, *items);
    *items = NULL;
    return st;
  }
  *n = pairs ? len / 2 : len;
  return KS_OK;
}

static int b64_value(uint8_t c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  return c == '+' ? 62 : c == '/' ? 63 : -1;
}

/* Standard base64 with padding, canonical: what Python's b64encode writes (b64decode(validate=True)
   also accepts nonzero padding bits, which would give one value two encodings). */
static KS_NODISCARD ks_status parse_base64(decoder *d, const uint8_t *s, size_t n, ks_dcp_value *v) {
  if (n % 4) return bad(d, "base64 whose length is not a multiple of 4");
  size_t pad = n && s[n - 1] == '=' ? (n >= 2 && s[n - 2] == '=' ? 2 : 1) : 0;
  size_t out_len = n / 4 * 3 - pad;
  uint8_t *o = ks__malloc(d->a, out_len + 1);
  if (!o) return nomem(d);
  size_t w = 0;
  for (size_t i = 0; i < n; i += 4) {
    uint32_t acc = 0;
    size_t last = i + 4 == n ? pad : 0;
    for (size_t k = 0; k < 4; k++) {
      int x = k >= 4 - last ? 0 : b64_value(s[i + k]);
      if (x < 0) {
        ks__free(d->a, o);
        return bad(d, "bad base64");
      }
      acc = acc << 6 | (uint32_t)x;
    }
    uint8_t three[3] = {(uint8_t)(acc >> 16), (uint8_t)(acc >> 8), (uint8_t)acc};
    size_t k = 3 - last;
    memcpy(o + w, three, k);
    w += k;
  }
  /* Canonical: the bits the padding leaves unused are zero ("QQ==", never "QR=="), so one value has
     one encoding, the one the encoder writes. */
  int last = pad ? b64_value(s[n - pad - 1]) : 0;
  if (last & (pad == 2 ? 0x0F : 0x03)) {
    ks__free(d->a, o);
    return ks__json_fail(&d->j, KS_E_FORMAT, NULL,
                         "object: base64 that is not canonical: character %zu ('%c') sets bits the padding drops",
                         n - pad - 1, (char)s[n - pad - 1]);
  }
  o[w] = '\0';
  v->s = (const char *)o;
  v->len = w;
  return KS_OK;
}

/* The one member of a tagged object: `{` consumed. */
static KS_NODISCARD ks_status parse_tagged(decoder *d, int depth, int key, ks_dcp_value *v) {
  ks__json *j = &d->j;
  bool first = true, done = false;
  const char *k;
  size_t kn;
  ks_status st = ks__json_next_key(j, &first, &done, &k, &kn);
  if (st) return st;
  if (done) return bad(d, "an empty object");
  enum { T_FLOAT, T_TUPLE, T_DICT, T_BYTES, T_BYTESIO, T_OTHER } tag = T_OTHER;
  if (kn == 5 && !memcmp(k, "float", 5)) tag = T_FLOAT;
  else if (kn == 5 && !memcmp(k, "tuple", 5)) tag = T_TUPLE;
  else if (kn == 4 && !memcmp(k, "dict", 4)) tag = T_DICT;
  else if (kn == 5 && !memcmp(k, "bytes", 5)) tag = T_BYTES;
  else if (kn == 7 && !memcmp(k, "bytesio", 7)) tag = T_BYTESIO;
  if (tag == T_OTHER) return bad(d, "an object whose tag is not float, tuple, dict, bytes or bytesio");
  if (tag == T_DICT && key) return bad(d, "a dict as a dict key");
  if (tag == T_TUPLE || tag == T_DICT) {
    ks_dcp_value *items;
    size_t n;
    if ((st = parse_items(d, depth + 1, key, tag == T_DICT, &items, &n)) != KS_OK) return st;
    v->kind = tag == T_TUPLE ? KS_DCP_TUPLE : KS_DCP_DICT;
    v->items = items;
    v->count = n;
  } else {
    const char *s;
    size_t n;
    if (!ks__json_peek(j, '"')) return bad(d, "a float, bytes or bytesio tag without a string");
    if ((st = ks__json_string(j, &j->vbuf, &s, &n)) != KS_OK) return st;
    if (tag == T_FLOAT) {
      v->kind = KS_DCP_FLOAT;
      if (n == 3 && !memcmp(s, "nan", 3)) v->f = NAN;
      else if (n == 3 && !memcmp(s, "inf", 3)) v->f = INFINITY;
      else if (n == 4 && !memcmp(s, "-inf", 4)) v->f = -INFINITY;
      else return bad(d, "a float tag that is not \"nan\", \"inf\" or \"-inf\"");
    } else {
      if ((st = parse_base64(d, (const uint8_t *)s, n, v)) != KS_OK) return st;
      v->kind = tag == T_BYTES ? KS_DCP_BYTES : KS_DCP_BYTESIO;
    }
  }
  if ((st = ks__json_next_key(j, &first, &done, &k, &kn)) != KS_OK) return st;
  return done ? KS_OK : bad(d, "a tagged object has more than one member");
}

static KS_NODISCARD ks_status parse_value(decoder *d, int depth, int key, ks_dcp_value *v) {
  ks__json *j = &d->j;
  memset(v, 0, sizeof *v);
  if (depth > KS_DCP_MAX_DEPTH)
    return ks__json_fail(j, KS_E_LIMIT, NULL, "object: value nested deeper than %d levels", KS_DCP_MAX_DEPTH);
  ks__json_ws(j);
  if (j->pos >= j->n) return bad(d, "truncated");
  uint8_t c = j->s[j->pos];
  ks_status st;
  if (c == '[') {
    if (key) return bad(d, "a list as a dict key");
    ks_dcp_value *items;
    size_t n;
    if ((st = parse_items(d, depth + 1, 0, 0, &items, &n)) != KS_OK) return st;
    v->kind = KS_DCP_LIST;
    v->items = items;
    v->count = n;
    return KS_OK;
  }
  if (c == '{') {
    st = parse_tagged(d, depth, key, v);
    if (st) value_free(d->a, v);
    return st;
  }
  if (c == '"') {
    const char *s;
    size_t n;
    if ((st = ks__json_string(j, &j->vbuf, &s, &n)) != KS_OK) return st;
    v->kind = KS_DCP_STR;
    return take_bytes(d, v, s, n);
  }
  if (c == '-' || is_digit(c)) return parse_number(d, v);
  static const struct {
    const char *word;
    ks_dcp_kind kind;
    int64_t i;
  } words[] = {{"null", KS_DCP_NONE, 0}, {"true", KS_DCP_BOOL, 1}, {"false", KS_DCP_BOOL, 0}};
  for (size_t w = 0; w < sizeof words / sizeof words[0]; w++) {
    size_t n = strlen(words[w].word);
    if (j->n - j->pos >= n && !memcmp(j->s + j->pos, words[w].word, n)) {
      v->kind = words[w].kind;
      v->i = words[w].i;
      j->pos += n;
      return KS_OK;
    }
  }
  return bad(d, "unexpected JSON");
}

ks_status ks_dcp_doc_parse(const void *buf, size_t len, const ks_allocator *alloc, ks_dcp_doc **out, ks_error *err) {
  ks_error_clear(err);
  if ((!buf && len) || !out) return ks__err(err, KS_E_INVALID, "ks_dcp_doc_parse: bad argument");
  const uint8_t *s = buf ? buf : (const void *)"";
  if (!ks__utf8_valid(s, len)) return ks__err(err, KS_E_FORMAT, "object: not UTF-8");
  const ks_allocator *a = ks__alloc_or_default(alloc);
  ks_dcp_doc *doc = ks__calloc(a, 1, sizeof *doc);
  if (!doc) return ks__err(err, KS_E_NOMEM, "out of memory");
  doc->alloc = a;
  decoder d = {.a = a};
  ks__json_init(&d.j, s, len, 0, NULL, a, err);
  d.j.skipping = true;        /* \u0000 is allowed in strings: each has its length */
  d.j.lone_surrogates = true; /* a Python str may hold one: it decodes to its 3-byte form */
  ks_status st = parse_value(&d, 0, 0, &doc->root);
  if (!st) st = ks__json_end(&d.j);
  ks__json_free(&d.j);
  if (st == KS_E_FORMAT && err && !strncmp(err->message, "header JSON: ", 13)) {
    char why[sizeof err->message];
    snprintf(why, sizeof why, "object: %s", err->message + 13);
    snprintf(err->message, sizeof err->message, "%s", why);
  }
  if (st) {
    ks_dcp_doc_free(doc);
    return st;
  }
  *out = doc;
  return KS_OK;
}
