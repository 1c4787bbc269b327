/* State components: PRNG, optimizers (against torch 1.13), scheduler, timestamp, load report, ignore globs. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "keepsake/state.h"
#include "state/state_internal.h"
#include "testutil.h"

static void rng_same_seed_same_stream_and_state_round_trips(void **s) {
  (void)s;
  ks_rng a, b;
  ks_rng_seed(&a, 7);
  ks_rng_seed(&b, 7);
  for (int i = 0; i < 100; i++) assert_int_equal(ks_rng_next(&a), ks_rng_next(&b));
  ks_statedict *sd;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  assert_int_equal(ks_test_save(ks_rng_stateful(&a), sd, "rng/0/", NULL), KS_OK);
  uint64_t expect[5];
  for (int i = 0; i < 5; i++) expect[i] = ks_rng_next(&a);
  ks_rng c;
  ks_rng_seed(&c, 999);
  assert_int_equal(ks_test_load(ks_rng_stateful(&c), sd, "rng/0/", NULL), KS_OK);
  for (int i = 0; i < 5; i++) assert_int_equal(ks_rng_next(&c), expect[i]);
  ks_statedict_free(sd);
}

static void rng_below_and_shuffle_stay_in_range(void **s) {
  (void)s;
  ks_rng r;
  ks_rng_seed(&r, 1);
  int seen[10] = {0};
  for (int i = 0; i < 10000; i++) {
    uint64_t v = ks_rng_below(&r, 10);
    assert_true(v < 10);
    seen[v]++;
  }
  for (int i = 0; i < 10; i++) assert_true(seen[i] > 800 && seen[i] < 1200);
  int64_t idx[50];
  for (int i = 0; i < 50; i++) idx[i] = i;
  ks_rng_shuffle(&r, idx, 50);
  int hit[50] = {0}, moved = 0;
  for (int i = 0; i < 50; i++) {
    hit[idx[i]]++;
    moved += idx[i] != i;
  }
  for (int i = 0; i < 50; i++) assert_int_equal(hit[i], 1);
  assert_true(moved > 25);
  double u = ks_rng_uniform(&r);
  assert_true(u >= 0 && u < 1);
}

static void rng_load_rejects_wrong_shape_and_zero_state(void **s) {
  (void)s;
  ks_statedict *sd;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  int64_t three = 3;
  assert_int_equal(ks_statedict_new_tensor(sd, "rng/0/xoshiro256starstar", KS_U64, 1, &three, NULL, NULL), KS_OK);
  ks_rng r, before;
  ks_rng_seed(&r, 3);
  before = r;
  assert_int_equal(ks_test_load(ks_rng_stateful(&r), sd, "rng/0/", NULL), KS_E_SHAPE);
  int64_t four = 4;
  assert_int_equal(ks_statedict_new_tensor(sd, "rng/0/xoshiro256starstar", KS_U64, 1, &four, NULL, NULL), KS_OK);
  assert_int_equal(ks_test_load(ks_rng_stateful(&r), sd, "rng/0/", NULL), KS_E_VALUE);
  assert_memory_equal(&r, &before, sizeof r);
  ks_statedict_free(sd);
}

/* Reference: torch 1.13 AdamW(lr=0.01, wd=0.01) and SGD(lr=0.1, momentum=0.9, nesterov, wd=0.01), 3 steps. */
static const float ref_adamw[4] = {4.706211388e-01f, -1.219627976e+00f, 1.971349597e+00f, -2.999700047e-02f};
static const float ref_adamw_exp_avg[4] = {5.610000342e-02f, -5.420000106e-02f, 4.780000448e-02f, 4.064999819e-01f};
static const float ref_sgd[4] = {3.505675495e-01f, -1.079254150e+00f, 1.821472645e+00f, -1.205264807e+00f};

static void run_three_steps(ks_optimizer *o, float *p, float *g) {
  for (int k = 0; k < 3; k++) {
    float grad[4] = {0.1f * (float)(k + 1), -0.2f, 0.3f / (float)(k + 1), 1.5f};
    memcpy(g, grad, sizeof grad);
    ks_optimizer_step(o);
  }
  (void)p;
}

static void adamw_matches_torch(void **s) {
  (void)s;
  float p[4] = {0.5f, -1.25f, 2.0f, 0.0f}, g[4];
  int64_t shape[1] = {4};
  ks_optimizer *o;
  ks_adamw_opts ao = {0.01, 0.9, 0.999, 1e-8, 0.01};
  assert_int_equal(ks_optimizer_create_adamw(&ao, NULL, &o, NULL), KS_OK);
  assert_int_equal(ks_optimizer_add_param(o, p, g, 1, shape, NULL), KS_OK);
  run_three_steps(o, p, g);
  for (int i = 0; i < 4; i++) assert_float_equal(p[i], ref_adamw[i], 2e-6);
  ks_statedict *sd;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  assert_int_equal(ks_test_save(ks_optimizer_stateful(o), sd, "state/optimizers/AdamW/", NULL), KS_OK);
  const ks_tensor *m = ks_statedict_tensor(sd, "state/optimizers/AdamW/state/0/exp_avg");
  assert_non_null(m);
  for (int i = 0; i < 4; i++) assert_float_equal(((float *)m->data)[i], ref_adamw_exp_avg[i], 1e-6);
  double step;
  assert_int_equal(ks__get_float(sd, "state/optimizers/AdamW/", "state/0/step", &step, NULL), KS_OK);
  assert_true(step == 3.0);
  double b2;
  assert_int_equal(ks__get_float(sd, "state/optimizers/AdamW/param_groups/0/", "betas/1", &b2, NULL), KS_OK);
  assert_true(b2 == 0.999);
  ks_statedict_free(sd);
  ks_optimizer_free(o);
}

/* torch 2.13's AdamW step bit for bit where rounding shows: a parameter near 0 after cancellation.
 * torch's addcdiv_ computes (-step_size * exp_avg) / denom (torch.optim.AdamW, lr 0.01,
 * weight_decay 0.01, one step from [0.01, -0.02] with gradients [0.5, -0.5]). */
static void adamw_step_is_torchs_bit_for_bit(void **s) {
  (void)s;
  float p[2] = {0.01f, -0.02f}, g[2] = {0.5f, -0.5f};
  const float want[2] = {-1.000240445137024e-06f, -0.009997999295592308f};
  int64_t shape[1] = {2};
  ks_adamw_opts ao = {0.01, 0.9, 0.999, 1e-8, 0.01};
  ks_optimizer *o;
  assert_int_equal(ks_optimizer_create_adamw(&ao, NULL, &o, NULL), KS_OK);
  assert_int_equal(ks_optimizer_add_param(o, p, g, 1, shape, NULL), KS_OK);
  ks_optimizer_step(o);
  assert_memory_equal(p, want, sizeof want);
  ks_optimizer_free(o);
}

static void sgd_nesterov_matches_torch(void **s) {
  (void)s;
  float p[4] = {0.5f, -1.25f, 2.0f, 0.0f}, g[4];
  int64_t shape[1] = {4};
  ks_optimizer *o;
  ks_sgd_opts so = {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = 1};
  assert_int_equal(ks_optimizer_create_sgd(&so, NULL, &o, NULL), KS_OK);
  assert_int_equal(ks_optimizer_add_param(o, p, g, 1, shape, NULL), KS_OK);
  run_three_steps(o, p, g);
  for (int i = 0; i < 4; i++) assert_float_equal(p[i], ref_sgd[i], 2e-6);
  assert_string_equal(ks_optimizer_name(o), "SGD");
  ks_optimizer_free(o);
}

/* Two optimizers, one restored from the other's state dict, then both stepped: bit-identical. */
static void optimizer_resumes_bit_identically(void **s) {
  (void)s;
  float p1[4] = {0.5f, -1.25f, 2.0f, 0.0f}, g1[4], p2[4], g2[4];
  int64_t shape[1] = {4};
  ks_adamw_opts ao = {0.01, 0.9, 0.999, 1e-8, 0.01};
  ks_optimizer *a, *b;
  assert_int_equal(ks_optimizer_create_adamw(&ao, NULL, &a, NULL), KS_OK);
  ks_adamw_opts other = {0.5, 0.5, 0.5, 1e-3, 0.0};
  assert_int_equal(ks_optimizer_create_adamw(&other, NULL, &b, NULL), KS_OK);
  assert_int_equal(ks_optimizer_add_param(a, p1, g1, 1, shape, NULL), KS_OK);
  assert_int_equal(ks_optimizer_add_param(b, p2, g2, 1, shape, NULL), KS_OK);
  run_three_steps(a, p1, g1);
  ks_statedict *sd;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  assert_int_equal(ks_test_save(ks_optimizer_stateful(a), sd, "o/", NULL), KS_OK);
  assert_int_equal(ks_test_load(ks_optimizer_stateful(b), sd, "o/", NULL), KS_OK);
  memcpy(p2, p1, sizeof p1);
  run_three_steps(a, p1, g1);
  run_three_steps(b, p2, g2);
  assert_memory_equal(p1, p2, sizeof p1);
  assert_true(ks_optimizer_lr(b) == 0.01);
  ks_statedict_free(sd);
  ks_optimizer_free(a);
  ks_optimizer_free(b);
}

/* The param_group fields in the order torch 2.13's state_dict() writes them (AdamW, then SGD). */
static void optimizer_groups_have_torch_fields_in_torch_order(void **s) {
  (void)s;
  static const char *const adamw[] = {"lr", "betas/0", "betas/1", "eps", "weight_decay", "amsgrad", "maximize",
                                      "foreach", "capturable", "differentiable", "fused", "decoupled_weight_decay",
                                      "params/0"};
  static const char *const sgd[] = {"lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize",
                                    "foreach", "differentiable", "fused", "params/0"};
  float p[4] = {0}, g[4] = {0};
  int64_t shape[1] = {4};
  ks_adamw_opts ao = {0.01, 0.9, 0.999, 1e-8, 0.01};
  ks_sgd_opts so = {0.1, 0.9, 0.0, 0.0, 0};
  ks_optimizer *o[2];
  assert_int_equal(ks_optimizer_create_adamw(&ao, NULL, &o[0], NULL), KS_OK);
  assert_int_equal(ks_optimizer_create_sgd(&so, NULL, &o[1], NULL), KS_OK);
  for (int k = 0; k < 2; k++) {
    const char *const *want = k ? sgd : adamw;
    size_t n = k ? sizeof sgd / sizeof *sgd : sizeof adamw / sizeof *adamw, j = 0;
    assert_int_equal(ks_optimizer_add_param(o[k], p, g, 1, shape, NULL), KS_OK);
    ks_statedict *sd;
    assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
    assert_int_equal(ks_test_save(ks_optimizer_stateful(o[k]), sd, "o/", NULL), KS_OK);
    ks_entry e;
    for (size_t i = 0; ks_statedict_at(sd, i, &e) == KS_OK; i++) {
      if (strncmp(e.name, "o/param_groups/0/", 17)) continue;
      assert_true(j < n);
      assert_string_equal(e.name + 17, want[j++]);
    }
    assert_int_equal(j, n);
    ks_entry f;
    assert_int_equal(ks_statedict_get(sd, "o/param_groups/0/fused", &f), KS_OK);
    assert_int_equal(f.kind, KS_VAL_NULL);
    ks_statedict_free(sd);
  }
  ks_optimizer_free(o[0]);
  ks_optimizer_free(o[1]);
}

/* A file written before the C optimizers wrote differentiable / fused / decoupled_weight_decay loads. */
static void optimizer_loads_groups_without_the_torch_2_fields(void **s) {
  (void)s;
  float p1[4] = {0.5f, -1.25f, 2.0f, 0.0f}, g1[4], p2[4] = {0}, g2[4];
  int64_t shape[1] = {4};
  ks_adamw_opts ao = {0.02, 0.9, 0.999, 1e-8, 0.01};
  ks_optimizer *a, *b;
  assert_int_equal(ks_optimizer_create_adamw(&ao, NULL, &a, NULL), KS_OK);
  assert_int_equal(ks_optimizer_create_adamw(&ao, NULL, &b, NULL), KS_OK);
  assert_int_equal(ks_optimizer_add_param(a, p1, g1, 1, shape, NULL), KS_OK);
  assert_int_equal(ks_optimizer_add_param(b, p2, g2, 1, shape, NULL), KS_OK);
  run_three_steps(a, p1, g1);
  ks_statedict *sd;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  assert_int_equal(ks_test_save(ks_optimizer_stateful(a), sd, "o/", NULL), KS_OK);
  static const char *const newer[] = {"o/param_groups/0/differentiable", "o/param_groups/0/fused",
                                      "o/param_groups/0/decoupled_weight_decay"};
  ks_entry e;
  for (size_t i = 0; i < 3; i++) {
    if (ks_statedict_remove(sd, newer[i])) {} /* absent from what an older C program wrote */
    assert_int_equal(ks_statedict_get(sd, newer[i], &e), KS_E_NOTFOUND);
  }
  assert_int_equal(ks_test_load(ks_optimizer_stateful(b), sd, "o/", NULL), KS_OK);
  memcpy(p2, p1, sizeof p1);
  run_three_steps(a, p1, g1);
  run_three_steps(b, p2, g2);
  assert_memory_equal(p1, p2, sizeof p1);
  ks_statedict_free(sd);
  ks_optimizer_free(a);
  ks_optimizer_free(b);
}

static void optimizer_load_rejects_shape_mismatch_unchanged(void **s) {
  (void)s;
  float p[4] = {1, 2, 3, 4}, g[4] = {1, 1, 1, 1}, q[3] = {0}, h[3] = {0};
  int64_t s4[1] = {4}, s3[1] = {3};
  ks_adamw_opts ao = {0.01, 0.9, 0.999, 1e-8, 0.01};
  ks_optimizer *a, *b;
  assert_int_equal(ks_optimizer_create_adamw(&ao, NULL, &a, NULL), KS_OK);
  assert_int_equal(ks_optimizer_create_adamw(&ao, NULL, &b, NULL), KS_OK);
  assert_int_equal(ks_optimizer_add_param(a, p, g, 1, s4, NULL), KS_OK);
  assert_int_equal(ks_optimizer_add_param(b, q, h, 1, s3, NULL), KS_OK);
  ks_optimizer_step(a);
  ks_statedict *sd;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  assert_int_equal(ks_test_save(ks_optimizer_stateful(a), sd, "o/", NULL), KS_OK);
  ks_error e;
  assert_int_equal(ks_test_load(ks_optimizer_stateful(b), sd, "o/", &e), KS_E_SHAPE);
  assert_string_equal(e.key, "o/state/0/exp_avg");
  ks_statedict *empty;
  assert_int_equal(ks_statedict_create(NULL, &empty, NULL), KS_OK);
  assert_int_equal(ks_test_save(ks_optimizer_stateful(b), empty, "o/", NULL), KS_OK);
  assert_null(ks_statedict_tensor(empty, "o/state/0/exp_avg")); /* still no state: nothing was written */
  ks_statedict_free(empty);
  ks_statedict_free(sd);
  ks_optimizer_free(a);
  ks_optimizer_free(b);
}

static void optimizer_state_dict_survives_every_allocation_failure(void **s) {
  (void)s;
  float p[4] = {1, 2, 3, 4}, g[4] = {1, 1, 1, 1};
  int64_t s4[1] = {4};
  for (long n = 1;; n++) {
    ks_test_alloc ta;
    ks_test_alloc_init(&ta, n);
    ks_optimizer *o = NULL;
    ks_adamw_opts ao = {0.01, 0.9, 0.999, 1e-8, 0.01};
    ks_status st = ks_optimizer_create_adamw(&ao, &ta.a, &o, NULL);
    if (!st) st = ks_optimizer_add_param(o, p, g, 1, s4, NULL);
    if (!st) ks_optimizer_step(o);
    ks_statedict *sd = NULL;
    if (!st) st = ks_statedict_create(&ta.a, &sd, NULL);
    if (!st) st = ks_test_save(ks_optimizer_stateful(o), sd, "o/", NULL);
    ks_statedict_free(sd);
    ks_optimizer_free(o);
    assert_int_equal(ta.live, 0);
    if (st == KS_OK) break;
    assert_int_equal(st, KS_E_NOMEM);
  }
}

static void scheduler_warms_up_then_decays_by_cosine(void **s) {
  (void)s;
  ks_scheduler sc;
  ks_scheduler_init(&sc, NULL, 1.0, 10, 110, 0.0);
  assert_true(sc.last_lr == 0.0);
  assert_float_equal(ks_scheduler_lr_at(&sc, 5), 0.5, 1e-12);
  assert_float_equal(ks_scheduler_lr_at(&sc, 10), 1.0, 1e-12);
  assert_float_equal(ks_scheduler_lr_at(&sc, 60), 0.5, 1e-12);
  assert_float_equal(ks_scheduler_lr_at(&sc, 110), 0.0, 1e-12);
  ks_scheduler_step(&sc, NULL);
  assert_int_equal(sc.last_epoch, 1);
  ks_statedict *sd;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  assert_int_equal(ks_test_save(ks_scheduler_stateful(&sc), sd, "s/", NULL), KS_OK);
  ks_scheduler other;
  ks_scheduler_init(&other, NULL, 3.0, 1, 2, 0.5);
  assert_int_equal(ks_test_load(ks_scheduler_stateful(&other), sd, "s/", NULL), KS_OK);
  assert_memory_equal(&other, &sc, sizeof sc);
  ks_statedict_free(sd);
}

static void timestamp_counts_and_round_trips_without_wct(void **s) {
  (void)s;
  ks_timestamp ts;
  ks_timestamp_init(&ts);
  ks_timestamp_batch_done(&ts, 32, 0, 0.25);
  ks_timestamp_batch_done(&ts, 16, 0, 0.25);
  ks_timestamp_epoch_done(&ts);
  ks_timestamp_batch_done(&ts, 32, 0, 0.5);
  assert_int_equal(ts.batch, 3);
  assert_int_equal(ts.sample, 80);
  assert_int_equal(ts.epoch, 1);
  assert_int_equal(ts.batch_in_epoch, 1);
  assert_true(ts.total_wct == 1.0 && ts.epoch_wct == 0.5);
  ks_statedict *sd;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  assert_int_equal(ks_test_save(ks_timestamp_stateful(&ts), sd, "t/", NULL), KS_OK);
  assert_int_equal(ks_statedict_remove(sd, "t/total_wct"), KS_OK); /* as if ignored by '*_wct' */
  ks_timestamp back;
  ks_timestamp_init(&back);
  back.total_wct = 9.0;
  assert_int_equal(ks_test_load(ks_timestamp_stateful(&back), sd, "t/", NULL), KS_OK);
  assert_int_equal(back.sample, 80);
  assert_true(back.total_wct == 9.0 && back.epoch_wct == 0.5);
  ks_statedict_free(sd);
}

static void ignore_glob_matches_slash_prefixes(void **s) {
  (void)s;
  const char *g1[] = {"rng"};
  assert_true(ks__path_ignored(g1, 1, "rng/0/xoshiro256starstar"));
  assert_false(ks__path_ignored(g1, 1, "rngx/0"));
  const char *g2[] = {"state/optimizers/*"};
  assert_true(ks__path_ignored(g2, 1, "state/optimizers/AdamW/state/0/exp_avg"));
  assert_false(ks__path_ignored(g2, 1, "state/model/fc1.weight"));
  const char *g3[] = {"*_wct"};
  assert_true(ks__path_ignored(g3, 1, "state/timestamp/Timestamp/total_wct"));
  assert_false(ks__path_ignored(g3, 1, "state/timestamp/Timestamp/batch"));
}

static void load_report_counts_and_survives_allocation_failure(void **s) {
  (void)s;
  for (long n = 1;; n++) {
    ks_test_alloc ta;
    ks_test_alloc_init(&ta, n);
    ks_load_report *r = NULL;
    ks_status st = ks_load_report_create(&ta.a, &r, NULL);
    size_t added = 0;
    for (int i = 0; i < 20 && !st; i++) {
      st = ks_load_report_add(r, (ks_load_kind)(i % 6), "state/x", "why", NULL);
      added += st == KS_OK;
    }
    if (r) assert_int_equal(ks_load_report_count(r, KS_LOAD_ANY), added); /* a failed add changes nothing */
    if (!st) {
      assert_int_equal(ks_load_report_count(r, KS_LOAD_MISMATCHED), 3);
      assert_int_equal(ks_load_report_count(r, KS_LOAD_LOADED), 4);
      /* KS_LOAD_ANY counts; it, or any other number, is no kind of item. */
      ks_error e;
      assert_int_equal(ks_load_report_add(r, KS_LOAD_ANY, "state/x", "why", &e), KS_E_INVALID);
      assert_int_equal(ks_load_report_add(r, (ks_load_kind)6, "state/x", "why", &e), KS_E_INVALID);
      assert_int_equal(ks_load_report_count(r, KS_LOAD_ANY), 20);
      assert_int_equal(ks_load_report_count(NULL, KS_LOAD_ANY), 0);
      assert_non_null(ks_load_report_find(r, "state/x"));
      assert_null(ks_load_report_find(r, "state/y"));
    }
    ks_load_report_free(r);
    assert_int_equal(ta.live, 0);
    if (st == KS_OK) break;
    assert_int_equal(st, KS_E_NOMEM);
  }
}

/* Many components and report items: found by key, duplicates refused, first report item wins. */
static void registry_and_report_find_by_key_at_scale(void **s) {
  (void)s;
  ks_state *st;
  assert_int_equal(ks_state_create("r", 1, NULL, &st, NULL), KS_OK);
  static float data[5000];
  int64_t one = 1;
  char name[64];
  for (int i = 0; i < 5000; i++) {
    ks_tensor t;
    assert_int_equal(ks_tensor_init(&t, KS_F32, 1, &one, &data[i]), KS_OK);
    snprintf(name, sizeof name, "layer%d/w", i);
    assert_int_equal(ks_state_add_tensor(st, name, &t, NULL), KS_OK);
  }
  ks_tensor t;
  assert_int_equal(ks_tensor_init(&t, KS_F32, 1, &one, &data[0]), KS_OK);
  assert_int_equal(ks_state_add_tensor(st, "layer4999/w", &t, NULL), KS_E_EXISTS);
  assert_int_equal(ks_state_add_tensor(st, "layer0/w", &t, NULL), KS_E_EXISTS);
  ks_dataset_state ds = {0, 0, 0};
  /* Same name, another kind: a different key, so allowed. */
  assert_int_equal(ks_state_add_dataset(st, "layer0", &ds, NULL), KS_OK);
  assert_int_equal(ks_state_add_dataset(st, "layer0", &ds, NULL), KS_E_EXISTS);
  assert_non_null(ks__comp_find(st, "state/model/layer2500/w"));
  assert_non_null(ks__comp_find(st, "state/dataset_state/layer0/"));
  assert_null(ks__comp_find(st, "state/model/layer5000/w"));
  ks_state_free(st);

  ks_load_report *r;
  assert_int_equal(ks_load_report_create(NULL, &r, NULL), KS_OK);
  for (int i = 0; i < 3000; i++) {
    snprintf(name, sizeof name, "state/c%d", i % 1000);
    assert_int_equal(ks_load_report_add(r, (ks_load_kind)(i / 1000), name, "why", NULL), KS_OK);
  }
  const ks_load_item *it = ks_load_report_find(r, "state/c999");
  assert_non_null(it);
  assert_int_equal(it->kind, KS_LOAD_LOADED); /* the first of the three */
  assert_null(ks_load_report_find(r, "state/c1000"));
  ks__load_report_clear(r);
  assert_null(ks_load_report_find(r, "state/c0"));
  assert_int_equal(ks_load_report_add(r, KS_LOAD_SKIPPED, "state/c0", "again", NULL), KS_OK);
  assert_int_equal(ks_load_report_find(r, "state/c0")->kind, KS_LOAD_SKIPPED);
  ks_load_report_free(r);
}

/* The prefix set answers like a scan of every key, at every depth. */
static void prefix_set_matches_a_scan(void **s) {
  (void)s;
  ks_statedict *sd;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_int(sd, "state/optimizers/AdamW/state/0/step", 1, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_int(sd, "state/schedulers/Cos/last_epoch", 1, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_int(sd, "rng/0/x", 1, NULL), KS_OK);
  assert_int_equal(ks_statedict_set_int(sd, "state/optimizers/SGD/x", 1, NULL), KS_OK);
  ks__prefixes *p;
  assert_int_equal(ks__prefixes_create(NULL, sd, &p), KS_OK);
  static const char *const yes[] = {"state/", "rng/0/", "state/optimizers/AdamW/", "state/optimizers/SGD/",
                                    "state/optimizers/AdamW/state/0/", "state/schedulers/Cos/"};
  static const char *const no[] = {"state/optimizers/Adam/", "rng/1/", "state/schedulers/Cos/last_epoch/",
                                   "rn/", "state/optimizers/AdamW/state/1/"};
  int found;
  for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++) {
    assert_int_equal(ks__prefixes_has(p, yes[i], &found), KS_OK);
    assert_true(found);
  }
  for (size_t i = 0; i < sizeof no / sizeof no[0]; i++) {
    assert_int_equal(ks__prefixes_has(p, no[i], &found), KS_OK);
    assert_false(found);
  }
  assert_int_equal(ks__prefixes_has(p, "state", &found), KS_E_INVALID);
  ks__prefixes_free(p);
  ks_statedict_free(sd);
}


/* ks_state_key names each part as layout.h spells it (the keys ks_state_save writes for a C
 * program and the Python package asks for), and refuses what a part does not take. */
static void state_key_names_every_part_as_layout_h(void **s) {
  (void)s;
  static const struct {
    ks_state_part part;
    const char *base, *name, *want;
  } cases[] = {
      {KS_PART_MODEL, NULL, "fc.weight", KS_KEY_MODEL "fc.weight"},
      {KS_PART_MODEL, NULL, NULL, "state/model"},
      {KS_PART_OPTIMIZER, NULL, "AdamW", KS_KEY_OPTIMIZERS "AdamW"},
      {KS_PART_SCHEDULER, NULL, "StepLR", KS_KEY_SCHEDULERS "StepLR"},
      {KS_PART_CALLBACK, NULL, "EarlyStop", KS_KEY_CALLBACKS "EarlyStop"},
      {KS_PART_DATASET_STATE, NULL, "train", KS_KEY_DATASET_STATE "train"},
      {KS_PART_RNG, NULL, "0", KS_KEY_RNG "0"},
      {KS_PART_TIMESTAMP, NULL, "epoch", KS_KEY_TIMESTAMP "epoch"},
      {KS_PART_TRAIN_METRIC, NULL, "acc/top1", KS_KEY_TRAIN_METRICS "acc/top1"},
      {KS_PART_EVAL_METRIC, "val", "mse", KS_KEY_EVAL_METRICS "val/mse"},
      {KS_PART_EVAL_METRIC, NULL, NULL, "state/eval_metrics"},
      {KS_PART_EXTRA, NULL, NULL, KS_KEY_EXTRA},
      {KS_PART_RANK_ZERO_SEED, NULL, NULL, KS_KEY_RANK_ZERO_SEED},
      {KS_PART_RUN_NAME, NULL, NULL, KS_KEY_RUN_NAME},
      {KS_PART_METRIC_STATE, "p/m", "tp", "p/m/" KS_KEY_METRIC_STATES "tp"},
      {KS_PART_METRIC_COMPUTED, "p/m", NULL, "p/m/" KS_KEY_METRIC_COMPUTED},
      {KS_PART_METRIC_ATTR, "p/m", "min_val", "p/m/" KS_KEY_METRIC_ATTRS "min_val"},
      {KS_PART_METRIC_INNER, "p/m", "_base_metric", "p/m/" KS_KEY_METRIC_INNER "_base_metric"},
      {KS_PART_METRIC_UPDATE_COUNT, "p/m/inner/b", NULL, "p/m/inner/b/" KS_KEY_METRIC_UPDATE_COUNT},
      {KS_PART_LIGHTNING, NULL, "epoch", "lightning/epoch"},
  };
  char buf[KS_MAX_NAME + 1];
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    assert_int_equal(ks_state_key(cases[i].part, cases[i].base, cases[i].name, buf, sizeof buf, NULL), KS_OK);
    assert_string_equal(buf, cases[i].want);
  }
  ks_error err;
  assert_int_equal(ks_state_key(KS_PART_COUNT_, NULL, "x", buf, sizeof buf, &err), KS_E_INVALID);
  assert_int_equal(ks_state_key((ks_state_part)-1, NULL, "x", buf, sizeof buf, &err), KS_E_INVALID);
  assert_int_equal(ks_state_key(KS_PART_METRIC_STATE, NULL, "tp", buf, sizeof buf, &err), KS_E_INVALID);
  assert_int_equal(ks_state_key(KS_PART_MODEL, "b", "w", buf, sizeof buf, &err), KS_E_INVALID);
  assert_int_equal(ks_state_key(KS_PART_RUN_NAME, NULL, "x", buf, sizeof buf, &err), KS_E_INVALID);
  assert_int_equal(ks_state_key(KS_PART_MODEL, NULL, "w", buf, 0, &err), KS_E_INVALID);
  assert_int_equal(ks_state_key(KS_PART_MODEL, NULL, "weight", buf, 10, &err), KS_E_LIMIT);
  assert_string_equal(buf, "");
  char long_name[KS_MAX_NAME + 1];
  memset(long_name, 'a', KS_MAX_NAME);
  long_name[KS_MAX_NAME] = '\0';
  char big[2 * KS_MAX_NAME];
  assert_int_equal(ks_state_key(KS_PART_MODEL, NULL, long_name, big, sizeof big, &err), KS_E_LIMIT);
  assert_string_equal(ks_layout_record(KS_META_STATE), "{\"layout_version\":1}");
  assert_string_equal(ks_layout_record(KS_META_LIGHTNING), "{\"layout_version\": 1}");
  assert_null(ks_layout_record(KS_META_METRICS));
  assert_null(ks_layout_record(NULL));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(registry_and_report_find_by_key_at_scale),
      cmocka_unit_test(prefix_set_matches_a_scan),
      cmocka_unit_test(rng_same_seed_same_stream_and_state_round_trips),
      cmocka_unit_test(rng_below_and_shuffle_stay_in_range),
      cmocka_unit_test(rng_load_rejects_wrong_shape_and_zero_state),
      cmocka_unit_test(adamw_matches_torch),
      cmocka_unit_test(adamw_step_is_torchs_bit_for_bit),
      cmocka_unit_test(sgd_nesterov_matches_torch),
      cmocka_unit_test(optimizer_resumes_bit_identically),
      cmocka_unit_test(optimizer_groups_have_torch_fields_in_torch_order),
      cmocka_unit_test(optimizer_loads_groups_without_the_torch_2_fields),
      cmocka_unit_test(optimizer_load_rejects_shape_mismatch_unchanged),
      cmocka_unit_test(optimizer_state_dict_survives_every_allocation_failure),
      cmocka_unit_test(scheduler_warms_up_then_decays_by_cosine),
      cmocka_unit_test(timestamp_counts_and_round_trips_without_wct),
      cmocka_unit_test(ignore_glob_matches_slash_prefixes),
      cmocka_unit_test(load_report_counts_and_survives_allocation_failure),
      cmocka_unit_test(state_key_names_every_part_as_layout_h),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
