/*
 * Nodes of a pickle's value tree. Every node and buffer is owned by one arena
 * and freed with it, so shared references (memo) and cycles need no counting.
 * Nodes come in blocks (kept in the order they were made); strings, tuples'
 * items, objects and tensors from chunks handed out in order; only a list, set
 * or dict that grew past its first batch owns a block of its own. Everything is
 * counted in ar->mem against the budget ks__pk_run sets (ks__pk_charge).
 */
#include <stdio.h>

#include "torch/torch_internal.h"

/* What one malloc'd block costs beyond its bytes (glibc's header and rounding), so that `mem` follows what the
 * process really holds. */
#define ALLOC_OVERHEAD 16u
#define BLOCK_MAX 4096u            /* nodes per block at most (160 KiB) */
#define CHUNK_MIN ((size_t)4096)   /* the first chunk; each next one doubles, up to CHUNK_MAX */
#define CHUNK_MAX ((size_t)1 << 16)

struct ks__pk_block {
  ks__pk_block *next;
  size_t n, cap;
  ks__pk_node nodes[];
};

struct ks__pk_chunk {
  ks__pk_chunk *next;
  size_t used, cap;
  max_align_t data[]; /* cap bytes */
};

void ks__pk_arena_init(ks__pk_arena *ar, const ks_allocator *a) {
  memset(ar, 0, sizeof *ar);
  ar->alloc = *ks__alloc_or_default(a);
  ar->mem_max = UINT64_MAX;
}

bool ks__pk_charge(ks__pk_arena *ar, size_t n) {
  if (n > ar->mem_max || ar->mem > ar->mem_max - n) {
    ar->over_budget = true;
    return false;
  }
  ar->mem += n;
  if (ar->mem > ar->mem_peak) ar->mem_peak = ar->mem;
  return true;
}

void ks__pk_uncharge(ks__pk_arena *ar, size_t n) { ar->mem = n < ar->mem ? ar->mem - n : 0; }

ks_status ks__pk_nomem(const ks__pk_arena *ar, int64_t off, ks_error *err) {
  if (!ar->over_budget) return ks__err_at(err, KS_E_NOMEM, NULL, NULL, off, "pickle: out of memory");
  return ks__err_at(err, KS_E_LIMIT, NULL, NULL, off,
                    "pickle: needs more than %llu bytes of memory for its values, stack and memo (by default "
                    "%u per pickle byte + %llu MiB)",
                    (unsigned long long)ar->mem_max, KS__PK_MEM_PER_BYTE,
                    (unsigned long long)(KS__PK_MEM_BASE >> 20));
}

/* malloc, counted in mem (with its overhead). */
static void *counted_malloc(ks__pk_arena *ar, size_t n) {
  if (n > SIZE_MAX - ALLOC_OVERHEAD || !ks__pk_charge(ar, n + ALLOC_OVERHEAD)) return NULL;
  void *p = ks__malloc(&ar->alloc, n);
  if (!p) ks__pk_uncharge(ar, n + ALLOC_OVERHEAD);
  return p;
}

/* Sequences that grew past their first items own them (cap > 0); everything else lives in blocks and chunks. */
static void free_items(ks__pk_arena *ar) {
  for (ks__pk_block *b = ar->first; b; b = b->next)
    for (size_t i = 0; i < b->n; i++) {
      ks__pk_node *n = &b->nodes[i];
      bool seq = n->kind == PK_TUPLE || n->kind == PK_LIST || n->kind == PK_SET || n->kind == PK_DICT;
      if (seq && n->u.seq.cap) ks__free(&ar->alloc, n->u.seq.v);
    }
}

void ks__pk_arena_release(ks__pk_arena *ar) {
  free_items(ar);
  for (ks__pk_block *b = ar->first, *next; b; b = next) {
    next = b->next;
    ks__free(&ar->alloc, b);
  }
  for (ks__pk_chunk *c = ar->chunks, *next; c; c = next) {
    next = c->next;
    ks__free(&ar->alloc, c);
  }
  for (size_t i = 0; i < ar->nbufs; i++) ks__free(&ar->alloc, ar->bufs[i]);
  ks__free(&ar->alloc, ar->bufs);
  ks__zip_free(ar->zip);
  ks_allocator a = ar->alloc;
  ks__pk_arena_init(ar, &a);
}

ks__pk_node *ks__pk_new(ks__pk_arena *ar, ks__pk_kind kind) {
  ks__pk_block *b = ar->last;
  if (!b || b->n == b->cap) {
    size_t cap = b ? (b->cap < BLOCK_MAX ? b->cap * 2 : BLOCK_MAX) : 16;
    ks__pk_block *nb = counted_malloc(ar, sizeof *nb + cap * sizeof nb->nodes[0]);
    if (!nb) return NULL;
    nb->next = NULL;
    nb->n = 0;
    nb->cap = cap;
    if (b) b->next = nb;
    else ar->first = nb;
    ar->last = b = nb;
  }
  ks__pk_node *n = &b->nodes[b->n++];
  memset(n, 0, sizeof *n);
  n->kind = kind;
  return n;
}

const ks__pk_node *ks__pk_find_node(const ks__pk_arena *ar, bool (*fn)(const ks__pk_node *n)) {
  for (const ks__pk_block *b = ar->first; b; b = b->next)
    for (size_t i = 0; i < b->n; i++)
      if (fn(&b->nodes[i])) return &b->nodes[i];
  return NULL;
}

void *ks__pk_bytes(ks__pk_arena *ar, size_t n) {
  size_t need = (n + 7) & ~(size_t)7;
  if (need < n) return NULL;
  ks__pk_chunk *c = ar->chunks;
  if (!c || c->cap - c->used < need) {
    /* A request larger than a chunk gets one of its own, behind the current one, which stays open. */
    size_t cap = c ? (c->cap < CHUNK_MAX ? c->cap * 2 : CHUNK_MAX) : CHUNK_MIN;
    bool own = need > cap / 4;
    if (own) cap = need;
    if (cap > SIZE_MAX - sizeof *c) return NULL;
    ks__pk_chunk *nc = counted_malloc(ar, sizeof *nc + cap);
    if (!nc) return NULL;
    nc->used = 0;
    nc->cap = cap;
    if (own && c) {
      nc->next = c->next;
      c->next = nc;
    } else {
      nc->next = c;
      ar->chunks = nc;
    }
    c = nc;
  }
  void *p = (char *)c->data + c->used;
  c->used += need;
  return p;
}

ks__pk_node *ks__pk_new_none(ks__pk_arena *ar) {
  if (!ar->none) ar->none = ks__pk_new(ar, PK_NONE);
  return ar->none;
}

ks__pk_node *ks__pk_new_bool(ks__pk_arena *ar, bool v) {
  ks__pk_node **slot = &ar->bools[v];
  if (!*slot && (*slot = ks__pk_new(ar, PK_BOOL)) != NULL) (*slot)->u.i = v;
  return *slot;
}

/* A list of ints below 65536 (BININT2: 3 bytes each) would otherwise take a node per item, 11 times its
 * size; shapes and offsets repeat. Pages of 32 keep a few scattered ints cheap. */
#define INT_PAGE 32u
static ks__pk_node **int_slot(ks__pk_arena *ar, int64_t v) {
  size_t top = 65536 / INT_PAGE;
  if (!ar->ints && (ar->ints = ks__pk_bytes(ar, top * sizeof *ar->ints)) != NULL)
    memset(ar->ints, 0, top * sizeof *ar->ints);
  if (!ar->ints) return NULL;
  ks__pk_node ***page = &ar->ints[v / INT_PAGE];
  if (!*page && (*page = ks__pk_bytes(ar, INT_PAGE * sizeof **page)) != NULL)
    memset(*page, 0, INT_PAGE * sizeof **page);
  return *page ? &(*page)[v % INT_PAGE] : NULL;
}

ks__pk_node *ks__pk_new_int(ks__pk_arena *ar, int64_t v) {
  ks__pk_node *n, **slot = NULL;
  if (v >= 0 && v < 65536) {
    if (!(slot = int_slot(ar, v))) return NULL;
    if (*slot) return *slot;
  }
  if ((n = ks__pk_new(ar, PK_INT)) != NULL) n->u.i = v;
  if (slot) *slot = n;
  return n;
}

ks__pk_node *ks__pk_new_str(ks__pk_arena *ar, ks__pk_kind kind, const void *p, size_t n) {
  char *copy = n < SIZE_MAX ? ks__pk_bytes(ar, n + 1) : NULL;
  ks__pk_node *node = copy ? ks__pk_new(ar, kind) : NULL;
  if (!node) return NULL;
  if (n) memcpy(copy, p, n);
  copy[n] = 0;
  node->u.s.p = copy;
  node->u.s.n = n;
  return node;
}

static char *arena_strndup(ks__pk_arena *ar, const char *s, size_t n) {
  char *d = n < SIZE_MAX ? ks__pk_bytes(ar, n + 1) : NULL;
  if (d) {
    memcpy(d, s, n);
    d[n] = 0;
  }
  return d;
}

ks__pk_node *ks__pk_new_global(ks__pk_arena *ar, const char *module, size_t mlen, const char *name,
                               size_t nlen) {
  char *m = arena_strndup(ar, module, mlen), *nm = m ? arena_strndup(ar, name, nlen) : NULL;
  ks__pk_node *g = nm ? ks__pk_new(ar, PK_GLOBAL) : NULL;
  if (!g) return NULL;
  g->u.g.module = m;
  g->u.g.name = nm;
  return g;
}

ks__pk_node *ks__pk_new_object(ks__pk_arena *ar, ks__pk_node *cls, ks__pk_node *args) {
  ks__pk_obj *o = ks__pk_bytes(ar, sizeof *o);
  ks__pk_node *n = o ? ks__pk_new(ar, PK_OBJECT) : NULL;
  if (!n) return NULL;
  memset(o, 0, sizeof *o);
  o->cls = cls;
  o->args = args;
  n->u.obj = o;
  return n;
}

ks__pk_node *ks__pk_new_tensor(ks__pk_arena *ar) {
  ks_tensor *t = ks__pk_bytes(ar, sizeof *t);
  ks__pk_node *n = t ? ks__pk_new(ar, PK_TENSOR) : NULL;
  if (!n) return NULL;
  memset(t, 0, sizeof *t);
  n->u.t = t;
  return n;
}

bool ks__pk_make_tensor(ks__pk_arena *ar, ks__pk_node *n, const ks_tensor *t) {
  ks_tensor *copy = ks__pk_bytes(ar, sizeof *copy);
  if (!copy) return false;
  *copy = *t;
  n->kind = PK_TENSOR;
  n->u.t = copy;
  return true;
}

ks__pk_node *ks__pk_new_seq(ks__pk_arena *ar, ks__pk_kind kind, ks__pk_node *const *items, size_t n) {
  size_t bytes;
  if (!ks__mul_size(n, sizeof *items, &bytes)) return NULL;
  ks__pk_node **v = n ? ks__pk_bytes(ar, bytes) : NULL;
  ks__pk_node *s = !n || v ? ks__pk_new(ar, kind) : NULL;
  if (!s) return NULL;
  if (n) memcpy(v, items, bytes);
  s->u.seq.v = v;
  s->u.seq.n = n;
  ar->work += n;
  return s;
}

/* Room for k more items. The first batch goes to the arena's chunks, exactly sized (most containers get all
 * their items at once: APPENDS and SETITEMS come in batches of 1000); when more come, the items move to memory
 * of their own, which grows by half each time it is full (APPEND adds one at a time). */
static bool grow_items(ks__pk_arena *ar, ks__pk_seq *s, size_t k) {
  size_t need, ncap, bytes;
  if (!ks__add_size(s->n, k, &need) || !ks__mul_size(need, sizeof *s->v, &bytes)) return false;
  if (!s->n && !s->cap) {
    ks__pk_node **v = ks__pk_bytes(ar, bytes);
    if (v) s->v = v;
    return v != NULL;
  }
  size_t grown = s->cap ? s->cap + s->cap / 2 : s->n + s->n / 2, old = s->cap * sizeof *s->v;
  ncap = grown > need ? grown : need;
  if (!ks__mul_size(ncap, sizeof *s->v, &bytes)) return false;
  size_t more = bytes - old + (old ? 0 : ALLOC_OVERHEAD);
  if (!ks__pk_charge(ar, more)) return false;
  ks__pk_node **nv = ks__realloc(&ar->alloc, s->cap ? s->v : NULL, bytes);
  if (!nv) {
    ks__pk_uncharge(ar, more);
    return false;
  }
  if (!s->cap) memcpy(nv, s->v, s->n * sizeof *s->v); /* out of the chunks, which keep their copy */
  s->v = nv;
  s->cap = ncap;
  return true;
}

bool ks__pk_push_n(ks__pk_arena *ar, ks__pk_seq *s, ks__pk_node *const *v, size_t k) {
  if (k == 0) return true;
  if ((!s->cap || s->cap - s->n < k) && !grow_items(ar, s, k)) return false;
  memcpy(s->v + s->n, v, k * sizeof *v);
  s->n += k;
  ar->work += k;
  return true;
}

bool ks__pk_push(ks__pk_arena *ar, ks__pk_seq *s, ks__pk_node *v) { return ks__pk_push_n(ar, s, &v, 1); }

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
  char *text = ks__pk_bytes(ar, cap * 9 + 12);
  uint32_t *limbs = text ? ks__malloc(&ar->alloc, (nl + cap) * sizeof *limbs) : NULL; /* at most 5 KiB, freed here */
  if (!limbs) return NULL;
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
  /* The bytes count against max_view_bytes; the block and two slots against mem (a flood of empty views). */
  if (!ks__pk_charge(ar, ALLOC_OVERHEAD + 2 * sizeof *ar->bufs)) return NULL;
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
