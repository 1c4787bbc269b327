/*
 * Described metrics (ks_metric_describe): a binding's metric of any class, filled by the one
 * load engine. Widening and refused narrowing, a catalogue twin's legacy names and reshape
 * rules, list states of any dtype, inner metrics all or nothing, components under every root,
 * merges by declared reductions, the records a binding's description gives, and every
 * allocation failure leaking nothing.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "keepsake/keepsake.h"
#include "metrics/internal.h"
#include "state/state_internal.h"
#include "testutil.h"

static const int64_t one[1] = {1};

static void put_f(ks_statedict *sd, const char *name, ks_dtype dt, int rank, const int64_t *shape, double v) {
  void *p;
  assert_int_equal(ks_statedict_new_tensor(sd, name, dt, rank, shape, &p, NULL), KS_OK);
  size_t n = 1;
  for (int i = 0; i < rank; i++) n *= (size_t)shape[i];
  for (size_t i = 0; i < n; i++) ks_dtype_set_f64(dt, p, i, v + (double)i);
}

/* A SumMetric-like described metric: one F32 () state "sum_value". */
static ks_metric *described_sum(const char *attrs) {
  ks_metric *m = NULL;
  assert_int_equal(ks_metric_describe("SumMetric", attrs, NULL, &m, NULL), KS_OK);
  assert_int_equal(ks_metric_describe_state(m, "sum_value", KS_REDUCE_SUM, KS_F32, 0, NULL, 0, NULL), KS_OK);
  return m;
}

static double state_value(const ks_metric *m, size_t i) {
  ks_tensor t;
  assert_int_equal(ks_metric_state_info(m, i, NULL, NULL, &t), KS_OK);
  return ks_dtype_get_f64(t.dtype, t.data, 0);
}

static void widening_and_refused_narrowing(void **unused) {
  (void)unused;
  ks_statedict *sd;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  put_f(sd, "p/state_dict/sum_value", KS_F16, 0, NULL, 3.0);
  put_f(sd, "q/state_dict/sum_value", KS_F64, 0, NULL, 4.0);
  ks_metric *m = described_sum(NULL);
  int mig = 0, conv = 0;
  assert_int_equal(ks_metric_load_state_dict(m, sd, "p/state_dict/", 2, 0, &mig, &conv, NULL), KS_OK);
  assert_true(conv && !mig);
  assert_true(state_value(m, 0) == 3.0);
  ks_error err;
  assert_int_equal(ks_metric_load_state_dict(m, sd, "q/state_dict/", 2, 0, &mig, &conv, &err), KS_E_DTYPE);
  assert_true(state_value(m, 0) == 3.0); /* unchanged */
  assert_int_equal(ks_metric_load_state_dict(m, sd, "q/state_dict/", 2, 1, &mig, &conv, NULL), KS_OK);
  assert_true(state_value(m, 0) == 4.0);
  assert_int_equal(ks_metric_load_state_dict(m, sd, "q/state_dict/", 99, 0, NULL, NULL, &err), KS_E_VERSION);
  assert_int_equal(ks_metric_update(m, NULL, 0, &err), KS_E_UNSUPPORTED);
  assert_string_equal(ks_metric_class(m), "SumMetric");
  assert_true(ks__metric_is_described(m));
  ks_metric_free(m);
  ks_statedict_free(sd);
}

static void twin_gives_legacy_names_args_and_reshapes(void **unused) {
  (void)unused;
  ks_statedict *sd;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  put_f(sd, "p/state_dict/value", KS_F32, 0, NULL, 7.0); /* schema 1: `value` */
  ks_metric *m = described_sum("{\"nan_strategy\":\"warn\"}");
  assert_non_null(ks_metric_args_json(m));
  int mig = 0;
  assert_int_equal(ks_metric_load_state_dict(m, sd, "p/state_dict/", 1, 0, &mig, NULL, NULL), KS_OK);
  assert_true(mig && state_value(m, 0) == 7.0);
  ks_metric_free(m);
  /* Not in the catalogue: no legacy names, no args, compared by class only. */
  assert_int_equal(ks_metric_describe("MyMetric", "{}", NULL, &m, NULL), KS_OK);
  assert_null(ks_metric_args_json(m));
  assert_int_equal(ks_metric_describe_state(m, "sum_value", KS_REDUCE_SUM, KS_F32, 0, NULL, 0, NULL), KS_OK);
  assert_int_equal(ks_metric_load_state_dict(m, sd, "p/state_dict/", 1, 0, NULL, NULL, NULL), KS_E_NOTFOUND);
  /* MeanSquaredError's sum: () stored, (1,) declared, reshaped by the twin's rule only. */
  put_f(sd, "m/state_dict/sum_squared_error", KS_F32, 0, NULL, 2.0);
  put_f(sd, "m/state_dict/total", KS_I64, 0, NULL, 5.0);
  ks_metric *mse = NULL;
  assert_int_equal(ks_metric_describe("MeanSquaredError", "{\"squared\":true,\"num_outputs\":1}", NULL, &mse, NULL),
                   KS_OK);
  assert_int_equal(ks_metric_describe_state(mse, "sum_squared_error", KS_REDUCE_SUM, KS_F32, 1, one, 0, NULL),
                   KS_OK);
  assert_int_equal(ks_metric_describe_state(mse, "total", KS_REDUCE_SUM, KS_I64, 0, NULL, 0, NULL), KS_OK);
  assert_int_equal(ks_metric_load_state_dict(mse, sd, "m/state_dict/", 2, 0, &mig, NULL, NULL), KS_OK);
  assert_true(mig);
  assert_int_equal(ks_metric_describe_state(m, "x", KS_REDUCE_SUM, KS_F32, 1, one, 0, NULL), KS_OK);
  assert_int_equal(ks_metric_load_state_dict(m, sd, "m/", 2, 0, NULL, NULL, NULL), KS_E_NOTFOUND);
  ks_metric_free(m);
  ks_metric_free(mse);
  ks_statedict_free(sd);
}

static void lists_keep_their_dtype_and_merge(void **unused) {
  (void)unused;
  ks_statedict *sd;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  const int64_t rows[2] = {3, 2};
  put_f(sd, "c/state_dict/value", KS_I32, 2, rows, 1.0);
  ks_metric *a = NULL, *b = NULL;
  assert_int_equal(ks_metric_describe("MyCat", NULL, NULL, &a, NULL), KS_OK);
  assert_int_equal(ks_metric_describe_state(a, "value", KS_REDUCE_CAT, KS_F32, 0, NULL, KS_STATE_ANY_DTYPE, NULL),
                   KS_OK);
  assert_int_equal(ks_metric_load_state_dict(a, sd, "c/state_dict/", 2, 0, NULL, NULL, NULL), KS_OK);
  ks_tensor t;
  assert_int_equal(ks_metric_state_info(a, 0, NULL, NULL, &t), KS_OK);
  assert_int_equal(t.dtype, KS_I32);
  assert_int_equal(t.shape[0], 3);
  assert_int_equal(ks_metric_clone(a, NULL, &b, NULL), KS_OK);
  assert_int_equal(ks_metric_merge(a, b, NULL), KS_OK);
  assert_int_equal(ks_metric_state_info(a, 0, NULL, NULL, &t), KS_OK);
  assert_int_equal(t.shape[0], 6);
  ks_metric *other = described_sum(NULL);
  ks_error err;
  assert_int_equal(ks_metric_merge(a, other, &err), KS_E_MISMATCH);
  ks_metric_free(other);
  ks_metric_free(a);
  ks_metric_free(b);
  ks_statedict_free(sd);
}

/* The factory of the state tests: a wrapper "W" with an inner sum "base". */
static ks_status wrapper_factory(void *ctx, const char *label, const ks_allocator *alloc,
                                 ks_metric_collection **out, ks_error *err) {
  (void)ctx;
  ks_metric_collection *c = NULL;
  ks_metric *w = NULL, *in = NULL;
  ks_status s = ks_metric_collection_create(alloc, &c, err);
  if (!s && !label) s = ks_metric_describe("MinMaxMetric", NULL, alloc, &w, err);
  if (!s && w) s = ks_metric_describe_state(w, "min_val", KS_REDUCE_MIN, KS_F32, 0, NULL, 0, err);
  if (!s && w) s = ks_metric_describe_attr(w, "max_val", KS_F32, 0, NULL, 0, 0, 0, err);
  if (!s && w) s = ks_metric_describe("SumMetric", NULL, alloc, &in, err);
  if (!s && in) s = ks_metric_describe_state(in, "sum_value", KS_REDUCE_SUM, KS_F32, 0, NULL, 0, err);
  if (!s && in) s = ks_metric_describe_attr(in, "_num_vals_seen", KS_I64, 0, NULL, KS_ATTR_INT, 0, INT64_MAX, err);
  if (!s && in) s = ks_metric_add_inner(w, "base", in, err);
  if (!s) in = NULL;
  if (!s && w) s = ks_metric_collection_add(c, "W", w, err);
  if (!s) w = NULL;
  ks_metric_free(in);
  ks_metric_free(w);
  if (s) {
    ks_metric_collection_free(c);
    return s;
  }
  *out = c;
  return KS_OK;
}

static int called;
static ks_status comp_save(void *ctx, ks_statedict *dst, const char *prefix, ks_error *err) {
  (void)ctx;
  (void)dst;
  (void)prefix;
  (void)err;
  return KS_OK;
}
static ks_status comp_load(void *ctx, const ks_statedict *src, const char *prefix, ks_error *err) {
  (void)ctx;
  (void)src;
  called++;
  if (!strcmp(prefix, "state/optimizers/bad/")) {
    err->code = KS_E_MISMATCH;
    snprintf(err->message, sizeof err->message, "does not fit");
    return KS_E_MISMATCH;
  }
  return KS_OK;
}

static const char *kind_of(const ks_load_report *r, const char *path) {
  const ks_load_item *it = ks_load_report_find(r, path);
  return it ? ks_load_kind_name(it->kind) : "none";
}

static ks_statedict *wrapper_file(int with_inner) {
  ks_statedict *sd;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  put_f(sd, "state/train_metrics/W/state_dict/min_val", KS_F32, 0, NULL, -1.0);
  put_f(sd, "state/train_metrics/W/attrs/max_val", KS_F32, 0, NULL, 0.81);
  if (with_inner) put_f(sd, "state/train_metrics/W/inner/base/state_dict/sum_value", KS_F32, 0, NULL, 9.0);
  assert_int_equal(ks_statedict_set_int(sd, "state/train_metrics/W/inner/base/attrs/_num_vals_seen", 5, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_int(sd, "state/train_metrics/W/inner/base/update_count", 4, NULL), KS_OK);
  put_f(sd, "state/optimizers/good/x", KS_F32, 0, NULL, 1.0);
  put_f(sd, "state/optimizers/bad/x", KS_F32, 0, NULL, 1.0);
  put_f(sd, "rng/0/torch", KS_U8, 1, one, 1.0);
  return sd;
}

static ks_status load_wrapper(const ks_statedict *sd, int strict, const ks_allocator *alloc, ks_load_report *rep,
                              double *inner_sum, int64_t *inner_count) {
  ks_state *st = NULL;
  ks_stateful cb = {NULL, comp_save, comp_load};
  ks_status s = ks_state_create("", 0, alloc, &st, NULL);
  if (!s) s = ks_state_add_component(st, KS_ROOT_OPTIMIZERS, "good", &cb, NULL);
  if (!s) s = ks_state_add_component(st, KS_ROOT_OPTIMIZERS, "bad", &cb, NULL);
  if (!s) s = ks_state_add_component(st, KS_ROOT_RNG, "0", &cb, NULL);
  if (!s) s = ks_state_add_component(st, KS_ROOT_SCHEDULERS, "none", &cb, NULL);
  if (!s) s = ks_state_build_metrics(st, wrapper_factory, NULL, NULL, 0, NULL);
  ks_load_opts o = {.non_strict_model = !strict};
  if (!s) s = ks_state_load_state_dict(st, sd, NULL, &o, rep, NULL);
  if (!s && inner_sum) {
    ks_metric *in = ks_metric_inner_at(ks_metric_collection_get(ks_state_train_metrics(st), "W"), 0, NULL);
    *inner_sum = state_value(in, 0);
    *inner_count = ks_metric_update_count(in);
  }
  ks_state_free(st);
  return s;
}

static void inner_metrics_and_components(void **unused) {
  (void)unused;
  ks_statedict *sd = wrapper_file(1);
  ks_load_report *rep;
  assert_int_equal(ks_load_report_create(NULL, &rep, NULL), KS_OK);
  double sum = 0;
  int64_t count = 0;
  called = 0;
  assert_int_equal(load_wrapper(sd, 0, NULL, rep, &sum, &count), KS_OK);
  assert_string_equal(kind_of(rep, "state/train_metrics/W"), "loaded");
  assert_true(sum == 9.0 && count == 4);
  assert_string_equal(kind_of(rep, "state/optimizers/good"), "loaded");
  assert_string_equal(kind_of(rep, "state/optimizers/bad"), "mismatched");
  assert_string_equal(kind_of(rep, "rng/0"), "loaded");
  assert_string_equal(kind_of(rep, "state/schedulers/none"), "missing");
  assert_int_equal(called, 3);
  ks__load_report_clear(rep);
  assert_int_equal(load_wrapper(sd, 1, NULL, rep, NULL, NULL), KS_E_MISMATCH); /* strict: the refusal is an error */
  ks_statedict_free(sd);
  /* Without the inner metric's states the wrapper is refused whole, and reset. */
  sd = wrapper_file(0);
  ks__load_report_clear(rep);
  assert_int_equal(load_wrapper(sd, 0, NULL, rep, &sum, &count), KS_OK);
  assert_string_equal(kind_of(rep, "state/train_metrics/W"), "mismatched");
  assert_true(sum == 0.0 && count == 0);
  ks_statedict_free(sd);
  ks_load_report_free(rep);
}

/* What the engine staged for the wrapper and its inner metric after a load of sd (non-strict). */
typedef struct staged {
  const char *kind;
  const char *reason;
  int has_max, has_seen;
  float max_val;
  int64_t seen;
} staged;

static staged load_attrs_of(const ks_statedict *sd, ks_load_report *rep) {
  staged out = {0};
  ks_state *st = NULL;
  assert_int_equal(ks_state_create("", 0, NULL, &st, NULL), KS_OK);
  assert_int_equal(ks_state_build_metrics(st, wrapper_factory, NULL, NULL, 0, NULL), KS_OK);
  ks_load_opts o = {.non_strict_model = 1};
  ks__load_report_clear(rep);
  assert_int_equal(ks_state_load_state_dict(st, sd, NULL, &o, rep, NULL), KS_OK);
  ks_metric *w = ks_metric_collection_get(ks_state_train_metrics(st), "W");
  const char *name;
  unsigned flags;
  ks_tensor v;
  assert_int_equal(ks_metric_attr_at(w, 0, &name, &flags, &v), KS_OK);
  assert_string_equal(name, "max_val");
  assert_int_equal(flags, 0);
  if ((out.has_max = v.data != NULL)) out.max_val = *(const float *)v.data;
  assert_int_equal(ks_metric_attr_at(ks_metric_inner_at(w, 0, NULL), 0, &name, &flags, &v), KS_OK);
  assert_true(flags == KS_ATTR_INT && v.dtype == KS_I64 && v.rank == 0);
  if ((out.has_seen = v.data != NULL)) out.seen = *(const int64_t *)v.data;
  assert_int_equal(ks_metric_attr_at(w, 1, NULL, NULL, NULL), KS_E_NOTFOUND);
  out.kind = kind_of(rep, "state/train_metrics/W");
  const ks_load_item *it = ks_load_report_find(rep, "state/train_metrics/W");
  static char why[512];
  snprintf(why, sizeof why, "%s", it && it->reason ? it->reason : "");
  out.reason = why;
  ks_state_free(st);
  return out;
}

static void kept_attributes_all_or_nothing(void **unused) {
  (void)unused;
  ks_load_report *rep;
  assert_int_equal(ks_load_report_create(NULL, &rep, NULL), KS_OK);
  ks_statedict *sd = wrapper_file(1);
  staged g = load_attrs_of(sd, rep);
  assert_string_equal(g.kind, "loaded");
  assert_true(g.has_max && g.max_val == 0.81f && g.has_seen && g.seen == 5);
  const char *W = "state/train_metrics/W/attrs/max_val", *N = "state/train_metrics/W/inner/base/attrs/_num_vals_seen";
  static const int64_t two[1] = {1};
  struct {
    const char *key;
    int what; /* 0 remove, 1 F64, 2 shape [1], 3 int value, 4 string, 5 float */
    int64_t v;
    const char *why;
  } cases[] = {
      {W, 0, 0, "attribute 'max_val' is not in the checkpoint"},
      {W, 1, 0, "attribute 'max_val': F64 in the checkpoint, F32 in the program"},
      {W, 2, 0, "attribute 'max_val': another shape"},
      {W, 3, 1, "attribute 'max_val': an integer in the checkpoint, a F32 tensor"},
      {N, 0, 0, "attribute '_num_vals_seen' is not in the checkpoint"},
      {N, 3, -7, "attribute '_num_vals_seen' is -7 in the checkpoint, outside [0, 9223372036854775807]"},
      {N, 4, 0, "attribute '_num_vals_seen': a string in the checkpoint, an integer in the program"},
      {N, 5, 0, "attribute '_num_vals_seen': a float in the checkpoint, an integer in the program"},
      {N, 1, 0, "attribute '_num_vals_seen': a tensor in the checkpoint, an integer in the program"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    ks_statedict_free(sd);
    sd = wrapper_file(1);
    assert_int_equal(ks_statedict_remove(sd, cases[i].key), KS_OK);
    if (cases[i].what == 1) put_f(sd, cases[i].key, KS_F64, 0, NULL, 0.5);
    if (cases[i].what == 2) put_f(sd, cases[i].key, KS_F32, 1, two, 0.5);
    if (cases[i].what == 3) assert_int_equal(ks_statedict_set_int(sd, cases[i].key, cases[i].v, NULL), KS_OK);
    if (cases[i].what == 4) assert_int_equal(ks_statedict_set_string(sd, cases[i].key, "1e30", NULL), KS_OK);
    if (cases[i].what == 5) assert_int_equal(ks_statedict_set_float(sd, cases[i].key, 3.0, NULL), KS_OK);
    staged b = load_attrs_of(sd, rep);
    if (strcmp(b.kind, "mismatched") || !strstr(b.reason, cases[i].why))
      fail_msg("case %zu: %s: %s", i, b.kind, b.reason);
    assert_false(b.has_max || b.has_seen); /* nothing staged: the binding installs nothing */
  }
  ks_statedict_free(sd);
  ks_load_report_free(rep);
}

static void attribute_declarations(void **unused) {
  (void)unused;
  ks_metric *m = described_sum(NULL), *cat = NULL, *c = NULL;
  ks_error e;
  const int64_t neg[1] = {-1};
  assert_int_equal(ks_metric_describe_attr(m, "a", KS_F32, 1, one, 0, 0, 0, &e), KS_OK);
  assert_int_equal(ks_metric_describe_attr(m, "a", KS_F32, 0, NULL, 0, 0, 0, &e), KS_E_INVALID); /* twice */
  assert_int_equal(ks_metric_describe_attr(m, "b", KS_F32, 1, neg, 0, 0, 0, &e), KS_E_INVALID);
  assert_int_equal(ks_metric_describe_attr(m, "b", KS_F32, 1, NULL, 0, 0, 0, &e), KS_E_INVALID);
  assert_int_equal(ks_metric_describe_attr(m, "b", KS_F32, 0, NULL, 4u, 0, 0, &e), KS_E_INVALID); /* flags */
  assert_int_equal(ks_metric_describe_attr(m, "b", KS_F32, 0, NULL, KS_ATTR_INT, 0, 1, &e), KS_E_INVALID);
  assert_int_equal(ks_metric_describe_attr(m, "b", KS_I64, 0, NULL, KS_ATTR_INT, 2, 1, &e), KS_E_INVALID);
  assert_int_equal(ks_metric_describe_attr(m, "", KS_I64, 0, NULL, KS_ATTR_INT, 0, 1, &e), KS_E_INVALID);
  assert_int_equal(ks_metric_describe_attr(m, "b", KS_I64, 0, NULL, KS_ATTR_INT, -3, 3, &e), KS_OK);
  assert_int_equal(ks_metric_create("SumMetric", NULL, NULL, &cat, NULL), KS_OK);
  assert_int_equal(ks_metric_describe_attr(cat, "b", KS_F32, 0, NULL, 0, 0, 0, &e), KS_E_INVALID);
  ks_metric_free(cat);
  /* Loaded directly: staged; a clone has the declarations only; a refused load or a reset drops the values. */
  ks_statedict *sd;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  put_f(sd, "p/a", KS_F32, 1, one, 2.5);
  assert_int_equal(ks_statedict_set_int(sd, "p/b", -3, NULL), KS_OK);
  assert_int_equal(ks_metric_load_attrs(m, sd, "p/", &e), KS_OK);
  ks_tensor v;
  assert_int_equal(ks_metric_attr_at(m, 0, NULL, NULL, &v), KS_OK);
  assert_true(v.data && *(const float *)v.data == 2.5f && v.rank == 1 && v.shape[0] == 1);
  assert_int_equal(ks_metric_clone(m, NULL, &c, NULL), KS_OK);
  const char *name;
  assert_int_equal(ks_metric_attr_at(c, 1, &name, NULL, &v), KS_OK);
  assert_string_equal(name, "b");
  assert_null(v.data);
  ks_metric_free(c);
  assert_int_equal(ks_statedict_set_int(sd, "p/b", 4, NULL), KS_OK); /* out of range: nothing staged */
  assert_int_equal(ks_metric_load_attrs(m, sd, "p/", &e), KS_E_MISMATCH);
  assert_int_equal(ks_metric_attr_at(m, 0, NULL, NULL, &v), KS_OK);
  assert_null(v.data);
  assert_int_equal(ks_statedict_set_int(sd, "p/b", 3, NULL), KS_OK);
  assert_int_equal(ks_metric_load_attrs(m, sd, "p/", &e), KS_OK);
  ks_metric_reset(m);
  assert_int_equal(ks_metric_attr_at(m, 1, NULL, NULL, &v), KS_OK);
  assert_null(v.data);
  ks_statedict_free(sd);
  ks_metric_free(m);
}

static void every_allocation_failure_leaks_nothing(void **unused) {
  (void)unused;
  ks_statedict *sd = wrapper_file(1);
  ks_status s = KS_E_NOMEM;
  for (long n = 1; s == KS_E_NOMEM && n < 5000; n++) {
    ks_test_alloc ta;
    ks_test_alloc_init(&ta, n);
    ks_load_report *rep = NULL;
    s = ks_load_report_create(&ta.a, &rep, NULL);
    if (!s) s = load_wrapper(sd, 0, &ta.a, rep, NULL, NULL);
    ks_load_report_free(rep);
    assert_int_equal(ta.live, 0);
  }
  assert_int_equal(s, KS_OK);
  ks_statedict_free(sd);
}

static void records_from_a_description(void **unused) {
  (void)unused;
  ks_statedict *sd;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  const char *desc = "{\"metrics\":[{\"path\":\"state/train_metrics/A\",\"class\":\"torchmetrics.classification."
                     "MulticlassJaccardIndex\",\"update_count\":3,\"attrs\":{\"num_classes\":4,\"normalize\":null,"
                     "\"average\":\"macro\",\"ignore_index\":null}},{\"path\":\"state/train_metrics/C\",\"class\":"
                     "\"x.CatMetric\",\"update_count\":-5,\"lists\":[\"value\"]}]}";
  char *out = NULL;
  assert_int_equal(ks_metric_records_json(desc, sd, NULL, &out, NULL), KS_OK);
  assert_non_null(strstr(out, "\"class\":\"MulticlassJaccardIndex\""));
  assert_non_null(strstr(out, "\"num_classes\":4")); /* the null normalize was dropped to find the args */
  assert_non_null(strstr(out, "\"lists\":[\"value\"]"));
  assert_non_null(strstr(out, "\"update_count\":1")); /* a negative count is recorded as 1 */
  free(out);
  ks_error err;
  assert_int_equal(ks_metric_records_json("{\"metrics\":3}", sd, NULL, &out, &err), KS_E_INVALID);
  assert_null(out);
  /* Rebuilt from records: the catalogue class with its args, per label. */
  ks_meta *meta;
  assert_int_equal(ks_meta_create(NULL, &meta, NULL), KS_OK);
  assert_int_equal(ks_meta_set(meta, KS_META_METRICS, "{\"state/eval_metrics/v/A\":{\"class\":\"SumMetric\","
                               "\"args\":{}},\"state/train_metrics/B\":{\"class\":\"Unknown\",\"args\":{}}}", NULL),
                   KS_OK);
  ks_state *st;
  assert_int_equal(ks_state_create("", 0, NULL, &st, NULL), KS_OK);
  assert_int_equal(ks_state_build_recorded_metrics(st, meta, 1 << 20, &err), KS_E_NOTFOUND);
  assert_int_equal(ks_meta_set(meta, KS_META_METRICS, "{\"state/eval_metrics/v/A\":{\"class\":\"SumMetric\","
                               "\"args\":{}}}", NULL), KS_OK);
  assert_int_equal(ks_state_build_recorded_metrics(st, meta, 1 << 20, NULL), KS_OK);
  assert_int_equal(ks_state_eval_count(st), 1);
  assert_string_equal(ks_state_eval_label(st, 0), "v");
  assert_non_null(ks_metric_collection_get(ks_state_eval_metrics(st, "v"), "A"));
  assert_int_equal(ks_meta_set(meta, KS_META_METRICS, "[1]", NULL), KS_OK);
  assert_int_equal(ks_state_build_recorded_metrics(st, meta, 1 << 20, &err), KS_E_FORMAT);
  ks_state_free(st);
  ks_meta_free(meta);
  ks_statedict_free(sd);
}

static void reductions_are_named_as_torchmetrics_names_them(void **state) {
  (void)state;
  const char *names[] = {"sum", "dim_zero_mean", "max", "dim_zero_min", "dim_zero_cat"};
  for (int i = 0; i < 5; i++) {
    ks_reduce r = (ks_reduce)99;
    assert_int_equal(ks_reduce_parse(names[i], &r), KS_OK);
    assert_int_equal(r, (ks_reduce)i);
  }
  ks_reduce r = KS_REDUCE_MAX;
  assert_int_equal(ks_reduce_parse("my_reduce", &r), KS_E_NOTFOUND);
  assert_int_equal(ks_reduce_parse("dim_zero_", &r), KS_E_NOTFOUND);
  assert_int_equal(ks_reduce_parse(NULL, &r), KS_E_NOTFOUND);
  assert_int_equal(r, KS_REDUCE_MAX); /* untouched */
}

/* ---- MinMaxMetric built by ks_metric_create: a described wrapper whose class computes ---- */

#define MINMAX_MEAN "{\"base_metric\":{\"class\":\"MeanMetric\",\"args\":{}}}"

static void feed(ks_metric *m, float v) {
  ks_tensor t;
  assert_int_equal(ks_tensor_init(&t, KS_F32, 0, NULL, &v), KS_OK);
  assert_int_equal(ks_metric_update(m, &t, 1, NULL), KS_OK);
}

static float attr_f(const ks_metric *m, size_t i, const char *want) {
  const char *name;
  ks_tensor v;
  assert_int_equal(ks_metric_attr_at(m, i, &name, NULL, &v), KS_OK);
  assert_string_equal(name, want);
  assert_non_null(v.data);
  assert_true(v.dtype == KS_F32 && v.rank == 0);
  return *(const float *)v.data;
}

static void check_result(ks_metric *m, float raw, float max, float min) {
  const ks_tensor *r;
  assert_int_equal(ks_metric_compute(m, &r, NULL), KS_OK);
  assert_true(r->dtype == KS_F32 && r->rank == 1 && r->shape[0] == 3);
  const float *f = r->data;
  assert_true(f[0] == raw && f[1] == max && f[2] == min);
}

/* torchmetrics 1.9.0's MinMaxMetric: update forwards (uncounted), compute moves the bounds, nothing
 * is cached, reset resets the base and keeps min_val / max_val. */
static void minmax_metric_has_torchmetrics_semantics(void **s) {
  (void)s;
  ks_metric *m, *c;
  ks_error e;
  assert_int_equal(ks_metric_create("MinMaxMetric", MINMAX_MEAN, NULL, &m, &e), KS_OK);
  assert_string_equal(ks_metric_class(m), "MinMaxMetric");
  assert_string_equal(ks_metric_args_json(m), "{\"base_metric\":{\"args\":{\"nan_strategy\":\"warn\"},\"class\":"
                                              "\"MeanMetric\"}}");
  assert_int_equal(ks_metric_state_count(m), 0);
  assert_int_equal(ks_metric_inner_count(m), 1);
  const char *iname;
  ks_metric *base = ks_metric_inner_at(m, 0, &iname);
  assert_string_equal(iname, "_base_metric");
  assert_string_equal(ks_metric_class(base), "MeanMetric");
  assert_true(attr_f(m, 0, "max_val") == -INFINITY && attr_f(m, 1, "min_val") == INFINITY);
  feed(m, 2.0f);
  check_result(m, 2.0f, 2.0f, 2.0f);
  feed(m, 6.0f);
  check_result(m, 4.0f, 4.0f, 2.0f);
  assert_int_equal(ks_metric_update_count(m), 0); /* a WrapperMetric's own count stays 0 */
  assert_int_equal(ks_metric_update_count(base), 2);
  assert_null(ks_metric_computed(m));            /* _computed: None */
  assert_non_null(ks_metric_computed(base));     /* the base's compute is cached */
  assert_int_equal(ks_metric_clone(m, NULL, &c, NULL), KS_OK); /* a clone keeps the bounds */
  assert_true(attr_f(c, 0, "max_val") == 4.0f && attr_f(c, 1, "min_val") == 2.0f);
  ks_metric_free(c);
  ks_metric_reset(m);
  assert_int_equal(ks_metric_update_count(base), 0);
  assert_true(attr_f(m, 0, "max_val") == 4.0f && attr_f(m, 1, "min_val") == 2.0f);
  feed(m, 10.0f);
  check_result(m, 10.0f, 10.0f, 2.0f);
  ks_metric_free(m);
  /* Arguments: torchmetrics' base_metric only; a base that is unknown or not scalar is refused. */
  static const char *const bad[] = {"{}", "{\"base_metric\":{}}",
                                    "{\"base_metric\":{\"class\":\"MeanMetric\"},\"x\":1}",
                                    "{\"base_metric\":{\"class\":\"MeanMetric\",\"args\":[]}}",
                                    "{\"base_metric\":{\"class\":\"MeanMetric\",\"kwargs\":{}}}", "[", NULL};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    assert_int_equal(ks_metric_create("MinMaxMetric", bad[i], NULL, &m, &e), KS_E_INVALID);
  assert_int_equal(ks_metric_create("MinMaxMetric", "{\"base_metric\":{\"class\":\"NoSuchMetric\"}}", NULL, &m, &e),
                   KS_E_NOTFOUND);
  assert_int_equal(ks_metric_create("MinMaxMetric", "{\"base_metric\":{\"class\":\"MulticlassAccuracy\",\"args\":"
                                    "{\"num_classes\":3,\"average\":\"none\"}}}", NULL, &m, &e), KS_OK);
  float p[3] = {0.1f, 0.8f, 0.1f};
  int64_t y = 1, ps[2] = {1, 3}, ys[1] = {1};
  ks_tensor in[2];
  assert_int_equal(ks_tensor_init(&in[0], KS_F32, 2, ps, p), KS_OK);
  assert_int_equal(ks_tensor_init(&in[1], KS_I64, 1, ys, &y), KS_OK);
  assert_int_equal(ks_metric_update(m, in, 2, NULL), KS_OK);
  const ks_tensor *r;
  assert_int_equal(ks_metric_compute(m, &r, &e), KS_E_STATE); /* torchmetrics: RuntimeError, not a scalar */
  ks_metric_free(m);
}

/* Creating, updating, computing and cloning a wrapper fail cleanly at every allocation. */
static void minmax_metric_survives_every_allocation_failure(void **s) {
  (void)s;
  long failures = 0;
  for (long n = 1;; n++) {
    ks_test_alloc ta;
    ks_test_alloc_init(&ta, n);
    ks_metric *m = NULL, *c = NULL;
    const ks_tensor *r;
    float v = 3.0f;
    ks_tensor t;
    assert_int_equal(ks_tensor_init(&t, KS_F32, 0, NULL, &v), KS_OK);
    ks_status st = ks_metric_create("MinMaxMetric", MINMAX_MEAN, &ta.a, &m, NULL);
    if (!st) st = ks_metric_update(m, &t, 1, NULL);
    if (!st) st = ks_metric_compute(m, &r, NULL);
    if (!st) st = ks_metric_clone(m, NULL, &c, NULL);
    if (!st) assert_true(attr_f(c, 1, "min_val") == 3.0f);
    ks_metric_free(c);
    ks_metric_free(m);
    assert_int_equal(ta.live, 0);
    if (st == KS_OK) break;
    assert_int_equal(st, KS_E_NOMEM);
    failures++;
  }
  assert_true(failures >= 8);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(reductions_are_named_as_torchmetrics_names_them),
      cmocka_unit_test(widening_and_refused_narrowing),
      cmocka_unit_test(twin_gives_legacy_names_args_and_reshapes),
      cmocka_unit_test(lists_keep_their_dtype_and_merge),
      cmocka_unit_test(inner_metrics_and_components),
      cmocka_unit_test(kept_attributes_all_or_nothing),
      cmocka_unit_test(attribute_declarations),
      cmocka_unit_test(every_allocation_failure_leaks_nothing),
      cmocka_unit_test(records_from_a_description),
      cmocka_unit_test(minmax_metric_has_torchmetrics_semantics),
      cmocka_unit_test(minmax_metric_survives_every_allocation_failure),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
