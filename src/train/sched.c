/*
 * Linear warmup then cosine decay, the shape of Composer's
 * CosineAnnealingWithWarmupScheduler driving a torch LambdaLR that is stepped
 * once per batch. Saved with LambdaLR's field names plus its own parameters.
 */
#include <math.h>

#include "core/keys.h"
#include "keepsake/train.h"

static double multiplier(const ks_scheduler *s, int64_t t) {
  if (t < s->t_warmup) return (double)t / (double)s->t_warmup;
  int64_t span = s->t_max - s->t_warmup;
  double frac = span > 0 ? (double)(t - s->t_warmup) / (double)span : 1.0;
  if (frac > 1.0) frac = 1.0;
  return s->alpha_f + (1.0 - s->alpha_f) * 0.5 * (1.0 + cos(M_PI * frac));
}

double ks_scheduler_lr_at(const ks_scheduler *s, int64_t t) { return s->base_lr * multiplier(s, t); }

void ks_scheduler_init(ks_scheduler *s, ks_optimizer *opt, double base_lr, int64_t t_warmup, int64_t t_max,
                       double alpha_f) {
  s->base_lr = base_lr;
  s->t_warmup = t_warmup < 0 ? 0 : t_warmup;
  s->t_max = t_max;
  s->alpha_f = alpha_f;
  s->last_epoch = 0;
  s->last_lr = ks_scheduler_lr_at(s, 0);
  if (opt) ks_optimizer_set_lr(opt, s->last_lr);
}

void ks_scheduler_step(ks_scheduler *s, ks_optimizer *opt) {
  s->last_epoch++;
  s->last_lr = ks_scheduler_lr_at(s, s->last_epoch);
  if (opt) ks_optimizer_set_lr(opt, s->last_lr);
}

static KS_NODISCARD ks_status sched_save(void *ctx, ks_statedict *dst, const char *prefix, ks_error *err) {
  const ks_scheduler *s = ctx;
  if (!s || !dst || !prefix) return ks__err(err, KS_E_INVALID, "scheduler save: NULL argument");
  ks_status st = ks__put_float(dst, prefix, "base_lrs/0", s->base_lr, err);
  if (!st) st = ks__put_int(dst, prefix, "last_epoch", s->last_epoch, err);
  if (!st) st = ks__put_int(dst, prefix, "_step_count", s->last_epoch + 1, err);
  if (!st) st = ks__put_float(dst, prefix, "_last_lr/0", s->last_lr, err);
  if (!st) st = ks__put_int(dst, prefix, "t_warmup", s->t_warmup, err);
  if (!st) st = ks__put_int(dst, prefix, "t_max", s->t_max, err);
  if (!st) st = ks__put_float(dst, prefix, "alpha_f", s->alpha_f, err);
  return st;
}

static KS_NODISCARD ks_status sched_load(void *ctx, const ks_statedict *src, const char *prefix, ks_error *err) {
  ks_scheduler *s = ctx;
  if (!s || !src || !prefix) return ks__err(err, KS_E_INVALID, "scheduler load: NULL argument");
  ks_scheduler t;
  ks_status st = ks__get_float(src, prefix, "base_lrs/0", &t.base_lr, err);
  if (!st) st = ks__get_int(src, prefix, "last_epoch", &t.last_epoch, err);
  if (!st) st = ks__get_float(src, prefix, "_last_lr/0", &t.last_lr, err);
  if (!st) st = ks__get_int(src, prefix, "t_warmup", &t.t_warmup, err);
  if (!st) st = ks__get_int(src, prefix, "t_max", &t.t_max, err);
  if (!st) st = ks__get_float(src, prefix, "alpha_f", &t.alpha_f, err);
  if (st) return st;
  if (t.last_epoch < 0 || t.t_warmup < 0)
    return ks__err_at(err, KS_E_VALUE, NULL, prefix, -1, "scheduler: negative step count");
  *s = t;
  return KS_OK;
}

ks_stateful ks_scheduler_stateful(ks_scheduler *s) {
  return (ks_stateful){.ctx = s, .to_state_dict = sched_save, .load_state_dict = sched_load};
}
