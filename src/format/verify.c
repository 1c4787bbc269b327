/*
 * Checksum and scalar-table verification. Structure was validated at open;
 * this is the part that reads every data byte, so it runs only on request.
 */
#include <inttypes.h>
#include <string.h>

#include <stdio.h>

#include "format/fmt_internal.h"

typedef struct vstate {
  const ks_reader *r;
  ks_verify_fn fn;
  void *ctx;
  ks_error *err;
  ks_status first;
  bool stop;
  ks__lazy_window win; /* lazy readers: the bytes being checked */
  const uint64_t *got; /* tensor i's hash at got[i - got_base] when computed before the checks (or NULL) */
  size_t got_base;
} vstate;

static void report(vstate *v, const ks_error *e) {
  if (!v->first) {
    v->first = e->code;
    if (v->err) *v->err = *e;
  }
  if (!v->fn || v->fn(v->ctx, e)) v->stop = true;
}

/* Reads one "name": "hex" pair of the checksum table into want/have. */
static KS_NODISCARD ks_status read_sum(vstate *v, ks__json *j, const char *k, size_t kn, int64_t at, uint64_t *want,
                                       uint8_t *have) {
  char key[KS_MAX_NAME + 1];
  snprintf(key, sizeof key, "%.*s", (int)(kn <= KS_MAX_NAME ? kn : KS_MAX_NAME), k);
  const char *hex;
  size_t hn;
  ks_status st = ks__json_peek(j, '"') ? ks__json_string(j, &j->vbuf, &hex, &hn)
                                      : ks__json_fail(j, KS_E_FORMAT, key, "checksum is not a string");
  if (st) return st;
  long i = ks__reader_find_n(v->r, k, kn);
  ks_error e;
  if (i < 0)
    ks__err_at(&e, KS_E_FORMAT, v->r->path, key, at, "checksum table lists a tensor the file does not contain");
  else if (have[i])
    ks__err_at(&e, KS_E_FORMAT, v->r->path, key, at, "checksum table lists this tensor twice");
  else if (!ks__parse_hex64(hex, hn, &want[i]))
    ks__err_at(&e, KS_E_FORMAT, v->r->path, key, at, "checksum '%.*s' is not 16 hex digits", (int)(hn < 40 ? hn : 40),
               hex);
  else
    return have[i] = 1, KS_OK;
  report(v, &e);
  return KS_OK;
}

/* Parses the checksum table; reports and returns false when it is missing or malformed. */
static bool load_sums(vstate *v, uint64_t *want, uint8_t *have) {
  const char *s = ks_meta_get(v->r->meta, KS_META_CHECKSUMS);
  ks_error e;
  int64_t at = ks__fmt_key_offset(v->r, KS_META_CHECKSUMS);
  if (!s) {
    ks__err_at(&e, KS_E_FORMAT, v->r->path, KS_META_CHECKSUMS, at, "checksum table is missing");
    report(v, &e);
    return false;
  }
  ks__json j;
  ks__json_init(&j, s, strlen(s), at, v->r->path, &v->r->alloc, &e);
  bool first = true, done = false;
  const char *k;
  size_t kn;
  ks_status st = KS_OK;
  while (!v->stop && !(st = ks__json_next_key(&j, &first, &done, &k, &kn)) && !done)
    if ((st = read_sum(v, &j, k, kn, at, want, have)) != KS_OK) break; /* at: found once, not per entry */
  if (!st && !v->stop) st = ks__json_end(&j);
  ks__json_free(&j);
  if (st) {
    ks__err_set_key(&e, KS_META_CHECKSUMS);
    report(v, &e);
  }
  return !st;
}

/* The hash of tensor i's bytes; a lazy reader reads them through a window (not kept). */
static bool hash_tensor(vstate *v, size_t i, uint64_t *got) {
  const ks_reader *r = v->r;
  const fmt_entry *en = &r->entries[i];
  size_t n = (size_t)(en->end - en->begin);
  if (v->got) {
    *got = v->got[i - v->got_base];
    return true;
  }
  if (!r->lazy || r->data) {
    *got = ks_checksum(r->data ? r->data + en->begin : r->bytes + r->data_off + en->begin, n);
    return true;
  }
  ks_error e;
  const uint8_t *p;
  ks_status st = ks__lazy_window_get(r, &v->win, i, &p, &e);
  if (!st) *got = ks_checksum(p, n);
  if (st) report(v, &e);
  return !st;
}

static void check_tensor(vstate *v, size_t i, uint64_t want, bool have) {
  const fmt_entry *en = &v->r->entries[i];
  ks_error e;
  int64_t at = (int64_t)(v->r->data_off + en->begin);
  if (!have) {
    ks__err_at(&e, KS_E_FORMAT, v->r->path, en->name, ks__fmt_key_offset(v->r, KS_META_CHECKSUMS),
               "checksum table has no entry for this tensor");
    report(v, &e);
    return;
  }
  uint64_t got;
  if (!hash_tensor(v, i, &got)) return;
  if (got == want) return;
  ks__err_at(&e, KS_E_CHECKSUM, v->r->path, en->name, at,
             "data of bytes [%" PRId64 ", %" PRIu64 ") hashes to %016" PRIx64 ", stored checksum is %016" PRIx64, at,
             v->r->data_off + en->end, got, want);
  report(v, &e);
}

typedef struct par_hash {
  const ks_reader *r;
  size_t from;
  uint64_t *got;
} par_hash;

static const uint8_t *bytes_of(const ks_reader *r, size_t i) {
  return r->data ? r->data + r->entries[i].begin : r->bytes + r->data_off + r->entries[i].begin;
}

static uint64_t tensor_bytes(void *ctx, size_t k) {
  const par_hash *h = ctx;
  const fmt_entry *e = &h->r->entries[h->from + k];
  return e->end - e->begin;
}

static KS_NODISCARD ks_status hash_item(void *ctx, size_t k, ks_error *err) {
  (void)err;
  par_hash *h = ctx;
  size_t i = h->from + k;
  h->got[i] = ks_checksum(bytes_of(h->r, i), (size_t)(h->r->entries[i].end - h->r->entries[i].begin));
  return KS_OK;
}

/* The hashes of tensors [from, to) of a reader that holds them in memory, on a few threads, or
   NULL (few bytes, bytes not in memory, or no memory for the result: then each is hashed as it is
   checked, as before). */
static uint64_t *hash_ahead(const vstate *v, size_t from, size_t to) {
  const ks_reader *r = v->r;
  if (v->got || (r->lazy && !r->data) || to - from < 2) return NULL;
  uint64_t total = 0;
  for (size_t i = from; i < to; i++) total += r->entries[i].end - r->entries[i].begin;
  if (total < ((uint64_t)32 << 20)) return NULL;
  par_hash h = {r, from, ks__calloc(&r->alloc, r->count, sizeof *h.got)};
  if (!h.got) return NULL;
  ks__par_job job = {&h, tensor_bytes, hash_item};
  ks_status st = ks__par_each(&job, to - from, 0, NULL);
  (void)st; /* hashing cannot fail */
  return h.got;
}

/* Checks tensors [from, to) against the checksum table. */
static void check_sums(vstate *v, size_t from, size_t to) {
  size_t n = v->r->count ? v->r->count : 1;
  uint64_t *want = ks__calloc(&v->r->alloc, n, sizeof *want);
  uint8_t *have = ks__calloc(&v->r->alloc, n, 1);
  if (!want || !have) {
    ks_error e;
    ks__err(&e, KS_E_NOMEM, "out of memory verifying %zu tensors", n);
    report(v, &e);
  } else if (load_sums(v, want, have)) {
    uint64_t *ahead = hash_ahead(v, from, to);
    if (ahead) v->got = ahead, v->got_base = 0;
    for (size_t i = from; i < to && !v->stop; i++) check_tensor(v, i, want[i], have[i]);
    if (ahead) v->got = NULL;
    ks__free(&v->r->alloc, ahead);
  }
  ks__free(&v->r->alloc, want);
  ks__free(&v->r->alloc, have);
  ks__lazy_window_free(v->r, &v->win);
}

static void check_scalars(vstate *v) {
  ks_statedict *sd;
  ks_error e;
  if (ks_statedict_create(&v->r->alloc, &sd, NULL)) {
    ks__err(&e, KS_E_NOMEM, "out of memory");
    report(v, &e);
    return;
  }
  if (ks_reader_scalars(v->r, sd, &e)) report(v, &e);
  for (size_t i = 0; !v->stop && i < ks_statedict_count(sd); i++) {
    ks_entry en;
    if (ks_statedict_at(sd, i, &en)) continue; /* index in range: cannot fail */
    if (ks_reader_find(v->r, en.name) < 0) continue;
    ks__err_at(&e, KS_E_FORMAT, v->r->path, en.name, ks__fmt_key_offset(v->r, KS_META_SCALARS),
               "name is both a tensor and a scalar");
    report(v, &e);
  }
  ks_statedict_free(sd);
}

ks_status ks__fmt_sums(const ks_reader *r, uint64_t *want, uint8_t *have, ks_error *err) {
  vstate v = {r, NULL, NULL, err, KS_OK, false, {0}, NULL, 0};
  load_sums(&v, want, have);
  return v.first;
}

ks_status ks_reader_verify(const ks_reader *r, ks_verify_fn on_problem, void *ctx, ks_error *err) {
  ks_error_clear(err);
  if (!r) return ks__err(err, KS_E_INVALID, "ks_reader_verify: no reader");
  if (!r->version) return KS_OK; /* plain safetensors: open already checked everything there is */
  vstate v = {r, on_problem, ctx, err, KS_OK, false, {0}, NULL, 0};
  check_sums(&v, 0, r->count);
  if (!v.stop) check_scalars(&v);
  return v.first;
}

ks_status ks__reader_verify_with(const ks_reader *r, size_t from, size_t to, const uint64_t *got, bool scalars,
                                 ks_error *err) {
  ks_error_clear(err);
  if (!r->version) return KS_OK;
  vstate v = {r, NULL, NULL, err, KS_OK, false, {0}, got, from};
  check_sums(&v, from, to);
  if (scalars && !v.stop) check_scalars(&v);
  return v.first;
}

ks_status ks__reader_verify_tensor(const ks_reader *r, size_t i, ks_error *err) {
  ks_error_clear(err);
  if (!r || i >= r->count) return ks__err(err, KS_E_NOTFOUND, "no tensor %zu", i);
  if (!r->version) return KS_OK;
  vstate v = {r, NULL, NULL, err, KS_OK, false, {0}, NULL, 0};
  check_sums(&v, i, i + 1);
  return v.first;
}

ks_status ks_reader_scalars(const ks_reader *r, ks_statedict *dst, ks_error *err) {
  if (!r || !dst) return ks__err(err, KS_E_INVALID, "ks_reader_scalars: bad arguments");
  if (!r->version) return KS_OK;
  const char *s = ks_meta_get(r->meta, KS_META_SCALARS);
  int64_t off = ks__fmt_key_offset(r, KS_META_SCALARS);
  if (!s) return ks__err_at(err, KS_E_FORMAT, r->path, KS_META_SCALARS, off, "scalar table is missing");
  return ks__scalars_decode(s, r->path, off, dst, err);
}
