/*
 * The training-state object: a registry of the program's components under
 * fixed names. Components are borrowed; only metric collections built through
 * the program's factory are owned.
 */
#include <string.h>

#include "state/state_internal.h"

ks_status ks_state_create(const char *run_name, int64_t rank_zero_seed, const ks_allocator *alloc,
                          ks_state **out, ks_error *err) {
  if (!out) return ks__err(err, KS_E_INVALID, "ks_state_create: NULL out");
  ks_state *st = ks__calloc(alloc, 1, sizeof *st);
  if (!st) return ks__err(err, KS_E_NOMEM, "out of memory for a state");
  st->alloc = *ks__alloc_or_default(alloc);
  st->run_name = ks__strdup(&st->alloc, run_name ? run_name : "");
  if (!st->run_name) {
    ks__free(&st->alloc, st);
    return ks__err(err, KS_E_NOMEM, "out of memory for the run name");
  }
  st->rank_zero_seed = rank_zero_seed;
  *out = st;
  return KS_OK;
}

static void free_metrics(ks_state *st) {
  ks_metric_collection_free(st->train);
  for (size_t i = 0; i < st->n_evals; i++) {
    ks__free(&st->alloc, st->evals[i].label);
    ks_metric_collection_free(st->evals[i].metrics);
  }
  ks__free(&st->alloc, st->evals);
  st->train = NULL;
  st->evals = NULL;
  st->n_evals = 0;
}

void ks_state_free(ks_state *st) {
  if (!st) return;
  for (size_t i = 0; i < st->n_comps; i++) {
    ks__free(&st->alloc, st->comps[i].name);
    ks__free(&st->alloc, st->comps[i].key);
  }
  ks__free(&st->alloc, st->comps);
  ks__hindex_free(&st->comp_index, &st->alloc);
  free_metrics(st);
  ks__free(&st->alloc, st->run_name);
  ks__free(&st->alloc, st);
}

/* A name becomes one path segment of every key below it, so '/' would split it. Its length is
   KS_MAX_NAME's business (ks__name_check), and the keys built from it are checked whole. */
static int valid_name(const char *name) { return !strchr(name, '/'); }

static uint64_t comp_hash(const void *ctx, size_t i) { return ((const ks_state *)ctx)->comps[i].hash; }

static const char *comp_key(const void *ctx, size_t i, size_t *len) {
  const st_comp *c = &((const ks_state *)ctx)->comps[i];
  *len = c->key_len;
  return c->key;
}

static const ks__hindex_ops comp_ops = {comp_hash, comp_key};

static long find_key(const ks_state *st, const char *key, size_t len, uint64_t h) {
  return ks__hindex_find(&st->comp_index, key, len, h, &comp_ops, st);
}

const st_comp *ks__comp_find(const ks_state *st, const char *key) {
  size_t n = strlen(key);
  long i = find_key(st, key, n, ks__hash(key, n));
  return i < 0 ? NULL : &st->comps[i];
}

/* Model tensor names may contain '/' (nested modules) but no empty segments. */
static int valid_tensor_name(const char *name) {
  size_t n = strlen(name);
  return name[0] != '/' && name[n - 1] != '/' && !strstr(name, "//");
}

static KS_NODISCARD ks_status add_comp(ks_state *st, const st_comp *c, ks_error *err) {
  if (!st) return ks__err_at(err, KS_E_INVALID, NULL, c->name, -1, "NULL state");
  ks_status s = ks__name_check(c->name, err);
  if (s) return s;
  if (c->kind == ST_TENSOR ? !valid_tensor_name(c->name) : !valid_name(c->name))
    return ks__err_at(err, KS_E_INVALID, NULL, c->name, -1,
                      c->kind == ST_TENSOR ? "tensor name '%.200s' has an empty path segment"
                                           : "component name '%.200s' contains '/'",
                      c->name);
  char key[KS__KEY_MAX + 1];
  if (ks__comp_prefix(c, key))
    return ks__err_at(err, KS_E_LIMIT, NULL, c->name, -1,
                      "the keys of '%.200s' would be longer than %d bytes (KS_MAX_NAME)", c->name, KS_MAX_NAME);
  st_comp copy = *c;
  copy.key_len = strlen(key);
  copy.hash = ks__hash(key, copy.key_len);
  if (find_key(st, key, copy.key_len, copy.hash) >= 0)
    return ks__err_at(err, KS_E_EXISTS, NULL, key, -1, "'%.200s' is already registered", c->name);
  s = ks__grow(&st->alloc, &st->comps, &st->cap_comps, st->n_comps + 1, sizeof *st->comps);
  if (!s) s = ks__hindex_reserve(&st->comp_index, &st->alloc, st->n_comps + 1, st->n_comps, &comp_ops, st);
  if (s) return ks__err_at(err, s, NULL, c->name, -1, "cannot register '%.200s': %s", c->name, ks_strerror(s));
  copy.name = ks__strdup(&st->alloc, c->name);
  copy.key = ks__strdup(&st->alloc, key);
  if (!copy.name || !copy.key) {
    ks__free(&st->alloc, copy.name);
    ks__free(&st->alloc, copy.key);
    return ks__err_at(err, KS_E_NOMEM, NULL, c->name, -1, "out of memory registering '%.200s'", c->name);
  }
  st->comps[st->n_comps] = copy;
  ks__hindex_insert(&st->comp_index, st->n_comps++, copy.hash);
  return KS_OK;
}

ks_status ks_state_add_tensor(ks_state *st, const char *name, const ks_tensor *t, ks_error *err) {
  if (!t || (t->nbytes > 0 && !t->data))
    return ks__err_at(err, KS_E_INVALID, NULL, name, -1, "tensor '%.200s' is NULL or has no data", name ? name : "");
  st_comp c = {.kind = ST_TENSOR, .name = (char *)name, .t = *t};
  c.t.ownership = KS_BORROWED;
  return add_comp(st, &c, err);
}

ks_status ks_state_add_optimizer(ks_state *st, const char *name, ks_optimizer *opt, ks_error *err) {
  if (!opt) return ks__err_at(err, KS_E_INVALID, NULL, name, -1, "NULL optimizer");
  return add_comp(st, &(st_comp){.kind = ST_OPTIM, .name = (char *)name, .obj = opt}, err);
}

ks_status ks_state_add_scheduler(ks_state *st, const char *name, ks_scheduler *sched, ks_error *err) {
  if (!sched) return ks__err_at(err, KS_E_INVALID, NULL, name, -1, "NULL scheduler");
  return add_comp(st, &(st_comp){.kind = ST_SCHED, .name = (char *)name, .obj = sched}, err);
}

ks_status ks_state_add_component(ks_state *st, ks_state_root root, const char *name, const ks_stateful *cb,
                                 ks_error *err) {
  if (!cb || !cb->to_state_dict || !cb->load_state_dict)
    return ks__err_at(err, KS_E_INVALID, NULL, name, -1, "stateful callbacks missing (both are required)");
  if (root < KS_ROOT_OPTIMIZERS || root > KS_ROOT_RNG)
    return ks__err_at(err, KS_E_INVALID, NULL, name, -1, "unknown component root %d", (int)root);
  return add_comp(st, &(st_comp){.kind = ST_CUSTOM, .name = (char *)name, .cb = *cb, .root = (int)root}, err);
}

ks_status ks_state_add_dataset(ks_state *st, const char *name, ks_dataset_state *ds, ks_error *err) {
  if (!ds) return ks__err_at(err, KS_E_INVALID, NULL, name, -1, "NULL dataset state");
  return add_comp(st, &(st_comp){.kind = ST_DATASET, .name = (char *)name, .obj = ds}, err);
}

void ks_state_set_timestamp(ks_state *st, ks_timestamp *ts) {
  if (st) st->ts = ts;
}

void ks_state_set_rng(ks_state *st, ks_rng *rng) {
  if (st) st->rng = rng;
}

const ks_timestamp *ks_state_timestamp(const ks_state *st) {
  return st ? st->ts : NULL;
}

/* ---- metrics built by the program's factory ---- */

static void free_evals(const ks_allocator *a, st_eval *ev, size_t n) {
  for (size_t i = 0; i < n; i++) {
    ks__free(a, ev[i].label);
    ks_metric_collection_free(ev[i].metrics);
  }
  ks__free(a, ev);
}

static KS_NODISCARD ks_status build_evals(ks_state *st, ks_metrics_factory factory, void *ctx,
                                          const char *const *labels, size_t n, st_eval **out, ks_error *err) {
  size_t bytes;
  if (!ks__mul_size(n ? n : 1, sizeof(st_eval), &bytes)) return KS_E_LIMIT;
  st_eval *ev = ks__calloc(&st->alloc, 1, bytes);
  if (!ev) return KS_E_NOMEM;
  ks_status s = KS_OK;
  for (size_t i = 0; i < n && !s; i++) {
    if ((s = ks__name_check(labels[i], err)) == KS_OK && !valid_name(labels[i]))
      s = ks__err_at(err, KS_E_INVALID, NULL, labels[i], -1, "evaluator label '%.200s' contains '/'", labels[i]);
    for (size_t j = 0; j < i && !s; j++)
      if (!strcmp(labels[i], labels[j])) s = ks__err(err, KS_E_EXISTS, "duplicate label '%s'", labels[i]);
    if (!s) ev[i].label = ks__strdup(&st->alloc, labels[i]);
    if (!s && !ev[i].label) s = ks__err(err, KS_E_NOMEM, "out of memory");
    if (!s) s = factory(ctx, labels[i], &st->alloc, &ev[i].metrics, err);
    /* A failing factory has freed what it built (state.h): its *out is not ours to free. */
    if (s) ev[i].metrics = NULL;
  }
  if (s) {
    free_evals(&st->alloc, ev, n);
    return s;
  }
  *out = ev;
  return KS_OK;
}

ks_status ks_state_build_metrics(ks_state *st, ks_metrics_factory factory, void *ctx,
                                 const char *const *eval_labels, size_t n_eval, ks_error *err) {
  if (!st || !factory || (n_eval && !eval_labels)) return ks__err(err, KS_E_INVALID, "build_metrics: bad argument");
  ks_metric_collection *train = NULL;
  ks_status s = factory(ctx, NULL, &st->alloc, &train, err);
  if (s) return s;
  st_eval *ev = NULL;
  s = build_evals(st, factory, ctx, eval_labels, n_eval, &ev, err);
  if (s) {
    ks_metric_collection_free(train);
    return s;
  }
  free_metrics(st);
  st->train = train;
  st->evals = ev;
  st->n_evals = n_eval;
  return KS_OK;
}

ks_metric_collection *ks_state_train_metrics(const ks_state *st) { return st ? st->train : NULL; }

ks_metric_collection *ks_state_eval_metrics(const ks_state *st, const char *label) {
  for (size_t i = 0; st && label && i < st->n_evals; i++)
    if (!strcmp(st->evals[i].label, label)) return st->evals[i].metrics;
  return NULL;
}
