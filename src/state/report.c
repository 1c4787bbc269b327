/* The load report: one line per component that was loaded, changed or left out. */
#include <stdio.h>
#include <string.h>

#include "state/state_internal.h"

/* Items are stored as the public struct; the strings are owned (hence the casts in free). */
typedef ks_load_item report_item;

struct ks_load_report {
  ks_allocator alloc;
  report_item *items;
  size_t count, cap;
  uint64_t *hashes;  /* of each item's path, for the index */
  size_t cap_hashes;
  ks__hindex index;  /* first item of each path */
};

static uint64_t item_hash(const void *ctx, size_t i) { return ((const ks_load_report *)ctx)->hashes[i]; }

static const char *item_key(const void *ctx, size_t i, size_t *len) {
  const char *p = ((const ks_load_report *)ctx)->items[i].path;
  *len = strlen(p);
  return p;
}

static const ks__hindex_ops report_ops = {item_hash, item_key};

ks_status ks_load_report_create(const ks_allocator *alloc, ks_load_report **out, ks_error *err) {
  if (!out) return ks__err(err, KS_E_INVALID, "ks_load_report_create: NULL out");
  ks_load_report *r = ks__calloc(alloc, 1, sizeof *r);
  if (!r) return ks__err(err, KS_E_NOMEM, "out of memory for a load report");
  r->alloc = *ks__alloc_or_default(alloc);
  *out = r;
  return KS_OK;
}

void ks__load_report_clear(ks_load_report *r) {
  if (!r) return;
  for (size_t i = 0; i < r->count; i++) {
    ks__free(&r->alloc, (char *)r->items[i].path);
    ks__free(&r->alloc, (char *)r->items[i].reason);
  }
  r->count = 0;
  ks__hindex_rebuild(&r->index, 0, &report_ops, r);
}

void ks_load_report_free(ks_load_report *r) {
  if (!r) return;
  ks__load_report_clear(r);
  ks__free(&r->alloc, r->items);
  ks__free(&r->alloc, r->hashes);
  ks__hindex_free(&r->index, &r->alloc);
  ks__free(&r->alloc, r);
}

static KS_NODISCARD ks_status grow(ks_load_report *r) {
  ks_status s = ks__grow(&r->alloc, &r->items, &r->cap, r->count + 1, sizeof *r->items);
  if (!s) s = ks__grow(&r->alloc, &r->hashes, &r->cap_hashes, r->count + 1, sizeof *r->hashes);
  if (!s) s = ks__hindex_reserve(&r->index, &r->alloc, r->count + 1, r->count, &report_ops, r);
  return s;
}

static long find_path(const ks_load_report *r, const char *path, size_t len, uint64_t h) {
  return ks__hindex_find(&r->index, path, len, h, &report_ops, r);
}

ks_status ks_load_report_add(ks_load_report *r, ks_load_kind kind, const char *path, const char *reason,
                             ks_error *err) {
  if (!r) return KS_OK; /* a NULL report means the caller does not want one */
  if (!path || !reason) return ks__err_at(err, KS_E_INVALID, NULL, path, -1, "ks_load_report_add: NULL path or reason");
  if (kind < KS_LOAD_LOADED || kind > KS_LOAD_MISMATCHED)
    return ks__err_at(err, KS_E_INVALID, NULL, path, -1, "ks_load_report_add: unknown kind %d", (int)kind);
  ks_status s = grow(r);
  if (s) return ks__err_at(err, s, NULL, path, -1, "cannot report on '%.200s': %s", path, ks_strerror(s));
  char *p = ks__strdup(&r->alloc, path), *why = ks__strdup(&r->alloc, reason);
  if (!p || !why) {
    ks__free(&r->alloc, p);
    ks__free(&r->alloc, why);
    return ks__err_at(err, KS_E_NOMEM, NULL, path, -1, "out of memory reporting on '%.200s'", path);
  }
  size_t len = strlen(p);
  uint64_t h = ks__hash(p, len);
  int first = find_path(r, p, len, h) < 0;
  r->hashes[r->count] = h;
  r->items[r->count] = (report_item){kind, p, why};
  if (first) ks__hindex_insert(&r->index, r->count, h);
  r->count++;
  return KS_OK;
}

size_t ks_load_report_count(const ks_load_report *r, ks_load_kind kind) {
  if (kind == KS_LOAD_ANY) return r ? r->count : 0;
  size_t n = 0;
  for (size_t i = 0; r && i < r->count; i++) n += r->items[i].kind == kind;
  return n;
}

ks_status ks_load_report_at(const ks_load_report *r, size_t i, ks_load_item *out) {
  if (!r || i >= r->count || !out) return KS_E_NOTFOUND;
  *out = r->items[i];
  return KS_OK;
}

const ks_load_item *ks_load_report_find(const ks_load_report *r, const char *path) {
  if (!r || !path) return NULL;
  size_t len = strlen(path);
  long i = find_path(r, path, len, ks__hash(path, len));
  return i < 0 ? NULL : &r->items[i];
}

static const char *const kind_names[] = {"loaded", "migrated", "converted", "skipped", "missing", "mismatched"};

const char *ks_load_kind_name(ks_load_kind kind) {
  return (unsigned)kind < sizeof kind_names / sizeof kind_names[0] ? kind_names[kind] : "?";
}

void ks_load_report_print(const ks_load_report *r, FILE *out) {
  if (!out) return;
  size_t nk = sizeof kind_names / sizeof kind_names[0];
  for (size_t k = 0; k < nk; k++)
    for (size_t i = 0; r && i < r->count; i++)
      if ((size_t)r->items[i].kind == k)
        fprintf(out, "  %-10s %s: %s\n", kind_names[k], r->items[i].path, r->items[i].reason);
  fprintf(out, "  summary:");
  for (size_t k = 0; k < nk; k++) fprintf(out, " %zu %s%s", ks_load_report_count(r, (ks_load_kind)k),
                                          kind_names[k], k + 1 < nk ? "," : "\n");
}
