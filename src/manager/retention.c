/*
 * Which checkpoints to keep. The decision is a pure function of what the
 * checkpoints on disk say about themselves (timestamp, wall clock, the stored
 * metric value), so a resumed run, or one pointed at the same directory under
 * another spelling, computes exactly the same set: no policy state is kept
 * anywhere else.
 *
 * A checkpoint is kept when any configured policy keeps it; the newest one is
 * always kept (it is the last good checkpoint). With no policy at all, every
 * checkpoint is kept.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "manager/manager_internal.h"

static int any_policy(const ks__retention *p) {
  return p->keep_latest > 0 || p->keep_best > 0 || p->every > 0 || p->period_seconds > 0;
}

static void add_reason(ks__ckpt_info *c, const char *why) {
  size_t n = strlen(c->why);
  snprintf(c->why + n, sizeof c->why - n, "%s%s", n ? "; " : "", why);
  c->keep = 1;
}

static void keep_latest(const ks__retention *p, ks__ckpt_info *v, size_t n) {
  char why[64];
  for (size_t i = 0; i < n && i < (size_t)p->keep_latest; i++) {
    snprintf(why, sizeof why, "latest %zu of %d", i + 1, p->keep_latest);
    add_reason(&v[i], why);
  }
}

/* Indices of checkpoints that carry the metric, best first (ties: the newer first). */
static int better(const ks__retention *p, const ks__ckpt_info *a, const ks__ckpt_info *b) {
  return p->best_min ? a->metric < b->metric : a->metric > b->metric;
}

static void keep_best(const ks__retention *p, ks__ckpt_info *v, size_t n) {
  /* Selection without allocation: n is the number of checkpoints in one run directory. */
  for (int rank = 1; rank <= p->keep_best; rank++) {
    ks__ckpt_info *best = NULL;
    for (size_t i = 0; i < n; i++) {
      if (!v[i].has_metric || v[i].best_rank) continue;
      if (!best || better(p, &v[i], best)) best = &v[i]; /* v is newest first: ties keep the newer */
    }
    if (!best) return;
    best->best_rank = rank;
    char why[KS_MAX_NAME + 96];
    snprintf(why, sizeof why, "best %d of %d by %s (%.6g)", rank, p->keep_best, p->metric_name, best->metric);
    add_reason(best, why);
  }
}

static void keep_every(const ks__retention *p, ks__ckpt_info *v, size_t n) {
  char why[64];
  for (size_t i = 0; i < n; i++) {
    int hit = p->every_epochs ? v[i].batch_in_epoch == 0 && v[i].epoch % p->every == 0
                              : v[i].batch % p->every == 0;
    if (!hit) continue;
    snprintf(why, sizeof why, "every %lld%s", (long long)p->every, p->every_epochs ? "ep" : "ba");
    add_reason(&v[i], why);
  }
}

/* The first (oldest) checkpoint of each period of training wall-clock time. */
static void keep_periods(const ks__retention *p, ks__ckpt_info *v, size_t n) {
  char why[96];
  for (size_t i = n; i-- > 0;) {
    double bucket = floor(v[i].wct / p->period_seconds);
    int first = i + 1 == n || floor(v[i + 1].wct / p->period_seconds) != bucket;
    if (!first) continue;
    snprintf(why, sizeof why, "first of period %.0f (%gs each)", bucket, p->period_seconds);
    add_reason(&v[i], why);
  }
}

void ks__retention_decide(const ks__retention *p, ks__ckpt_info *v, size_t n) {
  for (size_t i = 0; i < n; i++) {
    v[i].keep = 0;
    v[i].best_rank = 0;
    v[i].why[0] = '\0';
  }
  if (!n) return;
  if (!any_policy(p)) {
    for (size_t i = 0; i < n; i++) add_reason(&v[i], "no retention policy");
    return;
  }
  keep_latest(p, v, n);
  if (p->keep_best > 0) keep_best(p, v, n);
  if (p->every > 0) keep_every(p, v, n);
  if (p->period_seconds > 0) keep_periods(p, v, n);
  if (!v[0].keep) add_reason(&v[0], "newest (never deleted)");
}
