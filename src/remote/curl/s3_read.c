/* The reading side of the remote tables: open (HEAD), ranged reads (shared with HTTP), stat, listing, pointers. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "remote/curl/curl_internal.h"


/* The validator of an answer: its ETag, else its Last-Modified; *strong when it is a strong ETag. */
static void validator_of(const ks__resp *p, char *out, size_t cap, int *strong) {
  *strong = 0;
  out[0] = '\0';
  if (!p) return;
  if (p->etag[0] && strlen(p->etag) < cap) {
    snprintf(out, cap, "%s", p->etag);
    *strong = strncmp(p->etag, "W/", 2) != 0;
  } else if (p->last_modified[0] && strlen(p->last_modified) < cap) {
    snprintf(out, cap, "%s", p->last_modified);
  }
}

int ks__remote_open_url(ks__remote *r, char *url, uint64_t size, const ks__resp *p, int *fd) {
  ks__slot *s;
  int rc = ks__slot_new(r, fd, &s);
  if (rc) {
    ks__free(&r->alloc, url);
    return rc;
  }
  s->reading = 1;
  s->path = url;
  s->size = size;
  validator_of(p, s->validator, sizeof s->validator, &s->strong_etag);
  return 0;
}

int ks__remote_validator_fn(void *ctx, int fd, char *buf, size_t cap) {
  ks__remote *r = ctx;
  ks__slot *s = ks__slot_get(r, fd);
  if (!s || !s->reading) return EBADF;
  if (!s->validator[0]) return ENOTSUP;
  if (!buf || strlen(s->validator) >= cap) return ENAMETOOLONG;
  snprintf(buf, cap, "%s", s->validator);
  return 0;
}

/* HEAD of url: 0 with *p filled (the caller frees it), or an errno value. dl: the operation's deadline (0: now). */
static int head(ks__remote *r, const char *url, ks__resp *p, unsigned quiet, uint64_t dl) {
  ks__req q = {.method = "HEAD", .url = url, .deadline = dl};
  return ks__http_do(r, &q, p, quiet);
}

/* The object's size from a HEAD answer: present, and no more than S3's largest object. */
static int object_size(ks__remote *r, const char *url, const ks__resp *p, uint64_t *size) {
  if (!p->has_length) {
    ks__remote_fail(r, "HEAD %s: no Content-Length", url);
    return EIO;
  }
  if (p->content_length > KS__OBJECT_MAX) {
    ks__remote_fail_as(r, KS_E_LIMIT, "HEAD %s: Content-Length %llu exceeds the largest object size (5 TiB)", url,
                       (unsigned long long)p->content_length);
    return EFBIG;
  }
  *size = p->content_length;
  return 0;
}

/* The pointer object at url: its target into buf (cap bytes, NUL-terminated). */
static int get_pointer(ks__remote *r, const char *url, char *buf, size_t cap, size_t *len, uint64_t dl) {
  ks__req q = {.method = "GET", .url = url, .max_body = KS__POINTER_MAX, .deadline = dl};
  ks__resp p;
  int rc = ks__http_do(r, &q, &p, 0);
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
  return rc;
}

/* The path a pointer at `path` names: its target, relative to the pointer's own prefix. */
static int pointer_target(ks__remote *r, const char *path, const char *target, char **out) {
  const char *slash = strrchr(path, '/');
  size_t dl = slash ? (size_t)(slash - path) + 1 : 0, n = dl + strlen(target) + 1;
  if (!(*out = ks__malloc(&r->alloc, n))) return ENOMEM;
  snprintf(*out, n, "%.*s%s", (int)dl, path, target);
  return 0;
}

/* HEAD of path, following pointer objects (as open(2) follows symbolic links): *url, *p of the object. */
static int head_following(ks__remote *r, const char *path, char **url, ks__resp *p) {
  uint64_t dl = ks__remote_deadline(r); /* one deadline for the pointers and the object */
  *p = (ks__resp){0};
  char *cur = ks__strdup(&r->alloc, path), target[KS__POINTER_MAX + 1];
  int rc = cur ? 0 : ENOMEM;
  for (unsigned hops = 0; !rc; hops++) {
    size_t tl;
    char *next = NULL;
    if ((rc = ks__s3_url(r, cur, NULL, url)) != 0) break;
    rc = head(r, *url, p, 0, dl);
    if (rc || !p->pointer) break;
    ks__resp_free(p);
    if (hops == KS__POINTER_HOPS) {
      ks__remote_fail_as(r, KS_E_LIMIT, "HEAD %s: more than %d pointers in a row (a loop?)", *url, KS__POINTER_HOPS);
      rc = ELOOP;
    }
    if (!rc) rc = get_pointer(r, *url, target, sizeof target, &tl, dl);
    if (!rc) rc = pointer_target(r, cur, target, &next);
    ks__free(&r->alloc, *url);
    *url = NULL;
    ks__free(&r->alloc, cur);
    cur = next;
  }
  ks__free(&r->alloc, cur);
  if (rc) {
    ks__resp_free(p);
    ks__free(&r->alloc, *url);
    *url = NULL;
  }
  return rc;
}

int ks__s3_open_fn(void *ctx, const char *path, int *fd, uint64_t *size) {
  ks__remote *r = ctx;
  char *url = NULL;
  ks__resp p;
  int rc = head_following(r, path, &url, &p);
  if (!rc) rc = object_size(r, url, &p, size);
  if (!rc) rc = ks__remote_open_url(r, url, *size, &p, fd); /* takes url */
  else ks__free(&r->alloc, url);
  ks__resp_free(&p);
  return rc;
}

typedef struct ranged {
  ks__remote *r;
  const ks__slot *s;
  uint8_t *buf;
  uint64_t off;
  size_t n, chunk;
} ranged;

/* One ranged GET of bytes [off, off+n) into buf; a short answer is an error (the transport retries it).
 * With the strong ETag open_fn saw, only bytes of that very object are taken: an object replaced since
 * (412) gives ESTALE, never a mix of two objects' bytes. */
static int get_range(ks__remote *r, const ks__slot *s, uint8_t *buf, uint64_t off, size_t n) {
  const char *url = s->path;
  char range[80], match[KS__VALIDATOR_MAX + 16];
  snprintf(range, sizeof range, "Range: bytes=%llu-%llu", (unsigned long long)off, (unsigned long long)(off + n - 1));
  snprintf(match, sizeof match, "If-Match: %s", s->validator);
  const char *h[] = {range, match};
  ks__req q = {.method = "GET", .url = url, .headers = h, .n_headers = s->strong_etag ? 2 : 1, .dst = buf,
               .dst_cap = n};
  ks__resp p;
  int rc = ks__http_do(r, &q, &p, KS__QUIET_412);
  if (rc == EEXIST) {
    ks__remote_fail(r, "GET %s (%s): the object changed since it was opened (ETag no longer %s)", url, range + 7,
                    s->validator);
    rc = ESTALE;
  }
  /* bytes of another range than the one asked (a 200 is the whole object: right only from byte 0) */
  if (!rc && ((p.status == 206 && (!p.has_range_span || p.range_first != off || p.range_last != off + n - 1)) ||
              (p.status != 206 && off != 0))) {
    ks__remote_fail(r, "GET %s (%s): HTTP %ld with bytes %llu-%llu, not the range asked", url, range + 7, p.status,
                    (unsigned long long)p.range_first, (unsigned long long)p.range_last);
    rc = EIO;
  }
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
  return get_range(g->r, g->s, g->buf + at, g->off + at, n);
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
  ranged g = {r, s, buf, off, n, chunk};
  size_t jobs = n / chunk + (n % chunk != 0);
  int rc = jobs > 1 && r->parallel > 1 ? ks__remote_parallel(r, jobs, range_job, &g) : get_range(r, s, buf, off, n);
  if (!rc) *got = n;
  return rc;
}

typedef struct lister {
  ks__remote *r;
  const char *strip; /* the key prefix of the listed directory, with its '/' */
  ks_io_list_cb cb;
  void *cb_ctx;
  int count_only, found;
  const char *keyprefix, *url; /* for the messages: what is listed, the page being read */
  uint64_t pages, keys, bytes; /* spent of the listing's budget (ks_storage_opts.list_max_*) */
} lister;

/* Fails a listing that went past one of its budgets: EOVERFLOW, naming the location, the URL and the limit. */
static int over_budget(lister *l, uint64_t limit, const char *what, const char *opt) {
  ks__remote_fail_as(l->r, KS_E_LIMIT, "listing s3://%s/%s (GET %s): more than %llu %s (ks_storage_opts.%s)",
                     l->r->bucket, l->keyprefix, l->url, (unsigned long long)limit, what, opt);
  return EOVERFLOW;
}

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
      if (++l->keys > l->r->list_keys) return over_budget(l, l->r->list_keys, "entries", "list_max_keys");
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

/* Every page of a listing, within one deadline and the budgets of pages, entries and bytes. */
static int list_pages(ks__remote *r, const char *keyprefix, lister *l) {
  char token[1024] = "";
  int rc = 0;
  uint64_t dl = ks__remote_deadline(r);
  l->keyprefix = keyprefix;
  for (;;) {
    char *q = NULL, *url = NULL;
    rc = list_query(r, token[0] ? token : NULL, keyprefix, l->count_only, &q);
    size_t n = rc ? 0 : strlen(r->base) + strlen(q) + 4;
    if (!rc && !(url = ks__malloc(&r->alloc, n))) rc = ENOMEM;
    if (!rc) snprintf(url, n, "%s/?%s", r->base, q);
    ks__free(&r->alloc, q);
    if (rc) return rc;
    l->url = url;
    if (l->pages++ >= r->list_pages) {
      rc = over_budget(l, r->list_pages, "pages", "list_max_pages");
      ks__free(&r->alloc, url);
      return rc;
    }
    ks__req rq = {.method = "GET", .url = url, .max_body = KS__LIST_BODY_MAX, .deadline = dl};
    ks__resp p;
    rc = ks__http_do(r, &rq, &p, 0);
    const char *x = p.body ? (const char *)p.body : "";
    size_t pos = 0, vl;
    const char *v;
    l->bytes += p.len;
    if (!rc && l->bytes > r->list_bytes) rc = over_budget(l, r->list_bytes, "bytes", "list_max_bytes");
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
  rc = head(r, url, &p, 1, 0);
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
  rc = get_pointer(r, url, buf, cap, len, 0);
  ks__free(&r->alloc, url);
  return rc;
}
