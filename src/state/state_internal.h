/*
 * The state registry's object and the load context, shared by state.c,
 * save.c, load.c and load_metrics.c.
 */
#ifndef KS_STATE_INTERNAL_H
#define KS_STATE_INTERNAL_H

#include <stdint.h>

#include "core/internal.h"
#include "core/keys.h"
#include "keepsake/layout.h"
#include "keepsake/state.h"

/* Glob over '/' paths that also matches any '/'-prefix of `path`. */
int ks__path_ignored(const char *const *globs, size_t n, const char *path);

/* ---- the state object (shared by state.c, save.c and load.c) ---- */

typedef enum st_kind { ST_TENSOR, ST_OPTIM, ST_SCHED, ST_CUSTOM, ST_DATASET } st_kind;

typedef struct st_comp {
  st_kind kind;
  char *name;
  ks_tensor t;    /* ST_TENSOR: borrowed data */
  void *obj;      /* ST_OPTIM / ST_SCHED / ST_DATASET */
  ks_stateful cb; /* ST_CUSTOM */
} st_comp;

typedef struct st_eval {
  char *label;
  ks_metric_collection *metrics;
} st_eval;

struct ks_state {
  ks_allocator alloc;
  char *run_name;
  int64_t rank_zero_seed;
  st_comp *comps;
  size_t n_comps, cap_comps;
  ks_timestamp *ts;
  ks_rng *rng;
  ks_metric_collection *train;
  st_eval *evals;
  size_t n_evals;
};

/* Key prefix of a component ("state/optimizers/AdamW/"). @return KS_OK or KS_E_LIMIT. */
ks_status ks__comp_prefix(const st_comp *c, char *buf);

#define KS__STATE_LAYOUT_VERSION 1

/* ---- loading (load.c, load_metrics.c) ---- */

typedef struct ks__load_ctx {
  ks_state *st;
  const ks_statedict *src; /* the checkpoint minus ignored keys */
  void *metrics_meta;      /* json_t* of KS_META_METRICS, or NULL */
  ks_load_opts o;
  ks_load_report *rep;
  ks_error *err;
} ks__load_ctx;

/* Adds a report item with a formatted reason. @return KS_OK or KS_E_NOMEM. */
ks_status ks__note(ks__load_ctx *c, ks_load_kind kind, const char *path, const char *fmt, ...) KS__PRINTF(4, 5);
/* Nonzero when some key of sd starts with prefix. */
int ks__has_prefix(const ks_statedict *sd, const char *prefix);
/* Nonzero when path (or a '/'-prefix of it) matches an ignore glob. */
int ks__ignored(const ks__load_ctx *c, const char *path);
/* Fills every program metric (train and eval) from the checkpoint. */
ks_status ks__load_metrics(ks__load_ctx *c);

#endif
