/* The storage module: locations (storage.c) and, with libcurl, the S3 and HTTP backends (curl/). */
#ifndef KS_REMOTE_INTERNAL_H
#define KS_REMOTE_INTERNAL_H

#include "core/internal.h"
#include "keepsake/storage.h"

typedef struct ks__remote ks__remote;

enum { KS__ST_LOCAL = 0, KS__ST_S3 = 1, KS__ST_HTTP = 2 };

struct ks_storage {
  ks_allocator alloc;
  int kind;           /* KS__ST_* */
  char *path;         /* what ks_storage_path returns */
  ks_io io;           /* a copy of ks_io_posix() or the remote table (ctx = remote) */
  ks__remote *remote; /* NULL for a local location */
};

#ifdef KS_HAVE_CURL
/* Fills st->io, st->path and st->remote for "s3://" + rest (rest = "bucket[/prefix]"). */
KS_NODISCARD ks_status ks__s3_open(ks_storage *st, const char *rest, const ks_storage_opts *o, ks_error *err);
/* The same for an http(s):// URL (read-only). */
KS_NODISCARD ks_status ks__http_open(ks_storage *st, const char *url, const ks_storage_opts *o, ks_error *err);
void ks__remote_free(ks__remote *r);
size_t ks__remote_last_error(const ks__remote *r, char *buf, size_t cap);
/* The class of the last failure (KS_OK: none; KS_E_NET, KS_E_LIMIT, KS_E_IO) and its message into buf. */
KS_NODISCARD ks_status ks__remote_last_status(const ks__remote *r, char *buf, size_t cap);
#endif

#endif
