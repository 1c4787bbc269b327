/*
 * Flattening the state into Composer's layout, and the metric metadata:
 *   state/model/<param>                 state/optimizers/<name>/...
 *   state/schedulers/<name>/...         state/timestamp/Timestamp/<field>
 *   state/dataset_state/<name>/...      state/callbacks/<name>/...
 *   state/train_metrics/<M>/state_dict/<s>, state/train_metrics/<M>/_computed
 *   state/eval_metrics/<label>/<M>/...  state/rank_zero_seed, state/run_name
 *   rng/0/xoshiro256starstar, or a component's rng/<name>/... (KS_ROOT_RNG), last
 */
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "state/state_internal.h"

static KS_NODISCARD ks_status save_with(ks_stateful cb, ks_statedict *dst, const char *p, ks_error *err) {
  return cb.to_state_dict(cb.ctx, dst, p, err);
}

static KS_NODISCARD ks_status put_component(const st_comp *c, ks_statedict *dst, ks_error *err) {
  char p[KS__KEY_MAX + 1];
  if (ks__comp_prefix(c, p)) return ks__err(err, KS_E_LIMIT, "component name too long: %s", c->name);
  switch (c->kind) {
  case ST_TENSOR: return ks_statedict_set_tensor(dst, p, &c->t, KS_BORROW, err);
  case ST_OPTIM: return save_with(ks_optimizer_stateful(c->obj), dst, p, err);
  case ST_SCHED: return save_with(ks_scheduler_stateful(c->obj), dst, p, err);
  case ST_CUSTOM: return c->cb.to_state_dict(c->cb.ctx, dst, p, err);
  case ST_DATASET: {
    const ks_dataset_state *ds = c->obj;
    ks_status s = ks__put_int(dst, p, "epoch", ds->epoch, err);
    if (!s) s = ks__put_int(dst, p, "sample_in_epoch", ds->sample_in_epoch, err);
    if (!s) s = ks__put_int(dst, p, "shuffle_seed", ds->shuffle_seed, err);
    return s;
  }
  }
  return KS_E_INVALID;
}

static int is_rng(const st_comp *c) { return c->kind == ST_CUSTOM && c->root == KS_ROOT_RNG; }

/* The components of one kind; `rng` selects the custom ones under rng/ (saved last, as the built-in
 * generator is) or every other one. */
static KS_NODISCARD ks_status put_kind(const ks_state *st, st_kind kind, int rng, ks_statedict *dst, ks_error *err) {
  for (size_t i = 0; i < st->n_comps; i++) {
    if (st->comps[i].kind != kind || is_rng(&st->comps[i]) != rng) continue;
    ks_status s = put_component(&st->comps[i], dst, err);
    if (s) return s;
  }
  return KS_OK;
}

/* The metric's canonical arguments as a JSON value (an empty object if they do not parse). */
static ks__jv *metric_args(const ks_allocator *a, const ks_metric *m) {
  const char *txt = ks_metric_args_json(m);
  ks__jv *args = NULL;
  ks_status s = txt ? ks__jv_parse(a, txt, strlen(txt), "args", &args, NULL) : KS_E_FORMAT;
  if (s == KS_E_NOMEM) return NULL;
  return s ? ks__jv_object(a) : args;
}

/* The names of m's list ("cat") states, or NULL (none, or out of memory: *s says which). A reader
 * needs no metric catalogue to hand torchmetrics its lists back (FORMAT.md §10). */
static ks__jv *list_states(const ks_allocator *a, const ks_metric *m, ks_status *s) {
  ks__jv *lists = NULL;
  for (size_t i = 0; !*s && i < ks_metric_state_count(m); i++) {
    const char *name;
    ks_reduce r;
    if (ks_metric_state_info(m, i, &name, &r, NULL) || r != KS_REDUCE_CAT) continue;
    if (!lists && !(lists = ks__jv_array(a))) *s = KS_E_NOMEM;
    if (!*s) *s = ks__jv_push(a, lists, ks__jv_str(a, name));
  }
  if (*s) ks__jv_free(a, lists), lists = NULL;
  return lists;
}

/* {name: class} of a wrapper's inner metrics (a load refuses a wrapper around other classes). */
static ks__jv *inner_classes(const ks_allocator *a, const ks_metric *m) {
  ks__jv *o = ks__jv_object(a);
  for (size_t i = 0; o && i < ks_metric_inner_count(m); i++) {
    const char *name;
    const ks_metric *in = ks_metric_inner_at(m, i, &name);
    if (ks__jv_set(a, o, name, ks__jv_str(a, ks_metric_class(in)))) {
      ks__jv_free(a, o);
      return NULL;
    }
  }
  return o;
}

/* mj[path] = {"class":..., "args":{...}, "schema_version":N, "update_count":N[, "lists":[...]]} */
static KS_NODISCARD ks_status put_metric_json(const ks_allocator *a, const ks_metric *m, const char *path, ks__jv *mj) {
  ks__jv *one = ks__jv_object(a);
  ks_status s = one ? KS_OK : KS_E_NOMEM;
  if (!s) s = ks__jv_set(a, one, "class", ks__jv_str(a, ks_metric_class(m)));
  /* A wrapper's record names its inner metrics' classes and no arguments, as a binding's does. */
  if (!s && !ks_metric_inner_count(m)) s = ks__jv_set(a, one, "args", metric_args(a, m));
  if (!s && ks_metric_inner_count(m)) s = ks__jv_set(a, one, "inner", inner_classes(a, m));
  if (!s) s = ks__jv_set(a, one, "schema_version", ks__jv_int(a, KS_METRIC_SCHEMA_VERSION));
  if (!s) s = ks__jv_set(a, one, "update_count", ks__jv_int(a, ks_metric_update_count(m)));
  ks__jv *lists = s ? NULL : list_states(a, m, &s);
  if (lists) s = ks__jv_set(a, one, "lists", lists);
  if (s) {
    ks__jv_free(a, one);
    return s;
  }
  return ks__jv_set(a, mj, path, one);
}

/* A wrapper's attributes (MinMaxMetric's max_val, min_val) under <path>/attrs/, in declared order. */
static KS_NODISCARD ks_status put_attrs(const ks_metric *m, const char *path, ks_statedict *dst, ks_error *err) {
  const char *name;
  unsigned flags;
  ks_tensor v;
  for (size_t i = 0; ks_metric_attr_at(m, i, &name, &flags, &v) == KS_OK; i++) {
    char k[KS__KEY_MAX + 1];
    ks_status s = ks_state_key(KS_PART_METRIC_ATTR, path, name, k, sizeof k, err);
    if (s) return s;
    if (!v.data) continue; /* a value no load staged: the class holds none to save */
    s = (flags & KS_ATTR_INT) ? ks_statedict_set_int(dst, k, *(const int64_t *)v.data, err)
                              : ks_statedict_set_tensor(dst, k, &v, KS_COPY, err);
    if (s) return s;
  }
  return KS_OK;
}

/* One metric's parts: states, _computed, attributes, then each inner metric's with its update count
 * (the order a binding writes them in, so both files list the same keys in the same order). */
static KS_NODISCARD ks_status put_parts(const ks_metric *m, const char *path, ks_statedict *dst, ks_error *err) {
  char k[KS__KEY_MAX + 1];
  ks_status s = ks_state_key(KS_PART_METRIC_STATE, path, NULL, k, sizeof k - 1, err);
  if (!s) strcat(k, "/"); /* the states' prefix */
  if (!s) s = ks_metric_to_state_dict(m, dst, k, err);
  if (!s) s = ks_state_key(KS_PART_METRIC_COMPUTED, path, NULL, k, sizeof k, err);
  if (s) return s;
  const ks_tensor *c = ks_metric_computed(m);
  s = c ? ks_statedict_set_tensor(dst, k, c, KS_COPY, err) : ks_statedict_set_null(dst, k, err);
  if (!s) s = put_attrs(m, path, dst, err);
  for (size_t i = 0; !s && i < ks_metric_inner_count(m); i++) {
    const char *name;
    const ks_metric *in = ks_metric_inner_at(m, i, &name);
    char ipath[KS__KEY_MAX + 1];
    s = ks_state_key(KS_PART_METRIC_INNER, path, name, ipath, sizeof ipath, err);
    if (!s) s = put_parts(in, ipath, dst, err);
    if (!s) s = ks_state_key(KS_PART_METRIC_UPDATE_COUNT, ipath, NULL, k, sizeof k, err);
    if (!s) s = ks_statedict_set_int(dst, k, ks_metric_update_count(in), err);
  }
  return s;
}

static KS_NODISCARD ks_status put_metric(const ks_metric *m, const char *path, ks_statedict *dst, ks__jv *mj,
                                         ks_error *err) {
  ks_status s = put_parts(m, path, dst, err);
  if (s) return s;
  s = put_metric_json(ks__statedict_allocator(dst), m, path, mj);
  return s ? ks__err(err, s, "out of memory") : KS_OK;
}

/* The metrics of one group (`part`: train or eval with its label) under the keys ks_state_key gives. */
static KS_NODISCARD ks_status put_collection(const ks_metric_collection *c, ks_state_part part, const char *label,
                                             ks_statedict *dst, ks__jv *mj, ks_error *err) {
  for (size_t i = 0; c && i < ks_metric_collection_count(c); i++) {
    const char *name;
    const ks_metric *m = ks_metric_collection_at(c, i, &name);
    char path[KS__KEY_MAX + 1];
    ks_status s = ks_state_key(part, label, name, path, sizeof path, err);
    if (!s) s = put_metric(m, path, dst, mj, err);
    if (s) return s;
  }
  return KS_OK;
}

static KS_NODISCARD ks_status put_metrics(const ks_state *st, ks_statedict *dst, ks__jv *mj, ks_error *err) {
  ks_status s = put_collection(st->train, KS_PART_TRAIN_METRIC, NULL, dst, mj, err);
  for (size_t i = 0; i < st->n_evals && !s; i++)
    s = put_collection(st->evals[i].metrics, KS_PART_EVAL_METRIC, st->evals[i].label, dst, mj, err);
  return s;
}

static KS_NODISCARD ks_status put_rest(const ks_state *st, ks_statedict *dst) {
  ks_status s = ks_statedict_set_int(dst, KS_KEY_RANK_ZERO_SEED, st->rank_zero_seed, NULL);
  if (!s) s = ks_statedict_set_string(dst, KS_KEY_RUN_NAME, st->run_name, NULL);
  if (!s && st->rng) s = save_with(ks_rng_stateful(st->rng), dst, KS_KEY_RNG "0/", NULL);
  return s;
}

/* The records in the order the Python package sets them (structure, layout, metrics), so that both
 * headers are the same text. */
static KS_NODISCARD ks_status put_meta(const ks_state *st, const ks_statedict *dst, ks__jv *mj, ks_meta *meta,
                                       ks_error *err) {
  const ks_allocator *a = ks__statedict_allocator(dst);
  ks_status s = ks__state_structure(st, dst, meta, err);
  if (s) return s;
  char *metrics = ks__jv_dump(a, mj, true);
  if (!metrics) return ks__err(err, KS_E_NOMEM, "out of memory");
  s = ks_meta_set(meta, KS_META_STATE, ks_layout_record(KS_META_STATE), err);
  if (!s) s = ks_meta_set(meta, KS_META_METRICS, metrics, err);
  ks__free(a, metrics);
  return s ? ks__err(err, s, "cannot set state metadata") : KS_OK;
}

ks_status ks_state_to_state_dict(const ks_state *st, ks_statedict *dst, ks_meta *meta, ks_error *err) {
  if (!st || !dst) return ks__err(err, KS_E_INVALID, "to_state_dict: NULL argument");
  ks_error_clear(err);
  static const st_kind order[] = {ST_TENSOR, ST_OPTIM, ST_SCHED};
  ks_status s = KS_OK;
  for (size_t i = 0; i < 3 && !s; i++) s = put_kind(st, order[i], 0, dst, err);
  if (!s && st->ts) s = save_with(ks_timestamp_stateful(st->ts), dst, KS_KEY_TIMESTAMP, err);
  if (!s) s = put_kind(st, ST_DATASET, 0, dst, err);
  if (!s) s = put_kind(st, ST_CUSTOM, 0, dst, err);
  const ks_allocator *a = ks__statedict_allocator(dst);
  ks__jv *mj = ks__jv_object(a);
  if (!mj) s = s ? s : KS_E_NOMEM;
  if (!s) s = put_metrics(st, dst, mj, err);
  if (!s) s = put_rest(st, dst);
  if (!s) s = put_kind(st, ST_CUSTOM, 1, dst, err);
  if (!s && meta) s = put_meta(st, dst, mj, meta, err);
  ks__jv_free(a, mj);
  if (s && err && err->code == KS_OK) ks__err(err, s, "cannot flatten the training state");
  return s;
}

ks_status ks_state_save(const ks_state *st, const char *path, const ks_save_opts *opts, ks_error *err) {
  if (!st || !path) return ks__err(err, KS_E_INVALID, "save: NULL argument");
  KS__TAKE_OPTS(ks_save_opts, opts, KS__V1_SIZE(ks_save_opts, io), err);
  ks_statedict *sd = NULL;
  ks_meta *meta = NULL;
  ks_status s = ks_statedict_create(&st->alloc, &sd, err);
  if (!s) s = ks_meta_create(&st->alloc, &meta, err);
  if (s) s = ks__err(err, s, "out of memory");
  if (!s) s = ks_state_to_state_dict(st, sd, meta, err);
  if (!s) s = ks_save(path, sd, meta, opts, err);
  ks_meta_free(meta);
  ks_statedict_free(sd);
  return s;
}
