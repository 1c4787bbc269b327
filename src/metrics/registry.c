/* The catalogue: torchmetrics (and Composer) class names mapped to their families. */
#include <string.h>

#include "metrics/families.h"

#define AVG_ALL 0xFu
#define AVG_AUROC ((1u << KS__AVG_MACRO) | (1u << KS__AVG_WEIGHTED) | (1u << KS__AVG_NONE))
#define A_BIN (KS__A_THRESHOLD | KS__A_IGNORE | KS__A_MULTIDIM)
#define A_MC (KS__A_NUM_CLASSES | KS__A_AVERAGE | KS__A_TOP_K | KS__A_IGNORE | KS__A_MULTIDIM)
#define A_ML (KS__A_NUM_LABELS | KS__A_AVERAGE | KS__A_THRESHOLD | KS__A_IGNORE | KS__A_MULTIDIM)
#define A_CURVE (KS__A_THRESHOLDS | KS__A_IGNORE)
#define NC KS__A_NUM_CLASSES
#define NL KS__A_NUM_LABELS
#define MACRO KS__AVG_MACRO

#define AGG(name, f) {name, KS__A_NAN, 0, 0, 0, 0, 0, ks__##f##_declare, ks__##f##_update, ks__##f##_compute, 0}
#define BIN(name, c) {name, A_BIN, 0, 0, 0, 0, 0, ks__binary_stat_declare, ks__binary_stat_update, c, 0}
#define MC(name, c) \
  {name, A_MC, NC, MACRO, AVG_ALL, 0, 0, ks__multiclass_stat_declare, ks__multiclass_stat_update, c, 0}
#define ML(name, c) \
  {name, A_ML, NL, MACRO, AVG_ALL, 0, 0, ks__multilabel_stat_declare, ks__multilabel_stat_update, c, 0}

static const ks__class k_classes[] = {
    AGG("MeanMetric", mean),
    AGG("SumMetric", sum),
    AGG("MaxMetric", max),
    AGG("MinMetric", min),
    AGG("CatMetric", cat),
    BIN("BinaryAccuracy", ks__accuracy_compute),
    BIN("BinaryPrecision", ks__precision_compute),
    BIN("BinaryRecall", ks__recall_compute),
    BIN("BinaryF1Score", ks__f1_compute),
    {"BinaryConfusionMatrix", KS__A_THRESHOLD | KS__A_IGNORE | KS__A_NORMALIZE, 0, 0, 0, 0, 0,
     ks__binary_confmat_declare, ks__binary_confmat_update, ks__confmat_compute, 0},
    {"BinaryAUROC", A_CURVE, 0, 0, 0, 0, 0, ks__binary_curve_declare, ks__binary_curve_update,
     ks__binary_auroc_compute, 0},
    {"BinaryAveragePrecision", A_CURVE, 0, 0, 0, 0, 0, ks__binary_curve_declare, ks__binary_curve_update,
     ks__binary_ap_compute, 0},
    MC("MulticlassAccuracy", ks__accuracy_compute),
    MC("MulticlassPrecision", ks__precision_compute),
    MC("MulticlassRecall", ks__recall_compute),
    MC("MulticlassF1Score", ks__f1_compute),
    {"MulticlassConfusionMatrix", NC | KS__A_IGNORE | KS__A_NORMALIZE, NC, 0, 0, 0, 0,
     ks__multiclass_confmat_declare, ks__multiclass_confmat_update, ks__confmat_compute, 0},
    {"MulticlassAUROC", NC | KS__A_AVERAGE | A_CURVE, NC, MACRO, AVG_AUROC, 0, 0, ks__multiclass_curve_declare,
     ks__multiclass_curve_update, ks__multiclass_auroc_compute, 0},
    {"MulticlassJaccardIndex", NC | KS__A_AVERAGE | KS__A_IGNORE, NC, MACRO, AVG_ALL, 0, 0,
     ks__multiclass_confmat_declare, ks__multiclass_confmat_update, ks__jaccard_compute, 0},
    ML("MultilabelAccuracy", ks__accuracy_compute),
    ML("MultilabelF1Score", ks__f1_compute),
    {"MeanSquaredError", KS__A_SQUARED | KS__A_NUM_OUTPUTS, 0, 0, 0, 0, 0, ks__mse_declare, ks__mse_update,
     ks__mse_compute, 0},
    {"MeanAbsoluteError", KS__A_NUM_OUTPUTS, 0, 0, 0, 0, 0, ks__mae_declare, ks__mae_update, ks__mae_compute, 0},
    {"R2Score", KS__A_NUM_OUTPUTS, 0, 0, 0, 0, 0, ks__r2_declare, ks__r2_update, ks__r2_compute, 0},
    {"LanguageCrossEntropy", KS__A_IGNORE, 0, 0, 0, -100, 1, ks__lm_declare, ks__lm_update, ks__lm_ce_compute, 0},
    {"LanguagePerplexity", KS__A_IGNORE, 0, 0, 0, -100, 1, ks__lm_declare, ks__lm_update, ks__lm_ppl_compute, 0},
};
#define N_CLASSES (sizeof k_classes / sizeof k_classes[0])

const ks__class *ks__class_find(const char *name) {
  for (size_t i = 0; i < N_CLASSES; i++)
    if (!strcmp(k_classes[i].name, name)) return &k_classes[i];
  return NULL;
}

size_t ks_metric_class_count(void) { return N_CLASSES; }

const char *ks_metric_class_name(size_t i) { return i < N_CLASSES ? k_classes[i].name : NULL; }
