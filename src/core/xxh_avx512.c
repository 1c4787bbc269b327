/* The AVX-512 variant of ks__xxh3 (core/xxh.h): compiled with -mavx512f where the build
   dispatches (KS_XXH_DISPATCH), so xxHash's code below is its AVX-512 code; elsewhere it is empty. */
#include "core/xxh.h"

#if defined(KS_XXH_DISPATCH) && defined(__AVX512F__)
uint64_t ks__xxh3_avx512(const void *p, size_t n) { return XXH3_64bits(p, n); }
void ks__xxh3_update_avx512(ks__xxh3_state *s, const void *p, size_t n) { (void)XXH3_64bits_update(s, p, n); }
#else
typedef int ks__xxh_avx512_unused; /* ISO C: a translation unit declares something */
#endif
