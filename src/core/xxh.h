/*
 * XXH3-64 with the widest vector unit the CPU has. xxHash picks its vector code when it is
 * compiled, and a build for the x86-64 baseline gets SSE2, which hashes at a third to a quarter
 * of what AVX2 and AVX-512 do on the same core: every checksum a save writes or a load checks
 * runs through here. On x86-64 with GCC or Clang the AVX2 and AVX-512 variants are compiled
 * apart (xxh_avx2.c, xxh_avx512.c, with -mavx2 / -mavx512f) and chosen per call from what the
 * CPU and the kernel support (__builtin_cpu_supports: a load and a test); elsewhere this is
 * xxHash as compiled. Every variant gives the same values (the algorithm, not the code, defines
 * them), and a streaming state may pass between them. Not installed.
 */
#ifndef KS_CORE_XXH_H
#define KS_CORE_XXH_H

#include <stddef.h>
#include <stdint.h>

#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack: no allocation outside the hook */
#include <xxhash.h>

typedef XXH3_state_t ks__xxh3_state;

/* XXH3-64 (seed 0) of n bytes at p (p may be NULL when n is 0). */
uint64_t ks__xxh3(const void *p, size_t n);
/* Streaming: reset, update with the bytes in order, digest; the same value as ks__xxh3 of them all. */
void ks__xxh3_reset(ks__xxh3_state *s);
void ks__xxh3_update(ks__xxh3_state *s, const void *p, size_t n);
uint64_t ks__xxh3_digest(const ks__xxh3_state *s);

/* The variants (only in builds that compile them: KS_XXH_DISPATCH). */
uint64_t ks__xxh3_avx2(const void *p, size_t n);
void ks__xxh3_update_avx2(ks__xxh3_state *s, const void *p, size_t n);
uint64_t ks__xxh3_avx512(const void *p, size_t n);
void ks__xxh3_update_avx512(ks__xxh3_state *s, const void *p, size_t n);

#endif
