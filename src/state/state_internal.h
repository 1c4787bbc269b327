/*
 * The state registry's object and the load context, shared by state.c,
 * save.c, load.c and load_metrics.c.
 */
#ifndef KS_STATE_INTERNAL_H
#define KS_STATE_INTERNAL_H

#include <stdint.h>

#include "core/hindex.h"
#include "core/internal.h"
#include "core/keys.h"
#include "keepsake/binding.h"
#include "keepsake/layout.h"
#include "keepsake/state.h"

/* Empties a load report (report.c; tests reuse one report for several loads). */
void ks__load_report_clear(ks_load_report *r);

/* Glob over '/' paths that also matches any '/'-prefix of `path`. */
int ks__path_ignored(const char *const *globs, size_t n, const char *path);

/* ---- the state object (shared by state.c, save.c and load.c) ---- */

typedef enum st_kind { ST_TENSOR, ST_OPTIM, ST_SCHED, ST_CUSTOM, ST_DATASET } st_kind;

typedef struct st_comp {
  st_kind kind;
  char *name;
  char *key;      /* ks__comp_prefix of the component: its index key */
  size_t key_len;
  uint64_t hash;
  ks_tensor t;    /* ST_TENSOR: borrowed data */
  void *obj;      /* ST_OPTIM / ST_SCHED / ST_DATASET */
  ks_stateful cb; /* ST_CUSTOM */
  int root;       /* ST_CUSTOM: its ks_state_root (KS_ROOT_CALLBACKS unless added with a root) */
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
  ks__hindex comp_index; /* comps by key */
  ks_timestamp *ts;
  ks_rng *rng;
  ks_metric_collection *train;
  st_eval *evals;
  size_t n_evals;
};

/* Key prefix of a component ("state/optimizers/AdamW/"). @return KS_OK or KS_E_LIMIT. */
KS_NODISCARD ks_status ks__comp_prefix(const st_comp *c, char *buf);
/* Records in meta the torch structure document (KS_TORCH_STRUCTURE_META) of sd, the flattened
 * state st: which folders of its optimizers, schedulers and RNGs are lists, tuples or int-keyed
 * dicts (structure.c). Nothing is recorded when every folder is a str-keyed dict. */
KS_NODISCARD ks_status ks__state_structure(const ks_state *st, const ks_statedict *sd, ks_meta *meta, ks_error *err);
/* The component whose key prefix is `key` (see ks__comp_prefix), or NULL. */
const st_comp *ks__comp_find(const ks_state *st, const char *key);

/* Which '/'-terminated prefixes the keys of a state dict have (prefixes.c). */
typedef struct ks__prefixes ks__prefixes;
KS_NODISCARD ks_status ks__prefixes_create(const ks_allocator *a, const ks_statedict *sd, ks__prefixes **out);
void ks__prefixes_free(ks__prefixes *p);
/* *found = some key starts with `prefix` (which ends in '/'). @return KS_OK, KS_E_INVALID or KS_E_NOMEM. */
KS_NODISCARD ks_status ks__prefixes_has(ks__prefixes *p, const char *prefix, int *found);

#define KS__STATE_LAYOUT_VERSION 1

/* ---- loading (load.c, load_metrics.c) ---- */

typedef struct ks__load_ctx {
  ks_state *st;
  const ks_statedict *src; /* the checkpoint minus ignored keys */
  struct ks__jv *metrics_meta; /* "keepsake.metrics" parsed, or NULL */
  ks__prefixes *prefixes;  /* of src, built on demand */
  ks_load_opts o;
  ks_load_report *rep;
  ks_error *err;
} ks__load_ctx;

/* Adds a report item with a formatted reason. @return KS_OK or KS_E_NOMEM. */
KS_NODISCARD ks_status ks__note(ks__load_ctx *c, ks_load_kind kind, const char *path, const char *fmt, ...)
    KS__PRINTF(4, 5);
/* *found = some key of the checkpoint starts with prefix (ends in '/'). @return KS_OK or an error in c->err. */
KS_NODISCARD ks_status ks__has_prefix(ks__load_ctx *c, const char *prefix, int *found);
/* Nonzero when path (or a '/'-prefix of it) matches an ignore glob. */
int ks__ignored(const ks__load_ctx *c, const char *path);
/* Fills every program metric (train and eval) from the checkpoint. */
KS_NODISCARD ks_status ks__load_metrics(ks__load_ctx *c);

#endif
