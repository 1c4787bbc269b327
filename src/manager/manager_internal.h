/* The checkpoint manager's object, shared by policy.c (what decides), files.c and dirs.c (what
   writes a checkpoint file or directory), scan.c, retention.c, upload.c and preempt.c. */
#ifndef KS_MANAGER_INTERNAL_H
#define KS_MANAGER_INTERNAL_H

#include <stdio.h>

#include "core/internal.h"
#include "core/keys.h"
#include "keepsake/binding.h"
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
  const ks_io *upload_io;  /* save locally, then upload (NULL = off) */
  char *upload_dir;
  int upload_retention;
  const char *where;       /* "" for run_dir; "uploaded " in the upload view's retention log */
  int sharded; /* checkpoints are sharded directories */
  int lock_handle; /* the run directory's lock (lock_fn's handle), or -1 */
  int warned_unranked; /* the log was told that a saved checkpoint holds no value keep_best can rank */
  /* ks_ckpt_manager_should_save's watch on a loop that never advances its timestamp: per kind of
   * call (0 batch ends, 1 epoch ends) the last timestamp seen and how often in a row. */
  struct {
    int64_t epoch, batch;
    int repeats;
  } seen[2];
  int warned_stuck;
};

/* One entry of the run directory that matches the template. */
typedef struct ckpt {
  char *name;
  int readable; /* the header parsed and the timestamp was found */
  int incomplete; /* sharded: a directory without an index (a save that did not finish) */
  int nomem;      /* probing ran out of memory: says nothing about the checkpoint */
  ks_status code; /* why not readable, when the reason was an error (KS_E_IO, KS_E_NOMEM, ...); 0 for no timestamp */
  int64_t batch, epoch, sample, batch_in_epoch;
  double wct;
  int has_metric;
  double metric;
  const char *unranked; /* keep_best: why its value cannot rank (NULL when it can, or when keep_best is off) */
  char why[KS_ERROR_MSG_MAX + 40]; /* why it is not readable */
} ckpt;

typedef struct ckpt_list {
  ckpt *v;
  size_t n, cap;
} ckpt_list;

/* Records now as the time of the last save. */
void ks__mgr_touch(ks_ckpt_manager *m);
/* The template expanded with ts. @return KS_OK or KS_E_LIMIT. */
KS_NODISCARD ks_status ks__mgr_expand(const ks_ckpt_manager *m, const ks_timestamp *ts, char *name, size_t cap);
/* `latest`, then retention, after the checkpoint at path is durable. */
KS_NODISCARD ks_status ks__mgr_after_commit(void *ctx, const char *path, ks_error *err);
/* The next checkpoint file's path from the template and ts (NULL: all zero), remembered as
   m->last_path (policy.c). */
KS_NODISCARD ks_status ks__mgr_next_path(ks_ckpt_manager *m, const ks_timestamp *ts, ks_error *err);
/* Autoresume of a sharded manager: the newest complete directory, merged onto one process. */
KS_NODISCARD ks_status ks__mgr_autoresume_dir(ks_ckpt_manager *m, ks_state *st, const ks_load_opts *opts,
                                              ks_load_report *report, int *resumed, const char **path, ks_error *err);
/* run_dir + "/" + name into out. @return KS_OK or KS_E_LIMIT. */
KS_NODISCARD ks_status ks__mgr_join(const ks_ckpt_manager *m, const char *name, char *out, size_t cap);
/* Applies the preservation policies to the run directory (never deleting `keep_name`). */
KS_NODISCARD ks_status ks__mgr_prune(ks_ckpt_manager *m, const char *keep_name, ks_error *err);

/* The readable checkpoints of the manager's run directory, newest first (by the timestamp inside):
 * *names is an array of *n strings, freed with ks__mgr_names_free. Unreadable ones are warned
 * about on m->log, counted in *unreadable and left out (nothing is renamed). */
KS_NODISCARD ks_status ks__mgr_candidates(const ks_ckpt_manager *m, char ***names, size_t *n, size_t *unreadable,
                             ks_error *err);
void ks__mgr_names_free(const ks_ckpt_manager *m, char **names, size_t n);
/* Loads run_dir/name if it fully verifies (checksums); one that does not sets *bad = 1 and is
 * moved aside to .corrupt with a warning. Errors: out of memory, or the state refusing the load. */
KS_NODISCARD ks_status ks__mgr_try_load(ks_ckpt_manager *m, const char *name, ks_state *st, const ks_load_opts *opts,
                           ks_load_report *report, int *bad, ks_error *err);
/* Sets m->last_path to run_dir/name. */
KS_NODISCARD ks_status ks__mgr_set_last(ks_ckpt_manager *m, const char *name, ks_error *err);

/* Uploads run_dir/name to upload_dir/name, then points upload_dir's `latest` at it, then (with
 * upload_retention) applies the policies there. KS_E_IO names the step and both places. */
KS_NODISCARD ks_status ks__mgr_upload(ks_ckpt_manager *m, const char *name, ks_error *err);
/* Autoresume from upload_dir: download the newest that verifies into run_dir and load it. */
KS_NODISCARD ks_status ks__mgr_resume_uploaded(ks_ckpt_manager *m, ks_state *st, const ks_load_opts *opts,
                                  ks_load_report *report, int *resumed, ks_error *err);
/* The run directory's checkpoints, newest first (readable ones first). */
KS_NODISCARD ks_status ks__mgr_list(const ks_ckpt_manager *m, ckpt_list *l, ks_error *err);
void ks__mgr_list_free(const ks_allocator *a, ckpt_list *l);
/* Fills c from the checkpoint file at path (timestamp, best-N metric), or c->why. */
void ks__mgr_probe_file(const ks_ckpt_manager *m, const char *path, ckpt *c);
/* Fills c from the sharded directory at path: its index, then rank 0's file. */
void ks__mgr_probe_dir(const ks_ckpt_manager *m, const char *path, ckpt *c);
/* Removes a sharded checkpoint directory: the index first, then every file, then the directory. errno-style. */
int ks__mgr_remove_dir(const ks_ckpt_manager *m, const char *path);

#endif
