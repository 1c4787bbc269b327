/* Shared by the benchmarks: a monotonic clock, a memory-bandwidth baseline and table output. */
#ifndef KS_BENCHUTIL_H
#define KS_BENCHUTIL_H

#include <stddef.h>

#include "keepsake/io.h"

/* Seconds from a monotonic clock. */
double ks_bench_now(void);
/* CPU seconds (user + system) this process has used: steadier than wall time on a loaded machine. */
double ks_bench_cpu_now(void);
/* GiB/s for `bytes` moved in `seconds`. */
double ks_bench_gibps(double bytes, double seconds);
/*
 * Measures read bandwidth: sums `bytes` of a buffer (best of `reps`), in GiB/s.
 * This is the "read the inputs once" baseline the metric benchmarks compare to.
 */
double ks_bench_read_bandwidth(size_t bytes, int reps);
/* memcpy bandwidth over `bytes` (best of `reps`), in GiB/s. */
double ks_bench_memcpy_bandwidth(size_t bytes, int reps);
/* The POSIX I/O table with no-op fsyncs: measures a save's CPU work without the disk's flush. */
const ks_io *ks_bench_io_nosync(void);
/* Keeps the optimiser from dropping a computed value. */
void ks_bench_sink(double v);

#endif
