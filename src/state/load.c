/*
 * Load semantics: walk the program's components and fill each from the
 * checkpoint entry of the same name. Model mismatches are errors in strict mode
 * (checked before anything is written) and report items otherwise; everything
 * not loaded as-is ends up in the report. Metrics are in load_metrics.c.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/io_ops.h"
#include "core/json.h"
#include "core/pcopy.h"
#include "state/state_internal.h"

ks_status ks__note(ks__load_ctx *c, ks_load_kind kind, const char *path, const char *fmt, ...) {
  if (!c->rep) return KS_OK;
  char why[KS_ERROR_MSG_MAX + 256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  ks_status s = ks_load_report_add(c->rep, kind, path, why, NULL);
  return s ? ks__err(c->err, s, "load report: out of memory") : KS_OK;
}

ks_status ks__has_prefix(ks__load_ctx *c, const char *prefix, int *found) {
  ks_status s = c->prefixes ? KS_OK : ks__prefixes_create(&c->st->alloc, c->src, &c->prefixes);
  if (!s) s = ks__prefixes_has(c->prefixes, prefix, found);
  return s ? ks__err(c->err, s, "cannot index the checkpoint's keys") : KS_OK;
}

/* Any glob matching the path or one of its '/'-prefixes (`rng` ignores rng/0/...). */
int ks__path_ignored(const char *const *globs, size_t n, const char *path) {
  for (size_t i = 0; i < n; i++)
    if (ks_path_match(globs[i], path)) return 1;
  return 0;
}

int ks__ignored(const ks__load_ctx *c, const char *path) {
  return ks__path_ignored(c->o.ignore, c->o.n_ignore, path);
}

/* ---- model ---- */

/* Whether the program registered the model tensor of checkpoint key `key` (state/model/...). */
static int program_has_tensor(const ks_state *st, const char *key) { return ks__comp_find(st, key) != NULL; }

/* Why the stored tensor cannot fill the program's one (KS_OK when it can). */
static KS_NODISCARD ks_status tensor_problem(const ks_tensor *want, const ks_tensor *have, char *why, size_t cap) {
  char a[128], b[128];
  if (!have) return snprintf(why, cap, "not in the checkpoint"), KS_E_NOTFOUND;
  if (have->dtype != want->dtype)
    return snprintf(why, cap, "dtype %s in the checkpoint, %s in the program", ks_dtype_name(have->dtype),
                    ks_dtype_name(want->dtype)), KS_E_DTYPE;
  if (!ks_tensor_same_shape(want, have))
    return snprintf(why, cap, "shape %s in the checkpoint, %s in the program",
                    ks_shape_format(have->rank, have->shape, a, sizeof a),
                    ks_shape_format(want->rank, want->shape, b, sizeof b)), KS_E_SHAPE;
  return KS_OK;
}

/* Strict mode: every program tensor present and matching, no unexpected keys. */
static KS_NODISCARD ks_status check_model_strict(ks__load_ctx *c) {
  char k[KS__KEY_MAX + 1], why[400];
  for (size_t i = 0; i < c->st->n_comps; i++) {
    const st_comp *m = &c->st->comps[i];
    if (m->kind != ST_TENSOR || ks__comp_prefix(m, k) || ks__ignored(c, k)) continue;
    ks_status s = tensor_problem(&m->t, ks_statedict_tensor(c->src, k), why, sizeof why);
    if (s) return ks__err_at(c->err, s, NULL, k, -1, "strict model load: '%s': %s", k, why);
  }
  size_t n = ks_statedict_count(c->src);
  for (size_t i = 0; i < n; i++) {
    ks_entry e;
    if (ks_statedict_at(c->src, i, &e)) continue; /* index in range: cannot fail */
    if (strncmp(e.name, KS_KEY_MODEL, strlen(KS_KEY_MODEL)) || program_has_tensor(c->st, e.name)) continue;
    return ks__err_at(c->err, KS_E_MISMATCH, NULL, e.name, -1,
                      "strict model load: '%s' is in the checkpoint but not in the program", e.name);
  }
  return KS_OK;
}

static KS_NODISCARD ks_status load_one_tensor(ks__load_ctx *c, const st_comp *m, ks__copy *copies, size_t *loaded) {
  char k[KS__KEY_MAX + 1], why[400];
  if (ks__comp_prefix(m, k)) return ks__err(c->err, KS_E_LIMIT, "model tensor name too long");
  if (ks__ignored(c, k)) return ks__note(c, KS_LOAD_SKIPPED, k, "ignored by an ignore glob; kept as is");
  const ks_tensor *t = ks_statedict_tensor(c->src, k);
  ks_status s = tensor_problem(&m->t, t, why, sizeof why);
  if (s == KS_E_NOTFOUND) return ks__note(c, KS_LOAD_MISSING, k, "%s; kept as is", why);
  if (s) return ks__note(c, KS_LOAD_MISMATCHED, k, "%s; kept as is", why);
  /* A binding that read the bytes into the tensor itself hands the engine the tensor's own memory:
     nothing to copy, and memcpy onto itself would be undefined. */
  if (m->t.data != t->data) copies[*loaded] = (ks__copy){m->t.data, t->data, m->t.nbytes};
  else copies[*loaded] = (ks__copy){m->t.data, t->data, 0};
  (*loaded)++; /* copied with the others */
  return KS_OK;
}

static KS_NODISCARD ks_status note_unexpected_model_keys(ks__load_ctx *c) {
  size_t n = ks_statedict_count(c->src);
  for (size_t i = 0; i < n; i++) {
    ks_entry e;
    if (ks_statedict_at(c->src, i, &e)) continue; /* index in range: cannot fail */
    if (strncmp(e.name, KS_KEY_MODEL, strlen(KS_KEY_MODEL)) || program_has_tensor(c->st, e.name)) continue;
    ks_status s = ks__note(c, KS_LOAD_SKIPPED, e.name, "in the checkpoint, not in the program");
    if (s) return s;
  }
  return KS_OK;
}

/* The tensors are copied together once all are checked, on a few threads when they are large
   (ks__copy_parallel): a copy of a model's bytes on one core runs at one core's bandwidth. A
   failure midway still leaves the tensors before it loaded, as one copy after another did. */
static KS_NODISCARD ks_status load_model(ks__load_ctx *c) {
  size_t loaded = 0, total = 0;
  for (size_t i = 0; i < c->st->n_comps; i++) total += c->st->comps[i].kind == ST_TENSOR;
  ks__copy *copies = total ? ks__malloc(&c->st->alloc, total * sizeof *copies) : NULL;
  if (total && !copies) return ks__err(c->err, KS_E_NOMEM, "out of memory loading %zu model tensors", total);
  ks_status s = KS_OK;
  for (size_t i = 0; i < c->st->n_comps && !s; i++)
    if (c->st->comps[i].kind == ST_TENSOR) s = load_one_tensor(c, &c->st->comps[i], copies, &loaded);
  ks__copy_parallel(copies, loaded, 0);
  ks__free(&c->st->alloc, copies);
  if (s) return s;
  s = note_unexpected_model_keys(c);
  if (s || total == 0) return s;
  return ks__note(c, KS_LOAD_LOADED, "state/model", "%zu of %zu tensors", loaded, total);
}

/* ---- other components ---- */

static KS_NODISCARD ks_status load_dataset(ks_dataset_state *ds, const ks_statedict *src, const char *p,
                                           ks_error *err) {
  ks_dataset_state t;
  ks_status s = ks__get_int(src, p, "epoch", &t.epoch, err);
  if (!s) s = ks__get_int(src, p, "sample_in_epoch", &t.sample_in_epoch, err);
  if (!s) s = ks__get_int(src, p, "shuffle_seed", &t.shuffle_seed, err);
  if (!s && (t.epoch < 0 || t.sample_in_epoch < 0))
    s = ks__err_at(err, KS_E_VALUE, NULL, p, -1, "dataset state: negative position");
  if (!s) *ds = t;
  return s;
}

static KS_NODISCARD ks_status load_with(ks_stateful cb, const ks_statedict *src, const char *p, ks_error *err) {
  return cb.load_state_dict(cb.ctx, src, p, err);
}

static KS_NODISCARD ks_status call_loader(const st_comp *m, const ks_statedict *src, const char *p, ks_error *err) {
  switch (m->kind) {
  case ST_OPTIM: return load_with(ks_optimizer_stateful(m->obj), src, p, err);
  case ST_SCHED: return load_with(ks_scheduler_stateful(m->obj), src, p, err);
  case ST_CUSTOM: return m->cb.load_state_dict(m->cb.ctx, src, p, err);
  case ST_DATASET: return load_dataset(m->obj, src, p, err);
  case ST_TENSOR: break;
  }
  return KS_E_INVALID;
}

/*
 * One component under `prefix` ("state/optimizers/AdamW/"). A failure is an
 * error in strict mode and a `mismatched` item otherwise.
 */
typedef ks_status (*comp_loader)(void *obj, const ks_statedict *src, const char *prefix, ks_error *err);

static KS_NODISCARD ks_status load_generic(ks__load_ctx *c, const char *prefix, const st_comp *m, comp_loader fn,
                                           void *obj) {
  char path[KS__KEY_MAX + 1];
  snprintf(path, sizeof path, "%.*s", (int)strlen(prefix) - 1, prefix);
  if (ks__ignored(c, path)) return ks__note(c, KS_LOAD_SKIPPED, path, "ignored by an ignore glob; kept as is");
  int present;
  ks_status s = ks__has_prefix(c, prefix, &present);
  if (s) return s;
  if (!present) return ks__note(c, KS_LOAD_MISSING, path, "not in the checkpoint; kept as is");
  ks_error e;
  ks_error_clear(&e);
  s = m ? call_loader(m, c->src, prefix, &e) : fn(obj, c->src, prefix, &e);
  if (s == KS_E_NOMEM || (s && !c->o.non_strict_model)) {
    if (c->err) *c->err = e;
    return s;
  }
  if (s) return ks__note(c, KS_LOAD_MISMATCHED, path, "%s; kept as is", e.message);
  return ks__note(c, KS_LOAD_LOADED, path, "restored");
}

static KS_NODISCARD ks_status ts_loader(void *obj, const ks_statedict *src, const char *p, ks_error *err) {
  return load_with(ks_timestamp_stateful(obj), src, p, err);
}

static KS_NODISCARD ks_status rng_loader(void *obj, const ks_statedict *src, const char *p, ks_error *err) {
  return load_with(ks_rng_stateful(obj), src, p, err);
}

static KS_NODISCARD ks_status load_components(ks__load_ctx *c) {
  for (size_t i = 0; i < c->st->n_comps; i++) {
    const st_comp *m = &c->st->comps[i];
    char p[KS__KEY_MAX + 1];
    if (m->kind == ST_TENSOR) continue;
    if (ks__comp_prefix(m, p)) return ks__err(c->err, KS_E_LIMIT, "component name too long");
    ks_status s = load_generic(c, p, m, NULL, NULL);
    if (s) return s;
  }
  ks_status s = KS_OK;
  if (c->st->ts) s = load_generic(c, KS_KEY_TIMESTAMP, NULL, ts_loader, c->st->ts);
  if (!s && c->st->rng) s = load_generic(c, "rng/0/", NULL, rng_loader, c->st->rng);
  return s;
}

/* The run's identity comes from the checkpoint, as Composer's autoresume does. */
static KS_NODISCARD ks_status load_identity(ks__load_ctx *c) {
  ks_entry e;
  if (!ks__ignored(c, KS_KEY_RANK_ZERO_SEED) && ks_statedict_get(c->src, KS_KEY_RANK_ZERO_SEED, &e) == KS_OK &&
      e.kind == KS_VAL_INT)
    c->st->rank_zero_seed = e.i;
  if (ks__ignored(c, KS_KEY_RUN_NAME) || ks_statedict_get(c->src, KS_KEY_RUN_NAME, &e) != KS_OK ||
      e.kind != KS_VAL_STRING)
    return KS_OK;
  char *name = ks__strdup(&c->st->alloc, e.s);
  if (!name) return ks__err(c->err, KS_E_NOMEM, "out of memory");
  ks__free(&c->st->alloc, c->st->run_name);
  c->st->run_name = name;
  return KS_OK;
}

/* ---- checkpoint components the program lacks ---- */

/* Whether the program registered the component at `path` (state/optimizers/AdamW). */
static int program_has(const ks_state *st, const char *path) {
  char p[KS__KEY_MAX + 1];
  return !ks__keyf(p, path, "/") && ks__comp_find(st, p) != NULL;
}

/* Cuts `name` after its n-th '/'-separated segment into out; 0 when it has fewer. */
static int first_segments(const char *name, int n, char *out) {
  const char *p = name;
  for (int i = 0; i < n; i++) {
    p = strchr(p, '/');
    if (!p) return 0;
    if (i + 1 < n) p++;
  }
  snprintf(out, KS__KEY_MAX + 1, "%.*s", (int)(p - name), name);
  return 1;
}

static KS_NODISCARD ks_status note_extra_components(ks__load_ctx *c) {
  static const char *const roots[] = {KS_KEY_OPTIMIZERS, KS_KEY_SCHEDULERS, KS_KEY_CALLBACKS,
                                      KS_KEY_DATASET_STATE};
  size_t n = ks_statedict_count(c->src);
  for (size_t i = 0; i < n && c->rep; i++) {
    ks_entry e;
    char path[KS__KEY_MAX + 1];
    if (ks_statedict_at(c->src, i, &e)) continue; /* index in range: cannot fail */
    for (size_t r = 0; r < 4; r++) {
      if (strncmp(e.name, roots[r], strlen(roots[r])) || !first_segments(e.name, 3, path)) continue;
      if (program_has(c->st, path) || ks_load_report_find(c->rep, path)) continue;
      ks_status s = ks__note(c, KS_LOAD_SKIPPED, path, "in the checkpoint, not in the program");
      if (s) return s;
    }
  }
  return KS_OK;
}

static KS_NODISCARD ks_status note_weights_only(ks__load_ctx *c) {
  char p[KS__KEY_MAX + 1];
  ks_status s = KS_OK;
  for (size_t i = 0; i < c->st->n_comps && !s; i++) {
    if (c->st->comps[i].kind == ST_TENSOR || ks__comp_prefix(&c->st->comps[i], p)) continue;
    p[strlen(p) - 1] = '\0';
    s = ks__note(c, KS_LOAD_SKIPPED, p, "weights-only load; kept as is");
  }
  if (!s && c->st->ts) s = ks__note(c, KS_LOAD_SKIPPED, "state/timestamp/Timestamp", "weights-only load; kept as is");
  if (!s && c->st->rng) s = ks__note(c, KS_LOAD_SKIPPED, "rng/0", "weights-only load; kept as is");
  if (!s && c->st->train) s = ks__note(c, KS_LOAD_SKIPPED, "state/train_metrics", "weights-only load; kept as is");
  for (size_t i = 0; i < c->st->n_evals && !s; i++) {
    snprintf(p, sizeof p, KS_KEY_EVAL_METRICS "%s", c->st->evals[i].label);
    s = ks__note(c, KS_LOAD_SKIPPED, p, "weights-only load; kept as is");
  }
  return s;
}

/* ---- entry points ---- */

/* The checkpoint without the entries an ignore glob matches, nor the model's when the program has
 * none (tensor data borrowed). */
static KS_NODISCARD ks_status filter_ignored(ks__load_ctx *c, const ks_statedict *src, ks_statedict **out) {
  ks_statedict *view;
  ks_status s = ks_statedict_create(&c->st->alloc, &view, NULL);
  size_t n = ks_statedict_count(src);
  for (size_t i = 0; i < n && !s; i++) {
    ks_entry e;
    if (ks_statedict_at(src, i, &e)) continue; /* index in range: cannot fail */
    if (ks__ignored(c, e.name) || (c->o.model_absent && !strncmp(e.name, KS_KEY_MODEL, strlen(KS_KEY_MODEL))))
      continue;
    s = ks_statedict_set_entry(view, e.name, &e, KS_BORROW, NULL);
  }
  if (s) {
    ks_statedict_free(view);
    return ks__err(c->err, s, "cannot filter ignored keys");
  }
  *out = view;
  return KS_OK;
}

static KS_NODISCARD ks_status parse_metrics_meta(ks__load_ctx *c, const ks_meta *meta) {
  const char *txt = meta ? ks_meta_get(meta, KS_META_METRICS) : NULL;
  if (!txt) return KS_OK;
  ks_error je;
  ks_error_clear(&je);
  ks__jv *j = NULL;
  ks_status s = ks__jv_parse(&c->st->alloc, txt, strlen(txt), KS_META_METRICS, &j, &je);
  if (s == KS_E_NOMEM) return ks__err(c->err, s, "out of memory parsing metadata '%s'", KS_META_METRICS);
  if (s || !ks__jv_is(j, KS__JV_OBJECT)) {
    ks__jv_free(&c->st->alloc, j);
    return ks__err_at(c->err, KS_E_FORMAT, NULL, KS_META_METRICS, s ? je.offset : -1,
                      "metadata '%s' is not a JSON object: %s", KS_META_METRICS, s ? je.message : "another value");
  }
  c->metrics_meta = j;
  return KS_OK;
}

static KS_NODISCARD ks_status load_all(ks__load_ctx *c) {
  ks_status s = c->o.non_strict_model ? KS_OK : check_model_strict(c);
  if (!s) s = load_model(c);
  if (s || c->o.weights_only) return s ? s : note_weights_only(c);
  s = load_components(c);
  if (!s) s = ks__load_metrics(c);
  if (!s) s = note_extra_components(c);
  if (!s) s = load_identity(c);
  return s;
}

ks_status ks_state_load_state_dict(ks_state *st, const ks_statedict *src, const ks_meta *meta,
                                   const ks_load_opts *opts, ks_load_report *report, ks_error *err) {
  if (!st || !src) return ks__err(err, KS_E_INVALID, "load: NULL argument");
  ks_error_clear(err);
  KS__TAKE_OPTS(ks_load_opts, opts, KS__V1_SIZE(ks_load_opts, verify_checksums), err);
  ks__load_ctx c = {.st = st, .src = src, .rep = report, .err = err};
  if (opts) c.o = *opts;
  ks_statedict *view = NULL;
  ks_status s = c.o.n_ignore || c.o.model_absent ? filter_ignored(&c, src, &view) : KS_OK;
  if (view) c.src = view;
  if (!s) s = parse_metrics_meta(&c, meta);
  if (!s) s = load_all(&c);
  ks__jv_free(&st->alloc, c.metrics_meta);
  ks__prefixes_free(c.prefixes);
  ks_statedict_free(view);
  return s;
}

ks_status ks_state_load(ks_state *st, const char *path, const ks_load_opts *opts, ks_load_report *report,
                        ks_error *err) {
  if (!st || !path) return ks__err(err, KS_E_INVALID, "load: NULL argument");
  KS__TAKE_OPTS(ks_load_opts, opts, KS__V1_SIZE(ks_load_opts, verify_checksums), err);
  const ks_io *io = opts ? opts->io : NULL;
  ks_read_opts ro = {.alloc = &st->alloc, .mode = ks__io_read_mode(io), .io = io,
                     .verify_checksums = opts && opts->verify_checksums};
  ks_statedict *sd = NULL;
  ks_meta *meta = NULL;
  ks_status s = ks_load(path, &ro, &sd, &meta, err);
  if (s) return s;
  s = ks_state_load_state_dict(st, sd, meta, opts, report, err);
  if (s) ks__err_set_file(err, path);
  ks_meta_free(meta);
  ks_statedict_free(sd);
  return s;
}
