/*
 * `keepsake inspect` on a training checkpoint: the run's identity and
 * timestamp, its components, and its metrics with their computed values.
 * Hooks into cmd_inspect.c through ks_inspect_components (cli_common.h).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_common.h"
#include "keepsake/layout.h"
#include "keepsake/state.h"


int ks_inspect_component_owns_key(const char *key) {
  return !strcmp(key, KS_META_METRICS) || !strcmp(key, KS_META_STATE);
}

typedef struct comp_row {
  char path[512];
  size_t entries;
  uint64_t bytes;
} comp_row;

/* Rows merge by component path through a hash index: a linear search per key made
   inspect quadratic in the number of components. */
static int add_entry(ks_cli_index *idx, comp_row **rows, size_t *n, size_t *cap, const char *key, uint64_t bytes) {
  char path[512];
  ks_cli_component_of(key, path, sizeof path);
  size_t i = ks_cli_index_get_or_add(idx, path, *n);
  if (i == SIZE_MAX) return -1;
  if (i == *n) {
    if (*n == *cap) {
      size_t ncap = *cap ? *cap * 2 : 64;
      comp_row *r = realloc(*rows, ncap * sizeof **rows);
      if (!r) return -1;
      *rows = r, *cap = ncap;
    }
    snprintf((*rows)[i].path, sizeof (*rows)[i].path, "%s", path);
    (*rows)[i].entries = 0;
    (*rows)[i].bytes = 0;
    (*n)++;
  }
  (*rows)[i].entries++;
  (*rows)[i].bytes += bytes;
  return 0;
}

static int components(const ks_statedict *sd, FILE *out, json_t *json) {
  comp_row *rows = NULL;
  size_t n = 0, cap = 0;
  ks_cli_index *idx = ks_cli_index_new();
  int rc = idx ? 0 : -1;
  for (size_t i = 0; i < ks_statedict_count(sd) && !rc; i++) {
    ks_entry e;
    if (ks_statedict_at(sd, i, &e)) continue; /* index in range: cannot fail */
    rc = add_entry(idx, &rows, &n, &cap, e.name, e.kind == KS_VAL_TENSOR ? e.tensor.nbytes : 0);
  }
  ks_cli_index_free(idx);
  const char *hdr[] = {"COMPONENT", "ENTRIES", "BYTES"};
  ks_cli_table *t = json ? NULL : ks_cli_table_new(3, hdr);
  json_t *arr = json ? json_array() : NULL;
  for (size_t i = 0; i < n && !rc; i++) {
    char ne[32], nb[32];
    snprintf(ne, sizeof ne, "%zu", rows[i].entries);
    snprintf(nb, sizeof nb, "%llu", (unsigned long long)rows[i].bytes);
    const char *cells[] = {rows[i].path, ne, nb};
    if (t) rc = ks_cli_table_add(t, cells);
    if (arr) json_array_append_new(arr, json_pack("{s:s, s:I, s:I}", "path", rows[i].path, "entries",
                                                  (json_int_t)rows[i].entries, "bytes", (json_int_t)rows[i].bytes));
  }
  if (t) ks_cli_table_print(t, out, "\ncomponents");
  if (arr) json_object_set_new(json, "components", arr);
  ks_cli_table_free(t);
  free(rows);
  return rc;
}

/* The value of `_computed`: a number for 0-d/1-element results, a shape otherwise, None when absent. */
static void computed_text(const ks_statedict *sd, const char *path, char *buf, size_t cap) {
  char k[1100];
  ks_entry e;
  snprintf(k, sizeof k, "%s/" KS_KEY_METRIC_COMPUTED, path);
  if (ks_statedict_get(sd, k, &e) != KS_OK) snprintf(buf, cap, "-");
  else if (e.kind != KS_VAL_TENSOR) snprintf(buf, cap, "None");
  else if (ks_tensor_numel(&e.tensor) == 1)
    snprintf(buf, cap, "%.6g", ks_dtype_get_f64(e.tensor.dtype, e.tensor.data, 0));
  else {
    char s[96];
    snprintf(buf, cap, "%s %s tensor", ks_dtype_name(e.tensor.dtype), ks_cli_shape(&e.tensor, s, sizeof s));
  }
}

static int metrics(const ks_reader *r, const ks_statedict *sd, FILE *out, json_t *json) {
  const char *txt = ks_meta_get(ks_reader_meta(r), KS_META_METRICS);
  json_t *mj = txt ? json_loads(txt, JSON_REJECT_DUPLICATES, NULL) : NULL;
  if (!mj) return 0;
  const char *hdr[] = {"METRIC", "CLASS", "ARGS", "SCHEMA", "UPDATES", "COMPUTED"};
  ks_cli_table *t = json ? NULL : ks_cli_table_new(6, hdr);
  json_t *obj = json ? json_object() : NULL;
  const char *path;
  json_t *m;
  int rc = 0;
  json_object_foreach(mj, path, m) {
    char *args = json_dumps(json_object_get(m, "args"), JSON_COMPACT | JSON_SORT_KEYS);
    char sv[16], uc[32], comp[160];
    snprintf(sv, sizeof sv, "%lld", (long long)json_integer_value(json_object_get(m, "schema_version")));
    snprintf(uc, sizeof uc, "%lld", (long long)json_integer_value(json_object_get(m, "update_count")));
    computed_text(sd, path, comp, sizeof comp);
    const char *cls = json_string_value(json_object_get(m, "class"));
    const char *cells[] = {path, cls ? cls : "?", args ? args : "{}", sv, uc, comp};
    if (t && ks_cli_table_add(t, cells)) rc = -1;
    if (obj) {
      json_t *one = json_deep_copy(m);
      json_object_set_new(one, "computed", json_string(comp));
      json_object_set_new(obj, path, one);
    }
    free(args);
  }
  if (t) ks_cli_table_print(t, out, "\nmetrics");
  if (obj) json_object_set_new(json, "metrics", obj);
  ks_cli_table_free(t);
  json_decref(mj);
  return rc;
}

static void timestamp(const ks_statedict *sd, FILE *out, json_t *json) {
  static const char *const f[] = {"epoch", "batch", "sample", "token", "batch_in_epoch", "sample_in_epoch",
                                  "token_in_epoch", "total_wct", "epoch_wct", "batch_wct"};
  json_t *obj = json ? json_object() : NULL;
  int any = 0;
  for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
    char k[96], v[64];
    ks_entry e;
    snprintf(k, sizeof k, KS_KEY_TIMESTAMP "%s", f[i]);
    if (ks_statedict_get(sd, k, &e) != KS_OK) continue;
    if (!any++ && out && !json) fprintf(out, "\ntimestamp\n");
    if (obj) json_object_set_new(obj, f[i], ks_cli_scalar_json(&e));
    else fprintf(out, "  %-16s %s\n", f[i], ks_cli_esc(ks_cli_scalar_text(&e, v, sizeof v)));
  }
  if (obj && any) json_object_set_new(json, "timestamp", obj);
  else json_decref(obj);
}

static void identity(const ks_statedict *sd, FILE *out, json_t *json) {
  ks_entry name, seed;
  int has_name = ks_statedict_get(sd, KS_KEY_RUN_NAME, &name) == KS_OK && name.kind == KS_VAL_STRING;
  int has_seed = ks_statedict_get(sd, KS_KEY_RANK_ZERO_SEED, &seed) == KS_OK && seed.kind == KS_VAL_INT;
  if (json) {
    if (has_name) json_object_set_new(json, "run_name", json_string(name.s));
    if (has_seed) json_object_set_new(json, "rank_zero_seed", json_integer(seed.i));
  } else if (has_name || has_seed) {
    fprintf(out, "\ntraining checkpoint: run '%s', rank_zero_seed %lld\n", has_name ? ks_cli_esc(name.s) : "?",
            has_seed ? (long long)seed.i : 0LL);
  }
}

int ks_inspect_components(const ks_reader *r, FILE *out, json_t *json) {
  ks_statedict *sd;
  ks_error err;
  if (ks_statedict_create(NULL, &sd, NULL)) return fprintf(stderr, "keepsake inspect: out of memory\n"), -1;
  for (size_t i = 0; i < ks_reader_count(r); i++) {
    const char *name;
    ks_tensor v;
    if (!ks_reader_tensor_at(r, i, &name, &v) && ks_statedict_set_tensor(sd, name, &v, KS_BORROW, NULL)) break;
  }
  int rc = 0;
  if (ks_reader_scalars(r, sd, &err)) {
    ks_cli_print_error(stderr, "inspect", &err);
    rc = -1;
  }
  ks_entry e;
  int is_state = !rc && (ks_statedict_get(sd, KS_KEY_RUN_NAME, &e) == KS_OK ||
                         ks_meta_get(ks_reader_meta(r), KS_META_METRICS) != NULL);
  if (is_state) {
    identity(sd, out, json);
    timestamp(sd, out, json);
    rc = components(sd, out, json);
    if (!rc) rc = metrics(r, sd, out, json);
  }
  ks_statedict_free(sd);
  return rc;
}
