/*
 * Metrics on load: rebuilt from the program's definitions (its factory), then
 * filled by name. A metric whose class or arguments changed is reported and
 * left at its defaults; old schemas are migrated; _computed and the update
 * count are restored so compute() answers at once.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "keepsake/layout.h"
#include "state/state_internal.h"

/*
 * Where the stored metric's class/args differ from the program's: *problem is
 * `why` then, NULL when compatible. @return KS_OK or KS_E_NOMEM.
 */
static KS_NODISCARD ks_status definition_problem(const ks_allocator *a, const ks__jv *me, const ks_metric *m, char *why,
                                    size_t cap, const char **problem) {
  *problem = NULL;
  const char *cls = ks__jv_string(ks__jv_get(me, "class"));
  if (cls && strcmp(cls, ks_metric_class(m)) != 0) {
    snprintf(why, cap, "class %s in the checkpoint, %s in the program", cls, ks_metric_class(m));
    *problem = why;
    return KS_OK;
  }
  const ks__jv *stored = ks__jv_get(me, "args");
  const char *txt = ks_metric_args_json(m);
  ks__jv *mine = NULL;
  ks_status s = stored && txt ? ks__jv_parse(a, txt, strlen(txt), "args", &mine, NULL) : KS_OK;
  if (s == KS_E_NOMEM) return s;
  /* A described metric of a class the catalogue cannot build has no arguments: class only. */
  int same = !stored || !txt || (mine && ks__jv_equal(stored, mine));
  ks__jv_free(a, mine);
  if (same) return KS_OK;
  char *d = ks__jv_dump(a, stored, true);
  if (!d) return KS_E_NOMEM;
  snprintf(why, cap, "arguments changed: %s in the checkpoint, %s in the program", d, txt ? txt : "?");
  ks__free(a, d);
  *problem = why;
  return KS_OK;
}

typedef struct stored_info {
  int schema_version;
  int64_t update_count;
} stored_info;

/*
 * Without keepsake metadata (a converted Composer file) the states are taken as
 * current-schema, and the count as 1: Composer's own workaround, so compute()
 * does not warn that it ran before update().
 */
static stored_info stored_of(const ks__jv *me) {
  stored_info si = {KS_METRIC_SCHEMA_VERSION, 1};
  int64_t v;
  if (ks__jv_is_int(ks__jv_get(me, "schema_version"), &v) && v >= INT32_MIN && v <= INT32_MAX)
    si.schema_version = (int)v;
  if (ks__jv_is_int(ks__jv_get(me, "update_count"), &v) && v >= 0) si.update_count = v;
  return si;
}

/* The attributes a described metric declares (a wrapper's), from `<path>/attrs/`: a refusal in *e. */
static KS_NODISCARD ks_status load_attrs(ks__load_ctx *c, ks_metric *m, const char *path, ks_error *e) {
  char prefix[KS__KEY_MAX + 1];
  if (ks__key(prefix, path, "/" KS_KEY_METRIC_ATTRS)) return ks__key_limit(c->err, path, "/" KS_KEY_METRIC_ATTRS);
  return ks_metric_load_attrs(m, c->src, prefix, e);
}

static KS_NODISCARD ks_status restore_computed(ks__load_ctx *c, ks_metric *m, const char *path, int64_t count) {
  char k[KS__KEY_MAX + 1];
  if (ks_state_key(KS_PART_METRIC_COMPUTED, path, NULL, k, sizeof k, NULL))
    return ks__key_limit(c->err, path, "/" KS_KEY_METRIC_COMPUTED);
  const ks_tensor *t = ks_statedict_tensor(c->src, k);
  ks_error e;
  ks_status s = ks_metric_restore_computed(m, t, count, &e);
  if (s && c->err) *c->err = e;
  return s;
}

/* The update count an inner metric was saved with (`<path>/update_count`), 1 when absent. */
static int64_t inner_count(const ks__load_ctx *c, const char *path) {
  char k[KS__KEY_MAX + 1];
  ks_entry e;
  if (ks_state_key(KS_PART_METRIC_UPDATE_COUNT, path, NULL, k, sizeof k, NULL) || ks_statedict_get(c->src, k, &e))
    return 1;
  return e.kind == KS_VAL_INT && e.i >= 0 ? e.i : 1;
}

/*
 * The inner metrics of a described wrapper, each from `<path>/inner/<name>/` in the current
 * schema (they were never written by another). A refusal is returned in *e (the caller resets
 * the wrapper: all or nothing); KS_E_NOMEM and key limits in c->err.
 */
static KS_NODISCARD ks_status fill_inner(ks__load_ctx *c, ks_metric *m, const char *path, const ks__jv *me,
                                         int *migrated, int *converted, ks_error *e) {
  const ks__jv *classes = ks__jv_get(me, "inner"); /* the record's {name: class}, when the writer gave it */
  for (size_t i = 0; i < ks_metric_inner_count(m); i++) {
    const char *name;
    ks_metric *in = ks_metric_inner_at(m, i, &name);
    const char *saved = ks__jv_string(ks__jv_get(classes, name));
    if (saved && strcmp(saved, ks_metric_class(in)))
      return ks__err_at(e, KS_E_MISMATCH, NULL, path, -1, "inner metric '%s': class %s in the checkpoint, %s in the "
                        "program", name, saved, ks_metric_class(in));
    char ipath[KS__KEY_MAX + 1], prefix[KS__KEY_MAX + 1];
    if (ks_state_key(KS_PART_METRIC_INNER, path, name, ipath, sizeof ipath, NULL))
      return ks__key_limit(c->err, path, name);
    if (ks__key(prefix, ipath, "/")) return ks__key_limit(c->err, ipath, "/");
    int present;
    ks_status s = ks__has_prefix(c, prefix, &present); /* a wrapper of wrappers may hold no state */
    if (!s && ks__key(prefix, ipath, "/" KS_KEY_METRIC_STATES)) return ks__key_limit(c->err, ipath, "/");
    if (s) return s;
    if (!present) return ks__err_at(e, KS_E_NOTFOUND, NULL, ipath, -1, "inner metric '%s' is not in the checkpoint",
                                    name);
    s = ks_metric_load_state_dict(in, c->src, prefix, KS_METRIC_SCHEMA_VERSION, c->o.allow_narrowing, migrated,
                                  converted, e);
    if (!s) s = load_attrs(c, in, ipath, e);
    if (!s) s = restore_computed(c, in, ipath, inner_count(c, ipath));
    if (!s) s = fill_inner(c, in, ipath, NULL, migrated, converted, e);
    if (s) return s;
  }
  return KS_OK;
}

static KS_NODISCARD ks_status fill(ks__load_ctx *c, ks_metric *m, const char *path, const ks__jv *me) {
  char prefix[KS__KEY_MAX + 1];
  if (ks__key(prefix, path, "/" KS_KEY_METRIC_STATES)) return ks__key_limit(c->err, path, "/" KS_KEY_METRIC_STATES);
  stored_info si = stored_of(me);
  int migrated = 0, converted = 0, inner_mig = 0, inner_conv = 0;
  ks_error e;
  ks_error_clear(&e);
  ks_status s = ks_metric_load_state_dict(m, c->src, prefix, si.schema_version, c->o.allow_narrowing, &migrated,
                                          &converted, &e);
  if (s == KS_E_NOMEM) return ks__err(c->err, s, "out of memory loading %s", path);
  if (s) {
    ks_metric_reset(m);
    return ks__note(c, KS_LOAD_MISMATCHED, path, "%s; left at defaults", e.message);
  }
  s = load_attrs(c, m, path, &e); /* a wrapper is filled whole or not at all: its attributes too */
  if (!s) s = restore_computed(c, m, path, si.update_count);
  if (!s) s = fill_inner(c, m, path, me, &inner_mig, &inner_conv, &e);
  if (s == KS_E_NOMEM && !e.code) return s;
  if (s == KS_E_NOMEM) return ks__err(c->err, s, "out of memory loading %s", path);
  if (s && e.code) {
    ks_metric_reset(m);
    return ks__note(c, KS_LOAD_MISMATCHED, path, "%s; left at defaults", e.message);
  }
  if (s) return s;
  migrated |= inner_mig;
  converted |= inner_conv;
  /* Old shapes (a 0-d MSE sum) are reshaped whatever version the metadata names, if any. */
  if (migrated && si.schema_version < KS_METRIC_SCHEMA_VERSION)
    return ks__note(c, KS_LOAD_MIGRATED, path, "schema v%d states migrated to v%d%s", si.schema_version,
                    KS_METRIC_SCHEMA_VERSION, converted ? ", dtypes converted" : "");
  if (migrated)
    return ks__note(c, KS_LOAD_MIGRATED, path, "old state shapes migrated to schema v%d%s",
                    KS_METRIC_SCHEMA_VERSION, converted ? ", dtypes converted" : "");
  if (converted)
    return ks__note(c, KS_LOAD_CONVERTED, path, "stored dtypes converted to the declared ones%s",
                    c->o.allow_narrowing ? " (narrowing allowed)" : "");
  return ks__note(c, KS_LOAD_LOADED, path, "%zu states, %lld updates", ks_metric_state_count(m),
                  (long long)si.update_count);
}

static KS_NODISCARD ks_status load_metric(ks__load_ctx *c, ks_metric *m, const char *path) {
  char prefix[KS__KEY_MAX + 1], why[KS_ERROR_MSG_MAX];
  if (ks__ignored(c, path)) {
    ks_metric_reset(m);
    return ks__note(c, KS_LOAD_SKIPPED, path, "ignored by an ignore glob; left at defaults");
  }
  if (ks__key(prefix, path, "/")) return ks__key_limit(c->err, path, "/");
  int present;
  ks_status s = ks__has_prefix(c, prefix, &present);
  if (s) return s;
  if (!present) {
    ks_metric_reset(m);
    return ks__note(c, KS_LOAD_MISSING, path, "not in the checkpoint; left at defaults");
  }
  const ks__jv *me = ks__jv_get(c->metrics_meta, path);
  const char *problem = NULL;
  s = me ? definition_problem(&c->st->alloc, me, m, why, sizeof why, &problem) : KS_OK;
  if (s) return ks__err(c->err, s, "out of memory comparing metric arguments of %s", path);
  if (problem) {
    ks_metric_reset(m);
    return ks__note(c, KS_LOAD_MISMATCHED, path, "%s; left at defaults", why);
  }
  return fill(c, m, path, me);
}

static KS_NODISCARD ks_status load_collection(ks__load_ctx *c, ks_metric_collection *mc, const char *root) {
  size_t n = ks_metric_collection_count(mc);
  for (size_t i = 0; i < n; i++) {
    const char *name;
    ks_metric *m = ks_metric_collection_at(mc, i, &name);
    char path[KS__KEY_MAX + 1];
    if (ks__key(path, root, name)) return ks__key_limit(c->err, root, name);
    ks_status s = load_metric(c, m, path);
    if (s) return s;
  }
  return KS_OK;
}

/* Nonzero when a '/'-prefix of name is a reported metric path: a name or label holding '/'. */
static int covered(const ks__load_ctx *c, const char *name) {
  char path[KS__KEY_MAX + 1];
  for (const char *p = strchr(name, '/'); p; p = strchr(p + 1, '/')) {
    snprintf(path, sizeof path, "%.*s", (int)(p - name), name);
    if (ks_load_report_find(c->rep, path)) return 1;
  }
  return 0;
}

/* Metrics that keepsake.metrics names (exact paths) and the program does not define. */
static KS_NODISCARD ks_status note_extra_named(ks__load_ctx *c) {
  const ks__jv *meta = c->metrics_meta;
  for (size_t i = 0; i < meta->len; i++) {
    const char *path = meta->keys[i];
    if (!c->rep || ks__ignored(c, path) || ks_load_report_find(c->rep, path)) continue;
    ks_status s = ks__note(c, KS_LOAD_SKIPPED, path, "in the checkpoint, not in the program");
    if (s) return s;
  }
  return KS_OK;
}

/* Checkpoint metrics the program does not define: skipped, as Composer does. */
static KS_NODISCARD ks_status note_extra(ks__load_ctx *c) {
  size_t n = ks_statedict_count(c->src);
  ks_status s0 = c->metrics_meta ? note_extra_named(c) : KS_OK;
  if (s0) return s0;
  for (size_t i = 0; i < n && c->rep; i++) {
    ks_entry e;
    if (ks_statedict_at(c->src, i, &e)) continue; /* index in range: cannot fail */
    int train = !strncmp(e.name, KS_KEY_TRAIN_METRICS, strlen(KS_KEY_TRAIN_METRICS));
    if (!train && strncmp(e.name, KS_KEY_EVAL_METRICS, strlen(KS_KEY_EVAL_METRICS))) continue;
    if (covered(c, e.name)) continue;
    char path[KS__KEY_MAX + 1], label[KS__KEY_MAX + 1];
    const char *rest = e.name + strlen(train ? KS_KEY_TRAIN_METRICS : KS_KEY_EVAL_METRICS), *slash = strchr(rest, '/');
    if (!slash) continue;
    const ks_metric_collection *mc = c->st->train;
    if (!train) {
      snprintf(label, sizeof label, "%.*s", (int)(slash - rest), rest);
      mc = ks_state_eval_metrics(c->st, label);
      rest = slash + 1;
      slash = strchr(rest, '/');
      if (!slash) continue;
    }
    snprintf(path, sizeof path, "%.*s", (int)(slash - e.name), e.name);
    char mname[KS__KEY_MAX + 1];
    snprintf(mname, sizeof mname, "%.*s", (int)(slash - rest), rest);
    if ((mc && ks_metric_collection_get(mc, mname)) || ks_load_report_find(c->rep, path)) continue;
    ks_status s = ks__note(c, KS_LOAD_SKIPPED, path, "in the checkpoint, not in the program");
    if (s) return s;
  }
  return KS_OK;
}

ks_status ks__load_metrics(ks__load_ctx *c) {
  ks_status s = c->st->train ? load_collection(c, c->st->train, KS_KEY_TRAIN_METRICS) : KS_OK;
  for (size_t i = 0; i < c->st->n_evals && !s; i++) {
    char root[KS__KEY_MAX + 1];
    if (ks__keyf(root, KS_KEY_EVAL_METRICS, "%s/", c->st->evals[i].label))
      return ks__key_limit(c->err, KS_KEY_EVAL_METRICS, c->st->evals[i].label);
    s = load_collection(c, c->st->evals[i].metrics, root);
  }
  return s ? s : note_extra(c);
}
