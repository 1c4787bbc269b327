/*
 * S3 multipart upload: create, parts in parallel, complete; abort on any
 * failure, so neither a partial object nor an unfinished upload remains.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "remote/curl/curl_internal.h"

#define MAX_PARTS 10000 /* S3's limit */

typedef struct mpu {
  ks__remote *r;
  const char *url;
  const char *upload_id_enc;
  const uint8_t *data;
  size_t len, part;
  char (*etags)[256];
} mpu;

static int part_job(void *ctx, size_t i) {
  mpu *m = ctx;
  size_t at = i * m->part, n = m->len - at < m->part ? m->len - at : m->part;
  size_t ul = strlen(m->url) + strlen(m->upload_id_enc) + 64;
  char *url = ks__malloc(&m->r->alloc, ul);
  if (!url) return ENOMEM;
  snprintf(url, ul, "%s?partNumber=%zu&uploadId=%s", m->url, i + 1, m->upload_id_enc);
  ks__req q = {.method = "PUT", .url = url, .body = m->data + at, .body_len = n};
  ks__resp p;
  int rc = ks__http_do(m->r, &q, &p, 0);
  if (!rc && !p.etag[0]) {
    ks__remote_fail(m->r, "PUT %s: no ETag in the answer", url);
    rc = EIO;
  }
  if (!rc) memcpy(m->etags[i], p.etag, sizeof m->etags[i]);
  ks__resp_free(&p);
  ks__free(&m->r->alloc, url);
  return rc;
}

static int post(ks__remote *r, const char *url, const char *body, ks__resp *p) {
  const char *h[] = {"Content-Type: application/xml"};
  ks__req q = {.method = "POST", .url = url, .headers = h, .n_headers = 1, .body = (const uint8_t *)body,
               .body_len = body ? strlen(body) : 0, .max_body = KS__ERR_BODY_MAX};
  int rc = ks__http_do(r, &q, p, 0);
  /* CompleteMultipartUpload may fail after its 200: the error is in the body */
  if (!rc && p->body && strstr((const char *)p->body, "<Error>")) {
    ks__remote_fail(r, "POST %s: %.300s", url, (const char *)p->body);
    rc = EIO;
  }
  return rc;
}

static int create(ks__remote *r, const char *url, char **upload_id_enc) {
  size_t ul = strlen(url) + 16;
  char *u = ks__malloc(&r->alloc, ul), id[1024];
  if (!u) return ENOMEM;
  snprintf(u, ul, "%s?uploads=", url);
  ks__resp p;
  int rc = post(r, u, NULL, &p);
  size_t pos = 0, vl;
  const char *v;
  if (!rc &&
      (ks__xml_next((const char *)p.body, p.len, &pos, "UploadId", &v, &vl) || ks__xml_text(v, vl, id, sizeof id))) {
    ks__remote_fail(r, "POST %s: no UploadId in the answer", u);
    rc = EIO;
  }
  if (!rc) rc = ks__url_encode(&r->alloc, id, 0, upload_id_enc);
  ks__resp_free(&p);
  ks__free(&r->alloc, u);
  return rc;
}

/* <CompleteMultipartUpload> with every part's number and ETag (XML-escaped quotes). */
static char *complete_body(ks__remote *r, const mpu *m, size_t parts) {
  size_t cap = 64 + parts * (80 + 2 * 256), n = 0;
  char *b = ks__malloc(&r->alloc, cap);
  if (!b) return NULL;
  n += (size_t)snprintf(b + n, cap - n, "<CompleteMultipartUpload>");
  for (size_t i = 0; i < parts; i++) {
    n += (size_t)snprintf(b + n, cap - n, "<Part><PartNumber>%zu</PartNumber><ETag>", i + 1);
    for (const char *e = m->etags[i]; *e && n + 8 < cap; e++) {
      if (*e == '"') n += (size_t)snprintf(b + n, cap - n, "&quot;");
      else b[n++] = *e;
    }
    n += (size_t)snprintf(b + n, cap - n, "</ETag></Part>");
  }
  snprintf(b + n, cap - n, "</CompleteMultipartUpload>");
  return b;
}

static int finish(ks__remote *r, const mpu *m, size_t parts) {
  char *body = complete_body(r, m, parts);
  size_t ul = strlen(m->url) + strlen(m->upload_id_enc) + 16;
  char *u = ks__malloc(&r->alloc, ul);
  int rc = body && u ? 0 : ENOMEM;
  if (!rc) {
    snprintf(u, ul, "%s?uploadId=%s", m->url, m->upload_id_enc);
    ks__resp p;
    rc = post(r, u, body, &p);
    ks__resp_free(&p);
  }
  ks__free(&r->alloc, body);
  ks__free(&r->alloc, u);
  return rc;
}

/* Best effort, with the transport's retries; the first failure is what the caller reports. */
static void abort_upload(ks__remote *r, const char *url, const char *id_enc) {
  char saved[sizeof r->last_err];
  ks_status cls = ks__remote_last_status(r, saved, sizeof saved); /* kept: a deadline stays KS_E_NET */
  if (cls == KS_OK) cls = KS_E_IO;
  ks__note first; /* what this thread is told: the failure, not the abort's own request */
  ks__note_get(r, &first);
  size_t ul = strlen(url) + strlen(id_enc) + 16;
  char *u = ks__malloc(&r->alloc, ul);
  if (u) {
    snprintf(u, ul, "%s?uploadId=%s", url, id_enc);
    ks__req q = {.method = "DELETE", .url = u};
    ks__resp p;
    int rc = ks__http_do(r, &q, &p, 1);
    ks__resp_free(&p);
    if (rc) ks__remote_fail_as(r, cls, "%s; abort of the multipart upload failed too (%s)", saved, strerror(rc));
    else ks__remote_fail_as(r, cls, "%s (multipart upload aborted)", saved);
    ks__free(&r->alloc, u);
  }
  ks__note_put(r, &first);
}

int ks__s3_multipart(ks__remote *r, const char *url, const uint8_t *data, size_t len) {
  size_t part = r->part_size > SIZE_MAX ? SIZE_MAX : (size_t)r->part_size;
  if (len / part >= MAX_PARTS) part = len / (MAX_PARTS - 1) + 1;
  size_t parts = len / part + (len % part != 0);
  mpu m = {r, url, NULL, data, len, part, ks__calloc(&r->alloc, parts, sizeof *m.etags)};
  if (!m.etags) return ENOMEM;
  char *id = NULL;
  int rc = create(r, url, &id);
  if (!rc) {
    m.upload_id_enc = id;
    rc = ks__remote_parallel(r, parts, part_job, &m);
    if (!rc) rc = finish(r, &m, parts);
    if (rc) abort_upload(r, url, id);
  }
  ks__free(&r->alloc, id);
  ks__free(&r->alloc, m.etags);
  return rc;
}
