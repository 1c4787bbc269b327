/*
 * Storage locations: which backend a location names, and the object that owns
 * its I/O table. The local backend is ks_io_posix(); S3 and HTTP live in
 * curl/ and exist only in a build with libcurl.
 */
#include <stdio.h>
#include <string.h>

#include "remote/remote_internal.h"

static KS_NODISCARD ks_status open_local(ks_storage *st, const char *location, ks_error *err) {
  const char *path = NULL;
  ks_status s = ks_io_local_path(location, &path, err);
  if (s) return s;
  st->io = *ks_io_posix();
  st->path = ks__strdup(&st->alloc, path);
  return st->path ? KS_OK : ks__err(err, KS_E_NOMEM, "out of memory");
}

#ifdef KS_HAVE_CURL
static KS_NODISCARD ks_status open_remote(ks_storage *st, const char *location, const ks_storage_opts *o,
                                          ks_error *err) {
  if (!strncmp(location, "s3://", 5)) {
    st->kind = KS__ST_S3;
    return ks__s3_open(st, location + 5, o, err);
  }
  st->kind = KS__ST_HTTP;
  return ks__http_open(st, location, o, err);
}
#else
static KS_NODISCARD ks_status open_remote(ks_storage *st, const char *location, const ks_storage_opts *o,
                                          ks_error *err) {
  (void)st;
  (void)o;
  return ks__err_at(err, KS_E_UNSUPPORTED, location, NULL, -1,
                    "remote storage needs libcurl: this keepsake was built without it (KS_WITH_CURL=OFF "
                    "or libcurl not found)");
}
#endif

static int is_remote_scheme(const char *l) {
  return !strncmp(l, "s3://", 5) || !strncmp(l, "http://", 7) || !strncmp(l, "https://", 8);
}

ks_status ks_storage_open(const char *location, const ks_storage_opts *opts, ks_storage **out, ks_error *err) {
  if (!location || !*location || !out) return ks__err(err, KS_E_INVALID, "storage: location and out are required");
  KS__TAKE_OPTS(ks_storage_opts, opts, KS__V1_SIZE(ks_storage_opts, parallel), err);
  *out = NULL;
  const ks_allocator *a = ks__alloc_or_default(opts->alloc);
  ks_storage *st = ks__calloc(a, 1, sizeof *st);
  if (!st) return ks__err(err, KS_E_NOMEM, "out of memory");
  st->alloc = *a;
  ks_status s = is_remote_scheme(location) ? open_remote(st, location, opts, err) : open_local(st, location, err);
  if (s) {
    ks_storage_free(st);
    return s;
  }
  *out = st;
  return KS_OK;
}

/* The local table is ks_io_posix() itself: writers recognise it (stale temporary files, locks). */
const ks_io *ks_storage_io(const ks_storage *st) {
  if (!st) return NULL;
  return st->kind == KS__ST_LOCAL ? ks_io_posix() : &st->io;
}

const char *ks_storage_path(const ks_storage *st) { return st ? st->path : NULL; }

int ks_storage_is_remote(const ks_storage *st) { return st && st->kind != KS__ST_LOCAL; }

int ks_storage_is_read_only(const ks_storage *st) { return st && st->kind == KS__ST_HTTP; }

size_t ks_storage_last_error(const ks_storage *st, char *buf, size_t cap) {
#ifdef KS_HAVE_CURL
  if (st && st->remote) return ks__remote_last_error(st->remote, buf, cap);
#else
  (void)st;
#endif
  if (buf && cap) buf[0] = '\0';
  return 0;
}

ks_status ks_storage_last_status(const ks_storage *st, ks_error *err) {
#ifdef KS_HAVE_CURL
  if (st && st->remote) {
    char msg[1024];
    ks_status s = ks__remote_last_status(st->remote, msg, sizeof msg);
    return s ? ks__err(err, s, "%s", msg) : KS_OK;
  }
#else
  (void)st;
#endif
  (void)err;
  return KS_OK;
}

void ks_storage_free(ks_storage *st) {
  if (!st) return;
#ifdef KS_HAVE_CURL
  ks__remote_free(st->remote);
#endif
  ks__free(&st->alloc, st->path);
  ks__free(&st->alloc, st);
}
