/* The read-only HTTP(S) backend: the location is a URL, paths are URLs under it. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "remote/curl/curl_internal.h"

/* A size no store holds (above S3's 5 TiB): a hostile answer, refused before anything is sized by it. */
static int size_cap(ks__remote *r, const char *url, uint64_t size) {
  if (size <= KS__OBJECT_MAX) return 0;
  ks__remote_fail_as(r, KS_E_LIMIT, "HEAD %s: size %llu exceeds the largest object size (5 TiB)", url,
                     (unsigned long long)size);
  return EFBIG;
}

/* The size from HEAD; a server that sends none is asked for byte 0 (Content-Range: bytes 0-0/total).
 * *p keeps the answer that gave it (its ETag and Last-Modified: the validator); the caller frees it. */
static int probe_size(ks__remote *r, const char *url, uint64_t *size, ks__resp *p) {
  uint64_t dl = ks__remote_deadline(r); /* one deadline for the HEAD and the GET after it */
  ks__req q = {.method = "HEAD", .url = url, .deadline = dl};
  int rc = ks__http_do(r, &q, p, 0);
  int have = !rc && p->has_length;
  *size = p->content_length;
  if (rc || have) return rc ? rc : size_cap(r, url, *size);
  ks__resp_free(p);
  uint8_t byte;
  const char *h[] = {"Range: bytes=0-0"};
  ks__req g = {.method = "GET", .url = url, .headers = h, .n_headers = 1, .dst = &byte, .dst_cap = 1,
               .deadline = dl};
  rc = ks__http_do(r, &g, p, 0);
  if (!rc && !p->has_range_total) {
    ks__remote_fail(r, "GET %s: the server gives neither Content-Length nor Content-Range", url);
    rc = ENOTSUP;
  }
  *size = p->range_total;
  return rc ? rc : size_cap(r, url, *size);
}

static int http_open(void *ctx, const char *path, int *fd, uint64_t *size) {
  ks__remote *r = ctx;
  char *url = ks__strdup(&r->alloc, path);
  if (!url) return ENOMEM;
  ks__resp p;
  int rc = probe_size(r, url, size, &p);
  if (!rc) rc = ks__remote_open_url(r, url, *size, &p, fd); /* takes url */
  else ks__free(&r->alloc, url);
  ks__resp_free(&p);
  return rc;
}

static int http_close(void *ctx, int fd) {
  ks__slot_release(ctx, fd);
  return 0;
}

static int http_stat(void *ctx, const char *path, ks_io_stat *st) {
  uint64_t size;
  ks__resp p;
  int rc = probe_size(ctx, path, &size, &p);
  ks__resp_free(&p);
  if (!rc) *st = (ks_io_stat){KS_IO_FILE, size};
  return rc;
}

static int ro_create(void *c, const char *p, int *fd) { (void)c, (void)p, (void)fd; return EROFS; }
static int ro_write(void *c, int fd, const void *b, size_t n, size_t *w) {
  (void)c, (void)fd, (void)b, (void)n, (void)w;
  return EROFS;
}
static int ro_fd(void *c, int fd) { (void)c, (void)fd; return EROFS; }
static int ro_two(void *c, const char *a, const char *b) { (void)c, (void)a, (void)b; return EROFS; }
static int ro_one(void *c, const char *a) { (void)c, (void)a; return EROFS; }
static int no_list(void *c, const char *d, const char *p, ks_io_list_cb cb, void *x) {
  (void)c, (void)d, (void)p, (void)cb, (void)x;
  return ENOTSUP;
}
static int no_link(void *c, const char *p, char *b, size_t cap, size_t *len) {
  (void)c, (void)p, (void)b, (void)cap, (void)len;
  return EINVAL;
}

ks_status ks__http_open(ks_storage *st, const char *url, const ks_storage_opts *o, ks_error *err) {
  ks_status s = ks__remote_new(st, o, 0, err);
  if (s) return s;
  const char *host = strstr(url, "://") + 3;
  if (!*host || *host == '/') return ks__err(err, KS_E_INVALID, "%s: no host", url);
  size_t n = strlen(url);
  while (n > (size_t)(host - url) && url[n - 1] == '/') n--;
  if (!(st->path = ks__strndup(&st->alloc, url, n))) return ks__err(err, KS_E_NOMEM, "out of memory");
  st->io = (ks_io){.version = KS_IO_VERSION, .ctx = st->remote, .create_fn = ro_create, .write_fn = ro_write,
                   .fsync_fn = ro_fd, .close_fn = http_close, .rename_fn = ro_two, .unlink_fn = ro_one,
                   .fsync_dir_fn = ro_one, .open_fn = http_open, .read_fn = ks__remote_read_fn,
                   .stat_fn = http_stat, .list_fn = no_list, .mkdir_fn = ro_one, .symlink_fn = ro_two,
                   .readlink_fn = no_link, .caps = KS_IO_CAP_READ_ONLY,
                   .validator_fn = ks__remote_validator_fn, .detail_fn = ks__remote_detail_fn};
  return KS_OK;
}
