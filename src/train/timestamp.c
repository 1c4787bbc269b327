/* Composer's Timestamp: training progress counters plus wall-clock totals. */
#include <string.h>

#include "core/keys.h"
#include "keepsake/train.h"

void ks_timestamp_init(ks_timestamp *ts) { memset(ts, 0, sizeof *ts); }

void ks_timestamp_batch_done(ks_timestamp *ts, int64_t samples, int64_t tokens, double seconds) {
  ts->batch++;
  ts->batch_in_epoch++;
  ts->sample += samples;
  ts->sample_in_epoch += samples;
  ts->token += tokens;
  ts->token_in_epoch += tokens;
  ts->batch_wct = seconds;
  ts->epoch_wct += seconds;
  ts->total_wct += seconds;
}

void ks_timestamp_epoch_done(ks_timestamp *ts) {
  ts->epoch++;
  ts->batch_in_epoch = ts->sample_in_epoch = ts->token_in_epoch = 0;
  ts->epoch_wct = 0.0;
}

typedef struct ts_field {
  const char *name;
  size_t off;
} ts_field;

#define F(x) {#x, offsetof(ks_timestamp, x)}
static const ts_field int_fields[] = {F(epoch),          F(batch),           F(sample),        F(token),
                                      F(batch_in_epoch), F(sample_in_epoch), F(token_in_epoch)};
static const ts_field wct_fields[] = {F(total_wct), F(epoch_wct), F(batch_wct)};
#undef F
#define NFIELDS(a) (sizeof a / sizeof a[0])

static KS_NODISCARD ks_status ts_save(void *ctx, ks_statedict *dst, const char *prefix, ks_error *err) {
  const ks_timestamp *ts = ctx;
  if (!ts || !dst || !prefix) return ks__err(err, KS_E_INVALID, "timestamp save: NULL argument");
  const char *base = (const char *)ts;
  ks_status s = KS_OK;
  for (size_t i = 0; i < NFIELDS(int_fields) && !s; i++) {
    int64_t v;
    memcpy(&v, base + int_fields[i].off, sizeof v);
    s = ks__put_int(dst, prefix, int_fields[i].name, v, err);
  }
  for (size_t i = 0; i < NFIELDS(wct_fields) && !s; i++) {
    double v;
    memcpy(&v, base + wct_fields[i].off, sizeof v);
    s = ks__put_float(dst, prefix, wct_fields[i].name, v, err);
  }
  return s;
}

static KS_NODISCARD ks_status ts_load(void *ctx, const ks_statedict *src, const char *prefix, ks_error *err) {
  ks_timestamp *ts = ctx;
  if (!ts || !src || !prefix) return ks__err(err, KS_E_INVALID, "timestamp load: NULL argument");
  ks_timestamp t = *ts;
  char *base = (char *)&t;
  for (size_t i = 0; i < NFIELDS(int_fields); i++) {
    int64_t v;
    ks_status s = ks__get_int(src, prefix, int_fields[i].name, &v, err);
    if (s) return s;
    if (v < 0) return ks__err_at(err, KS_E_VALUE, NULL, int_fields[i].name, -1, "negative counter");
    memcpy(base + int_fields[i].off, &v, sizeof v);
  }
  /* Wall-clock fields are optional: loads that ignore '*_wct' keep the current ones. */
  for (size_t i = 0; i < NFIELDS(wct_fields); i++) {
    double v;
    ks_status s = ks__get_float(src, prefix, wct_fields[i].name, &v, NULL);
    if (s == KS_E_NOTFOUND) continue;
    if (s) return ks__get_float(src, prefix, wct_fields[i].name, &v, err);
    memcpy(base + wct_fields[i].off, &v, sizeof v);
  }
  *ts = t;
  return KS_OK;
}

ks_stateful ks_timestamp_stateful(ks_timestamp *ts) {
  return (ks_stateful){.ctx = ts, .to_state_dict = ts_save, .load_state_dict = ts_load};
}
