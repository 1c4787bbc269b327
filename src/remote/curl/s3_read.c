/* The reading side of the remote tables: open (HEAD), ranged reads (shared with HTTP), stat, listing, pointers. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "remote/curl/curl_internal.h"

#define LIST_PAGES_MAX 100000 /* 10^8 keys: a listing that never ends is an error, not a hang */

int ks__remote_open_url(ks__remote *r, char *url, uint64_t size, int *fd) {
  ks__slot *s;
  int rc = ks__slot_new(r, fd, &s);
  if (rc) {
    ks__free(&r->alloc, url);
    return rc;
  }
  s->reading = 1;
  s->path = url;
  s->size = size;
  return 0;
}

/* HEAD of url: 0 with *p filled (the caller frees it), or an errno value. */
static int head(ks__remote *r, const char *url, ks__resp *p, int quiet) {
  ks__req q = {.method = "HEAD", .url = url};
  return ks__http_do(r, &q, p, quiet);
}

int ks__s3_open_fn(void *ctx, const char *path, int *fd, uint64_t *size) {
  ks__remote *r = ctx;
  char *url = NULL;
  int rc = ks__s3_url(r, path, NULL, &url);
  if (rc) return rc;
  ks__resp p;
  rc = head(r, url, &p, 0);
  if (!rc && !p.has_length) {
    ks__remote_fail(r, "HEAD %s: no Content-Length", url);
    rc = EIO;
  }
  ks__resp_free(&p);
  if (rc) {
    ks__free(&r->alloc, url);
    return rc;
  }
  *size = p.content_length;
  return ks__remote_open_url(r, url, p.content_length, fd);
}

typedef struct ranged {
  ks__remote *r;
  const char *url;
  uint8_t *buf;
  uint64_t off;
  size_t n, chunk;
} ranged;

/* One ranged GET of bytes [off, off+n) into buf; a short answer is an error (the transport retries it). */
static int get_range(ks__remote *r, const char *url, uint8_t *buf, uint64_t off, size_t n) {
  char range[80];
  snprintf(range, sizeof range, "Range: bytes=%llu-%llu", (unsigned long long)off, (unsigned long long)(off + n - 1));
  const char *h[] = {range};
  ks__req q = {.method = "GET", .url = url, .headers = h, .n_headers = 1, .dst = buf, .dst_cap = n};
  ks__resp p;
  int rc = ks__http_do(r, &q, &p, 0);
  if (!rc && p.dst_len != n) {
    ks__remote_fail(r, "GET %s (%s): %zu bytes instead of %zu", url, range + 7, p.dst_len, n);
    rc = EIO;
  }
  ks__resp_free(&p);
  return rc;
}

static int range_job(void *ctx, size_t i) {
  ranged *g = ctx;
  size_t at = i * g->chunk, n = g->n - at < g->chunk ? g->n - at : g->chunk;
  return get_range(g->r, g->url, g->buf + at, g->off + at, n);
}

/* Large reads (a full load) go as parallel ranges of part_size bytes. */
int ks__remote_read_fn(void *ctx, int fd, void *buf, size_t n, uint64_t off, size_t *got) {
  ks__remote *r = ctx;
  ks__slot *s = ks__slot_get(r, fd);
  if (!s || !s->reading) return EBADF;
  *got = 0;
  if (off >= s->size || n == 0) return 0;
  if ((uint64_t)n > s->size - off) n = (size_t)(s->size - off);
  size_t chunk = r->part_size > SIZE_MAX ? SIZE_MAX : (size_t)r->part_size;
  ranged g = {r, s->path, buf, off, n, chunk};
  size_t jobs = n / chunk + (n % chunk != 0);
  int rc = jobs > 1 && r->parallel > 1 ? ks__remote_parallel(r, jobs, range_job, &g) : get_range(r, s->path, buf, off, n);
  if (!rc) *got = n;
  return rc;
}

typedef struct lister {
  ks__remote *r;
  const char *strip; /* the key prefix of the listed directory, with its '/' */
  ks_io_list_cb cb;
  void *cb_ctx;
  int count_only, found;
} lister;

/* Calls the callback for each <Contents><Key> and <CommonPrefixes><Prefix> of one page. */
static int list_page(lister *l, const char *x, size_t n) {
  static const struct { const char *block, *tag; ks_io_kind kind; } kinds[] = {
      {"Contents", "Key", KS_IO_FILE}, {"CommonPrefixes", "Prefix", KS_IO_DIR}};
  char name[2048];
  size_t sl = strlen(l->strip);
  for (size_t k = 0; k < 2; k++) {
    size_t pos = 0, bl;
    const char *b;
    while (!ks__xml_next(x, n, &pos, kinds[k].block, &b, &bl)) {
      size_t ip = 0, vl;
      const char *v;
      if (ks__xml_next(b, bl, &ip, kinds[k].tag, &v, &vl) || ks__xml_text(v, vl, name, sizeof name)) return EIO;
      if (strncmp(name, l->strip, sl)) continue;
      char *rel = name + sl;
      size_t rl = strlen(rel);
      if (kinds[k].kind == KS_IO_DIR && rl && rel[rl - 1] == '/') rel[--rl] = '\0';
      if (!rl) continue;
      l->found = 1;
      if (l->count_only) return 0;
      int rc = l->cb(l->cb_ctx, rel, kinds[k].kind);
      if (rc) return rc;
    }
  }
  return 0;
}

/* The ListObjectsV2 query (parameters in canonical, sorted order, as SigV4 signs them). */
static int list_query(ks__remote *r, const char *token, const char *prefix, int one, char **q) {
  char *ep = NULL, *et = NULL;
  int rc = ks__url_encode(&r->alloc, prefix, 0, &ep);
  if (!rc && token) rc = ks__url_encode(&r->alloc, token, 0, &et);
  if (!rc) {
    size_t n = strlen(ep) + (et ? strlen(et) : 0) + 96;
    if (!(*q = ks__malloc(&r->alloc, n))) rc = ENOMEM;
    else
      snprintf(*q, n, "%s%s%sdelimiter=%%2F&list-type=2%s&prefix=%s", et ? "continuation-token=" : "", et ? et : "",
               et ? "&" : "", one ? "&max-keys=1" : "", ep);
  }
  ks__free(&r->alloc, ep);
  ks__free(&r->alloc, et);
  return rc;
}

static int list_pages(ks__remote *r, const char *keyprefix, lister *l) {
  char token[1024] = "";
  int rc = 0;
  for (size_t page = 0; page < LIST_PAGES_MAX; page++) {
    char *q = NULL, *url = NULL;
    rc = list_query(r, token[0] ? token : NULL, keyprefix, l->count_only, &q);
    size_t n = rc ? 0 : strlen(r->base) + strlen(q) + 4;
    if (!rc && !(url = ks__malloc(&r->alloc, n))) rc = ENOMEM;
    if (!rc) snprintf(url, n, "%s/?%s", r->base, q);
    ks__free(&r->alloc, q);
    if (rc) return rc;
    ks__req rq = {.method = "GET", .url = url, .max_body = KS__LIST_BODY_MAX};
    ks__resp p;
    rc = ks__http_do(r, &rq, &p, 0);
    const char *x = p.body ? (const char *)p.body : "";
    size_t pos = 0, vl;
    const char *v;
    if (!rc) rc = list_page(l, x, p.len);
    int more = !rc && !l->count_only && !ks__xml_next(x, p.len, &pos, "IsTruncated", &v, &vl) && vl == 4 &&
               !memcmp(v, "true", 4);
    pos = 0;
    if (more && (ks__xml_next(x, p.len, &pos, "NextContinuationToken", &v, &vl) ||
                 ks__xml_text(v, vl, token, sizeof token))) {
      ks__remote_fail(r, "GET %s: truncated listing without a usable continuation token", url);
      rc = EIO;
    }
    ks__resp_free(&p);
    ks__free(&r->alloc, url);
    if (rc || !more) return rc;
  }
  ks__remote_fail(r, "listing %s: more than %d pages", keyprefix, LIST_PAGES_MAX);
  return EIO;
}

static int list_dir(ks__remote *r, const char *dir, const char *prefix, lister *l) {
  char *key = NULL;
  int rc = ks__s3_key(r, dir, &key);
  if (rc) return rc;
  size_t n = strlen(key) + strlen(prefix) + 2;
  char *strip = ks__malloc(&r->alloc, n), *kp = ks__malloc(&r->alloc, n);
  if (!strip || !kp) rc = ENOMEM;
  else {
    snprintf(strip, n, "%s%s", key, key[0] ? "/" : "");
    snprintf(kp, n, "%s%s", strip, prefix);
    l->strip = strip;
    rc = list_pages(r, kp, l);
  }
  ks__free(&r->alloc, key);
  ks__free(&r->alloc, strip);
  ks__free(&r->alloc, kp);
  return rc;
}

int ks__s3_list_fn(void *ctx, const char *dir, const char *prefix, ks_io_list_cb cb, void *cb_ctx) {
  lister l = {.r = ctx, .cb = cb, .cb_ctx = cb_ctx};
  return list_dir(ctx, dir, prefix ? prefix : "", &l);
}

/* An object (HEAD), else a prefix with something under it (a directory), else ENOENT. */
int ks__s3_stat_fn(void *ctx, const char *path, ks_io_stat *st) {
  ks__remote *r = ctx;
  char *key = NULL, *url = NULL;
  int rc = ks__s3_key(r, path, &key), root = !rc && !key[0];
  ks__free(&r->alloc, key);
  if (rc) return rc;
  if (root) {
    *st = (ks_io_stat){KS_IO_DIR, 0};
    return 0;
  }
  if ((rc = ks__s3_url(r, path, NULL, &url)) != 0) return rc;
  ks__resp p;
  rc = head(r, url, &p, 1);
  ks__free(&r->alloc, url);
  if (!rc) *st = (ks_io_stat){p.pointer ? KS_IO_LINK : KS_IO_FILE, p.content_length};
  ks__resp_free(&p);
  if (rc != ENOENT) return rc;
  lister l = {.r = r, .count_only = 1};
  rc = list_dir(r, path, "", &l);
  if (!rc && !l.found) return ENOENT;
  if (!rc) *st = (ks_io_stat){KS_IO_DIR, 0};
  return rc;
}

int ks__s3_readlink_fn(void *ctx, const char *path, char *buf, size_t cap, size_t *len) {
  ks__remote *r = ctx;
  char *url = NULL;
  int rc = ks__s3_url(r, path, NULL, &url);
  if (rc) return rc;
  ks__req q = {.method = "GET", .url = url, .max_body = KS__POINTER_MAX};
  ks__resp p;
  rc = ks__http_do(r, &q, &p, 0);
  if (!rc && !p.pointer) rc = EINVAL; /* not a pointer object: like readlink(2) of a regular file */
  if (!rc && p.len >= cap) rc = ENAMETOOLONG;
  if (!rc && (p.len == 0 || memchr(p.body, '\0', p.len) || memchr(p.body, '/', p.len))) {
    ks__remote_fail(r, "GET %s: not a valid pointer (empty, or a NUL or '/' in the target)", url);
    rc = EINVAL;
  }
  if (!rc) {
    memcpy(buf, p.body, p.len);
    buf[p.len] = '\0';
    *len = p.len;
  }
  ks__resp_free(&p);
  ks__free(&r->alloc, url);
  return rc;
}
