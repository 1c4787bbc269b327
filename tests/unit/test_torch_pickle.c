/* The safe pickle machine: opcodes, limits, inert objects and malformed programs. */
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

/* Storage "0" of 6 floats 0..5, for programs that reference storages. */
static const float storage0[6] = {0, 1, 2, 3, 4, 5};
static ks_status fake_storage(void *ctx, const char *key, const uint8_t **data, size_t *len, ks_error *err) {
  (void)ctx;
  if (strcmp(key, "data/0")) return ks__err(err, KS_E_NOTFOUND, "no %s", key);
  *data = (const uint8_t *)storage0;
  *len = sizeof storage0;
  return KS_OK;
}

/* Runs a program and flattens it; returns the status, *out the dict on success. */
static ks_status run(const void *prog, size_t n, const ks_torch_read_opts *opts, ks_statedict **out, ks_error *err) {
  ks__pk_arena ar;
  ks__pk_limits lim;
  ks__pk_arena_init(&ar, NULL);
  ks__pk_limits_from_opts(opts, n, &lim);
  if (!lim.max_entries) lim.max_entries = 1 << 16;
  ks__pk_node *root = NULL;
  ks_statedict *sd = NULL;
  ks_status st = ks__pk_run(prog, n, &ar, &lim, fake_storage, NULL, &root, err);
  if (!st) st = ks_statedict_create(NULL, &sd, NULL);
  if (!st) st = ks__pk_flatten(root, &ar, &lim, sd, err);
  if (!st) {
    /* copy out so the arena can go */
    ks_statedict *copy;
    assert_int_equal(ks_statedict_create(NULL, &copy, NULL), KS_OK);
    assert_int_equal(ks__statedict_copy_prefix(copy, sd, "", "", NULL), KS_OK);
    ks_statedict_free(sd);
    sd = copy;
  }
  ks__pk_arena_release(&ar);
  if (st) ks_statedict_free(sd);
  else *out = sd;
  return st;
}

#define RUN(prog, out, err) run(prog, sizeof(prog) - 1, NULL, out, err)

static void unknown_global_call_becomes_an_inert_object(void **s) {
  (void)s;
  static const char prog[] = "\x80\x02}(X\x01\x00\x00\x00xcos\nsystem\nX\x02\x00\x00\x00ls\x85R"
                             "}X\x01\x00\x00\x00" "aK\x07sbu.";
  ks_statedict *sd;
  ks_error err;
  assert_int_equal(RUN(prog, &sd, &err), KS_OK);
  ks_entry e;
  assert_int_equal(ks_statedict_get(sd, "x/__class__", &e), KS_OK);
  assert_string_equal(e.s, "os.system");
  assert_int_equal(ks_statedict_get(sd, "x/a", &e), KS_OK); /* BUILD state is flattened */
  assert_int_equal(e.i, 7);
  ks_statedict_free(sd);
}

static void nested_lists_and_int_keys_name_entries_by_path(void **s) {
  (void)s;
  /* {'nested': {'list': [1, [2.5, None]], 3: True}} */
  static const char prog[] = "\x80\x02}X\x06\x00\x00\x00nested}(X\x04\x00\x00\x00list]"
                             "(K\x01](G\x40\x04\x00\x00\x00\x00\x00\x00Nee" "K\x03\x88u" "s.";
  ks_statedict *sd;
  ks_error err;
  assert_int_equal(RUN(prog, &sd, &err), KS_OK);
  ks_entry e;
  assert_int_equal(ks_statedict_get(sd, "nested/list/0", &e), KS_OK);
  assert_int_equal(e.i, 1);
  assert_int_equal(ks_statedict_get(sd, "nested/list/1/0", &e), KS_OK);
  assert_true(e.kind == KS_VAL_FLOAT && e.f == 2.5);
  assert_int_equal(ks_statedict_get(sd, "nested/list/1/1", &e), KS_OK);
  assert_int_equal(e.kind, KS_VAL_NULL);
  assert_int_equal(ks_statedict_get(sd, "nested/3", &e), KS_OK);
  assert_int_equal(e.kind, KS_VAL_BOOL);
  ks_statedict_free(sd);
}

static void long_integers_keep_their_value(void **s) {
  (void)s;
  /* [-2, 2**64 + 1 (9 bytes)] */
  static const char prog[] = "\x80\x02](\x8a\x01\xfe\x8a\x09\x01\x00\x00\x00\x00\x00\x00\x00\x01" "e.";
  ks_statedict *sd;
  assert_int_equal(RUN(prog, &sd, NULL), KS_OK);
  ks_entry e;
  assert_int_equal(ks_statedict_get(sd, "0", &e), KS_OK);
  assert_int_equal(e.i, -2);
  assert_int_equal(ks_statedict_get(sd, "1", &e), KS_OK);
  assert_string_equal(e.s, "18446744073709551617");
  ks_statedict_free(sd);
}

static void shared_storage_views_are_materialised(void **s) {
  (void)s;
  /* {'t': _rebuild_tensor_v2(storage0, 1, (2, 2), (1, 2), False, OrderedDict())}: a transposed view */
  static const char prog[] = "\x80\x02}X\x01\x00\x00\x00t"
                             "ctorch._utils\n_rebuild_tensor_v2\n"
                             "((X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x00"
                             "0X\x03\x00\x00\x00"
                             "cpuK\x06tQ"
                             "K\x01K\x02K\x02\x86K\x01K\x02\x86\x89"
                             "ccollections\nOrderedDict\n)RtRs.";
  ks_statedict *sd;
  ks_error err;
  assert_int_equal(RUN(prog, &sd, &err), KS_OK);
  const ks_tensor *t = ks_statedict_tensor(sd, "t");
  assert_non_null(t);
  const float *v = t->data;
  assert_true(v[0] == 1 && v[1] == 3 && v[2] == 2 && v[3] == 4);
  ks_statedict_free(sd);
}

static void view_past_the_storage_end_is_refused(void **s) {
  (void)s;
  static const char prog[] = "\x80\x02}X\x01\x00\x00\x00t"
                             "ctorch._utils\n_rebuild_tensor_v2\n"
                             "((X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x00"
                             "0X\x03\x00\x00\x00"
                             "cpuK\x06tQ"
                             "K\x03K\x04\x85K\x01\x85\x89"
                             "ccollections\nOrderedDict\n)RtRs.";
  ks_statedict *sd;
  ks_error err;
  assert_int_equal(RUN(prog, &sd, &err), KS_E_FORMAT);
  assert_non_null(strstr(err.message, "past the end"));
}

static void zero_stride_views_are_bounded_by_the_view_limit(void **s) {
  (void)s;
  /* size (2**30,), stride (0,): 4 GiB from one float */
  static const char prog[] = "\x80\x02}X\x01\x00\x00\x00t"
                             "ctorch._utils\n_rebuild_tensor_v2\n"
                             "((X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x00"
                             "0X\x03\x00\x00\x00"
                             "cpuK\x06tQ"
                             "K\x00J\x00\x00\x00\x40\x85K\x00\x85\x89"
                             "ccollections\nOrderedDict\n)RtRs.";
  ks_statedict *sd;
  ks_error err;
  assert_int_equal(RUN(prog, &sd, &err), KS_E_LIMIT);
}

static void memo_index_beyond_the_program_is_a_limit(void **s) {
  (void)s;
  static const char prog[] = "\x80\x02Nr\xff\xff\xff\x7f.";
  ks_statedict *sd;
  assert_int_equal(RUN(prog, &sd, NULL), KS_E_LIMIT);
}

static void self_referencing_list_hits_the_depth_limit(void **s) {
  (void)s;
  static const char prog[] = "\x80\x02]q\x00h\x00" "a.";
  ks_statedict *sd;
  ks_error err;
  assert_int_equal(RUN(prog, &sd, &err), KS_E_LIMIT);
  assert_non_null(strstr(err.message, "deeper"));
}

/* L0 = [], L(k+1) = [Lk, Lk]: 200 bytes of pickle, 2^21 paths and not one leaf. */
static void shared_empty_containers_are_bounded_by_the_entry_limit(void **s) {
  (void)s;
  char prog[256];
  size_t n = 0;
  memcpy(prog, "\x80\x02]q\x00", 5);
  n = 5;
  for (int k = 0; k < 20; k++) {
    const char step[] = {'(', 'h', (char)k, 'h', (char)k, 'l', 'q', (char)(k + 1)};
    memcpy(prog + n, step, sizeof step);
    n += sizeof step;
  }
  prog[n++] = '.';
  ks_statedict *sd;
  ks_error err;
  assert_int_equal(run(prog, n, NULL, &sd, &err), KS_E_LIMIT);
  assert_non_null(strstr(err.message, "containers"));
}

/* obj; BUILD {1: 1}; then 2000 x (GET 0, BUILD): the state grows by one item per BUILD. */
static void repeated_builds_extend_the_state_without_copying_it(void **s) {
  (void)s;
  enum { N = 2000 };
  static char prog[32 + 3 * N];
  static const char head[] = "\x80\x02" "cfoo\nBar\n)R}(K\x01K\x01uq\x00" "b";
  size_t n = sizeof head - 1;
  memcpy(prog, head, n);
  for (int i = 0; i < N; i++, n += 3) memcpy(prog + n, "h\x00" "b", 3);
  prog[n++] = '.';
  ks_test_alloc ta;
  ks_test_alloc_init(&ta, 0);
  ks__pk_arena ar;
  ks__pk_limits lim;
  ks__pk_arena_init(&ar, &ta.a);
  ks__pk_limits_from_opts(NULL, n, &lim);
  ks__pk_node *root = NULL;
  assert_int_equal(ks__pk_run((const uint8_t *)prog, n, &ar, &lim, NULL, NULL, &root, NULL), KS_OK);
  assert_int_equal(root->kind, PK_OBJECT);
  assert_int_equal(root->u.obj->state->u.seq.n, 2 * (N + 1));
  assert_true(ta.calls < N); /* copying the state on every BUILD allocates at least once per BUILD */
  ks__pk_arena_release(&ar);
  assert_int_equal(ta.live, 0);
}

static void stack_depth_is_capped(void **s) {
  (void)s;
  char prog[4096];
  memset(prog, '(', sizeof prog);
  ks_torch_read_opts o = {0};
  o.max_stack = 100;
  ks_statedict *sd;
  assert_int_equal(run(prog, sizeof prog, &o, &sd, NULL), KS_E_LIMIT);
}

static void malformed_programs_are_clear_errors(void **s) {
  (void)s;
  ks_statedict *sd;
  ks_error err;
  assert_int_equal(RUN("\x80\x02" "a.", &sd, &err), KS_E_FORMAT);              /* APPEND on empty stack */
  assert_int_equal(RUN("\x80\x02" "h\x05.", &sd, &err), KS_E_FORMAT);          /* memo key not set */
  assert_int_equal(RUN("\x80\x02" "X\xff\x00\x00\x00" "ab.", &sd, &err), KS_E_FORMAT); /* truncated string */
  assert_int_equal(RUN("\x80\x02" "\xff.", &sd, &err), KS_E_UNSUPPORTED);      /* unknown opcode */
  assert_int_equal(err.offset, 2);
  assert_int_equal(RUN("\x80\x02" "N", &sd, &err), KS_E_FORMAT);               /* no STOP */
  assert_int_equal(RUN("\x80\x02" "(K\x01" "d.", &sd, &err), KS_E_FORMAT);       /* odd dict */
  assert_int_equal(RUN("\x80\x02" "X\x02\x00\x00\x00\xc3\x28.", &sd, &err), KS_E_FORMAT); /* bad UTF-8 */
  assert_int_equal(RUN("\x80\x02" "Q.", &sd, &err), KS_E_FORMAT);              /* persid underflow */
  assert_int_equal(RUN("\x80\x02" "K\x01Q.", &sd, &err), KS_E_FORMAT);         /* persid not a storage */
}

static void numpy_rng_array_becomes_a_tensor(void **s) {
  (void)s;
  /* _reconstruct(ndarray, (0,), b'b') + BUILD((1, (2,), dtype('u4') + BUILD((3,'<',...)), False, bytes)) */
  static const char prog[] = "\x80\x02" "cnumpy.core.multiarray\n_reconstruct\n"
                             "cnumpy\nndarray\nK\x00\x85" "C\x01" "b\x87R"
                             "(K\x01K\x02\x85" "cnumpy\ndtype\nX\x02\x00\x00\x00u4\x89\x88\x87R"
                             "(K\x03X\x01\x00\x00\x00<NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb"
                             "\x89" "C\x08\x01\x00\x00\x00\xff\xff\xff\xfftb.";
  ks_statedict *sd;
  ks_error err;
  assert_int_equal(RUN(prog, &sd, &err), KS_OK);
  const ks_tensor *t = ks_statedict_tensor(sd, "value");
  assert_non_null(t);
  assert_int_equal(t->dtype, KS_U32);
  assert_int_equal(t->shape[0], 2);
  assert_int_equal(((const uint32_t *)t->data)[1], 0xFFFFFFFFu);
  ks_statedict_free(sd);
}

static void every_prefix_of_a_program_fails_cleanly(void **s) {
  (void)s;
  static const char prog[] = "\x80\x02}X\x01\x00\x00\x00t"
                             "ctorch._utils\n_rebuild_tensor_v2\n"
                             "((X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x00"
                             "0X\x03\x00\x00\x00"
                             "cpuK\x06tQ"
                             "K\x01K\x02K\x02\x86K\x01K\x02\x86\x89"
                             "ccollections\nOrderedDict\n)RtRs.";
  for (size_t n = 0; n + 1 < sizeof prog - 1; n++) {
    char *copy = malloc(n + 1);
    memcpy(copy, prog, n);
    ks_statedict *sd = NULL;
    assert_int_not_equal(run(copy, n, NULL, &sd, NULL), KS_OK);
    free(copy);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(unknown_global_call_becomes_an_inert_object),
      cmocka_unit_test(nested_lists_and_int_keys_name_entries_by_path),
      cmocka_unit_test(long_integers_keep_their_value),
      cmocka_unit_test(shared_storage_views_are_materialised),
      cmocka_unit_test(view_past_the_storage_end_is_refused),
      cmocka_unit_test(zero_stride_views_are_bounded_by_the_view_limit),
      cmocka_unit_test(memo_index_beyond_the_program_is_a_limit),
      cmocka_unit_test(self_referencing_list_hits_the_depth_limit),
      cmocka_unit_test(shared_empty_containers_are_bounded_by_the_entry_limit),
      cmocka_unit_test(repeated_builds_extend_the_state_without_copying_it),
      cmocka_unit_test(stack_depth_is_capped),
      cmocka_unit_test(malformed_programs_are_clear_errors),
      cmocka_unit_test(numpy_rng_array_becomes_a_tensor),
      cmocka_unit_test(every_prefix_of_a_program_fails_cleanly),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
