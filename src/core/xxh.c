/* ks__xxh3: XXH3-64 through the widest vector variant the CPU runs (core/xxh.h). */
#include "core/xxh.h"

#ifdef KS_XXH_DISPATCH
/* 2: AVX-512, 1: AVX2, 0: the baseline. libgcc (compiler-rt) reads CPUID and XCR0 once when the
   program starts, so this is a load and a test, and the kernel's support for the wide registers'
   state is part of the answer. */
static int level(void) {
  if (__builtin_cpu_supports("avx512f")) return 2;
  return __builtin_cpu_supports("avx2") ? 1 : 0;
}
#endif

uint64_t ks__xxh3(const void *p, size_t n) {
  if (!n) return XXH3_64bits("", 0);
#ifdef KS_XXH_DISPATCH
  if (n >= 256) { /* below, XXH3 is scalar code: the variants would all run the same */
    int l = level();
    if (l == 2) return ks__xxh3_avx512(p, n);
    if (l == 1) return ks__xxh3_avx2(p, n);
  }
#endif
  return XXH3_64bits(p, n);
}

void ks__xxh3_reset(ks__xxh3_state *s) { (void)XXH3_64bits_reset(s); /* cannot fail on a state */ }

void ks__xxh3_update(ks__xxh3_state *s, const void *p, size_t n) {
  if (!n) return;
#ifdef KS_XXH_DISPATCH
  int l = level();
  if (l == 2) {
    ks__xxh3_update_avx512(s, p, n);
    return;
  }
  if (l == 1) {
    ks__xxh3_update_avx2(s, p, n);
    return;
  }
#endif
  (void)XXH3_64bits_update(s, p, n); /* cannot fail: p is not NULL */
}

uint64_t ks__xxh3_digest(const ks__xxh3_state *s) { return XXH3_64bits_digest(s); }
