/* The PyTorch bridge against the shared torch.save and Composer fixtures. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "import/import_internal.h"
#include "keepsake/keepsake.h"
#include "keepsake/torch.h"
#include "testutil.h"

#define FIX KS_FIXTURES_DIR "/"

static int value_matches(const ks_tensor *t, size_t i, const json_t *v) {
  if (json_is_string(v)) {
    double d = ks_dtype_get_f64(t->dtype, t->data, i);
    const char *s = json_string_value(v);
    if (!strcmp(s, "nan")) return isnan(d);
    return !strcmp(s, "inf") ? d == INFINITY : !strcmp(s, "-inf") ? d == -INFINITY : 0;
  }
  if (json_is_boolean(v)) return ks_dtype_get_i64(t->dtype, t->data, i) == (json_is_true(v) ? 1 : 0);
  if (json_is_integer(v) && !ks_dtype_is_float(t->dtype))
    return ks_dtype_get_i64(t->dtype, t->data, i) == json_integer_value(v);
  return ks_dtype_get_f64(t->dtype, t->data, i) == json_number_value(v);
}

static int tensor_matches(const char *key, const ks_entry *e, const json_t *spec) {
  const ks_tensor *t = &e->tensor;
  const json_t *shape = json_object_get(spec, "shape"), *data = json_object_get(spec, "data");
  if (e->kind != KS_VAL_TENSOR || strcmp(ks_dtype_name(t->dtype), json_string_value(json_object_get(spec, "dtype")))) {
    fprintf(stderr, "%s: kind/dtype differs\n", key);
    return 0;
  }
  if ((size_t)t->rank != json_array_size(shape)) return fprintf(stderr, "%s: rank differs\n", key), 0;
  for (int d = 0; d < t->rank; d++)
    if (t->shape[d] != json_integer_value(json_array_get(shape, (size_t)d)))
      return fprintf(stderr, "%s: shape\n", key), 0;
  if (ks_tensor_numel(t) != json_array_size(data)) return fprintf(stderr, "%s: numel differs\n", key), 0;
  for (size_t i = 0; i < json_array_size(data); i++)
    if (!value_matches(t, i, json_array_get(data, i))) return fprintf(stderr, "%s[%zu] differs\n", key, i), 0;
  return 1;
}

static int scalar_matches(const ks_entry *e, const json_t *v) {
  switch (json_typeof(v)) {
    case JSON_NULL: return e->kind == KS_VAL_NULL;
    case JSON_TRUE:
    case JSON_FALSE: return e->kind == KS_VAL_BOOL && e->i == json_is_true(v);
    case JSON_INTEGER: return e->kind == KS_VAL_INT && e->i == json_integer_value(v);
    case JSON_REAL: return e->kind == KS_VAL_FLOAT && e->f == json_real_value(v);
    case JSON_STRING: return e->kind == KS_VAL_STRING && !strcmp(e->s, json_string_value(v));
    default: return 0;
  }
}

/* Every entry of <fixture>.expected.json is in sd with the right dtype, shape and values. */
static size_t expect_entries(const ks_statedict *sd, const char *json_path) {
  json_error_t jerr;
  json_t *root = json_load_file(json_path, JSON_REJECT_DUPLICATES, &jerr);
  assert_non_null(root);
  const char *key;
  json_t *spec;
  size_t bad = 0, n = 0;
  json_object_foreach(json_object_get(root, "entries"), key, spec) {
    ks_entry e;
    n++;
    if (ks_statedict_get(sd, key, &e) != KS_OK) {
      fprintf(stderr, "missing: %s\n", key);
      bad++;
    } else if (json_object_get(spec, "dtype") ? !tensor_matches(key, &e, spec)
                                                : !scalar_matches(&e, json_object_get(spec, "scalar"))) {
      fprintf(stderr, "wrong value: %s\n", key);
      bad++;
    }
  }
  json_decref(root);
  assert_int_equal(bad, 0);
  return n;
}

static void check_fixture(const char *name, int composer) {
  char pt[512], js[512];
  snprintf(pt, sizeof pt, FIX "%s.pt", name);
  snprintf(js, sizeof js, FIX "%s.expected.json", name);
  ks_statedict *sd, *norm = NULL;
  ks_error err;
  assert_int_equal(ks_torch_load(pt, NULL, &sd, NULL, &err), KS_OK);
  if (composer) assert_int_equal(ks__composer_normalize(sd, KS_BORROW, NULL, &norm, NULL, &err), KS_OK);
  assert_true(expect_entries(norm ? norm : sd, js) > 0);
  ks_statedict_free(norm);
  ks_statedict_free(sd);
}

/* A torch 2.13 fixture: exactly the expected entries and structure document, or the expected refusal. */
static void check_torch213_fixture(const char *dir, const char *name) {
  char pt[768], js[768];
  snprintf(pt, sizeof pt, "%s/%s.pt", dir, name);
  snprintf(js, sizeof js, "%s/%s.expected.json", dir, name);
  json_error_t jerr;
  json_t *want = json_load_file(js, JSON_REJECT_DUPLICATES, &jerr);
  assert_non_null(want);
  ks_statedict *sd = NULL;
  char *structure = NULL;
  ks_error err;
  ks_status st = ks_torch_load(pt, NULL, &sd, &structure, &err);
  const char *error = json_string_value(json_object_get(want, "error"));
  if (error) {
    if (st == KS_OK || strcmp(ks_status_name(st), error) ||
        !strstr(err.message, json_string_value(json_object_get(want, "message"))))
      fail_msg("%s: expected %s, got %s: %s", name, error, ks_status_name(st), err.message);
    assert_null(sd);
  } else {
    if (st != KS_OK) fail_msg("%s: %s", name, err.message);
    assert_int_equal(expect_entries(sd, js), ks_statedict_count(sd)); /* nothing more, nothing less */
    json_t *got = json_loads(structure, 0, &jerr);
    if (!json_equal(got, json_object_get(want, "structure"))) {
      char *w = json_dumps(json_object_get(want, "structure"), JSON_SORT_KEYS);
      fail_msg("%s: structure differs:\n got  %s\n want %s", name, structure, w);
    }
    json_decref(got);
  }
  ks_torch_free(NULL, structure);
  ks_statedict_free(sd);
  json_decref(want);
}

static void reads_every_torch_2_13_fixture_exactly(void **s) {
  (void)s;
  DIR *d = opendir(FIX "torch213");
  assert_non_null(d);
  size_t n = 0;
  for (struct dirent *de; (de = readdir(d)) != NULL;) {
    size_t len = strlen(de->d_name);
    if (len <= 14 || strcmp(de->d_name + len - 14, ".expected.json")) continue;
    char name[256];
    snprintf(name, sizeof name, "%.*s", (int)(len - 14), de->d_name);
    check_torch213_fixture(FIX "torch213", name);
    n++;
  }
  closedir(d);
  assert_true(n >= 17); /* dtypes, training state, RNG, protocols 2-5, legacy, 9 refused dtypes */
}

static void reads_every_dtype_view_and_special_value(void **s) {
  (void)s;
  check_fixture("torch/tensors", 0);
}

static void reads_module_and_optimizer_state_dicts(void **s) {
  (void)s;
  check_fixture("torch/mlp_state_dict", 0);
  check_fixture("torch/adamw_state_dict", 0);
}

static void reads_composer_checkpoints_of_both_metric_layouts(void **s) {
  (void)s;
  check_fixture("composer/composer-0.14-dict-metrics", 1);
  check_fixture("composer/composer-0.13.5-pickled-metrics", 1);
}

static void malicious_payload_is_kept_inert_and_never_runs(void **s) {
  (void)s;
  const char *side_effect = "/tmp/keepsake-pwned"; /* what `posix.system` in the pickle would create */
  unlink(side_effect);
  ks_statedict *sd;
  ks_error err;
  assert_int_equal(ks_torch_load(FIX "torch/malicious.pt", NULL, &sd, NULL, &err), KS_OK);
  assert_false(ks_test_exists(side_effect));
  ks_entry e;
  assert_int_equal(ks_statedict_get(sd, "payload/__class__", &e), KS_OK);
  assert_string_equal(e.s, "posix.system");
  expect_entries(sd, FIX "torch/malicious.expected.json");
  ks_statedict_free(sd);
  assert_false(ks_test_exists(side_effect));
}

static void contiguous_tensors_are_views_into_the_mapping(void **s) {
  (void)s;
  ks_statedict *sd;
  assert_int_equal(ks_torch_load(FIX "torch/tensors.pt", NULL, &sd, NULL, NULL), KS_OK);
  assert_int_equal(ks_statedict_tensor(sd, "f32")->ownership, KS_MAPPED);
  ks_statedict_free(sd);
}

static void buffer_input_gives_the_same_entries_and_outlives_the_buffer(void **s) {
  (void)s;
  size_t len;
  uint8_t *buf = ks_test_read_file(FIX "torch/tensors.pt", &len);
  assert_non_null(buf);
  ks_statedict *sd;
  assert_int_equal(ks_test_torch_load_buffer(buf, len, NULL, &sd, NULL, NULL), KS_OK);
  memset(buf, 0, len);
  free(buf);
  expect_entries(sd, FIX "torch/tensors.expected.json");
  ks_statedict_free(sd);
}

static void every_truncation_is_refused_without_crashing(void **s) {
  (void)s;
  size_t len;
  uint8_t *buf = ks_test_read_file(FIX "torch/malicious.pt", &len);
  assert_non_null(buf);
  for (size_t n = 0; n < len; n++) {
    ks_statedict *sd = NULL;
    ks_error err;
    uint8_t *copy = malloc(n ? n : 1);
    memcpy(copy, buf, n);
    assert_int_not_equal(ks_test_torch_load_buffer(copy, n, NULL, &sd, NULL, &err), KS_OK);
    assert_null(sd);
    free(copy);
  }
  free(buf);
}

static void random_corruption_is_an_error_or_data_never_a_crash(void **s) {
  (void)s;
  size_t len;
  uint8_t *orig = ks_test_read_file(FIX "torch/tensors.pt", &len);
  assert_non_null(orig);
  uint8_t *buf = malloc(len);
  uint32_t rng = 12345;
  for (int round = 0; round < 3000; round++) {
    memcpy(buf, orig, len);
    for (int k = 0; k < 4; k++) {
      rng = rng * 1664525u + 1013904223u;
      size_t at = (rng >> 8) % 1600; /* mostly data.pkl, the densest part */
      rng = rng * 1664525u + 1013904223u;
      buf[at] = (uint8_t)(rng >> 24);
    }
    ks_statedict *sd = NULL;
    ks_status st = ks_test_torch_load_buffer(buf, len, NULL, &sd, NULL, NULL);
    assert_true(st == KS_OK ? sd != NULL : sd == NULL);
    ks_statedict_free(sd);
  }
  free(buf);
  free(orig);
}

static void crc_verification_catches_a_flipped_storage_byte(void **s) {
  (void)s;
  size_t len;
  uint8_t *buf = ks_test_read_file(FIX "torch/malicious.pt", &len);
  assert_non_null(buf);
  /* data/0 holds the 8 bytes of model/w; its data follows the 64-byte aligned local header */
  const uint8_t one[4] = {0, 0, 0x80, 0x3f};
  uint8_t *w = NULL;
  for (size_t i = 0; !w && i + 4 <= len; i++)
    if (!memcmp(buf + i, one, 4)) w = buf + i;
  assert_non_null(w);
  w[0] ^= 1;
  ks_statedict *sd;
  ks_error err;
  ks_torch_read_opts o = {0};
  o.verify_crc = 1;
  assert_int_equal(ks_test_torch_load_buffer(buf, len, &o, &sd, NULL, &err), KS_E_CHECKSUM);
  assert_non_null(strstr(err.key, "data/0"));
  assert_int_equal(ks_test_torch_load_buffer(buf, len, NULL, &sd, NULL, &err), KS_OK);
  ks_statedict_free(sd);
  free(buf);
}

static void allocation_failures_return_nomem_and_leak_nothing(void **s) {
  (void)s;
  size_t len;
  uint8_t *buf = ks_test_read_file(FIX "composer/composer-0.13.5-pickled-metrics.pt", &len);
  assert_non_null(buf);
  for (long n = 1;; n++) {
    ks_test_alloc ta;
    ks_test_alloc_init(&ta, n);
    ks_torch_read_opts o = {0};
    o.alloc = &ta.a;
    ks_statedict *sd = NULL, *norm = NULL;
    char *json = NULL;
    ks_status st = ks_test_torch_load_buffer(buf, len, &o, &sd, NULL, NULL);
    if (st == KS_OK) st = ks__composer_normalize(sd, KS_COPY, NULL, &norm, &json, NULL);
    if (st == KS_OK) {
      assert_non_null(json);
      ks_torch_free(&ta.a, json);
      ks_statedict_free(norm);
      ks_statedict_free(sd);
      assert_int_equal(ta.live, 0);
      break;
    }
    assert_int_equal(st, KS_E_NOMEM);
    ks_statedict_free(sd);
    assert_int_equal(ta.live, 0);
  }
  free(buf);
}

/* With a structure document asked for, every failed allocation is KS_E_NOMEM and nothing leaks. */
static void structure_reads_survive_every_allocation_failure(void **s) {
  (void)s;
  size_t len;
  uint8_t *buf = ks_test_read_file(FIX "torch213/protocol2.pt", &len);
  assert_non_null(buf);
  for (long n = 1;; n++) {
    ks_test_alloc ta;
    ks_test_alloc_init(&ta, n);
    ks_torch_read_opts o = {0};
    o.alloc = &ta.a;
    ks_statedict *sd = NULL;
    char *structure = NULL;
    ks_status st = ks_test_torch_load_buffer(buf, len, &o, &sd, &structure, NULL);
    if (st == KS_OK) {
      assert_non_null(strstr(structure, "\"names\":{\"kind\":\"list\""));
      ks_torch_free(&ta.a, structure);
      ks_statedict_free(sd);
      assert_int_equal(ta.live, 0);
      break;
    }
    assert_int_equal(st, KS_E_NOMEM);
    assert_null(sd);
    assert_null(structure);
    assert_int_equal(ta.live, 0);
  }
  free(buf);
}

/* A pickled metric's list state whose items disagree in rank: [1, 0] then [5] must not be
   concatenated into a [6, 0] tensor of no bytes while 20 bytes are copied into it. */
static void composer_list_state_items_of_different_rank_are_refused(void **s) {
  (void)s;
  static const float five[5] = {1, 2, 3, 4, 5};
  ks_statedict *sd, *norm = NULL;
  ks_tensor a, b;
  int64_t sa[2] = {1, 0}, sb[1] = {5};
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_string(sd, "state/train_metrics/M/__class__", "m.M", NULL), KS_OK);
  assert_int_equal(ks_statedict_set_null(sd, "state/train_metrics/M/_defaults/x", NULL), KS_OK);
  assert_int_equal(ks_tensor_init(&a, KS_F32, 2, sa, NULL), KS_OK);
  assert_int_equal(ks_tensor_init(&b, KS_F32, 1, sb, (void *)five), KS_OK);
  assert_int_equal(ks_statedict_set_tensor(sd, "state/train_metrics/M/x/0", &a, KS_COPY, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_tensor(sd, "state/train_metrics/M/x/1", &b, KS_BORROW, NULL), KS_OK);
  ks_error err;
  assert_int_equal(ks__composer_normalize(sd, KS_BORROW, NULL, &norm, NULL, &err), KS_E_SHAPE);
  assert_null(norm);
  ks_statedict_free(sd);
}

static void torch_load_refuses_a_fifo_without_waiting_for_a_writer(void **s) {
  (void)s;
  char *dir = ks_test_tmpdir("torch-fifo");
  char *path = ks_test_path(dir, "fifo.pt");
  assert_int_equal(mkfifo(path, 0600), 0);
  alarm(10); /* a blocking open would wait forever: let the alarm fail the test instead */
  ks_statedict *sd = NULL;
  ks_error err;
  assert_int_equal(ks_torch_load(path, NULL, &sd, NULL, &err), KS_E_IO); /* as ks_reader_open says */
  alarm(0);
  assert_null(sd);
  ks_test_rmtree(dir);
  free(path);
  free(dir);
}

/* ks_torch_probe: one call for what a path or bytes in memory are (zip, legacy, DCP, other). */
static void probe_says_what_torch_wrote(void **s) {
  (void)s;
  assert_int_equal(ks_torch_probe(FIX "torch/tensors.pt", NULL), KS_TORCH_ZIP);
  assert_int_equal(ks_torch_probe(FIX "torch213/legacy.pt", NULL), KS_TORCH_LEGACY);
  assert_int_equal(ks_torch_probe(FIX "dcp/basic", NULL), KS_TORCH_DCP);
  assert_int_equal(ks_torch_probe(FIX "dcp", NULL), KS_TORCH_UNKNOWN); /* a directory without .metadata */
  assert_int_equal(ks_torch_probe(FIX "torch/tensors.expected.json", NULL), KS_TORCH_UNKNOWN);
  assert_int_equal(ks_torch_probe(FIX "torch/no-such-file.pt", NULL), KS_TORCH_UNKNOWN);
  assert_int_equal(ks_torch_probe(NULL, NULL), KS_TORCH_UNKNOWN);
  size_t len;
  uint8_t *legacy = ks_test_read_file(FIX "torch213/legacy.pt", &len);
  assert_non_null(legacy);
  ks_torch_read_opts o = KS_OPTS_INIT(ks_torch_read_opts);
  o.data = legacy;
  o.data_len = len;
  assert_int_equal(ks_torch_probe(NULL, &o), KS_TORCH_LEGACY);
  o.data_len = 13; /* too short to tell */
  assert_int_equal(ks_torch_probe(NULL, &o), KS_TORCH_UNKNOWN);
  o.data = "PK\x05\x06";
  o.data_len = 4; /* an empty archive's end record */
  assert_int_equal(ks_torch_probe(NULL, &o), KS_TORCH_ZIP);
  o.data = "PK\x01\x02";
  assert_int_equal(ks_torch_probe(NULL, &o), KS_TORCH_UNKNOWN);
  free(legacy);
}

/* ks_torch_load reads a path or opts->data: exactly one of them. */
static void torch_load_takes_a_path_or_bytes(void **s) {
  (void)s;
  size_t len;
  uint8_t *buf = ks_test_read_file(FIX "torch/tensors.pt", &len);
  assert_non_null(buf);
  ks_torch_read_opts o = KS_OPTS_INIT(ks_torch_read_opts);
  ks_statedict *a = NULL, *b = NULL;
  ks_error err;
  assert_int_equal(ks_torch_load(NULL, &o, &a, NULL, &err), KS_E_INVALID); /* neither */
  assert_int_equal(ks_torch_load(NULL, NULL, &a, NULL, &err), KS_E_INVALID);
  o.data = buf;
  o.data_len = len;
  assert_int_equal(ks_torch_load(FIX "torch/tensors.pt", &o, &a, NULL, &err), KS_E_INVALID); /* both */
  assert_null(a);
  char *structure = NULL;
  assert_int_equal(ks_torch_load(NULL, &o, &a, &structure, &err), KS_OK);
  assert_non_null(structure);
  free(buf); /* the dict copied what it keeps */
  assert_int_equal(ks_torch_load(FIX "torch/tensors.pt", NULL, &b, NULL, &err), KS_OK);
  assert_int_equal(ks_statedict_count(a), ks_statedict_count(b));
  for (size_t i = 0; i < ks_statedict_count(b); i++) {
    ks_entry x, y;
    assert_int_equal(ks_statedict_at(b, i, &y), KS_OK);
    assert_int_equal(ks_statedict_get(a, y.name, &x), KS_OK);
    assert_int_equal(x.kind, y.kind);
    if (x.kind == KS_VAL_TENSOR) {
      assert_int_equal(x.tensor.nbytes, y.tensor.nbytes);
      if (x.tensor.nbytes) assert_memory_equal(x.tensor.data, y.tensor.data, x.tensor.nbytes);
    }
  }
  /* A legacy file is refused the same way from a path and from bytes. */
  assert_int_equal(ks_torch_load(FIX "torch213/legacy.pt", NULL, &b, NULL, &err), KS_E_UNSUPPORTED);
  ks_torch_free(NULL, structure);
  ks_statedict_free(a);
  ks_statedict_free(b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(reads_every_dtype_view_and_special_value),
      cmocka_unit_test(reads_every_torch_2_13_fixture_exactly),
      cmocka_unit_test(reads_module_and_optimizer_state_dicts),
      cmocka_unit_test(reads_composer_checkpoints_of_both_metric_layouts),
      cmocka_unit_test(malicious_payload_is_kept_inert_and_never_runs),
      cmocka_unit_test(contiguous_tensors_are_views_into_the_mapping),
      cmocka_unit_test(buffer_input_gives_the_same_entries_and_outlives_the_buffer),
      cmocka_unit_test(every_truncation_is_refused_without_crashing),
      cmocka_unit_test(random_corruption_is_an_error_or_data_never_a_crash),
      cmocka_unit_test(crc_verification_catches_a_flipped_storage_byte),
      cmocka_unit_test(allocation_failures_return_nomem_and_leak_nothing),
      cmocka_unit_test(structure_reads_survive_every_allocation_failure),
      cmocka_unit_test(composer_list_state_items_of_different_rank_are_refused),
      cmocka_unit_test(torch_load_refuses_a_fifo_without_waiting_for_a_writer),
      cmocka_unit_test(probe_says_what_torch_wrote),
      cmocka_unit_test(torch_load_takes_a_path_or_bytes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
