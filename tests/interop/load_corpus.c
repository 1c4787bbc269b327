/*
 * load_corpus: the C side of the cross-language load corpus (load_corpus.py).
 *
 *   load_corpus DESCRIPTION.json CHECKPOINT
 *
 * DESCRIPTION is a program, written by load_corpus.py from the Python objects it hands
 * keepsake.torch.load_checkpoint:
 *
 *   {"model": [{"name": "w", "dtype": "F32", "shape": [2, 3]}, ...] (null: no model, model_absent),
 *    "components": [{"root": 1, "name": "AdamW"}, ...],          (ks_state_root codes)
 *    "timestamp": true,
 *    "train": [METRIC, ...],
 *    "evals": [{"label": "eval", "metrics": [METRIC, ...]}, ...],
 *    "strict": true, "weights_only": false, "allow_narrowing": false, "ignore": ["glob", ...]}
 *
 *   METRIC = {"name": "MeanMetric", "class": "MeanMetric", "attrs": "{...}" or null,
 *             "states": [{"name": "mean_value", "reduce": "dim_zero_sum" or null, "dtype": "F32" or null,
 *                         "shape": []}, ...],
 *             "inner": [{"name": "base_metric", "metric": METRIC}, ...],
 *             "kept": [{"name": "max_val", "dtype": "F32" or null (an int), "shape": [], "min": 0,
 *                       "max": 0}, ...]}   (a wrapper's attributes: ks_metric_describe_attr)
 *
 * Model tensors get buffers of their own, components a load callback that accepts whatever it
 * is given, metrics are described metrics (ks_metric_describe) built through the factory.
 * ks_state_load then prints the report, one item a line: kind TAB path TAB reason, or, when the
 * load fails (or the library refuses the program), one line: error TAB status name TAB key.
 * Exit 0 either way; 2 for a bad run.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "keepsake/binding.h"
#include "keepsake/keepsake.h"

#define MAX_TENSORS 256

typedef struct program {
  json_t *root;
  void *buffers[MAX_TENSORS];
  size_t n_buffers;
} program;

static int fail(const char *what, const char *detail) {
  fprintf(stderr, "load_corpus: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
  return 2;
}

static int flag(const json_t *obj, const char *key) { return json_is_true(json_object_get(obj, key)); }

/* A dtype by safetensors name (null: KS_STATE_ANY_DTYPE with F32). */
static ks_status dtype_of(const json_t *v, ks_dtype *out, unsigned *flags) {
  *flags = 0;
  if (json_is_null(v) || !v) {
    *flags = KS_STATE_ANY_DTYPE;
    *out = KS_F32;
    return KS_OK;
  }
  const char *name = json_string_value(v);
  return name ? ks_dtype_parse(name, strlen(name), out) : KS_E_INVALID;
}

static ks_status shape_of(const json_t *v, int *rank, int64_t *dims) {
  size_t n = json_array_size(v);
  if (!json_is_array(v) || n > KS_MAX_RANK) return KS_E_INVALID;
  for (size_t i = 0; i < n; i++) {
    const json_t *d = json_array_get(v, i);
    if (!json_is_integer(d)) return KS_E_INVALID;
    dims[i] = (int64_t)json_integer_value(d);
  }
  *rank = (int)n;
  return KS_OK;
}

/* ---- components: a load callback that accepts ---- */

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
  (void)prefix;
  (void)err;
  return KS_OK;
}

/* ---- metrics ---- */

static ks_status describe(const json_t *d, const ks_allocator *alloc, ks_metric **out, ks_error *err);

static ks_status describe_states(ks_metric *m, const json_t *states, ks_error *err) {
  size_t i;
  const json_t *st;
  json_array_foreach(states, i, st) {
    const char *name = json_string_value(json_object_get(st, "name"));
    const json_t *red = json_object_get(st, "reduce");
    int64_t dims[KS_MAX_RANK];
    int rank = 0;
    ks_dtype dt;
    unsigned flags;
    if (!name || !(json_is_string(red) || json_is_null(red))) return KS_E_INVALID;
    ks_status s = dtype_of(json_object_get(st, "dtype"), &dt, &flags);
    /* as the extension describes a torchmetrics state (python/src/ksload.c): a list state is cat;
       a tensor state folds by its named reduction, summed when that is cat or custom */
    ks_reduce r = KS_REDUCE_SUM;
    if (flags & KS_STATE_ANY_DTYPE) r = KS_REDUCE_CAT;
    else if (ks_reduce_parse(json_string_value(red), &r) || r == KS_REDUCE_CAT) r = KS_REDUCE_SUM;
    if (!s) s = shape_of(json_object_get(st, "shape"), &rank, dims);
    if (!s) s = ks_metric_describe_state(m, name, r, dt, rank, dims, flags, err);
    if (s) return s;
  }
  return KS_OK;
}

/* The attributes a wrapper keeps besides its states, as the binding declares them. */
static ks_status describe_kept(ks_metric *m, const json_t *kept, ks_error *err) {
  size_t i;
  const json_t *a;
  json_array_foreach(kept, i, a) {
    const char *name = json_string_value(json_object_get(a, "name"));
    int64_t dims[KS_MAX_RANK];
    int rank = 0;
    ks_dtype dt = KS_I64;
    unsigned flags = 0, any = 0;
    const json_t *dtype = json_object_get(a, "dtype");
    ks_status s = name ? KS_OK : KS_E_INVALID;
    if (!s && json_is_null(dtype)) flags = KS_ATTR_INT;
    else if (!s) s = dtype_of(dtype, &dt, &any);
    if (!s) s = shape_of(json_object_get(a, "shape"), &rank, dims);
    int64_t lo = (int64_t)json_integer_value(json_object_get(a, "min"));
    int64_t hi = (int64_t)json_integer_value(json_object_get(a, "max"));
    if (!s) s = ks_metric_describe_attr(m, name, dt, rank, dims, flags, lo, hi, err);
    if (s) return s;
  }
  return KS_OK;
}

static ks_status describe(const json_t *d, const ks_allocator *alloc, ks_metric **out, ks_error *err) {
  const char *cls = json_string_value(json_object_get(d, "class"));
  const char *attrs = json_string_value(json_object_get(d, "attrs")); /* NULL for null */
  if (!cls) return KS_E_INVALID;
  ks_metric *m = NULL;
  ks_status s = ks_metric_describe(cls, attrs, alloc, &m, err);
  if (!s) s = describe_states(m, json_object_get(d, "states"), err);
  if (!s) s = describe_kept(m, json_object_get(d, "kept"), err);
  size_t i;
  const json_t *in;
  json_array_foreach(json_object_get(d, "inner"), i, in) {
    if (s) break;
    const char *name = json_string_value(json_object_get(in, "name"));
    ks_metric *sub = NULL;
    s = name ? describe(json_object_get(in, "metric"), alloc, &sub, err) : KS_E_INVALID;
    if (!s && (s = ks_metric_add_inner(m, name, sub, err))) ks_metric_free(sub);
  }
  if (s) {
    ks_metric_free(m);
    return s;
  }
  *out = m;
  return KS_OK;
}

static const json_t *metrics_of(const program *p, const char *label) {
  if (!label) return json_object_get(p->root, "train");
  size_t i;
  const json_t *ev;
  json_array_foreach(json_object_get(p->root, "evals"), i, ev) {
    const char *l = json_string_value(json_object_get(ev, "label"));
    if (l && !strcmp(l, label)) return json_object_get(ev, "metrics");
  }
  return NULL;
}

static ks_status factory(void *ctx, const char *label, const ks_allocator *alloc, ks_metric_collection **out,
                         ks_error *err) {
  const json_t *descs = metrics_of(ctx, label);
  ks_metric_collection *c = NULL;
  ks_status s = ks_metric_collection_create(alloc, &c, err);
  size_t i;
  const json_t *d;
  json_array_foreach(descs, i, d) {
    if (s) break;
    const char *name = json_string_value(json_object_get(d, "name"));
    ks_metric *m = NULL;
    s = name ? describe(d, alloc, &m, err) : KS_E_INVALID;
    if (!s && (s = ks_metric_collection_add(c, name, m, err))) ks_metric_free(m);
  }
  if (s) {
    ks_metric_collection_free(c);
    return s;
  }
  *out = c;
  return KS_OK;
}

/* ---- the program ---- */

static ks_status add_model(program *p, ks_state *st, ks_error *err) {
  size_t i;
  const json_t *t;
  json_array_foreach(json_object_get(p->root, "model"), i, t) {
    const char *name = json_string_value(json_object_get(t, "name"));
    int64_t dims[KS_MAX_RANK];
    int rank = 0;
    ks_dtype dt;
    unsigned flags;
    if (!name || json_is_null(json_object_get(t, "dtype")) || p->n_buffers == MAX_TENSORS) return KS_E_INVALID;
    ks_status s = dtype_of(json_object_get(t, "dtype"), &dt, &flags);
    if (!s) s = shape_of(json_object_get(t, "shape"), &rank, dims);
    size_t nbytes = 0;
    if (!s) s = ks_shape_size(dt, rank, dims, NULL, &nbytes);
    void *buf = s ? NULL : calloc(1, nbytes ? nbytes : 1);
    if (!s && !buf) s = KS_E_NOMEM;
    if (buf) p->buffers[p->n_buffers++] = buf;
    ks_tensor desc;
    if (!s) s = ks_tensor_init(&desc, dt, rank, dims, buf);
    if (!s) s = ks_state_add_tensor(st, name, &desc, err);
    if (s) return s;
  }
  return KS_OK;
}

static ks_status add_components(const program *p, ks_state *st, ks_error *err) {
  size_t i;
  const json_t *c;
  json_array_foreach(json_object_get(p->root, "components"), i, c) {
    const char *name = json_string_value(json_object_get(c, "name"));
    const json_t *root = json_object_get(c, "root");
    if (!name || !json_is_integer(root)) return KS_E_INVALID;
    ks_stateful cb = {NULL, comp_save, comp_load};
    ks_status s = ks_state_add_component(st, (ks_state_root)json_integer_value(root), name, &cb, err);
    if (s) return s;
  }
  return KS_OK;
}

static ks_status add_metrics(program *p, ks_state *st, ks_error *err) {
  const json_t *evals = json_object_get(p->root, "evals");
  size_t n = json_array_size(evals);
  const char **labels = calloc(n + 1, sizeof *labels);
  if (!labels) return KS_E_NOMEM;
  for (size_t i = 0; i < n; i++) labels[i] = json_string_value(json_object_get(json_array_get(evals, i), "label"));
  ks_status s = ks_state_build_metrics(st, factory, p, labels, n, err);
  free(labels);
  return s;
}

static void print_report(const ks_load_report *rep) {
  ks_load_item it;
  for (size_t i = 0; ks_load_report_at(rep, i, &it) == KS_OK; i++)
    printf("%s\t%s\t%s\n", ks_load_kind_name(it.kind), it.path, it.reason ? it.reason : "");
}

int main(int argc, char **argv) {
  if (argc != 3) return fail("usage", "load_corpus DESCRIPTION.json CHECKPOINT");
  json_error_t jerr;
  program p = {.root = json_load_file(argv[1], 0, &jerr), .n_buffers = 0};
  if (!json_is_object(p.root)) return fail("bad description", jerr.text);
  const json_t *ignore = json_object_get(p.root, "ignore");
  size_t n_ignore = json_array_size(ignore);
  const char **globs = calloc(n_ignore + 1, sizeof *globs);
  ks_error err;
  ks_error_clear(&err);
  ks_state *st = NULL;
  ks_load_report *rep = NULL;
  ks_timestamp ts;
  ks_timestamp_init(&ts);
  ks_status s = globs ? ks_state_create("", 0, NULL, &st, &err) : KS_E_NOMEM;
  for (size_t i = 0; !s && i < n_ignore; i++)
    if (!(globs[i] = json_string_value(json_array_get(ignore, i)))) s = KS_E_INVALID;
  if (!s) s = ks_load_report_create(NULL, &rep, &err);
  if (!s) s = add_model(&p, st, &err);
  if (!s) s = add_components(&p, st, &err);
  if (!s) s = add_metrics(&p, st, &err);
  int rc = 0;
  if (!st || !rep) {
    rc = fail("cannot start", ks_status_name(s));
  } else if (s) { /* a program the library refuses (an evaluator label holding '/'): the load's error */
    printf("error\t%s\t%s\n", ks_status_name(s), err.key);
  } else {
    if (flag(p.root, "timestamp")) ks_state_set_timestamp(st, &ts);
    ks_load_opts o = {.size = sizeof o,
                      .non_strict_model = !flag(p.root, "strict"),
                      .weights_only = flag(p.root, "weights_only"),
                      .ignore = globs,
                      .n_ignore = n_ignore,
                      .allow_narrowing = flag(p.root, "allow_narrowing"),
                      .verify_checksums = 1,
                      .model_absent = json_is_null(json_object_get(p.root, "model"))};
    s = ks_state_load(st, argv[2], &o, rep, &err);
    if (s)
      printf("error\t%s\t%s\n", ks_status_name(s), err.key);
    else
      print_report(rep);
  }
  ks_load_report_free(rep);
  ks_state_free(st);
  free(globs);
  for (size_t i = 0; i < p.n_buffers; i++) free(p.buffers[i]);
  json_decref(p.root);
  return rc;
}
