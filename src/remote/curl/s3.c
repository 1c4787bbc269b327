/*
 * The S3 backend: opening an s3:// location and the parts of its ks_io table
 * that write. A file the library writes is staged in memory (create_fn,
 * write_fn) and uploaded only by rename_fn onto its final key, so an object's
 * name never shows a partial upload; a link (symlink_fn) becomes a pointer
 * object the same way. Reading, stat and listing are in s3_read.c.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "remote/curl/curl_internal.h"

#define DEFAULT_THRESHOLD ((uint64_t)64 << 20)
#define DEFAULT_PART ((uint64_t)16 << 20)
#define DEFAULT_DEADLINE_MS 300000L            /* one operation (a request and its retries, a listing) */
#define DEADLINE_MAX_MS (30L * 24 * 3600 * 1000) /* a month: "no deadline" in all but name */
#define DEFAULT_LIST_PAGES ((uint64_t)10000)   /* 10^7 keys at S3's 1000 a page */
#define DEFAULT_LIST_KEYS ((uint64_t)1000000)  /* far more checkpoints than a run directory holds */
#define DEFAULT_LIST_BYTES ((uint64_t)1 << 30) /* 1 GiB of XML (about 3M keys) */
#define DEFAULT_LOCK_TTL_MS 60000L             /* a lease without renewal: a dead holder's ends after a minute */
#define LOCK_TTL_MIN_MS 1000L                  /* the server's clock counts whole seconds */

int ks__s3_key(ks__remote *r, const char *path, char **key) {
  (void)r;
  while (path[0] == '.' && path[1] == '/') path += 2;
  while (path[0] == '/') path++;
  if (!strcmp(path, ".")) path = "";
  size_t n = strlen(path);
  while (n && path[n - 1] == '/') n--;
  *key = ks__strndup(&r->alloc, path, n);
  return *key ? 0 : ENOMEM;
}

int ks__s3_url(ks__remote *r, const char *path, const char *query, char **url) {
  char *key = NULL, *enc = NULL;
  int rc = ks__s3_key(r, path, &key);
  if (!rc) rc = ks__url_encode(&r->alloc, key, 1, &enc);
  if (!rc) {
    size_t n = strlen(r->base) + strlen(enc) + (query ? strlen(query) : 0) + 4;
    *url = ks__malloc(&r->alloc, n);
    if (!*url) rc = ENOMEM;
    else snprintf(*url, n, "%s/%s%s%s", r->base, enc, query ? "?" : "", query ? query : "");
  }
  ks__free(&r->alloc, key);
  ks__free(&r->alloc, enc);
  return rc;
}

/* A temporary name of the writers (".<name>.tmp-XXXXXX", ".latest.tmp"): only ever staged, never uploaded. */
static int is_staging_name(const char *path) {
  const char *slash = strrchr(path, '/');
  const char *base = slash ? slash + 1 : path;
  return base[0] == '.' && strstr(base, ".tmp") != NULL;
}

static int put_object(ks__remote *r, const char *url, const uint8_t *data, size_t len, int pointer) {
  const char *hp[] = {"Content-Type: application/x-keepsake-pointer", "x-amz-meta-keepsake-pointer: 1"};
  const char *hf[] = {"Content-Type: application/octet-stream"};
  ks__req q = {.method = "PUT", .url = url, .headers = pointer ? hp : hf, .n_headers = pointer ? 2 : 1,
               .body = data, .body_len = len};
  ks__resp p;
  int rc = ks__http_do(r, &q, &p, 0);
  ks__resp_free(&p);
  return rc;
}

/* Uploads data as the object at `path` (multipart above the threshold). pointer: mark it as a pointer object. */
static int s3_upload(ks__remote *r, const char *path, const uint8_t *data, size_t len, int pointer) {
  char *url = NULL;
  int rc = ks__s3_url(r, path, NULL, &url);
  if (rc) return rc;
  if (!pointer && (uint64_t)len >= r->threshold) rc = ks__s3_multipart(r, url, data, len);
  else rc = put_object(r, url, data, len, pointer);
  ks__free(&r->alloc, url);
  return rc;
}

static int s3_create(void *ctx, const char *path, int *fd) {
  ks__remote *r = ctx;
  ks__slot *s;
  int rc = ks__slot_new(r, fd, &s);
  if (rc) return rc;
  if (!(s->path = ks__strdup(&r->alloc, path))) {
    ks__slot_release(r, *fd);
    return ENOMEM;
  }
  return 0;
}

static int s3_write(void *ctx, int fd, const void *buf, size_t n, size_t *written) {
  ks__remote *r = ctx;
  ks__slot *s = ks__slot_get(r, fd);
  if (!s || s->reading || s->closed) return EBADF;
  int rc = ks__slot_append(r, s, buf, n);
  *written = rc ? 0 : n;
  return rc;
}

/* Nothing is durable before the upload; the upload itself is (S3 acknowledges stored objects). */
static int s3_fsync(void *ctx, int fd) {
  ks__slot *s = ks__slot_get(ctx, fd);
  return s ? 0 : EBADF;
}

static int s3_close(void *ctx, int fd) {
  ks__remote *r = ctx;
  ks__slot *s = ks__slot_get(r, fd);
  if (!s) return EBADF;
  if (s->reading) ks__slot_release(r, fd);
  else s->closed = 1; /* staged: kept until rename_fn uploads it or unlink_fn drops it */
  return 0;
}

/* Deletes the object at `path`. */
static int s3_delete(ks__remote *r, const char *path) {
  char *url = NULL;
  int rc = ks__s3_url(r, path, NULL, &url);
  if (rc) return rc;
  ks__req q = {.method = "DELETE", .url = url};
  ks__resp p;
  rc = ks__http_do(r, &q, &p, 1);
  ks__resp_free(&p);
  ks__free(&r->alloc, url);
  return rc;
}

/* A rename of a stored object (`.corrupt` aside): server-side copy, then delete. */
static int copy_object(ks__remote *r, const char *from, const char *to) {
  char *url = NULL, *key = NULL, *enc = NULL, *src = NULL;
  int rc = ks__s3_url(r, to, NULL, &url);
  if (!rc) rc = ks__s3_key(r, from, &key);
  if (!rc) rc = ks__url_encode(&r->alloc, key, 1, &enc);
  size_t n = enc ? strlen(enc) + strlen(r->bucket) + 40 : 0;
  if (!rc && !(src = ks__malloc(&r->alloc, n))) rc = ENOMEM;
  if (!rc) {
    snprintf(src, n, "x-amz-copy-source: /%s/%s", r->bucket, enc);
    const char *h[] = {src};
    ks__req q = {.method = "PUT", .url = url, .headers = h, .n_headers = 1};
    ks__resp p;
    rc = ks__http_do(r, &q, &p, 0);
    /* a copy may fail after its 200 (an <Error> body) */
    if (!rc && p.body && strstr((const char *)p.body, "<Error>")) rc = EIO;
    ks__resp_free(&p);
  }
  ks__free(&r->alloc, url);
  ks__free(&r->alloc, key);
  ks__free(&r->alloc, enc);
  ks__free(&r->alloc, src);
  return rc ? rc : s3_delete(r, from);
}

static int s3_rename(void *ctx, const char *from, const char *to) {
  ks__remote *r = ctx;
  int rc = ks__lease_check(r, to); /* a manager that lost its run directory's lock writes nothing more there */
  ks__slot *s = rc ? NULL : ks__slot_take_staged(r, from, 1);
  if (rc) {
    ks__slot_free(r, ks__slot_take_staged(r, from, 1)); /* gone, as after any failed rename */
    return rc;
  }
  if (!s) return is_staging_name(from) ? ENOENT : copy_object(r, from, to);
  rc = s3_upload(r, to, s->buf, s->len, s->is_link);
  ks__slot_free(r, s); /* uploaded or failed: the temporary file is gone either way, as after a failed rename */
  return rc;
}


static int s3_unlink(void *ctx, const char *path) {
  ks__remote *r = ctx;
  ks__slot *s = ks__slot_take_staged(r, path, 0);
  if (s) {
    ks__slot_free(r, s);
    return 0;
  }
  return is_staging_name(path) ? ENOENT : s3_delete(r, path);
}

static int s3_nothing(void *ctx, const char *path) {
  (void)ctx;
  (void)path;
  return 0; /* prefixes need no creation; listings are consistent without a directory sync */
}

static int s3_symlink(void *ctx, const char *target, const char *path) {
  ks__remote *r = ctx;
  size_t n = strlen(target);
  if (n == 0 || n > KS__POINTER_MAX) return ENAMETOOLONG;
  int fd;
  ks__slot *s;
  int rc = s3_create(ctx, path, &fd);
  if (!rc && !(s = ks__slot_get(r, fd))) rc = EBADF;
  if (!rc && (rc = ks__slot_append(r, s, target, n)) != 0) ks__slot_release(r, fd);
  if (!rc) s->is_link = s->closed = 1;
  return rc;
}

static KS_NODISCARD ks_status parse_location(ks__remote *r, const char *rest, ks_error *err) {
  const char *slash = strchr(rest, '/');
  size_t bl = slash ? (size_t)(slash - rest) : strlen(rest);
  if (bl < 3 || bl > 63) return ks__err(err, KS_E_INVALID, "s3://%s: bucket name must have 3 to 63 characters", rest);
  for (size_t i = 0; i < bl; i++) {
    char c = rest[i];
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.'))
      return ks__err(err, KS_E_INVALID, "s3://%s: bucket names use a-z, 0-9, '-' and '.'", rest);
  }
  r->bucket = ks__strndup(&r->alloc, rest, bl);
  const char *pre = slash ? slash + 1 : "";
  size_t pl = strlen(pre);
  while (pl && pre[pl - 1] == '/') pl--;
  r->prefix = ks__strndup(&r->alloc, pre, pl);
  return r->bucket && r->prefix ? KS_OK : ks__err(err, KS_E_NOMEM, "out of memory");
}

/* The base URL: endpoint/bucket (path style) or scheme://bucket.host (virtual host). */
static KS_NODISCARD ks_status make_base(ks__remote *r, const ks_storage_opts *o, const char *region, ks_error *err) {
  const char *ep = o->endpoint ? o->endpoint : getenv("AWS_ENDPOINT_URL");
  char dflt[256];
  int path_style = o->path_style > 0 || (o->path_style == 0 && ep && *ep);
  if (!ep || !*ep) {
    snprintf(dflt, sizeof dflt, "https://s3.%s.amazonaws.com", region);
    ep = dflt;
  }
  const char *host = strstr(ep, "://");
  if (!host || (strncmp(ep, "http://", 7) && strncmp(ep, "https://", 8)))
    return ks__err(err, KS_E_INVALID, "S3 endpoint '%s': expected http://host[:port] or https://...", ep);
  size_t el = strlen(ep);
  while (el && ep[el - 1] == '/') el--;
  if (!(r->endpoint = ks__strndup(&r->alloc, ep, el))) return ks__err(err, KS_E_NOMEM, "out of memory");
  size_t n = el + strlen(r->bucket) + 4;
  if (!(r->base = ks__malloc(&r->alloc, n))) return ks__err(err, KS_E_NOMEM, "out of memory");
  if (path_style) snprintf(r->base, n, "%.*s/%s", (int)el, ep, r->bucket);
  else
    snprintf(r->base, n, "%.*s%s.%.*s", (int)(host + 3 - ep), ep, r->bucket, (int)(el - (size_t)(host + 3 - ep)),
             host + 3);
  return KS_OK;
}

static KS_NODISCARD ks_status credentials(ks__remote *r, const char *region, ks_error *err) {
  const char *id = getenv("AWS_ACCESS_KEY_ID"), *secret = getenv("AWS_SECRET_ACCESS_KEY"),
             *token = getenv("AWS_SESSION_TOKEN");
  snprintf(r->sigv4, sizeof r->sigv4, "aws:amz:%s:s3", region);
  if (!id || !*id || !secret) return KS_OK; /* anonymous requests (public buckets) */
  size_t n = strlen(id) + strlen(secret) + 2;
  if (!(r->userpwd = ks__malloc(&r->alloc, n))) return ks__err(err, KS_E_NOMEM, "out of memory");
  snprintf(r->userpwd, n, "%s:%s", id, secret);
  if (token && *token) {
    n = strlen(token) + 32;
    if (!(r->token_hdr = ks__malloc(&r->alloc, n))) return ks__err(err, KS_E_NOMEM, "out of memory");
    snprintf(r->token_hdr, n, "x-amz-security-token: %s", token);
  }
  return KS_OK;
}

ks_status ks__remote_new(ks_storage *st, const ks_storage_opts *o, int s3, ks_error *err) {
  ks_status s = ks__curl_init_once(err);
  if (s) return s;
  ks__remote *r = ks__calloc(&st->alloc, 1, sizeof *r);
  if (!r) return ks__err(err, KS_E_NOMEM, "out of memory");
  if (pthread_mutex_init(&r->lock, NULL)) {
    ks__free(&st->alloc, r);
    return ks__err(err, KS_E_NOMEM, "cannot create a mutex");
  }
  r->alloc = st->alloc;
  r->s3 = s3;
  r->max_retries = o->max_retries ? o->max_retries : 5;
  r->retry_base_ms = o->retry_base_ms ? o->retry_base_ms : 100;
  r->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 0;
  r->connect_timeout_ms = o->connect_timeout_ms > 0 ? o->connect_timeout_ms : 10000;
  r->threshold = o->multipart_threshold ? o->multipart_threshold : DEFAULT_THRESHOLD;
  r->part_size = o->part_size ? o->part_size : DEFAULT_PART;
  r->parallel = o->parallel ? (o->parallel > 64 ? 64 : o->parallel) : 4;
  r->deadline_ms = o->deadline_ms == 0 ? DEFAULT_DEADLINE_MS : o->deadline_ms < 0 ? -1 : o->deadline_ms;
  if (r->deadline_ms > DEADLINE_MAX_MS) r->deadline_ms = DEADLINE_MAX_MS; /* no overflow in ns arithmetic */
  r->list_pages = o->list_max_pages ? o->list_max_pages : DEFAULT_LIST_PAGES;
  r->list_keys = o->list_max_keys ? o->list_max_keys : DEFAULT_LIST_KEYS;
  r->list_bytes = o->list_max_bytes ? o->list_max_bytes : DEFAULT_LIST_BYTES;
  r->lock_ttl_ms = o->lock_ttl_ms == 0 ? DEFAULT_LOCK_TTL_MS : o->lock_ttl_ms < 0 ? -1 : o->lock_ttl_ms;
  if (r->lock_ttl_ms > 0 && r->lock_ttl_ms < LOCK_TTL_MIN_MS) r->lock_ttl_ms = LOCK_TTL_MIN_MS;
  if (r->lock_ttl_ms > DEADLINE_MAX_MS) r->lock_ttl_ms = DEADLINE_MAX_MS;
  st->remote = r;
  return KS_OK;
}

ks_status ks__s3_open(ks_storage *st, const char *rest, const ks_storage_opts *o, ks_error *err) {
  ks_status s = ks__remote_new(st, o, 1, err);
  if (s) return s;
  ks__remote *r = st->remote;
  const char *region = o->region ? o->region : getenv("AWS_REGION");
  if (!region || !*region) region = "us-east-1";
  if ((s = parse_location(r, rest, err)) || (s = make_base(r, o, region, err)) || (s = credentials(r, region, err)))
    return s;
  st->path = ks__strdup(&st->alloc, r->prefix[0] ? r->prefix : ".");
  if (!st->path) return ks__err(err, KS_E_NOMEM, "out of memory");
  st->io = (ks_io){.version = KS_IO_VERSION, .ctx = r, .create_fn = s3_create, .write_fn = s3_write,
                   .fsync_fn = s3_fsync, .close_fn = s3_close, .rename_fn = s3_rename, .unlink_fn = s3_unlink,
                   .fsync_dir_fn = s3_nothing, .open_fn = ks__s3_open_fn, .read_fn = ks__remote_read_fn,
                   .stat_fn = ks__s3_stat_fn, .list_fn = ks__s3_list_fn, .mkdir_fn = s3_nothing,
                   .symlink_fn = s3_symlink, .readlink_fn = ks__s3_readlink_fn,
                   .validator_fn = ks__remote_validator_fn, .detail_fn = ks__remote_detail_fn};
  if (r->lock_ttl_ms > 0) { /* a lease object written with S3's conditional writes (lease.c) */
    st->io.caps |= KS_IO_CAP_LOCK;
    st->io.lock_fn = ks__s3_lock_fn;
    st->io.unlock_fn = ks__s3_unlock_fn;
  }
  return KS_OK;
}

void ks__remote_free(ks__remote *r) {
  if (!r) return;
  ks__leases_free(r);
  for (size_t i = 0; i < r->nslots; i++) ks__slot_free(r, r->slots[i]);
  for (size_t i = 0; i < r->npool; i++) curl_easy_cleanup(r->pool[i]);
  ks__free(&r->alloc, r->slots);
  ks__free(&r->alloc, r->base);
  ks__free(&r->alloc, r->endpoint);
  ks__free(&r->alloc, r->bucket);
  ks__free(&r->alloc, r->prefix);
  if (r->userpwd) memset(r->userpwd, 0, strlen(r->userpwd)); /* the secret does not outlive its use */
  ks__free(&r->alloc, r->userpwd);
  ks__free(&r->alloc, r->token_hdr);
  pthread_mutex_destroy(&r->lock);
  ks_allocator a = r->alloc;
  ks__free(&a, r);
}
