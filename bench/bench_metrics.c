/*
 * Metric update throughput: updates/s and input bytes/s on large batches
 * (about 1M predictions) and small ones (32), compared with the read
 * bandwidth of a buffer of the same size measured in the same run.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "benchutil.h"
#include "keepsake/metric.h"

enum { IN_LOGITS, IN_LABELS, IN_BINARY, IN_REG, IN_LM };

typedef struct bcase {
  const char *label;
  const char *cls;
  const char *args;
  int inputs;
  int64_t width;      /* classes / vocabulary */
  int64_t large_rows; /* rows of a large batch */
} bcase;

static const bcase k_cases[] = {
    {"MulticlassAccuracy C=10 logits", "MulticlassAccuracy", "{\"num_classes\":10}", IN_LOGITS, 10, 1 << 20},
    {"MulticlassAccuracy C=10 labels", "MulticlassAccuracy", "{\"num_classes\":10}", IN_LABELS, 10, 1 << 20},
    {"MulticlassAccuracy C=1000 logits", "MulticlassAccuracy", "{\"num_classes\":1000}", IN_LOGITS, 1000, 1 << 14},
    {"MulticlassAccuracy C=1000 labels", "MulticlassAccuracy", "{\"num_classes\":1000}", IN_LABELS, 1000, 1 << 20},
    {"BinaryAUROC exact", "BinaryAUROC", NULL, IN_BINARY, 0, 1 << 20},
    {"BinaryAUROC thresholds=100", "BinaryAUROC", "{\"thresholds\":100}", IN_BINARY, 0, 1 << 20},
    {"MeanSquaredError", "MeanSquaredError", NULL, IN_REG, 0, 1 << 20},
    {"LanguageCrossEntropy V=32000", "LanguageCrossEntropy", NULL, IN_LM, 32000, 256},
};

typedef struct inputs {
  ks_tensor t[2];
  void *buf[2];
  size_t bytes;
} inputs;

static uint64_t rng = 88172645463325252ull;
static float frand(void) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (float)(rng >> 40) / 16777216.0f;
}

static int make_inputs(const bcase *c, int64_t rows, inputs *in) {
  int64_t w = c->width, n0 = rows * (c->inputs == IN_LOGITS || c->inputs == IN_LM ? w : 1);
  ks_dtype d0 = c->inputs == IN_LABELS ? KS_I64 : KS_F32, d1 = c->inputs == IN_REG ? KS_F32 : KS_I64;
  in->buf[0] = malloc((size_t)n0 * ks_dtype_size(d0));
  in->buf[1] = malloc((size_t)rows * ks_dtype_size(d1));
  if (!in->buf[0] || !in->buf[1]) return -1;
  for (int64_t i = 0; i < n0; i++) {
    if (d0 == KS_I64) ((int64_t *)in->buf[0])[i] = (int64_t)(frand() * (float)w) % w;
    else ((float *)in->buf[0])[i] = c->inputs == IN_BINARY ? frand() : frand() * 8 - 4;
  }
  for (int64_t i = 0; i < rows; i++) {
    if (d1 == KS_F32) ((float *)in->buf[1])[i] = frand();
    else ((int64_t *)in->buf[1])[i] = c->inputs == IN_BINARY ? frand() < 0.5f : (int64_t)(frand() * (float)w) % w;
  }
  int64_t s0[2] = {rows, w};
  if (ks_tensor_init(&in->t[0], d0, (c->inputs == IN_LOGITS || c->inputs == IN_LM) ? 2 : 1, s0, in->buf[0]))
    abort();                                                     /* fixed, valid shapes: cannot fail */
  if (ks_tensor_init(&in->t[1], d1, 1, s0, in->buf[1])) abort(); /* fixed, valid shapes: cannot fail */
  in->bytes = in->t[0].nbytes + in->t[1].nbytes;
  return 0;
}

/* Best-of-batches time per update; cat states are reset between updates so memory stays flat. */
static double time_updates(ks_metric *m, const inputs *in, size_t per_round, int rounds) {
  double best = 1e30;
  for (int r = 0; r < rounds; r++) {
    ks_metric_reset(m);
    double t0 = ks_bench_now();
    for (size_t k = 0; k < per_round; k++)
      if (ks_metric_update(m, in->t, 2, NULL)) return -1;
    double t = (ks_bench_now() - t0) / (double)per_round;
    if (t < best) best = t;
  }
  const ks_tensor *out;
  if (ks_metric_compute(m, &out, NULL) == KS_OK) ks_bench_sink(ks_dtype_get_f64(out->dtype, out->data, 0));
  return best;
}

static void run(const bcase *c, int64_t rows, const char *size) {
  inputs in;
  ks_metric *m = NULL;
  if (make_inputs(c, rows, &in) || ks_metric_create(c->cls, c->args, NULL, &m, NULL)) {
    printf("| %s | %s | setup failed |\n", c->label, size);
    return;
  }
  int small = in.bytes < (1u << 20);
  double t = time_updates(m, &in, small ? 2000 : 3, small ? 5 : 4);
  double bw = ks_bench_read_bandwidth(in.bytes < 4096 ? 4096 : in.bytes, small ? 200 : 5);
  double gib = ks_bench_gibps((double)in.bytes, t);
  printf("| %-34s | %-5s | %10lld | %10.3f | %12.0f | %8.2f | %8.2f | %5.2f |\n", c->label, size, (long long)rows,
         (double)in.bytes / 1048576.0, 1.0 / t, gib, bw, gib / bw);
  ks_metric_free(m);
  free(in.buf[0]);
  free(in.buf[1]);
}

int main(void) {
  printf("metric update throughput (input GiB/s vs read bandwidth of the same bytes)\n\n");
  printf("| %-34s | %-5s | %10s | %10s | %12s | %8s | %8s | %5s |\n", "metric", "batch", "rows", "MiB/update",
         "updates/s", "GiB/s", "read BW", "ratio");
  printf("|%s|%s|%s|%s|%s|%s|%s|%s|\n", "------------------------------------", "-------", "------------",
         "------------", "--------------", "----------", "----------", "-------");
  for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++) {
    run(&k_cases[i], k_cases[i].large_rows, "large");
    run(&k_cases[i], 32, "small");
  }
  return 0;
}
