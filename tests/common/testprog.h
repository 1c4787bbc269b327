/*
 * The small training program the checkpoint-manager tests save and resume: a
 * 4-float weight "w", the training timestamp, and one eval metric collection
 * ("eval") holding a MeanMetric, whose computed value the keep-best policy
 * ranks by. Each test advances the timestamp and the weight its own way.
 */
#ifndef KS_TESTPROG_H
#define KS_TESTPROG_H

#include <stdint.h>

#include "keepsake/state.h"
#include "keepsake/train.h"

typedef struct ks_test_prog {
  float w[4];
  int64_t shape[1];
  ks_timestamp ts;
  ks_state *st;
} ks_test_prog;

/* Zeroes p and builds its state ("run", version 1). */
ks_status ks_test_prog_init(ks_test_prog *p);
/* Resets the eval MeanMetric, feeds it v and computes it, so its `_computed` holds v. */
ks_status ks_test_prog_set_metric(ks_test_prog *p, double v);

#endif
