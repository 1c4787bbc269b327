/*
 * Large copies on several threads: a memcpy of a few hundred MiB on one core runs at one core's
 * bandwidth, while torch's own tensor copies (the baseline a background save's snapshot is held
 * to) use every core. Used where a caller waits for a copy: the async saver's snapshot.
 */
#ifndef KS_CORE_PCOPY_H
#define KS_CORE_PCOPY_H

#include <stddef.h>

/* One piece of a copy: n bytes from src to dst (the pieces do not overlap). */
typedef struct ks__copy {
  void *dst;
  const void *src;
  size_t n;
} ks__copy;

/* Copies every piece. With more than KS__PCOPY_MIN bytes in all, the bytes are shared out among
   up to `threads` threads (the caller's included; 0: one per online CPU, at most 4); a thread that
   cannot be started leaves its share to the caller. Never fails. */
void ks__copy_parallel(const ks__copy *pieces, size_t n, size_t threads);

/* The CPUs this process may run on (its affinity mask: a program pinned to one core gets 1), at
   least 1. */
size_t ks__cpus(void);

#define KS__PCOPY_MIN ((size_t)32 << 20)

#endif
