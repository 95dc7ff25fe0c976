// The instruction sets the int8-activation kernels (gemv_w4_int8.h, gemv_q8_interleaved.h) are
// written for. Each path computes the same bits (exact integer dot products per block of 32,
// then the same float32 operations in the same order), so the choice is speed alone:
//   kPortable     plain C++, every CPU;
//   kAvx2         x86 AVX2 (+FMA, F16C): `vpmaddubsw` (u8 x s8, pairs summed to int16) and
//                 `vpmaddwd` by ones for the int32 sums, 8 rows per 256-bit register;
//   kAvx512Vnni   x86 AVX512-VNNI (+BW): `vpdpbusd`, 16 rows per 512-bit register.
#pragma once

#include <vector>

namespace kestrel::kernels {

enum class Int8Isa { kPortable, kAvx2, kAvx512Vnni };

/// Whether this CPU runs `isa`'s path and the environment does not turn it off
/// (KESTREL_NO_VNNI=1 for kAvx512Vnni, KESTREL_NO_AVX2=1 for kAvx2). Read once per process.
bool int8_isa_available(Int8Isa isa);

/// The fastest available path, the one gemv_w4_int8 and gemv_q8_interleaved take.
Int8Isa best_int8_isa();

/// Whether a SIMD path (AVX2 or AVX512-VNNI) is available: the int8 kernels then beat the
/// float32 / bf16 ones, and int8 activations are the default (gemv_w4_int8.h).
bool int8_simd_available();

/// Every available path, kPortable first (for tests: each must give the same bits).
std::vector<Int8Isa> int8_isas_available();

/// "portable", "avx2" or "avx512vnni".
const char* int8_isa_name(Int8Isa isa);

}  // namespace kestrel::kernels
