/* Which saved ranks' per-rank entries a rank takes at another world size (ks_shard_assigned). */
#include "shard/shard_internal.h"

ks_status ks_shard_assigned(int saved_world, int world_size, int rank, int *lo, int *hi, int *first,
                            ks_error *err) {
  if (!lo || !hi || !first)
    return ks__err(err, KS_E_INVALID, "ks_shard_assigned: NULL argument");
  if (saved_world < 1 || saved_world > KS_SHARD_MAX_WORLD || world_size < 1 || world_size > KS_SHARD_MAX_WORLD ||
      rank < 0 || rank >= world_size)
    return ks__err(err, KS_E_INVALID, "ks_shard_assigned: rank %d of %d from %d saved ranks is out of range", rank,
                   world_size, saved_world);
  /* Saved rank s goes to floor(s*M/N): nondecreasing in s, so the ranks' blocks are contiguous. */
  int a = 0;
  while (a < saved_world && (int64_t)a * world_size / saved_world < rank) a++;
  int b = a;
  while (b < saved_world && (int64_t)b * world_size / saved_world == rank) b++;
  *lo = a;
  *hi = b;
  *first = a < b ? a : rank % saved_world;
  return KS_OK;
}
