/* The libcurl side of the storage module: the remote object, the HTTP transport, S3 helpers. */
#ifndef KS_REMOTE_CURL_INTERNAL_H
#define KS_REMOTE_CURL_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include "remote/curl/curl_load.h" /* <curl/curl.h>; libcurl's functions loaded at run time when KS_CURL_RUNTIME */
#include "remote/remote_internal.h"

#define KS__ERR_BODY_MAX ((size_t)64 << 10)  /* error bodies kept (and parsed) at most */
#define KS__LIST_BODY_MAX ((size_t)8 << 20)  /* one ListObjectsV2 page */
#define KS__POINTER_MAX ((size_t)4096)       /* a pointer object's content */
#define KS__POOL_MAX 16                      /* idle easy handles kept for connection reuse */
#define KS__OBJECT_MAX ((uint64_t)5 << 40)   /* S3's largest object: a bigger size is a hostile answer */
#define KS__POINTER_HOPS 8                   /* pointers followed in a row by open_fn, else ELOOP */
#define KS__VALIDATOR_MAX 256                /* an ETag or a Last-Modified kept per reading handle */
#define KS__NOTES 16                         /* threads whose last failure detail_fn can tell */
#define KS__LEASES_MAX 16                    /* run directory locks one storage object holds at once */

/* One handle of the table: an object being staged (create_fn / symlink_fn) or one opened for reading. */
typedef struct ks__slot {
  int used;
  int reading;     /* open_fn: url + size */
  int is_link;     /* a staged pointer: buf holds the target */
  int closed;      /* close_fn done: may be renamed */
  char *path;      /* the library's path (staged) or the object's URL (reading) */
  uint8_t *buf;
  size_t len, cap;
  uint64_t size;   /* reading: the object's size */
  char validator[KS__VALIDATOR_MAX]; /* reading: the ETag (else Last-Modified) open_fn found; "" when none */
  int strong_etag; /* reading: validator is a strong ETag, so reads ask for exactly that content (If-Match) */
} ks__slot;

/* One thread's most recent failure, as detail_fn tells it (io.h). */
typedef struct ks__note {
  pthread_t tid;
  uint64_t seq; /* 0: unused; else the order notes were taken in (the oldest is replaced) */
  int e;        /* the errno the failed request returned; 0: not known */
  char text[768];
} ks__note;

typedef struct ks__lease ks__lease; /* a run directory lock held (lease.c) */

struct ks__remote {
  ks_allocator alloc;
  int s3;
  char *base;            /* S3: ".../bucket" (path style) or "https://bucket.host"; HTTP: unused */
  char *endpoint;        /* S3: the endpoint requests go to (named in failure details) */
  char *prefix;          /* S3: the key prefix of the location ("" for the root) */
  char *bucket;          /* S3: the bucket */
  char sigv4[160];       /* "aws:amz:<region>:s3" */
  char *userpwd;         /* "key:secret" or NULL (unsigned requests) */
  char *token_hdr;       /* "x-amz-security-token: ..." or NULL */
  unsigned max_retries, retry_base_ms, parallel;
  long timeout_ms, connect_timeout_ms;
  long deadline_ms;      /* one operation's overall limit; negative: none */
  uint64_t list_pages, list_keys, list_bytes; /* one listing's budget */
  uint64_t threshold, part_size;
  pthread_mutex_t lock;  /* slots, the handle pool and last_err */
  ks__slot **slots;
  size_t nslots, slots_cap;
  CURL *pool[KS__POOL_MAX];
  size_t npool;
  char last_err[1024];
  ks_status last_status; /* the class of last_err: KS_E_NET, KS_E_LIMIT or KS_E_IO */
  ks__note notes[KS__NOTES]; /* per thread: the last failure, for detail_fn (guarded by lock) */
  uint64_t note_seq;
  long lock_ttl_ms;      /* S3: a lease's life without renewal; negative: no locks */
  int cond_writes;       /* S3: conditional writes (If-None-Match) honoured: 1 yes, -1 no, 0 not known yet
                            (guarded by lock) */
  ks__lease *leases[KS__LEASES_MAX]; /* S3: locks held (guarded by lock); a lock handle indexes it */
};

/* One request. Bodies are in memory; a GET either fills dst (dst_cap bytes at most) or grows body up to max_body. */
typedef struct ks__req {
  const char *method; /* GET PUT HEAD DELETE POST */
  const char *url;
  const char *const *headers; /* "Name: value", n_headers of them */
  size_t n_headers;
  const uint8_t *body;
  size_t body_len;
  uint8_t *dst;
  size_t dst_cap;
  size_t max_body;
  uint64_t deadline; /* CLOCK_MONOTONIC ns when the operation must end; 0: ks__remote_deadline() now */
  unsigned quiet;    /* KS__QUIET_*: answers that are results, not failures to record */
} ks__req;

/* ks__req.quiet bits (and ks__http_do's last argument). A quiet answer still returns its errno. */
#define KS__QUIET_404 1u /* a missing object (ENOENT) is not recorded */
#define KS__QUIET_412 2u /* a condition that did not hold (EEXIST) is not recorded */
#define KS__QUIET_ALL 4u /* nothing goes to the storage's last error (only to this thread's note) */

typedef struct ks__resp {
  long status;
  uint8_t *body; /* allocated with the remote's allocator; NUL-terminated; free with ks__resp_free */
  size_t len, cap, max;
  uint8_t *dst;
  size_t dst_cap, dst_len;
  int overflow;  /* more bytes than dst or max allowed (a body, or a Content-Length announcing one) */
  int nobody;    /* HEAD: Content-Length is the object's size, not a body to come */
  uint64_t content_length;
  int has_length;
  uint64_t range_total;
  int has_range_total;
  uint64_t range_first, range_last; /* Content-Range: bytes first-last/total */
  int has_range_span;
  int pointer;   /* x-amz-meta-keepsake-pointer present */
  char etag[256];
  char last_modified[64]; /* Last-Modified, "" when absent */
  char date[64];          /* Date (the server's clock), "" when absent */
  const ks_allocator *alloc;
} ks__resp;

/* Performs q with the retries; returns 0 for a 2xx answer, else an errno value (last error recorded,
 * and this thread's note taken, unless the answer is one of the quiet ones: q->quiet | quiet). */
int ks__http_do(ks__remote *r, const ks__req *q, ks__resp *p, unsigned quiet);
void ks__resp_free(ks__resp *p);
/* Records the detail of a failure (printf-like) as the remote's last error, of class KS_E_IO. */
void ks__remote_fail(ks__remote *r, const char *fmt, ...) KS__PRINTF(2, 3);
/* The same with its class: KS_E_NET (deadline, network) or KS_E_LIMIT (a budget or cap). */
void ks__remote_fail_as(ks__remote *r, ks_status cls, const char *fmt, ...) KS__PRINTF(3, 4);
/* ---- what detail_fn tells (per thread) ---- */
/* Forgets this thread's last failure (a new request starts). */
void ks__note_clear(ks__remote *r);
/* This thread's last failure into *out (seq 0 when none), and back (ks__note_put: as this thread's). */
void ks__note_get(ks__remote *r, ks__note *out);
void ks__note_put(ks__remote *r, const ks__note *n);
/* The table's detail_fn (io.h). */
size_t ks__remote_detail_fn(void *ctx, int rc, char *buf, size_t cap);
/* The table's validator_fn (io.h): the slot's validator. */
int ks__remote_validator_fn(void *ctx, int fd, char *buf, size_t cap);
/* The seconds since 1970 of an HTTP date ("Sun, 06 Nov 1994 08:49:37 GMT"), or -1. */
int64_t ks__http_date(const char *s);

/* When an operation starting now must end (CLOCK_MONOTONIC ns; UINT64_MAX: no deadline). */
uint64_t ks__remote_deadline(const ks__remote *r);
/* Runs job(ctx, i) for i in [0, n) on up to r->parallel threads; the first nonzero result stops the rest. */
int ks__remote_parallel(ks__remote *r, size_t n, int (*job)(void *ctx, size_t i), void *ctx);

/* ---- bounded XML scanning of S3 answers ---- */
/* The text of the first <tag>...</tag> at or after *pos in s[0..n): *v, *vlen; *pos moves past it. 0 or -1. */
int ks__xml_next(const char *s, size_t n, size_t *pos, const char *tag, const char **v, size_t *vlen);
/* Decodes XML entities of v[0..vlen) into out (cap bytes, NUL-terminated). 0, or -1 when it does not fit / is bad. */
int ks__xml_text(const char *v, size_t vlen, char *out, size_t cap);

/* ---- handles ---- */
/* A new slot (zeroed, used) and its handle number. ENOMEM or EMFILE. */
int ks__slot_new(ks__remote *r, int *fd, ks__slot **out);
ks__slot *ks__slot_get(ks__remote *r, int fd);
/* The closed staged slot for path, taken out of the table (the caller frees it), or NULL. */
ks__slot *ks__slot_take_staged(ks__remote *r, const char *path, int closed_only);
void ks__slot_free(ks__remote *r, ks__slot *s);
void ks__slot_release(ks__remote *r, int fd);
int ks__slot_append(ks__remote *r, ks__slot *s, const void *buf, size_t n);

/* ---- S3 ---- */
/* The URL of the object for a library path ("run/x" -> base/prefix-less key, encoded); query appended when not NULL. */
int ks__s3_url(ks__remote *r, const char *path, const char *query, char **url);
/* The key (unencoded) of a library path, into a new string. */
int ks__s3_key(ks__remote *r, const char *path, char **key);
int ks__s3_multipart(ks__remote *r, const char *url, const uint8_t *data, size_t len);
/* Percent-encodes s (S3 rules; '/' kept when keep_slash) appending to a new string *out. */
int ks__url_encode(const ks_allocator *a, const char *s, int keep_slash, char **out);
/* curl's global init, once per process (a KS_CURL_RUNTIME build loads libcurl first). KS_OK;
 * KS_E_UNSUPPORTED when libcurl cannot be loaded (err says what to install); KS_E_NET. */
KS_NODISCARD ks_status ks__curl_init_once(ks_error *err);
/* The remote object of st (st->remote) with the options applied; no request made. */
KS_NODISCARD ks_status ks__remote_new(ks_storage *st, const ks_storage_opts *o, int s3, ks_error *err);

/* ---- table functions shared or defined outside s3.c (ctx = ks__remote) ---- */
int ks__s3_open_fn(void *ctx, const char *path, int *fd, uint64_t *size);
int ks__remote_read_fn(void *ctx, int fd, void *buf, size_t n, uint64_t off, size_t *got);
int ks__s3_stat_fn(void *ctx, const char *path, ks_io_stat *st);
int ks__s3_list_fn(void *ctx, const char *dir, const char *prefix, ks_io_list_cb cb, void *cb_ctx);
int ks__s3_readlink_fn(void *ctx, const char *path, char *buf, size_t cap, size_t *len);
/* A reading handle for url whose size is known; p (the answer that gave the size, or NULL) gives its validator. */
int ks__remote_open_url(ks__remote *r, char *url, uint64_t size, const ks__resp *p, int *fd);

/* ---- S3 run directory locks (lease.c) ---- */
int ks__s3_lock_fn(void *ctx, const char *path, const char *owner, int *handle, char *holder, size_t cap);
int ks__s3_unlock_fn(void *ctx, int handle);
/* Before an upload to `path`: ENOLCK when path is in the directory of a lease this object lost (another
 * manager took it over), after renewing a lease that is overdue; else 0. */
int ks__lease_check(ks__remote *r, const char *path);
/* Stops every renewal (ks_storage_free); the lease objects stay, as when a process dies. */
void ks__leases_free(ks__remote *r);

#endif
