/* The "keepsake.metrics" metadata of a converted Composer checkpoint. */
#ifndef KS_TOOLS_CONVERT_METRICS_H
#define KS_TOOLS_CONVERT_METRICS_H

#include "keepsake/keepsake.h"

/*
 * Builds "keepsake.metrics" ({metric_path: {class, args, schema_version,
 * update_count}}, the layout ks_state_save writes) from the description
 * ks_composer_normalize returned (`composer_json`) and the normalized dict `sd`:
 *   class          catalogue name: the last part of a pickled object's class,
 *                  or the metric's key when that is a catalogue class; else absent.
 *   args           canonical constructor arguments rebuilt from a pickled
 *                  object's attributes; absent when they cannot be rebuilt
 *                  reliably (the loader then relies on its shape checks).
 *   schema_version 1 when the states carry pre-torchmetrics-1.1 names or shapes.
 *   update_count   the object's `_update_count`, else 1 (Composer's own default).
 * *out is a malloc'd JSON string (free()).
 * Returns KS_OK, KS_E_FORMAT (composer_json malformed) or KS_E_NOMEM.
 */
ks_status ks_convert_metrics_meta(const char *composer_json, const ks_statedict *sd, char **out, ks_error *err);

#endif
