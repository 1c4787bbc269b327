/*
 * Families of hostile torch input the reader and writer close as a whole, each
 * with a generator or property test and the reported input as a regression:
 *   amplification through shared references (a bounded output budget, shared
 *   containers counted as copies),
 *   silent key collisions (escaped separators; colliding names refused),
 *   writer and reader limits that disagree (an export keepsake cannot read back).
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

/* ---- building pickles and archives ---- */

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
static void op(buf *b, uint8_t o) { emit(b, &o, 1); }

static void str(buf *b, const char *s) {
  uint8_t h[5] = {'X'};
  ks__put_le32(h + 1, (uint32_t)strlen(s));
  emit(b, h, 5);
  emit(b, s, strlen(s));
}

static void int32(buf *b, int32_t v) {
  uint8_t h[5] = {'J'};
  ks__put_le32(h + 1, (uint32_t)v);
  emit(b, h, 5);
}

/* A stored zip "archive/" holding data.pkl and, when slen > 0, data/0. */
static buf archive(const buf *pkl, const void *storage, size_t slen) {
  buf out = {0};
  ks__zw *z;
  assert_int_equal(ks__zw_create(NULL, buf_write, &out, 0, &z), KS_OK);
  assert_int_equal(ks__zw_add(z, "archive/data.pkl", pkl->p, pkl->n, NULL), KS_OK);
  if (slen) assert_int_equal(ks__zw_add(z, "archive/data/0", storage, slen, NULL), KS_OK);
  assert_int_equal(ks__zw_add(z, "archive/version", "3\n", 2, NULL), KS_OK);
  assert_int_equal(ks__zw_finish(z, NULL), KS_OK);
  ks__zw_free(z);
  return out;
}

/* {"0": t, "1": t, ...}: one U8 tensor of `bytes` over storage 0, referenced n times (memo). */
static buf shared_tensor_pickle(size_t n, uint32_t bytes) {
  buf p = {0};
  emit(&p, "\x80\x02}(", 4);
  for (size_t i = 0; i < n; i++) {
    char key[24];
    snprintf(key, sizeof key, "%zu", i);
    str(&p, key);
    if (i) { /* BINGET 0: the tensor built for key "0" */
      emit(&p, "h\x00", 2);
      continue;
    }
    emit(&p, "ctorch._utils\n_rebuild_tensor_v2\n((", 35);
    str(&p, "storage");
    emit(&p, "ctorch\nByteStorage\n", 19);
    str(&p, "0");
    str(&p, "cpu");
    int32(&p, (int32_t)bytes);
    emit(&p, "tQK\x00", 4);
    int32(&p, (int32_t)bytes);
    emit(&p, "\x85K\x01\x85\x89", 5);
    emit(&p, "ccollections\nOrderedDict\n)RtRq\x00", 31);
  }
  emit(&p, "u.", 2);
  return p;
}

static uint64_t tensor_bytes(const ks_statedict *sd) {
  uint64_t total = 0;
  ks_entry e;
  for (size_t i = 0; ks_statedict_at(sd, i, &e) == KS_OK; i++)
    if (e.kind == KS_VAL_TENSOR) total += e.tensor.nbytes;
  return total;
}

/* ---- family: amplification through shared references ---- */

/* Property: for random (size, references, budget), the load succeeds exactly when the copies
   and their names fit the budget, and then holds every copy; otherwise it is KS_E_LIMIT. */
static void shared_references_succeed_exactly_within_the_output_budget(void **s) {
  (void)s;
  uint32_t rng = 99;
  uint8_t *storage = calloc(1, 1 << 16);
  for (int round = 0; round < 120; round++) {
    rng = rng * 1664525u + 1013904223u;
    uint32_t bytes = 1 + (rng >> 8) % (1 << 16);
    rng = rng * 1664525u + 1013904223u;
    size_t n = 1 + (rng >> 8) % 40;
    rng = rng * 1664525u + 1013904223u;
    uint64_t budget = 1 + (uint64_t)((rng >> 8) % (40u << 16));
    buf pkl = shared_tensor_pickle(n, bytes), pt = archive(&pkl, storage, bytes);
    ks_torch_read_opts o = {0};
    o.max_output_bytes = budget;
    ks_statedict *sd = NULL;
    ks_error err;
    ks_status st = ks_test_torch_load_buffer(pt.p, pt.n, &o, &sd, NULL, &err);
    /* every copy, every name ("0", "1", ...) with its entry's record, and the dict's record */
    uint64_t need = (uint64_t)bytes * n + KS__PK_CONTAINER_BYTES;
    for (size_t i = 0; i < n; i++) need += (i < 10 ? 1u : 2u) + KS__PK_ENTRY_BYTES;
    if (round % 3 == 0) o.max_output_bytes = budget = need - (uint64_t)(round % 2); /* right at the edge */
    if (round % 3 == 0) {
      ks_statedict_free(sd);
      sd = NULL;
      st = ks_test_torch_load_buffer(pt.p, pt.n, &o, &sd, NULL, &err);
    }
    if (need <= budget) {
      assert_int_equal(st, KS_OK);
      assert_int_equal(ks_statedict_count(sd), n);
      assert_int_equal(tensor_bytes(sd), (uint64_t)bytes * n);
    } else {
      assert_int_equal(st, KS_E_LIMIT);
      assert_null(sd);
      assert_non_null(strstr(err.message, "copied once per path"));
    }
    ks_statedict_free(sd);
    free(pkl.p);
    free(pt.p);
  }
  free(storage);
}

/* The report: 50 references to one 16 MiB storage made 838 MB of memory and an 839 MB file.
   Now the default budget (4 x input + 64 MiB) stops it after 8 copies. */
static void fifty_references_to_a_16_mib_storage_are_refused_by_default(void **s) {
  (void)s;
  const uint32_t mib16 = 16u << 20;
  uint8_t *storage = calloc(1, mib16);
  buf pkl = shared_tensor_pickle(50, mib16), pt = archive(&pkl, storage, mib16);
  free(storage);
  char *dir = ks_test_tmpdir("torch-amplify");
  char *path = ks_test_path(dir, "shared.pt");
  ks_test_write_file(path, pt.p, pt.n);
  ks_statedict *sd = NULL;
  ks_error err;
  assert_int_equal(ks_torch_load(path, NULL, &sd, NULL, &err), KS_E_LIMIT);
  assert_null(sd);
  assert_non_null(strstr(err.message, "would exceed"));
  assert_int_equal(ks_test_torch_load_buffer(pt.p, pt.n, NULL, &sd, NULL, &err), KS_E_LIMIT);
  /* the same storage referenced 4 times fits: tied weights and views stay readable */
  free(pkl.p);
  free(pt.p);
  storage = calloc(1, mib16);
  pkl = shared_tensor_pickle(4, mib16);
  pt = archive(&pkl, storage, mib16);
  free(storage);
  ks_test_write_file(path, pt.p, pt.n);
  assert_int_equal(ks_torch_load(path, NULL, &sd, NULL, &err), KS_OK);
  assert_int_equal(tensor_bytes(sd), 4ull * mib16);
  ks_statedict_free(sd);
  free(pkl.p);
  free(pt.p);
  ks_test_rmtree(dir);
  free(path);
  free(dir);
}

/* L0 = [], L(k+1) = [Lk, Lk] up to L(levels), then `pad` zero bytes after STOP (they count as
   pickle bytes, so the default entry and container limits grow with them). */
static buf shared_lists_pickle(int levels, size_t pad) {
  buf p = {0};
  emit(&p, "\x80\x02]q\x00", 5);
  for (int k = 0; k < levels; k++) {
    const char step[] = {'(', 'h', (char)k, 'h', (char)k, 'l', 'q', (char)(k + 1)};
    emit(&p, step, sizeof step);
  }
  op(&p, '.');
  for (size_t i = 0; i < pad; i++) op(&p, 0);
  return p;
}

/* Property: each path to a list (a second path is a copy) counts as its name plus
   KS__PK_CONTAINER_BYTES; the load (with its structure document) succeeds exactly when the
   copies fit the budget. At depth j the 2^j lists have names of 2j - 1 bytes ("0/1/..."),
   and the root's name is empty. */
static void shared_containers_are_copies_counted_exactly_against_the_budget(void **s) {
  (void)s;
  for (int levels = 1; levels <= 10; levels++) {
    uint64_t need = KS__PK_CONTAINER_BYTES;
    for (int j = 1; j <= levels; j++)
      need += ((uint64_t)1 << j) * ((uint64_t)(2 * j - 1) + KS__PK_CONTAINER_BYTES);
    buf pkl = shared_lists_pickle(levels, 0), pt = archive(&pkl, NULL, 0);
    for (int under = 0; under <= 1; under++) {
      ks_torch_read_opts o = {0};
      o.max_output_bytes = need - (uint64_t)under;
      o.max_entries = (size_t)1 << 20;
      ks_statedict *sd = NULL;
      char *structure = NULL;
      ks_error err;
      ks_status st = ks_test_torch_load_buffer(pt.p, pt.n, &o, &sd, &structure, &err);
      if (!under) {
        assert_int_equal(st, KS_OK);
        assert_int_equal(ks_statedict_count(sd), 0); /* empty lists only: all in the structure */
        assert_non_null(structure);
      } else {
        assert_int_equal(st, KS_E_LIMIT);
        assert_null(sd);
        assert_non_null(strstr(err.message, "copied once per path"));
      }
      ks_statedict_free(sd);
      ks_torch_free(NULL, structure);
    }
    free(pkl.p);
    free(pt.p);
  }
}

/* The report: 24 levels of shared empty lists (25 lists, 2^25 paths) padded to 64 KB after
   STOP: the container limit (8 x 64 KB + 4096) let 514128 paths through, each recorded in the
   structure document (~900 bytes of memory apiece: 463 MB, 0.8 s). Now the copies are stopped
   by the output budget (4 x input + 64 MiB) at about 130000 paths, before that limit. */
static void shared_empty_lists_padded_to_64_kib_stop_at_the_output_budget(void **s) {
  (void)s;
  buf pkl = shared_lists_pickle(24, 63754 - 198), pt = archive(&pkl, NULL, 0);
  assert_int_equal(pkl.n, 63754);
  ks_statedict *sd = NULL;
  char *structure = NULL;
  ks_error err;
  assert_int_equal(ks_test_torch_load_buffer(pt.p, pt.n, NULL, &sd, &structure, &err), KS_E_LIMIT);
  assert_null(sd);
  assert_null(structure);
  assert_non_null(strstr(err.message, "copied once per path"));
  /* without the structure document the same bound holds */
  assert_int_equal(ks_test_torch_load_buffer(pt.p, pt.n, NULL, &sd, NULL, &err), KS_E_LIMIT);
  assert_non_null(strstr(err.message, "copied once per path"));
  free(pkl.p);
  free(pt.p);
}

/* ---- family: silent key collisions ---- */

/* Random trees over keys that print alike or hold separators, as a model of what keepsake names. */
typedef struct model_leaf {
  char name[256];
  int64_t value;
} model_leaf;

typedef struct model {
  model_leaf leaf[512];
  size_t n;
  int collides; /* two keys of one dict print the same */
} model;

static const struct {
  const char *text; /* what keepsake names the key */
  int kind;         /* 0 str, 1 int, 2 True, 3 None */
  int64_t i;
} keys[] = {
    {"a", 0, 0},   {"b", 0, 0},  {"a%2Fb", 0, 0}, {"%25", 0, 0}, {"1", 0, 0},     {"1", 1, 1},
    {"True", 0, 0}, {"True", 2, 1}, {"None", 0, 0}, {"None", 3, 0}, {"%252F", 0, 0}, {"7", 1, 7},
};
static const char *raw_text[] = {"a", "b", "a/b", "%", "1", NULL, "True", NULL, "None", NULL, "%2F", NULL};

static void emit_key(buf *p, int k) {
  switch (keys[k].kind) {
    case 0: str(p, raw_text[k]); break;
    case 1: int32(p, (int32_t)keys[k].i); break;
    case 2: op(p, 0x88); break;
    default: op(p, 'N'); break;
  }
}

static void gen_dict(buf *p, model *m, uint32_t *rng, const char *path, int depth) {
  int used[sizeof keys / sizeof keys[0]] = {0};
  char seen[16][16];
  int nseen = 0;
  *rng = *rng * 1664525u + 1013904223u;
  int n = 1 + (int)((*rng >> 8) % 4);
  op(p, '}');
  op(p, '(');
  for (int i = 0; i < n; i++) {
    *rng = *rng * 1664525u + 1013904223u;
    int k = (int)((*rng >> 8) % (sizeof keys / sizeof keys[0]));
    if (used[k]) continue; /* a real dict holds each key once */
    used[k] = 1;
    for (int j = 0; j < nseen; j++) m->collides |= !strcmp(seen[j], keys[k].text);
    snprintf(seen[nseen++], sizeof seen[0], "%s", keys[k].text);
    char child[256];
    snprintf(child, sizeof child, "%s%s%s", path, *path ? "/" : "", keys[k].text);
    emit_key(p, k);
    *rng = *rng * 1664525u + 1013904223u;
    if (depth < 3 && (*rng >> 8) % 3 == 0) {
      gen_dict(p, m, rng, child, depth + 1);
    } else {
      model_leaf *l = &m->leaf[m->n++];
      snprintf(l->name, sizeof l->name, "%s", child);
      l->value = (int64_t)(m->n * 1000 + (size_t)k);
      int32(p, (int32_t)l->value);
    }
  }
  op(p, 'u');
}

static ks_status load_tree(const buf *pkl, ks_statedict **sd, char **structure, ks_error *err) {
  buf pt = archive(pkl, NULL, 0);
  ks_status st = ks_test_torch_load_buffer(pt.p, pt.n, NULL, sd, structure, err);
  free(pt.p);
  return st;
}

/* Property: every generated tree either loads with one entry per leaf, each at its escaped
   path with its value, and exports to a .pt that re-imports to the same entries; or, exactly
   when two keys of one dict print alike, it is refused with KS_E_EXISTS. Never a lost value. */
static void generated_key_collisions_are_refused_and_everything_else_survives(void **s) {
  (void)s;
  uint32_t rng = 4242;
  int refused = 0, loaded = 0;
  for (int round = 0; round < 400; round++) {
    model m = {0};
    buf p = {0};
    emit(&p, "\x80\x02", 2);
    gen_dict(&p, &m, &rng, "", 0);
    op(&p, '.');
    ks_statedict *sd = NULL, *back = NULL;
    char *structure = NULL;
    ks_error err;
    ks_status st = load_tree(&p, &sd, &structure, &err);
    if (m.collides) {
      assert_int_equal(st, KS_E_EXISTS);
      assert_true(strstr(err.message, "flatten to the name") || strstr(err.message, "both a value and a folder"));
      refused++;
    } else {
      if (st) fail_msg("round %d: %s", round, err.message);
      assert_int_equal(ks_statedict_count(sd), m.n);
      for (size_t i = 0; i < m.n; i++) {
        ks_entry e;
        if (ks_statedict_get(sd, m.leaf[i].name, &e) != KS_OK) fail_msg("round %d: no '%s'", round, m.leaf[i].name);
        assert_int_equal(e.i, m.leaf[i].value);
      }
      ks_torch_write_opts wo = {0};
      wo.structure = structure;
      void *out;
      size_t len;
      assert_int_equal(ks_torch_save_buffer(sd, &wo, &out, &len, &err), KS_OK);
      assert_int_equal(ks_test_torch_load_buffer(out, len, NULL, &back, NULL, &err), KS_OK);
      assert_int_equal(ks_statedict_count(back), m.n);
      for (size_t i = 0; i < m.n; i++) {
        ks_entry e;
        assert_int_equal(ks_statedict_get(back, m.leaf[i].name, &e), KS_OK);
        assert_int_equal(e.i, m.leaf[i].value);
      }
      ks_torch_free(NULL, out);
      loaded++;
    }
    ks_torch_free(NULL, structure);
    ks_statedict_free(back);
    ks_statedict_free(sd);
    free(p.p);
  }
  assert_true(refused > 20 && loaded > 100); /* both outcomes were exercised */
}

/* The report: {"a/b": 1, "a": {"b": 2}} flattened to one entry a/b = 2. */
static void a_slash_key_beside_a_nested_dict_keeps_both_values(void **s) {
  (void)s;
  buf p = {0};
  emit(&p, "\x80\x02}(", 4);
  str(&p, "a/b");
  op(&p, 'K'), op(&p, 1);
  str(&p, "a");
  emit(&p, "}", 1);
  str(&p, "b");
  op(&p, 'K'), op(&p, 2);
  emit(&p, "su.", 3);
  ks_statedict *sd;
  ks_error err;
  ks_entry e;
  assert_int_equal(load_tree(&p, &sd, NULL, &err), KS_OK);
  assert_int_equal(ks_statedict_count(sd), 2);
  assert_int_equal(ks_statedict_get(sd, "a%2Fb", &e), KS_OK);
  assert_int_equal(e.i, 1);
  assert_int_equal(ks_statedict_get(sd, "a/b", &e), KS_OK);
  assert_int_equal(e.i, 2);
  ks_statedict_free(sd);
  free(p.p);
}

/* An int key 1 whose value is a folder beside a str key "1" holding a value: refused, not merged. */
static void an_int_and_a_str_key_that_print_alike_are_refused(void **s) {
  (void)s;
  buf p = {0};
  emit(&p, "\x80\x02}(", 4);
  str(&p, "1");
  op(&p, 'K'), op(&p, 5);
  op(&p, 'K'), op(&p, 1);
  emit(&p, "}", 1);
  str(&p, "x");
  op(&p, 'K'), op(&p, 2);
  emit(&p, "su.", 3);
  ks_statedict *sd = NULL;
  ks_error err;
  assert_int_equal(load_tree(&p, &sd, NULL, &err), KS_E_EXISTS);
  assert_non_null(strstr(err.message, "flatten to the name '1'"));
  assert_null(sd);
  free(p.p);
}

/* An object's state naming `__class__` would overwrite the class entry keepsake adds. */
static void an_attribute_named_like_the_class_entry_is_refused(void **s) {
  (void)s;
  buf p = {0};
  emit(&p, "\x80\x02}(", 4);
  str(&p, "m");
  emit(&p, "cmod\nCls\n)R}", 12);
  str(&p, "__class__");
  str(&p, "forged");
  emit(&p, "sbu.", 4);
  ks_statedict *sd = NULL;
  ks_error err;
  assert_int_equal(load_tree(&p, &sd, NULL, &err), KS_E_EXISTS);
  assert_non_null(strstr(err.message, "m/__class__"));
  free(p.p);
}

/* ---- family: the writer never makes what the reader refuses ---- */

/* Property: random names (1..80 parts, some with '%', some long) either export to a .pt that
   loads back with the same names and values, or are refused by the writer with KS_E_LIMIT
   because they nest deeper than 64 or would be read back longer than KS_MAX_NAME. */
static void every_export_reads_back_or_the_writer_refuses_it(void **s) {
  (void)s;
  uint32_t rng = 777;
  int written = 0, refused = 0;
  for (int round = 0; round < 300; round++) {
    ks_statedict *sd, *back = NULL;
    assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
    char name[KS_MAX_NAME + 1];
    rng = rng * 1664525u + 1013904223u;
    size_t parts = 1 + (rng >> 8) % 80, len = 0, reread = 0;
    rng = rng * 1664525u + 1013904223u;
    size_t width = 1 + (rng >> 8) % 30;
    for (size_t i = 0; i < parts && len + width + 1 < KS_MAX_NAME; i++) {
      if (i) name[len++] = '/', reread++;
      for (size_t k = 0; k < width; k++) {
        rng = rng * 1664525u + 1013904223u;
        char c = (rng >> 8) % 7 == 0 ? '%' : (char)('a' + (rng >> 12) % 26);
        name[len++] = c;
        reread += c == '%' ? 3 : 1;
      }
    }
    name[len] = 0;
    size_t depth = 1;
    for (size_t i = 0; i < len; i++) depth += name[i] == '/';
    assert_int_equal(ks_statedict_set_int(sd, name, round, NULL), KS_OK);
    void *out;
    size_t n;
    ks_error err;
    ks_status st = ks_torch_save_buffer(sd, NULL, &out, &n, &err);
    if (depth > 64 || reread > KS_MAX_NAME) {
      assert_int_equal(st, KS_E_LIMIT);
      refused++;
    } else {
      assert_int_equal(st, KS_OK);
      if (ks_test_torch_load_buffer(out, n, NULL, &back, NULL, &err) != KS_OK)
        fail_msg("round %d: %s", round, err.message);
      ks_entry e;
      assert_int_equal(ks_statedict_count(back), 1);
      assert_int_equal(ks_statedict_at(back, 0, &e), KS_OK);
      char want[3 * KS_MAX_NAME + 1];
      size_t w = 0;
      for (size_t i = 0; i < len; i++) {
        if (name[i] == '%') memcpy(want + w, "%25", 3), w += 3;
        else want[w++] = name[i];
      }
      want[w] = 0;
      assert_string_equal(e.name, want);
      assert_int_equal(e.i, round);
      ks_torch_free(NULL, out);
      written++;
    }
    ks_statedict_free(back);
    ks_statedict_free(sd);
  }
  assert_true(written > 50 && refused > 50);
}

/* The report: a name of 200 '/' parts exported to a .pt that keepsake then refused. */
static void a_name_of_200_parts_is_refused_by_the_writer(void **s) {
  (void)s;
  char name[512];
  size_t n = 0;
  for (int i = 0; i < 200; i++) name[n++] = 'x', name[n++] = '/';
  name[n - 1] = 0;
  ks_statedict *sd;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_int(sd, name, 1, NULL), KS_OK);
  void *out;
  size_t len;
  ks_error err;
  assert_int_equal(ks_torch_save_buffer(sd, NULL, &out, &len, &err), KS_E_LIMIT);
  assert_non_null(strstr(err.message, "nests 200 levels"));
  ks_statedict_free(sd);
}

/* One dict of many entries: the writer batches SETITEMS so the reader's stack stays shallow. */
static void a_wide_dict_exports_in_batches_that_read_back(void **s) {
  (void)s;
  ks_statedict *sd, *back;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  for (int i = 0; i < 5000; i++) {
    char k[16];
    snprintf(k, sizeof k, "k%d", i);
    assert_int_equal(ks_statedict_set_int(sd, k, i, NULL), KS_OK);
  }
  void *out;
  size_t len;
  ks_torch_read_opts ro = {0};
  ro.max_stack = 4096; /* below the 10,000 items one MARK would hold */
  assert_int_equal(ks_torch_save_buffer(sd, NULL, &out, &len, NULL), KS_OK);
  assert_int_equal(ks_test_torch_load_buffer(out, len, &ro, &back, NULL, NULL), KS_OK);
  assert_int_equal(ks_statedict_count(back), 5000);
  ks_statedict_free(back);
  ks_torch_free(NULL, out);
  ks_statedict_free(sd);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(shared_references_succeed_exactly_within_the_output_budget),
      cmocka_unit_test(fifty_references_to_a_16_mib_storage_are_refused_by_default),
      cmocka_unit_test(shared_containers_are_copies_counted_exactly_against_the_budget),
      cmocka_unit_test(shared_empty_lists_padded_to_64_kib_stop_at_the_output_budget),
      cmocka_unit_test(generated_key_collisions_are_refused_and_everything_else_survives),
      cmocka_unit_test(a_slash_key_beside_a_nested_dict_keeps_both_values),
      cmocka_unit_test(an_int_and_a_str_key_that_print_alike_are_refused),
      cmocka_unit_test(an_attribute_named_like_the_class_entry_is_refused),
      cmocka_unit_test(every_export_reads_back_or_the_writer_refuses_it),
      cmocka_unit_test(a_name_of_200_parts_is_refused_by_the_writer),
      cmocka_unit_test(a_wide_dict_exports_in_batches_that_read_back),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
