/*
 * The key of each part of a training state (layout.h): what ks_state_save
 * writes for a C program and what the Python package asks for its objects
 * (ks_state_key, binding.h), so that both name every part by one rule.
 */
#include <stdio.h>
#include <string.h>

#include "state/state_internal.h"

enum { NEEDS_NOTHING, NEEDS_BASE, TAKES_BASE };

typedef struct part_rule {
  const char *folder; /* the key with no name: a root, or "<base>/" + this */
  int base;           /* NEEDS_NOTHING: no base; NEEDS_BASE: a metric path; TAKES_BASE: an optional label */
  int named;          /* 0: the part takes no name */
} part_rule;

/* Indexed by ks_state_part. The folders are layout.h's prefixes without their trailing '/'. */
static const part_rule rules[KS_PART_COUNT_] = {
    [KS_PART_MODEL] = {"state/model", NEEDS_NOTHING, 1},
    [KS_PART_OPTIMIZER] = {"state/optimizers", NEEDS_NOTHING, 1},
    [KS_PART_SCHEDULER] = {"state/schedulers", NEEDS_NOTHING, 1},
    [KS_PART_CALLBACK] = {"state/callbacks", NEEDS_NOTHING, 1},
    [KS_PART_DATASET_STATE] = {"state/dataset_state", NEEDS_NOTHING, 1},
    [KS_PART_RNG] = {"rng", NEEDS_NOTHING, 1},
    [KS_PART_TIMESTAMP] = {"state/timestamp/Timestamp", NEEDS_NOTHING, 1},
    [KS_PART_TRAIN_METRIC] = {"state/train_metrics", NEEDS_NOTHING, 1},
    [KS_PART_EVAL_METRIC] = {"state/eval_metrics", TAKES_BASE, 1},
    [KS_PART_EXTRA] = {KS_KEY_EXTRA, NEEDS_NOTHING, 1},
    [KS_PART_RANK_ZERO_SEED] = {KS_KEY_RANK_ZERO_SEED, NEEDS_NOTHING, 0},
    [KS_PART_RUN_NAME] = {KS_KEY_RUN_NAME, NEEDS_NOTHING, 0},
    [KS_PART_METRIC_STATE] = {"state_dict", NEEDS_BASE, 1},
    [KS_PART_METRIC_COMPUTED] = {KS_KEY_METRIC_COMPUTED, NEEDS_BASE, 0},
    [KS_PART_METRIC_ATTR] = {"attrs", NEEDS_BASE, 1},
    [KS_PART_METRIC_INNER] = {"inner", NEEDS_BASE, 1},
    [KS_PART_METRIC_UPDATE_COUNT] = {KS_KEY_METRIC_UPDATE_COUNT, NEEDS_BASE, 0},
    [KS_PART_LIGHTNING] = {"lightning", NEEDS_NOTHING, 1},
};

/* The folders above must stay layout.h's prefixes: a C program's files and a binding's agree. */
_Static_assert(sizeof "state/model" + 1 == sizeof KS_KEY_MODEL, "KS_KEY_MODEL");
_Static_assert(sizeof "state/train_metrics" + 1 == sizeof KS_KEY_TRAIN_METRICS, "KS_KEY_TRAIN_METRICS");
_Static_assert(sizeof "state_dict" + 1 == sizeof KS_KEY_METRIC_STATES, "KS_KEY_METRIC_STATES");
_Static_assert(sizeof "attrs" + 1 == sizeof KS_KEY_METRIC_ATTRS, "KS_KEY_METRIC_ATTRS");
_Static_assert(sizeof "inner" + 1 == sizeof KS_KEY_METRIC_INNER, "KS_KEY_METRIC_INNER");
_Static_assert(sizeof "rng" + 1 == sizeof KS_KEY_RNG, "KS_KEY_RNG");

_Static_assert(KS__STATE_LAYOUT_VERSION == 1, "ks_layout_record writes layout_version 1");

ks_status ks_state_key(ks_state_part part, const char *base, const char *name, char *buf, size_t cap,
                       ks_error *err) {
  if (!buf || cap == 0) return ks__err(err, KS_E_INVALID, "ks_state_key: no buffer");
  buf[0] = '\0';
  if ((int)part < 0 || part >= KS_PART_COUNT_) return ks__err(err, KS_E_INVALID, "unknown state part %d", (int)part);
  const part_rule *r = &rules[part];
  if (r->base == NEEDS_BASE && !base) return ks__err(err, KS_E_INVALID, "part %d needs a metric path", (int)part);
  if (r->base == NEEDS_NOTHING && base) return ks__err(err, KS_E_INVALID, "part %d takes no base", (int)part);
  if (!r->named && name) return ks__err(err, KS_E_INVALID, "part %d takes no name", (int)part);
  /* A metric's part is under its path; an eval metric under the root, then its label. */
  const char *head = r->base == NEEDS_BASE ? base : r->folder, *mid = r->base == NEEDS_BASE ? r->folder : base;
  int n = snprintf(buf, cap, "%s%s%s%s%s", head, mid ? "/" : "", mid ? mid : "", name ? "/" : "", name ? name : "");
  if (n < 0 || (size_t)n >= cap || n > KS_MAX_NAME) {
    buf[0] = '\0';
    return ks__err_at(err, KS_E_LIMIT, NULL, name ? name : head, -1,
                      "key of part %d would be longer than %d bytes (KS_MAX_NAME) or the buffer", (int)part,
                      KS_MAX_NAME);
  }
  return KS_OK;
}

const char *ks_layout_record(const char *meta_key) {
  if (!meta_key) return NULL;
  /* keepsake 0.1 wrote the Lightning record with Python's json.dumps spacing: kept byte for byte. */
  if (!strcmp(meta_key, KS_META_STATE)) return "{\"layout_version\":1}";
  if (!strcmp(meta_key, KS_META_LIGHTNING)) return "{\"layout_version\": 1}";
  return NULL;
}

ks_status ks__comp_prefix(const st_comp *c, char *buf) {
  /* Indexed by st_kind; custom components by their ks_state_root (the same order, plus rng/). */
  static const ks_state_part parts[] = {KS_PART_MODEL, KS_PART_OPTIMIZER, KS_PART_SCHEDULER,
                                        KS_PART_CALLBACK, KS_PART_DATASET_STATE, KS_PART_RNG};
  int r = c->kind == ST_CUSTOM ? c->root : (int)c->kind;
  ks_status s = ks_state_key(parts[r], NULL, c->name, buf, KS__KEY_MAX + 1, NULL);
  if (s || c->kind == ST_TENSOR) return s;
  size_t n = strlen(buf); /* a folder: its prefix ends in '/' */
  if (n >= KS__KEY_MAX) return KS_E_LIMIT;
  buf[n] = '/';
  buf[n + 1] = '\0';
  return KS_OK;
}
