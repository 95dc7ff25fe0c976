// The x86 instruction-set targets of the int8 kernels (int8_isa.h: AVX512-VNNI and AVX2 paths),
// shared by gemv_w4_int8.cpp, gemv_q8_interleaved.cpp and gemm_w8a8.cpp. Include only from kernel
// .cpp files: defines KESTREL_HAVE_VNNI where the compiler can emit them (x86-64 GCC / Clang),
// with KESTREL_VNNI_TARGET and KESTREL_AVX2_TARGET for the functions of each path (F16C with
// both: the group parameters' fp16 conversions; int8_isa_available requires it).
#pragma once

#if defined(__x86_64__) && defined(__GNUC__)
// _mm512_set1_epi32 and its kin read an undefined vector first (GCC 12 warns inside its own
// headers).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#define KESTREL_HAVE_VNNI 1
#define KESTREL_VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vnni,f16c")))
#define KESTREL_AVX2_TARGET __attribute__((target("avx2,fma,f16c")))
#endif
