/*
 * Internals of the import: the mapping of Composer's metric layouts (composer.c), used by
 * ks_torch_import and tested directly. Not installed.
 */
#ifndef KS_IMPORT_INTERNAL_H
#define KS_IMPORT_INTERNAL_H

#include <stdint.h>

#include "core/internal.h"
#include "keepsake/statedict.h"

/*
 * Maps the flattened tree of a Composer checkpoint onto keepsake's metric layout.
 *
 * Every metric found under `state/train_metrics/<Name>/` or
 * `state/eval_metrics/<label>/<Name>/` becomes
 *   <prefix><Name>/state_dict/<state>   (tensors; list states concatenated along dim 0)
 *   <prefix><Name>/_computed            (tensor, or null; nested results keep their sub-keys)
 * whether the checkpoint holds `{state_dict, _computed}` (Composer >= 0.14; a
 * list state's items state_dict/<state>/0, /1, ... are joined) or a whole
 * pickled torchmetrics object (<= 0.13.5; states are the names in its
 * `_persistent` / `_defaults` attributes). Names and labels may contain '/': a
 * metric's folder is the shortest one that holds `__class__`, `state_dict/` or
 * `_computed`. In the description an eval metric's name is its last folder and
 * its label the folders before it. Every other entry of `flat` is passed
 * through unchanged, in order. Linear in the number of entries.
 *
 * @param flat   a dict produced by ks_torch_load (or any dict with that layout).
 * @param take   KS_COPY copies passed-through tensors; KS_BORROW keeps pointers
 *               into `flat`, which must then outlive *out.
 * @param out    receives a new dict (flat's allocator); untouched on failure.
 * @param metrics_json optional; receives a JSON object describing the metrics:
 *   {"layout": "pickled-object" | "state-dict" | "mixed" (both kinds in one file) | "none",
 *    "metrics": [{"path": ".../<Name>", "group": "train" | "eval", "label": <label or null>,
 *                 "name": <Name>, "class": "module.Class" or null, "states": [...],
 *                 "update_count": <int or null>, "attrs": {<public scalar attributes>},
 *                 "lists": [the states that were Python lists, joined here; absent when none]}]}
 *   Free with ks__free(allocator of flat, *metrics_json).
 * @param join_budget NULL = no cap; else in: the bytes joining list states may
 *   allocate, out: decreased by what they allocated. List items can all view one
 *   shared storage, so a join can copy far more than the file holds (384
 *   references to a 256 KiB storage join to 96 MiB).
 * @return KS_OK, KS_E_NOMEM, KS_E_SHAPE / KS_E_DTYPE (list state items that cannot
 *         be concatenated), KS_E_LIMIT (a join would pass the budget; err names the
 *         state), KS_E_INVALID.
 */
KS_NODISCARD ks_status ks__composer_normalize(const ks_statedict *flat, ks_take take, uint64_t *join_budget,
                                              ks_statedict **out, char **metrics_json, ks_error *err);
#endif
