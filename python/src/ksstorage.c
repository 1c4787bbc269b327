/*
 * Storage locations for the extension's file functions: a plain path (or file://) is the local
 * file system, as before; s3:// and http(s):// go through the library's storage layer
 * (ks_storage_open: its table and its path), so save_file, load_file, safe_open,
 * save_checkpoint, load_checkpoint and the manager take them unchanged.
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
