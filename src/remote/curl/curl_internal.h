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
} ks__slot;

struct ks__remote {
  ks_allocator alloc;
  int s3;
  char *base;            /* S3: ".../bucket" (path style) or "https://bucket.host"; HTTP: unused */
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
} ks__req;

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
  const ks_allocator *alloc;
} ks__resp;

/* Performs q with the retries; returns 0 for a 2xx answer, else an errno value (last error recorded).
 * A 404 is returned as ENOENT without being recorded when quiet_404. */
int ks__http_do(ks__remote *r, const ks__req *q, ks__resp *p, int quiet_404);
void ks__resp_free(ks__resp *p);
/* Records the detail of a failure (printf-like) as the remote's last error, of class KS_E_IO. */
void ks__remote_fail(ks__remote *r, const char *fmt, ...) KS__PRINTF(2, 3);
/* The same with its class: KS_E_NET (deadline, network) or KS_E_LIMIT (a budget or cap). */
void ks__remote_fail_as(ks__remote *r, ks_status cls, const char *fmt, ...) KS__PRINTF(3, 4);
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
/* A reading handle for url whose size is known. */
int ks__remote_open_url(ks__remote *r, char *url, uint64_t size, int *fd);

#endif
