/* Load semantics: metrics filled by name from the program's definitions, and everything else in the report. */
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "keepsake/manager.h"
#include "keepsake/state.h"
#include "keepsake/binding/structure.h"
#include "state/state_internal.h"
#include "testutil.h"

typedef struct mdef {
  const char *name, *cls, *args;
} mdef;

/* The program: a 2x3 weight, a bias, AdamW, timestamp, PRNG and the metrics in `train`/`eval`. */
typedef struct prog {
  float w[6], b[3], gw[6], gb[3];
  int64_t wshape[2];
  ks_optimizer *opt;
  ks_timestamp ts;
  ks_rng rng;
  ks_state *st;
  const mdef *train, *eval;
  size_t n_train, n_eval;
} prog;

static ks_status factory(void *ctx, const char *label, const ks_allocator *a, ks_metric_collection **out,
                         ks_error *err) {
  const prog *p = ctx;
  const mdef *defs = label ? p->eval : p->train;
  size_t n = label ? p->n_eval : p->n_train;
  ks_status s = ks_metric_collection_create(a, out, NULL);
  for (size_t i = 0; i < n && !s; i++) {
    ks_metric *m = NULL;
    s = ks_metric_create(defs[i].cls, defs[i].args, a, &m, err);
    if (!s) s = ks_metric_collection_add(*out, defs[i].name, m, NULL);
    if (s) ks_metric_free(m);
  }
  if (s) ks_metric_collection_free(*out);
  return s;
}

static void prog_init_alloc(prog *p, const mdef *train, size_t nt, const mdef *eval, size_t ne, float fill,
                            int64_t rows, int64_t cols, const ks_allocator *al) {
  memset(p, 0, sizeof *p);
  for (int i = 0; i < 6; i++) p->w[i] = fill + (float)i;
  for (int i = 0; i < 3; i++) p->b[i] = fill - (float)i;
  p->wshape[0] = rows, p->wshape[1] = cols;
  p->train = train, p->n_train = nt, p->eval = eval, p->n_eval = ne;
  ks_adamw_opts ao = {0.01, 0.9, 0.999, 1e-8, 0.01};
  int64_t bshape[1] = {3};
  assert_int_equal(ks_optimizer_create_adamw(&ao, al, &p->opt, NULL), KS_OK);
  assert_int_equal(ks_state_create("run", 5, al, &p->st, NULL), KS_OK);
  ks_tensor t;
  assert_int_equal(ks_tensor_init(&t, KS_F32, 2, p->wshape, p->w), KS_OK);
  assert_int_equal(ks_state_add_tensor(p->st, "fc.weight", &t, NULL), KS_OK);
  assert_int_equal(ks_tensor_init(&t, KS_F32, 1, bshape, p->b), KS_OK);
  assert_int_equal(ks_state_add_tensor(p->st, "fc.bias", &t, NULL), KS_OK);
  assert_int_equal(ks_optimizer_add_param(p->opt, p->w, p->gw, 2, p->wshape, NULL), KS_OK);
  assert_int_equal(ks_optimizer_add_param(p->opt, p->b, p->gb, 1, bshape, NULL), KS_OK);
  assert_int_equal(ks_state_add_optimizer(p->st, "AdamW", p->opt, NULL), KS_OK);
  ks_timestamp_init(&p->ts);
  ks_rng_seed(&p->rng, (uint64_t)fill);
  ks_state_set_timestamp(p->st, &p->ts);
  ks_state_set_rng(p->st, &p->rng);
  const char *labels[] = {"eval"};
  assert_int_equal(ks_state_build_metrics(p->st, factory, p, labels, ne ? 1 : 0, NULL), KS_OK);
}

static void prog_init_shape(prog *p, const mdef *train, size_t nt, const mdef *eval, size_t ne, float fill,
                            int64_t rows, int64_t cols) {
  prog_init_alloc(p, train, nt, eval, ne, fill, rows, cols, NULL);
}

static void prog_init(prog *p, const mdef *train, size_t nt, const mdef *eval, size_t ne, float fill) {
  prog_init_shape(p, train, nt, eval, ne, fill, 2, 3);
}

static void prog_free(prog *p) {
  ks_state_free(p->st);
  ks_optimizer_free(p->opt);
}

/* Feeds a few batches of 10-class predictions to every train metric, then computes them. */
static void train_a_little(prog *p) {
  float logits[4 * 10] = {0};
  int64_t y[4] = {1, 2, 3, 3};
  for (int i = 0; i < 4; i++) logits[i * 10 + (i == 3 ? 5 : y[i])] = 4.0f;
  int64_t ls[2] = {4, 10}, ys[1] = {4};
  ks_tensor in[2];
  assert_int_equal(ks_tensor_init(&in[0], KS_F32, 2, ls, logits), KS_OK);
  assert_int_equal(ks_tensor_init(&in[1], KS_I64, 1, ys, y), KS_OK);
  float v = 2.5f;
  ks_tensor scalar;
  assert_int_equal(ks_tensor_init(&scalar, KS_F32, 0, NULL, &v), KS_OK);
  ks_metric_collection *mc = ks_state_train_metrics(p->st);
  for (int step = 0; step < 3; step++)
    for (size_t i = 0; i < ks_metric_collection_count(mc); i++) {
      ks_metric *m = ks_metric_collection_at(mc, i, NULL);
      int agg = !strcmp(ks_metric_class(m), "MeanMetric");
      assert_int_equal(ks_metric_update(m, agg ? &scalar : in, agg ? 1 : 2, NULL), KS_OK);
    }
  for (size_t i = 0; i < ks_metric_collection_count(mc); i++) {
    const ks_tensor *t;
    assert_int_equal(ks_metric_compute(ks_metric_collection_at(mc, i, NULL), &t, NULL), KS_OK);
  }
  ks_optimizer_step(p->opt);
  ks_timestamp_batch_done(&p->ts, 4, 0, 0.1);
}

static double metric_value(ks_state *st, const char *name) {
  const ks_tensor *t;
  ks_metric *m = ks_metric_collection_get(ks_state_train_metrics(st), name);
  assert_non_null(m);
  assert_int_equal(ks_metric_compute(m, &t, NULL), KS_OK);
  return ks_dtype_get_f64(t->dtype, t->data, 0);
}

static ks_load_kind kind_of(const ks_load_report *r, const char *path) {
  const ks_load_item *it = ks_load_report_find(r, path);
  if (!it) fail_msg("no report item for %s", path);
  return it->kind;
}

/* Saves `a` into (sd, meta) and loads them into `b`. */
static ks_status transfer(prog *a, prog *b, const ks_load_opts *o, ks_load_report *rep, ks_statedict **keep_sd,
                          ks_meta **keep_meta, void (*edit)(ks_statedict *, ks_meta *)) {
  ks_statedict *sd;
  ks_meta *meta;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  assert_int_equal(ks_meta_create(NULL, &meta, NULL), KS_OK);
  assert_int_equal(ks_state_to_state_dict(a->st, sd, meta, NULL), KS_OK);
  if (edit) edit(sd, meta);
  ks_error e;
  ks_status s = ks_state_load_state_dict(b->st, sd, meta, o, rep, &e);
  if (keep_sd) *keep_sd = sd;
  else ks_statedict_free(sd);
  if (keep_meta) *keep_meta = meta;
  else ks_meta_free(meta);
  return s;
}

static const mdef ACC = {"MulticlassAccuracy", "MulticlassAccuracy", "{\"num_classes\":10}"};
static const mdef ACC12 = {"MulticlassAccuracy", "MulticlassAccuracy", "{\"num_classes\":12}"};
static const mdef F1 = {"MulticlassF1Score", "MulticlassF1Score", "{\"num_classes\":10}"};
static const mdef MEAN = {"Loss", "MeanMetric", "{}"};
static const mdef CONF = {"MulticlassConfusionMatrix", "MulticlassConfusionMatrix", "{\"num_classes\":10}"};

static void load_fills_metrics_so_compute_works_at_once(void **s) {
  (void)s;
  mdef train[] = {ACC, MEAN}, eval[] = {CONF};
  prog a, b;
  prog_init(&a, train, 2, eval, 1, 1.0f);
  prog_init(&b, train, 2, eval, 1, 50.0f);
  train_a_little(&a);
  ks_load_report *rep;
  assert_int_equal(ks_load_report_create(NULL, &rep, NULL), KS_OK);
  assert_int_equal(transfer(&a, &b, NULL, rep, NULL, NULL, NULL), KS_OK);
  ks_metric *ma = ks_metric_collection_get(ks_state_train_metrics(a.st), "MulticlassAccuracy");
  ks_metric *mb = ks_metric_collection_get(ks_state_train_metrics(b.st), "MulticlassAccuracy");
  assert_non_null(ks_metric_computed(mb)); /* _computed restored: no recompute needed */
  assert_int_equal(ks_metric_update_count(mb), ks_metric_update_count(ma));
  assert_true(metric_value(b.st, "MulticlassAccuracy") == metric_value(a.st, "MulticlassAccuracy"));
  assert_true(metric_value(b.st, "Loss") == 2.5);
  assert_memory_equal(a.w, b.w, sizeof a.w);
  assert_memory_equal(&a.rng, &b.rng, sizeof a.rng);
  assert_int_equal(b.ts.batch, 1);
  assert_int_equal(kind_of(rep, "state/train_metrics/MulticlassAccuracy"), KS_LOAD_LOADED);
  assert_int_equal(kind_of(rep, "state/eval_metrics/eval/MulticlassConfusionMatrix"), KS_LOAD_LOADED);
  assert_int_equal(kind_of(rep, "state/optimizers/AdamW"), KS_LOAD_LOADED);
  assert_int_equal(ks_load_report_count(rep, KS_LOAD_MISMATCHED), 0);
  ks_load_report_free(rep);
  prog_free(&a);
  prog_free(&b);
}

static void checkpoint_metric_the_program_lacks_is_skipped(void **s) {
  (void)s;
  mdef ta[] = {ACC, MEAN}, tb[] = {ACC};
  prog a, b;
  prog_init(&a, ta, 2, NULL, 0, 1.0f);
  prog_init(&b, tb, 1, NULL, 0, 2.0f);
  train_a_little(&a);
  ks_load_report *rep;
  assert_int_equal(ks_load_report_create(NULL, &rep, NULL), KS_OK);
  assert_int_equal(transfer(&a, &b, NULL, rep, NULL, NULL, NULL), KS_OK);
  assert_int_equal(kind_of(rep, "state/train_metrics/Loss"), KS_LOAD_SKIPPED);
  assert_int_equal(kind_of(rep, "state/train_metrics/MulticlassAccuracy"), KS_LOAD_LOADED);
  assert_int_equal(ks_metric_collection_count(ks_state_train_metrics(b.st)), 1);
  ks_load_report_free(rep);
  prog_free(&a);
  prog_free(&b);
}

static void program_metric_missing_from_checkpoint_keeps_defaults(void **s) {
  (void)s;
  mdef ta[] = {ACC}, tb[] = {ACC, F1};
  prog a, b;
  prog_init(&a, ta, 1, NULL, 0, 1.0f);
  prog_init(&b, tb, 2, NULL, 0, 2.0f);
  train_a_little(&a);
  ks_load_report *rep;
  assert_int_equal(ks_load_report_create(NULL, &rep, NULL), KS_OK);
  assert_int_equal(transfer(&a, &b, NULL, rep, NULL, NULL, NULL), KS_OK);
  assert_int_equal(kind_of(rep, "state/train_metrics/MulticlassF1Score"), KS_LOAD_MISSING);
  ks_metric *f1 = ks_metric_collection_get(ks_state_train_metrics(b.st), "MulticlassF1Score");
  assert_int_equal(ks_metric_update_count(f1), 0);
  assert_null(ks_metric_computed(f1));
  ks_load_report_free(rep);
  prog_free(&a);
  prog_free(&b);
}

static void to_old_schema(ks_statedict *sd, ks_meta *meta) {
  const char *k = "state/train_metrics/Loss/state_dict/mean_value";
  ks_tensor t = *ks_statedict_tensor(sd, k);
  assert_int_equal(ks_statedict_set_tensor(sd, "state/train_metrics/Loss/state_dict/value", &t, KS_COPY, NULL), KS_OK);
  assert_int_equal(ks_statedict_remove(sd, k), KS_OK);
  json_t *j = json_loads(ks_meta_get(meta, "keepsake.metrics"), 0, NULL);
  json_object_set_new(json_object_get(j, "state/train_metrics/Loss"), "schema_version", json_integer(1));
  char *txt = json_dumps(j, JSON_COMPACT);
  assert_int_equal(ks_meta_set(meta, "keepsake.metrics", txt, NULL), KS_OK);
  free(txt);
  json_decref(j);
}

static void renamed_state_old_schema_metric_is_migrated(void **s) {
  (void)s;
  mdef t[] = {MEAN};
  prog a, b;
  prog_init(&a, t, 1, NULL, 0, 1.0f);
  prog_init(&b, t, 1, NULL, 0, 2.0f);
  train_a_little(&a);
  ks_load_report *rep;
  assert_int_equal(ks_load_report_create(NULL, &rep, NULL), KS_OK);
  assert_int_equal(transfer(&a, &b, NULL, rep, NULL, NULL, to_old_schema), KS_OK);
  assert_int_equal(kind_of(rep, "state/train_metrics/Loss"), KS_LOAD_MIGRATED);
  assert_true(metric_value(b.st, "Loss") == 2.5);
  ks_load_report_free(rep);
  prog_free(&a);
  prog_free(&b);
}

static void changed_num_classes_is_reported_and_left_at_defaults(void **s) {
  (void)s;
  mdef ta[] = {ACC}, tb[] = {ACC12};
  prog a, b;
  prog_init(&a, ta, 1, NULL, 0, 1.0f);
  prog_init(&b, tb, 1, NULL, 0, 2.0f);
  train_a_little(&a);
  ks_load_report *rep;
  assert_int_equal(ks_load_report_create(NULL, &rep, NULL), KS_OK);
  assert_int_equal(transfer(&a, &b, NULL, rep, NULL, NULL, NULL), KS_OK);
  const ks_load_item *it = ks_load_report_find(rep, "state/train_metrics/MulticlassAccuracy");
  assert_non_null(it);
  assert_int_equal(it->kind, KS_LOAD_MISMATCHED);
  assert_non_null(strstr(it->reason, "num_classes"));
  ks_metric *m = ks_metric_collection_get(ks_state_train_metrics(b.st), "MulticlassAccuracy");
  assert_int_equal(ks_metric_update_count(m), 0);
  ks_load_report_free(rep);
  prog_free(&a);
  prog_free(&b);
}

static void drop_meta(ks_statedict *sd, ks_meta *meta) {
  (void)sd;
  assert_int_equal(ks_meta_set(meta, "keepsake.metrics", "{}", NULL), KS_OK);
}

/* Without class/args metadata (e.g. a converted Composer file) the shapes still catch 10 -> 12. */
static void changed_num_classes_without_metadata_is_caught_by_shape(void **s) {
  (void)s;
  mdef ta[] = {ACC}, tb[] = {ACC12};
  prog a, b;
  prog_init(&a, ta, 1, NULL, 0, 1.0f);
  prog_init(&b, tb, 1, NULL, 0, 2.0f);
  train_a_little(&a);
  ks_load_report *rep;
  assert_int_equal(ks_load_report_create(NULL, &rep, NULL), KS_OK);
  assert_int_equal(transfer(&a, &b, NULL, rep, NULL, NULL, drop_meta), KS_OK);
  assert_int_equal(kind_of(rep, "state/train_metrics/MulticlassAccuracy"), KS_LOAD_MISMATCHED);
  assert_int_equal(ks_metric_update_count(ks_metric_collection_get(ks_state_train_metrics(b.st), "MulticlassAccuracy")),
                   0);
  ks_load_report_free(rep);
  prog_free(&a);
  prog_free(&b);
}

static void store_as(ks_statedict *sd, ks_dtype dt) {
  const char *keys[] = {"state/train_metrics/Loss/state_dict/mean_value", "state/train_metrics/Loss/state_dict/weight"};
  for (int i = 0; i < 2; i++) {
    const ks_tensor *t = ks_statedict_tensor(sd, keys[i]);
    double v = ks_dtype_get_f64(t->dtype, t->data, 0);
    void *data;
    assert_int_equal(ks_statedict_new_tensor(sd, keys[i], dt, 0, NULL, &data, NULL), KS_OK);
    ks_dtype_set_f64(dt, data, 0, v);
  }
}
static void to_f16(ks_statedict *sd, ks_meta *m) { (void)m; store_as(sd, KS_F16); }
static void to_f64(ks_statedict *sd, ks_meta *m) { (void)m; store_as(sd, KS_F64); }

static void f16_stored_states_are_widened_and_narrowing_is_refused(void **s) {
  (void)s;
  mdef t[] = {MEAN};
  prog a, b, c, d;
  prog_init(&a, t, 1, NULL, 0, 1.0f);
  prog_init(&b, t, 1, NULL, 0, 2.0f);
  prog_init(&c, t, 1, NULL, 0, 3.0f);
  prog_init(&d, t, 1, NULL, 0, 4.0f);
  train_a_little(&a);
  ks_load_report *rep;
  assert_int_equal(ks_load_report_create(NULL, &rep, NULL), KS_OK);
  assert_int_equal(transfer(&a, &b, NULL, rep, NULL, NULL, to_f16), KS_OK);
  assert_int_equal(kind_of(rep, "state/train_metrics/Loss"), KS_LOAD_CONVERTED);
  ks_tensor cur;
  assert_int_equal(
      ks_metric_state_info(ks_metric_collection_get(ks_state_train_metrics(b.st), "Loss"), 0, NULL, NULL, &cur), KS_OK);
  assert_int_equal(cur.dtype, KS_F32); /* the declared dtype is kept */
  assert_true(metric_value(b.st, "Loss") == 2.5);
  ks__load_report_clear(rep);
  assert_int_equal(transfer(&a, &c, NULL, rep, NULL, NULL, to_f64), KS_OK);
  assert_int_equal(kind_of(rep, "state/train_metrics/Loss"), KS_LOAD_MISMATCHED);
  ks__load_report_clear(rep);
  ks_load_opts o = {.allow_narrowing = 1};
  assert_int_equal(transfer(&a, &d, &o, rep, NULL, NULL, to_f64), KS_OK);
  assert_int_equal(kind_of(rep, "state/train_metrics/Loss"), KS_LOAD_CONVERTED);
  ks_load_report_free(rep);
  prog_free(&a);
  prog_free(&b);
  prog_free(&c);
  prog_free(&d);
}

static void ignore_globs_leave_components_untouched(void **s) {
  (void)s;
  mdef t[] = {ACC};
  prog a, b;
  prog_init(&a, t, 1, NULL, 0, 1.0f);
  prog_init(&b, t, 1, NULL, 0, 2.0f);
  train_a_little(&a);
  ks_rng rng_before = b.rng;
  const char *ignore[] = {"rng", "state/optimizers/*", "*_wct"};
  ks_load_opts o = {.ignore = ignore, .n_ignore = 3};
  ks_load_report *rep;
  assert_int_equal(ks_load_report_create(NULL, &rep, NULL), KS_OK);
  b.ts.total_wct = 123.0;
  assert_int_equal(transfer(&a, &b, &o, rep, NULL, NULL, NULL), KS_OK);
  assert_memory_equal(&b.rng, &rng_before, sizeof b.rng);
  assert_int_equal(kind_of(rep, "rng/0"), KS_LOAD_SKIPPED);
  assert_int_equal(kind_of(rep, "state/optimizers/AdamW"), KS_LOAD_SKIPPED);
  assert_int_equal(kind_of(rep, "state/timestamp/Timestamp"), KS_LOAD_LOADED);
  assert_true(b.ts.total_wct == 123.0);
  assert_int_equal(b.ts.batch, 1);
  assert_memory_equal(a.w, b.w, sizeof a.w);
  ks_load_report_free(rep);
  prog_free(&a);
  prog_free(&b);
}

static void weights_only_loads_the_model_alone(void **s) {
  (void)s;
  mdef t[] = {ACC};
  prog a, b;
  prog_init(&a, t, 1, NULL, 0, 1.0f);
  prog_init(&b, t, 1, NULL, 0, 2.0f);
  train_a_little(&a);
  ks_load_opts o = {.weights_only = 1};
  ks_load_report *rep;
  assert_int_equal(ks_load_report_create(NULL, &rep, NULL), KS_OK);
  assert_int_equal(transfer(&a, &b, &o, rep, NULL, NULL, NULL), KS_OK);
  assert_memory_equal(a.w, b.w, sizeof a.w);
  assert_int_equal(b.ts.batch, 0);
  assert_int_equal(ks_metric_update_count(ks_metric_collection_get(ks_state_train_metrics(b.st), "MulticlassAccuracy")),
                   0);
  assert_int_equal(kind_of(rep, "state/model"), KS_LOAD_LOADED);
  assert_int_equal(kind_of(rep, "state/optimizers/AdamW"), KS_LOAD_SKIPPED);
  assert_int_equal(kind_of(rep, "state/train_metrics"), KS_LOAD_SKIPPED);
  ks_load_report_free(rep);
  prog_free(&a);
  prog_free(&b);
}

static void strict_model_mismatch_fails_and_changes_nothing(void **s) {
  (void)s;
  mdef t[] = {ACC};
  prog a, b;
  prog_init(&a, t, 1, NULL, 0, 1.0f);
  prog_init_shape(&b, t, 1, NULL, 0, 2.0f, 3, 2); /* same bytes, different shape */
  float bias_before[3];
  memcpy(bias_before, b.b, sizeof bias_before);
  ks_load_report *rep;
  assert_int_equal(ks_load_report_create(NULL, &rep, NULL), KS_OK);
  assert_int_equal(transfer(&a, &b, NULL, rep, NULL, NULL, NULL), KS_E_SHAPE);
  assert_memory_equal(b.b, bias_before, sizeof bias_before); /* nothing written, not even the matching bias */
  ks__load_report_clear(rep);
  ks_load_opts o = {.non_strict_model = 1};
  assert_int_equal(transfer(&a, &b, &o, rep, NULL, NULL, NULL), KS_OK);
  assert_int_equal(kind_of(rep, "state/model/fc.weight"), KS_LOAD_MISMATCHED);
  assert_memory_equal(b.b, a.b, sizeof a.b);
  ks_load_report_free(rep);
  prog_free(&a);
  prog_free(&b);
}

/* A binding that read a tensor's bytes into the tensor itself gives the engine the tensor's own
   memory as the entry: loaded, nothing copied onto itself (ASan flags an overlapping memcpy). */
static void an_entry_already_in_place_is_loaded_without_a_copy(void **s) {
  (void)s;
  ks_state *st;
  assert_int_equal(ks_state_create("", 0, NULL, &st, NULL), KS_OK);
  float w[6] = {1, 2, 3, 4, 5, 6}, other[2] = {7, 8}, b[2] = {0, 0};
  int64_t ws[2] = {2, 3}, bs[1] = {2};
  ks_tensor t;
  assert_int_equal(ks_tensor_init(&t, KS_F32, 2, ws, w), KS_OK);
  assert_int_equal(ks_state_add_tensor(st, "w", &t, NULL), KS_OK);
  ks_statedict *sd;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_tensor(sd, "state/model/w", &t, KS_BORROW, NULL), KS_OK);
  assert_int_equal(ks_tensor_init(&t, KS_F32, 1, bs, b), KS_OK);
  assert_int_equal(ks_state_add_tensor(st, "b", &t, NULL), KS_OK);
  assert_int_equal(ks_tensor_init(&t, KS_F32, 1, bs, other), KS_OK);
  assert_int_equal(ks_statedict_set_tensor(sd, "state/model/b", &t, KS_BORROW, NULL), KS_OK);
  ks_load_report *rep;
  assert_int_equal(ks_load_report_create(NULL, &rep, NULL), KS_OK);
  assert_int_equal(ks_state_load_state_dict(st, sd, NULL, NULL, rep, NULL), KS_OK);
  assert_int_equal(kind_of(rep, "state/model"), KS_LOAD_LOADED);
  const float want[6] = {1, 2, 3, 4, 5, 6};
  assert_memory_equal(w, want, sizeof want);
  assert_memory_equal(b, other, sizeof other); /* the other entry copied as before */
  ks_load_report_free(rep);
  ks_statedict_free(sd);
  ks_state_free(st);
}

static void strict_model_rejects_unexpected_keys(void **s) {
  (void)s;
  mdef t[] = {ACC};
  prog a, b;
  prog_init(&a, t, 1, NULL, 0, 1.0f);
  prog_init(&b, t, 1, NULL, 0, 2.0f);
  float extra[2] = {1, 2};
  int64_t es[1] = {2};
  ks_tensor et;
  assert_int_equal(ks_tensor_init(&et, KS_F32, 1, es, extra), KS_OK);
  assert_int_equal(ks_state_add_tensor(a.st, "head.bias", &et, NULL), KS_OK);
  assert_int_equal(transfer(&a, &b, NULL, NULL, NULL, NULL, NULL), KS_E_MISMATCH);
  ks_load_opts o = {.non_strict_model = 1};
  ks_load_report *rep;
  assert_int_equal(ks_load_report_create(NULL, &rep, NULL), KS_OK);
  assert_int_equal(transfer(&a, &b, &o, rep, NULL, NULL, NULL), KS_OK);
  assert_int_equal(kind_of(rep, "state/model/head.bias"), KS_LOAD_SKIPPED);
  ks_load_report_free(rep);
  prog_free(&a);
  prog_free(&b);
}

static void state_flattens_to_composer_layout_with_metric_metadata(void **s) {
  (void)s;
  mdef t[] = {ACC}, e[] = {CONF};
  prog a;
  prog_init(&a, t, 1, e, 1, 1.0f);
  train_a_little(&a);
  ks_statedict *sd;
  ks_meta *meta;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  assert_int_equal(ks_meta_create(NULL, &meta, NULL), KS_OK);
  assert_int_equal(ks_state_to_state_dict(a.st, sd, meta, NULL), KS_OK);
  const char *keys[] = {"state/model/fc.weight", "state/optimizers/AdamW/state/0/exp_avg",
                        "state/optimizers/AdamW/param_groups/0/lr", "state/timestamp/Timestamp/batch",
                        "state/timestamp/Timestamp/total_wct", "state/train_metrics/MulticlassAccuracy/state_dict/tp",
                        "state/train_metrics/MulticlassAccuracy/_computed",
                        "state/eval_metrics/eval/MulticlassConfusionMatrix/state_dict/confmat",
                        "state/eval_metrics/eval/MulticlassConfusionMatrix/_computed", "state/rank_zero_seed",
                        "state/run_name", "rng/0/xoshiro256starstar"};
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
    ks_entry en;
    if (ks_statedict_get(sd, keys[i], &en) != KS_OK) fail_msg("missing %s", keys[i]);
  }
  ks_entry en;
  assert_int_equal(ks_statedict_get(sd, "state/eval_metrics/eval/MulticlassConfusionMatrix/_computed", &en), KS_OK);
  assert_int_equal(en.kind, KS_VAL_NULL); /* never computed: None */
  json_t *j = json_loads(ks_meta_get(meta, "keepsake.metrics"), 0, NULL);
  json_t *m = json_object_get(j, "state/train_metrics/MulticlassAccuracy");
  assert_string_equal(json_string_value(json_object_get(m, "class")), "MulticlassAccuracy");
  assert_int_equal(json_integer_value(json_object_get(json_object_get(m, "args"), "num_classes")), 10);
  assert_int_equal(json_integer_value(json_object_get(m, "update_count")), 3);
  assert_int_equal(json_integer_value(json_object_get(m, "schema_version")), KS_METRIC_SCHEMA_VERSION);
  json_decref(j);
  ks_meta_free(meta);
  ks_statedict_free(sd);
  prog_free(&a);
}

static void save_and_load_survive_every_allocation_failure(void **s) {
  (void)s;
  mdef t[] = {ACC}, e[] = {CONF};
  prog a, b;
  prog_init(&a, t, 1, e, 1, 1.0f);
  prog_init(&b, t, 1, e, 1, 2.0f);
  train_a_little(&a);
  ks_statedict *src;
  ks_meta *meta;
  assert_int_equal(ks_statedict_create(NULL, &src, NULL), KS_OK);
  assert_int_equal(ks_meta_create(NULL, &meta, NULL), KS_OK);
  assert_int_equal(ks_state_to_state_dict(a.st, src, meta, NULL), KS_OK);
  for (long n = 1;; n++) {
    ks_test_alloc ta;
    ks_test_alloc_init(&ta, n);
    ks_statedict *sd = NULL;
    ks_meta *m2 = NULL;
    ks_load_report *rep = NULL;
    ks_status st = ks_statedict_create(&ta.a, &sd, NULL);
    if (!st) st = ks_meta_create(&ta.a, &m2, NULL);
    if (!st) st = ks_state_to_state_dict(a.st, sd, m2, NULL);
    if (!st) st = ks_load_report_create(&ta.a, &rep, NULL);
    if (!st) st = ks_state_load_state_dict(b.st, src, meta, NULL, rep, NULL);
    ks_load_report_free(rep);
    ks_meta_free(m2);
    ks_statedict_free(sd);
    assert_int_equal(ta.live, 0);
    if (st == KS_OK) break;
    assert_int_equal(st, KS_E_NOMEM);
  }
  assert_true(metric_value(b.st, "MulticlassAccuracy") == metric_value(a.st, "MulticlassAccuracy"));
  ks_meta_free(meta);
  ks_statedict_free(src);
  prog_free(&a);
  prog_free(&b);
}

/*
 * A whole checkpoint round trip through files, every object on one failing
 * allocator: ks_state_save (state dict, metric metadata JSON, header, scalars)
 * then ks_state_load (reader, scalars JSON, metric metadata JSON, metrics,
 * report). Failing the Nth allocation, for every N, gives KS_E_NOMEM, no crash
 * and no leak; the run that succeeds restores the metrics exactly.
 */
static void file_save_and_load_with_metrics_survive_every_allocation_failure(void **s) {
  (void)s;
  mdef t[] = {ACC, MEAN}, e[] = {CONF};
  char *dir = ks_test_tmpdir("state_nomem"), *path = ks_test_path(dir, "ckpt.keepsake");
  long failures = 0;
  for (long n = 1;; n++) {
    ks_test_alloc ta;
    ks_test_alloc_init(&ta, 0); /* setup allocates without failing */
    prog a, b;
    prog_init_alloc(&a, t, 2, e, 1, 1.0f, 2, 3, &ta.a);
    prog_init_alloc(&b, t, 2, e, 1, 2.0f, 2, 3, &ta.a);
    train_a_little(&a);
    ks_load_report *rep = NULL;
    assert_int_equal(ks_load_report_create(&ta.a, &rep, NULL), KS_OK);
    remove(path);
    ta.calls = 0;
    ta.fail_at = n;
    ks_save_opts so = {.alloc = &ta.a, .io = ks_test_io_nosync()};
    ks_status st = ks_state_save(a.st, path, &so, NULL);
    if (!st) st = ks_state_load(b.st, path, NULL, rep, NULL);
    ta.fail_at = 0;
    if (st == KS_OK) {
      assert_true(metric_value(b.st, "MulticlassAccuracy") == metric_value(a.st, "MulticlassAccuracy"));
      assert_true(metric_value(b.st, "Loss") == metric_value(a.st, "Loss"));
      assert_int_equal(kind_of(rep, "state/train_metrics/MulticlassAccuracy"), KS_LOAD_LOADED);
      assert_true(memcmp(a.w, b.w, sizeof a.w) == 0);
    } else {
      assert_int_equal(st, KS_E_NOMEM);
      failures++;
    }
    ks_load_report_free(rep);
    prog_free(&a);
    prog_free(&b);
    assert_int_equal(ta.live, 0);
    if (st == KS_OK) break;
  }
  printf("allocation sweep: %ld failure points\n", failures);
  assert_true(failures > 20); /* the sweep did reach the allocations of both halves */
  ks_test_rmtree(dir);
  free(path);
  free(dir);
}

static const mdef MINMAX = {"minmax", "MinMaxMetric", "{\"base_metric\":{\"class\":\"MeanMetric\"}}"};

static void feed_scalar(ks_metric *m, float v) {
  ks_tensor t;
  const ks_tensor *r;
  assert_int_equal(ks_tensor_init(&t, KS_F32, 0, NULL, &v), KS_OK);
  assert_int_equal(ks_metric_update(m, &t, 1, NULL), KS_OK);
  assert_int_equal(ks_metric_compute(m, &r, NULL), KS_OK);
}

static float bound(const ks_metric *m, size_t i) {
  ks_tensor v;
  assert_int_equal(ks_metric_attr_at(m, i, NULL, NULL, &v), KS_OK);
  assert_non_null(v.data);
  return *(const float *)v.data;
}

/*
 * A C program's MinMaxMetric(MeanMetric) is saved as torchmetrics' is by the Python package (the
 * keys in the same order, the wrapper's record with its inner classes and no arguments) and a C
 * resume fills the base metric's states and the bounds.
 */
static void minmax_wrapper_saves_the_binding_layout_and_resumes(void **s) {
  (void)s;
  static const char *const keys[] = {"_computed", "attrs/max_val", "attrs/min_val",
                                     "inner/_base_metric/state_dict/mean_value",
                                     "inner/_base_metric/state_dict/weight", "inner/_base_metric/_computed",
                                     "inner/_base_metric/update_count"};
  mdef t[] = {MINMAX};
  prog a, b;
  prog_init(&a, t, 1, NULL, 0, 1.0f);
  prog_init(&b, t, 1, NULL, 0, 2.0f);
  ks_metric *ma = ks_metric_collection_get(ks_state_train_metrics(a.st), "minmax");
  feed_scalar(ma, 2.0f);
  feed_scalar(ma, 6.0f); /* mean 4: max 4, min 2 */
  ks_statedict *sd;
  ks_meta *meta;
  ks_load_report *rep;
  assert_int_equal(ks_load_report_create(NULL, &rep, NULL), KS_OK);
  assert_int_equal(transfer(&a, &b, NULL, rep, &sd, &meta, NULL), KS_OK);
  size_t j = 0, n = sizeof keys / sizeof *keys, pl = strlen("state/train_metrics/minmax/");
  ks_entry e;
  for (size_t i = 0; ks_statedict_at(sd, i, &e) == KS_OK; i++) {
    if (strncmp(e.name, "state/train_metrics/minmax/", pl)) continue;
    assert_true(j < n);
    assert_string_equal(e.name + pl, keys[j++]);
  }
  assert_int_equal(j, n);
  assert_int_equal(ks_statedict_get(sd, "state/train_metrics/minmax/_computed", &e), KS_OK);
  assert_int_equal(e.kind, KS_VAL_NULL);
  assert_int_equal(ks_statedict_get(sd, "state/train_metrics/minmax/inner/_base_metric/update_count", &e), KS_OK);
  assert_true(e.kind == KS_VAL_INT && e.i == 2);
  assert_string_equal(ks_meta_get(meta, KS_META_METRICS),
                      "{\"state/train_metrics/minmax\":{\"class\":\"MinMaxMetric\",\"inner\":{\"_base_metric\":"
                      "\"MeanMetric\"},\"schema_version\":2,\"update_count\":0}}");
  assert_int_equal(kind_of(rep, "state/train_metrics/minmax"), KS_LOAD_LOADED);
  ks_metric *mb = ks_metric_collection_get(ks_state_train_metrics(b.st), "minmax");
  ks_metric *base = ks_metric_inner_at(mb, 0, NULL);
  assert_true(bound(mb, 0) == 4.0f && bound(mb, 1) == 2.0f);
  assert_int_equal(ks_metric_update_count(base), 2);
  assert_non_null(ks_metric_computed(base));
  feed_scalar(mb, 0.5f); /* mean of 2, 6, 0.5: the base's states came back */
  const ks_tensor *r;
  assert_int_equal(ks_metric_compute(mb, &r, NULL), KS_OK);
  const float *f = r->data;
  assert_true(f[0] == 8.5f / 3.0f && f[1] == 4.0f && f[2] == 2.0f);
  ks_load_report_free(rep);
  ks_statedict_free(sd);
  ks_meta_free(meta);
  prog_free(&a);
  prog_free(&b);
}

/* A component under rng/ that marks its words as a numpy array (as a program embedding CPython would). */
static ks_status np_save(void *ctx, ks_statedict *dst, const char *prefix, ks_error *err) {
  int64_t *words = ctx, n = 4;
  char k[128];
  ks_tensor t;
  snprintf(k, sizeof k, "%snumpy/keys", prefix);
  ks_status s = ks_tensor_init(&t, KS_I64, 1, &n, words);
  if (!s) s = ks_statedict_set_tensor(dst, k, &t, KS_COPY, err);
  if (!s) s = ks_statedict_mark_leaf(dst, k, KS_LEAF_NDARRAY, err);
  return s;
}

static ks_status np_load(void *ctx, const ks_statedict *src, const char *prefix, ks_error *err) {
  char k[128];
  snprintf(k, sizeof k, "%snumpy/keys", prefix);
  const ks_tensor *t = ks_statedict_tensor(src, k);
  (void)err;
  if (!t || t->nbytes != 4 * sizeof(int64_t)) return KS_E_MISMATCH;
  memcpy(ctx, t->data, t->nbytes);
  return KS_OK;
}

/* ks_statedict_mark_leaf: what a mark needs, and ks_state_save recording it with the rng/ list, the
 * component saved after the run identity. */
static void a_component_marks_a_leaf_that_the_save_records(void **s) {
  (void)s;
  ks_statedict *sd;
  ks_error e;
  int64_t v = 1, words[4] = {1, 2, 3, 4}, got[4] = {0};
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_int(sd, "i", 5, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_string(sd, "big", "123456789012345678901234567890", NULL), KS_OK);
  ks_tensor t;
  assert_int_equal(ks_tensor_init(&t, KS_I64, 0, NULL, &v), KS_OK);
  assert_int_equal(ks_statedict_set_tensor(sd, "t", &t, KS_COPY, NULL), KS_OK);
  assert_int_equal(ks_statedict_mark_leaf(sd, "nope", KS_LEAF_NDARRAY, &e), KS_E_NOTFOUND);
  assert_int_equal(ks_statedict_mark_leaf(sd, "i", KS_LEAF_NDARRAY, &e), KS_E_INVALID);
  assert_int_equal(ks_statedict_mark_leaf(sd, "t", KS_LEAF_BIGINT, &e), KS_E_INVALID);
  assert_int_equal(ks_statedict_mark_leaf(sd, "t", 9, &e), KS_E_INVALID);
  assert_int_equal(ks_statedict_mark_leaf(sd, "big", KS_LEAF_BIGINT, &e), KS_OK);
  assert_int_equal(ks_statedict_mark_leaf(sd, "t", KS_LEAF_BYTES, &e), KS_OK);
  assert_int_equal(ks__statedict_leaf(sd, 2), KS_LEAF_BYTES);
  assert_int_equal(ks_statedict_set_tensor(sd, "t", &t, KS_COPY, NULL), KS_OK); /* replaced: unmarked */
  assert_int_equal(ks__statedict_leaf(sd, 2), 0);
  assert_int_equal(ks__statedict_leaf(sd, 1), KS_LEAF_BIGINT);
  ks_statedict_free(sd);
  /* Through ks_state_save's flattening: the leaf and the rng list in the document, the entry last. */
  ks_state *st, *st2;
  ks_stateful np = {words, np_save, np_load}, np2 = {got, np_save, np_load};
  assert_int_equal(ks_state_create("run", 1, NULL, &st, NULL), KS_OK);
  assert_int_equal(ks_state_add_component(st, KS_ROOT_RNG, "0", &np, NULL), KS_OK);
  ks_meta *meta;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  assert_int_equal(ks_meta_create(NULL, &meta, NULL), KS_OK);
  assert_int_equal(ks_state_to_state_dict(st, sd, meta, NULL), KS_OK);
  assert_string_equal(ks_meta_get(meta, KS_TORCH_STRUCTURE_META),
                      "{\"version\":1,\"containers\":{\"rng\":{\"kind\":\"list\",\"len\":1}},\"leaves\":"
                      "{\"rng/0/numpy/keys\":\"ndarray\"}}");
  ks_entry last;
  assert_int_equal(ks_statedict_at(sd, ks_statedict_count(sd) - 1, &last), KS_OK);
  assert_string_equal(last.name, "rng/0/numpy/keys");
  assert_int_equal(ks_state_create("run", 1, NULL, &st2, NULL), KS_OK);
  assert_int_equal(ks_state_add_component(st2, KS_ROOT_RNG, "0", &np2, NULL), KS_OK);
  assert_int_equal(ks_state_load_state_dict(st2, sd, meta, NULL, NULL, NULL), KS_OK);
  assert_memory_equal(got, words, sizeof words);
  ks_meta_free(meta);
  ks_statedict_free(sd);
  ks_state_free(st);
  ks_state_free(st2);
}

/* A wrapper metric and a marked rng component saved to a file and loaded, failing every allocation. */
static void wrapper_and_marked_leaf_survive_every_allocation_failure(void **s) {
  (void)s;
  mdef t[] = {MINMAX};
  char *dir = ks_test_tmpdir("wrapper_nomem"), *path = ks_test_path(dir, "ckpt.keepsake");
  long failures = 0;
  int64_t words[4] = {5, 6, 7, 8};
  for (long n = 1;; n++) {
    ks_test_alloc ta;
    ks_test_alloc_init(&ta, 0);
    prog a, b;
    int64_t got[4] = {0};
    ks_stateful np = {words, np_save, np_load}, np2 = {got, np_save, np_load};
    prog_init_alloc(&a, t, 1, NULL, 0, 1.0f, 2, 3, &ta.a);
    prog_init_alloc(&b, t, 1, NULL, 0, 2.0f, 2, 3, &ta.a);
    assert_int_equal(ks_state_add_component(a.st, KS_ROOT_RNG, "np", &np, NULL), KS_OK);
    assert_int_equal(ks_state_add_component(b.st, KS_ROOT_RNG, "np", &np2, NULL), KS_OK);
    ks_metric *ma = ks_metric_collection_get(ks_state_train_metrics(a.st), "minmax");
    feed_scalar(ma, 2.0f);
    feed_scalar(ma, 6.0f);
    remove(path);
    ta.calls = 0;
    ta.fail_at = n;
    ks_save_opts so = {.alloc = &ta.a, .io = ks_test_io_nosync()};
    ks_status st = ks_state_save(a.st, path, &so, NULL);
    if (!st) st = ks_state_load(b.st, path, NULL, NULL, NULL);
    ta.fail_at = 0;
    if (st == KS_OK) {
      ks_metric *mb = ks_metric_collection_get(ks_state_train_metrics(b.st), "minmax");
      assert_true(bound(mb, 0) == 4.0f && bound(mb, 1) == 2.0f);
      assert_memory_equal(got, words, sizeof words);
    } else {
      assert_int_equal(st, KS_E_NOMEM);
      failures++;
    }
    prog_free(&a);
    prog_free(&b);
    assert_int_equal(ta.live, 0);
    if (st == KS_OK) break;
  }
  assert_true(failures > 20);
  ks_test_rmtree(dir);
  free(path);
  free(dir);
}

static void retention_deletes_only_files_named_by_the_template(void **s) {
  (void)s;
  static const mdef train[] = {ACC};
  prog p;
  prog_init(&p, train, 1, NULL, 0, 1.0f);
  char *dir = ks_test_tmpdir("retention");
  ks_ckpt_opts co = {.run_dir = dir, .save_interval = "1ba", .keep = 1, .io = ks_test_io_nosync()};
  ks_ckpt_manager *mgr;
  assert_int_equal(ks_ckpt_manager_create(&co, &mgr, NULL), KS_OK);
  train_a_little(&p);
  char *final = ks_test_path(dir, "final.keepsake"), *first = ks_test_path(dir, "ep0-ba1.keepsake");
  assert_int_equal(ks_state_save(p.st, final, NULL, NULL), KS_OK); /* an export beside the checkpoints */
  assert_int_equal(ks_ckpt_manager_save(mgr, p.st, NULL, NULL), KS_OK);
  train_a_little(&p);
  assert_int_equal(ks_ckpt_manager_save(mgr, p.st, NULL, NULL), KS_OK);
  train_a_little(&p);
  assert_int_equal(ks_ckpt_manager_save(mgr, p.st, NULL, NULL), KS_OK);
  assert_true(ks_test_exists(final));
  assert_false(ks_test_exists(first));
  ks_ckpt_manager_free(mgr);
  ks_test_rmtree(dir);
  free(final);
  free(first);
  free(dir);
  prog_free(&p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(load_fills_metrics_so_compute_works_at_once),
      cmocka_unit_test(checkpoint_metric_the_program_lacks_is_skipped),
      cmocka_unit_test(program_metric_missing_from_checkpoint_keeps_defaults),
      cmocka_unit_test(renamed_state_old_schema_metric_is_migrated),
      cmocka_unit_test(changed_num_classes_is_reported_and_left_at_defaults),
      cmocka_unit_test(changed_num_classes_without_metadata_is_caught_by_shape),
      cmocka_unit_test(f16_stored_states_are_widened_and_narrowing_is_refused),
      cmocka_unit_test(ignore_globs_leave_components_untouched),
      cmocka_unit_test(weights_only_loads_the_model_alone),
      cmocka_unit_test(strict_model_mismatch_fails_and_changes_nothing),
      cmocka_unit_test(an_entry_already_in_place_is_loaded_without_a_copy),
      cmocka_unit_test(strict_model_rejects_unexpected_keys),
      cmocka_unit_test(state_flattens_to_composer_layout_with_metric_metadata),
      cmocka_unit_test(save_and_load_survive_every_allocation_failure),
      cmocka_unit_test(file_save_and_load_with_metrics_survive_every_allocation_failure),
      cmocka_unit_test(minmax_wrapper_saves_the_binding_layout_and_resumes),
      cmocka_unit_test(a_component_marks_a_leaf_that_the_save_records),
      cmocka_unit_test(wrapper_and_marked_leaf_survive_every_allocation_failure),
      cmocka_unit_test(retention_deletes_only_files_named_by_the_template),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
