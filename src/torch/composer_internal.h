/* The Composer layout mapping with a bound on what joining list states copies (composer.c). Not installed. */
#ifndef KS_TORCH_COMPOSER_INTERNAL_H
#define KS_TORCH_COMPOSER_INTERNAL_H

#include <stdint.h>

#include "keepsake/statedict.h"
#include "keepsake/status.h"

/*
 * ks_composer_normalize, with the bytes that list states may be joined into
 * bounded by *join_budget, which is decreased by what was joined (NULL = no
 * cap). Items may all view one shared storage, so a join can copy far more
 * than the file holds. @return as ks_composer_normalize; KS_E_LIMIT past the budget.
 */
ks_status ks__composer_normalize(const ks_statedict *flat, ks_take take, uint64_t *join_budget, ks_statedict **out,
                                 char **metrics_json, ks_error *err);

#endif
