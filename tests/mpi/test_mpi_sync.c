/*
 * Metric sync across ranks: after ks_dist_sync every metric of the catalogue
 * equals the single-process metric fed the union of the data (ranks that saw
 * no data included), every rank holds the same bits, and ks_dist_unsync puts
 * each rank's local states back. Also: a mismatch on one rank and an
 * allocation failure on one rank fail every rank with the same error and
 * change nothing.
 */
#include <math.h>
#include <string.h>

#include "catalogue.h"
#include "keepsake/dist.h"
#include "mpitest.h"
#include "testutil.h"

#define N_BATCHES 7

/* Which rank feeds batch b: the last rank of a multi-rank job sees no data. */
static int owner(int b, int size) { return size == 1 ? 0 : b % (size - 1); }

static ks_metric_collection *catalogue(void) {
  ks_metric_collection *c;
  ks_error err;
  MT_OK(golden_catalogue_factory(NULL, NULL, NULL, &c, &err), &err);
  return c;
}

static void feed(ks_metric_collection *c, int only_rank) {
  ks_error err;
  for (size_t i = 0; i < ks_metric_collection_count(c); i++) {
    ks_metric *m = ks_metric_collection_at(c, i, NULL);
    if (only_rank >= 0) {
      for (int b = 0; b < N_BATCHES; b++)
        if (owner(b, mt_size) == only_rank) MT_OK(golden_feed(m, ks_metric_class(m), b, &err), &err);
    } else {
      /* The union in rank order, as a sync concatenates it. */
      for (int r = 0; r < mt_size; r++)
        for (int b = 0; b < N_BATCHES; b++)
          if (owner(b, mt_size) == r) MT_OK(golden_feed(m, ks_metric_class(m), b, &err), &err);
    }
  }
}

static void test_catalogue_sync(void) {
  ks_metric_collection *c = catalogue(), *ref = catalogue(), *local = catalogue();
  feed(c, mt_rank);
  feed(local, mt_rank);
  feed(ref, -1);
  ks_dist_cache *cache = NULL;
  ks_error err;
  MT_OK(ks_dist_sync(c, MPI_COMM_WORLD, NULL, &cache, &err), &err);
  MT_CHECK(mt_same_on_all(mt_states_hash(c)), "ranks hold different states after sync");
  for (size_t i = 0; i < ks_metric_collection_count(c); i++) {
    const char *name;
    ks_metric *m = ks_metric_collection_at(c, i, &name);
    ks_metric *want = ks_metric_collection_at(ref, i, NULL);
    mt_expect_same_states(name, m, want);
    mt_expect_same_compute(name, m, want);
  }
  MT_OK(ks_dist_unsync(c, cache, &err), &err);
  MT_CHECK(mt_states_hash(c) == mt_states_hash(local), "unsync did not restore the local states");
  for (size_t i = 0; i < ks_metric_collection_count(c); i++) {
    const char *name;
    ks_metric *m = ks_metric_collection_at(c, i, &name);
    MT_CHECK(ks_metric_computed(m) == NULL, "%s: unsync kept a synced result", name);
    mt_expect_same_compute(name, m, ks_metric_collection_at(local, i, NULL));
  }
  ks_dist_cache_free(cache);
  ks_metric_collection_free(c);
  ks_metric_collection_free(ref);
  ks_metric_collection_free(local);
}

static ks_metric_collection *small(int top_k) {
  ks_metric_collection *c;
  ks_metric *m;
  char args[64];
  snprintf(args, sizeof args, "{\"num_classes\":5,\"top_k\":%d}", top_k);
  MT_CHECK(ks_metric_collection_create(NULL, &c, NULL) == KS_OK, "create");
  MT_CHECK(ks_metric_create("CatMetric", NULL, NULL, &m, NULL) == KS_OK, "create");
  MT_CHECK(ks_metric_collection_add(c, "cat", m, NULL) == KS_OK, "add");
  MT_CHECK(ks_metric_create("MulticlassAccuracy", args, NULL, &m, NULL) == KS_OK, "create");
  MT_CHECK(ks_metric_collection_add(c, "acc", m, NULL) == KS_OK, "add");
  MT_CHECK(ks_metric_create("MeanMetric", NULL, NULL, &m, NULL) == KS_OK, "create");
  MT_CHECK(ks_metric_collection_add(c, "mean", m, NULL) == KS_OK, "add");
  for (size_t i = 0; i < ks_metric_collection_count(c); i++) {
    ks_metric *x = ks_metric_collection_at(c, i, NULL);
    MT_CHECK(golden_feed(x, ks_metric_class(x), mt_rank, NULL) == KS_OK, "feed");
  }
  return c;
}

/* Every rank must see the same status and message, and keep its own states. */
static void expect_agreed_failure(ks_status st, const ks_error *err, ks_status want, const ks_metric_collection *c,
                                  uint64_t before) {
  MT_CHECK(st == want, "status %d, want %d", st, want);
  MT_CHECK(mt_same_on_all((uint64_t)st), "ranks disagree on the status");
  MT_CHECK(mt_same_on_all(ks_checksum(err->message, strlen(err->message))), "ranks disagree on the message: %s",
           err->message);
  MT_CHECK(mt_states_hash(c) == before, "a failed sync changed the states");
}

static void test_mismatch(void) {
  if (mt_size < 2) return;
  ks_metric_collection *c = small(mt_rank == 1 ? 2 : 1);
  uint64_t before = mt_states_hash(c);
  ks_error err;
  ks_dist_cache *cache = NULL;
  ks_status st = ks_dist_sync(c, MPI_COMM_WORLD, NULL, &cache, &err);
  expect_agreed_failure(st, &err, KS_E_MISMATCH, c, before);
  MT_CHECK(cache == NULL, "a failed sync returned a cache");
  MT_CHECK(strstr(err.message, "rank 1") != NULL, "message does not name the rank: %s", err.message);
  ks_metric_collection_free(c);
}

/* Fail the Nth allocation on the last rank for every N until the sync succeeds. */
static void test_nomem_on_one_rank(void) {
  ks_metric_collection *c = small(1);
  uint64_t before = mt_states_hash(c);
  ks_status st = KS_E_NOMEM;
  long n;
  for (n = 1; st && n < 100000; n++) {
    ks_test_alloc ta;
    ks_test_alloc_init(&ta, n);
    ks_error err;
    ks_dist_cache *cache = NULL;
    st = ks_dist_sync(c, MPI_COMM_WORLD, mt_rank == mt_size - 1 ? &ta.a : NULL, &cache, &err);
    if (st) {
      expect_agreed_failure(st, &err, KS_E_NOMEM, c, before);
      MT_CHECK(ta.live == 0, "%ld blocks leaked after failing allocation %ld", ta.live, n);
    } else {
      ta.fail_at = 0;
      MT_OK(ks_dist_unsync(c, cache, &err), &err);
      ks_dist_cache_free(cache);
      MT_CHECK(ta.live == 0, "%ld blocks leaked", ta.live);
    }
  }
  MT_CHECK(st == KS_OK, "sync never succeeded");
  MT_CHECK(mt_states_hash(c) == before, "sync + unsync changed the states");
  ks_metric_collection_free(c);
}

int main(int argc, char **argv) {
  mt_init(&argc, &argv);
  test_catalogue_sync();
  test_mismatch();
  test_nomem_on_one_rank();
  if (mt_rank == 0) printf("test_mpi_sync: %d ranks ok\n", mt_size);
  MPI_Finalize();
  return 0;
}
