/* Small pieces of the remote backends: bounded XML scanning, URL encoding, the handle table. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "remote/curl/curl_internal.h"

#define SLOTS_MAX 4096 /* open handles of one storage object */

static const char *find(const char *s, size_t n, size_t from, const char *needle) {
  size_t k = strlen(needle);
  for (size_t i = from; i + k <= n; i++)
    if (s[i] == needle[0] && !memcmp(s + i, needle, k)) return s + i;
  return NULL;
}

int ks__xml_next(const char *s, size_t n, size_t *pos, const char *tag, const char **v, size_t *vlen) {
  char open[80], close[80];
  if (snprintf(open, sizeof open, "<%s>", tag) >= (int)sizeof open) return -1;
  snprintf(close, sizeof close, "</%s>", tag);
  const char *a = find(s, n, *pos, open);
  if (!a) return -1;
  size_t start = (size_t)(a - s) + strlen(open);
  const char *b = find(s, n, start, close);
  if (!b) return -1;
  *v = s + start;
  *vlen = (size_t)(b - (s + start));
  *pos = (size_t)(b - s) + strlen(close);
  return 0;
}

static int entity(const char *v, size_t n, size_t *used, char *c) {
  static const struct { const char *e; char c; } ents[] = {{"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'},
                                                           {"&quot;", '"'}, {"&apos;", '\''}};
  for (size_t i = 0; i < sizeof ents / sizeof ents[0]; i++) {
    size_t k = strlen(ents[i].e);
    if (n >= k && !memcmp(v, ents[i].e, k)) {
      *used = k;
      *c = ents[i].c;
      return 0;
    }
  }
  /* &#NN; and &#xHH; (ASCII only: S3 escapes control characters this way) */
  if (n < 4 || v[1] != '#') return -1;
  int hex = v[2] == 'x', base = hex ? 16 : 10;
  unsigned x = 0;
  size_t i = hex ? 3 : 2;
  for (; i < n && i < 8 && v[i] != ';'; i++) {
    int d = v[i] >= '0' && v[i] <= '9'                        ? v[i] - '0'
            : hex && (v[i] | 32) >= 'a' && (v[i] | 32) <= 'f' ? (v[i] | 32) - 'a' + 10
                                                              : -1;
    if (d < 0) return -1;
    x = x * (unsigned)base + (unsigned)d;
  }
  if (i >= n || v[i] != ';' || x == 0 || x > 127) return -1;
  *used = i + 1;
  *c = (char)x;
  return 0;
}

int ks__xml_text(const char *v, size_t vlen, char *out, size_t cap) {
  size_t o = 0;
  for (size_t i = 0; i < vlen;) {
    char c = v[i];
    size_t used = 1;
    if (c == '&' && entity(v + i, vlen - i, &used, &c)) return -1;
    if (o + 1 >= cap) return -1;
    out[o++] = c;
    i += used;
  }
  if (!cap) return -1;
  out[o] = '\0';
  return 0;
}

int ks__url_encode(const ks_allocator *a, const char *s, int keep_slash, char **out) {
  static const char hex[] = "0123456789ABCDEF";
  size_t n = strlen(s);
  if (n > (SIZE_MAX - 1) / 3) return ENAMETOOLONG;
  char *o = ks__malloc(a, 3 * n + 1), *p = o;
  if (!o) return ENOMEM;
  for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
    int plain = (*c >= 'A' && *c <= 'Z') || (*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '-' ||
                *c == '_' || *c == '.' || *c == '~' || (keep_slash && *c == '/');
    if (plain) *p++ = (char)*c;
    else {
      *p++ = '%';
      *p++ = hex[*c >> 4];
      *p++ = hex[*c & 15];
    }
  }
  *p = '\0';
  *out = o;
  return 0;
}

int ks__slot_new(ks__remote *r, int *fd, ks__slot **out) {
  ks__slot *s = ks__calloc(&r->alloc, 1, sizeof *s);
  if (!s) return ENOMEM;
  s->used = 1;
  int rc = 0;
  pthread_mutex_lock(&r->lock);
  size_t i = 0;
  while (i < r->nslots && r->slots[i]) i++;
  if (i == r->nslots) {
    if (r->nslots >= SLOTS_MAX) rc = EMFILE;
    else if (ks__grow(&r->alloc, &r->slots, &r->slots_cap, r->nslots + 1, sizeof *r->slots)) rc = ENOMEM;
    else r->slots[r->nslots++] = NULL;
  }
  if (!rc) r->slots[i] = s;
  pthread_mutex_unlock(&r->lock);
  if (rc) {
    ks__free(&r->alloc, s);
    return rc;
  }
  *fd = (int)i;
  *out = s;
  return 0;
}

ks__slot *ks__slot_get(ks__remote *r, int fd) {
  pthread_mutex_lock(&r->lock);
  ks__slot *s = fd >= 0 && (size_t)fd < r->nslots ? r->slots[fd] : NULL;
  pthread_mutex_unlock(&r->lock);
  return s;
}

ks__slot *ks__slot_take_staged(ks__remote *r, const char *path, int closed_only) {
  ks__slot *s = NULL;
  pthread_mutex_lock(&r->lock);
  for (size_t i = 0; i < r->nslots && !s; i++)
    if (r->slots[i] && !r->slots[i]->reading && (r->slots[i]->closed || !closed_only) &&
        !strcmp(r->slots[i]->path, path)) {
      s = r->slots[i];
      r->slots[i] = NULL;
    }
  pthread_mutex_unlock(&r->lock);
  return s;
}

void ks__slot_free(ks__remote *r, ks__slot *s) {
  if (!s) return;
  ks__free(&r->alloc, s->path);
  ks__free(&r->alloc, s->buf);
  ks__free(&r->alloc, s);
}

void ks__slot_release(ks__remote *r, int fd) {
  ks__slot *s = NULL;
  pthread_mutex_lock(&r->lock);
  if (fd >= 0 && (size_t)fd < r->nslots) {
    s = r->slots[fd];
    r->slots[fd] = NULL;
  }
  pthread_mutex_unlock(&r->lock);
  ks__slot_free(r, s);
}

int ks__slot_append(ks__remote *r, ks__slot *s, const void *buf, size_t n) {
  if (n > SIZE_MAX - s->len) return EFBIG;
  if (s->len + n > s->cap) {
    size_t cap = s->cap ? s->cap : 65536;
    while (cap < s->len + n) {
      if (cap > SIZE_MAX / 2) return EFBIG;
      cap *= 2;
    }
    uint8_t *b = ks__realloc(&r->alloc, s->buf, cap);
    if (!b) return ENOMEM;
    s->buf = b;
    s->cap = cap;
  }
  memcpy(s->buf + s->len, buf, n);
  s->len += n;
  return 0;
}
