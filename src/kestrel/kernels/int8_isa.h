// The instruction sets the int8-activation kernels (gemv_w4_int8.h, gemv_q8_interleaved.h) are
// written for. Each path computes the same bits (exact integer dot products per block of 32,
// then the same float32 operations in the same order), so the choice is speed alone:
//   kPortable     plain C++, every CPU;
//   kAvx2         x86 AVX2 (+FMA, F16C): `vpmaddubsw` (u8 x s8, pairs summed to int16) and
//                 `vpmaddwd` by ones for the int32 sums, 8 rows per 256-bit register;
//   kAvx512Vnni   x86 AVX512-VNNI (+BW): `vpdpbusd`, 16 rows per 512-bit register.
// (AMX-INT8 tiles computing the same bits were tried on a 2-core Sapphire Rapids class Xeon and
// were no faster: each 32-column block's sums must leave the tiles for their float32 scaling,
// docs/quantization.md; prefill takes AMX-BF16 instead, gemm_w4_amx_bf16.h.)
#pragma once

#include <vector>

namespace kestrel::kernels {

enum class Int8Isa { kPortable, kAvx2, kAvx512Vnni };

/// Whether this CPU runs `isa`'s path and the kernel switches do not turn it off (no-vnni for
/// kAvx512Vnni, no-avx2 for kAvx2: kernel_options.h).
bool int8_isa_available(Int8Isa isa);

/// The fastest available path, the one gemv_w4_int8 and gemv_q8_interleaved take.
Int8Isa best_int8_isa();

/// Whether a SIMD path (AVX2 or AVX512-VNNI) is available: the int8 kernels then beat the
/// float32 / bf16 ones, and int8 activations are the default (gemv_w4_int8.h).
bool int8_simd_available();

/// Every available path, kPortable first (for tests: each must give the same bits).
std::vector<Int8Isa> int8_isas_available();

/// Whether the CPU has AMX-TILE, the OS enables the tile state (XCR0 bits 17, 18), and Linux
/// grants this process the tile data (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), Linux
/// 5.16+; Documentation/arch/x86/xstate.rst): without it the first tile instruction faults.
/// Asked once per process.
bool amx_tiles_granted();

/// Whether the CPU has AMX-BF16 (`tdpbf16ps`; CPUID, amx_tiles_granted() tells whether it may run).
bool amx_bf16_cpu();

/// "portable", "avx2" or "avx512vnni".
const char* int8_isa_name(Int8Isa isa);

}  // namespace kestrel::kernels
