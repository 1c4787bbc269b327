/*
 * JSON values: a small tree with the caller's allocator, parsed with the
 * streaming reader (json.c) and written with the string buffer (sbuf.c), so
 * metadata JSON goes through the same allocator, limits and escaping as the
 * safetensors header.
 */
#include <locale.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"

#define MAX_DEPTH 64
#define MAX_NUMBER 400 /* bytes of one number literal */

static ks__jv *jv_new(const ks_allocator *a, ks__jv_type t) {
  ks__jv *v = ks__calloc(a, 1, sizeof *v);
  if (v) v->type = t;
  return v;
}

ks__jv *ks__jv_null(const ks_allocator *a) { return jv_new(a, KS__JV_NULL); }
ks__jv *ks__jv_array(const ks_allocator *a) { return jv_new(a, KS__JV_ARRAY); }
ks__jv *ks__jv_object(const ks_allocator *a) { return jv_new(a, KS__JV_OBJECT); }

ks__jv *ks__jv_bool(const ks_allocator *a, bool b) {
  ks__jv *v = jv_new(a, KS__JV_BOOL);
  if (v) v->b = b;
  return v;
}

ks__jv *ks__jv_int(const ks_allocator *a, int64_t i) {
  ks__jv *v = jv_new(a, KS__JV_INT);
  if (v) v->i = i;
  return v;
}

ks__jv *ks__jv_real(const ks_allocator *a, double d) {
  ks__jv *v = jv_new(a, KS__JV_REAL);
  if (v) v->d = d;
  return v;
}

static ks__jv *jv_strn(const ks_allocator *a, const char *s, size_t n) {
  ks__jv *v = jv_new(a, KS__JV_STRING);
  if (!v) return NULL;
  v->s = ks__strndup(a, s, n);
  v->len = n;
  if (!v->s) {
    ks__free(a, v);
    return NULL;
  }
  return v;
}

ks__jv *ks__jv_str(const ks_allocator *a, const char *s) { return jv_strn(a, s, strlen(s)); }

void ks__jv_free(const ks_allocator *a, ks__jv *v) {
  if (!v) return;
  for (size_t i = 0; i < v->len && v->items; i++) ks__jv_free(a, v->items[i]);
  for (size_t i = 0; i < v->len && v->keys; i++) ks__free(a, v->keys[i]);
  ks__free(a, v->items);
  ks__free(a, v->keys);
  ks__free(a, v->hashes);
  ks__hindex_free(&v->index, a);
  ks__free(a, v->s);
  ks__free(a, v);
}

#define INDEX_FROM 16 /* members; smaller objects are searched linearly */

static uint64_t member_hash(const void *ctx, size_t i) { return ((const ks__jv *)ctx)->hashes[i]; }

static const char *member_key(const void *ctx, size_t i, size_t *len) {
  const char *k = ((const ks__jv *)ctx)->keys[i];
  *len = strlen(k);
  return k;
}

static const ks__hindex_ops member_ops = {member_hash, member_key};

#define FIRST_CAP 4 /* items of a container's first allocation: most objects are small records */

/* ks__grow, starting at FIRST_CAP rather than its 16 (a record of two members then takes 3 x 32
   bytes of arrays, not 3 x 128). */
static KS_NODISCARD ks_status grow(const ks_allocator *a, void *arrayp, size_t *cap, size_t need, size_t size) {
  if (*cap || need > FIRST_CAP) return ks__grow(a, arrayp, cap, need, size);
  void *old, *p;
  memcpy(&old, arrayp, sizeof old);
  p = ks__realloc(a, old, FIRST_CAP * size);
  if (!p) return KS_E_NOMEM;
  memcpy(arrayp, &p, sizeof p);
  *cap = FIRST_CAP;
  return KS_OK;
}

/* Room for one more item (and key, hash and index slot, for objects); cap is the smallest capacity. */
static KS_NODISCARD ks_status reserve(const ks_allocator *a, ks__jv *c) {
  size_t icap = c->cap, kcap = c->cap, hcap = c->cap;
  ks_status s = grow(a, &c->items, &icap, c->len + 1, sizeof *c->items);
  if (c->type != KS__JV_OBJECT) {
    if (!s) c->cap = icap;
    return s;
  }
  if (!s) s = grow(a, &c->keys, &kcap, c->len + 1, sizeof *c->keys);
  if (!s) s = grow(a, &c->hashes, &hcap, c->len + 1, sizeof *c->hashes);
  if (!s && c->len + 1 >= INDEX_FROM) s = ks__hindex_reserve(&c->index, a, c->len + 1, c->len, &member_ops, c);
  if (!s) c->cap = icap < kcap ? (icap < hcap ? icap : hcap) : (kcap < hcap ? kcap : hcap);
  return s;
}

static long find_key_h(const ks__jv *obj, const char *key, size_t n, uint64_t h) {
  if (obj->index.nslots) return ks__hindex_find(&obj->index, key, n, h, &member_ops, obj);
  for (size_t i = 0; i < obj->len; i++)
    if (obj->hashes[i] == h && !strcmp(obj->keys[i], key)) return (long)i;
  return -1;
}

static long find_key(const ks__jv *obj, const char *key) {
  size_t n = strlen(key);
  return find_key_h(obj, key, n, ks__hash(key, n));
}

ks_status ks__jv_set(const ks_allocator *a, ks__jv *obj, const char *key, ks__jv *val) {
  if (!val) return KS_E_NOMEM; /* a failed constructor: nothing to take */
  if (!ks__jv_is(obj, KS__JV_OBJECT) || !key) return ks__jv_free(a, val), KS_E_INVALID;
  long at = find_key(obj, key);
  if (at >= 0) {
    ks__jv_free(a, obj->items[at]);
    obj->items[at] = val;
    return KS_OK;
  }
  char *k = ks__strdup(a, key);
  if (!k || reserve(a, obj)) {
    ks__free(a, k);
    ks__jv_free(a, val);
    return KS_E_NOMEM;
  }
  size_t n = strlen(k);
  obj->keys[obj->len] = k;
  obj->hashes[obj->len] = ks__hash(k, n);
  if (obj->index.nslots) ks__hindex_insert(&obj->index, obj->len, obj->hashes[obj->len]);
  obj->items[obj->len++] = val;
  return KS_OK;
}

ks_status ks__jv_push(const ks_allocator *a, ks__jv *arr, ks__jv *val) {
  if (!val) return KS_E_NOMEM;
  if (!ks__jv_is(arr, KS__JV_ARRAY)) return ks__jv_free(a, val), KS_E_INVALID;
  if (reserve(a, arr)) return ks__jv_free(a, val), KS_E_NOMEM;
  arr->items[arr->len++] = val;
  return KS_OK;
}

const ks__jv *ks__jv_get(const ks__jv *obj, const char *key) {
  if (!ks__jv_is(obj, KS__JV_OBJECT) || !key) return NULL;
  long at = find_key(obj, key);
  return at < 0 ? NULL : obj->items[at];
}

const char *ks__jv_string(const ks__jv *v) { return ks__jv_is(v, KS__JV_STRING) ? v->s : NULL; }

bool ks__jv_is_int(const ks__jv *v, int64_t *out) {
  if (!ks__jv_is(v, KS__JV_INT)) return false;
  if (out) *out = v->i;
  return true;
}

bool ks__jv_is_number(const ks__jv *v, double *out) {
  if (!v || (v->type != KS__JV_INT && v->type != KS__JV_REAL)) return false;
  if (out) *out = v->type == KS__JV_INT ? (double)v->i : v->d;
  return true;
}

bool ks__jv_equal(const ks__jv *x, const ks__jv *y) {
  if (!x || !y || x->type != y->type) return false;
  switch (x->type) {
  case KS__JV_NULL: return true;
  case KS__JV_BOOL: return x->b == y->b;
  case KS__JV_INT: return x->i == y->i;
  case KS__JV_REAL: return x->d == y->d;
  case KS__JV_STRING: return x->len == y->len && !memcmp(x->s, y->s, x->len);
  case KS__JV_ARRAY:
    if (x->len != y->len) return false;
    for (size_t i = 0; i < x->len; i++)
      if (!ks__jv_equal(x->items[i], y->items[i])) return false;
    return true;
  case KS__JV_OBJECT:
    if (x->len != y->len) return false;
    for (size_t i = 0; i < x->len; i++)
      if (!ks__jv_equal(x->items[i], ks__jv_get(y, x->keys[i]))) return false;
    return true;
  }
  return false;
}

ks__jv *ks__jv_copy(const ks_allocator *a, const ks__jv *v) {
  if (!v) return NULL;
  if (v->type == KS__JV_STRING) return jv_strn(a, v->s, v->len);
  ks__jv *c = jv_new(a, v->type);
  if (!c) return NULL;
  c->b = v->b, c->i = v->i, c->d = v->d;
  ks_status s = KS_OK;
  for (size_t i = 0; i < v->len && !s; i++)
    s = v->type == KS__JV_OBJECT ? ks__jv_set(a, c, v->keys[i], ks__jv_copy(a, v->items[i]))
                                 : ks__jv_push(a, c, ks__jv_copy(a, v->items[i]));
  if (s) ks__jv_free(a, c), c = NULL;
  return c;
}

/* obj's members in order, each copied, without those drop(ctx, key) names. */
static ks__jv *copy_without(const ks_allocator *a, const ks__jv *obj, int (*drop)(void *, const char *), void *ctx) {
  ks__jv *c = ks__jv_object(a);
  for (size_t i = 0; c && i < obj->len; i++)
    if (!drop(ctx, obj->keys[i]) && ks__jv_set(a, c, obj->keys[i], ks__jv_copy(a, obj->items[i])))
      ks__jv_free(a, c), c = NULL;
  return c;
}

ks__jv *ks__jv_copy_pruned(const ks_allocator *a, const ks__jv *doc, const char *member,
                           int (*drop)(void *ctx, const char *key), void *ctx) {
  if (!ks__jv_is(doc, KS__JV_OBJECT)) return ks__jv_copy(a, doc);
  ks__jv *out = ks__jv_object(a);
  for (size_t i = 0; out && i < doc->len; i++) {
    const ks__jv *v = doc->items[i];
    int prune = !strcmp(doc->keys[i], member) && ks__jv_is(v, KS__JV_OBJECT);
    ks__jv *copy = prune ? copy_without(a, v, drop, ctx) : ks__jv_copy(a, v);
    if (ks__jv_set(a, out, doc->keys[i], copy)) ks__jv_free(a, out), out = NULL;
  }
  return out;
}

/* ---- parsing ---- */

static KS_NODISCARD ks_status parse_value(ks__json *j, int depth, ks__jv **out);

static KS_NODISCARD ks_status nomem(ks__json *j) { return ks__err(j->err, KS_E_NOMEM, "out of memory parsing JSON"); }

static bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }

size_t ks__json_number_len(const uint8_t *s, size_t n, bool *real) {
  size_t p = 0;
  *real = false;
  if (p < n && s[p] == '-') p++;
  if (p >= n || !is_digit(s[p])) return 0;
  if (s[p] == '0') p++;
  else
    while (p < n && is_digit(s[p])) p++;
  if (p < n && s[p] == '.') {
    *real = true;
    if (++p >= n || !is_digit(s[p])) return 0;
    while (p < n && is_digit(s[p])) p++;
  }
  if (p < n && (s[p] == 'e' || s[p] == 'E')) {
    *real = true;
    if (++p < n && (s[p] == '+' || s[p] == '-')) p++;
    if (p >= n || !is_digit(s[p])) return 0;
    while (p < n && is_digit(s[p])) p++;
  }
  return p;
}

/* Integer literal into int64, false on overflow. */
static bool parse_i64(const char *t, int64_t *out) {
  bool neg = *t == '-';
  uint64_t v = 0, lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
  for (t += neg; *t; t++) {
    uint64_t d = (uint64_t)(*t - '0');
    if (v > (lim - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = neg ? (int64_t)(0 - v) : (int64_t)v;
  return true;
}

/* strtod reads the locale's decimal separator, so the '.' is rewritten to it first. */
static double parse_real(char *t) {
  const char *dp = localeconv()->decimal_point;
  if (dp && dp[0] && dp[0] != '.' && !dp[1]) {
    char *q = strchr(t, '.');
    if (q) *q = dp[0];
  }
  return strtod(t, NULL);
}

static KS_NODISCARD ks_status parse_number(ks__json *j, ks__jv **out) {
  bool real;
  size_t n = ks__json_number_len(j->s + j->pos, j->n - j->pos, &real);
  if (n == 0) return ks__json_fail(j, KS_E_FORMAT, NULL, "JSON: malformed number");
  if (n > MAX_NUMBER)
    return ks__json_fail(j, KS_E_FORMAT, NULL, "JSON: number literal longer than %d bytes", MAX_NUMBER);
  char t[MAX_NUMBER + 1];
  memcpy(t, j->s + j->pos, n);
  t[n] = '\0';
  int64_t i;
  if (!real && parse_i64(t, &i)) {
    *out = ks__jv_int(j->alloc, i);
  } else {
    double d = parse_real(t);
    if (!isfinite(d)) return ks__json_fail(j, KS_E_FORMAT, NULL, "JSON: number out of range");
    *out = ks__jv_real(j->alloc, d);
  }
  if (!*out) return nomem(j);
  j->pos += n;
  return KS_OK;
}

static KS_NODISCARD ks_status parse_literal(ks__json *j, ks__jv **out) {
  static const char *const words[] = {"true", "false", "null"};
  for (int w = 0; w < 3; w++) {
    size_t n = strlen(words[w]);
    if (j->n - j->pos < n || memcmp(j->s + j->pos, words[w], n)) continue;
    j->pos += n;
    *out = w == 2 ? ks__jv_null(j->alloc) : ks__jv_bool(j->alloc, w == 0);
    return *out ? KS_OK : nomem(j);
  }
  return ks__json_fail(j, KS_E_FORMAT, NULL, "JSON: value expected");
}

static KS_NODISCARD ks_status parse_member(ks__json *j, int depth, ks__jv *obj, const char *key, size_t klen) {
  if (memchr(key, '\0', klen)) return ks__json_fail(j, KS_E_FORMAT, NULL, "JSON: key with a NUL character");
  char *k = ks__strndup(j->alloc, key, klen); /* the key's buffer is reused by nested values */
  if (!k) return nomem(j);
  ks__jv *v = NULL;
  ks_status s = ks__jv_get(obj, k) ? ks__json_fail(j, KS_E_FORMAT, k, "JSON: duplicate key '%s'", k)
                                   : parse_value(j, depth + 1, &v);
  if (!s) s = ks__jv_set(j->alloc, obj, k, v) ? nomem(j) : KS_OK;
  ks__free(j->alloc, k);
  return s;
}

static KS_NODISCARD ks_status parse_object(ks__json *j, int depth, ks__jv *obj) {
  bool first = true, done = false;
  while (1) {
    const char *key;
    size_t klen;
    ks_status s = ks__json_next_key(j, &first, &done, &key, &klen);
    if (s || done) return s;
    if ((s = parse_member(j, depth, obj, key, klen)) != KS_OK) return s;
  }
}

static KS_NODISCARD ks_status parse_array(ks__json *j, int depth, ks__jv *arr) {
  ks_status s = ks__json_expect(j, '[');
  if (s || ks__json_peek(j, ']')) return s ? s : (j->pos++, KS_OK);
  while (1) {
    ks__jv *v = NULL;
    if ((s = parse_value(j, depth + 1, &v)) != KS_OK) return s;
    if (ks__jv_push(j->alloc, arr, v)) return nomem(j);
    if (ks__json_peek(j, ']')) return j->pos++, KS_OK;
    if ((s = ks__json_expect(j, ',')) != KS_OK) return s;
  }
}

static KS_NODISCARD ks_status parse_container(ks__json *j, int depth, ks__jv_type t, ks__jv **out) {
  ks__jv *c = t == KS__JV_OBJECT ? ks__jv_object(j->alloc) : ks__jv_array(j->alloc);
  if (!c) return nomem(j);
  ks_status s = t == KS__JV_OBJECT ? parse_object(j, depth, c) : parse_array(j, depth, c);
  if (s) ks__jv_free(j->alloc, c), c = NULL;
  *out = c;
  return s;
}

static KS_NODISCARD ks_status parse_value(ks__json *j, int depth, ks__jv **out) {
  if (depth > MAX_DEPTH) return ks__json_fail(j, KS_E_FORMAT, NULL, "JSON: nested deeper than %d", MAX_DEPTH);
  ks__json_ws(j);
  if (j->pos >= j->n) return ks__json_fail(j, KS_E_FORMAT, NULL, "JSON: value expected before the end");
  uint8_t c = j->s[j->pos];
  if (c == '{') return parse_container(j, depth, KS__JV_OBJECT, out);
  if (c == '[') return parse_container(j, depth, KS__JV_ARRAY, out);
  if (c == '-' || is_digit(c)) return parse_number(j, out);
  if (c != '"') return parse_literal(j, out);
  const char *s;
  size_t n;
  ks_status st = ks__json_string(j, &j->vbuf, &s, &n);
  if (st) return st;
  *out = jv_strn(j->alloc, s, n);
  return *out ? KS_OK : nomem(j);
}

ks_status ks__jv_parse(const ks_allocator *a, const char *text, size_t n, const char *what, ks__jv **out,
                       ks_error *err) {
  ks__json j;
  ks__json_init(&j, text, n, 0, NULL, a, err);
  ks__jv *v = NULL;
  ks_status s = parse_value(&j, 0, &v);
  if (!s) s = ks__json_end(&j);
  ks__json_free(&j);
  if (s) {
    ks__jv_free(a, v);
    if (what) ks__err_set_key(err, what);
    return s;
  }
  *out = v;
  return KS_OK;
}

/* ---- writing ---- */

static int key_order(const void *pa, const void *pb) {
  return strcmp(**(const char *const *const *)pa, **(const char *const *const *)pb);
}

/* Newline and `depth` levels of `indent` spaces; nothing in compact output. */
static void newline(ks__sbuf *b, int indent, int depth) {
  if (indent <= 0) return;
  ks__sbuf_putc(b, '\n');
  for (long i = 0; i < (long)indent * depth; i++) ks__sbuf_putc(b, ' ');
}

static void write_value(ks__sbuf *b, const ks__jv *v, bool sort, int indent, int depth);

static void write_object(ks__sbuf *b, const ks__jv *v, bool sort, int indent, int depth) {
  const char **order = NULL;
  if (sort && v->len > 1) {
    order = ks__malloc(b->alloc, v->len * sizeof *order); /* len is bounded by an existing array */
    if (!order) {
      b->failed = true;
      return;
    }
    for (size_t i = 0; i < v->len; i++) order[i] = (const char *)&v->keys[i];
    qsort(order, v->len, sizeof *order, key_order);
  }
  ks__sbuf_putc(b, '{');
  for (size_t n = 0; n < v->len; n++) {
    size_t i = order ? (size_t)((char *const *)(const void *)order[n] - v->keys) : n;
    if (n) ks__sbuf_putc(b, ',');
    newline(b, indent, depth + 1);
    ks__sbuf_put_json_str(b, v->keys[i], strlen(v->keys[i]));
    ks__sbuf_puts(b, indent > 0 ? ": " : ":");
    write_value(b, v->items[i], sort, indent, depth + 1);
  }
  if (v->len) newline(b, indent, depth);
  ks__sbuf_putc(b, '}');
  ks__free(b->alloc, order);
}

static void write_array(ks__sbuf *b, const ks__jv *v, bool sort, int indent, int depth) {
  ks__sbuf_putc(b, '[');
  for (size_t i = 0; i < v->len; i++) {
    if (i) ks__sbuf_putc(b, ',');
    newline(b, indent, depth + 1);
    write_value(b, v->items[i], sort, indent, depth + 1);
  }
  if (v->len) newline(b, indent, depth);
  ks__sbuf_putc(b, ']');
}

static void write_value(ks__sbuf *b, const ks__jv *v, bool sort, int indent, int depth) {
  switch (v->type) {
  case KS__JV_NULL: ks__sbuf_puts(b, "null"); break;
  case KS__JV_BOOL: ks__sbuf_puts(b, v->b ? "true" : "false"); break;
  case KS__JV_INT: ks__sbuf_put_i64(b, v->i); break;
  case KS__JV_REAL: /* JSON has no inf/nan */
    if (isfinite(v->d)) ks__sbuf_put_double(b, v->d);
    else ks__sbuf_puts(b, "null");
    break;
  case KS__JV_STRING: ks__sbuf_put_json_str(b, v->s, v->len); break;
  case KS__JV_ARRAY: write_array(b, v, sort, indent, depth); break;
  case KS__JV_OBJECT: write_object(b, v, sort, indent, depth); break;
  }
}

char *ks__jv_dump(const ks_allocator *a, const ks__jv *v, bool sort_keys) {
  return ks__jv_dump_indented(a, v, sort_keys, 0);
}

char *ks__jv_dump_indented(const ks_allocator *a, const ks__jv *v, bool sort_keys, int indent) {
  ks__sbuf b;
  ks__sbuf_init(&b, a);
  write_value(&b, v, sort_keys, indent, 0);
  ks__sbuf_putc(&b, '\0');
  if (b.failed) {
    ks__sbuf_free(&b);
    return NULL;
  }
  return b.p; /* the buffer is the caller's now */
}
