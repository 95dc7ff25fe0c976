// The instruction sets the int8-activation kernels (gemv_w4_int8.h, gemv_q8_interleaved.h) are
// written for. Each path computes the same bits (exact integer dot products per block of 32,
// then the same float32 operations in the same order), so the choice is speed alone:
//   kPortable     plain C++, every CPU;
//   kAvx2         x86 AVX2 (+FMA, F16C): `vpmaddubsw` (u8 x s8, pairs summed to int16) and
//                 `vpmaddwd` by ones for the int32 sums, 8 rows per 256-bit register;
//   kAvx512Vnni   x86 AVX512-VNNI (+BW): `vpdpbusd`, 16 rows per 512-bit register;
//   kAmx          x86 AMX-INT8 tiles (`tdpbsud`: 8 tokens x 16 rows x 32 or 64 columns per
//                 instruction) for prefill, with AVX512-VNNI for the rest (decode rows, the
//                 float32 steps); Sapphire Rapids and later, where Linux grants the tile state.
#pragma once

#include <vector>

namespace kestrel::kernels {

enum class Int8Isa { kPortable, kAvx2, kAvx512Vnni, kAmx };

/// Whether this CPU runs `isa`'s path and the environment does not turn it off
/// (KESTREL_NO_VNNI=1 for kAvx512Vnni and kAmx, KESTREL_NO_AVX2=1 for kAvx2, KESTREL_NO_AMX=1
/// for kAmx). kAmx also needs the CPU's AMX-TILE and AMX-INT8, the OS's tile state in XCR0, and
/// Linux's permission for this process (arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA), asked once
/// here; refused: false, and the kernels take AVX512-VNNI). Read once per process.
bool int8_isa_available(Int8Isa isa);

/// The fastest available path, the one gemv_w4_int8 and gemv_q8_interleaved take.
Int8Isa best_int8_isa();

/// Whether a SIMD path (AVX2 or AVX512-VNNI) is available: the int8 kernels then beat the
/// float32 / bf16 ones, and int8 activations are the default (gemv_w4_int8.h).
bool int8_simd_available();

/// Every available path, kPortable first (for tests: each must give the same bits).
std::vector<Int8Isa> int8_isas_available();

/// Whether `isa` runs the AVX-512 code (kAvx512Vnni, and kAmx besides its tiles).
inline bool uses_avx512(Int8Isa isa) { return isa == Int8Isa::kAvx512Vnni || isa == Int8Isa::kAmx; }

/// "portable", "avx2", "avx512vnni" or "amx".
const char* int8_isa_name(Int8Isa isa);

}  // namespace kestrel::kernels
