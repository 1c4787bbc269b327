/* The declare / update / compute functions of every metric family, wired up by registry.c. */
#ifndef KS_METRICS_FAMILIES_H
#define KS_METRICS_FAMILIES_H

#include "metrics/internal.h"

#define KS__FAMILY_FNS(f)                                                               \
  ks_status ks__##f##_declare(ks_metric *m, ks_error *err);                             \
  ks_status ks__##f##_update(ks_metric *m, const ks_tensor *in, size_t n, ks_error *err); \
  ks_status ks__##f##_compute(ks_metric *m, ks_tensor *out, ks_error *err)

/* aggregation.c */
KS__FAMILY_FNS(mean);
KS__FAMILY_FNS(sum);
KS__FAMILY_FNS(max);
KS__FAMILY_FNS(min);
KS__FAMILY_FNS(cat);

/* statscores.c: tp/fp/tn/fn states; stat_reduce.c: the four scores */
KS_NODISCARD ks_status ks__binary_stat_declare(ks_metric *m, ks_error *err);
KS_NODISCARD ks_status ks__binary_stat_update(ks_metric *m, const ks_tensor *in, size_t n, ks_error *err);
KS_NODISCARD ks_status ks__multiclass_stat_declare(ks_metric *m, ks_error *err);
KS_NODISCARD ks_status ks__multiclass_stat_update(ks_metric *m, const ks_tensor *in, size_t n, ks_error *err);
KS_NODISCARD ks_status ks__multilabel_stat_declare(ks_metric *m, ks_error *err);
KS_NODISCARD ks_status ks__multilabel_stat_update(ks_metric *m, const ks_tensor *in, size_t n, ks_error *err);
KS_NODISCARD ks_status ks__accuracy_compute(ks_metric *m, ks_tensor *out, ks_error *err);
KS_NODISCARD ks_status ks__precision_compute(ks_metric *m, ks_tensor *out, ks_error *err);
KS_NODISCARD ks_status ks__recall_compute(ks_metric *m, ks_tensor *out, ks_error *err);
KS_NODISCARD ks_status ks__f1_compute(ks_metric *m, ks_tensor *out, ks_error *err);

/* confmat.c */
KS_NODISCARD ks_status ks__binary_confmat_declare(ks_metric *m, ks_error *err);
KS_NODISCARD ks_status ks__binary_confmat_update(ks_metric *m, const ks_tensor *in, size_t n, ks_error *err);
KS_NODISCARD ks_status ks__multiclass_confmat_declare(ks_metric *m, ks_error *err);
KS_NODISCARD ks_status ks__multiclass_confmat_update(ks_metric *m, const ks_tensor *in, size_t n, ks_error *err);
KS_NODISCARD ks_status ks__confmat_compute(ks_metric *m, ks_tensor *out, ks_error *err);
KS_NODISCARD ks_status ks__jaccard_compute(ks_metric *m, ks_tensor *out, ks_error *err);

/* curve_update.c (exact cat states or binned confmats) and curve_compute.c */
KS_NODISCARD ks_status ks__binary_curve_declare(ks_metric *m, ks_error *err);
KS_NODISCARD ks_status ks__binary_curve_update(ks_metric *m, const ks_tensor *in, size_t n, ks_error *err);
KS_NODISCARD ks_status ks__multiclass_curve_declare(ks_metric *m, ks_error *err);
KS_NODISCARD ks_status ks__multiclass_curve_update(ks_metric *m, const ks_tensor *in, size_t n, ks_error *err);
KS_NODISCARD ks_status ks__binary_auroc_compute(ks_metric *m, ks_tensor *out, ks_error *err);
KS_NODISCARD ks_status ks__binary_ap_compute(ks_metric *m, ks_tensor *out, ks_error *err);
KS_NODISCARD ks_status ks__multiclass_auroc_compute(ks_metric *m, ks_tensor *out, ks_error *err);

/* regression.c */
KS__FAMILY_FNS(mse);
KS__FAMILY_FNS(mae);
KS__FAMILY_FNS(r2);

/* language.c */
KS_NODISCARD ks_status ks__lm_declare(ks_metric *m, ks_error *err);
KS_NODISCARD ks_status ks__lm_update(ks_metric *m, const ks_tensor *in, size_t n, ks_error *err);
KS_NODISCARD ks_status ks__lm_ce_compute(ks_metric *m, ks_tensor *out, ks_error *err);
KS_NODISCARD ks_status ks__lm_ppl_compute(ks_metric *m, ks_tensor *out, ks_error *err);

#endif
