/*
 * Regression metrics: MeanSquaredError (RMSE with squared=false),
 * MeanAbsoluteError, R2Score. Per-batch sums are taken in double and added to
 * the float32 states once, as torch adds a batch's sum to the state.
 */
#include <math.h>
#include <string.h>

#include "metrics/families.h"
#include "metrics/inputs.h"

enum { ERR_SQ, ERR_ABS };

/*
 * sum over i of (p-t)^2 or |p-t| with float32 differences as torch. Blocks of
 * 512 are summed in eight float lanes (vectorisable, error ~ 64 ulp of a block
 * at worst) and the block sums in double, close to torch's pairwise sum.
 */
#define ERR_BLOCK 512
#define ERR_BLOCK_FN(name, expr)                                                                       \
  static double name(const float *p, const float *t, size_t n) {                                      \
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};                                                           \
    size_t i = 0;                                                                                      \
    for (; i + 8 <= n; i += 8)                                                                         \
      for (size_t k = 0; k < 8; k++) {                                                                 \
        float d = p[i + k] - t[i + k];                                                                 \
        acc[k] += expr;                                                                                \
      }                                                                                                \
    double s = ((double)(acc[0] + acc[4]) + (double)(acc[1] + acc[5])) +                               \
               ((double)(acc[2] + acc[6]) + (double)(acc[3] + acc[7]));                                \
    for (; i < n; i++) {                                                                               \
      float d = p[i] - t[i];                                                                           \
      s += (double)(expr);                                                                             \
    }                                                                                                  \
    return s;                                                                                          \
  }
ERR_BLOCK_FN(sq_block_f32, d * d)
ERR_BLOCK_FN(abs_block_f32, fabsf(d))

static double err_sum_f32(const float *p, const float *t, size_t n, int kind) {
  double s = 0;
  for (size_t i = 0; i < n; i += ERR_BLOCK) {
    size_t k = n - i < ERR_BLOCK ? n - i : ERR_BLOCK;
    s += kind == ERR_SQ ? sq_block_f32(p + i, t + i, k) : abs_block_f32(p + i, t + i, k);
  }
  return s;
}

/* Per-output sums over rows of (rows, k) inputs, in double. */
static void err_sum_f64(const double *p, const double *t, size_t rows, size_t k, int kind, double *out) {
  for (size_t j = 0; j < k; j++) out[j] = 0;
  for (size_t r = 0; r < rows; r++)
    for (size_t j = 0; j < k; j++) {
      double d = p[r * k + j] - t[r * k + j];
      out[j] += kind == ERR_SQ ? d * d : fabs(d);
    }
}

static KS_NODISCARD ks_status check_pair(const ks_metric *m, const ks_tensor *in, size_t n, ks_error *err) {
  ks_status st = ks__need_inputs(m, n, 2, 2, err);
  if (!st) st = ks__check_input(&in[0], "preds", err);
  if (!st) st = ks__check_input(&in[1], "target", err);
  if (!st) st = ks__same_shape(&in[0], &in[1], "preds", "target", err);
  return st;
}

/* Rows and outputs of a (N,) / (N, num_outputs) batch; num_outputs = 1 takes any shape. */
static KS_NODISCARD ks_status layout(const ks_metric *m, const ks_tensor *p, size_t *rows, size_t *k, ks_error *err) {
  size_t K = (size_t)m->args.num_outputs;
  if (K == 1) {
    *rows = ks__numel(p);
    *k = 1;
    return KS_OK;
  }
  if (p->rank != 2 || p->shape[1] != (int64_t)K)
    return ks__err(err, KS_E_SHAPE, "%s with num_outputs=%zu needs preds of shape (N, %zu)", m->cls->name, K, K);
  *rows = (size_t)p->shape[0];
  *k = K;
  return KS_OK;
}

/* Sums of one error kind per output, into out[k] (k = num_outputs). */
static KS_NODISCARD ks_status batch_errors(ks_metric *m, const ks_tensor *in, int kind, size_t rows, size_t k,
                                           double *out, ks_error *err) {
  if (k == 1 && in[0].dtype == KS_F32 && in[1].dtype == KS_F32) {
    out[0] = err_sum_f32(in[0].data, in[1].data, rows, kind);
    return KS_OK;
  }
  ks__view p = {0}, t = {0};
  ks_status st = ks__view_as(m, &in[0], KS_F64, &p, err);
  if (!st) st = ks__view_as(m, &in[1], KS_F64, &t, err);
  if (!st) err_sum_f64(p.p, t.p, rows, k, kind, out);
  ks__view_free(m, &p);
  ks__view_free(m, &t);
  return st;
}

static KS_NODISCARD ks_status error_update(ks_metric *m, const ks_tensor *in, size_t n, int kind, ks_error *err) {
  size_t rows = 0, k = 1;
  ks_status st = check_pair(m, in, n, err);
  if (!st) st = layout(m, &in[0], &rows, &k, err);
  if (st) return st;
  double one, *sums = k == 1 ? &one : ks__malloc(&m->alloc, k * sizeof *sums);
  if (!sums) return ks__err(err, KS_E_NOMEM, "out of memory for %s sums", m->cls->name);
  st = batch_errors(m, in, kind, rows, k, sums, err);
  if (!st) {
    float *s = ks__f32(&m->st[0]);
    for (size_t j = 0; j < k; j++) s[j] += (float)sums[j];
    *ks__i64(&m->st[1]) += (int64_t)rows;
  }
  if (sums != &one) ks__free(&m->alloc, sums);
  return st;
}

static KS_NODISCARD ks_status declare_error(ks_metric *m, const char *name, ks_error *err) {
  int64_t K = m->args.num_outputs;
  ks_status st = ks__state_declare(m, name, KS_REDUCE_SUM, KS_F32, 1, &K, 0.0, err);
  if (st) return st;
  ks__state_last(m)->reshape_ok = 1;
  return ks__state_declare(m, "total", KS_REDUCE_SUM, KS_I64, 0, NULL, 0.0, err);
}

static KS_NODISCARD ks_status error_compute(ks_metric *m, int root, ks_tensor *out, ks_error *err) {
  int64_t K = m->args.num_outputs;
  ks_status st = ks__result(m, out, KS_F32, K == 1 ? 0 : 1, &K, err);
  if (st) return st;
  const float *s = ks__f32(&m->st[0]);
  float total = (float)*ks__i64(&m->st[1]);
  for (int64_t j = 0; j < K; j++) {
    float v = s[j] / total;
    ((float *)out->data)[j] = root ? sqrtf(v) : v;
  }
  return KS_OK;
}

/* ---- MeanSquaredError ---- */

ks_status ks__mse_declare(ks_metric *m, ks_error *err) { return declare_error(m, "sum_squared_error", err); }
ks_status ks__mse_update(ks_metric *m, const ks_tensor *in, size_t n, ks_error *err) {
  return error_update(m, in, n, ERR_SQ, err);
}
ks_status ks__mse_compute(ks_metric *m, ks_tensor *out, ks_error *err) {
  return error_compute(m, !m->args.squared, out, err);
}

/* ---- MeanAbsoluteError: sum_abs_error is (num_outputs,) since torchmetrics 1.5, () before (migrated on load) ---- */

ks_status ks__mae_declare(ks_metric *m, ks_error *err) { return declare_error(m, "sum_abs_error", err); }
ks_status ks__mae_update(ks_metric *m, const ks_tensor *in, size_t n, ks_error *err) {
  return error_update(m, in, n, ERR_ABS, err);
}
ks_status ks__mae_compute(ks_metric *m, ks_tensor *out, ks_error *err) { return error_compute(m, 0, out, err); }

/*
 * ---- R2Score ----
 * torchmetrics >= 1.5 starts the three sums as () and lets the first update
 * broadcast them to (outputs,); keepsake is told num_outputs instead, so the
 * sums are () for one output and (num_outputs,) for more: the 1.5+ shapes after
 * any update. Loading migrates 1.4's (1,) sums and broadcasts 1.5+'s () zeros.
 */
ks_status ks__r2_declare(ks_metric *m, ks_error *err) {
  static const char *const names[3] = {"sum_squared_error", "sum_error", "residual"};
  int64_t K = m->args.num_outputs;
  for (int i = 0; i < 3; i++) {
    ks_status st = ks__state_declare(m, names[i], KS_REDUCE_SUM, KS_F32, K == 1 ? 0 : 1, &K, 0.0, err);
    if (st) return st;
    ks__state_last(m)->reshape_ok = K == 1 ? 1 : 2;
  }
  return ks__state_declare(m, "total", KS_REDUCE_SUM, KS_I64, 0, NULL, 0.0, err);
}

static KS_NODISCARD ks_status r2_layout(const ks_metric *m, const ks_tensor *p, size_t *rows, ks_error *err) {
  int64_t K = m->args.num_outputs;
  int ok = (p->rank == 1 && K == 1) || (p->rank == 2 && p->shape[1] == K);
  if (!ok) return ks__err(err, KS_E_SHAPE, "R2Score needs preds of shape (N,) or (N, num_outputs=%lld)", (long long)K);
  *rows = (size_t)p->shape[0];
  return KS_OK;
}

ks_status ks__r2_update(ks_metric *m, const ks_tensor *in, size_t n, ks_error *err) {
  size_t rows = 0, K = (size_t)m->args.num_outputs;
  ks__view p = {0}, t = {0};
  ks_status st = check_pair(m, in, n, err);
  if (!st) st = r2_layout(m, &in[0], &rows, err);
  if (!st) st = ks__view_as(m, &in[0], KS_F64, &p, err);
  if (!st) st = ks__view_as(m, &in[1], KS_F64, &t, err);
  double *acc = NULL;
  if (!st && !(acc = ks__calloc(&m->alloc, 3 * K, sizeof *acc))) st = ks__err(err, KS_E_NOMEM, "out of memory");
  if (!st) {
    const double *pp = p.p, *tt = t.p;
    for (size_t r = 0; r < rows; r++)
      for (size_t j = 0; j < K; j++) {
        double y = tt[r * K + j], d = y - pp[r * K + j];
        acc[j] += y * y;
        acc[K + j] += y;
        acc[2 * K + j] += d * d;
      }
    for (int s = 0; s < 3; s++)
      for (size_t j = 0; j < K; j++) ks__f32(&m->st[s])[j] += (float)acc[(size_t)s * K + j];
    *ks__i64(&m->st[3]) += (int64_t)rows;
  }
  ks__free(&m->alloc, acc);
  ks__view_free(m, &p);
  ks__view_free(m, &t);
  return st;
}

/* torchmetrics' _r2_score_compute with multioutput='uniform_average', in float32. */
ks_status ks__r2_compute(ks_metric *m, ks_tensor *out, ks_error *err) {
  int64_t N = *ks__i64(&m->st[3]), K = m->args.num_outputs;
  if (N < 2) return ks__err(err, KS_E_STATE, "R2Score needs at least two samples, has %lld", (long long)N);
  const float *sq = ks__f32(&m->st[0]), *sum = ks__f32(&m->st[1]), *rss = ks__f32(&m->st[2]);
  double total = 0;
  for (int64_t j = 0; j < K; j++) {
    float mean = sum[j] / (float)N;
    float tss = sq[j] - sum[j] * mean;
    int c_rss = !(fabsf(rss[j]) <= 1e-4f), c_tss = !(fabsf(tss) <= 1e-4f);
    float raw = 1.0f;
    if (c_rss && c_tss) raw = 1.0f - rss[j] / tss;
    else if (c_rss) raw = 0.0f;
    total += (double)raw;
  }
  return ks__result_f32(m, out, total / (double)K, err);
}
