/*
 * Storage locations for the extension's file functions: a plain path (or file://) is the local
 * file system, as before; s3:// and http(s):// go through the library's storage layer
 * (ks_storage_open: its table and its path), so save_file, load_file, safe_open,
 * save_checkpoint, load_checkpoint and the manager take them unchanged; readers and the manager
 * may read a remote location through a local read cache (ksp_loc_open, cache_dir=).
 */
#include <string.h>

#include "ksext.h"

int ksp_is_remote(const char *loc) {
  const char *sep = strstr(loc, "://");
  return sep && strncmp(loc, "file://", 7) != 0;
}

ks_status ksp_location(const char *loc, const ks_io *local_io, ks_storage **st, const ks_io **io, const char **path,
                       ks_error *err) {
  *st = NULL;
  if (!ksp_is_remote(loc)) {
    *io = local_io;
    return ks_io_local_path(loc, path, err);
  }
  ks_status s = ks_storage_open(loc, NULL, st, err);
  if (s) return s;
  *io = ks_storage_io(*st);
  *path = ks_storage_path(*st);
  return KS_OK;
}

ks_status ksp_loc_open(const char *loc, const ks_io *local_io, const char *cache_dir, ksp_loc *out, ks_error *err) {
  *out = (ksp_loc){0};
  ks_status s = ksp_location(loc, local_io, &out->store, &out->io, &out->path, err);
  if (!s && cache_dir && out->store) {
    s = ks_io_cache_create(out->io, cache_dir, NULL, &out->cache, err);
    if (!s) out->io = out->cache;
  }
  if (s) ksp_loc_close(out);
  return s;
}

void ksp_loc_close(ksp_loc *l) {
  ks_io_cache_free(l->cache); /* before the store whose table it wraps */
  ks_storage_free(l->store);
  *l = (ksp_loc){0};
}

PyObject *ksp_cache_stats_dict(const ks_io_cache_stats *s) {
  return Py_BuildValue("{sKsKsKsKsKsKsK}", "hit_reads", (unsigned long long)s->hit_reads, "hit_bytes",
                       (unsigned long long)s->hit_bytes, "miss_reads", (unsigned long long)s->miss_reads, "miss_bytes",
                       (unsigned long long)s->miss_bytes, "stored", (unsigned long long)s->stored, "store_failures",
                       (unsigned long long)s->store_failures, "rejected", (unsigned long long)s->rejected);
}

PyObject *ksp_cache_stats(const ks_io *cache) {
  if (!cache) Py_RETURN_NONE;
  ks_io_cache_stats s;
  ks_io_cache_get_stats(cache, &s);
  return ksp_cache_stats_dict(&s);
}
