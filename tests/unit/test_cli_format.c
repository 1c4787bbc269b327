/* The inspect, verify and diff subcommands, run as a user would run them. */
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>

#include <cmocka.h>
#include <jansson.h>

#include "test_format_helpers.h"

static char *tmp_dir;

static int setup(void **state) {
  (void)state;
  tmp_dir = ks_test_tmpdir("cli-fmt");
  return tmp_dir ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  ks_test_rmtree(tmp_dir);
  free(tmp_dir);
  return 0;
}

/* Runs `keepsake <args>`; returns the exit status, output in *out (caller frees). */
static int cli(char **out, const char *fmt, ...) {
  char args[2048], cmd[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(args, sizeof args, fmt, ap);
  va_end(ap);
  snprintf(cmd, sizeof cmd, "'%s' %s", KS_CLI_PATH, args);
  char *o = NULL;
  int rc = ks_test_run(cmd, &o);
  if (out) *out = o;
  else free(o);
  return rc;
}

static void assert_contains(const char *hay, const char *needle) {
  if (!hay || !strstr(hay, needle)) fail_msg("output lacks '%s':\n%s", needle, hay ? hay : "(null)");
}

/* A safetensors file written from the specification alone: no keepsake metadata. */
static char *foreign_file(void) {
  const char *h = "{\"__metadata__\":{\"format\":\"pt\"},"
                  "\"embed.weight\":{\"dtype\":\"F16\",\"shape\":[2,2],\"data_offsets\":[0,8]},"
                  "\"scale\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[8,16]},"
                  "\"none\":{\"dtype\":\"I32\",\"shape\":[0],\"data_offsets\":[16,16]}}";
  uint8_t data[16] = {0x00, 0x3c, 0x00, 0x40, 0x00, 0xc0, 0x00, 0x7c}; /* f16: 1, 2, -2, inf */
  double scale = 0.5;
  memcpy(data + 8, &scale, 8);
  size_t len;
  uint8_t *b = fmt_build(h, data, sizeof data, &len);
  char *path = ks_test_path(tmp_dir, "foreign.safetensors");
  ks_test_write_file(path, b, len);
  free(b);
  return path;
}

static char *saved(const char *name, ks_statedict *sd, const ks_meta *extra) {
  char *path = ks_test_path(tmp_dir, name);
  assert_int_equal(ks_save(path, sd, extra, NULL, NULL), KS_OK);
  return path;
}

static void inspect_shows_a_foreign_safetensors_file(void **state) {
  (void)state;
  char *path = foreign_file(), *out;
  assert_int_equal(cli(&out, "inspect '%s'", path), 0);
  assert_contains(out, "safetensors (no keepsake metadata)");
  assert_contains(out, "embed.weight");
  assert_contains(out, "F16");
  assert_contains(out, "[2, 2]");
  assert_contains(out, "format: pt");
  free(out);
  assert_int_equal(cli(&out, "inspect --json '%s'", path), 0);
  json_error_t je;
  json_t *j = json_loads(out, 0, &je);
  assert_non_null(j);
  assert_string_equal(json_string_value(json_object_get(j, "format")), "safetensors");
  json_t *tensors = json_object_get(j, "tensors");
  assert_int_equal(json_array_size(tensors), 3);
  json_t *t0 = json_array_get(tensors, 0);
  assert_string_equal(json_string_value(json_object_get(t0, "name")), "embed.weight");
  assert_int_equal(json_integer_value(json_object_get(t0, "bytes")), 8);
  json_decref(j);
  free(out);
  free(path);
}

static void verify_accepts_a_foreign_safetensors_file(void **state) {
  (void)state;
  char *path = foreign_file(), *out;
  assert_int_equal(cli(&out, "verify '%s'", path), 0);
  assert_contains(out, "OK (safetensors, 3 tensors");
  free(out);
  free(path);
}

static void inspect_shows_scalars_and_metadata(void **state) {
  (void)state;
  ks_statedict *sd = fmt_small_dict(4);
  assert_int_equal(ks_statedict_set_float(sd, "lr", NAN, NULL), KS_OK);
  ks_meta *extra;
  assert_int_equal(ks_meta_create(NULL, &extra, NULL), KS_OK);
  assert_int_equal(ks_meta_set(extra, "keepsake.metrics", "{\"train/acc\":{\"class\":\"MeanMetric\"}}", NULL), KS_OK);
  assert_int_equal(ks_meta_set(extra, "user.note", "{\"raw\": true}", NULL), KS_OK);
  char *path = saved("k.ks", sd, extra), *out;
  assert_int_equal(cli(&out, "inspect '%s'", path), 0);
  assert_contains(out, "keepsake version 1");
  assert_contains(out, "\"small\"");
  assert_contains(out, "nan");
  assert_contains(out, "user.note: {\"raw\": true}"); /* caller metadata is printed raw */
  assert_contains(out, "train/acc"); /* raw, or rendered by the metrics component when linked in */
  free(out);
  assert_int_equal(cli(&out, "inspect --json '%s'", path), 0);
  json_t *j = json_loads(out, 0, NULL);
  assert_non_null(j);
  assert_string_equal(json_string_value(json_object_get(json_object_get(j, "scalars"), "run")), "small");
  assert_string_equal(json_string_value(json_object_get(json_object_get(j, "scalars"), "lr")), "nan");
  json_decref(j);
  free(out);
  ks_meta_free(extra);
  ks_statedict_free(sd);
  free(path);
}

static void verify_names_key_and_offset_of_corruption(void **state) {
  (void)state;
  ks_statedict *sd = fmt_small_dict(4);
  char *path = saved("bad.ks", sd, NULL), *out;
  assert_int_equal(cli(&out, "verify '%s'", path), 0);
  assert_contains(out, "all checksums match");
  free(out);
  size_t len;
  uint8_t *b = ks_test_read_file(path, &len);
  b[len - 2] ^= 0x40;
  ks_test_write_file(path, b, len);
  assert_int_equal(cli(&out, "verify '%s'", path), 1);
  assert_contains(out, "'step'");
  char at[64];
  snprintf(at, sizeof at, "at byte %zu", len - 8);
  assert_contains(out, at);
  assert_contains(out, "KS_E_CHECKSUM");
  assert_contains(out, "BAD (1 problem)");
  free(out);
  ks_test_write_file(path, b, len - 1);
  assert_int_equal(cli(&out, "verify '%s'", path), 1);
  assert_contains(out, "past the end of the data section");
  free(out);
  assert_int_equal(cli(&out, "inspect '%s'", path), 1);
  free(out);
  free(b);
  ks_statedict_free(sd);
  free(path);
}

static void diff_exit_status_follows_content(void **state) {
  (void)state;
  ks_statedict *a = fmt_small_dict(4), *b = fmt_small_dict(4);
  char *pa = saved("a.ks", a, NULL), *pb = saved("b.ks", b, NULL), *out;
  assert_int_equal(cli(&out, "diff '%s' '%s'", pa, pb), 0);
  assert_contains(out, "identical");
  free(out);
  float *w = ks_statedict_tensor(b, "model/w")->data;
  w[1] += 0.25f;
  w[4] = NAN;
  assert_int_equal(ks_statedict_set_int(b, "rng/seed", 7, NULL), KS_OK);
  free(pb);
  pb = saved("b.ks", b, NULL);
  assert_int_equal(cli(&out, "diff '%s' '%s'", pa, pb), 1);
  assert_contains(out, "model/w: 2 of 6 elements differ, max abs difference 0.25");
  assert_contains(out, "rng/seed: only in B");
  free(out);
  assert_int_equal(cli(&out, "diff '%s' '%s' --ignore 'model/*' --ignore rng", pa, pb), 0);
  assert_contains(out, "2 ignored");
  free(out);
  assert_int_equal(cli(&out, "diff '%s' '%s' --ignore model", pa, pb), 1); /* rng still differs */
  free(out);
  assert_int_equal(ks_statedict_set_string(a, "run", "other", NULL), KS_OK);
  free(pa);
  pa = saved("a.ks", a, NULL);
  assert_int_equal(cli(&out, "diff '%s' '%s' --ignore=model --ignore=rng/*", pa, pb), 1);
  assert_contains(out, "run: \"other\" -> \"small\"");
  free(out);
  assert_int_equal(cli(&out, "diff '%s' /nonexistent/file", pa), 2);
  free(out);
  ks_statedict_free(a);
  ks_statedict_free(b);
  free(pa);
  free(pb);
}

/* The RESULT cell of a component's row in diff's summary table, or "" when absent. */
static const char *component_result(const char *out, const char *component) {
  char needle[256];
  snprintf(needle, sizeof needle, "\n  %s ", component);
  const char *row = strstr(out, needle);
  if (!row) return "";
  const char *end = strchr(row + 1, '\n');
  const char *d = strstr(row, "different"), *i = strstr(row, "identical");
  if (d && (!end || d < end)) return "different";
  if (i && (!end || i < end)) return "identical";
  return "";
}

static void diff_summarises_checkpoints_component_by_component(void **state) {
  (void)state;
  ks_statedict *a, *b;
  int64_t shape[1] = {3};
  assert_int_equal(ks_statedict_create(NULL, &a, NULL), KS_OK);
  assert_int_equal(ks_statedict_create(NULL, &b, NULL), KS_OK);
  float *wa, *wb, *ma, *mb;
  assert_int_equal(ks_statedict_new_tensor(a, "state/model/fc.weight", KS_F32, 1, shape, (void **)&wa, NULL), KS_OK);
  assert_int_equal(ks_statedict_new_tensor(b, "state/model/fc.weight", KS_F32, 1, shape, (void **)&wb, NULL), KS_OK);
  assert_int_equal(
      ks_statedict_new_tensor(a, "state/optimizers/AdamW/state/0/exp_avg", KS_F32, 1, shape, (void **)&ma, NULL),
      KS_OK);
  assert_int_equal(
      ks_statedict_new_tensor(b, "state/optimizers/AdamW/state/0/exp_avg", KS_F32, 1, shape, (void **)&mb, NULL),
      KS_OK);
  assert_int_equal(ks_statedict_set_int(a, "state/timestamp/Timestamp/batch", 10, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_int(b, "state/timestamp/Timestamp/batch", 10, NULL), KS_OK);
  wb[1] = 1.0f; /* only the model differs */
  char *pa = saved("ca.ks", a, NULL), *pb = saved("cb.ks", b, NULL), *out;
  assert_int_equal(cli(&out, "diff '%s' '%s'", pa, pb), 1);
  assert_contains(out, "components (3)");
  assert_string_equal(component_result(out, "state/model"), "different");
  assert_string_equal(component_result(out, "state/optimizers/AdamW"), "identical");
  assert_string_equal(component_result(out, "state/timestamp/Timestamp"), "identical");
  free(out);
  ks_statedict_free(a);
  ks_statedict_free(b);
  free(pa);
  free(pb);
}

static void diff_treats_nan_in_the_same_place_as_equal(void **state) {
  (void)state;
  ks_statedict *a = fmt_small_dict(4), *b = fmt_small_dict(4);
  ((float *)ks_statedict_tensor(a, "model/w")->data)[2] = NAN;
  uint32_t other_nan = 0x7fc00001u;
  memcpy((float *)ks_statedict_tensor(b, "model/w")->data + 2, &other_nan, 4);
  char *pa = saved("na.ks", a, NULL), *pb = saved("nb.ks", b, NULL), *out;
  assert_int_equal(cli(&out, "diff '%s' '%s'", pa, pb), 0);
  free(out);
  ks_statedict_free(a);
  ks_statedict_free(b);
  free(pa);
  free(pb);
}

static void every_subcommand_has_help_and_rejects_bad_usage(void **state) {
  (void)state;
  const char *cmds[] = {"inspect", "verify", "diff"};
  for (int i = 0; i < 3; i++) {
    char *out;
    assert_int_equal(cli(&out, "%s --help", cmds[i]), 0);
    assert_contains(out, "usage: keepsake");
    free(out);
    assert_int_equal(cli(&out, "%s", cmds[i]), 2);
    free(out);
    assert_int_equal(cli(&out, "%s --bogus x", cmds[i]), 2);
    free(out);
  }
  char *out;
  assert_int_equal(cli(&out, "inspect /nonexistent"), 1);
  assert_contains(out, "cannot open");
  free(out);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(inspect_shows_a_foreign_safetensors_file),
      cmocka_unit_test(verify_accepts_a_foreign_safetensors_file),
      cmocka_unit_test(inspect_shows_scalars_and_metadata),
      cmocka_unit_test(verify_names_key_and_offset_of_corruption),
      cmocka_unit_test(diff_exit_status_follows_content),
      cmocka_unit_test(diff_summarises_checkpoints_component_by_component),
      cmocka_unit_test(diff_treats_nan_in_the_same_place_as_equal),
      cmocka_unit_test(every_subcommand_has_help_and_rejects_bad_usage),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
