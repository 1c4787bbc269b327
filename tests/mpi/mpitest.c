#include "mpitest.h"

int mt_rank, mt_size;

void mt_init(int *argc, char ***argv) {
  MPI_Init(argc, argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &mt_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &mt_size);
}

int mt_same_on_all(uint64_t v) {
  unsigned long long lo = v, hi = v, mine = v;
  MPI_Allreduce(&mine, &lo, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&mine, &hi, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
  return lo == hi;
}
