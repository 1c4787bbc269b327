#include "testutil.h"

#include "core/nosync/io_nosync.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* Each block carries a header so `live` can be tracked without a table. */
typedef struct hdr {
  size_t size;
  size_t pad;
} hdr;

static int should_fail(ks_test_alloc *ta) {
  ta->calls++;
  if (ta->fail_at <= 0) return 0;
  return ta->sticky ? ta->calls >= ta->fail_at : ta->calls == ta->fail_at;
}

static void *t_malloc(void *ctx, size_t n) {
  ks_test_alloc *ta = ctx;
  if (should_fail(ta)) return NULL;
  hdr *h = malloc(sizeof(hdr) + (n ? n : 1));
  if (!h) return NULL;
  h->size = n;
  ta->live++;
  return h + 1;
}

static void t_free(void *ctx, void *p) {
  ks_test_alloc *ta = ctx;
  if (!p) return;
  ta->live--;
  free((hdr *)p - 1);
}

static void *t_realloc(void *ctx, void *p, size_t n) {
  ks_test_alloc *ta = ctx;
  if (!p) return t_malloc(ctx, n);
  if (should_fail(ta)) return NULL;
  hdr *h = realloc((hdr *)p - 1, sizeof(hdr) + (n ? n : 1));
  if (!h) return NULL;
  h->size = n;
  return h + 1;
}

void ks_test_alloc_init(ks_test_alloc *ta, long fail_at) {
  memset(ta, 0, sizeof *ta);
  ta->a.malloc_fn = t_malloc;
  ta->a.realloc_fn = t_realloc;
  ta->a.free_fn = t_free;
  ta->a.ctx = ta;
  ta->fail_at = fail_at;
}

char *ks_test_tmpdir(const char *tag) {
  const char *base = getenv("TMPDIR");
  char tmpl[4096];
  snprintf(tmpl, sizeof tmpl, "%s/ks-%s-XXXXXX", base && *base ? base : "/tmp", tag);
  if (!mkdtemp(tmpl)) return NULL;
  return strdup(tmpl);
}

void ks_test_rmtree(const char *path) {
  DIR *d = opendir(path);
  if (!d) {
    unlink(path);
    return;
  }
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char *p = ks_test_path(path, e->d_name);
    struct stat st;
    if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode))
      ks_test_rmtree(p);
    else
      unlink(p);
    free(p);
  }
  closedir(d);
  rmdir(path);
}

char *ks_test_path(const char *dir, const char *name) {
  size_t n = strlen(dir) + strlen(name) + 2;
  char *p = malloc(n);
  if (p) snprintf(p, n, "%s/%s", dir, name);
  return p;
}

uint8_t *ks_test_read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
  if (buf && n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    buf = NULL;
  }
  fclose(f);
  if (buf && len) *len = (size_t)n;
  return buf;
}

int ks_test_write_file(const char *path, const void *data, size_t len) {
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  size_t w = len ? fwrite(data, 1, len, f) : 0;
  return (fclose(f) == 0 && w == len) ? 0 : -1;
}

int ks_test_run(const char *cmd, char **out) {
  char full[8192];
  snprintf(full, sizeof full, "(%s) 2>&1", cmd);
  FILE *p = popen(full, "r");
  if (!p) return -1;
  size_t cap = 4096, len = 0;
  char *buf = malloc(cap);
  size_t n;
  while (buf && (n = fread(buf + len, 1, cap - len - 1, p)) > 0) {
    len += n;
    if (len + 1 == cap) {
      char *nb = realloc(buf, cap *= 2);
      if (!nb) free(buf);
      buf = nb;
    }
  }
  int status = pclose(p);
  if (buf) buf[len] = '\0';
  if (out)
    *out = buf;
  else
    free(buf);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int ks_test_exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

int ks_test_dir_entries(const char *dir) {
  DIR *d = opendir(dir);
  int n = 0;
  struct dirent *e;
  while (d && (e = readdir(d)) != NULL)
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
  if (d) closedir(d);
  return n;
}

const ks_io *ks_test_io_nosync(void) { return ks__io_posix_nosync(); }

uint32_t ks_test_to_bits(ks_dtype dt, float f) {
  uint8_t b[2] = {0, 0};
  ks_dtype_set_f64(dt, b, 0, (double)f);
  return ks_dtype_size(dt) == 2 ? (uint32_t)b[0] | (uint32_t)b[1] << 8 : b[0];
}

float ks_test_from_bits(ks_dtype dt, uint32_t bits) {
  uint8_t b[2] = {(uint8_t)bits, (uint8_t)(bits >> 8)};
  return (float)ks_dtype_get_f64(dt, b, 0);
}

ks_status ks_test_torch_load_buffer(const void *buf, size_t len, const ks_torch_read_opts *opts, ks_statedict **out,
                                    char **structure, ks_error *err) {
  ks_torch_read_opts o = {0};
  if (opts) o = *opts;
  o.data = buf;
  o.data_len = len;
  return ks_torch_load(NULL, &o, out, structure, err);
}

ks_status ks_test_torch_import_buffer(const void *buf, size_t len, const ks_import_opts *opts, ks_statedict **out,
                                      ks_meta **meta, ks_error *err) {
  ks_import_opts io = {0};
  ks_torch_read_opts o = {0};
  if (opts) io = *opts;
  if (io.read) o = *io.read;
  o.data = buf;
  o.data_len = len;
  io.read = &o;
  return ks_torch_import(NULL, &io, out, meta, err);
}

ks_status ks_test_save(ks_stateful cb, ks_statedict *dst, const char *prefix, ks_error *err) {
  return cb.to_state_dict(cb.ctx, dst, prefix, err);
}

ks_status ks_test_load(ks_stateful cb, const ks_statedict *src, const char *prefix, ks_error *err) {
  return cb.load_state_dict(cb.ctx, src, prefix, err);
}
