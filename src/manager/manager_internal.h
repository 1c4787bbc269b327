/* The checkpoint manager's object, shared by manager.c and scan.c. */
#ifndef KS_MANAGER_INTERNAL_H
#define KS_MANAGER_INTERNAL_H

#include <stdio.h>

#include "core/internal.h"
#include "core/keys.h"
#include "keepsake/manager.h"

/* The preservation policies, parsed from ks_ckpt_opts. */
typedef struct ks__retention {
  int keep_latest;
  int keep_best;
  int best_min;          /* 1: lower is better */
  char metric_name[KS_MAX_NAME + 1]; /* as the user spelled it, for messages */
  char metric_key[KS_MAX_NAME + 1];  /* the `_computed` entry it reads */
  int64_t every;
  int every_epochs;
  double period_seconds;
} ks__retention;

/* What retention knows of one readable checkpoint. */
typedef struct ks__ckpt_info {
  const char *name;
  int64_t batch, epoch, batch_in_epoch;
  double wct;            /* total_wct of its timestamp */
  int has_metric;        /* a finite stored value of the best-N metric */
  double metric;
  int keep, best_rank;   /* outputs */
  char why[512];         /* outputs: the policies that keep it */
} ks__ckpt_info;

/* Marks each checkpoint of v (newest first) keep or not, with the reasons. Pure. */
void ks__retention_decide(const ks__retention *p, ks__ckpt_info *v, size_t n);

struct ks_ckpt_manager {
  ks_allocator alloc;
  char *run_dir;
  char *tmpl;
  int keep;
  int64_t every;
  int by_epoch;
  const ks_io *io;
  FILE *log;
  char *last_path;
  size_t skipped;
  ks__retention ret;
  FILE *retention_log;
  double save_every_seconds;
  double last_save_time; /* monotonic seconds of the last save (or of creation) */
  ks_async_saver *saver; /* created on the first async save */
  ks_async_busy async_busy;
  void *staging;
  size_t staging_size;
};

/* run_dir + "/" + name into out. @return KS_OK or KS_E_LIMIT. */
KS_NODISCARD ks_status ks__mgr_join(const ks_ckpt_manager *m, const char *name, char *out, size_t cap);
/* Applies the preservation policies to the run directory (never deleting `keep_name`). */
KS_NODISCARD ks_status ks__mgr_prune(ks_ckpt_manager *m, const char *keep_name, ks_error *err);
/* Parses "eval/Name", "train/Name" or a full "state/..." metric path into its `_computed` key. */
KS_NODISCARD ks_status ks__mgr_metric_key(const char *metric, char *key, size_t cap);

#endif
