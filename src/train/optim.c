/*
 * SGD with momentum and AdamW, computed as torch 1.13's single-tensor loops do
 * (F32 tensors, Python-double hyperparameters rounded to F32 per operation), and
 * saved under torch's state_dict names so a checkpoint reads like torch's.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/keys.h"
#include "keepsake/train.h"

typedef enum { OPT_SGD, OPT_ADAMW } opt_kind;

typedef struct opt_param {
  float *p;
  const float *g;
  int rank;
  int64_t shape[KS_MAX_RANK];
  size_t n;
  float *m; /* exp_avg, or SGD's momentum_buffer */
  float *v; /* exp_avg_sq (AdamW only) */
} opt_param;

struct ks_optimizer {
  ks_allocator alloc;
  opt_kind kind;
  double lr, beta1, beta2, eps, weight_decay, momentum, dampening;
  int nesterov;
  float step;  /* AdamW: steps taken (torch keeps one per param, all equal here) */
  int has_buf; /* SGD: momentum buffers exist (torch creates them on the first step) */
  opt_param *params;
  size_t count, cap;
};

static KS_NODISCARD ks_status create(const ks_allocator *alloc, opt_kind kind, double lr, ks_optimizer **out) {
  if (!out || !(lr >= 0)) return KS_E_INVALID;
  ks_optimizer *o = ks__calloc(alloc, 1, sizeof *o);
  if (!o) return KS_E_NOMEM;
  o->alloc = *ks__alloc_or_default(alloc);
  o->kind = kind;
  o->lr = lr;
  *out = o;
  return KS_OK;
}

ks_status ks_optimizer_create_sgd(const ks_sgd_opts *opts, const ks_allocator *alloc, ks_optimizer **out,
                                  ks_error *err) {
  if (!opts || !out) return ks__err(err, KS_E_INVALID, "SGD: NULL options or out");
  if (opts->momentum < 0 || opts->weight_decay < 0)
    return ks__err(err, KS_E_INVALID, "SGD: momentum %g and weight_decay %g must be >= 0", opts->momentum,
                   opts->weight_decay);
  if (opts->nesterov && (opts->momentum <= 0 || opts->dampening != 0))
    return ks__err(err, KS_E_INVALID, "SGD: nesterov needs momentum > 0 and dampening 0 (found %g and %g)",
                   opts->momentum, opts->dampening);
  ks_status s = create(alloc, OPT_SGD, opts->lr, out);
  if (s) return ks__err(err, s, "SGD: out of memory");
  (*out)->momentum = opts->momentum;
  (*out)->dampening = opts->dampening;
  (*out)->weight_decay = opts->weight_decay;
  (*out)->nesterov = opts->nesterov;
  return KS_OK;
}

ks_status ks_optimizer_create_adamw(const ks_adamw_opts *opts, const ks_allocator *alloc, ks_optimizer **out,
                                    ks_error *err) {
  if (!opts || !out) return ks__err(err, KS_E_INVALID, "AdamW: NULL options or out");
  if (!(opts->beta1 >= 0 && opts->beta1 < 1) || !(opts->beta2 >= 0 && opts->beta2 < 1) || !(opts->eps >= 0) ||
      !(opts->weight_decay >= 0))
    return ks__err(err, KS_E_INVALID, "AdamW: betas (%g, %g) must be in [0, 1), eps %g and weight_decay %g >= 0",
                   opts->beta1, opts->beta2, opts->eps, opts->weight_decay);
  ks_status s = create(alloc, OPT_ADAMW, opts->lr, out);
  if (s) return ks__err(err, s, "AdamW: out of memory");
  (*out)->beta1 = opts->beta1;
  (*out)->beta2 = opts->beta2;
  (*out)->eps = opts->eps;
  (*out)->weight_decay = opts->weight_decay;
  return KS_OK;
}

void ks_optimizer_free(ks_optimizer *o) {
  if (!o) return;
  for (size_t i = 0; i < o->count; i++) {
    ks__free(&o->alloc, o->params[i].m);
    ks__free(&o->alloc, o->params[i].v);
  }
  ks__free(&o->alloc, o->params);
  ks__free(&o->alloc, o);
}

static KS_NODISCARD ks_status alloc_state(ks_optimizer *o, opt_param *p) {
  size_t bytes;
  if (!ks__mul_size(p->n ? p->n : 1, sizeof(float), &bytes)) return KS_E_LIMIT;
  p->m = ks__calloc(&o->alloc, 1, bytes);
  if (o->kind == OPT_ADAMW) p->v = ks__calloc(&o->alloc, 1, bytes);
  if (!p->m || (o->kind == OPT_ADAMW && !p->v)) {
    ks__free(&o->alloc, p->m);
    ks__free(&o->alloc, p->v);
    return KS_E_NOMEM;
  }
  return KS_OK;
}

ks_status ks_optimizer_add_param(ks_optimizer *o, float *param, const float *grad, int rank,
                                 const int64_t *shape, ks_error *err) {
  if (!o || !param || !grad)
    return ks__err(err, KS_E_INVALID, "optimizer param %zu: NULL optimizer, param or grad", o ? o->count : 0);
  opt_param p = {.p = param, .g = grad, .rank = rank};
  uint64_t numel;
  ks_status s = ks_shape_size(KS_F32, rank, shape, &numel, NULL);
  if (s) return ks__err(err, s, "optimizer param %zu: bad shape (rank %d)", o->count, rank);
  if (rank > 0) memcpy(p.shape, shape, (size_t)rank * sizeof *shape);
  p.n = (size_t)numel;
  s = ks__grow(&o->alloc, &o->params, &o->cap, o->count + 1, sizeof *o->params);
  if (!s) s = alloc_state(o, &p);
  if (s) return ks__err(err, s, "optimizer param %zu: no memory for its state", o->count);
  o->params[o->count++] = p;
  return KS_OK;
}

static void adamw_param(const ks_optimizer *o, opt_param *p, float step) {
  float decay = (float)(1.0 - o->lr * o->weight_decay);
  float b1 = (float)o->beta1, b2 = (float)o->beta2, c1 = (float)(1.0 - o->beta1), c2 = (float)(1.0 - o->beta2);
  double bc1 = 1.0 - pow(o->beta1, step), bc2 = 1.0 - pow(o->beta2, step);
  float step_size = (float)(o->lr / bc1), bc2_sqrt = (float)sqrt(bc2), eps = (float)o->eps;
  for (size_t i = 0; i < p->n; i++) {
    float g = p->g[i];
    p->p[i] *= decay;
    p->m[i] = p->m[i] * b1 + g * c1;
    p->v[i] = p->v[i] * b2 + c2 * g * g;
    float denom = sqrtf(p->v[i]) / bc2_sqrt + eps;
    p->p[i] += (-step_size * p->m[i]) / denom; /* torch's addcdiv_: (value * exp_avg) / denom, in that order */
  }
}

static void sgd_param(const ks_optimizer *o, opt_param *p, int first) {
  float wd = (float)o->weight_decay, mom = (float)o->momentum, damp = (float)(1.0 - o->dampening);
  float lr = (float)o->lr;
  for (size_t i = 0; i < p->n; i++) {
    float d = p->g[i];
    if (o->weight_decay != 0) d += wd * p->p[i];
    if (o->momentum != 0) {
      p->m[i] = first ? d : p->m[i] * mom + damp * d;
      d = o->nesterov ? d + mom * p->m[i] : p->m[i];
    }
    p->p[i] += -lr * d;
  }
}

void ks_optimizer_step(ks_optimizer *o) {
  if (!o) return;
  if (o->kind == OPT_ADAMW) o->step += 1.0f;
  int first = !o->has_buf;
  for (size_t i = 0; i < o->count; i++) {
    if (o->kind == OPT_ADAMW) adamw_param(o, &o->params[i], o->step);
    else sgd_param(o, &o->params[i], first);
  }
  if (o->kind == OPT_SGD && o->momentum != 0) o->has_buf = 1;
}

double ks_optimizer_lr(const ks_optimizer *o) { return o ? o->lr : 0.0; }
void ks_optimizer_set_lr(ks_optimizer *o, double lr) {
  if (o) o->lr = lr;
}
const char *ks_optimizer_name(const ks_optimizer *o) { return o && o->kind == OPT_ADAMW ? "AdamW" : "SGD"; }
size_t ks_optimizer_param_count(const ks_optimizer *o) { return o ? o->count : 0; }

/* ---- state dict ---- */

static KS_NODISCARD ks_status put_buffer(ks_statedict *dst, const char *prefix, size_t i, const char *what,
                            const opt_param *p, const float *data, ks_error *err) {
  char k[KS__KEY_MAX + 1];
  if (ks__keyf(k, prefix, "state/%zu/%s", i, what)) return ks__key_limit(err, prefix, what);
  void *out;
  ks_status s = ks_statedict_new_tensor(dst, k, KS_F32, p->rank, p->shape, &out, err);
  if (s) return s;
  for (size_t j = 0; j < p->n; j++) {
    uint32_t bits;
    memcpy(&bits, &data[j], 4);
    ks__put_le32((uint8_t *)out + 4 * j, bits);
  }
  return KS_OK;
}

static KS_NODISCARD ks_status put_step(ks_statedict *dst, const char *prefix, size_t i, float step, ks_error *err) {
  char k[KS__KEY_MAX + 1];
  if (ks__keyf(k, prefix, "state/%zu/step", i)) return ks__key_limit(err, prefix, "state/N/step");
  void *out;
  ks_status s = ks_statedict_new_tensor(dst, k, KS_F32, 0, NULL, &out, err);
  if (s) return s;
  uint32_t bits;
  memcpy(&bits, &step, 4);
  ks__put_le32(out, bits);
  return KS_OK;
}

/* torch has no per-param state until the first step; neither do we in the file. */
static KS_NODISCARD ks_status put_state(const ks_optimizer *o, ks_statedict *dst, const char *prefix, ks_error *err) {
  ks_status s = KS_OK;
  for (size_t i = 0; i < o->count && !s; i++) {
    const opt_param *p = &o->params[i];
    if (o->kind == OPT_ADAMW && o->step > 0) {
      s = put_step(dst, prefix, i, o->step, err);
      if (!s) s = put_buffer(dst, prefix, i, "exp_avg", p, p->m, err);
      if (!s) s = put_buffer(dst, prefix, i, "exp_avg_sq", p, p->v, err);
    } else if (o->kind == OPT_SGD && o->has_buf) {
      s = put_buffer(dst, prefix, i, "momentum_buffer", p, p->m, err);
    }
  }
  return s;
}

static KS_NODISCARD ks_status put_null(ks_statedict *dst, const char *prefix, const char *name, ks_error *err) {
  char k[KS__KEY_MAX + 1];
  ks_status s = ks__key_err(k, prefix, name, err);
  return s ? s : ks_statedict_set_null(dst, k, err);
}

static KS_NODISCARD ks_status put_bool(ks_statedict *dst, const char *prefix, const char *name, int v, ks_error *err) {
  char k[KS__KEY_MAX + 1];
  ks_status s = ks__key_err(k, prefix, name, err);
  return s ? s : ks_statedict_set_bool(dst, k, v, err);
}

static KS_NODISCARD ks_status put_groups(const ks_optimizer *o, ks_statedict *dst, const char *gp, ks_error *err) {
  ks_status s = ks__put_float(dst, gp, "lr", o->lr, err);
  if (o->kind == OPT_ADAMW) {
    if (!s) s = ks__put_float(dst, gp, "betas/0", o->beta1, err);
    if (!s) s = ks__put_float(dst, gp, "betas/1", o->beta2, err);
    if (!s) s = ks__put_float(dst, gp, "eps", o->eps, err);
    if (!s) s = ks__put_float(dst, gp, "weight_decay", o->weight_decay, err);
    if (!s) s = put_bool(dst, gp, "amsgrad", 0, err);
    if (!s) s = put_bool(dst, gp, "maximize", 0, err);
    if (!s) s = put_null(dst, gp, "foreach", err);
    if (!s) s = put_bool(dst, gp, "capturable", 0, err);
    if (!s) s = put_bool(dst, gp, "differentiable", 0, err);
    if (!s) s = put_null(dst, gp, "fused", err);
    if (!s) s = put_bool(dst, gp, "decoupled_weight_decay", 1, err); /* AdamW is Adam with it set (torch 2.6+) */
  } else {
    if (!s) s = ks__put_float(dst, gp, "momentum", o->momentum, err);
    if (!s) s = ks__put_float(dst, gp, "dampening", o->dampening, err);
    if (!s) s = ks__put_float(dst, gp, "weight_decay", o->weight_decay, err);
    if (!s) s = put_bool(dst, gp, "nesterov", o->nesterov, err);
    if (!s) s = put_bool(dst, gp, "maximize", 0, err);
    if (!s) s = put_null(dst, gp, "foreach", err);
    if (!s) s = put_bool(dst, gp, "differentiable", 0, err);
    if (!s) s = put_null(dst, gp, "fused", err);
  }
  for (size_t i = 0; i < o->count && !s; i++) {
    char k[KS__KEY_MAX + 1];
    if (ks__keyf(k, gp, "params/%zu", i)) s = ks__key_limit(err, gp, "params/N");
    if (!s) s = ks_statedict_set_int(dst, k, (int64_t)i, err);
  }
  return s;
}

static KS_NODISCARD ks_status optim_save(void *ctx, ks_statedict *dst, const char *prefix, ks_error *err) {
  const ks_optimizer *o = ctx;
  if (!o || !dst || !prefix) return ks__err(err, KS_E_INVALID, "optimizer save: NULL argument");
  char gp[KS__KEY_MAX + 1];
  ks_status s = ks__key_err(gp, prefix, "param_groups/0/", err);
  if (!s) s = put_state(o, dst, prefix, err);
  return s ? s : put_groups(o, dst, gp, err);
}

/* Checks one stored buffer against the parameter: F32, or a type that widens to it. */
static KS_NODISCARD ks_status check_buffer(const ks_statedict *src, const char *prefix, size_t i, const char *what,
                              const opt_param *p, const ks_tensor **out, ks_error *err) {
  char k[KS__KEY_MAX + 1];
  if (ks__keyf(k, prefix, "state/%zu/%s", i, what)) return ks__err(err, KS_E_LIMIT, "key too long");
  const ks_tensor *t = ks_statedict_tensor(src, k);
  if (!t) return ks__err_at(err, KS_E_NOTFOUND, NULL, k, -1, "missing optimizer state '%s'", k);
  if (t->dtype != KS_F32 && !ks_dtype_widens_to(t->dtype, KS_F32))
    return ks__err_at(err, KS_E_DTYPE, NULL, k, -1, "expected F32, found %s", ks_dtype_name(t->dtype));
  if (t->rank != p->rank || (p->rank && memcmp(t->shape, p->shape, (size_t)p->rank * sizeof(int64_t)))) {
    char a[96], b[96];
    return ks__err_at(err, KS_E_SHAPE, NULL, k, -1, "expected shape %s, found %s",
                      ks_shape_format(p->rank, p->shape, a, sizeof a), ks_shape_format(t->rank, t->shape, b, sizeof b));
  }
  *out = t;
  return KS_OK;
}

typedef struct loaded_params {
  double lr, beta1, beta2, eps, weight_decay, momentum, dampening;
  int64_t nesterov;
} loaded_params;

static KS_NODISCARD ks_status read_groups(const ks_optimizer *o, const ks_statedict *src, const char *gp,
                                          loaded_params *lp, ks_error *err) {
  ks_status s = ks__get_float(src, gp, "lr", &lp->lr, err);
  if (!s) s = ks__get_float(src, gp, "weight_decay", &lp->weight_decay, err);
  if (o->kind == OPT_ADAMW) {
    if (!s) s = ks__get_float(src, gp, "betas/0", &lp->beta1, err);
    if (!s) s = ks__get_float(src, gp, "betas/1", &lp->beta2, err);
    if (!s) s = ks__get_float(src, gp, "eps", &lp->eps, err);
  } else {
    if (!s) s = ks__get_float(src, gp, "momentum", &lp->momentum, err);
    if (!s) s = ks__get_float(src, gp, "dampening", &lp->dampening, err);
    if (!s) s = ks__get_int(src, gp, "nesterov", &lp->nesterov, err);
  }
  if (s) return s;
  int64_t last;
  char name[32];
  snprintf(name, sizeof name, "params/%zu", o->count);
  if (o->count == 0 || ks__get_int(src, gp, name, &last, NULL) == KS_OK ||
      ks__keyf(name, "", "params/%zu", o->count - 1) || ks__get_int(src, gp, name, &last, NULL) != KS_OK)
    return ks__err_at(err, KS_E_MISMATCH, NULL, gp, -1, "optimizer has %zu params; the checkpoint's group differs",
                      o->count);
  return KS_OK;
}

/* check_buffer accepted t, so its dtype widens to F32 and the conversion succeeds. */
static KS_NODISCARD ks_status copy_in(float *dst, const ks_tensor *t, size_t n) {
  return ks_dtype_convert(KS_F32, dst, t->dtype, t->data, n);
}

static KS_NODISCARD ks_status optim_load(void *ctx, const ks_statedict *src, const char *prefix, ks_error *err) {
  ks_optimizer *o = ctx;
  if (!o || !src || !prefix) return ks__err(err, KS_E_INVALID, "optimizer load: NULL argument");
  char gp[KS__KEY_MAX + 1];
  if (ks__key(gp, prefix, "param_groups/0/")) return ks__err(err, KS_E_LIMIT, "key too long");
  loaded_params lp = {0};
  ks_status s = read_groups(o, src, gp, &lp, err);
  if (s) return s;
  const char *first = o->kind == OPT_ADAMW ? "exp_avg" : "momentum_buffer";
  char k0[KS__KEY_MAX + 1];
  if (ks__key(k0, prefix, "state/0/")) return ks__err(err, KS_E_LIMIT, "key too long");
  int has_state = o->count > 0 && ks_statedict_tensor(src, strcat(k0, first)) != NULL;
  float step = 0;
  if (has_state && o->kind == OPT_ADAMW) {
    double st;
    s = ks__get_float(src, prefix, "state/0/step", &st, err);
    if (s) return s;
    step = (float)st;
  }
  /* Check everything before writing anything, so a failed load changes nothing. */
  for (size_t i = 0; has_state && i < o->count; i++) {
    const ks_tensor *t;
    s = check_buffer(src, prefix, i, first, &o->params[i], &t, err);
    if (!s && o->kind == OPT_ADAMW) s = check_buffer(src, prefix, i, "exp_avg_sq", &o->params[i], &t, err);
    if (s) return s;
  }
  for (size_t i = 0; i < o->count; i++) {
    opt_param *p = &o->params[i];
    const ks_tensor *t = NULL;
    if (!has_state) {
      memset(p->m, 0, p->n * sizeof(float));
      if (p->v) memset(p->v, 0, p->n * sizeof(float));
      continue;
    }
    /* The first pass checked every buffer: these cannot fail, but a failure is still reported. */
    s = check_buffer(src, prefix, i, first, p, &t, err);
    if (!s) s = copy_in(p->m, t, p->n);
    if (!s && o->kind == OPT_ADAMW) {
      s = check_buffer(src, prefix, i, "exp_avg_sq", p, &t, err);
      if (!s) s = copy_in(p->v, t, p->n);
    }
    if (s) return ks__err(err, s, "optimizer param %zu: cannot restore its state", i);
  }
  o->step = step;
  o->has_buf = o->kind == OPT_SGD && has_state;
  o->lr = lp.lr;
  o->weight_decay = lp.weight_decay;
  if (o->kind == OPT_ADAMW) {
    o->beta1 = lp.beta1;
    o->beta2 = lp.beta2;
    o->eps = lp.eps;
  } else {
    o->momentum = lp.momentum;
    o->dampening = lp.dampening;
    o->nesterov = lp.nesterov != 0;
  }
  return KS_OK;
}

ks_stateful ks_optimizer_stateful(ks_optimizer *o) {
  return (ks_stateful){.ctx = o, .to_state_dict = optim_save, .load_state_dict = optim_load};
}
