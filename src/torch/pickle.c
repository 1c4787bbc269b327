/*
 * A pickle machine that executes nothing. It decodes the opcodes torch.save and
 * Composer emit (protocol 2, plus the common protocol 3-5 ones) into a node
 * tree. GLOBAL names are kept as strings; REDUCE/NEWOBJ/BUILD/BINPERSID go to
 * rebuild.c, which interprets known constructors and leaves the rest inert.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "torch/torch_internal.h"

#define MAX_LINE 4096

struct ks__pk_vm {
  ks__pk_arena *ar;
  const ks__pk_limits *lim;
  ks_error *err;
  ks__cursor c;
  int64_t op_off;
  ks__pk_node **stack;
  size_t sp, scap;
  size_t *marks;
  size_t nm, mcap;
  ks__pk_node **memo;
  size_t memo_cap, memo_count, memo_max;
  ks__pk_storage_fn storage;
  void *sctx;
  ks__pk_node *result;
  uint64_t max_work;
};

typedef ks__pk_vm vm_t;
typedef ks_status (*op_fn)(vm_t *vm, uint8_t op);

KS__PRINTF(3, 4) static ks_status fail(vm_t *vm, ks_status code, const char *fmt, ...) {
  char msg[KS_ERROR_MSG_MAX - 16];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return ks__err_at(vm->err, code, NULL, NULL, vm->op_off, "pickle: %s", msg);
}

static KS_NODISCARD ks_status nomem(vm_t *vm) { return ks__pk_nomem(vm->ar, vm->op_off, vm->err); }
static KS_NODISCARD ks_status truncated(vm_t *vm) {
  return fail(vm, KS_E_FORMAT, "truncated operand of opcode 0x%02x", *(vm->c.base + vm->op_off));
}

static size_t floor_sp(const vm_t *vm) { return vm->nm ? vm->marks[vm->nm - 1] : 0; }

/* The stack and the marks, each at most max_stack slots, counted in the arena's memory as they grow. */
static KS_NODISCARD ks_status grow(vm_t *vm, void **arr, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return KS_OK;
  if (need > vm->lim->max_stack) return fail(vm, KS_E_LIMIT, "stack deeper than %zu", vm->lim->max_stack);
  size_t ncap = *cap ? *cap : 16, old = *cap;
  while (ncap < need) ncap *= 2; /* as ks__grow does; need <= max_stack keeps this small */
  if (!ks__pk_charge(vm->ar, (ncap - old) * elem)) return nomem(vm);
  ks_status s = ks__grow(&vm->ar->alloc, arr, cap, need, elem);
  if (s == KS_E_LIMIT) return fail(vm, KS_E_LIMIT, "stack too large");
  return s ? nomem(vm) : KS_OK;
}

static KS_NODISCARD ks_status push(vm_t *vm, ks__pk_node *n) {
  if (!n) return nomem(vm);
  ks_status st = grow(vm, (void **)&vm->stack, &vm->scap, vm->sp + 1, sizeof *vm->stack);
  if (st) return st;
  vm->stack[vm->sp++] = n;
  return KS_OK;
}

static KS_NODISCARD ks_status pop(vm_t *vm, ks__pk_node **out) {
  if (vm->sp <= floor_sp(vm)) return fail(vm, KS_E_FORMAT, "stack underflow");
  *out = vm->stack[--vm->sp];
  return KS_OK;
}

static KS_NODISCARD ks_status top(vm_t *vm, ks__pk_node **out) {
  if (vm->sp <= floor_sp(vm)) return fail(vm, KS_E_FORMAT, "stack underflow");
  *out = vm->stack[vm->sp - 1];
  return KS_OK;
}

/* Pops back to the last MARK; the items are stack[*start .. vm->sp). */
static KS_NODISCARD ks_status pop_mark(vm_t *vm, size_t *start) {
  if (!vm->nm) return fail(vm, KS_E_FORMAT, "no MARK to pop");
  *start = vm->marks[--vm->nm];
  return KS_OK;
}

static KS_NODISCARD ks_status take(vm_t *vm, size_t n, const uint8_t **p) {
  return ks__take(&vm->c, n, p) ? KS_OK : truncated(vm);
}

static KS_NODISCARD ks_status read_line(vm_t *vm, const char **s, size_t *n) {
  const uint8_t *start = vm->c.base + vm->c.pos;
  size_t left = ks__cursor_left(&vm->c), lim = left < MAX_LINE ? left : MAX_LINE;
  const uint8_t *nl = memchr(start, '\n', lim);
  if (!nl) return fail(vm, KS_E_FORMAT, "unterminated text operand");
  *s = (const char *)start;
  *n = (size_t)(nl - start);
  vm->c.pos += *n + 1;
  return KS_OK;
}

static KS_NODISCARD ks_status parse_decimal(vm_t *vm, const char *s, size_t n, int64_t *v) {
  char buf[32];
  if (n == 0 || n >= sizeof buf) return fail(vm, KS_E_FORMAT, "bad decimal operand");
  memcpy(buf, s, n);
  buf[n] = 0;
  char *end;
  errno = 0;
  long long x = strtoll(buf, &end, 10);
  if (*end || errno) return fail(vm, KS_E_FORMAT, "bad decimal operand");
  *v = x;
  return KS_OK;
}

/* ---- scalars ---- */

static KS_NODISCARD ks_status push_int(vm_t *vm, int64_t v) { return push(vm, ks__pk_new_int(vm->ar, v)); }

static KS_NODISCARD ks_status op_const(vm_t *vm, uint8_t op) {
  return push(vm, op == 'N' ? ks__pk_new_none(vm->ar) : ks__pk_new_bool(vm->ar, op == 0x88));
}

static KS_NODISCARD ks_status op_binint(vm_t *vm, uint8_t op) {
  const uint8_t *p = NULL;
  size_t n = op == 'K' ? 1 : op == 'M' ? 2 : 4;
  ks_status st = take(vm, n, &p);
  if (st) return st;
  int64_t v = n == 1 ? p[0] : n == 2 ? ks__le16(p) : (int64_t)(int32_t)ks__le32(p);
  return push_int(vm, v);
}

static KS_NODISCARD ks_status op_long(vm_t *vm, uint8_t op) {
  const uint8_t *p = NULL;
  size_t n;
  ks_status st = take(vm, op == 0x8a ? 1 : 4, &p);
  if (st) return st;
  n = op == 0x8a ? p[0] : ks__le32(p);
  if (op == 0x8b && (int32_t)ks__le32(p) < 0) return fail(vm, KS_E_FORMAT, "negative LONG4 length");
  if (n > vm->lim->max_string) return fail(vm, KS_E_LIMIT, "integer of %zu bytes", n);
  if ((st = take(vm, n, &p)) != KS_OK) return st;
  if (n > 8) return push(vm, ks__pk_new_bigint(vm->ar, p, n));
  uint64_t u = 0;
  for (size_t i = 0; i < n; i++) u |= (uint64_t)p[i] << (8 * i);
  if (n && n < 8 && (p[n - 1] & 0x80)) u |= ~(uint64_t)0 << (8 * n);
  return push_int(vm, (int64_t)u);
}

static KS_NODISCARD ks_status op_int_text(vm_t *vm, uint8_t op) {
  (void)op;
  const char *s = NULL;
  size_t n = 0;
  int64_t v = 0;
  ks_status st = read_line(vm, &s, &n);
  if (st) return st;
  if (n == 2 && s[0] == '0' && (s[1] == '0' || s[1] == '1')) return op_const(vm, s[1] == '1' ? 0x88 : 0x89);
  if ((st = parse_decimal(vm, s, n, &v)) != KS_OK) return st;
  return push_int(vm, v);
}

static KS_NODISCARD ks_status op_binfloat(vm_t *vm, uint8_t op) {
  (void)op;
  const uint8_t *p = NULL;
  ks_status st = take(vm, 8, &p);
  if (st) return st;
  uint64_t u = 0;
  for (int i = 0; i < 8; i++) u = (u << 8) | p[i];
  ks__pk_node *n = ks__pk_new(vm->ar, PK_FLOAT);
  if (n) memcpy(&n->u.f, &u, sizeof u);
  return push(vm, n);
}

/* ---- strings and bytes ---- */

static KS_NODISCARD ks_status read_len(vm_t *vm, size_t width, uint64_t *n) {
  const uint8_t *p = NULL;
  ks_status st = take(vm, width, &p);
  if (st) return st;
  *n = width == 1 ? p[0] : width == 4 ? ks__le32(p) : ks__le64(p);
  if (*n > vm->lim->max_string)
    return fail(vm, KS_E_LIMIT, "string of %llu bytes exceeds the limit", (unsigned long long)*n);
  return KS_OK;
}

static KS_NODISCARD ks_status op_string(vm_t *vm, uint8_t op) {
  size_t width = (op == 0x8c || op == 'U' || op == 'C') ? 1 : (op == 0x8d || op == 0x8e || op == 0x96) ? 8 : 4;
  uint64_t n = 0;
  const uint8_t *p = NULL;
  ks_status st = read_len(vm, width, &n);
  if (st) return st;
  if (op == 'T' && (int32_t)n < 0) return fail(vm, KS_E_FORMAT, "negative BINSTRING length");
  if (n > ks__cursor_left(&vm->c)) return truncated(vm);
  if ((st = take(vm, (size_t)n, &p)) != KS_OK) return st;
  int unicode = op == 'X' || op == 0x8c || op == 0x8d;
  int legacy = op == 'T' || op == 'U'; /* Python 2 str: decoded as UTF-8 when it is valid */
  int valid = (unicode || legacy) && ks__utf8_valid(p, (size_t)n);
  if (unicode && !valid) return fail(vm, KS_E_FORMAT, "string is not valid UTF-8");
  return push(vm, ks__pk_new_str(vm->ar, valid ? PK_STR : PK_BYTES, p, (size_t)n));
}

/* ---- containers ---- */

static KS_NODISCARD ks_status make_seq(vm_t *vm, ks__pk_kind kind, size_t start) {
  ks__pk_node *n = ks__pk_new_seq(vm->ar, kind, vm->stack + start, vm->sp - start);
  if (!n) return nomem(vm);
  vm->sp = start;
  return push(vm, n);
}

static KS_NODISCARD ks_status op_empty(vm_t *vm, uint8_t op) {
  ks__pk_kind k = op == ')' ? PK_TUPLE : op == ']' ? PK_LIST : op == '}' ? PK_DICT : PK_SET;
  return push(vm, ks__pk_new(vm->ar, k));
}

static KS_NODISCARD ks_status op_mark_seq(vm_t *vm, uint8_t op) {
  size_t start = 0;
  ks_status st = pop_mark(vm, &start);
  if (st) return st;
  ks__pk_kind k = op == 't' ? PK_TUPLE : op == 'l' ? PK_LIST : op == 'd' ? PK_DICT : PK_SET;
  if (k == PK_DICT && (vm->sp - start) % 2) return fail(vm, KS_E_FORMAT, "DICT with an odd number of items");
  return make_seq(vm, k, start);
}

static KS_NODISCARD ks_status op_tuple_n(vm_t *vm, uint8_t op) {
  size_t n = (size_t)(op - 0x84);
  if (vm->sp < floor_sp(vm) + n) return fail(vm, KS_E_FORMAT, "stack underflow");
  return make_seq(vm, PK_TUPLE, vm->sp - n);
}

/* The container items go into: a list/set/dict itself, or an inert object's item list. */
static KS_NODISCARD ks_status target_seq(vm_t *vm, ks__pk_node *t, int pairs, ks__pk_seq **out) {
  if (t->kind == PK_OBJECT) {
    if (!t->u.obj->items && !(t->u.obj->items = ks__pk_new(vm->ar, pairs ? PK_DICT : PK_LIST))) return nomem(vm);
    t = t->u.obj->items;
  }
  int ok = pairs ? t->kind == PK_DICT : (t->kind == PK_LIST || t->kind == PK_SET);
  if (!ok) return fail(vm, KS_E_FORMAT, "cannot add items to a %s", ks__pk_kind_name(t->kind));
  *out = &t->u.seq;
  return KS_OK;
}

/* APPEND(S), SETITEM(S), ADDITEMS: items stack[start..sp) go into stack[start-1]. */
static KS_NODISCARD ks_status add_items(vm_t *vm, size_t start, int pairs) {
  if (start == 0 || start - 1 < floor_sp(vm)) return fail(vm, KS_E_FORMAT, "no container below the items");
  if (pairs && (vm->sp - start) % 2) return fail(vm, KS_E_FORMAT, "SETITEMS with an odd number of items");
  ks__pk_seq *seq = NULL;
  ks_status st = target_seq(vm, vm->stack[start - 1], pairs, &seq);
  if (st) return st;
  if (!ks__pk_push_n(vm->ar, seq, vm->stack + start, vm->sp - start)) return nomem(vm);
  vm->sp = start;
  return KS_OK;
}

static KS_NODISCARD ks_status op_add(vm_t *vm, uint8_t op) {
  size_t n = op == 'a' ? 1 : 2;
  if (op == 'a' || op == 's') {
    if (vm->sp < floor_sp(vm) + n) return fail(vm, KS_E_FORMAT, "stack underflow");
    return add_items(vm, vm->sp - n, op == 's');
  }
  size_t start = 0;
  ks_status st = pop_mark(vm, &start);
  if (st) return st;
  return add_items(vm, start, op == 'u');
}

static KS_NODISCARD ks_status op_stack(vm_t *vm, uint8_t op) {
  ks__pk_node *n = NULL;
  size_t start = 0;
  if (op == '(') {
    ks_status st = grow(vm, (void **)&vm->marks, &vm->mcap, vm->nm + 1, sizeof *vm->marks);
    if (!st) vm->marks[vm->nm++] = vm->sp;
    return st;
  }
  if (op == '1') {
    ks_status st = pop_mark(vm, &start);
    if (!st) vm->sp = start;
    return st;
  }
  if (op == '2') {
    ks_status st = top(vm, &n);
    return st ? st : push(vm, n);
  }
  if (vm->sp == floor_sp(vm) && vm->nm) return pop_mark(vm, &start); /* POP of a bare MARK */
  return pop(vm, &n);
}

/* ---- memo ---- */

static KS_NODISCARD ks_status memo_put(vm_t *vm, uint64_t idx) {
  ks__pk_node *n = NULL;
  ks_status st = top(vm, &n);
  if (st) return st;
  if (idx >= vm->memo_max) return fail(vm, KS_E_LIMIT, "memo index %llu exceeds the limit", (unsigned long long)idx);
  if (idx >= vm->memo_cap) {
    size_t ncap = vm->memo_cap ? vm->memo_cap : 64, bytes;
    while (ncap <= idx) ncap *= 2;
    if (ncap > vm->memo_max) ncap = vm->memo_max;
    if (!ks__mul_size(ncap, sizeof *vm->memo, &bytes)) return fail(vm, KS_E_LIMIT, "memo too large");
    if (!ks__pk_charge(vm->ar, bytes - vm->memo_cap * sizeof *vm->memo)) return nomem(vm);
    ks__pk_node **m = ks__realloc(&vm->ar->alloc, vm->memo, bytes);
    if (!m) return nomem(vm);
    memset(m + vm->memo_cap, 0, (ncap - vm->memo_cap) * sizeof *m);
    vm->memo = m;
    vm->memo_cap = ncap;
  }
  if (!vm->memo[idx]) vm->memo_count++;
  vm->memo[idx] = n;
  return KS_OK;
}

static KS_NODISCARD ks_status op_memo(vm_t *vm, uint8_t op) {
  const uint8_t *p = NULL;
  const char *s = NULL;
  size_t n = 0;
  int64_t v = 0;
  ks_status st = KS_OK;
  uint64_t idx = vm->memo_count;
  if (op == 'q' || op == 'h') st = take(vm, 1, &p), idx = st ? 0 : p[0];
  else if (op == 'r' || op == 'j') st = take(vm, 4, &p), idx = st ? 0 : ks__le32(p);
  else if (op == 'p' || op == 'g') {
    if (!(st = read_line(vm, &s, &n)) && !(st = parse_decimal(vm, s, n, &v)) && v < 0)
      st = fail(vm, KS_E_FORMAT, "negative memo index");
    idx = (uint64_t)v;
  }
  if (st) return st;
  if (op == 'q' || op == 'r' || op == 'p' || op == 0x94) return memo_put(vm, idx);
  if (idx >= vm->memo_cap || !vm->memo[idx])
    return fail(vm, KS_E_FORMAT, "memo key %llu is not set", (unsigned long long)idx);
  return push(vm, vm->memo[idx]);
}

/* ---- objects ---- */

static int valid_ident(const char *s, size_t n) {
  if (n == 0) return 0;
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] >= 0x7f) return 0;
  return 1;
}

static KS_NODISCARD ks_status op_global(vm_t *vm, uint8_t op) {
  const char *m = NULL, *nm = NULL;
  size_t ml = 0, nl = 0;
  ks_status st;
  if (op == 'c') {
    if ((st = read_line(vm, &m, &ml)) || (st = read_line(vm, &nm, &nl))) return st;
  } else {
    ks__pk_node *a = NULL, *b = NULL;
    if ((st = pop(vm, &b)) || (st = pop(vm, &a))) return st;
    if (a->kind != PK_STR || b->kind != PK_STR) return fail(vm, KS_E_FORMAT, "STACK_GLOBAL needs two strings");
    m = a->u.s.p, ml = a->u.s.n, nm = b->u.s.p, nl = b->u.s.n;
  }
  if (!valid_ident(m, ml) || !valid_ident(nm, nl)) return fail(vm, KS_E_FORMAT, "malformed GLOBAL name");
  return push(vm, ks__pk_new_global(vm->ar, m, ml, nm, nl));
}

static KS_NODISCARD ks_status op_reduce(vm_t *vm, uint8_t op) {
  ks__pk_node *fn = NULL, *args = NULL, *kwargs = NULL, *out = NULL;
  ks_status st;
  if (op == 0x92 && (st = pop(vm, &kwargs))) return st;
  if ((st = pop(vm, &args)) || (st = pop(vm, &fn))) return st;
  if ((st = ks__pk_reduce(vm->ar, vm->lim, fn, args, vm->op_off, &out, vm->err))) return st;
  return push(vm, out);
}

static KS_NODISCARD ks_status op_build(vm_t *vm, uint8_t op) {
  (void)op;
  ks__pk_node *state = NULL, *obj = NULL;
  ks_status st;
  if ((st = pop(vm, &state)) || (st = top(vm, &obj))) return st;
  return ks__pk_build(vm->ar, vm->lim, obj, state, vm->op_off, vm->err);
}

static KS_NODISCARD ks_status op_persid(vm_t *vm, uint8_t op) {
  (void)op;
  ks__pk_node *pid = NULL, *out = NULL;
  ks_status st;
  if ((st = pop(vm, &pid))) return st;
  if ((st = ks__pk_persid(vm->ar, pid, vm->storage, vm->sctx, vm->op_off, &out, vm->err))) return st;
  return push(vm, out);
}

static KS_NODISCARD ks_status op_proto(vm_t *vm, uint8_t op) {
  const uint8_t *p = NULL;
  ks_status st = take(vm, op == 0x80 ? 1 : 8, &p);
  if (st) return st;
  if (op == 0x80 && p[0] > 5) return fail(vm, KS_E_VERSION, "pickle protocol %u is newer than 5", p[0]);
  return KS_OK;
}

static KS_NODISCARD ks_status op_stop(vm_t *vm, uint8_t op) {
  (void)op;
  return pop(vm, &vm->result);
}

static op_fn opcode(uint8_t op) {
  switch (op) {
    case 'N': case 0x88: case 0x89: return op_const;
    case 'J': case 'K': case 'M': return op_binint;
    case 0x8a: case 0x8b: return op_long;
    case 'I': return op_int_text;
    case 'G': return op_binfloat;
    case 'X': case 0x8c: case 0x8d: case 'T': case 'U': case 'B': case 'C': case 0x8e: case 0x96: return op_string;
    case ')': case ']': case '}': case 0x8f: return op_empty;
    case 't': case 'l': case 'd': case 0x91: return op_mark_seq;
    case 0x85: case 0x86: case 0x87: return op_tuple_n;
    case 'a': case 'e': case 's': case 'u': case 0x90: return op_add;
    case '(': case '0': case '1': case '2': return op_stack;
    case 'q': case 'r': case 'p': case 0x94: case 'h': case 'j': case 'g': return op_memo;
    case 'c': case 0x93: return op_global;
    case 'R': case 0x81: case 0x92: return op_reduce;
    case 'b': return op_build;
    case 'Q': return op_persid;
    case 0x80: case 0x95: return op_proto;
    case '.': return op_stop;
    default: return NULL;
  }
}

static KS_NODISCARD ks_status run_loop(vm_t *vm) {
  while (!vm->result) {
    uint8_t op;
    vm->op_off = (int64_t)vm->c.pos;
    if (!ks__read_u8(&vm->c, &op)) return fail(vm, KS_E_FORMAT, "program ended without STOP");
    op_fn fn = opcode(op);
    if (!fn) return fail(vm, KS_E_UNSUPPORTED, "opcode 0x%02x is not supported", op);
    ks_status st = op == 0x90 ? op_add(vm, 'e') : fn(vm, op);
    if (st) return st;
    /* One opcode copies at most what earlier ones built, so checking after each bounds the total. */
    if (++vm->ar->work > vm->max_work)
      return fail(vm, KS_E_LIMIT, "program costs more than %llu steps (opcodes plus items copied)",
                  (unsigned long long)vm->max_work);
  }
  return KS_OK;
}

void ks__pk_limits_from_opts(const ks_torch_read_opts *o, size_t input_len, ks__pk_limits *out) {
  ks_torch_read_opts d = {0};
  if (!o) o = &d;
  out->max_memo = o->max_memo ? o->max_memo : (size_t)1 << 24;
  out->max_stack = o->max_stack ? o->max_stack : (size_t)1 << 20;
  out->max_string = o->max_string ? o->max_string : (uint64_t)1 << 30;
  uint64_t view = (uint64_t)input_len * 2 + ((uint64_t)64 << 20);
  out->max_view_bytes = o->max_view_bytes ? o->max_view_bytes : view;
  out->max_depth = o->max_depth ? o->max_depth : 64;
  out->max_entries = o->max_entries ? o->max_entries : 0; /* set per pickle by the caller */
  uint64_t output = (uint64_t)input_len * 4 + ((uint64_t)64 << 20);
  out->max_output_bytes = o->max_output_bytes ? o->max_output_bytes : output;
  out->max_work = UINT64_MAX; /* capped per pickle by ks__pk_run */
  out->max_mem = 0;           /* 0: KS__PK_MEM_PER_BYTE per pickle byte + KS__PK_MEM_BASE, set by ks__pk_run */
}

/* Real pickles copy each item a few times at most; 32 per byte leaves a wide margin. */
static uint64_t work_budget(const ks__pk_limits *lim, size_t n) {
  uint64_t cap = (uint64_t)n * 32 + ((uint64_t)1 << 20);
  return lim->max_work < cap ? lim->max_work : cap;
}

/* The machine's memory: 16 bytes per pickle byte leaves real pickles (2 to 6) a wide margin, and keeps a
 * flood of opcodes that each make a node (40 bytes and a stack slot for one byte) to a few times its size. */
static uint64_t mem_budget(const ks__pk_limits *lim, size_t n) {
  return lim->max_mem ? lim->max_mem : (uint64_t)n * KS__PK_MEM_PER_BYTE + KS__PK_MEM_BASE;
}

ks_status ks__pk_run(const uint8_t *p, size_t n, ks__pk_arena *ar, const ks__pk_limits *lim,
                     ks__pk_storage_fn storage, void *storage_ctx, ks__pk_node **root, ks_error *err) {
  vm_t vm = {0};
  uint64_t budget = mem_budget(lim, n), before = ar->mem;
  /* Relative to what the arena holds already (DCP reads several pickles into one arena). */
  ar->mem_max = before > UINT64_MAX - budget ? UINT64_MAX : before + budget;
  ar->over_budget = false;
  vm.ar = ar;
  vm.lim = lim;
  vm.err = err;
  vm.storage = storage;
  vm.sctx = storage_ctx;
  vm.memo_max = lim->max_memo < n + 1 ? lim->max_memo : n + 1;
  vm.max_work = ar->work + work_budget(lim, n);
  ks__cursor_init(&vm.c, p, n);
  ks_status st = run_loop(&vm);
  ks__free(&ar->alloc, vm.stack);
  ks__free(&ar->alloc, vm.marks);
  ks__free(&ar->alloc, vm.memo);
  ks__pk_uncharge(ar, vm.scap * sizeof *vm.stack + vm.mcap * sizeof *vm.marks + vm.memo_cap * sizeof *vm.memo);
  ar->mem_max = UINT64_MAX; /* what callers add after the program is bounded by their own limits */
  if (st == KS_OK) *root = vm.result;
  return st;
}
