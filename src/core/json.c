/*
 * A streaming JSON reader for safetensors headers. Opening a file with
 * 100,000 tensors must take well under 150 ms, and a general JSON library
 * builds (and frees) a tree of millions of nodes for that; this reads the
 * grammar in place instead. Strings without escapes are returned zero-copy;
 * escapes (including surrogate pairs) are decoded into a scratch buffer.
 * Input is untrusted: every read checks the remaining length.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/json.h"

/* Containers may nest 127 deep, counting the header object as 1: the reference reader's
   JSON parser (serde_json) refuses the 128th level. */
#define MAX_DEPTH 127

void ks__json_init(ks__json *j, const void *s, size_t n, int64_t base, const char *file, const ks_allocator *a,
                   ks_error *err) {
  memset(j, 0, sizeof *j);
  j->s = s;
  j->n = n;
  j->base = base;
  j->file = file;
  j->alloc = a;
  j->err = err;
  ks__sbuf_init(&j->kbuf, a);
  ks__sbuf_init(&j->vbuf, a);
}

void ks__json_free(ks__json *j) {
  ks__sbuf_free(&j->kbuf);
  ks__sbuf_free(&j->vbuf);
}

ks_status ks__json_fail(ks__json *j, ks_status code, const char *key, const char *fmt, ...) {
  char msg[KS_ERROR_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return ks__err_at(j->err, code, j->file, key, j->base + (int64_t)j->pos, "%s", msg);
}

void ks__json_ws(ks__json *j) {
  while (j->pos < j->n) {
    uint8_t c = j->s[j->pos];
    if (c != ' ' && c != '\n' && c != '\r' && c != '\t') return;
    j->pos++;
  }
}

bool ks__json_peek(ks__json *j, char c) {
  /* Writers rarely put whitespace between tokens: c (never whitespace) is usually right here. */
  if (j->pos < j->n && j->s[j->pos] == (uint8_t)c) return true;
  ks__json_ws(j);
  return j->pos < j->n && j->s[j->pos] == (uint8_t)c;
}

ks_status ks__json_expect(ks__json *j, char c) {
  if (!ks__json_peek(j, c))
    return ks__json_fail(j, KS_E_FORMAT, NULL, "header JSON: expected '%c' %s", c,
                         j->pos < j->n ? "here" : "before the end of the header");
  j->pos++;
  return KS_OK;
}

static bool buf_put(ks__json *j, ks__sbuf *b, const void *p, size_t n) {
  if (n == 0) return true;
  (void)j;
  ks__sbuf_put(b, p, n);
  return !b->failed;
}

static int hex4(const uint8_t *p) {
  int v = 0;
  for (int i = 0; i < 4; i++) {
    int c = p[i], d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                                     : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

static size_t utf8_encode(uint32_t cp, uint8_t out[4]) {
  if (cp < 0x80) return out[0] = (uint8_t)cp, 1;
  if (cp < 0x800) return out[0] = (uint8_t)(0xC0 | (cp >> 6)), out[1] = (uint8_t)(0x80 | (cp & 0x3F)), 2;
  if (cp < 0x10000) {
    out[0] = (uint8_t)(0xE0 | (cp >> 12));
    out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    out[2] = (uint8_t)(0x80 | (cp & 0x3F));
    return 3;
  }
  out[0] = (uint8_t)(0xF0 | (cp >> 18));
  out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
  out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
  out[3] = (uint8_t)(0x80 | (cp & 0x3F));
  return 4;
}

/* Decodes \uHHHH (and its low surrogate) at j->pos, which points just past the 'u'. */
static KS_NODISCARD ks_status read_u_escape(ks__json *j, uint32_t *cp) {
  int hi = j->n - j->pos >= 4 ? hex4(j->s + j->pos) : -1;
  if (hi < 0) return ks__json_fail(j, KS_E_FORMAT, NULL, "header JSON: bad \\u escape");
  j->pos += 4;
  *cp = (uint32_t)hi;
  if (hi >= 0xDC00 && hi <= 0xDFFF)
    return j->lone_surrogates ? KS_OK : ks__json_fail(j, KS_E_FORMAT, NULL, "header JSON: lone low surrogate");
  if (hi < 0xD800 || hi > 0xDBFF)
    return hi || j->skipping ? KS_OK : ks__json_fail(j, KS_E_FORMAT, NULL, "header JSON: \\u0000 is not allowed");
  int lo = j->n - j->pos >= 6 && j->s[j->pos] == '\\' && j->s[j->pos + 1] == 'u' ? hex4(j->s + j->pos + 2) : -1;
  if (lo < 0xDC00 || lo > 0xDFFF)
    return j->lone_surrogates ? KS_OK : ks__json_fail(j, KS_E_FORMAT, NULL, "header JSON: lone high surrogate");
  j->pos += 6;
  *cp = 0x10000 + (((uint32_t)hi - 0xD800) << 10) + ((uint32_t)lo - 0xDC00);
  return KS_OK;
}

/* The byte a one-character escape stands for, or 0 when c does not name one. */
static uint8_t simple_escape(uint8_t c) {
  switch (c) {
    case '"': return '"';
    case '\\': return '\\';
    case '/': return '/';
    case 'b': return '\b';
    case 'f': return '\f';
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    default: return 0;
  }
}

static KS_NODISCARD ks_status read_escape(ks__json *j, ks__sbuf *b) {
  if (j->pos >= j->n) return ks__json_fail(j, KS_E_FORMAT, NULL, "header JSON: unterminated string");
  uint8_t c = j->s[j->pos++], out[4];
  size_t n = 1;
  if ((out[0] = simple_escape(c)) == 0) {
    if (c != 'u') {
      j->pos--;
      return ks__json_fail(j, KS_E_FORMAT, NULL, "header JSON: invalid escape '\\%c'", c);
    }
    uint32_t cp = 0;
    ks_status st = read_u_escape(j, &cp);
    if (st) return st;
    n = utf8_encode(cp, out);
  }
  return buf_put(j, b, out, n) ? KS_OK : ks__err(j->err, KS_E_NOMEM, "out of memory decoding a string");
}

/* True for the bytes that end a run of plain string content: '"', '\\' and control characters. */
static bool ends_run(uint8_t c) { return c < 0x20 || c == '"' || c == '\\'; }

/* Advances j->pos past plain string content. */
static void scan_run(ks__json *j) {
  while (j->pos < j->n && !ends_run(j->s[j->pos])) j->pos++;
}

/* Slow path: the string has escapes; decode it into b. j->pos is at the first backslash. */
static KS_NODISCARD ks_status read_escaped(ks__json *j, ks__sbuf *b, size_t start) {
  b->len = 0;
  if (!buf_put(j, b, j->s + start, j->pos - start)) return ks__err(j->err, KS_E_NOMEM, "out of memory");
  while (j->pos < j->n) {
    size_t run = j->pos;
    scan_run(j);
    if (!buf_put(j, b, j->s + run, j->pos - run)) return ks__err(j->err, KS_E_NOMEM, "out of memory");
    if (j->pos >= j->n || j->s[j->pos] < 0x20) break;
    if (j->s[j->pos++] == '"') return KS_OK;
    ks_status st = read_escape(j, b);
    if (st) return st;
  }
  return ks__json_fail(j, KS_E_FORMAT, NULL, "header JSON: unterminated string or raw control character");
}

ks_status ks__json_string(ks__json *j, ks__sbuf *b, const char **s, size_t *n) {
  ks_status st = ks__json_expect(j, '"');
  if (st) return st;
  size_t start = j->pos;
  scan_run(j);
  if (j->pos < j->n && j->s[j->pos] == '"') {
    *s = (const char *)j->s + start;
    *n = j->pos++ - start;
    return KS_OK;
  }
  if (j->pos >= j->n || j->s[j->pos] != '\\')
    return ks__json_fail(j, KS_E_FORMAT, NULL, "header JSON: unterminated string or raw control character");
  if ((st = read_escaped(j, b, start)) != KS_OK) return st;
  *s = b->p ? b->p : "";
  *n = b->len;
  return KS_OK;
}

static bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }

static size_t digits(ks__json *j) {
  size_t start = j->pos;
  while (j->pos < j->n && is_digit(j->s[j->pos])) j->pos++;
  return j->pos - start;
}

/* Any JSON number, per the grammar: -?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)? */
static KS_NODISCARD ks_status skip_number(ks__json *j) {
  size_t start = j->pos;
  if (j->pos < j->n && j->s[j->pos] == '-') j->pos++;
  size_t intd = digits(j);
  bool ok = intd > 0 && !(intd > 1 && j->s[j->pos - intd] == '0');
  if (ok && j->pos < j->n && j->s[j->pos] == '.') j->pos++, ok = digits(j) > 0;
  if (ok && j->pos < j->n && (j->s[j->pos] == 'e' || j->s[j->pos] == 'E')) {
    j->pos++;
    if (j->pos < j->n && (j->s[j->pos] == '+' || j->s[j->pos] == '-')) j->pos++;
    ok = digits(j) > 0;
  }
  if (ok && !ks__json_number_out_of_range(j->s + start, j->pos - start)) return KS_OK;
  j->pos = start;
  return ks__json_fail(j, KS_E_FORMAT, NULL, ok ? "header JSON: number out of range of a double"
                                                : "header JSON: invalid number");
}

ks_status ks__json_u64(ks__json *j, const char *key, const char *what, uint64_t *v) {
  ks__json_ws(j);
  size_t start = j->pos;
  uint64_t x = 0;
  while (j->pos < j->n && is_digit(j->s[j->pos])) {
    unsigned d = (unsigned)(j->s[j->pos] - '0');
    if (x > (UINT64_MAX - d) / 10) return ks__json_fail(j, KS_E_LIMIT, key, "%s does not fit in 64 bits", what);
    x = x * 10 + d;
    j->pos++;
  }
  size_t nd = j->pos - start;
  bool more = j->pos < j->n && (j->s[j->pos] == '.' || j->s[j->pos] == 'e' || j->s[j->pos] == 'E');
  if (nd == 0 || more || (nd > 1 && j->s[start] == '0')) {
    j->pos = start;
    return ks__json_fail(j, KS_E_FORMAT, key, "%s is not a non-negative integer", what);
  }
  *v = x;
  return KS_OK;
}

static KS_NODISCARD ks_status skip_literal(ks__json *j) {
  static const char *const lits[] = {"true", "false", "null"};
  for (int i = 0; i < 3; i++) {
    size_t n = strlen(lits[i]);
    if (j->n - j->pos >= n && memcmp(j->s + j->pos, lits[i], n) == 0) return j->pos += n, KS_OK;
  }
  return ks__json_fail(j, KS_E_FORMAT, NULL, "header JSON: unexpected character");
}

static KS_NODISCARD ks_status skip_container(ks__json *j, int depth, char close) {
  j->pos++;
  if (ks__json_peek(j, close)) return j->pos++, KS_OK;
  for (;;) {
    ks_status st;
    if (close == '}') {
      const char *k;
      size_t kn;
      if ((st = ks__json_string(j, &j->kbuf, &k, &kn)) || (st = ks__json_expect(j, ':'))) return st;
    }
    if ((st = ks__json_skip(j, depth + 1)) != KS_OK) return st;
    if (ks__json_peek(j, close)) return j->pos++, KS_OK;
    if ((st = ks__json_expect(j, ',')) != KS_OK) return st;
  }
}

ks_status ks__json_skip(ks__json *j, int depth) {
  ks__json_ws(j);
  if (j->pos >= j->n) return ks__json_fail(j, KS_E_FORMAT, NULL, "header JSON: value expected before the end");
  uint8_t c = j->s[j->pos];
  const char *s;
  size_t n;
  if ((c == '{' || c == '[') && depth > MAX_DEPTH)
    return ks__json_fail(j, KS_E_LIMIT, NULL, "header JSON nests deeper than %d", MAX_DEPTH);
  if (c == '"') return ks__json_string(j, &j->vbuf, &s, &n);
  if (c == '{') return skip_container(j, depth, '}');
  if (c == '[') return skip_container(j, depth, ']');
  if (c == '-' || is_digit(c)) return skip_number(j);
  return skip_literal(j);
}

ks_status ks__json_next_key(ks__json *j, bool *first, bool *done, const char **key, size_t *klen) {
  ks_status st;
  if (*first) {
    *first = false;
    if ((st = ks__json_expect(j, '{')) != KS_OK) return st;
    if (ks__json_peek(j, '}')) return j->pos++, *done = true, KS_OK;
  } else {
    if (ks__json_peek(j, '}')) return j->pos++, *done = true, KS_OK;
    if ((st = ks__json_expect(j, ',')) != KS_OK) return st;
  }
  *done = false;
  if ((st = ks__json_string(j, &j->kbuf, key, klen)) != KS_OK) return st;
  return ks__json_expect(j, ':');
}

ks_status ks__json_end(ks__json *j) {
  ks__json_ws(j);
  if (j->pos != j->n) return ks__json_fail(j, KS_E_FORMAT, NULL, "header JSON: unexpected data after the object");
  return KS_OK;
}
