/*
 * The pickle machine's memory: every value, string, item, stack, mark and memo slot it
 * holds is counted against a budget of KS__PK_MEM_PER_BYTE bytes per pickle byte plus
 * KS__PK_MEM_BASE, and a program that needs more is refused with KS_E_LIMIT naming it.
 * Checked with an allocator that records the peak of the bytes it holds: floods of
 * opcodes stay within the budget, the count covers what the allocator sees, legitimate
 * lists stay well inside it, and a failed allocation anywhere frees everything.
 * (tests/hostile/pickle_floods.py checks the same floods through the CLI's peak RSS.)
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "keepsake/keepsake.h"
#include "keepsake/torch.h"
#include "testutil.h"
#include "torch/torch_internal.h"

/* ---- an allocator that knows the size of each block: live bytes, their peak, and failing the Nth call ---- */

typedef struct peak_alloc {
  ks_allocator a;
  size_t live, peak, blocks;
  long calls, fail_at;
} peak_alloc;

typedef union head {
  size_t n;
  max_align_t align;
} head;

static void *pa_realloc(void *ctx, void *p, size_t n) {
  peak_alloc *pa = ctx;
  if (pa->fail_at && ++pa->calls >= pa->fail_at) return NULL;
  head *h = p ? (head *)p - 1 : NULL;
  size_t old = h ? h->n : 0;
  head *nh = realloc(h, sizeof *nh + (n ? n : 1));
  if (!nh) return NULL;
  if (!h) pa->blocks++;
  pa->live = pa->live - old + n;
  if (pa->live > pa->peak) pa->peak = pa->live;
  nh->n = n;
  return nh + 1;
}

static void *pa_malloc(void *ctx, size_t n) { return pa_realloc(ctx, NULL, n); }

static void pa_free(void *ctx, void *p) {
  peak_alloc *pa = ctx;
  if (!p) return;
  head *h = (head *)p - 1;
  pa->live -= h->n;
  pa->blocks--;
  free(h);
}

static void pa_init(peak_alloc *pa, long fail_at) {
  memset(pa, 0, sizeof *pa);
  pa->a = (ks_allocator){pa_malloc, pa_realloc, pa_free, pa};
  pa->fail_at = fail_at;
}

/* ---- programs ---- */

typedef struct buf {
  uint8_t *p;
  size_t n, cap;
} buf;

static ks_status buf_write(void *ctx, const void *p, size_t n) {
  buf *b = ctx;
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2 + 64;
    b->p = realloc(b->p, b->cap);
    assert_non_null(b->p);
  }
  memcpy(b->p + b->n, p, n);
  b->n += n;
  return KS_OK;
}

static void emit(buf *b, const void *p, size_t n) { buf_write(b, p, n); }
/* A literal's bytes, NULs included. */
#define OPS(b, lit) emit(b, lit, sizeof lit - 1)

static void le32(buf *b, char op, uint32_t v) {
  uint8_t h[5] = {(uint8_t)op};
  ks__put_le32(h + 1, v);
  emit(b, h, 5);
}

static void str(buf *b, const char *s) {
  le32(b, 'X', (uint32_t)strlen(s));
  emit(b, s, strlen(s));
}

/* head, then unit until the program is about `size` bytes, then tail. */
static buf flood(const char *head_ops, size_t head_len, const char *unit, size_t unit_len, const char *tail,
                 size_t size) {
  buf b = {0};
  emit(&b, "\x80\x02", 2);
  emit(&b, head_ops, head_len);
  while (b.n + unit_len + strlen(tail) < size) emit(&b, unit, unit_len);
  emit(&b, tail, strlen(tail));
  return b;
}

/* A stored zip "archive/" holding data.pkl and 16 bytes of storage data/0. */
static buf archive(const buf *pkl) {
  static const uint8_t storage[16];
  buf out = {0};
  ks__zw *z;
  assert_int_equal(ks__zw_create(NULL, buf_write, &out, 0, &z), KS_OK);
  assert_int_equal(ks__zw_add(z, "archive/data.pkl", pkl->p, pkl->n, NULL), KS_OK);
  assert_int_equal(ks__zw_add(z, "archive/data/0", storage, sizeof storage, NULL), KS_OK);
  assert_int_equal(ks__zw_add(z, "archive/version", "3\n", 2, NULL), KS_OK);
  assert_int_equal(ks__zw_finish(z, NULL), KS_OK);
  ks__zw_free(z);
  return out;
}

static uint64_t budget(size_t n) { return (uint64_t)n * KS__PK_MEM_PER_BYTE + KS__PK_MEM_BASE; }

/* The floods that must meet the budget: each opcode (or short sequence) makes something and keeps it. */
typedef struct flood_case {
  const char *name, *head;
  size_t head_len;
  const char *unit;
  size_t unit_len;
} flood_case;

#define S(x) x, sizeof x - 1
static const flood_case floods[] = {
    {"TUPLE1", S("N"), S("\x85")},
    {"TUPLE2", S("N"), S("N\x86")},
    {"TUPLE3", S("N"), S("NN\x87")},
    {"EMPTY_TUPLE", S(""), S(")")},
    {"EMPTY_LIST", S(""), S("]")},
    {"EMPTY_DICT", S(""), S("}")},
    {"EMPTY_SET", S(""), S("\x8f")},
    {"MARK+TUPLE", S(""), S("(t")},
    {"MARK+LIST", S(""), S("(l")},
    {"MARK+DICT", S(""), S("(d")},
    {"MARK+FROZENSET", S(""), S("(\x91")},
    {"APPENDS of lists", S("]"), S("(]]]]]]]]e")},
    {"SHORT_BINUNICODE", S(""), S("\x8c\x00")},
    {"SHORT_BINBYTES", S(""), S("C\x00")},
    {"STACK_GLOBAL", S(""), S("\x8c\x01" "a" "\x8c\x01" "b" "\x93")},
    {"REDUCE unknown", S("ca\nb\nq\x00"), S("h\x00)R")},
    {"NEWOBJ", S("ca\nb\nq\x00"), S("h\x00)\x81")},
    {"NEWOBJ_EX", S("ca\nb\nq\x00"), S("h\x00)}\x92")},
};

/* Copies by constructors: set(L), OrderedDict(pairs), _codecs.encode(text), BUILD of a memoised dict. */
static buf copies(int which, size_t size) {
  buf h = {0};
  const char *unit = NULL;
  size_t unit_len = 0;
#define UNIT(lit) (unit = lit, unit_len = sizeof lit - 1)
  if (which == 0) { /* a memoised list of 20000 Nones, then set(L) again and again */
    OPS(&h, "(");
    for (int i = 0; i < 20000; i++) OPS(&h, "N");
    OPS(&h, "lq\x00" "0");
    UNIT("cbuiltins\nset\n(h\x00tR0");
  } else if (which == 1) {
    OPS(&h, "(");
    for (int i = 0; i < 10000; i++) OPS(&h, "NN\x86");
    OPS(&h, "lq\x00" "0");
    UNIT("ccollections\nOrderedDict\n(h\x00tR0");
  } else if (which == 2) { /* 64 KiB of text, latin-1 encoded again and again */
    OPS(&h, "c_codecs\nencode\nq\x00");
    le32(&h, 'X', 1 << 16);
    for (int i = 0; i < 1 << 16; i++) OPS(&h, "x");
    OPS(&h, "q\x01");
    str(&h, "latin1");
    OPS(&h, "q\x02" "0");
    UNIT("h\x00h\x01h\x02\x86R0");
  } else { /* an object whose state (a memoised dict of 10000 items) BUILD merges again and again */
    OPS(&h, "}(");
    for (int i = 0; i < 10000; i++) le32(&h, 'J', (uint32_t)i), OPS(&h, "N");
    OPS(&h, "uq\x00" "0ca\nb\n)R");
    UNIT("h\x00" "b");
  }
#undef UNIT
  buf b = flood((const char *)h.p, h.n, unit, unit_len, "N.", size);
  free(h.p);
  return b;
}

/* ---- the budget holds through the public import ---- */

static void check_refused(const char *name, const buf *pkl) {
  buf pt = archive(pkl);
  peak_alloc pa;
  pa_init(&pa, 0);
  ks_torch_read_opts o = {0};
  o.alloc = &pa.a;
  ks_statedict *sd = NULL;
  ks_error err;
  ks_status st = ks_test_torch_load_buffer(pt.p, pt.n, &o, &sd, NULL, &err);
  if (st != KS_E_LIMIT || !strstr(err.message, "bytes of memory"))
    fail_msg("%s: status %d, '%s'", name, st, st ? err.message : "");
  /* the machine's budget, plus the zip's directory and what the load itself keeps (a few KiB) */
  if (pa.peak > budget(pkl->n) + (64u << 10))
    fail_msg("%s: %zu bytes of pickle held %zu bytes at the peak (budget %llu)", name, pkl->n, pa.peak,
             (unsigned long long)budget(pkl->n));
  assert_int_equal(pa.live, 0);
  free(pt.p);
}

/* Property: a flood of each allocating opcode, at several sizes, is refused with the budget's message, and the
   allocator never held more than the budget. Before the budget, 512 KiB of TUPLE1 held 140 MB. */
static void floods_of_each_opcode_stop_at_the_budget(void **s) {
  (void)s;
  static const size_t sizes[] = {(size_t)1 << 19, (size_t)1 << 20};
  for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++) {
    for (size_t i = 0; i < sizeof floods / sizeof floods[0]; i++) {
      const flood_case *f = &floods[i];
      buf pkl = flood(f->head, f->head_len, f->unit, f->unit_len, ".", sizes[z]);
      check_refused(f->name, &pkl);
      free(pkl.p);
    }
    for (int which = 0; which < 4; which++) {
      buf pkl = copies(which, sizes[z]);
      check_refused(which == 0 ? "set()" : which == 1 ? "OrderedDict()" : which == 2 ? "_codecs.encode" : "BUILD",
                    &pkl);
      free(pkl.p);
    }
  }
}

/* ---- the count is what the allocator holds ---- */

/* Every storage key resolves to the same 16 zero bytes. */
static ks_status zeros(void *ctx, const char *key, const uint8_t **data, size_t *len, ks_error *err) {
  static const uint8_t z[16];
  (void)ctx, (void)key, (void)err;
  *data = z;
  *len = sizeof z;
  return KS_OK;
}

static buf every_kind(void);

static void check_counted(const char *name, const buf *pkl) {
  peak_alloc pa;
  pa_init(&pa, 0);
  ks__pk_arena ar;
  ks__pk_limits lim;
  ks__pk_arena_init(&ar, &pa.a);
  ks__pk_limits_from_opts(NULL, pkl->n, &lim);
  ks__pk_node *root = NULL;
  ks_status st = ks__pk_run(pkl->p, pkl->n, &ar, &lim, zeros, NULL, &root, NULL);
  (void)st; /* most end at the budget, some on another limit: what they held until then is counted */
  /* Uncounted: a big integer's scratch digits (5 KiB at most, freed at once), and the bytes of views
     (max_view_bytes bounds them; their blocks and slots are counted). */
  if (pa.peak > ar.mem_peak + (8u << 10))
    fail_msg("%s: the allocator held %zu bytes, the arena counted %llu", name, pa.peak,
             (unsigned long long)ar.mem_peak);
  ks__pk_arena_release(&ar);
  assert_int_equal(pa.live, 0);
}

/* Property: for every flood, and a program that makes every kind of value, the arena's count of its memory is
   at least what the allocator held at the peak (so the budget bounds real memory). */
static void the_count_covers_what_the_allocator_holds(void **s) {
  (void)s;
  for (size_t i = 0; i < sizeof floods / sizeof floods[0]; i++) {
    const flood_case *f = &floods[i];
    buf pkl = flood(f->head, f->head_len, f->unit, f->unit_len, ".", (size_t)1 << 18);
    check_counted(f->name, &pkl);
    free(pkl.p);
  }
  for (int which = 0; which < 4; which++) {
    buf pkl = copies(which, (size_t)1 << 18);
    check_counted("copies", &pkl);
    free(pkl.p);
  }
  /* APPEND one at a time (items move from the chunks to their own memory, then grow), big integers, memo */
  static const char unit[] = "N" "a" "\x8a\x09\x01\x02\x03\x04\x05\x06\x07\x08\x09" "0" "r\x01\x02\x03\x00";
  buf pkl = flood("]", 1, unit, sizeof unit - 1, ".", (size_t)1 << 18);
  check_counted("APPEND, LONG1, BINPUT", &pkl);
  free(pkl.p);
  pkl = every_kind();
  check_counted("every kind of value", &pkl);
  free(pkl.p);
}

/* ---- legitimate lists stay well inside ---- */

/* list(range(first, first + count)) as pickle writes it: EMPTY_LIST, then APPENDS of 1000 BININT2/BININT. */
static buf int_list(uint32_t first, uint32_t count) {
  buf b = {0};
  OPS(&b, "\x80\x02]q\x00");
  for (uint32_t i = 0; i < count; i++) {
    if (i % 1000 == 0) OPS(&b, "(");
    uint32_t v = first + i;
    if (v < 65536) {
      uint8_t m[3] = {'M', (uint8_t)v, (uint8_t)(v >> 8)};
      emit(&b, m, 3);
    } else {
      le32(&b, 'J', v);
    }
    if (i % 1000 == 999 || i + 1 == count) OPS(&b, "e");
  }
  OPS(&b, ".");
  return b;
}

/* The densest data a real pickle holds per byte: distinct ints (a node each for 3 or 5 bytes), and lists of
   None (a slot for one byte). They load, under 80% of the budget. */
static void lists_of_distinct_ints_stay_well_inside_the_budget(void **s) {
  (void)s;
  buf lists[4];
  lists[0] = int_list(256, 65280);   /* every BININT2 once */
  lists[1] = int_list(65536, 400000); /* BININT */
  lists[2] = int_list(0, 100000);    /* list(range(100000)) */
  lists[3] = flood("](", 2, "NNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNe(", 52, "e.", (size_t)1 << 20);
  for (int i = 0; i < 4; i++) {
    ks__pk_arena ar;
    ks__pk_limits lim;
    ks__pk_arena_init(&ar, NULL);
    ks__pk_limits_from_opts(NULL, lists[i].n, &lim);
    ks__pk_node *root = NULL;
    ks_error err;
    ks_status st = ks__pk_run(lists[i].p, lists[i].n, &ar, &lim, NULL, NULL, &root, &err);
    if (st) fail_msg("list %d: %s", i, err.message);
    assert_int_equal(root->kind, PK_LIST);
    if (ar.mem_peak * 5 > budget(lists[i].n) * 4)
      fail_msg("list %d: %zu bytes held %llu bytes (%.1f per byte; budget %llu)", i, lists[i].n,
               (unsigned long long)ar.mem_peak, (double)ar.mem_peak / (double)lists[i].n,
               (unsigned long long)budget(lists[i].n));
    ks__pk_arena_release(&ar);
    free(lists[i].p);
  }
}

/* ---- a failed allocation frees everything ---- */

/* A program that makes every kind of node the arena holds: tensors, storages, objects with state and items,
   dicts, lists (grown past their first batch), sets, tuples, strings, bytes, ints of every page, big integers,
   globals, numpy dtypes and arrays. */
static buf every_kind(void) {
  buf b = {0};
  OPS(&b, "\x80\x02}q\x00(");
  str(&b, "t");
  OPS(&b, "ctorch._utils\n_rebuild_tensor_v2\n((");
  str(&b, "storage");
  OPS(&b, "ctorch\nFloatStorage\n");
  str(&b, "0");
  str(&b, "cpu");
  OPS(&b, "K\x04tQK\x00K\x02K\x02\x86K\x01K\x02\x86\x89" "ccollections\nOrderedDict\n)RtR");
  str(&b, "l");
  OPS(&b, "](K\x01M\x00\x01M\xff\xff");
  le32(&b, 'J', 1u << 20);
  OPS(&b, "\x8a\x09\x01\x02\x03\x04\x05\x06\x07\x08\x09" "eNaNaNaNaNaNa");
  str(&b, "o");
  OPS(&b, "cfoo\nBar\n)R}(");
  str(&b, "x");
  OPS(&b, "G\x3f\xf0\x00\x00\x00\x00\x00\x00" "ub(N\x88\x89\x87" "e");
  str(&b, "s");
  OPS(&b, "cbuiltins\nset\n(K\x01K\x02lq\x01\x85R");
  str(&b, "b");
  OPS(&b, "C\x03" "abc");
  str(&b, "d");
  OPS(&b, "ctorch\ndevice\n");
  str(&b, "cpu");
  OPS(&b, "\x85R");
  str(&b, "n");
  OPS(&b, "cnumpy.core.multiarray\n_reconstruct\n)R(K\x01K\x02\x85" "cnumpy\ndtype\n");
  str(&b, ">f4");
  OPS(&b, "\x85R\x89" "C\x08" "\x3f\x80\x00\x00\x40\x00\x00\x00" "tb");
  OPS(&b, "u.");
  return b;
}

/* Property: failing the Nth allocation, for every N until the load succeeds, gives KS_E_NOMEM (never the
   budget's KS_E_LIMIT, never a crash) and leaves nothing allocated. */
static void every_failed_allocation_is_nomem_and_frees_everything(void **s) {
  (void)s;
  buf pkl = every_kind(), pt = archive(&pkl);
  ks_statedict *sd = NULL;
  ks_error err;
  ks_status st0 = ks_test_torch_load_buffer(pt.p, pt.n, NULL, &sd, NULL, &err);
  if (st0) fail_msg("the program: %s", err.message); /* it is valid */
  ks_entry e;
  assert_int_equal(ks_statedict_get(sd, "t", &e), KS_OK);
  assert_int_equal(ks_statedict_get(sd, "n", &e), KS_OK);
  ks_statedict_free(sd);
  long n = 1;
  for (;; n++) {
    peak_alloc pa;
    pa_init(&pa, n);
    ks_torch_read_opts o = {0};
    o.alloc = &pa.a;
    sd = NULL;
    ks_status st = ks_test_torch_load_buffer(pt.p, pt.n, &o, &sd, NULL, &err);
    ks_statedict_free(sd);
    assert_int_equal(pa.live, 0);
    if (st == KS_OK) break;
    if (st != KS_E_NOMEM) fail_msg("allocation %ld failed: status %d (%s)", n, st, err.message);
  }
  assert_true(n > 20); /* the program made many allocations: each failed in turn */
  free(pkl.p);
  free(pt.p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(floods_of_each_opcode_stop_at_the_budget),
      cmocka_unit_test(the_count_covers_what_the_allocator_holds),
      cmocka_unit_test(lists_of_distinct_ints_stay_well_inside_the_budget),
      cmocka_unit_test(every_failed_allocation_is_nomem_and_frees_everything),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
