/*
 * The per-rank items of a DCP save by keepsake 0.2's Python front end (docs/FORMAT.md 9.1): rank s
 * saved its own items as DCP items under `rank<s>/`, in its own file:
 *   rank<s>/rng/<k>                          a generator's state (a tensor, or a typed JSON value)
 *   rank<s>/dataset_state/<name>[.<key>...]  a data position, flattened by DCP (planner data gives
 *                                            the path of each key)
 *   rank<s>/metrics/<name>/<i>               a metric's local states: typed JSON bytes of a keepsake
 *   rank<s>/eval_metrics/<label>/<name>/<i>  file holding state_dict/<state> and update_count; part 0
 *                                            the metric, part i its inner metric i
 * ks_shard_load_local reads them under the names every other writer gives them (rng/0/<k>,
 * state/dataset_state/<name>/<key>..., state/train_metrics/<name>/state_dict/<state>, ...), with the
 * update counts in keepsake.metrics records, so one loader serves both layouts.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shard/shard_internal.h"

typedef struct conv {
  const ks_allocator *a;
  const ks__planner *pd;
  ks_shard_metric_fn metric;
  void *metric_ctx;
  const char *path; /* the rank file, for errors */
  ks_statedict *out;
  ks__jv *records;
  ks_error *err;
} conv;

static KS_NODISCARD ks_status bad(conv *c, const char *key, const char *what) {
  return ks__err_at(c->err, KS_E_FORMAT, c->path, key, -1, "%s: %s", key, what);
}

/* A decoded typed JSON value as entries under `name`: scalars as they are, bytes as a U8 tensor,
   containers flattened below it (items by index, dict keys escaped). */
static KS_NODISCARD ks_status put_value(conv *c, const char *name, const ks_dcp_value *v) {
  char k[KS__KEY_MAX + 1];
  switch (v->kind) {
    case KS_DCP_NONE: return ks_statedict_set_null(c->out, name, c->err);
    case KS_DCP_BOOL: return ks_statedict_set_bool(c->out, name, (int)v->i, c->err);
    case KS_DCP_INT: return ks_statedict_set_int(c->out, name, v->i, c->err);
    case KS_DCP_FLOAT: return ks_statedict_set_float(c->out, name, v->f, c->err);
    case KS_DCP_BIGINT:
    case KS_DCP_STR: return ks_statedict_set_string(c->out, name, v->s, c->err);
    case KS_DCP_BYTES:
    case KS_DCP_BYTESIO: {
      int64_t n = (int64_t)v->len;
      void *data;
      ks_status st = ks_statedict_new_tensor(c->out, name, KS_U8, 1, &n, &data, c->err);
      if (!st && v->len) memcpy(data, v->s, v->len);
      return st;
    }
    case KS_DCP_LIST:
    case KS_DCP_TUPLE:
      for (size_t i = 0; i < v->count; i++) {
        ks_status st = ks__keyf(k, name, "/%zu", i) ? ks__key_limit(c->err, name, "/N") : put_value(c, k, &v->items[i]);
        if (st) return st;
      }
      return KS_OK;
    case KS_DCP_DICT:
      for (size_t i = 0; i < v->count; i++) {
        const ks_dcp_value *key = &v->items[2 * i];
        char t[32];
        const char *s = key->s;
        size_t n = key->len;
        if (key->kind == KS_DCP_INT || key->kind == KS_DCP_BOOL) {
          n = (size_t)snprintf(t, sizeof t, "%lld", (long long)key->i);
          s = t;
        } else if (key->kind != KS_DCP_STR) {
          return bad(c, name, "a data position's dict key is no str or int");
        }
        size_t e = ks__key_escaped_len(s, n), at = strlen(name);
        if (at + 1 + e > KS__KEY_MAX) return ks__key_limit(c->err, name, s);
        memcpy(k, name, at);
        k[at] = '/';
        k[at + 1 + ks__key_escape(s, n, k + at + 1)] = '\0';
        ks_status st = put_value(c, k, &v->items[2 * i + 1]);
        if (st) return st;
      }
      return KS_OK;
  }
  return bad(c, name, "an unknown value");
}

/* Appends "/" and path component p (a str escaped, an int in decimal) to k. */
static KS_NODISCARD ks_status append_component(conv *c, char *k, const ks_dcp_value *p) {
  char t[32];
  const char *s = p->s;
  size_t n = p->len, at = strlen(k);
  if (p->kind == KS_DCP_INT) n = (size_t)snprintf(t, sizeof t, "%lld", (long long)p->i), s = t;
  else if (p->kind != KS_DCP_STR) return bad(c, k, "planner data: a path component is no str or int");
  if (at + 1 + ks__key_escaped_len(s, n) > KS__KEY_MAX) return ks__key_limit(c->err, k, s);
  k[at] = '/';
  k[at + 1 + ks__key_escape(s, n, k + at + 1)] = '\0';
  return KS_OK;
}

/* `rank<s>/dataset_state/<name>...`: state/dataset_state/<name> and the rest of its planner data path. */
static KS_NODISCARD ks_status dataset_name(conv *c, const char *fqn, const char *mine, char *k) {
  const ks_dcp_value *path = ks__planner_path(c->pd, fqn);
  size_t plen = strlen(mine) + strlen("dataset_state/");
  if (!path) /* no planner data: the key as DCP flattened it */
    return ks__key(k, "state/dataset_state/", fqn + plen) ? ks__key_limit(c->err, "state/dataset_state/", fqn + plen)
                                                             : KS_OK;
  if ((path->kind != KS_DCP_TUPLE && path->kind != KS_DCP_LIST) || !path->count || path->items[0].kind != KS_DCP_STR ||
      strncmp(path->items[0].s, fqn, plen))
    return bad(c, fqn, "planner data: the path does not begin with the item's own top key");
  if (ks__key(k, "state/dataset_state/", path->items[0].s + plen))
    return ks__key_limit(c->err, "state/dataset_state/", path->items[0].s + plen);
  for (size_t i = 1; i < path->count; i++) {
    ks_status st = append_component(c, k, &path->items[i]);
    if (st) return st;
  }
  return KS_OK;
}

/* One metric part's keepsake bytes: its states and update count under `mpath` (part 0) or its inner metric. */
static KS_NODISCARD ks_status metric_part(conv *c, const char *fqn, const char *mpath, long part, const void *bytes,
                                          size_t len) {
  char base[KS__KEY_MAX + 1], k[KS__KEY_MAX + 1];
  if (part == 0) {
    if (ks__key(base, mpath, "")) return ks__key_limit(c->err, mpath, "");
  } else {
    const ks_metric *m = c->metric ? c->metric(c->metric_ctx, mpath) : NULL;
    const char *iname = NULL;
    if (!m || !ks_metric_inner_at(m, (size_t)(part - 1), &iname)) return KS_OK; /* no program metric names it */
    if (ks__keyf(base, mpath, "/inner/%s", iname)) return ks__key_limit(c->err, mpath, iname);
  }
  ks_statedict *sd = NULL;
  ks_meta *meta = NULL;
  ks_read_opts ro = {.alloc = c->a};
  ks_status st = ks_load_buffer(bytes, len, &ro, &sd, &meta, c->err);
  if (st) ks__err_set_key(c->err, fqn);
  int64_t count = -1;
  for (size_t i = 0; !st && i < ks_statedict_count(sd); i++) {
    ks_entry e;
    if (ks_statedict_at(sd, i, &e)) continue; /* index in range: cannot fail */
    if (!strcmp(e.name, "update_count") && e.kind == KS_VAL_INT) count = e.i;
    if (strncmp(e.name, "state_dict/", strlen("state_dict/"))) continue;
    if (ks__keyf(k, base, "/%s", e.name)) st = ks__key_limit(c->err, base, e.name);
    else st = ks_statedict_set_entry(c->out, k, &e, KS_COPY, c->err);
  }
  ks_statedict_free(sd);
  ks_meta_free(meta);
  if (!st && count < 0) st = bad(c, fqn, "a metric's saved states without an update count");
  if (st) return st;
  if (part) return ks__put_int(c->out, base, "/update_count", count, c->err);
  ks__jv *rec = ks__jv_object(c->a);
  ks__shard_put(c->a, rec, "update_count", ks__jv_int(c->a, count), &st);
  ks__shard_put(c->a, rec, "schema_version", ks__jv_int(c->a, KS_METRIC_SCHEMA_VERSION), &st);
  ks__shard_put(c->a, c->records, mpath, rec, &st);
  return st ? ks__err(c->err, KS_E_NOMEM, "out of memory") : KS_OK;
}

/* `metrics/<name>/<i>` or `eval_metrics/<label>/<name>/<i>` (rest, below rank<s>/). */
static KS_NODISCARD ks_status metric_item(conv *c, const char *fqn, const char *rest, const ks_dcp_value *v) {
  int train = !strncmp(rest, "metrics/", strlen("metrics/"));
  const char *root = train ? "state/train_metrics/" : "state/eval_metrics/";
  const char *mid = rest + strlen(train ? "metrics/" : "eval_metrics/"), *slash = strrchr(mid, '/');
  char *end = NULL;
  long part = slash ? strtol(slash + 1, &end, 10) : -1;
  if (!slash || slash == mid || part < 0 || !end || *end || end == slash + 1)
    return bad(c, fqn, "a metric part is not <name>/<index>");
  if (!v || v->kind != KS_DCP_BYTES) return bad(c, fqn, "a metric part is not keepsake bytes");
  char mpath[KS__KEY_MAX + 1];
  size_t n = strlen(root), m = (size_t)(slash - mid);
  if (n + m > KS__KEY_MAX) return ks__key_limit(c->err, root, mid);
  memcpy(mpath, root, n);
  memcpy(mpath + n, mid, m);
  mpath[n + m] = '\0';
  return metric_part(c, fqn, mpath, part, v->s, v->len);
}

/* One `rank<s>/` item (a tensor `t`, or a value `v` decoded from its typed JSON). */
static KS_NODISCARD ks_status convert_item(conv *c, const char *fqn, const char *mine, const ks_entry *t,
                                           const ks_dcp_value *v) {
  const char *rest = fqn + strlen(mine);
  char k[KS__KEY_MAX + 1];
  if (!strncmp(rest, "rng/", 4)) {
    if (ks__key(k, "rng/0/", rest + 4)) return ks__key_limit(c->err, "rng/0/", rest + 4);
    return v ? put_value(c, k, v) : ks_statedict_set_entry(c->out, k, t, KS_COPY, c->err);
  }
  if (!strncmp(rest, "dataset_state/", strlen("dataset_state/"))) {
    ks_status st = dataset_name(c, fqn, mine, k);
    if (st) return st;
    return v ? put_value(c, k, v) : ks_statedict_set_entry(c->out, k, t, KS_COPY, c->err);
  }
  if (!strncmp(rest, "metrics/", strlen("metrics/")) || !strncmp(rest, "eval_metrics/", strlen("eval_metrics/")))
    return metric_item(c, fqn, rest, v);
  return KS_OK; /* not one of the front end's per-rank items: left to DCP */
}

int ks__shard_dcp02_item(const char *name, int rank) {
  char mine[32];
  snprintf(mine, sizeof mine, "rank%d/", rank);
  size_t n = strlen(KS_SHARD_DCP_OBJECT);
  return !strncmp(name, mine, strlen(mine)) ||
         (!strncmp(name, KS_SHARD_DCP_OBJECT, n) && !strncmp(name + n, mine, strlen(mine)));
}

ks_status ks__shard_dcp02_convert(const ks_allocator *a, const ks_statedict *file, int rank, const ks__planner *pd,
                                  ks_shard_metric_fn metric, void *metric_ctx, const char *path, ks_statedict *out,
                                  ks__jv *records, ks_error *err) {
  conv c = {a, pd, metric, metric_ctx, path, out, records, err};
  char mine[32];
  snprintf(mine, sizeof mine, "rank%d/", rank);
  size_t on = strlen(KS_SHARD_DCP_OBJECT);
  ks_status st = KS_OK;
  for (size_t i = 0; !st && i < ks_statedict_count(file); i++) {
    ks_entry e;
    if (ks_statedict_at(file, i, &e) || !ks__shard_dcp02_item(e.name, rank)) continue; /* index in range */
    int object = !strncmp(e.name, KS_SHARD_DCP_OBJECT, on);
    if (!object) {
      st = convert_item(&c, e.name, mine, &e, NULL);
      continue;
    }
    if (e.kind != KS_VAL_TENSOR || e.tensor.dtype != KS_U8 || e.tensor.rank != 1) {
      st = bad(&c, e.name, "an object is one whole 1-d U8 tensor");
      continue;
    }
    ks_dcp_doc *doc = NULL;
    st = ks_dcp_doc_parse(e.tensor.data, e.tensor.nbytes, a, &doc, err);
    if (st && err) {
      ks__err_set_file(err, path);
      ks__err_set_key(err, e.name);
    }
    if (!st) st = convert_item(&c, e.name + on, mine, NULL, ks_dcp_doc_root(doc));
    ks_dcp_doc_free(doc);
  }
  return st;
}
