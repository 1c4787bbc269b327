/*
 * The HTTP transport over libcurl: one request with its retries, the
 * classification of results into errno values, and bounded response bodies.
 * Easy handles come from a small locked pool so connections are reused and
 * every function is thread safe.
 */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "remote/curl/curl_internal.h"

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc = CURLE_FAILED_INIT;
#ifdef KS_CURL_RUNTIME
static char curl_load_msg[1024]; /* why libcurl could not be loaded; "" once it was */
#endif

/* libcurl's documented global state: initialised once, never torn down (another user may still need it).
   A KS_CURL_RUNTIME build first loads the system's libcurl (curl_load.c). */
static void curl_init(void) {
#ifdef KS_CURL_RUNTIME
  if (ks__curl_load(NULL, curl_load_msg, sizeof curl_load_msg)) return;
  curl_load_msg[0] = '\0';
#endif
  curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

ks_status ks__curl_init_once(ks_error *err) {
  pthread_once(&curl_once, curl_init);
#ifdef KS_CURL_RUNTIME
  if (curl_load_msg[0]) return ks__err(err, KS_E_UNSUPPORTED, "%s", curl_load_msg);
#endif
  return curl_init_rc == CURLE_OK ? KS_OK : ks__err(err, KS_E_NET, "libcurl could not be initialised");
}

/* ---- per-thread notes: what detail_fn tells a thread about its own last failure ---- */

/* This thread's note, or NULL; call with the lock held. */
static ks__note *own_note(ks__remote *r) {
  pthread_t self = pthread_self();
  for (size_t i = 0; i < KS__NOTES; i++)
    if (r->notes[i].seq && pthread_equal(r->notes[i].tid, self)) return &r->notes[i];
  return NULL;
}

/* This thread's note, else a free one or the oldest, made this thread's; call with the lock held. */
static ks__note *take_note(ks__remote *r) {
  ks__note *n = own_note(r);
  if (!n) {
    n = &r->notes[0];
    for (size_t i = 1; i < KS__NOTES; i++) /* a free one has seq 0: the smallest */
      if (r->notes[i].seq < n->seq) n = &r->notes[i];
  }
  n->tid = pthread_self();
  n->seq = ++r->note_seq;
  return n;
}

static void note(ks__remote *r, int e, const char *text) {
  pthread_mutex_lock(&r->lock);
  ks__note *n = take_note(r);
  n->e = e;
  snprintf(n->text, sizeof n->text, "%s", text);
  pthread_mutex_unlock(&r->lock);
}

void ks__note_clear(ks__remote *r) {
  pthread_mutex_lock(&r->lock);
  ks__note *n = own_note(r);
  if (n) n->seq = 0;
  pthread_mutex_unlock(&r->lock);
}

void ks__note_get(ks__remote *r, ks__note *out) {
  pthread_mutex_lock(&r->lock);
  ks__note *n = own_note(r);
  if (n) *out = *n;
  else out->seq = 0;
  pthread_mutex_unlock(&r->lock);
}

void ks__note_put(ks__remote *r, const ks__note *src) {
  if (!src->seq) return;
  note(r, src->e, src->text);
}

size_t ks__remote_detail_fn(void *ctx, int rc, char *buf, size_t cap) {
  ks__remote *r = ctx;
  size_t len = 0;
  if (buf && cap) buf[0] = '\0';
  pthread_mutex_lock(&r->lock);
  ks__note *n = own_note(r);
  if (n && (n->e == 0 || n->e == rc)) { /* another errno: the failure came from elsewhere (no request) */
    len = strlen(n->text);
    if (buf && cap) snprintf(buf, cap, "%s", n->text);
  }
  pthread_mutex_unlock(&r->lock);
  return len;
}

static void record(ks__remote *r, ks_status cls, const char *fmt, va_list ap) {
  char msg[sizeof r->last_err];
  vsnprintf(msg, sizeof msg, fmt, ap);
  pthread_mutex_lock(&r->lock);
  memcpy(r->last_err, msg, sizeof msg);
  r->last_status = cls;
  pthread_mutex_unlock(&r->lock);
  note(r, 0, msg);
}

void ks__remote_fail(ks__remote *r, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  record(r, KS_E_IO, fmt, ap);
  va_end(ap);
}

void ks__remote_fail_as(ks__remote *r, ks_status cls, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  record(r, cls, fmt, ap);
  va_end(ap);
}

ks_status ks__remote_last_status(const ks__remote *r, char *buf, size_t cap) {
  ks__remote *m = (ks__remote *)(uintptr_t)r; /* the lock is the only thing touched */
  pthread_mutex_lock(&m->lock);
  ks_status s = m->last_err[0] ? m->last_status : KS_OK;
  if (buf && cap) snprintf(buf, cap, "%s", m->last_err);
  pthread_mutex_unlock(&m->lock);
  return s;
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t ks__remote_deadline(const ks__remote *r) {
  if (r->deadline_ms < 0) return UINT64_MAX;
  return now_ns() + (uint64_t)r->deadline_ms * 1000000u; /* deadline_ms is capped at open: no overflow */
}

/* Milliseconds left before dl (at least 1 while any is left), 0 once it passed, LONG_MAX without one. */
static long ms_left(uint64_t dl) {
  if (dl == UINT64_MAX) return LONG_MAX;
  uint64_t now = now_ns();
  if (now >= dl) return 0;
  uint64_t ms = (dl - now + 999999u) / 1000000u;
  return ms > (uint64_t)LONG_MAX ? LONG_MAX : (long)ms;
}

size_t ks__remote_last_error(const ks__remote *r, char *buf, size_t cap) {
  ks__remote *m = (ks__remote *)(uintptr_t)r; /* the lock is the only thing touched */
  pthread_mutex_lock(&m->lock);
  size_t n = strlen(m->last_err);
  if (buf && cap) snprintf(buf, cap, "%s", m->last_err);
  pthread_mutex_unlock(&m->lock);
  return n;
}

static CURL *handle_get(ks__remote *r) {
  CURL *h = NULL;
  pthread_mutex_lock(&r->lock);
  if (r->npool) h = r->pool[--r->npool];
  pthread_mutex_unlock(&r->lock);
  if (h) curl_easy_reset(h); /* keeps the connection cache */
  return h ? h : curl_easy_init();
}

static void handle_put(ks__remote *r, CURL *h) {
  pthread_mutex_lock(&r->lock);
  if (r->npool < KS__POOL_MAX) {
    r->pool[r->npool++] = h;
    h = NULL;
  }
  pthread_mutex_unlock(&r->lock);
  if (h) curl_easy_cleanup(h);
}

void ks__resp_free(ks__resp *p) {
  if (p->body) ks__free(p->alloc, p->body);
  p->body = NULL;
  p->len = p->cap = 0;
}

/* Appends to the growable body, up to p->max bytes. */
static int body_append(ks__resp *p, const char *d, size_t n) {
  if (p->len + n > p->max) {
    p->overflow = 1;
    return -1;
  }
  if (p->len + n + 1 > p->cap) {
    size_t cap = p->cap ? p->cap : 4096;
    while (cap < p->len + n + 1) cap *= 2;
    uint8_t *b = ks__realloc(p->alloc, p->body, cap);
    if (!b) return -1;
    p->body = b;
    p->cap = cap;
  }
  memcpy(p->body + p->len, d, n);
  p->len += n;
  p->body[p->len] = '\0';
  return 0;
}

/* 2xx bodies of a ranged read go to dst; everything else (errors, listings) to the bounded body. */
static size_t on_body(char *d, size_t sz, size_t nm, void *ctx) {
  ks__resp *p = ctx;
  size_t n = sz * nm;
  if (p->dst && p->status / 100 == 2) {
    if (n > p->dst_cap - p->dst_len) {
      p->overflow = 1;
      return 0;
    }
    memcpy(p->dst + p->dst_len, d, n);
    p->dst_len += n;
    return n;
  }
  size_t cap = p->status / 100 == 2 ? p->max : KS__ERR_BODY_MAX;
  if (p->len + n > cap) { /* an error body is only kept in part; a 2xx one may not overflow */
    if (p->status / 100 == 2) {
      p->overflow = 1;
      return 0;
    }
    return n;
  }
  size_t keep = p->max;
  p->max = cap;
  int rc = body_append(p, d, n);
  p->max = keep;
  return rc ? 0 : n;
}

static int hdr_is(const char *line, size_t n, const char *name, const char **val, size_t *vlen) {
  size_t k = strlen(name);
  if (n <= k || strncasecmp(line, name, k) || line[k] != ':') return 0;
  const char *v = line + k + 1, *end = line + n;
  while (v < end && (*v == ' ' || *v == '\t')) v++;
  while (end > v && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' ')) end--;
  *val = v;
  *vlen = (size_t)(end - v);
  return 1;
}

static uint64_t parse_u64(const char *v, size_t n, int *ok) {
  uint64_t x = 0;
  *ok = n > 0;
  for (size_t i = 0; i < n && *ok; i++) {
    if (v[i] < '0' || v[i] > '9' || x > (UINT64_MAX - 9) / 10) *ok = 0;
    else x = x * 10 + (uint64_t)(v[i] - '0');
  }
  return x;
}

/* A 2xx answer whose Content-Length is more than the caller's buffer or the body's cap. */
static int announces_too_much(ks__resp *p) {
  if (p->nobody || p->status / 100 != 2 || !p->has_length) return 0;
  uint64_t cap = p->dst ? p->dst_cap : p->max;
  if (p->content_length <= cap) return 0;
  p->overflow = 1;
  return 1;
}

/* "bytes first-last" of a Content-Range (before its '/'). */
static void parse_span(ks__resp *p, const char *v, size_t n) {
  int ok1 = 0, ok2 = 0;
  if (n < 6 || strncmp(v, "bytes ", 6)) return;
  const char *dash = memchr(v + 6, '-', n - 6);
  if (!dash) return;
  p->range_first = parse_u64(v + 6, (size_t)(dash - v - 6), &ok1);
  p->range_last = parse_u64(dash + 1, (size_t)(v + n - dash - 1), &ok2);
  p->has_range_span = ok1 && ok2;
}

static size_t on_header(char *d, size_t sz, size_t nm, void *ctx) {
  ks__resp *p = ctx;
  size_t n = sz * nm;
  const char *v;
  size_t vl;
  int ok;
  if (n > 5 && !strncmp(d, "HTTP/", 5)) { /* a new response (after 100 Continue or a redirect) */
    p->status = strtol(memchr(d, ' ', n) ? (char *)memchr(d, ' ', n) + 1 : d, NULL, 10);
    p->has_length = p->has_range_total = p->has_range_span = p->pointer = 0;
    p->etag[0] = p->last_modified[0] = p->date[0] = '\0';
  } else if (hdr_is(d, n, "Content-Length", &v, &vl)) {
    p->content_length = parse_u64(v, vl, &ok);
    p->has_length = ok;
    if (announces_too_much(p)) return 0; /* refused before any byte of it: curl ends with a write error */
  } else if (hdr_is(d, n, "Content-Range", &v, &vl)) { /* bytes a-b/total */
    const char *slash = memchr(v, '/', vl);
    if (slash) p->range_total = parse_u64(slash + 1, vl - (size_t)(slash + 1 - v), &ok), p->has_range_total = ok;
    parse_span(p, v, slash ? (size_t)(slash - v) : vl);
  } else if (hdr_is(d, n, "ETag", &v, &vl)) {
    snprintf(p->etag, sizeof p->etag, "%.*s", (int)vl, v);
  } else if (hdr_is(d, n, "Last-Modified", &v, &vl)) {
    snprintf(p->last_modified, sizeof p->last_modified, "%.*s", (int)vl, v);
  } else if (hdr_is(d, n, "Date", &v, &vl)) {
    snprintf(p->date, sizeof p->date, "%.*s", (int)vl, v);
  } else if (hdr_is(d, n, "x-amz-meta-keepsake-pointer", &v, &vl)) {
    p->pointer = 1;
  }
  return n;
}

typedef struct upload {
  const uint8_t *d;
  size_t n, off;
} upload;

static size_t on_read(char *buf, size_t sz, size_t nm, void *ctx) {
  upload *u = ctx;
  size_t n = sz * nm, left = u->n - u->off;
  if (n > left) n = left;
  memcpy(buf, u->d + u->off, n);
  u->off += n;
  return n;
}

/* curl rewinds the body to resend it on a fresh connection (a reused one that the server closed). */
static int on_seek(void *ctx, curl_off_t offset, int origin) {
  upload *u = ctx;
  if (origin != SEEK_SET || offset < 0 || (uint64_t)offset > u->n) return CURL_SEEKFUNC_FAIL;
  u->off = (size_t)offset;
  return CURL_SEEKFUNC_OK;
}

static struct curl_slist *build_headers(ks__remote *r, const ks__req *q) {
  struct curl_slist *h = NULL, *t;
  const char *fixed[] = {"Expect:", r->userpwd ? "x-amz-content-sha256: UNSIGNED-PAYLOAD" : NULL, r->token_hdr};
  for (size_t i = 0; i < 3; i++)
    if (fixed[i]) {
      if (!(t = curl_slist_append(h, fixed[i]))) goto fail;
      h = t;
    }
  for (size_t i = 0; i < q->n_headers; i++) {
    if (!(t = curl_slist_append(h, q->headers[i]))) goto fail;
    h = t;
  }
  return h;
fail:
  curl_slist_free_all(h);
  return NULL;
}

static void set_method(CURL *h, const ks__req *q, upload *u) {
  if (!strcmp(q->method, "HEAD")) curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
  else if (!strcmp(q->method, "PUT")) {
    curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(h, CURLOPT_READFUNCTION, on_read);
    curl_easy_setopt(h, CURLOPT_READDATA, u);
    curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, on_seek);
    curl_easy_setopt(h, CURLOPT_SEEKDATA, u);
    curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)q->body_len);
  } else if (!strcmp(q->method, "POST")) {
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, q->body ? (const char *)q->body : "");
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)q->body_len);
  } else if (strcmp(q->method, "GET"))
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, q->method);
}

static void set_common(ks__remote *r, CURL *h, const ks__req *q, ks__resp *p, struct curl_slist *hdrs, char *ebuf,
                       long left_ms) {
  curl_easy_setopt(h, CURLOPT_URL, q->url);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, p);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, p);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, ebuf);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L); /* threads: no SIGALRM for DNS timeouts */
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, r->connect_timeout_ms);
  /* The attempt ends by the request timeout or by what is left of the operation's deadline, whichever
     comes first: the low-speed limit alone never ends a server that trickles a byte now and then. */
  long limit = r->timeout_ms > 0 && r->timeout_ms < left_ms ? r->timeout_ms : left_ms;
  if (limit != LONG_MAX) curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, limit);
  /* A stalled transfer (no byte for 30 s, or the request timeout if shorter) is a timeout, retried. */
  long stall = r->timeout_ms > 0 && r->timeout_ms < 30000 ? (r->timeout_ms + 999) / 1000 : 30;
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, stall);
  curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
  if (r->userpwd) {
    curl_easy_setopt(h, CURLOPT_AWS_SIGV4, r->sigv4);
    curl_easy_setopt(h, CURLOPT_USERPWD, r->userpwd);
  }
}

/* Transient: worth another attempt. */
static int retryable(CURLcode c, long status, const ks__resp *p) {
  if (c == CURLE_OK) return status >= 500 || status == 429 || status == 408;
  if (c == CURLE_WRITE_ERROR && p->overflow) return 0;
  switch (c) {
  case CURLE_OPERATION_TIMEDOUT: case CURLE_COULDNT_CONNECT: case CURLE_RECV_ERROR: case CURLE_SEND_ERROR:
  case CURLE_GOT_NOTHING: case CURLE_PARTIAL_FILE: case CURLE_COULDNT_RESOLVE_HOST: case CURLE_HTTP2:
  case CURLE_HTTP2_STREAM: case CURLE_SSL_CONNECT_ERROR: case CURLE_READ_ERROR: case CURLE_SEND_FAIL_REWIND:
    return 1;
  default:
    return 0;
  }
}

static int errno_of_status(long s) {
  switch (s) {
  case 404: return ENOENT;
  case 401: case 403: return EACCES;
  case 400: case 416: return EINVAL;
  case 405: case 501: return ENOTSUP;
  case 409: return EBUSY;
  case 412: return EEXIST;
  case 413: return EFBIG;
  default: return EIO;
  }
}

static int errno_of_curl(CURLcode c) {
  switch (c) {
  case CURLE_OPERATION_TIMEDOUT: return ETIMEDOUT;
  case CURLE_COULDNT_CONNECT: return ECONNREFUSED;
  case CURLE_COULDNT_RESOLVE_HOST: return EHOSTUNREACH;
  case CURLE_OUT_OF_MEMORY: return ENOMEM;
  default: return EIO;
  }
}

/* "HTTP 503 (SlowDown: Please reduce...)" from the status and the S3 error body. */
static void describe(const ks__resp *p, char *out, size_t cap) {
  const char *code = NULL, *msg = NULL;
  size_t cl = 0, ml = 0, pos = 0, pos2 = 0;
  char c[128] = "", m[512] = "";
  if (p->body && !ks__xml_next((const char *)p->body, p->len, &pos, "Code", &code, &cl))
    ks__xml_text(code, cl, c, sizeof c);
  if (p->body && !ks__xml_next((const char *)p->body, p->len, &pos2, "Message", &msg, &ml))
    ks__xml_text(msg, ml, m, sizeof m);
  if (c[0]) snprintf(out, cap, "HTTP %ld (%s%s%s)", p->status, c, m[0] ? ": " : "", m);
  else snprintf(out, cap, "HTTP %ld", p->status);
}

/* Exponential backoff with jitter: base * 2^attempt, scaled by a random factor in [0.5, 1.5), never
   past the deadline. 0 when the deadline leaves no time for another attempt. */
static int backoff(ks__remote *r, unsigned attempt, uint64_t *seed, uint64_t dl) {
  uint64_t ms = (uint64_t)r->retry_base_ms << (attempt < 16 ? attempt : 16);
  *seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
  ms = ms / 2 + (ms ? (*seed >> 33) % ms : 0);
  long left = ms_left(dl);
  if ((uint64_t)left <= ms) return 0;
  struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
  return 1;
}

static CURLcode attempt_once(ks__remote *r, CURL *h, const ks__req *q, ks__resp *p, struct curl_slist *hdrs,
                             char *ebuf, long left_ms) {
  upload u = {q->body, q->body_len, 0};
  p->status = 0;
  p->len = p->dst_len = 0;
  p->overflow = p->has_length = p->has_range_total = p->has_range_span = p->pointer = 0;
  p->etag[0] = p->last_modified[0] = p->date[0] = ebuf[0] = '\0';
  curl_easy_reset(h);
  set_common(r, h, q, p, hdrs, ebuf, left_ms);
  set_method(h, q, &u);
  CURLcode c = curl_easy_perform(h);
  /* A 2xx ranged read that ended short of what Content-Length announced: curl reports PARTIAL_FILE. */
  if (c == CURLE_OK && p->dst && p->status / 100 == 2 && p->has_length && p->content_length != p->dst_len)
    c = CURLE_PARTIAL_FILE;
  return c;
}

/* The errno and the message of a failed transfer (c != CURLE_OK); the class goes to *cls. */
static int transfer_failure(const ks__resp *p, CURLcode c, const char *ebuf, char *what, size_t cap, ks_status *cls) {
  if (p->overflow) {
    size_t limit = p->dst ? p->dst_cap : p->max;
    if (p->has_length && p->content_length > limit)
      snprintf(what, cap, "Content-Length %llu exceeds the %zu bytes %s", (unsigned long long)p->content_length,
               limit, p->dst ? "asked" : "allowed for this answer");
    else
      snprintf(what, cap, "answer longer than the %zu bytes %s", limit, p->dst ? "asked" : "allowed for this answer");
    *cls = KS_E_LIMIT;
    return EFBIG;
  }
  snprintf(what, cap, "%s", ebuf[0] ? ebuf : curl_easy_strerror(c));
  *cls = KS_E_NET;
  return errno_of_curl(c);
}

/* Appends s[0..n) to out, %XX sequences decoded (a key as S3 names it). */
static void put_decoded(char *out, size_t cap, const char *s, size_t n) {
  size_t o = strlen(out);
  for (size_t i = 0; i < n && o + 1 < cap; i++) {
    unsigned hi, lo;
    if (s[i] == '%' && i + 2 < n && sscanf(s + i + 1, "%1x%1x", &hi, &lo) == 2 && (hi || lo)) {
      out[o++] = (char)(hi << 4 | lo);
      i += 2;
    } else {
      out[o++] = s[i];
    }
  }
  out[o] = '\0';
}

/* What a request was about, for this thread's note: "s3://bucket/key at endpoint E" (a listing names
 * its prefix), or the URL itself for HTTP. */
static void object_of(const ks__remote *r, const char *url, char *out, size_t cap) {
  size_t bl = r->base ? strlen(r->base) : 0;
  if (!r->s3 || !bl || strncmp(url, r->base, bl) || url[bl] != '/') {
    snprintf(out, cap, "%s", url);
    return;
  }
  const char *key = url + bl + 1, *query = strchr(key, '?'), *pre = query ? strstr(query, "prefix=") : NULL;
  snprintf(out, cap, "s3://%s/", r->bucket);
  if (query == key && pre) put_decoded(out, cap, pre + 7, strcspn(pre + 7, "&"));
  else put_decoded(out, cap, key, query ? (size_t)(query - key) : strlen(key));
  size_t o = strlen(out);
  snprintf(out + o, cap - o, " at endpoint %s", r->endpoint ? r->endpoint : r->base);
}

/* snprintf whose output is cut to fit on purpose (a message: its start is what matters). */
static void KS__PRINTF(3, 4) fit(char *buf, size_t cap, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, cap, fmt, ap);
  va_end(ap);
}

/* Records the failure of q (unless its answer is a quiet one) and returns its errno. */
static int fail_request(ks__remote *r, const ks__req *q, const ks__resp *p, CURLcode c, const char *ebuf,
                        unsigned tries, int expired, unsigned quiet) {
  char what[700], last[720] = "";
  ks_status cls = KS_E_IO;
  int e;
  if (c != CURLE_OK) {
    e = transfer_failure(p, c, ebuf, what, sizeof what, &cls);
  } else {
    describe(p, what, sizeof what);
    e = errno_of_status(p->status);
  }
  if (expired) { /* what the last attempt got is still worth saying (a 503 the deadline cut short) */
    if (p->status || c != CURLE_OK) snprintf(last, sizeof last, " (last attempt: %s)", what);
    snprintf(what, sizeof what, "deadline of %ld ms (ks_storage_opts.deadline_ms) exceeded", r->deadline_ms);
    cls = KS_E_NET;
    e = ETIMEDOUT;
  }
  if ((quiet & KS__QUIET_404 && e == ENOENT) || (quiet & KS__QUIET_412 && e == EEXIST)) return e;
  char retries[40] = "", obj[512], text[sizeof r->notes[0].text];
  if (tries) snprintf(retries, sizeof retries, " after %u %s", tries, tries == 1 ? "retry" : "retries");
  if (!(quiet & KS__QUIET_ALL)) {
    pthread_mutex_lock(&r->lock);
    fit(r->last_err, sizeof r->last_err, "%s %s: %s%s%s", q->method, q->url, what, retries, last);
    r->last_status = cls;
    pthread_mutex_unlock(&r->lock);
  }
  object_of(r, q->url, obj, sizeof obj);
  fit(text, sizeof text, "%s %s: %s%s%s", q->method, obj, what, retries, last);
  note(r, e, text);
  return e;
}

int ks__http_do(ks__remote *r, const ks__req *q, ks__resp *p, unsigned quiet) {
  *p = (ks__resp){.alloc = &r->alloc, .max = q->max_body ? q->max_body : KS__ERR_BODY_MAX, .dst = q->dst,
                  .dst_cap = q->dst_cap, .nobody = !strcmp(q->method, "HEAD")};
  uint64_t dl = q->deadline ? q->deadline : ks__remote_deadline(r);
  ks__note_clear(r); /* what this thread is told about a failure is about this request */
  CURL *h = handle_get(r);
  struct curl_slist *hdrs = build_headers(r, q);
  if (!h || !hdrs) {
    if (h) curl_easy_cleanup(h);
    curl_slist_free_all(hdrs);
    ks__remote_fail(r, "%s %s: out of memory", q->method, q->url);
    return ENOMEM;
  }
  char ebuf[CURL_ERROR_SIZE] = "";
  uint64_t seed = (uint64_t)(uintptr_t)p ^ (uint64_t)time(NULL) ^ ((uint64_t)clock() << 20);
  CURLcode c = CURLE_OK;
  unsigned tries = 0;
  int expired = 0;
  for (;; tries++) {
    long left = ms_left(dl);
    if (left == 0) { /* a listing's later page, or a retry after the backoff: no time is left */
      expired = 1;
      break;
    }
    c = attempt_once(r, h, q, p, hdrs, ebuf, left);
    if (c == CURLE_OPERATION_TIMEDOUT && ms_left(dl) <= 1) expired = 1; /* curl's timer may fire a hair early */
    if (expired || !retryable(c, p->status, p) || tries >= r->max_retries) break;
    if (!backoff(r, tries, &seed, dl)) {
      expired = 1;
      break;
    }
  }
  curl_slist_free_all(hdrs);
  handle_put(r, h);
  if (!expired && c == CURLE_OK && p->status / 100 == 2) return 0;
  return fail_request(r, q, p, c, ebuf, tries, expired, quiet | q->quiet);
}

typedef struct par {
  pthread_mutex_t lock;
  size_t next, n;
  int rc;
  pthread_t failed; /* the thread whose job failed first (rc) */
  int (*job)(void *, size_t);
  void *ctx;
} par;

static void *worker(void *arg) {
  par *w = arg;
  for (;;) {
    pthread_mutex_lock(&w->lock);
    size_t i = w->next < w->n && !w->rc ? w->next++ : SIZE_MAX;
    pthread_mutex_unlock(&w->lock);
    if (i == SIZE_MAX) return NULL;
    int rc = w->job(w->ctx, i);
    if (rc) {
      pthread_mutex_lock(&w->lock);
      if (!w->rc) {
        w->rc = rc;
        w->failed = pthread_self();
      }
      pthread_mutex_unlock(&w->lock);
    }
  }
}

int ks__remote_parallel(ks__remote *r, size_t n, int (*job)(void *ctx, size_t i), void *ctx) {
  par w = {.n = n, .job = job, .ctx = ctx};
  pthread_t t[64];
  size_t nt = r->parallel < n ? r->parallel : n, started = 0;
  if (nt > 64) nt = 64;
  if (pthread_mutex_init(&w.lock, NULL)) return ENOMEM;
  for (; started + 1 < nt; started++) /* this thread is the last worker */
    if (pthread_create(&t[started], NULL, worker, &w)) break;
  worker(&w);
  for (size_t i = 0; i < started; i++) pthread_join(t[i], NULL);
  pthread_mutex_destroy(&w.lock);
  if (w.rc && !pthread_equal(w.failed, pthread_self())) { /* the caller is told what failed on a worker */
    ks__note copy;
    pthread_mutex_lock(&r->lock);
    ks__note *f = NULL;
    for (size_t i = 0; i < KS__NOTES && !f; i++)
      if (r->notes[i].seq && pthread_equal(r->notes[i].tid, w.failed)) f = &r->notes[i];
    copy = f ? *f : (ks__note){0};
    pthread_mutex_unlock(&r->lock);
    ks__note_put(r, &copy);
  }
  return w.rc;
}

/* "Sun, 06 Nov 1994 08:49:37 GMT" (RFC 9110's IMF-fixdate, the one S3 and nginx send). */
int64_t ks__http_date(const char *s) {
  static const char months[] = "JanFebMarAprMayJunJulAugSepOctNovDec";
  char mon[4] = "";
  int d, y, hh, mm, ss;
  if (!s || sscanf(s, "%*3s, %2d %3s %4d %2d:%2d:%2d GMT", &d, mon, &y, &hh, &mm, &ss) != 6) return -1;
  const char *at = strstr(months, mon);
  if (!at || (at - months) % 3 || d < 1 || d > 31 || y < 1970 || hh > 23 || mm > 59 || ss > 60) return -1;
  int m = (int)(at - months) / 3 + 1;
  /* days from 1970-01-01 of a civil date (Howard Hinnant's algorithm) */
  int yy = y - (m <= 2), era = yy / 400, yoe = yy - era * 400;
  int doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1, doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  int64_t days = (int64_t)era * 146097 + doe - 719468;
  return days * 86400 + hh * 3600 + mm * 60 + ss;
}
