#include <stdlib.h>
#include <string.h>

#include "core/internal.h"

static void *libc_malloc(void *ctx, size_t n) {
  (void)ctx;
  return malloc(n ? n : 1);
}
static void *libc_realloc(void *ctx, void *p, size_t n) {
  (void)ctx;
  return realloc(p, n ? n : 1);
}
static void libc_free(void *ctx, void *p) {
  (void)ctx;
  free(p);
}

static const ks_allocator libc_allocator = {libc_malloc, libc_realloc, libc_free, NULL};

const ks_allocator *ks__alloc_or_default(const ks_allocator *a) { return a ? a : &libc_allocator; }

void *ks__malloc(const ks_allocator *a, size_t n) {
  a = ks__alloc_or_default(a);
  return a->malloc_fn(a->ctx, n);
}

void *ks__calloc(const ks_allocator *a, size_t count, size_t size) {
  size_t n;
  if (!ks__mul_size(count, size, &n)) return NULL;
  void *p = ks__malloc(a, n);
  if (p) memset(p, 0, n);
  return p;
}

void *ks__realloc(const ks_allocator *a, void *p, size_t n) {
  a = ks__alloc_or_default(a);
  return a->realloc_fn(a->ctx, p, n);
}

void ks__free(const ks_allocator *a, void *p) {
  if (!p) return;
  a = ks__alloc_or_default(a);
  a->free_fn(a->ctx, p);
}

char *ks__strndup(const ks_allocator *a, const char *s, size_t n) {
  char *d = ks__malloc(a, n + 1);
  if (!d) return NULL;
  memcpy(d, s, n);
  d[n] = '\0';
  return d;
}

char *ks__strdup(const ks_allocator *a, const char *s) { return ks__strndup(a, s, strlen(s)); }

ks_status ks__grow(const ks_allocator *a, void *arrayp, size_t *cap, size_t need, size_t size) {
  if (need <= *cap) return KS_OK;
  size_t ncap = *cap ? *cap : 16, bytes;
  while (ncap < need)
    if (!ks__mul_size(ncap, 2, &ncap)) return KS_E_LIMIT;
  if (!ks__mul_size(ncap, size, &bytes)) return KS_E_LIMIT;
  void *old, *p;
  memcpy(&old, arrayp, sizeof old); /* arrayp points to a T*, read without type punning */
  p = ks__realloc(a, old, bytes);
  if (!p) return KS_E_NOMEM;
  memcpy(arrayp, &p, sizeof p);
  *cap = ncap;
  return KS_OK;
}
