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

#endif
