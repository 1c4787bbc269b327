/* The keepsake-digits example: data, model and the pieces main.c wires together. */
#ifndef KS_DIGITS_H
#define KS_DIGITS_H

#include <stddef.h>
#include <stdint.h>

#include "keepsake/manager.h"
#include "keepsake/state.h"

#define DIGITS_ROWS 1797
#define DIGITS_PIXELS 64
#define DIGITS_CLASSES 10
#define DIGITS_EVAL_ROWS 360 /* rows 0, 5, 10, ...: a fixed split (see data.c) */

/* The whole data set: pixels scaled to [0, 1], labels 0..9. */
typedef struct digits_data {
  float *x;   /* n * 64 */
  int64_t *y; /* n */
  size_t n;
} digits_data;

/* Reads data/digits.csv.gz (gzip'd CSV, 65 integers per row): 1437 train rows, then 360 eval rows.
   Returns 0 or prints why and returns -1. */
int digits_load(const char *path, digits_data *d);
void digits_free(digits_data *d);

/* A 64-H-10 MLP with ReLU and dropout on the hidden layer. */
typedef struct mlp {
  int hidden;
  float *w1, *b1, *w2, *b2;     /* parameters (torch layout: weight [out, in]) */
  float *gw1, *gb1, *gw2, *gb2; /* gradients of the last batch */
  float *pre, *h, *mask;        /* scratch for one batch */
  size_t max_batch;
} mlp;

int mlp_create(mlp *m, int hidden, size_t max_batch);
void mlp_free(mlp *m);
/* torch.nn.Linear's default init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), from `rng`. */
void mlp_init(mlp *m, ks_rng *rng);
/* Forward + backward of one batch; fills the gradients and `logits` (bs*10); returns the mean loss. */
float mlp_train_batch(mlp *m, const float *x, const int64_t *y, size_t bs, float dropout, ks_rng *rng,
                      float *logits);
/* Forward only, no dropout. */
void mlp_forward(mlp *m, const float *x, size_t bs, float *logits);
/* Registers fc1.weight, fc1.bias, fc2.weight, fc2.bias with the state and the optimizer. */
ks_status mlp_register(mlp *m, ks_state *st, ks_optimizer *opt);

/* Installs the optional save-kill hook from KS_TEST_KILL_IN_SAVE="<save number>:<bytes>". NULL when unset. */
const ks_io *digits_test_io(void);
/* Test hook: raises the signal KS_TEST_SIGNAL_AT names after that batch. */
void digits_test_after_batch(long long batch);

/* KS_TEST_KILL_RANK=<r>: under mpirun, only rank r runs the test hooks (kills, halts); unset = every rank. */
void digits_test_set_rank(int rank);
/* Whether the test hooks apply to this rank. */
int digits_test_this_rank(void);

/*
 * Data parallelism (parallel.c). When the program was started by mpirun and
 * keepsake was built with MPI, `on` is 1: each rank trains on its part of every
 * batch and evaluates its part of the eval rows, gradients are averaged with
 * MPI_Allreduce, metrics are synced before they are printed, and checkpoints are
 * sharded directories. Otherwise on = 0, rank 0 of 1, and nothing here does anything.
 */
struct ks_dist_saver;
typedef struct digits_par {
  int on, rank, size;
  struct ks_dist_saver *saver; /* --async-save: background sharded saves */
  char *resumed;               /* the directory resumed from (malloc'd) */
} digits_par;

int par_init(int *argc, char ***argv, digits_par *p);
void par_finish(digits_par *p);
/* Gradients of `local` rows (mean over them) become the mean over all ranks' rows. */
int par_average_grads(const digits_par *p, mlp *m, size_t local);
/* Every metric of mc computed on the union of all ranks' data, cached as its `_computed`; local states kept. */
ks_status par_sync_computed(const digits_par *p, ks_metric_collection *mc, ks_error *e);
/* The largest of every rank's v (v itself on one process). */
int par_max(const digits_par *p, int v);
int par_should_save(const digits_par *p, const ks_ckpt_manager *mgr, const ks_timestamp *ts, int epoch_end);
/* A sharded checkpoint; `async`: the files are written in the background, committed at the next save or par_wait. */
ks_status par_save(digits_par *p, ks_ckpt_manager *mgr, const ks_state *st, const ks_io *io, int async, ks_error *e);
/* Commits a background save (collective); KS_OK when there is none. */
ks_status par_wait(digits_par *p, ks_error *e);
ks_status par_autoresume(digits_par *p, ks_ckpt_manager *mgr, ks_state *st, ks_load_report *rep, int *resumed,
                         const char **path, ks_error *e);
/* The final state as the sharded directory `dir`. */
ks_status par_save_final(const digits_par *p, const ks_state *st, const char *dir, ks_error *e);

#endif
