/* The checkpoint manager's object, shared by manager.c and scan.c. */
#ifndef KS_MANAGER_INTERNAL_H
#define KS_MANAGER_INTERNAL_H

#include <stdio.h>

#include "core/internal.h"
#include "core/keys.h"
#include "keepsake/manager.h"

struct ks_ckpt_manager {
  ks_allocator alloc;
  char *run_dir;
  char *tmpl;
  int keep;
  int64_t every;
  int by_epoch;
  const ks_io *io;
  int no_fsync;
  FILE *log;
  char *last_path;
  size_t skipped;
};

/* run_dir + "/" + name into out. @return KS_OK or KS_E_LIMIT. */
ks_status ks__mgr_join(const ks_ckpt_manager *m, const char *name, char *out, size_t cap);
/* Deletes the oldest checkpoints beyond `keep` (never `keep_name`). */
ks_status ks__mgr_prune(ks_ckpt_manager *m, const char *keep_name, ks_error *err);

#endif
