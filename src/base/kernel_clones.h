// HC_KERNEL_CLONES: one copy of a kernel per instruction set, picked at load time (GCC's
// target_clones, an ifunc), with everything it calls inlined into each copy (flatten). The
// loops are written for auto-vectorization; x86-64-v3 (AVX2, F16C) and v4 (AVX-512) run them on
// wider registers (perf/results/2026-12-02.md, 2026-12-06-zen2.md). Their bits must not depend
// on the copy: compile such files with -ffp-contract=off (v3 and v4 have FMA).
// Not under ThreadSanitizer: the clones' ifunc resolvers run before its runtime is up.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define HC_KERNEL_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"), flatten))
#else
#define HC_KERNEL_CLONES
#endif
