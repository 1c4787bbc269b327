/* The torch.save-compatible writer, the zip container it produces, and Composer metric mapping. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "import/import_internal.h"
#include "keepsake/keepsake.h"
#include "keepsake/torch.h"
#include "testutil.h"
#include "torch/torch_internal.h"

static ks_statedict *sample(const ks_allocator *a) {
  ks_statedict *sd;
  assert_int_equal(ks_statedict_create(a, &sd, NULL), KS_OK);
  int64_t s23[2] = {2, 3}, s0[2] = {0, 4}, s4[1] = {4};
  float *f;
  assert_int_equal(ks_statedict_new_tensor(sd, "model/w", KS_F32, 2, s23, (void **)&f, NULL), KS_OK);
  for (int i = 0; i < 6; i++) f[i] = (float)i - 2.5f;
  uint16_t *h;
  assert_int_equal(ks_statedict_new_tensor(sd, "model/h", KS_BF16, 1, s4, (void **)&h, NULL), KS_OK);
  for (int i = 0; i < 4; i++) h[i] = (uint16_t)ks_test_to_bits(KS_BF16, (float)i * 0.5f);
  uint32_t *u;
  assert_int_equal(ks_statedict_new_tensor(sd, "rng/numpy", KS_U32, 1, s4, (void **)&u, NULL), KS_OK);
  u[3] = 0xFFFFFFFFu;
  assert_int_equal(ks_statedict_new_tensor(sd, "empty", KS_I64, 2, s0, NULL, NULL), KS_OK);
  assert_int_equal(ks_statedict_new_tensor(sd, "flag", KS_BOOL, 0, NULL, NULL, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_int(sd, "step", -5000000000LL, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_float(sd, "opt/lr", 0.001, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_bool(sd, "opt/amsgrad", 1, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_string(sd, "run_name", "r\xc3\xa9sum\xc3\xa9", NULL), KS_OK);
  assert_int_equal(ks_statedict_set_null(sd, "opt/foreach", NULL), KS_OK);
  return sd;
}

static void written_file_reads_back_with_every_value(void **s) {
  (void)s;
  ks_statedict *sd = sample(NULL), *back;
  void *buf;
  size_t len;
  ks_error err;
  assert_int_equal(ks_torch_save_buffer(sd, NULL, &buf, &len, &err), KS_OK);
  assert_int_equal(ks_test_torch_load_buffer(buf, len, NULL, &back, NULL, &err), KS_OK);
  const ks_tensor *w = ks_statedict_tensor(back, "model/w"), *u = ks_statedict_tensor(back, "rng/numpy");
  assert_non_null(w);
  assert_memory_equal(w->data, ks_statedict_tensor(sd, "model/w")->data, 24);
  assert_int_equal(u->dtype, KS_U32); /* torch >= 2.3 has uint32: _rebuild_tensor_v3 */
  assert_int_equal(((const uint32_t *)u->data)[3], 0xFFFFFFFFu);
  assert_int_equal(ks_statedict_tensor(back, "empty")->shape[0], 0);
  assert_int_equal(ks_statedict_tensor(back, "flag")->rank, 0);
  ks_entry e;
  assert_int_equal(ks_statedict_get(back, "opt/lr", &e), KS_OK); /* a Python float (BINFLOAT) */
  assert_true(e.kind == KS_VAL_FLOAT && e.f == 0.001);
  assert_int_equal(ks_statedict_get(back, "step", &e), KS_OK);
  assert_int_equal(e.i, -5000000000LL);
  assert_int_equal(ks_statedict_get(back, "run_name", &e), KS_OK);
  assert_string_equal(e.s, "r\xc3\xa9sum\xc3\xa9");
  assert_int_equal(ks_statedict_get(back, "opt/amsgrad", &e), KS_OK);
  assert_int_equal(e.kind, KS_VAL_BOOL);
  assert_int_equal(ks_statedict_get(back, "opt/foreach", &e), KS_OK);
  assert_int_equal(e.kind, KS_VAL_NULL);
  ks_statedict_free(back);
  ks_torch_free(NULL, buf);
  ks_statedict_free(sd);
}

static void torch_1_13_compat_widens_unsigned_and_writes_floats_as_tensors(void **s) {
  (void)s;
  ks_statedict *sd = sample(NULL), *back;
  void *buf;
  size_t len;
  ks_error err;
  ks_torch_write_opts wo = {0};
  wo.torch_compat = KS_TORCH_COMPAT_1_13;
  assert_int_equal(ks_torch_save_buffer(sd, &wo, &buf, &len, &err), KS_OK);
  assert_int_equal(ks_test_torch_load_buffer(buf, len, NULL, &back, NULL, &err), KS_OK);
  const ks_tensor *u = ks_statedict_tensor(back, "rng/numpy");
  assert_int_equal(u->dtype, KS_I64); /* torch 1.13 has no uint32: widened */
  assert_int_equal(((const int64_t *)u->data)[3], 0xFFFFFFFFLL);
  const ks_tensor *lr = ks_statedict_tensor(back, "opt/lr"); /* 1.13's safe loader lacks BINFLOAT */
  assert_true(lr && lr->dtype == KS_F64 && lr->rank == 0 && *(const double *)lr->data == 0.001);
  ks_statedict_free(back);
  ks_torch_free(NULL, buf);
  ks_statedict_free(sd);
}

static void storages_are_64_byte_aligned_and_crcs_verify(void **s) {
  (void)s;
  ks_statedict *sd = sample(NULL), *back;
  void *buf;
  size_t len;
  ks_torch_write_opts wo = {0};
  wo.root = "ckpt";
  assert_int_equal(ks_torch_save_buffer(sd, &wo, &buf, &len, NULL), KS_OK);
  ks__zip *z;
  assert_int_equal(ks__zip_open_buffer(buf, len, NULL, &z, NULL), KS_OK);
  assert_string_equal(ks__zip_root(z), "ckpt/");
  for (size_t i = 0; i < ks__zip_count(z); i++) assert_int_equal(ks__zip_at(z, i)->data_off % 64, 0);
  ks__zip_free(z);
  ks_torch_read_opts ro = {0};
  ro.verify_crc = 1;
  assert_int_equal(ks_test_torch_load_buffer(buf, len, &ro, &back, NULL, NULL), KS_OK);
  ks_statedict_free(back);
  ks_torch_free(NULL, buf);
  ks_statedict_free(sd);
}

static void zip64_records_are_written_and_read(void **s) {
  (void)s;
  ks_statedict *sd = sample(NULL), *back;
  void *buf;
  size_t len;
  assert_int_equal(ks__torch_save_buffer_zip64(sd, NULL, &buf, &len, NULL), KS_OK);
  const uint8_t sig[4] = {0x50, 0x4b, 0x06, 0x06};
  int found = 0;
  for (size_t i = 0; i + 4 <= len; i++) found |= !memcmp((uint8_t *)buf + i, sig, 4);
  assert_true(found);
  ks_torch_read_opts ro = {0};
  ro.verify_crc = 1;
  assert_int_equal(ks_test_torch_load_buffer(buf, len, &ro, &back, NULL, NULL), KS_OK);
  assert_int_equal(ks_statedict_count(back), ks_statedict_count(sd));
  ks_statedict_free(back);
  ks_torch_free(NULL, buf);
  ks_statedict_free(sd);
}

static void compressed_entries_are_refused_clearly(void **s) {
  (void)s;
  ks_statedict *sd = sample(NULL), *back;
  uint8_t *buf;
  size_t len;
  assert_int_equal(ks_torch_save_buffer(sd, NULL, (void **)&buf, &len, NULL), KS_OK);
  for (size_t i = 0; i + 46 <= len; i++) /* mark every central entry as deflated */
    if (ks__le32(buf + i) == 0x02014b50u) ks__put_le16(buf + i + 10, 8);
  ks_error err;
  assert_int_equal(ks_test_torch_load_buffer(buf, len, NULL, &back, NULL, &err), KS_E_UNSUPPORTED);
  assert_non_null(strstr(err.message, "compressed"));
  ks_torch_free(NULL, buf);
  ks_statedict_free(sd);
}

static void a_name_that_is_both_value_and_folder_is_refused(void **s) {
  (void)s;
  ks_statedict *sd;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_int(sd, "a", 1, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_int(sd, "a/b", 2, NULL), KS_OK);
  void *buf;
  size_t len;
  ks_error err;
  assert_int_equal(ks_torch_save_buffer(sd, NULL, &buf, &len, &err), KS_E_INVALID);
  assert_non_null(strstr(err.message, "both a value and a folder"));
  ks_statedict_free(sd);
}

static void fp8_tensors_round_trip_and_are_refused_for_torch_1_13(void **s) {
  (void)s;
  ks_statedict *sd, *back;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  int64_t n = 2;
  uint8_t *q;
  assert_int_equal(ks_statedict_new_tensor(sd, "q", KS_F8_E4M3, 1, &n, (void **)&q, NULL), KS_OK);
  assert_int_equal(ks_statedict_new_tensor(sd, "r", KS_F8_E5M2, 1, &n, NULL, NULL), KS_OK);
  q[0] = 0x38, q[1] = 0xC0;
  void *buf;
  size_t len;
  ks_torch_write_opts wo = {0};
  assert_int_equal(ks_torch_save_buffer(sd, &wo, &buf, &len, NULL), KS_OK);
  assert_int_equal(ks_test_torch_load_buffer(buf, len, NULL, &back, NULL, NULL), KS_OK);
  assert_int_equal(ks_statedict_tensor(back, "q")->dtype, KS_F8_E4M3);
  assert_int_equal(ks_statedict_tensor(back, "r")->dtype, KS_F8_E5M2);
  assert_memory_equal(ks_statedict_tensor(back, "q")->data, q, 2);
  ks_statedict_free(back);
  ks_torch_free(NULL, buf);
  wo.torch_compat = KS_TORCH_COMPAT_1_13;
  assert_int_equal(ks_torch_save_buffer(sd, &wo, &buf, &len, NULL), KS_E_DTYPE);
  ks_statedict_free(sd);
}

static ks_status save_with(const ks_statedict *sd, const char *structure, void **buf, size_t *len, ks_error *err) {
  ks_torch_write_opts wo = {0};
  wo.structure = structure;
  return ks_torch_save_buffer(sd, &wo, buf, len, err);
}

/* The structure document round-trips: what the export holds reads back as the same document. */
static void structure_document_rebuilds_lists_tuples_typed_keys_and_empty_containers(void **s) {
  (void)s;
  static const char doc[] =
      "{\"version\":1,\"containers\":{\"opt/state\":{\"kind\":\"dict\",\"keys\":{\"0\":0,\"True\":true,\"None\":null}},"
      "\"opt/groups\":{\"kind\":\"list\",\"len\":3},\"opt/groups/0/betas\":{\"kind\":\"tuple\",\"len\":2},"
      "\"opt/groups/2\":{\"kind\":\"dict\"},\"empty_list\":{\"kind\":\"list\",\"len\":0},"
      "\"ids\":{\"kind\":\"set\",\"len\":2}}}";
  ks_statedict *sd, *back;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_int(sd, "opt/state/0", 10, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_int(sd, "opt/state/True", 11, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_int(sd, "opt/state/None", 12, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_float(sd, "opt/groups/0/betas/0", 0.9, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_float(sd, "opt/groups/0/betas/1", 0.999, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_string(sd, "a%2Fb", "slash", NULL), KS_OK); /* a key "a/b" */
  assert_int_equal(ks_statedict_set_int(sd, "ids/0", 3, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_int(sd, "ids/1", 4, NULL), KS_OK);
  void *buf;
  size_t len;
  ks_error err;
  char *again = NULL;
  assert_int_equal(save_with(sd, doc, &buf, &len, &err), KS_OK);
  assert_int_equal(ks_test_torch_load_buffer(buf, len, NULL, &back, &again, &err), KS_OK);
  ks_entry e;
  assert_int_equal(ks_statedict_get(back, "opt/groups/1", &e), KS_OK); /* item 1 had no entry: None */
  assert_int_equal(e.kind, KS_VAL_NULL);
  assert_int_equal(ks_statedict_get(back, "a%2Fb", &e), KS_OK);
  assert_string_equal(e.s, "slash");
  assert_int_equal(ks_statedict_count(back), ks_statedict_count(sd) + 1);
  json_t *want = json_loads(doc, 0, NULL), *got = json_loads(again, 0, NULL);
  assert_true(json_equal(want, got));
  json_decref(want);
  json_decref(got);
  ks_torch_free(NULL, again);
  ks_statedict_free(back);
  ks_torch_free(NULL, buf);
  ks_statedict_free(sd);
}

/* A document that contradicts the entries, or is not one, is refused with a clear message. */
static void malformed_structure_documents_are_refused(void **s) {
  (void)s;
  static const struct {
    const char *doc, *message;
  } cases[] = {
      {"not json", "structure document"},
      {"{\"version\":2,\"containers\":{}}", "structure document"},
      {"{\"version\":1,\"containers\":{\"a\":{\"kind\":\"list\",\"len\":1}}}", "not an index"},
      {"{\"version\":1,\"containers\":{\"a\":{\"kind\":\"list\",\"len\":1000000000000}}}", "items"},
      {"{\"version\":1,\"containers\":{\"a/x\":{\"kind\":\"dict\"}}}", "both a value and a folder"},
      {"{\"version\":1,\"containers\":{\"b\":[]}}", "not an object"},
  };
  ks_statedict *sd;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_int(sd, "a/x", 1, NULL), KS_OK);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    void *buf = NULL;
    size_t len;
    ks_error err;
    assert_int_equal(save_with(sd, cases[i].doc, &buf, &len, &err), KS_E_INVALID);
    if (!strstr(err.message, cases[i].message)) fail_msg("case %zu: %s", i, err.message);
    assert_null(buf);
  }
  ks_statedict_free(sd);
}

static void save_to_a_path_replaces_the_file(void **s) {
  (void)s;
  char *dir = ks_test_tmpdir("torchsave"), *path = ks_test_path(dir, "x.pt");
  ks_test_write_file(path, "old", 3);
  ks_statedict *sd = sample(NULL), *back;
  ks_torch_write_opts wo = {.io = ks_test_io_nosync()};
  assert_int_equal(ks_torch_save(path, sd, &wo, NULL), KS_OK);
  assert_int_equal(ks_torch_load(path, NULL, &back, NULL, NULL), KS_OK);
  assert_int_equal(ks_statedict_count(back), ks_statedict_count(sd));
  ks_statedict_free(back);
  ks_statedict_free(sd);
  ks_test_rmtree(dir);
  free(path);
  free(dir);
}

static void writer_allocation_failures_return_nomem_and_leak_nothing(void **s) {
  (void)s;
  ks_statedict *sd = sample(NULL);
  for (long n = 1;; n++) {
    ks_test_alloc ta;
    ks_test_alloc_init(&ta, n);
    ks_torch_write_opts wo = {0};
    wo.alloc = &ta.a;
    /* a list, a tuple and an empty dict, so the structure paths fail in turn too */
    wo.structure = "{\"version\":1,\"containers\":{\"model\":{\"kind\":\"dict\",\"keys\":{}},"
                   "\"opt/none\":{\"kind\":\"dict\"},\"seq\":{\"kind\":\"tuple\",\"len\":2},"
                   "\"\":{\"kind\":\"dict\"}}}";
    if (n % 2) wo.structure = NULL;
    void *buf = NULL;
    size_t len;
    ks_status st = ks_torch_save_buffer(sd, &wo, &buf, &len, NULL);
    if (st == KS_OK && !wo.structure) { /* the structured run decides when to stop */
      ks_torch_free(&ta.a, buf);
      assert_int_equal(ta.live, 0);
      continue;
    }
    if (st == KS_OK) {
      ks_torch_free(&ta.a, buf);
      assert_int_equal(ta.live, 0);
      break;
    }
    assert_int_equal(st, KS_E_NOMEM);
    assert_int_equal(ta.live, 0);
  }
  ks_statedict_free(sd);
}

static void composer_list_states_are_concatenated(void **s) {
  (void)s;
  ks_statedict *flat, *out;
  assert_int_equal(ks_statedict_create(NULL, &flat, NULL), KS_OK);
  const char *r = "state/eval_metrics/val/BinaryAUROC/";
  char k[256];
  snprintf(k, sizeof k, "%s__class__", r);
  assert_int_equal(ks_statedict_set_string(flat, k, "torchmetrics.classification.auroc.BinaryAUROC", NULL), KS_OK);
  snprintf(k, sizeof k, "%s_persistent/preds", r);
  assert_int_equal(ks_statedict_set_bool(flat, k, 1, NULL), KS_OK);
  snprintf(k, sizeof k, "%s_update_count", r);
  assert_int_equal(ks_statedict_set_int(flat, k, 2, NULL), KS_OK);
  snprintf(k, sizeof k, "%smax_fpr", r);
  assert_int_equal(ks_statedict_set_null(flat, k, NULL), KS_OK);
  int64_t n2 = 2, n3 = 3;
  float *a, *b;
  snprintf(k, sizeof k, "%spreds/0", r);
  assert_int_equal(ks_statedict_new_tensor(flat, k, KS_F32, 1, &n2, (void **)&a, NULL), KS_OK);
  snprintf(k, sizeof k, "%spreds/1", r);
  assert_int_equal(ks_statedict_new_tensor(flat, k, KS_F32, 1, &n3, (void **)&b, NULL), KS_OK);
  a[0] = 1, a[1] = 2, b[0] = 3, b[1] = 4, b[2] = 5;
  assert_int_equal(ks_statedict_set_int(flat, "state/rank_zero_seed", 7, NULL), KS_OK);
  char *json;
  assert_int_equal(ks__composer_normalize(flat, KS_COPY, NULL, &out, &json, NULL), KS_OK);
  snprintf(k, sizeof k, "%sstate_dict/preds", r);
  const ks_tensor *t = ks_statedict_tensor(out, k);
  assert_true(t && t->shape[0] == 5 && ((const float *)t->data)[4] == 5);
  ks_entry e;
  snprintf(k, sizeof k, "%s_computed", r);
  assert_int_equal(ks_statedict_get(out, k, &e), KS_OK);
  assert_int_equal(e.kind, KS_VAL_NULL);
  assert_int_equal(ks_statedict_get(out, "state/rank_zero_seed", &e), KS_OK);
  snprintf(k, sizeof k, "%s_update_count", r);
  assert_int_not_equal(ks_statedict_get(out, k, &e), KS_OK); /* object attributes are not carried over */
  assert_non_null(strstr(json, "\"layout\":\"pickled-object\""));
  assert_non_null(strstr(json, "\"label\":\"val\""));
  assert_non_null(strstr(json, "\"update_count\":2"));
  assert_non_null(strstr(json, "\"max_fpr\":null"));
  ks_torch_free(NULL, json);
  ks_statedict_free(out);
  ks_statedict_free(flat);
}

static void composer_state_dict_layout_passes_through(void **s) {
  (void)s;
  ks_statedict *sd, *out;
  char *json;
  const char *pt = KS_FIXTURES_DIR "/composer/composer-0.14-dict-metrics.pt";
  assert_int_equal(ks_torch_load(pt, NULL, &sd, NULL, NULL), KS_OK);
  assert_int_equal(ks__composer_normalize(sd, KS_BORROW, NULL, &out, &json, NULL), KS_OK);
  assert_int_equal(ks_statedict_count(out), ks_statedict_count(sd));
  assert_non_null(strstr(json, "\"layout\":\"state-dict\""));
  assert_non_null(strstr(json, "\"states\":[\"mean_value\",\"weight\"]"));
  assert_non_null(strstr(json, "\"class\":null"));
  ks_torch_free(NULL, json);
  ks_statedict_free(out);
  ks_statedict_free(sd);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(written_file_reads_back_with_every_value),
      cmocka_unit_test(storages_are_64_byte_aligned_and_crcs_verify),
      cmocka_unit_test(zip64_records_are_written_and_read),
      cmocka_unit_test(compressed_entries_are_refused_clearly),
      cmocka_unit_test(a_name_that_is_both_value_and_folder_is_refused),
      cmocka_unit_test(fp8_tensors_round_trip_and_are_refused_for_torch_1_13),
      cmocka_unit_test(torch_1_13_compat_widens_unsigned_and_writes_floats_as_tensors),
      cmocka_unit_test(structure_document_rebuilds_lists_tuples_typed_keys_and_empty_containers),
      cmocka_unit_test(malformed_structure_documents_are_refused),
      cmocka_unit_test(save_to_a_path_replaces_the_file),
      cmocka_unit_test(writer_allocation_failures_return_nomem_and_leak_nothing),
      cmocka_unit_test(composer_list_states_are_concatenated),
      cmocka_unit_test(composer_state_dict_layout_passes_through),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
