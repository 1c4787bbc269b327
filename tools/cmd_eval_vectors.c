/*
 * keepsake eval-vectors FILE.json: replays metric reference vectors (the
 * format of tests/vectors/metrics-tm1.4.3.json, produced by torchmetrics) through
 * keepsake's metrics and checks compute() after every batch, the final state
 * dict, a state-dict round trip, and that merging a metric fed the first half
 * of the batches into one fed the second half matches feeding them all.
 */
#include <jansson.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_common.h"
#include "commands.h"
#include "keepsake/keepsake.h"
#include "keepsake/metric.h"

#define REL_TOL 1e-5
#define ABS_TOL 1e-6

/*
 * Documented differences from torchmetrics that a replay accepts, each one
 * reported with the case (see tests/vectors/README.md):
 *  - F64_AS_F32: torchmetrics keeps float64 where the input was float64 (exact
 *    curve list states, R2Score's sums and result); keepsake's states and
 *    results are float32. Values are compared with the usual tolerance.
 *  - MIGRATED: the file's state has an older torchmetrics layout (MAE's () sum,
 *    R2Score's (1,) sums before 1.5; the aggregation `value` names before 1.1,
 *    loaded as schema version 1); it must load into a fresh metric as a
 *    migration and then equal keepsake's state.
 *  - TOPK_RULE: files from torchmetrics < 1.7 count fp/tn of top_k > 1 with
 *    each of the k predictions; keepsake follows 1.7+ (one prediction per
 *    sample), so those two states are not compared (tp, fn and compute() are).
 */
enum { NOTE_F64_AS_F32 = 1, NOTE_MIGRATED = 2, NOTE_TOPK_RULE = 4 };

typedef struct ctx {
  char why[512];
  int tm_major, tm_minor; /* torchmetrics version that made the file */
  unsigned notes;         /* NOTE_* met by the current case */
} ctx;

static int fail(ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(ctx *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->why, sizeof c->why, fmt, ap);
  va_end(ap);
  return -1;
}

/* ---- JSON tensors ---- */

static int json_num(json_t *v, double *out) {
  if (json_is_number(v)) {
    *out = json_number_value(v);
    return 0;
  }
  if (json_is_boolean(v)) {
    *out = json_is_true(v);
    return 0;
  }
  const char *s = json_string_value(v);
  if (!s) return -1;
  if (!strcmp(s, "nan")) *out = NAN;
  else if (!strcmp(s, "inf")) *out = INFINITY;
  else if (!strcmp(s, "-inf")) *out = -INFINITY;
  else return -1;
  return 0;
}

static int json_shape(json_t *js, ks_tensor *t) {
  if (!json_is_array(js) || json_array_size(js) > KS_MAX_RANK) return -1;
  t->rank = (int)json_array_size(js);
  for (int i = 0; i < t->rank; i++) {
    json_t *d = json_array_get(js, (size_t)i);
    if (!json_is_integer(d) || json_integer_value(d) < 0) return -1;
    t->shape[i] = (int64_t)json_integer_value(d);
  }
  return 0;
}

static void fill_element(ks_tensor *t, size_t i, json_t *v, double d) {
  if (json_is_integer(v) && !ks_dtype_is_float(t->dtype)) ks_dtype_set_i64(t->dtype, t->data, i, json_integer_value(v));
  else ks_dtype_set_f64(t->dtype, t->data, i, d);
}

/* Builds a tensor (malloc'd data) from {dtype, shape, data}. */
static int json_tensor(ctx *c, json_t *j, ks_tensor *t) {
  memset(t, 0, sizeof *t);
  const char *dt = json_string_value(json_object_get(j, "dtype"));
  json_t *data = json_object_get(j, "data");
  if (!dt || ks_dtype_parse(dt, strlen(dt), &t->dtype) || json_shape(json_object_get(j, "shape"), t) ||
      !json_is_array(data))
    return fail(c, "malformed tensor in the vectors file");
  size_t nbytes;
  uint64_t numel;
  if (ks_shape_size(t->dtype, t->rank, t->shape, &numel, &nbytes) || numel != json_array_size(data))
    return fail(c, "tensor data length does not match its shape");
  t->data = calloc(1, nbytes ? nbytes : 1);
  t->nbytes = nbytes;
  if (!t->data) return fail(c, "out of memory");
  for (size_t i = 0; i < numel; i++) {
    double d;
    json_t *v = json_array_get(data, i);
    if (json_num(v, &d)) return fail(c, "bad number in tensor data");
    fill_element(t, i, v, d);
  }
  return 0;
}

/* A list of tensors (a torchmetrics list state) concatenated along dim 0. */
static int json_cat(ctx *c, json_t *list, ks_tensor *t) {
  memset(t, 0, sizeof *t);
  size_t n = json_array_size(list);
  ks_tensor *parts = calloc(n ? n : 1, sizeof *parts);
  int rc = parts ? 0 : fail(c, "out of memory");
  size_t total = 0;
  for (size_t i = 0; !rc && i < n; i++) {
    rc = json_tensor(c, json_array_get(list, i), &parts[i]);
    if (!rc && parts[i].rank == 0) parts[i].rank = 1, parts[i].shape[0] = 1;
    total += parts[i].nbytes;
  }
  if (!rc && n) {
    *t = parts[0];
    t->data = malloc(total ? total : 1);
    t->nbytes = total;
    t->shape[0] = 0;
    for (size_t i = 0, off = 0; t->data && i < n; off += parts[i].nbytes, i++) {
      memcpy((char *)t->data + off, parts[i].data, parts[i].nbytes);
      t->shape[0] += parts[i].shape[0];
    }
    if (!t->data) rc = fail(c, "out of memory");
  }
  for (size_t i = 0; parts && i < n; i++) free(parts[i].data);
  free(parts);
  return rc;
}

/* ---- comparison ---- */

static int close_enough(double a, double b) {
  if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
  if (isinf(a) || isinf(b)) return a == b;
  return fabs(a - b) <= REL_TOL * fmax(fabs(a), fabs(b)) + ABS_TOL;
}

static int compare(ctx *c, const char *what, const ks_tensor *want, const ks_tensor *got) {
  char a[128], b[128];
  if (want->dtype == KS_F64 && got->dtype == KS_F32) c->notes |= NOTE_F64_AS_F32;
  else if (want->dtype != got->dtype)
    return fail(c, "%s: dtype %s, expected %s", what, ks_dtype_name(got->dtype), ks_dtype_name(want->dtype));
  if (!ks_tensor_same_shape(want, got))
    return fail(c, "%s: shape %s, expected %s", what, ks_shape_format(got->rank, got->shape, a, sizeof a),
                ks_shape_format(want->rank, want->shape, b, sizeof b));
  uint64_t n = ks_tensor_numel(want);
  for (size_t i = 0; i < n; i++) {
    if (!ks_dtype_is_float(want->dtype)) {
      int64_t x = ks_dtype_get_i64(got->dtype, got->data, i), y = ks_dtype_get_i64(want->dtype, want->data, i);
      if (x != y) return fail(c, "%s[%zu] = %lld, expected %lld", what, i, (long long)x, (long long)y);
    } else {
      double x = ks_dtype_get_f64(got->dtype, got->data, i), y = ks_dtype_get_f64(want->dtype, want->data, i);
      if (!close_enough(x, y)) return fail(c, "%s[%zu] = %.9g, expected %.9g", what, i, x, y);
    }
  }
  return 0;
}

static int compare_json(ctx *c, const char *what, json_t *want_j, const ks_tensor *got) {
  ks_tensor want;
  int rc = json_is_array(want_j) ? json_cat(c, want_j, &want) : json_tensor(c, want_j, &want);
  if (!rc) rc = compare(c, what, &want, got);
  free(want.data);
  return rc;
}

static int compare_compute(ctx *c, ks_metric *m, json_t *want, const char *what) {
  const ks_tensor *got;
  ks_error e;
  ks_status st = ks_metric_compute(m, &got, &e);
  if (json_is_null(want)) return st ? 0 : fail(c, "%s: compute succeeded, expected an error", what);
  if (st) return fail(c, "%s: compute failed: %s", what, e.message);
  return compare_json(c, what, want, got);
}

/* Files older than torchmetrics 1.7 used the older top_k > 1 rule for fp and tn. */
static int older_topk_state(ctx *c, json_t *cs, const char *key) {
  json_t *k = json_object_get(json_object_get(cs, "args"), "top_k");
  int older = c->tm_major < 1 || (c->tm_major == 1 && c->tm_minor < 7);
  if (!older || !json_is_integer(k) || json_integer_value(k) <= 1 || (strcmp(key, "fp") && strcmp(key, "tn")))
    return 0;
  c->notes |= NOTE_TOPK_RULE;
  return 1;
}

static int compare_dicts(ctx *c, json_t *cs, const ks_statedict *sd, json_t *want, const char *what) {
  if (ks_statedict_count(sd) != json_object_size(want))
    return fail(c, "%s: %zu states, expected %zu", what, ks_statedict_count(sd), json_object_size(want));
  const char *key;
  json_t *v;
  json_object_foreach(want, key, v) {
    const ks_tensor *got = ks_statedict_tensor(sd, key);
    char label[256];
    snprintf(label, sizeof label, "%s state '%s'", what, key);
    if (older_topk_state(c, cs, key)) continue;
    int rc = got ? compare_json(c, label, v, got) : fail(c, "%s: state '%s' is missing", what, key);
    if (rc) return rc;
  }
  return 0;
}

static int make(ctx *c, json_t *cs, ks_metric **m);

/* The file's states as a state dict (list states joined), loaded into a fresh metric. */
static int load_expected(ctx *c, json_t *cs, json_t *want, ks_metric **fresh, int *migrated) {
  ks_statedict *sd = NULL;
  int rc = ks_statedict_create(NULL, &sd, NULL) ? fail(c, "out of memory") : make(c, cs, fresh);
  const char *key;
  json_t *v;
  json_object_foreach(want, key, v) {
    if (rc) break;
    ks_tensor t;
    rc = json_is_array(v) ? json_cat(c, v, &t) : json_tensor(c, v, &t);
    if (!rc && ks_statedict_set_tensor(sd, key, &t, KS_COPY, NULL)) rc = fail(c, "out of memory");
    free(t.data);
  }
  ks_error e;
  int schema = c->tm_major < 1 || (c->tm_major == 1 && c->tm_minor < 1) ? 1 : KS_METRIC_SCHEMA_VERSION; /* names */
  if (!rc && ks_metric_load_state_dict(*fresh, sd, "", schema, 0, migrated, NULL, &e))
    rc = fail(c, "the expected state does not load: %s", e.message);
  ks_statedict_free(sd);
  return rc;
}

/*
 * The metric's states equal the file's; or the file holds an older
 * torchmetrics layout that loads as a migration into states equal to ours.
 */
static int compare_states(ctx *c, json_t *cs, const ks_metric *m, json_t *want, const char *what) {
  ks_statedict *sd = NULL, *mig_sd = NULL;
  ks_metric *fresh = NULL;
  ks_error e;
  if (ks_statedict_create(NULL, &sd, NULL) || ks_statedict_create(NULL, &mig_sd, NULL)) {
    ks_statedict_free(sd);
    return fail(c, "out of memory");
  }
  int rc = ks_metric_to_state_dict(m, sd, "", &e) ? fail(c, "%s: to_state_dict: %s", what, e.message) : 0;
  if (!rc && compare_dicts(c, cs, sd, want, what)) {
    char first[sizeof c->why];
    memcpy(first, c->why, sizeof first);
    int migrated = 0;
    rc = load_expected(c, cs, want, &fresh, &migrated) || !migrated || ks_metric_to_state_dict(fresh, mig_sd, "", &e);
    if (rc) memcpy(c->why, first, sizeof first); /* not an older layout: the direct mismatch stands */
    for (size_t i = 0; !rc && i < ks_statedict_count(sd); i++) {
      ks_entry x;
      char label[256];
      if (ks_statedict_at(sd, i, &x)) continue; /* index in range: cannot fail */
      snprintf(label, sizeof label, "%s state '%s' (after migrating the file's layout)", what, x.name);
      const ks_tensor *y = ks_statedict_tensor(mig_sd, x.name);
      rc = y ? compare(c, label, y, &x.tensor) : fail(c, "%s: '%s' missing after migration", what, x.name);
    }
    if (!rc) c->notes |= NOTE_MIGRATED;
  }
  ks_metric_free(fresh);
  ks_statedict_free(mig_sd);
  ks_statedict_free(sd);
  return rc;
}

/* ---- one case ---- */

typedef struct batches {
  size_t n;
  ks_tensor **in; /* in[b] has len[b] tensors */
  size_t *len;
} batches;

static void batches_free(batches *b) {
  for (size_t i = 0; b->in && i < b->n; i++) {
    for (size_t k = 0; b->in[i] && k < b->len[i]; k++) free(b->in[i][k].data);
    free(b->in[i]);
  }
  free(b->in);
  free(b->len);
}

static int batches_load(ctx *c, json_t *js, batches *b) {
  memset(b, 0, sizeof *b);
  if (!json_is_array(js) || !json_array_size(js)) return fail(c, "case has no batches");
  b->n = json_array_size(js);
  b->in = calloc(b->n, sizeof *b->in);
  b->len = calloc(b->n, sizeof *b->len);
  if (!b->in || !b->len) return fail(c, "out of memory");
  for (size_t i = 0; i < b->n; i++) {
    json_t *args = json_array_get(js, i);
    b->len[i] = json_array_size(args);
    b->in[i] = calloc(b->len[i] ? b->len[i] : 1, sizeof **b->in);
    if (!b->in[i]) return fail(c, "out of memory");
    for (size_t k = 0; k < b->len[i]; k++)
      if (json_tensor(c, json_array_get(args, k), &b->in[i][k])) return -1;
  }
  return 0;
}

static int feed(ctx *c, ks_metric *m, const batches *b, size_t from, size_t to, json_t *computes) {
  for (size_t i = from; i < to; i++) {
    ks_error e;
    if (ks_metric_update(m, b->in[i], b->len[i], &e)) return fail(c, "batch %zu: update failed: %s", i, e.message);
    char what[64];
    snprintf(what, sizeof what, "compute after batch %zu", i);
    if (computes && compare_compute(c, m, json_array_get(computes, i), what)) return -1;
  }
  return 0;
}

static int make(ctx *c, json_t *cs, ks_metric **m) {
  const char *cls = json_string_value(json_object_get(cs, "metric"));
  json_t *args = json_object_get(cs, "args");
  char *aj = args ? json_dumps(args, JSON_COMPACT) : NULL;
  ks_error e;
  ks_status st = cls ? ks_metric_create(cls, aj, NULL, m, &e) : KS_E_INVALID;
  free(aj);
  if (!cls) return fail(c, "case has no metric class");
  return st ? fail(c, "cannot build %s: %s", cls, e.message) : 0;
}

static int check_round_trip(ctx *c, json_t *cs, const ks_metric *full, json_t *last) {
  ks_metric *m = NULL;
  ks_statedict *sd = NULL;
  ks_error e;
  int rc = make(c, cs, &m);
  if (!rc && ks_statedict_create(NULL, &sd, NULL)) rc = fail(c, "out of memory");
  if (!rc && ks_metric_to_state_dict(full, sd, "metric/", &e)) rc = fail(c, "to_state_dict: %s", e.message);
  if (!rc && ks_metric_load_state_dict(m, sd, "metric/", KS_METRIC_SCHEMA_VERSION, 0, NULL, NULL, &e))
    rc = fail(c, "load_state_dict: %s", e.message);
  if (!rc) rc = compare_compute(c, m, last, "compute after a state-dict round trip");
  ks_statedict_free(sd);
  ks_metric_free(m);
  return rc;
}

static int check_merge(ctx *c, json_t *cs, const batches *b, json_t *last) {
  ks_metric *first = NULL, *second = NULL;
  size_t h = b->n / 2;
  ks_error e;
  int rc = make(c, cs, &first);
  if (!rc) rc = make(c, cs, &second);
  if (!rc) rc = feed(c, first, b, 0, h, NULL);
  if (!rc) rc = feed(c, second, b, h, b->n, NULL);
  if (!rc && ks_metric_merge(second, first, &e)) rc = fail(c, "merge failed: %s", e.message);
  if (!rc) rc = compare_states(c, cs, second, json_object_get(cs, "state_dict"), "merged");
  if (!rc) rc = compare_compute(c, second, last, "compute after merge");
  if (!rc && ks_metric_update_count(second) != (int64_t)b->n) rc = fail(c, "merged update count is wrong");
  ks_metric_free(first);
  ks_metric_free(second);
  return rc;
}

static int run_case(ctx *c, json_t *cs) {
  batches b;
  ks_metric *m = NULL;
  json_t *computes = json_object_get(cs, "compute_after_each_batch");
  int rc = batches_load(c, json_object_get(cs, "batches"), &b);
  if (!rc && json_array_size(computes) != b.n) rc = fail(c, "compute_after_each_batch does not match batches");
  if (!rc) rc = make(c, cs, &m);
  if (!rc) rc = feed(c, m, &b, 0, b.n, computes);
  if (!rc) rc = compare_states(c, cs, m, json_object_get(cs, "state_dict"), "final");
  json_t *last = json_array_get(computes, b.n - 1);
  if (!rc) rc = check_round_trip(c, cs, m, last);
  if (!rc && b.n >= 2) rc = check_merge(c, cs, &b, last);
  ks_metric_free(m);
  batches_free(&b);
  return rc;
}

static int usage(FILE *out) {
  fprintf(out,
          "usage: keepsake eval-vectors [--case NAME] FILE.json\n\n"
          "Replays metric reference vectors (torchmetrics-generated) and checks, per case:\n"
          "  compute() after every batch, the final state dict (names, dtypes, shapes, values),\n"
          "  a state-dict round trip, and merge(first half -> second half) == all batches.\n"
          "Tolerance: integers exact; floats %g relative + %g absolute; NaN equals NaN.\n"
          "Documented differences, accepted and named on the case's line:\n"
          "  float64-kept-as-float32  torchmetrics keeps float64 (exact-curve list states, R2Score\n"
          "                           after float64 input); keepsake's states are float32\n"
          "  state-migrated           the file's state is an older torchmetrics layout that loads\n"
          "                           as a migration into keepsake's state\n"
          "  older-topk-rule          torchmetrics < 1.7 counted top_k > 1 fp/tn per prediction;\n"
          "                           those two states are not compared\n"
          "Prints one line per case, then 'N passed (D with documented differences), M failed'.\n"
          "Exit status 1 on any failure.\n",
          REL_TOL, ABS_TOL);
  return out == stdout ? 0 : 2;
}

/* The torchmetrics version that made the file: "torchmetrics", else "generator": "torchmetrics X.Y...". */
static void file_version(json_t *root, ctx *c) {
  const char *v = json_string_value(json_object_get(root, "torchmetrics"));
  const char *g = json_string_value(json_object_get(root, "generator"));
  const char *at = g ? strstr(g, "torchmetrics ") : NULL;
  if (!v && at) v = at + strlen("torchmetrics ");
  c->tm_major = 99;
  c->tm_minor = 0;
  if (v && sscanf(v, "%d.%d", &c->tm_major, &c->tm_minor) != 2) c->tm_major = 99;
}

static void print_notes(const char *name, unsigned notes) {
  printf("ok   %s", ks_cli_esc(name));
  if (notes) {
    printf(" (documented:%s%s%s)", notes & NOTE_F64_AS_F32 ? " float64-kept-as-float32" : "",
           notes & NOTE_MIGRATED ? " state-migrated" : "", notes & NOTE_TOPK_RULE ? " older-topk-rule" : "");
  }
  printf("\n");
}

int ks_cmd_eval_vectors(int argc, char **argv) {
  const char *path = NULL, *only = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return usage(stdout);
    if (!strcmp(argv[i], "--case") && i + 1 < argc) only = argv[++i];
    else if (argv[i][0] == '-' || path) return usage(stderr);
    else path = argv[i];
  }
  if (!path) return usage(stderr);
  json_error_t je;
  void *text = NULL;
  size_t len = 0;
  ks_error err;
  if (ks_cli_read_file(path, &text, &len, &err)) { /* read(2) of a regular file: a FIFO would block forever */
    ks_cli_print_error(stderr, "eval-vectors", &err);
    return 1;
  }
  json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
  free(text);
  json_t *cases = root ? json_object_get(root, "cases") : NULL;
  if (!json_is_array(cases)) {
    fprintf(stderr, "keepsake eval-vectors: %s: %s\n", ks_cli_esc(path),
            ks_cli_esc(root ? "no 'cases' array" : je.text));
    json_decref(root);
    return 1;
  }
  int passed = 0, failed = 0, noted = 0;
  for (size_t i = 0; i < json_array_size(cases); i++) {
    json_t *cs = json_array_get(cases, i);
    const char *name = json_string_value(json_object_get(cs, "name"));
    if (!name) name = "?";
    if (only && strcmp(only, name)) continue;
    ctx c;
    memset(&c, 0, sizeof c);
    file_version(root, &c);
    if (run_case(&c, cs)) {
      printf("FAIL %s: %s\n", ks_cli_esc(name), ks_cli_esc(c.why));
      failed++;
    } else {
      print_notes(name, c.notes);
      passed++;
      noted += c.notes != 0;
    }
  }
  printf("%d passed (%d with documented differences), %d failed\n", passed, noted, failed);
  json_decref(root);
  return failed || passed == 0 ? 1 : 0;
}
