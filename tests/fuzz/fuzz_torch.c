/*
 * libFuzzer target: the Composer / torch import path as `keepsake convert` runs it.
 * The input is a pickle program (or a template, see expand.h); the target wraps it
 * in a valid torch archive with four 4 KiB storages (keys "0".."3"), so every run
 * gets past the zip layer, then: the library's import as convert runs it
 * (ks_torch_import of the bytes: flattening, the Composer layout and the metric rebuild
 * from pickled attributes), and each metric its "keepsake.metrics" describes
 * created, filled from the dict and computed.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "expand.h"
#include "keepsake/import.h"
#include "keepsake/keepsake.h"
#include "testutil.h"
#include "keepsake/layout.h"
#include "keepsake/torch.h"
#include "torch/torch_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct membuf {
  uint8_t *p;
  size_t n, cap;
} membuf;

static ks_status put(void *ctx, const void *p, size_t n) {
  membuf *b = ctx;
  if (b->n + n > b->cap) {
    size_t cap = (b->n + n) * 2;
    uint8_t *q = realloc(b->p, cap);
    if (!q) return KS_E_NOMEM;
    b->p = q, b->cap = cap;
  }
  memcpy(b->p + b->n, p, n);
  b->n += n;
  return KS_OK;
}

static int archive(const uint8_t *pkl, size_t n, membuf *out) {
  static uint8_t storage[4][4096];
  for (int s = 0; s < 4; s++)
    for (int i = 0; i < 4096; i++) storage[s][i] = (uint8_t)(s == 0 ? 0 : s == 1 ? i : s == 2 ? 0xFF : i * 7 + 1);
  ks__zw *z = NULL;
  if (ks__zw_create(NULL, put, out, 0, &z)) return -1;
  ks_status st = ks__zw_add(z, "archive/data.pkl", pkl, n, NULL);
  char name[32];
  for (int s = 0; s < 4 && !st; s++) {
    snprintf(name, sizeof name, "archive/data/%d", s);
    st = ks__zw_add(z, name, storage[s], sizeof storage[s], NULL);
  }
  if (!st) st = ks__zw_add(z, "archive/byteorder", "little", 6, NULL);
  if (!st) st = ks__zw_add(z, "archive/version", "3\n", 2, NULL);
  if (!st) st = ks__zw_finish(z, NULL);
  ks__zw_free(z);
  return st ? -1 : 0;
}

/* Creates every metric the description names and fills it from the dict, as the state loader would. */
static void rebuild_metrics(const char *metrics_json, const ks_statedict *sd) {
  json_t *all = json_loads(metrics_json, 0, NULL);
  const char *path;
  json_t *m;
  json_object_foreach(all, path, m) {
    const char *cls = json_string_value(json_object_get(m, "class"));
    char *args = json_dumps(json_object_get(m, "args"), JSON_COMPACT | JSON_ENCODE_ANY);
    ks_metric *metric = NULL;
    if (cls && ks_metric_create(cls, args && strcmp(args, "null") ? args : "{}", NULL, &metric, NULL) == KS_OK) {
      char prefix[KS_MAX_NAME + 32];
      snprintf(prefix, sizeof prefix, "%s/state_dict/", path);
      int sv = (int)json_integer_value(json_object_get(m, "schema_version"));
      const ks_tensor *res = NULL;
      /* Fuzzing: refusing the input is an expected outcome; only crashes and leaks matter. */
      if (ks_metric_load_state_dict(metric, sd, prefix, sv ? sv : 1, 1, NULL, NULL, NULL) == KS_OK &&
          ks_metric_compute(metric, &res, NULL) != KS_OK)
        res = NULL;
    }
    ks_metric_free(metric);
    free(args);
  }
  json_decref(all);
}

static void import(const uint8_t *buf, size_t n) {
  ks_torch_read_opts o = {0};
  o.verify_crc = 1;
  o.max_view_bytes = (uint64_t)1 << 26;
  ks_import_opts io = {.read = &o};
  ks_statedict *sd = NULL;
  ks_meta *meta = NULL;
  if (ks_test_torch_import_buffer(buf, n, &io, &sd, &meta, NULL) == KS_OK) {
    const char *metrics = ks_meta_get(meta, KS_META_METRICS);
    if (metrics) rebuild_metrics(metrics, sd);
  }
  ks_meta_free(meta);
  ks_statedict_free(sd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const uint8_t *prog;
  size_t len;
  int owned;
  membuf zip = {0};
  if (ks_fuzz_expand(data, size, &prog, &len, &owned)) return 0;
  if (archive(prog, len, &zip) == 0) import(zip.p, zip.n);
  free(zip.p);
  if (owned) free((void *)(uintptr_t)prog);
  return 0;
}
