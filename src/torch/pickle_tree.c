/*
 * Nodes of a pickle's value tree. Every node and buffer is owned by one arena
 * and freed with it, so shared references (memo) and cycles need no counting.
 */
#include <stdio.h>

#include "torch/torch_internal.h"

void ks__pk_arena_init(ks__pk_arena *ar, const ks_allocator *a) {
  memset(ar, 0, sizeof *ar);
  ar->alloc = *ks__alloc_or_default(a);
}

static void free_node(ks__pk_arena *ar, ks__pk_node *n) {
  switch (n->kind) {
    case PK_STR:
    case PK_BYTES:
    case PK_BIGINT: ks__free(&ar->alloc, n->u.s.p); break;
    case PK_TUPLE:
    case PK_LIST:
    case PK_SET:
    case PK_DICT: ks__free(&ar->alloc, n->u.seq.v); break;
    case PK_GLOBAL:
      ks__free(&ar->alloc, n->u.g.module);
      ks__free(&ar->alloc, n->u.g.name);
      break;
    default: break;
  }
  ks__free(&ar->alloc, n);
}

void ks__pk_arena_release(ks__pk_arena *ar) {
  for (ks__pk_node *n = ar->nodes, *next; n; n = next) {
    next = n->next_alloc;
    free_node(ar, n);
  }
  for (size_t i = 0; i < ar->nbufs; i++) ks__free(&ar->alloc, ar->bufs[i]);
  ks__free(&ar->alloc, ar->bufs);
  ks__zip_free(ar->zip);
  ar->nodes = NULL;
  ar->bufs = NULL;
  ar->nbufs = ar->capbufs = 0;
  ar->zip = NULL;
}

ks__pk_node *ks__pk_new(ks__pk_arena *ar, ks__pk_kind kind) {
  ks__pk_node *n = ks__calloc(&ar->alloc, 1, sizeof *n);
  if (!n) return NULL;
  n->kind = kind;
  n->next_alloc = ar->nodes;
  ar->nodes = n;
  return n;
}

ks__pk_node *ks__pk_new_str(ks__pk_arena *ar, ks__pk_kind kind, const void *p, size_t n) {
  char *copy = ks__malloc(&ar->alloc, n + 1);
  if (!copy) return NULL;
  if (n) memcpy(copy, p, n);
  copy[n] = 0;
  ks__pk_node *node = ks__pk_new(ar, kind);
  if (!node) {
    ks__free(&ar->alloc, copy);
    return NULL;
  }
  node->u.s.p = copy;
  node->u.s.n = n;
  return node;
}

ks__pk_node *ks__pk_new_global(ks__pk_arena *ar, const char *module, size_t mlen, const char *name,
                               size_t nlen) {
  char *m = ks__strndup(&ar->alloc, module, mlen), *nm = ks__strndup(&ar->alloc, name, nlen);
  ks__pk_node *g = m && nm ? ks__pk_new(ar, PK_GLOBAL) : NULL;
  if (!g) {
    ks__free(&ar->alloc, m);
    ks__free(&ar->alloc, nm);
    return NULL;
  }
  g->u.g.module = m;
  g->u.g.name = nm;
  return g;
}

bool ks__pk_push(ks__pk_arena *ar, ks__pk_seq *s, ks__pk_node *v) {
  if (ks__grow(&ar->alloc, &s->v, &s->cap, s->n + 1, sizeof *s->v)) return false;
  s->v[s->n++] = v;
  ar->work++;
  return true;
}

/* Magnitude of a two's complement integer as base-1e9 digits (least significant first),
 * by repeated division of 32-bit limbs: (n/4)^2/9 steps, about 10^5 for the largest. */
static size_t to_base1e9(const uint8_t *le, size_t n, int *neg, uint32_t *limbs, uint32_t *out) {
  size_t nl = (n + 3) / 4, nout = 0;
  unsigned carry = 1;
  *neg = (le[n - 1] & 0x80) != 0;
  memset(limbs, 0, nl * sizeof *limbs);
  for (size_t i = 0; i < n; i++) {
    unsigned b = le[i];
    if (*neg) b = (~b & 0xFFu) + carry, carry = b >> 8, b &= 0xFF;
    limbs[i / 4] |= (uint32_t)b << (8 * (i % 4));
  }
  while (nl && !limbs[nl - 1]) nl--;
  while (nl) {
    uint64_t rem = 0;
    for (size_t i = nl; i-- > 0;) {
      uint64_t cur = rem << 32 | limbs[i];
      limbs[i] = (uint32_t)(cur / 1000000000u);
      rem = cur % 1000000000u;
    }
    out[nout++] = (uint32_t)rem;
    while (nl && !limbs[nl - 1]) nl--;
  }
  return nout;
}

ks__pk_node *ks__pk_new_bigint(ks__pk_arena *ar, const uint8_t *le, size_t n) {
  ks__pk_node *node = ks__pk_new(ar, PK_BIGINT);
  if (!node || n == 0) return node;
  node->u.s.n = n;
  if (n > KS__PK_BIGINT_MAX) return node; /* no text: flattening refuses it, nothing else reads it */
  size_t nl = (n + 3) / 4, cap = nl * 10 / 9 + 2;
  uint32_t *limbs = ks__malloc(&ar->alloc, (nl + cap) * sizeof *limbs);
  char *text = ks__malloc(&ar->alloc, cap * 9 + 12);
  if (!limbs || !text) {
    ks__free(&ar->alloc, limbs);
    ks__free(&ar->alloc, text);
    return NULL;
  }
  int neg;
  uint32_t *digits = limbs + nl;
  size_t nd = to_base1e9(le, n, &neg, limbs, digits), len = 0;
  if (neg) text[len++] = '-';
  if (nd == 0) text[len++] = '0';
  for (size_t i = nd; i-- > 0;)
    len += (size_t)snprintf(text + len, 11, i + 1 == nd ? "%u" : "%09u", (unsigned)digits[i]);
  text[len] = 0;
  ks__free(&ar->alloc, limbs);
  node->u.s.p = text;
  node->u.s.n = len;
  return node;
}

void *ks__pk_buffer(ks__pk_arena *ar, size_t n) {
  if (ks__grow(&ar->alloc, &ar->bufs, &ar->capbufs, ar->nbufs + 1, sizeof *ar->bufs)) return NULL;
  void *p = ks__malloc(&ar->alloc, n ? n : 1);
  if (!p) return NULL;
  ar->bufs[ar->nbufs++] = p;
  ar->buf_bytes += n;
  return p;
}

int ks__pk_is_global(const ks__pk_node *g, const char *module, const char *name) {
  return g && g->kind == PK_GLOBAL && !strcmp(g->u.g.module, module) && !strcmp(g->u.g.name, name);
}

const char *ks__pk_kind_name(ks__pk_kind k) {
  static const char *const names[] = {"None",   "bool",   "int",    "int",     "float",   "str",
                                      "bytes",  "tuple",  "list",   "set",     "dict",    "global",
                                      "object", "storage", "tensor", "numpy.dtype"};
  return (size_t)k < sizeof names / sizeof names[0] ? names[k] : "?";
}
