/* Early stopping: Lightning's rule (improve by more than min_delta, else count toward patience). */
#include <math.h>
#include <string.h>

#include "core/internal.h"
#include "keepsake/train.h"

ks_status ks_early_stop_init(ks_early_stop *es, const char *monitor, ks_best_mode mode, int64_t patience,
                             double min_delta, ks_error *err) {
  if (!es || !monitor || !*monitor || strlen(monitor) >= sizeof es->monitor)
    return ks__err(err, KS_E_INVALID, "early stopping: monitor must be 1..255 bytes");
  if (patience < 1 || !(min_delta >= 0) || (mode != KS_BEST_MAX && mode != KS_BEST_MIN))
    return ks__err(err, KS_E_INVALID, "early stopping: patience >= 1, min_delta >= 0 and mode max or min");
  memset(es, 0, sizeof *es);
  memcpy(es->monitor, monitor, strlen(monitor) + 1);
  es->mode = mode;
  es->patience = patience;
  es->min_delta = min_delta;
  es->stopped_epoch = -1;
  return KS_OK;
}

static int improves(const ks_early_stop *es, double v) {
  if (isnan(v)) return 0;
  if (!es->has_best) return 1;
  return es->mode == KS_BEST_MIN ? v < es->best_score - es->min_delta : v > es->best_score + es->min_delta;
}

int ks_early_stop_update(ks_early_stop *es, double value, int64_t epoch) {
  if (!es || es->stopped_epoch >= 0) return es != NULL;
  if (improves(es, value)) {
    es->best_score = value;
    es->has_best = 1;
    es->wait_count = 0;
    return 0;
  }
  if (++es->wait_count < es->patience) return 0;
  es->stopped_epoch = epoch;
  return 1;
}
