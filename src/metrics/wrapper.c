/*
 * torchmetrics wrappers a C program builds with ks_metric_create: MinMaxMetric over a catalogue
 * metric. A wrapper is a described metric (described.c) whose class computes: its base metric is
 * its inner metric `_base_metric` and min_val / max_val are its attributes, so the one load engine
 * (state/load_metrics.c), the one save layout (state/save.c) and the one merge rule serve it as
 * they serve a binding's wrapper. Semantics are torchmetrics 1.9.0's: update forwards to the base
 * metric and is not counted, compute computes the base and, for a scalar, moves min_val / max_val
 * (initially +inf / -inf), nothing is cached, and reset resets the base and keeps min_val / max_val.
 */
#include <math.h>
#include <string.h>

#include "core/json.h"
#include "metrics/internal.h"

#define BASE_NAME "_base_metric"
enum { MAX_VAL, MIN_VAL }; /* the attributes, in the order torchmetrics' state is saved (sorted) */

static KS_NODISCARD ks_status minmax_update(ks_metric *m, const ks_tensor *in, size_t n, ks_error *err) {
  return ks_metric_update(m->inner[0], in, n, err);
}

/* The result: [raw, max, min], torchmetrics' {"raw", "max", "min"} in its order. */
static KS_NODISCARD ks_status minmax_compute(ks_metric *m, ks_tensor *out, ks_error *err) {
  const ks_tensor *v;
  ks_status st = ks_metric_compute(m->inner[0], &v, err);
  if (st) return st;
  if (ks_tensor_numel(v) != 1 || !ks_dtype_size(v->dtype))
    return ks__err(err, KS_E_STATE, "MinMaxMetric: the base metric's result is not a scalar");
  int64_t three = 3;
  if ((st = ks__result(m, out, KS_F32, 1, &three, err))) return st;
  float val = (float)ks_dtype_get_f64(v->dtype, v->data, 0);
  float *mx = m->attrs[MAX_VAL].data, *mn = m->attrs[MIN_VAL].data;
  if (*mx < val) *mx = val; /* torchmetrics: val if max_val < val else max_val (a NaN moves neither) */
  if (*mn > val) *mn = val;
  float *r = out->data;
  r[0] = val, r[1] = *mx, r[2] = *mn;
  return KS_OK;
}

static const ks__class minmax_class = {.name = "MinMaxMetric", .update = minmax_update, .compute = minmax_compute,
                                       .wrapper = 1};

/* The base metric's class and arguments from {"base_metric": {"class": C, "args": {...}}}. */
static KS_NODISCARD ks_status base_of(const ks_allocator *a, const char *args_json, ks__jv **doc, const char **cls,
                                      const ks__jv **args, ks_error *err) {
  const char *txt = args_json && *args_json ? args_json : "{}";
  ks_status st = ks__jv_parse(a, txt, strlen(txt), "MinMaxMetric arguments", doc, err);
  if (st) return st == KS_E_NOMEM ? st : ks__err(err, KS_E_INVALID, "MinMaxMetric: arguments are not JSON");
  const ks__jv *base = ks__jv_get(*doc, "base_metric");
  if (!ks__jv_is(*doc, KS__JV_OBJECT) || (*doc)->len != 1 || !ks__jv_is(base, KS__JV_OBJECT))
    return ks__err(err, KS_E_INVALID, "MinMaxMetric takes exactly {\"base_metric\": {\"class\": C, \"args\": {}}}");
  *cls = ks__jv_string(ks__jv_get(base, "class"));
  *args = ks__jv_get(base, "args");
  size_t known = 1 + (*args != NULL);
  if (!*cls || base->len != known || (*args && !ks__jv_is(*args, KS__JV_OBJECT)))
    return ks__err(err, KS_E_INVALID, "MinMaxMetric: base_metric needs a \"class\" string and may have \"args\"");
  return KS_OK;
}

/* {"base_metric":{"args":<the base's canonical args>,"class":C}}: ks_metric_create rebuilds it. */
static KS_NODISCARD ks_status canonical(ks_metric *m, const ks_metric *base) {
  const ks_allocator *a = &m->alloc;
  const char *bargs = ks_metric_args_json(base);
  ks__jv *doc = ks__jv_object(a), *b = ks__jv_object(a), *args = NULL;
  ks_status st = doc && b ? KS_OK : KS_E_NOMEM;
  if (!st && bargs) st = ks__jv_parse(a, bargs, strlen(bargs), "args", &args, NULL);
  if (!st) st = ks__jv_set(a, b, "args", args ? args : ks__jv_object(a));
  args = NULL;
  if (!st) st = ks__jv_set(a, b, "class", ks__jv_str(a, ks_metric_class(base)));
  ks__jv *taken = b; /* ks__jv_set takes its value, on failure too */
  b = NULL;
  if (!st) st = ks__jv_set(a, doc, "base_metric", taken);
  else ks__jv_free(a, taken);
  char *txt = st ? NULL : ks__jv_dump(a, doc, true);
  ks__jv_free(a, doc);
  ks__jv_free(a, b);
  ks__jv_free(a, args);
  if (!txt) return KS_E_NOMEM;
  m->args_json = txt;
  return KS_OK;
}

/* Declares min_val / max_val (F32, 0-d) and stages their initial values. */
static KS_NODISCARD ks_status declare_bounds(ks_metric *m, ks_error *err) {
  static const char *const names[] = {"max_val", "min_val"};
  for (int i = 0; i < 2; i++) {
    ks_status st = ks_metric_describe_attr(m, names[i], KS_F32, 0, NULL, 0, 0, 0, err);
    if (st) return st;
    float *v = ks__malloc(&m->alloc, sizeof *v);
    if (!v) return ks__err(err, KS_E_NOMEM, "out of memory creating MinMaxMetric");
    *v = i == MAX_VAL ? -INFINITY : INFINITY;
    m->attrs[i].data = v;
    m->attrs[i].nbytes = sizeof *v;
    m->attrs[i].staged = 1;
  }
  return KS_OK;
}

ks_status ks__wrapper_create(const char *class_name, const char *args_json, const ks_allocator *alloc,
                             ks_metric **out, ks_error *err) {
  if (strcmp(class_name, minmax_class.name))
    return ks__err(err, KS_E_NOTFOUND, "unknown metric class '%s'", class_name);
  const ks_allocator *a = ks__alloc_or_default(alloc);
  ks__jv *doc = NULL;
  const char *cls = NULL;
  const ks__jv *bargs = NULL;
  ks_metric *m = NULL, *base = NULL;
  char *btxt = NULL;
  ks_status st = base_of(a, args_json, &doc, &cls, &bargs, err);
  if (!st && bargs && !(btxt = ks__jv_dump(a, bargs, true))) st = KS_E_NOMEM;
  if (!st) st = ks_metric_create(cls, btxt, alloc, &base, err);
  if (!st) st = ks_metric_describe(class_name, NULL, alloc, &m, err);
  if (!st) {
    m->cls = &minmax_class;
    st = declare_bounds(m, err);
  }
  if (!st && !(st = ks__metric_add_inner(m, BASE_NAME, base, err))) base = NULL;
  if (!st && canonical(m, m->inner[0])) st = KS_E_NOMEM;
  if (st == KS_E_NOMEM && (!err || !err->code)) ks__err(err, st, "out of memory creating MinMaxMetric");
  ks__free(a, btxt);
  ks__jv_free(a, doc);
  ks_metric_free(base);
  if (st) {
    ks_metric_free(m);
    return st;
  }
  *out = m;
  return KS_OK;
}
