/* A tiny MLP with hand-written backward pass; loops run in a fixed order so runs are bit-reproducible. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "digits.h"

#define IN DIGITS_PIXELS
#define OUT DIGITS_CLASSES

int mlp_create(mlp *m, int hidden, size_t max_batch) {
  memset(m, 0, sizeof *m);
  size_t h = (size_t)hidden;
  m->hidden = hidden;
  m->max_batch = max_batch;
  float **bufs[] = {&m->w1, &m->gw1, &m->b1, &m->gb1, &m->w2, &m->gw2, &m->b2, &m->gb2, &m->pre, &m->h, &m->mask};
  size_t sizes[] = {h * IN, h * IN, h, h, OUT * h, OUT * h, OUT, OUT, max_batch * h, max_batch * h, max_batch * h};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
    if (!(*bufs[i] = calloc(sizes[i], sizeof(float)))) return -1;
  return 0;
}

void mlp_free(mlp *m) {
  float *bufs[] = {m->w1, m->gw1, m->b1, m->gb1, m->w2, m->gw2, m->b2, m->gb2, m->pre, m->h, m->mask};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
  memset(m, 0, sizeof *m);
}

static void uniform_fill(float *w, size_t n, float bound, ks_rng *rng) {
  for (size_t i = 0; i < n; i++) w[i] = (float)((ks_rng_uniform(rng) * 2.0 - 1.0) * bound);
}

void mlp_init(mlp *m, ks_rng *rng) {
  size_t h = (size_t)m->hidden;
  uniform_fill(m->w1, h * IN, 1.0f / sqrtf((float)IN), rng);
  uniform_fill(m->b1, h, 1.0f / sqrtf((float)IN), rng);
  uniform_fill(m->w2, OUT * h, 1.0f / sqrtf((float)h), rng);
  uniform_fill(m->b2, OUT, 1.0f / sqrtf((float)h), rng);
}

/* logits = relu(x W1^T + b1) * mask, then W2^T + b2. mask NULL = no dropout. */
static void forward(mlp *m, const float *x, size_t bs, const float *mask, float *logits) {
  size_t h = (size_t)m->hidden;
  for (size_t b = 0; b < bs; b++) {
    for (size_t j = 0; j < h; j++) {
      float s = m->b1[j];
      for (size_t i = 0; i < IN; i++) s += m->w1[j * IN + i] * x[b * IN + i];
      m->pre[b * h + j] = s;
      m->h[b * h + j] = (s > 0 ? s : 0) * (mask ? mask[b * h + j] : 1.0f);
    }
    for (size_t k = 0; k < OUT; k++) {
      float s = m->b2[k];
      for (size_t j = 0; j < h; j++) s += m->w2[k * h + j] * m->h[b * h + j];
      logits[b * OUT + k] = s;
    }
  }
}

void mlp_forward(mlp *m, const float *x, size_t bs, float *logits) { forward(m, x, bs, NULL, logits); }

/* Softmax cross-entropy; turns logits into dL/dlogits (mean over the batch) in `d`. */
static float softmax_xent(const float *logits, const int64_t *y, size_t bs, float *d) {
  double loss = 0;
  for (size_t b = 0; b < bs; b++) {
    const float *z = logits + b * OUT;
    float mx = z[0], sum = 0;
    for (int k = 1; k < OUT; k++) mx = z[k] > mx ? z[k] : mx;
    for (int k = 0; k < OUT; k++) sum += expf(z[k] - mx);
    loss += (double)(logf(sum) + mx - z[y[b]]);
    for (int k = 0; k < OUT; k++) d[b * OUT + (size_t)k] = (expf(z[k] - mx) / sum - (float)(k == y[b])) / (float)bs;
  }
  return (float)(loss / (double)bs);
}

static void backward(mlp *m, const float *x, size_t bs, const float *d) {
  size_t h = (size_t)m->hidden;
  memset(m->gw1, 0, sizeof(float) * h * IN);
  memset(m->gb1, 0, sizeof(float) * h);
  memset(m->gw2, 0, sizeof(float) * OUT * h);
  memset(m->gb2, 0, sizeof(float) * OUT);
  for (size_t b = 0; b < bs; b++) {
    for (size_t k = 0; k < OUT; k++) {
      m->gb2[k] += d[b * OUT + k];
      for (size_t j = 0; j < h; j++) m->gw2[k * h + j] += d[b * OUT + k] * m->h[b * h + j];
    }
    for (size_t j = 0; j < h; j++) {
      float g = 0;
      for (size_t k = 0; k < OUT; k++) g += d[b * OUT + k] * m->w2[k * h + j];
      g *= (m->pre[b * h + j] > 0 ? 1.0f : 0.0f) * m->mask[b * h + j];
      m->gb1[j] += g;
      for (size_t i = 0; i < IN; i++) m->gw1[j * IN + i] += g * x[b * IN + i];
    }
  }
}

float mlp_train_batch(mlp *m, const float *x, const int64_t *y, size_t bs, float dropout, ks_rng *rng,
                      float *logits) {
  size_t n = bs * (size_t)m->hidden;
  for (size_t i = 0; i < n; i++) /* inverted dropout, drawn from the saved PRNG */
    m->mask[i] = ks_rng_uniform(rng) < dropout ? 0.0f : 1.0f / (1.0f - dropout);
  forward(m, x, bs, m->mask, logits);
  float d[64 * OUT];
  float loss = softmax_xent(logits, y, bs, d);
  backward(m, x, bs, d);
  return loss;
}

ks_status mlp_register(mlp *m, ks_state *st, ks_optimizer *opt) {
  int64_t h = m->hidden;
  struct {
    const char *name;
    float *p, *g;
    int rank;
    int64_t shape[2];
  } ps[] = {{"fc1.weight", m->w1, m->gw1, 2, {h, IN}},
            {"fc1.bias", m->b1, m->gb1, 1, {h, 0}},
            {"fc2.weight", m->w2, m->gw2, 2, {OUT, h}},
            {"fc2.bias", m->b2, m->gb2, 1, {OUT, 0}}};
  for (size_t i = 0; i < 4; i++) {
    ks_tensor t;
    ks_status s = ks_tensor_init(&t, KS_F32, ps[i].rank, ps[i].shape, ps[i].p);
    if (!s) s = ks_state_add_tensor(st, ps[i].name, &t, NULL);
    if (!s) s = ks_optimizer_add_param(opt, ps[i].p, ps[i].g, ps[i].rank, ps[i].shape, NULL);
    if (s) return s;
  }
  return KS_OK;
}
