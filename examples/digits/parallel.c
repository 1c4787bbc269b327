/*
 * keepsake-digits under mpirun: data-parallel training. Every rank holds the
 * same weights (same seed), trains on its slice of every batch, and the
 * gradients are averaged with MPI_Allreduce, so the weights stay identical.
 * With --async-save the files are written by a thread while training goes on
 * (ks_dist_saver), committed at the next save or at the end.
 * Metrics are synced (ks_dist_sync) before they are computed and printed; each
 * rank keeps its local states, which its file of every sharded checkpoint
 * saves, with the synced result as `_computed` (what keep-best ranks by).
 *
 * MPI is used only when the program was launched by mpirun (its environment
 * says so): started on its own, the demo behaves exactly as the serial one.
 */
#include <stdlib.h>
#include <string.h>

#include "digits.h"

#ifdef KS_DIGITS_MPI
#include "keepsake/dist.h"

static int launched_by_mpirun(void) {
  return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK");
}

int par_init(int *argc, char ***argv, digits_par *p) {
  *p = (digits_par){0, 0, 1, NULL, NULL};
  if (!launched_by_mpirun()) return 0;
  if (MPI_Init(argc, argv) != MPI_SUCCESS) return -1;
  p->on = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &p->rank);
  MPI_Comm_size(MPI_COMM_WORLD, &p->size);
  return 0;
}

void par_finish(digits_par *p) {
  ks_dist_saver_free(p->saver);
  p->saver = NULL;
  free(p->resumed);
  p->resumed = NULL;
  if (p->on) MPI_Finalize();
}

int par_average_grads(const digits_par *p, mlp *m, size_t local) {
  if (!p->on) return 0;
  size_t h = (size_t)m->hidden, n[4] = {h * DIGITS_PIXELS, h, DIGITS_CLASSES * h, DIGITS_CLASSES};
  float *g[4] = {m->gw1, m->gb1, m->gw2, m->gb2};
  double rows = (double)local, total = 0;
  if (MPI_Allreduce(&rows, &total, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD) != MPI_SUCCESS || total <= 0) return -1;
  for (int k = 0; k < 4; k++) {
    /* mean over local rows -> sum over them -> sum over all ranks -> mean over all rows */
    for (size_t i = 0; i < n[k]; i++) g[k][i] = local ? g[k][i] * (float)rows : 0.0f;
    if (MPI_Allreduce(MPI_IN_PLACE, g[k], (int)n[k], MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD) != MPI_SUCCESS) return -1;
    for (size_t i = 0; i < n[k]; i++) g[k][i] /= (float)total;
  }
  return 0;
}

/* Copies every metric's synced result, then puts the local states back with that result as `_computed`. */
ks_status par_sync_computed(const digits_par *p, ks_metric_collection *mc, ks_error *e) {
  if (!p->on) return KS_OK;
  size_t n = ks_metric_collection_count(mc);
  int64_t *counts = calloc(n ? n : 1, sizeof *counts);
  ks_tensor *res = calloc(n ? n : 1, sizeof *res);
  void **bufs = calloc(n ? n : 1, sizeof *bufs);
  ks_dist_cache *cache = NULL;
  ks_status s = counts && res && bufs ? KS_OK : KS_E_NOMEM;
  for (size_t i = 0; !s && i < n; i++) counts[i] = ks_metric_update_count(ks_metric_collection_at(mc, i, NULL));
  if (!s) s = ks_dist_sync(mc, MPI_COMM_WORLD, NULL, &cache, e);
  for (size_t i = 0; !s && i < n; i++) {
    const ks_tensor *t;
    s = ks_metric_compute(ks_metric_collection_at(mc, i, NULL), &t, e);
    if (!s && !(bufs[i] = malloc(t->nbytes ? t->nbytes : 1))) s = KS_E_NOMEM;
    if (!s) {
      memcpy(bufs[i], t->data, t->nbytes);
      s = ks_tensor_init(&res[i], t->dtype, t->rank, t->shape, bufs[i]);
    }
  }
  if (cache) {
    ks_status u = ks_dist_unsync(mc, cache, e);
    if (!s) s = u;
  }
  for (size_t i = 0; !s && i < n; i++)
    s = ks_metric_restore_computed(ks_metric_collection_at(mc, i, NULL), &res[i], counts[i], e);
  ks_dist_cache_free(cache);
  for (size_t i = 0; bufs && i < n; i++) free(bufs[i]);
  free(bufs);
  free(res);
  free(counts);
  return s;
}

int par_max(const digits_par *p, int v) {
  int all = v;
  if (p->on && MPI_Allreduce(&v, &all, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD) != MPI_SUCCESS) return v;
  return all;
}

int par_should_save(const digits_par *p, const ks_ckpt_manager *mgr, const ks_timestamp *ts, int epoch_end) {
  return p->on ? ks_dist_ckpt_should_save(MPI_COMM_WORLD, mgr, ts, epoch_end)
               : ks_ckpt_manager_should_save(mgr, ts, epoch_end);
}

ks_status par_save(digits_par *p, ks_ckpt_manager *mgr, const ks_state *st, const ks_io *io, int async, ks_error *e) {
  ks_dist_save_opts o = {.io = io};
  if (!async) return ks_dist_ckpt_save(MPI_COMM_WORLD, mgr, st, NULL, &o, NULL, e);
  ks_status s = p->saver ? KS_OK : ks_dist_saver_create(MPI_COMM_WORLD, mgr, &p->saver, e);
  s = ks_dist_agree(MPI_COMM_WORLD, s, e);
  return s ? s : ks_dist_saver_save(p->saver, st, NULL, &o, NULL, e);
}

ks_status par_wait(digits_par *p, ks_error *e) { return p->saver ? ks_dist_saver_wait(p->saver, e) : KS_OK; }

ks_status par_autoresume(digits_par *p, ks_ckpt_manager *mgr, ks_state *st, ks_load_report *rep, int *resumed,
                         const char **path, ks_error *e) {
  free(p->resumed);
  p->resumed = NULL;
  ks_status s = ks_dist_ckpt_autoresume(MPI_COMM_WORLD, mgr, st, NULL, NULL, rep, resumed, &p->resumed, e);
  if (path) *path = p->resumed;
  return s;
}

ks_status par_save_final(const digits_par *p, const ks_state *st, const char *dir, ks_error *e) {
  (void)p;
  ks_statedict *sd = NULL;
  ks_meta *meta = NULL;
  ks_status s = ks_statedict_create(NULL, &sd, e);
  if (!s) s = ks_meta_create(NULL, &meta, e);
  if (!s) s = ks_state_to_state_dict(st, sd, meta, e);
  s = ks_dist_agree(MPI_COMM_WORLD, s, e);
  if (!s) s = ks_dist_save(MPI_COMM_WORLD, dir, sd, meta, NULL, NULL, e);
  ks_statedict_free(sd);
  ks_meta_free(meta);
  return s;
}

#else /* built without MPI: one process, and these are never reached with on = 1 */

int par_init(int *argc, char ***argv, digits_par *p) {
  (void)argc;
  (void)argv;
  *p = (digits_par){0, 0, 1, NULL, NULL};
  return 0;
}
void par_finish(digits_par *p) { (void)p; }
int par_average_grads(const digits_par *p, mlp *m, size_t local) {
  (void)p, (void)m, (void)local;
  return 0;
}
ks_status par_sync_computed(const digits_par *p, ks_metric_collection *mc, ks_error *e) {
  (void)p, (void)mc, (void)e;
  return KS_OK;
}
int par_max(const digits_par *p, int v) {
  (void)p;
  return v;
}
int par_should_save(const digits_par *p, const ks_ckpt_manager *mgr, const ks_timestamp *ts, int epoch_end) {
  (void)p;
  return ks_ckpt_manager_should_save(mgr, ts, epoch_end);
}
ks_status par_save(digits_par *p, ks_ckpt_manager *mgr, const ks_state *st, const ks_io *io, int async, ks_error *e) {
  (void)p, (void)mgr, (void)st, (void)io, (void)async, (void)e;
  return KS_E_UNSUPPORTED;
}
ks_status par_wait(digits_par *p, ks_error *e) {
  (void)p, (void)e;
  return KS_OK;
}
ks_status par_autoresume(digits_par *p, ks_ckpt_manager *mgr, ks_state *st, ks_load_report *rep, int *resumed,
                         const char **path, ks_error *e) {
  (void)p, (void)mgr, (void)st, (void)rep, (void)resumed, (void)path, (void)e;
  return KS_E_UNSUPPORTED;
}
ks_status par_save_final(const digits_par *p, const ks_state *st, const char *dir, ks_error *e) {
  (void)p, (void)st, (void)dir, (void)e;
  return KS_E_UNSUPPORTED;
}
#endif
