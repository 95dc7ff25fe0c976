// The x86 AVX512-BF16 preamble shared by the bfloat16 dot-product kernels (gemm_bf16.cpp,
// gemv_w4_bf16.cpp): include only from those .cpp files. Defines KESTREL_HAVE_BF16_DOT where
// the compiler can emit the instructions (whether the CPU runs them is bf16_dot_available()), and
// KESTREL_BF16_TARGET, the function attribute that enables them (and F16C, which every
// AVX512-BF16 CPU has).
#pragma once

#if defined(__x86_64__) && defined(__GNUC__)
// GCC 12 warns inside its own avx512fintrin.h (_mm512_reduce_add_ps) about an operand it
// deliberately leaves undefined.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#define KESTREL_HAVE_BF16_DOT 1
#define KESTREL_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,f16c")))
#endif
