/* The version rules of ks_io and the compound operations built on its primitives. */
#include "core/io_ops.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "core/internal.h"

#define PATH_CAP 4096

const ks_io *ks__io_v1(const ks_io *io) { return io ? io : ks_io_posix(); }

const ks_io *ks__io_v2(const ks_io *io) { return io && io->version >= 2 ? io : ks_io_posix(); }

int ks__io_read_mode(const ks_io *io) {
  if (ks_io_check(io, NULL)) return 0; /* KS_READ_MMAP */
  return ks__io_v2(io)->map_fn ? 0 : 2; /* KS_READ_MMAP : KS_READ_LAZY (format.h) */
}

int ks__io_rmdir(const ks_io *io, const char *path) {
  const ks_io *t = io && io->version >= 3 ? io : ks_io_posix();
  return t->rmdir_fn ? t->rmdir_fn(t->ctx, path) : 0;
}

/*
 * The targets of the `latest` links along path, one per line, into sig (cap bytes). 0 when at
 * least one such link was read, else nonzero (no `latest` in the path, or none is a link).
 */
static int latest_targets(const ks_io *t, const char *path, char *sig, size_t cap) {
  char prefix[PATH_CAP];
  size_t used = 0, n = strlen(path), name_len = strlen(KS__LATEST);
  int found = 0;
  sig[0] = '\0';
  for (size_t i = 0; i + name_len <= n && n < sizeof prefix; i++) {
    if ((i && path[i - 1] != '/') || strncmp(path + i, KS__LATEST, name_len) ||
        (path[i + name_len] && path[i + name_len] != '/'))
      continue;
    memcpy(prefix, path, i + name_len);
    prefix[i + name_len] = '\0';
    size_t len = 0;
    if (used + 2 >= cap || t->readlink_fn(t->ctx, prefix, sig + used, cap - used - 2, &len)) continue;
    used += len < cap - used - 2 ? len : cap - used - 2;
    sig[used++] = '\n';
    sig[used] = '\0';
    found = 1;
  }
  return !found;
}

int ks__io_open_follow(const ks_io *io, const char *path, int *fd, uint64_t *size) {
  const ks_io *t = ks__io_v2(io);
  int rc = t->open_fn(t->ctx, path, fd, size);
  char before[PATH_CAP], after[PATH_CAP];
  if (rc != ENOENT || !t->readlink_fn || latest_targets(t, path, before, sizeof before)) return rc;
  for (int i = 0; i < KS__LATEST_TRIES; i++) {
    rc = t->open_fn(t->ctx, path, fd, size); /* through the link as it is now */
    if (rc != ENOENT || latest_targets(t, path, after, sizeof after) || !strcmp(before, after)) return rc;
    memcpy(before, after, sizeof before); /* moved on since: the next one may be there */
  }
  return rc;
}

int ks__io_validator(const ks_io *io, int fd, char *buf, size_t cap) {
  if (!io || io->version < 6 || !io->validator_fn) return ENOTSUP;
  return io->validator_fn(io->ctx, fd, buf, cap);
}

size_t ks__io_detail(const ks_io *io, int rc, char *buf, size_t cap) {
  if (buf && cap) buf[0] = '\0';
  if (!io || io->version < 6 || !io->detail_fn || !buf || !cap) return 0;
  size_t n = io->detail_fn(io->ctx, rc, buf, cap);
  buf[cap - 1] = '\0'; /* a table's own answer: never trusted to terminate */
  return n;
}

const char *ks__io_why(const ks_io *io, int rc, char *buf, size_t cap) {
  char detail[KS__IO_WHY_MAX];
  if (!buf || !cap) return "";
  if (ks__io_detail(io, rc, detail, sizeof detail) && detail[0])
    snprintf(buf, cap, "%s (%s)", strerror(rc), detail);
  else snprintf(buf, cap, "%s", strerror(rc));
  return buf;
}

ks_status ks_io_check(const ks_io *io, ks_error *err) {
  if (!io) return KS_OK;
  if (io->version == 0) return ks__err(err, KS_E_INVALID, "ks_io: version is 0 (set .version = KS_IO_VERSION)");
  struct {
    int set;
    const char *name;
  } v1[] = {{io->create_fn != NULL, "create_fn"}, {io->write_fn != NULL, "write_fn"},
            {io->fsync_fn != NULL, "fsync_fn"},   {io->close_fn != NULL, "close_fn"},
            {io->rename_fn != NULL, "rename_fn"}, {io->unlink_fn != NULL, "unlink_fn"},
            {io->fsync_dir_fn != NULL, "fsync_dir_fn"}};
  for (size_t i = 0; i < sizeof v1 / sizeof v1[0]; i++)
    if (!v1[i].set) return ks__err(err, KS_E_INVALID, "ks_io: %s is NULL", v1[i].name);
  if (io->version < 2) return KS_OK; /* the version 2 members are not even read */
  struct {
    int set;
    const char *name;
  } v2[] = {{io->open_fn != NULL, "open_fn"},   {io->read_fn != NULL, "read_fn"},
            {io->stat_fn != NULL, "stat_fn"},   {io->list_fn != NULL, "list_fn"},
            {io->mkdir_fn != NULL, "mkdir_fn"}, {io->symlink_fn != NULL, "symlink_fn"},
            {io->readlink_fn != NULL, "readlink_fn"}};
  for (size_t i = 0; i < sizeof v2 / sizeof v2[0]; i++)
    if (!v2[i].set)
      return ks__err(err, KS_E_INVALID, "ks_io: %s is NULL in a version %u table", v2[i].name, io->version);
  if (!io->map_fn != !io->unmap_fn)
    return ks__err(err, KS_E_INVALID, "ks_io: map_fn and unmap_fn must be set together");
  if (io->version < 4) return KS_OK;
  if (!io->lock_fn != !io->unlock_fn)
    return ks__err(err, KS_E_INVALID, "ks_io: lock_fn and unlock_fn must be set together");
  if ((io->caps & KS_IO_CAP_LOCK) && !io->lock_fn)
    return ks__err(err, KS_E_INVALID, "ks_io: caps has KS_IO_CAP_LOCK but lock_fn is NULL");
  return KS_OK;
}

ks_status ks_io_local_path(const char *location, const char **path, ks_error *err) {
  if (!location || !path || !*location) return ks__err(err, KS_E_INVALID, "storage location: empty");
  const char *p = location;
  if (!strncmp(location, "file://", 7)) p = location + 7;
  else if (strstr(location, "://"))
    return ks__err_at(err, KS_E_UNSUPPORTED, location, NULL, -1,
                      "storage location: only local paths and file:// are supported by this build");
  if (!*p) return ks__err(err, KS_E_INVALID, "storage location '%s': no path", location);
  *path = p;
  return KS_OK;
}

/* The parent directory of buf[0..len) (which has no trailing '/'), into out. */
static void parent_of(const char *buf, size_t len, char *out) {
  size_t i = len;
  while (i > 0 && buf[i - 1] != '/') i--;
  while (i > 1 && buf[i - 1] == '/') i--; /* "a//b" */
  if (i == 0) snprintf(out, PATH_CAP, ".");
  else snprintf(out, PATH_CAP, "%.*s", (int)i, buf);
}

/* fsync of the parent of buf[0..len), by the table's own fsync_dir_fn (a version 1 table has one). */
static KS_NODISCARD ks_status sync_parent(const ks_io *io, const char *buf, size_t len, ks_error *err) {
  const ks_io *v1 = ks__io_v1(io);
  char parent[PATH_CAP];
  parent_of(buf, len, parent);
  int rc = v1->fsync_dir_fn(v1->ctx, parent);
  char why[KS__IO_WHY_MAX];
  return rc ? ks__err_at(err, KS_E_IO, parent, NULL, -1, "fsync of the parent of '%s': %s", buf,
                         ks__io_why(v1, rc, why, sizeof why))
            : KS_OK;
}

/* Creates buf (one level) unless it is a directory already; fsyncs the parent after creating it. */
static KS_NODISCARD ks_status mkdir_one(const ks_io *orig, const char *buf, size_t len, int sync, ks_error *err) {
  const ks_io *io = ks__io_v2(orig);
  ks_io_stat st;
  int rc = io->stat_fn(io->ctx, buf, &st);
  if (rc == 0 && st.kind == KS_IO_DIR) return KS_OK;
  if (rc == 0 && st.kind != KS_IO_LINK)
    return ks__err_at(err, KS_E_IO, buf, NULL, -1, "mkdir: exists and is not a directory");
  if (rc == 0 || rc == ENOENT) rc = io->mkdir_fn(io->ctx, buf);
  if (rc == EEXIST) return KS_OK; /* created meanwhile, or a link to a directory */
  char why[KS__IO_WHY_MAX];
  if (rc) return ks__err_at(err, KS_E_IO, buf, NULL, -1, "mkdir: %s", ks__io_why(io, rc, why, sizeof why));
  return sync ? sync_parent(orig, buf, len, err) : KS_OK;
}

ks_status ks__io_mkdir_p(const ks_io *io, const char *dir, ks_error *err) {
  char buf[PATH_CAP];
  size_t n = strlen(dir);
  while (n > 1 && dir[n - 1] == '/') n--;
  if (n >= sizeof buf) return ks__err(err, KS_E_LIMIT, "directory path too long");
  memcpy(buf, dir, n);
  buf[n] = '\0';
  for (size_t i = 1; i < n; i++) {
    if (buf[i] != '/' || buf[i - 1] == '/') continue;
    buf[i] = '\0';
    ks_status s = mkdir_one(io, buf, i, 1, err);
    buf[i] = '/';
    if (s) return s;
  }
  /* The last one's parent always: its entry may date from a run that crashed before making it durable. */
  ks_status s = mkdir_one(io, buf, n, 0, err);
  return s ? s : sync_parent(io, buf, n, err);
}

ks_status ks__io_pointer_set(const ks_io *io, const char *dir, const char *name, const char *target,
                             ks_error *err) {
  const ks_io *v1 = ks__io_v1(io), *v2 = ks__io_v2(io);
  char tmp[PATH_CAP], dst[PATH_CAP];
  int a = snprintf(tmp, sizeof tmp, "%s/.%s.tmp", dir, name), b = snprintf(dst, sizeof dst, "%s/%s", dir, name);
  if (a < 0 || b < 0 || (size_t)a >= sizeof tmp || (size_t)b >= sizeof dst)
    return ks__err(err, KS_E_LIMIT, "pointer path too long");
  char why[KS__IO_WHY_MAX];
  int rc = v1->unlink_fn(v1->ctx, tmp); /* a stale link of a save that was killed */
  if (rc && rc != ENOENT)
    return ks__err_at(err, KS_E_IO, tmp, NULL, -1, "cannot remove stale link: %s", ks__io_why(v1, rc, why, sizeof why));
  if ((rc = v2->symlink_fn(v2->ctx, target, tmp)) != 0)
    return ks__err_at(err, KS_E_IO, tmp, NULL, -1, "symlink: %s", ks__io_why(v2, rc, why, sizeof why));
  if ((rc = v1->rename_fn(v1->ctx, tmp, dst)) != 0) {
    ks__io_why(v1, rc, why, sizeof why); /* before the unlink below can replace the table's account */
    v1->unlink_fn(v1->ctx, tmp); /* best effort: autoresume removes it too; the rename error is what matters */
    return ks__err_at(err, KS_E_IO, dst, NULL, -1, "rename: %s", why);
  }
  rc = v1->fsync_dir_fn(v1->ctx, dir);
  return rc ? ks__err_at(err, KS_E_NOT_DURABLE, dir, NULL, -1, "'%s' updated, but fsync of the directory failed (%s): "
                         "durability unknown", name, ks__io_why(v1, rc, why, sizeof why))
            : KS_OK;
}
