/*
 * Checks the synced eval accuracy that keepsake-digits prints under mpirun:
 * recomputes MulticlassAccuracy from the union of the per-rank local states a
 * sharded checkpoint saved (merged onto one rank with ks_shard_load_rank), checks
 * that every rank's `_computed` (the synced result) equals it, and prints it.
 * usage: merged_metric DIR      (exit 1 when a rank's stored result differs)
 */
#include <stdio.h>
#include <string.h>

#include "keepsake/keepsake.h"
#include "keepsake/shard.h"

/* What the index records (ks_shard_index_get), by value. */
static ks_shard_index_info index_info(const ks_shard_index *idx) {
  ks_shard_index_info info = KS_OPTS_INIT(ks_shard_index_info);
  ks_shard_index_get(idx, &info);
  return info;
}

#define NAME "state/eval_metrics/eval/MulticlassAccuracy/"

static double scalar(const ks_tensor *t) { return ks_dtype_get_f64(t->dtype, t->data, 0); }

int main(int argc, char **argv) {
  if (argc != 2) return fprintf(stderr, "usage: merged_metric DIR\n"), 2;
  ks_shard_index *idx = NULL;
  ks_statedict *sd = NULL;
  ks_meta *meta = NULL;
  ks_metric *m = NULL;
  ks_error e;
  const ks_tensor *acc = NULL;
  ks_status s = ks_shard_index_read(argv[1], NULL, NULL, &idx, &e);
  if (!s) s = ks_shard_load_rank(argv[1], idx, 0, 1, NULL, NULL, &sd, &meta, &e);
  if (!s) s = ks_metric_create("MulticlassAccuracy", "{\"num_classes\":10,\"average\":\"micro\"}", NULL, &m, &e);
  if (!s) s = ks_metric_load_state_dict(m, sd, NAME "state_dict/", 2, 0, NULL, NULL, &e);
  if (!s) s = ks_metric_compute(m, &acc, &e);
  if (s) return fprintf(stderr, "merged_metric: %s\n", e.message), 2;
  int bad = 0, world = index_info(idx).world_size;
  for (int r = 0; r < world; r++) {
    ks_statedict *own = NULL;
    ks_meta *om = NULL;
    const ks_tensor *c;
    if (ks_shard_load_rank(argv[1], idx, r, world, NULL, NULL, &own, &om, &e) ||
        !(c = ks_statedict_tensor(own, NAME "_computed")) || scalar(c) != scalar(acc)) {
      fprintf(stderr, "merged_metric: rank %d's stored accuracy is not the merged one\n", r);
      bad = 1;
    }
    ks_statedict_free(own);
    ks_meta_free(om);
  }
  printf("%.4f\n", scalar(acc));
  ks_metric_free(m);
  ks_statedict_free(sd);
  ks_meta_free(meta);
  ks_shard_index_free(idx);
  return bad;
}
