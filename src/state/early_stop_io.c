/*
 * Early stopping as a saved component: state/callbacks/<name>/{monitor, mode,
 * patience, min_delta, best_score (None before the first value), wait_count,
 * stopped_epoch}. Loading checks everything before it writes.
 */
#include <string.h>

#include "core/internal.h"
#include "core/keys.h"
#include "keepsake/state.h"

static const char *mode_name(ks_best_mode m) { return m == KS_BEST_MIN ? "min" : "max"; }

static KS_NODISCARD ks_status es_save(void *ctx, ks_statedict *dst, const char *prefix, ks_error *err) {
  const ks_early_stop *es = ctx;
  char k[KS__KEY_MAX + 1];
  ks_status s = ks__key(k, prefix, "monitor");
  if (!s) s = ks_statedict_set_string(dst, k, es->monitor, err);
  if (!s) s = ks__key(k, prefix, "mode");
  if (!s) s = ks_statedict_set_string(dst, k, mode_name(es->mode), err);
  if (!s) s = ks__put_int(dst, prefix, "patience", es->patience, err);
  if (!s) s = ks__put_float(dst, prefix, "min_delta", es->min_delta, err);
  if (!s) s = ks__key(k, prefix, "best_score");
  if (!s) s = es->has_best ? ks_statedict_set_float(dst, k, es->best_score, err) : ks_statedict_set_null(dst, k, err);
  if (!s) s = ks__put_int(dst, prefix, "wait_count", es->wait_count, err);
  if (!s) s = ks__put_int(dst, prefix, "stopped_epoch", es->stopped_epoch, err);
  return s ? ks__err(err, s, "early stopping: cannot save under %s", prefix) : KS_OK;
}

/* The saved string at prefix+name must equal want. */
static KS_NODISCARD ks_status same_string(const ks_statedict *src, const char *prefix, const char *name,
                                          const char *want, ks_error *err) {
  char k[KS__KEY_MAX + 1];
  ks_entry e;
  if (ks__key(k, prefix, name) || ks_statedict_get(src, k, &e) || e.kind != KS_VAL_STRING)
    return ks__err_at(err, KS_E_NOTFOUND, NULL, k, -1, "early stopping: no saved %s", name);
  if (strcmp(e.s, want))
    return ks__err_at(err, KS_E_MISMATCH, NULL, k, -1, "early stopping: saved %s '%s', the program's is '%s'", name,
                      e.s, want);
  return KS_OK;
}

static KS_NODISCARD ks_status es_load(void *ctx, const ks_statedict *src, const char *prefix, ks_error *err) {
  ks_early_stop *es = ctx, next = *es;
  char k[KS__KEY_MAX + 1];
  ks_entry e;
  ks_status s = same_string(src, prefix, "monitor", es->monitor, err);
  if (!s) s = same_string(src, prefix, "mode", mode_name(es->mode), err);
  if (!s) s = ks__get_int(src, prefix, "wait_count", &next.wait_count, err);
  if (!s) s = ks__get_int(src, prefix, "stopped_epoch", &next.stopped_epoch, err);
  if (!s && (ks__key(k, prefix, "best_score") || ks_statedict_get(src, k, &e)))
    s = ks__err_at(err, KS_E_NOTFOUND, NULL, k, -1, "early stopping: no saved best_score");
  if (!s && e.kind == KS_VAL_NULL) next.has_best = 0;
  else if (!s) {
    s = ks__get_float(src, prefix, "best_score", &next.best_score, err);
    next.has_best = 1;
  }
  if (!s && (next.wait_count < 0 || next.stopped_epoch < -1))
    s = ks__err_at(err, KS_E_VALUE, NULL, prefix, -1, "early stopping: negative wait_count or stopped_epoch");
  if (!s) *es = next;
  return s;
}

ks_stateful ks_early_stop_stateful(ks_early_stop *es) {
  return (ks_stateful){.ctx = es, .to_state_dict = es_save, .load_state_dict = es_load};
}
