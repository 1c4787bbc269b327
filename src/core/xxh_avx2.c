/* The AVX2 variant of ks__xxh3 (core/xxh.h): this file is compiled with -mavx2 where the build
   dispatches (KS_XXH_DISPATCH), so xxHash's code below is its AVX2 code; elsewhere it is empty. */
#include "core/xxh.h"

#if defined(KS_XXH_DISPATCH) && defined(__AVX2__)
uint64_t ks__xxh3_avx2(const void *p, size_t n) { return XXH3_64bits(p, n); }
void ks__xxh3_update_avx2(ks__xxh3_state *s, const void *p, size_t n) { (void)XXH3_64bits_update(s, p, n); }
#else
typedef int ks__xxh_avx2_unused; /* ISO C: a translation unit declares something */
#endif
