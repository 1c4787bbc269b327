/*
 * Private to the metrics module: the metric object, its states, parsed
 * constructor arguments and the per-class function table. Families
 * (aggregation.c, statscores.c, ...) implement declare/update/compute against
 * these; engine.c owns the lifecycle and the generic state operations.
 */
#ifndef KS_METRICS_INTERNAL_H
#define KS_METRICS_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "core/internal.h"
#include "keepsake/binding.h"
#include "keepsake/metric.h"

#define KS__MAX_STATES 4
/* A described metric (described.c) keeps its states in a heap array of this many. */
#define KS__MAX_DESCRIBED_STATES 64
/* Hard caps on constructor arguments (state sizes are checked for overflow too). */
#define KS__MAX_CLASSES (1 << 20)
#define KS__MAX_THRESHOLDS (1 << 20)
#define KS__MAX_OUTPUTS (1 << 20)

typedef enum { KS__AVG_MICRO, KS__AVG_MACRO, KS__AVG_WEIGHTED, KS__AVG_NONE } ks__avg;
typedef enum { KS__NORM_NONE, KS__NORM_TRUE, KS__NORM_PRED, KS__NORM_ALL } ks__norm;
typedef enum { KS__TASK_NONE, KS__TASK_BINARY, KS__TASK_MULTICLASS, KS__TASK_MULTILABEL } ks__task;
typedef enum { KS__NAN_WARN, KS__NAN_IGNORE, KS__NAN_ERROR, KS__NAN_DISABLE, KS__NAN_VALUE } ks__nan;

/* Which constructor arguments a class accepts (bit set). */
enum {
  KS__A_AVERAGE = 1u << 0,
  KS__A_IGNORE = 1u << 1,
  KS__A_MULTIDIM = 1u << 2,
  KS__A_NAN = 1u << 3,
  KS__A_NORMALIZE = 1u << 4,
  KS__A_NUM_CLASSES = 1u << 5,
  KS__A_NUM_LABELS = 1u << 6,
  KS__A_NUM_OUTPUTS = 1u << 7,
  KS__A_SQUARED = 1u << 8,
  KS__A_THRESHOLD = 1u << 9,
  KS__A_THRESHOLDS = 1u << 10,
  KS__A_TOP_K = 1u << 11
};

typedef struct ks__margs {
  int64_t num_classes; /* num_classes, or num_labels for multilabel */
  int average;         /* ks__avg */
  int64_t top_k;
  int has_ignore;
  int64_t ignore_index;
  double threshold;
  int64_t n_thr;   /* 0: exact (thresholds=None) */
  float *thr;      /* n_thr thresholds, owned, as torch's float32 linspace */
  int thr_list;    /* thresholds were given as a list */
  int thr_sorted;  /* ascending, so binned updates can binary-search */
  int normalize;   /* ks__norm */
  int squared;
  int64_t num_outputs;
  int nan_strategy; /* ks__nan */
  double nan_value;
} ks__margs;

/* One named state. Cat states keep rows contiguously: shape[0] is the row count. */
typedef struct ks__state {
  const char *name;        /* torchmetrics name (static) */
  const char *legacy_name; /* schema-1 name, or NULL */
  ks_reduce reduce;
  ks_dtype dtype;
  int rank;
  int64_t shape[KS_MAX_RANK];
  double fill;      /* default value of every element (non-cat) */
  int reshape_ok;   /* 1: () and (n,) are interchangeable on load when the counts agree (MSE/MAE/R2 sums);
                       2: also a () value broadcasts to (n,) (R2Score sums of torchmetrics >= 1.5) */
  int row_dynamic;  /* CatMetric: row shape fixed by the first rows seen */
  int row_known;
  int any_dtype;   /* described cat states: rows keep their stored dtype */
  void *data;
  size_t nbytes;
  size_t cap; /* cat: allocated bytes */
} ks__state;

typedef struct ks__class ks__class;

/* A described metric's attribute (ks_metric_describe_attr), and the value a load staged for it. */
typedef struct ks__attr {
  char *name; /* owned */
  ks_dtype dtype;
  int rank;
  int64_t shape[KS_MAX_RANK];
  unsigned flags; /* KS_ATTR_INT */
  int64_t min, max;
  int staged;
  int64_t ival;   /* KS_ATTR_INT: the staged integer */
  void *data;     /* a tensor's staged bytes (owned), or NULL */
  size_t nbytes;
} ks__attr;

/* A described metric keeps at most this many attributes. */
#define KS__MAX_ATTRS 64

struct ks_metric {
  ks_allocator alloc;
  const ks__class *cls;
  int task; /* ks__task: how the classification families read inputs and reduce */
  ks__margs args;
  char *args_json;
  size_t n_states, cap_states;
  ks__state *st; /* st_inline, or a described metric's heap array */
  ks__state st_inline[KS__MAX_STATES];
  int64_t update_count;
  int has_computed;
  ks_tensor computed; /* data owned by the metric */
  /* Described metrics (described.c): the program's class name and state names (owned), the
   * catalogue twin the states take legacy names and reshape rules from, and inner metrics. */
  char *described;
  ks_metric *twin;
  ks_metric **inner;
  char **inner_names;
  size_t n_inner, cap_inner;
  ks__attr *attrs; /* declared attributes (described metrics) */
  size_t n_attrs, cap_attrs;
};

struct ks__class {
  const char *name;
  unsigned accepts;   /* KS__A_* */
  unsigned requires;  /* KS__A_* that must be given */
  int default_average;
  unsigned averages;  /* bit set of ks__avg accepted */
  int64_t default_ignore; /* language metrics ignore -100 by default */
  int has_default_ignore;
  ks_status (*declare)(ks_metric *m, ks_error *err);
  ks_status (*update)(ks_metric *m, const ks_tensor *in, size_t n, ks_error *err);
  ks_status (*compute)(ks_metric *m, ks_tensor *out, ks_error *err);
  /* A torchmetrics WrapperMetric (wrapper.c): its update and compute are neither counted nor cached
   * (the base metric's are), reset keeps its attributes (min_val / max_val), a clone copies them. */
  int wrapper;
};

/* described.c */
/* Nonzero when m was made by ks_metric_describe. */
int ks__metric_is_described(const ks_metric *m);
void ks__described_free(ks_metric *m);
/* Drops the values a load staged for m's attributes (ks_metric_reset). */
void ks__attrs_unstage(ks_metric *m);
/* ks_metric_add_inner without its check that `inner` is described: a wrapper's catalogue base metric. */
KS_NODISCARD ks_status ks__metric_add_inner(ks_metric *m, const char *name, ks_metric *inner, ks_error *err);
/* wrapper.c: ks_metric_create of a torchmetrics wrapper class (MinMaxMetric); KS_E_NOTFOUND when
 * class_name is none. */
KS_NODISCARD ks_status ks__wrapper_create(const char *class_name, const char *args_json, const ks_allocator *alloc,
                                          ks_metric **out, ks_error *err);
/* Deep copies of m's described parts (names, inner metrics) into c, a shallow copy of m. */
KS_NODISCARD ks_status ks__described_clone(const ks_metric *m, ks_metric *c, const ks_allocator *a);

/* registry.c */
const ks__class *ks__class_find(const char *name);

/* args.c */
KS_NODISCARD ks_status ks__args_parse(const ks__class *cls, const char *json, const ks_allocator *a, ks__margs *out,
                         ks_error *err);
KS_NODISCARD ks_status ks__args_canonical(const ks__class *cls, const ks__margs *args, const ks_allocator *a,
                             char **out);
void ks__args_free(const ks_allocator *a, ks__margs *args);
/* Nonzero when `key` is a constructor argument some catalogue class takes (not the ignored ones). */
int ks__args_known(const char *key);
KS_NODISCARD ks_status ks__args_copy(const ks_allocator *a, const ks__margs *src, ks__margs *dst);

/* engine.c: declaring and growing states */
KS_NODISCARD ks_status ks__state_declare(ks_metric *m, const char *name, ks_reduce reduce, ks_dtype dtype, int rank,
                            const int64_t *shape, double fill, ks_error *err);
ks__state *ks__state_last(ks_metric *m);
size_t ks__state_row_bytes(const ks__state *s);
/* Makes room for `rows` more rows of a cat state; the content is unchanged on failure. */
KS_NODISCARD ks_status ks__cat_reserve(const ks_metric *m, ks__state *s, uint64_t rows, ks_error *err);
/* Where the next row goes (after a successful reserve). */
void *ks__cat_tail(ks__state *s);
void ks__cat_commit(ks__state *s, uint64_t rows);

/* engine.c: results */
KS_NODISCARD ks_status ks__result(const ks_metric *m, ks_tensor *out, ks_dtype dtype, int rank, const int64_t *shape,
                     ks_error *err);
KS_NODISCARD ks_status ks__result_f32(const ks_metric *m, ks_tensor *out, double v, ks_error *err);

/* Counts as int64 views of a state. */
static inline int64_t *ks__i64(ks__state *s) { return (int64_t *)s->data; }
static inline float *ks__f32(ks__state *s) { return (float *)s->data; }

#endif
