/*
 * The MPI loader over any sharded directory (run by tests/distributed/cross_layout.py, which checks
 * the result against a torch.distributed save's per-rank items):
 *
 *   mpirun -np M dist_load_dump DIR OUT
 *
 * Each rank loads DIR with ks_dist_load (verified, at this world size: its own per-rank entries, or
 * the fold of the saved ranks ks_shard_assigned gives it) and writes what it got to
 * OUT/rank<r>.keepsake with ks_save.
 */
#include <stdio.h>

#include "keepsake/dist.h"
#include "mpitest.h"

int main(int argc, char **argv) {
  mt_init(&argc, &argv);
  MT_CHECK(argc == 3, "usage: dist_load_dump DIR OUT");
  ks_statedict *sd = NULL;
  ks_meta *meta = NULL;
  ks_error err;
  ks_error_clear(&err);
  MT_OK(ks_dist_load(MPI_COMM_WORLD, argv[1], NULL, NULL, &sd, &meta, &err), &err);
  char path[4096];
  MT_CHECK(snprintf(path, sizeof path, "%s/rank%d.keepsake", argv[2], mt_rank) < (int)sizeof path, "path too long");
  MT_OK(ks_save(path, sd, meta, NULL, &err), &err);
  ks_statedict_free(sd);
  ks_meta_free(meta);
  MPI_Finalize();
  return 0;
}
