/*
 * Constructor arguments: strict JSON parsing (duplicate keys, unknown keys,
 * wrong types and out-of-range values are errors) and the canonical JSON that
 * identifies a metric's configuration.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/json.h"
#include "metrics/internal.h"

typedef struct arg_name {
  const char *name;
  unsigned bit;
} arg_name;

/* Alphabetical: the canonical JSON lists keys in this order. */
static const arg_name k_args[] = {
    {"average", KS__A_AVERAGE},         {"ignore_index", KS__A_IGNORE},   {"multidim_average", KS__A_MULTIDIM},
    {"nan_strategy", KS__A_NAN},        {"normalize", KS__A_NORMALIZE},   {"num_classes", KS__A_NUM_CLASSES},
    {"num_labels", KS__A_NUM_LABELS},   {"num_outputs", KS__A_NUM_OUTPUTS}, {"squared", KS__A_SQUARED},
    {"threshold", KS__A_THRESHOLD},     {"thresholds", KS__A_THRESHOLDS}, {"top_k", KS__A_TOP_K},
};
#define N_ARGS (sizeof k_args / sizeof k_args[0])

/* torchmetrics base-class options that do not change the state. */
static const char *const k_ignored[] = {"validate_args", "dist_sync_on_step", "sync_on_compute",
                                        "compute_on_cpu", "compute_with_cache"};

static const char *const k_avg_names[] = {"micro", "macro", "weighted", "none"};
static const char *const k_norm_names[] = {"none", "true", "pred", "all"};

static unsigned arg_bit(const char *key) {
  for (size_t i = 0; i < N_ARGS; i++)
    if (!strcmp(k_args[i].name, key)) return k_args[i].bit;
  return 0;
}

int ks__args_known(const char *key) { return arg_bit(key) != 0; }

static int is_ignored(const char *key) {
  for (size_t i = 0; i < sizeof k_ignored / sizeof k_ignored[0]; i++)
    if (!strcmp(k_ignored[i], key)) return 1;
  return 0;
}

static KS_NODISCARD ks_status get_int(const ks__jv *v, const char *key, int64_t lo, int64_t hi, int64_t *out,
                                      ks_error *err) {
  if (!ks__jv_is(v, KS__JV_INT)) return ks__err(err, KS_E_INVALID, "argument '%s' must be an integer", key);
  int64_t x = v->i;
  if (x < lo || x > hi)
    return ks__err(err, KS_E_INVALID, "argument '%s' = %lld is out of range [%lld, %lld]", key, (long long)x,
                   (long long)lo, (long long)hi);
  *out = (int64_t)x;
  return KS_OK;
}

static KS_NODISCARD ks_status get_enum(const ks__jv *v, const char *key, const char *const *names, int n, int *out,
                                       ks_error *err) {
  if (ks__jv_is(v, KS__JV_NULL)) {
    for (int i = 0; i < n; i++)
      if (!strcmp(names[i], "none")) {
        *out = i;
        return KS_OK;
      }
  }
  if (ks__jv_is(v, KS__JV_STRING))
    for (int i = 0; i < n; i++)
      if (!strcmp(names[i], ks__jv_string(v))) {
        *out = i;
        return KS_OK;
      }
  return ks__err(err, KS_E_INVALID, "argument '%s' has an unsupported value", key);
}

static KS_NODISCARD ks_status get_unit(const ks__jv *v, const char *key, double *out, ks_error *err) {
  if (!ks__jv_is_number(v, NULL)) return ks__err(err, KS_E_INVALID, "argument '%s' must be a number", key);
  double d = ks__jv_number(v);
  if (!(d >= 0.0 && d <= 1.0)) return ks__err(err, KS_E_INVALID, "argument '%s' must lie in [0, 1]", key);
  *out = d;
  return KS_OK;
}

/*
 * torch.linspace(0, 1, n) in float32, bit for bit as torch's AVX2 CPU kernel
 * computes it: blocks of 8 start at a fused start + step*idx (or end - step*k
 * past halfway) and add i*step; the tail past the last 16-aligned block is
 * scalar. Binned metrics compare preds against these exact values.
 */
static float lin_point(float step, int64_t idx, int64_t n) {
  return idx < n / 2 ? fmaf(step, (float)idx, 0.0f) : fmaf(-step, (float)(n - idx - 1), 1.0f);
}

static void linspace01(float *thr, int64_t n) {
  float step = 1.0f / (float)(n - 1);
  int64_t vec_end = n / 16 * 16, idx = 0;
  for (; idx < vec_end; idx += 8) {
    float base = lin_point(step, idx, n);
    for (int64_t i = 0; i < 8; i++) thr[idx + i] = base + (float)i * step;
  }
  for (; idx < n; idx++) thr[idx] = lin_point(step, idx, n);
}

static KS_NODISCARD ks_status get_thresholds(const ks__jv *v, const ks_allocator *a, ks__margs *o, ks_error *err) {
  if (ks__jv_is(v, KS__JV_NULL)) return KS_OK;
  int64_t n;
  if (ks__jv_is(v, KS__JV_INT)) {
    ks_status st = get_int(v, "thresholds", 2, KS__MAX_THRESHOLDS, &n, err);
    if (st) return st;
  } else if (ks__jv_is(v, KS__JV_ARRAY)) {
    n = (int64_t)v->len;
    if (n < 1 || n > KS__MAX_THRESHOLDS)
      return ks__err(err, KS_E_INVALID, "argument 'thresholds' needs 1..%d values", KS__MAX_THRESHOLDS);
  } else
    return ks__err(err, KS_E_INVALID, "argument 'thresholds' must be null, an integer or a list");
  o->thr = ks__malloc(a, (size_t)n * sizeof(float));
  if (!o->thr) return ks__err(err, KS_E_NOMEM, "out of memory for thresholds");
  o->n_thr = n;
  if (ks__jv_is(v, KS__JV_INT)) {
    linspace01(o->thr, n);
  } else {
    o->thr_list = 1;
    for (int64_t i = 0; i < n; i++) {
      double d;
      ks_status st = get_unit(v->items[i], "thresholds", &d, err);
      if (st) return st;
      o->thr[i] = (float)d;
    }
  }
  o->thr_sorted = 1;
  for (int64_t i = 1; i < n; i++) o->thr_sorted &= o->thr[i - 1] <= o->thr[i];
  return KS_OK;
}

static KS_NODISCARD ks_status get_nan(const ks__jv *v, ks__margs *o, ks_error *err) {
  static const char *const names[] = {"warn", "ignore", "error", "disable"};
  if (ks__jv_is_number(v, NULL)) {
    o->nan_strategy = KS__NAN_VALUE;
    o->nan_value = ks__jv_number(v);
    return KS_OK;
  }
  return get_enum(v, "nan_strategy", names, 4, &o->nan_strategy, err);
}

static KS_NODISCARD ks_status parse_one(const ks__class *cls, unsigned bit, const ks__jv *v, const ks_allocator *a,
                           ks__margs *o, ks_error *err) {
  int64_t x = 0;
  ks_status st = KS_OK;
  switch (bit) {
    case KS__A_AVERAGE:
      st = get_enum(v, "average", k_avg_names, 4, &o->average, err);
      if (!st && !((cls->averages >> o->average) & 1u))
        st = ks__err(err, KS_E_UNSUPPORTED, "%s does not support average='%s'", cls->name,
                     k_avg_names[o->average]);
      return st;
    case KS__A_IGNORE:
      if (ks__jv_is(v, KS__JV_NULL)) {
        o->has_ignore = 0;
        return KS_OK;
      }
      st = get_int(v, "ignore_index", INT64_MIN, INT64_MAX, &o->ignore_index, err);
      o->has_ignore = !st;
      return st;
    case KS__A_MULTIDIM:
      if (ks__jv_is(v, KS__JV_STRING) && !strcmp(ks__jv_string(v), "global")) return KS_OK;
      return ks__err(err, KS_E_UNSUPPORTED, "only multidim_average='global' is supported");
    case KS__A_NAN: return get_nan(v, o, err);
    case KS__A_NORMALIZE: return get_enum(v, "normalize", k_norm_names, 4, &o->normalize, err);
    case KS__A_NUM_CLASSES: return get_int(v, "num_classes", 2, KS__MAX_CLASSES, &o->num_classes, err);
    case KS__A_NUM_LABELS: return get_int(v, "num_labels", 2, KS__MAX_CLASSES, &o->num_classes, err);
    case KS__A_NUM_OUTPUTS: return get_int(v, "num_outputs", 1, KS__MAX_OUTPUTS, &o->num_outputs, err);
    case KS__A_SQUARED:
      if (!ks__jv_is(v, KS__JV_BOOL)) return ks__err(err, KS_E_INVALID, "argument 'squared' must be a boolean");
      o->squared = (v)->b;
      return KS_OK;
    case KS__A_THRESHOLD: return get_unit(v, "threshold", &o->threshold, err);
    case KS__A_THRESHOLDS: return get_thresholds(v, a, o, err);
    default:
      st = get_int(v, "top_k", 1, KS__MAX_CLASSES, &x, err);
      o->top_k = x;
      return st;
  }
}

static void set_defaults(const ks__class *cls, ks__margs *o) {
  memset(o, 0, sizeof *o);
  o->average = cls->default_average;
  o->top_k = 1;
  o->threshold = 0.5;
  o->squared = 1;
  o->num_outputs = 1;
  o->has_ignore = cls->has_default_ignore;
  o->ignore_index = cls->default_ignore;
}

static KS_NODISCARD ks_status parse_object(const ks__class *cls, const ks__jv *root, const ks_allocator *a,
                                           ks__margs *o, ks_error *err) {
  unsigned seen = 0;
  for (size_t i = 0; i < root->len; i++) {
    const char *key = root->keys[i];
    const ks__jv *v = root->items[i];
    if (is_ignored(key)) continue;
    unsigned bit = arg_bit(key);
    if (!bit || !(cls->accepts & bit))
      return ks__err(err, KS_E_INVALID, "%s does not take an argument '%s'", cls->name, key);
    ks_status st = parse_one(cls, bit, v, a, o, err);
    if (st) return st;
    seen |= bit;
  }
  if ((seen & cls->requires) != cls->requires)
    return ks__err(err, KS_E_INVALID, "%s needs argument '%s'", cls->name,
                   (cls->requires & KS__A_NUM_LABELS) ? "num_labels" : "num_classes");
  if (o->top_k > 1 && o->top_k > o->num_classes)
    return ks__err(err, KS_E_INVALID, "top_k=%lld exceeds num_classes=%lld", (long long)o->top_k,
                   (long long)o->num_classes);
  return KS_OK;
}

ks_status ks__args_parse(const ks__class *cls, const char *json, const ks_allocator *a, ks__margs *out,
                         ks_error *err) {
  set_defaults(cls, out);
  if (!json || !*json) json = "{}";
  ks_error je;
  ks_error_clear(&je);
  ks__jv *root = NULL;
  ks_status st = ks__jv_parse(a, json, strlen(json), "args", &root, &je);
  if (st == KS_E_NOMEM) return ks__err(err, st, "%s arguments: out of memory", cls->name);
  if (st)
    return ks__err(err, KS_E_INVALID, "%s arguments: %s (at byte %lld)", cls->name, je.message, (long long)je.offset);
  st = ks__jv_is(root, KS__JV_OBJECT) ? parse_object(cls, root, a, out, err)
                                      : ks__err(err, KS_E_INVALID, "%s arguments must be a JSON object", cls->name);
  ks__jv_free(a, root);
  if (st) ks__args_free(a, out);
  return st;
}

void ks__args_free(const ks_allocator *a, ks__margs *args) {
  ks__free(a, args->thr);
  args->thr = NULL;
  args->n_thr = 0;
}

ks_status ks__args_copy(const ks_allocator *a, const ks__margs *src, ks__margs *dst) {
  *dst = *src;
  dst->thr = NULL;
  if (!src->thr) return KS_OK;
  dst->thr = ks__malloc(a, (size_t)src->n_thr * sizeof(float));
  if (!dst->thr) {
    dst->n_thr = 0;
    return KS_E_NOMEM;
  }
  memcpy(dst->thr, src->thr, (size_t)src->n_thr * sizeof(float));
  return KS_OK;
}

/* ---- canonical JSON ---- */

/* Canonical arguments are written with the core string buffer. */
typedef ks__sbuf sbuf;

static void put(sbuf *b, const char *s) { ks__sbuf_puts(b, s); }

static void put_num(sbuf *b, double d) {
  char t[40];
  snprintf(t, sizeof t, "%.9g", d);
  if (!strpbrk(t, ".eEn")) strcat(t, ".0"); /* keep floats floats */
  put(b, t);
}

static void put_int(sbuf *b, int64_t x) { ks__sbuf_put_i64(b, x); }

static void put_value(sbuf *b, unsigned bit, const ks__margs *o) {
  static const char *const nan_names[] = {"\"warn\"", "\"ignore\"", "\"error\"", "\"disable\""};
  switch (bit) {
    case KS__A_AVERAGE: put(b, "\""), put(b, k_avg_names[o->average]), put(b, "\""); break;
    case KS__A_IGNORE: o->has_ignore ? put_int(b, o->ignore_index) : put(b, "null"); break;
    case KS__A_MULTIDIM: put(b, "\"global\""); break;
    case KS__A_NAN:
      o->nan_strategy == KS__NAN_VALUE ? put_num(b, o->nan_value) : put(b, nan_names[o->nan_strategy]);
      break;
    case KS__A_NORMALIZE: put(b, "\""), put(b, k_norm_names[o->normalize]), put(b, "\""); break;
    case KS__A_NUM_CLASSES:
    case KS__A_NUM_LABELS: put_int(b, o->num_classes); break;
    case KS__A_NUM_OUTPUTS: put_int(b, o->num_outputs); break;
    case KS__A_SQUARED: put(b, o->squared ? "true" : "false"); break;
    case KS__A_THRESHOLD: put_num(b, o->threshold); break;
    case KS__A_THRESHOLDS:
      if (!o->n_thr) put(b, "null");
      else if (!o->thr_list) put_int(b, o->n_thr);
      else {
        put(b, "[");
        for (int64_t i = 0; i < o->n_thr; i++) {
          if (i) put(b, ",");
          put_num(b, (double)o->thr[i]);
        }
        put(b, "]");
      }
      break;
    default: put_int(b, o->top_k);
  }
}

ks_status ks__args_canonical(const ks__class *cls, const ks__margs *args, const ks_allocator *a, char **out) {
  sbuf b;
  ks__sbuf_init(&b, a);
  put(&b, "{");
  int first = 1;
  for (size_t i = 0; i < N_ARGS; i++) {
    if (!(cls->accepts & k_args[i].bit)) continue;
    put(&b, first ? "\"" : ",\"");
    put(&b, k_args[i].name);
    put(&b, "\":");
    put_value(&b, k_args[i].bit, args);
    first = 0;
  }
  put(&b, "}");
  ks__sbuf_putc(&b, '\0');
  if (b.failed) {
    ks__sbuf_free(&b);
    return KS_E_NOMEM;
  }
  *out = b.p;
  return KS_OK;
}
