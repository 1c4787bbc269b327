/* The conversion report, the output check and the --ignore pruning of ks_convert. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "convert/convert_internal.h"
#include "core/json.h"
#include "keepsake/torch.h"

ks_convert_report *ks__convert_report_new(const ks_allocator *a) {
  ks_convert_report *r = ks__calloc(a, 1, sizeof *r);
  if (r) r->a = ks__alloc_or_default(a);
  return r;
}

void ks__convert_warn(ks_convert_report *r, const ks_error *problem, const char *file) {
  if (!r) return;
  size_t i = r->n_warnings++;
  if (i >= KS_CONVERT_MAX_WARNINGS || ks__grow(r->a, &r->warnings, &r->cap, i + 1, sizeof *r->warnings)) return;
  r->warnings[i] = *problem; /* read from a buffer: its file is the input's */
  snprintf(r->warnings[i].file, sizeof r->warnings[i].file, "%s", file);
}

size_t ks_convert_report_written(const ks_convert_report *r) { return r ? r->written : 0; }
size_t ks_convert_report_ignored(const ks_convert_report *r) { return r ? r->ignored : 0; }
size_t ks_convert_report_list_states(const ks_convert_report *r) { return r ? r->list_states : 0; }
size_t ks_convert_report_warning_count(const ks_convert_report *r) { return r ? r->n_warnings : 0; }

const ks_error *ks_convert_report_warning(const ks_convert_report *r, size_t i) {
  return r && i < r->n_warnings && i < r->cap ? &r->warnings[i] : NULL;
}

void ks_convert_report_free(ks_convert_report *r) {
  if (!r) return;
  ks__free(r->a, r->warnings);
  ks__free(r->a, r);
}

/* What an existing output is, when it may not be replaced; NULL when it may. */
static const char *refused_kind(const struct stat *sb) {
  return S_ISLNK(sb->st_mode)    ? "a symbolic link (it is neither followed nor replaced)"
         : S_ISDIR(sb->st_mode)  ? "a directory"
         : S_ISCHR(sb->st_mode)  ? "a character device"
         : S_ISBLK(sb->st_mode)  ? "a block device"
         : S_ISFIFO(sb->st_mode) ? "a FIFO"
         : S_ISSOCK(sb->st_mode) ? "a socket"
         : !S_ISREG(sb->st_mode) ? "not a regular file"
         : !(sb->st_mode & 0222) ? "a read-only file (make it writable or remove it to replace it)"
                                 : NULL;
}

ks_status ks__convert_check_output(const char *out, ks_error *err) {
  struct stat sb;
  if (lstat(out, &sb) != 0)
    return errno == ENOENT ? KS_OK
                           : ks__err_at(err, KS_E_IO, out, NULL, -1, "cannot check output: %s", strerror(errno));
  const char *what = refused_kind(&sb);
  if (!what) return KS_OK;
  return ks__err_at(err, KS_E_INVALID, out, NULL, -1, "output exists and is %s; refusing to replace it", what);
}

typedef struct globs {
  const char *const *g;
  size_t n;
} globs;

static int ignored(void *ctx, const char *path) {
  const globs *gl = ctx;
  for (size_t i = 0; i < gl->n; i++)
    if (*path && ks_path_match(gl->g[i], path)) return 1;
  return 0;
}

/* The structure document without the containers the globs match; a document that does not parse
   is kept as it is (the .pt writer names what is wrong with it). */
static KS_NODISCARD ks_status prune_structure(ks_meta *meta, const ks_allocator *a, globs *gl, ks_error *err) {
  const char *text = ks_meta_get(meta, KS_TORCH_STRUCTURE_META);
  if (!text) return KS_OK;
  ks__jv *doc = NULL;
  ks_error perr;
  ks_status st = ks__jv_parse(a, text, strlen(text), KS_TORCH_STRUCTURE_META, &doc, &perr);
  if (st == KS_E_NOMEM) return ks__err(err, st, "convert: out of memory reading the structure document");
  if (st) return KS_OK;
  ks__jv *pruned = ks__jv_copy_pruned(a, doc, "containers", ignored, gl);
  char *dump = pruned ? ks__jv_dump(a, pruned, false) : NULL;
  st = dump ? ks_meta_set(meta, KS_TORCH_STRUCTURE_META, dump, NULL) : KS_E_NOMEM;
  ks__free(a, dump);
  ks__jv_free(a, pruned);
  ks__jv_free(a, doc);
  return st ? ks__err(err, st, "convert: out of memory pruning the structure document") : KS_OK;
}

ks_status ks__convert_ignore(const ks_statedict *src, const char *const *g, size_t n, ks_meta *meta,
                             ks_statedict **out, ks_error *err) {
  *out = NULL;
  if (!n) return KS_OK;
  globs gl = {g, n};
  ks_statedict *dst;
  ks_status st = ks_statedict_create(ks__statedict_allocator(src), &dst, NULL);
  ks_entry e;
  for (size_t i = 0; !st && ks_statedict_at(src, i, &e) == KS_OK; i++)
    if (!ignored(&gl, e.name)) st = ks_statedict_set_entry(dst, e.name, &e, KS_BORROW, NULL);
  if (st) st = ks__err(err, st, "convert: out of memory leaving out ignored entries");
  if (!st) st = prune_structure(meta, ks__statedict_allocator(src), &gl, err);
  if (st) ks_statedict_free(dst);
  else *out = dst;
  return st;
}
