#include "kestrel/kernels/int8_isa.h"

#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace kestrel::kernels {
namespace {

[[maybe_unused]] bool turned_off(const char* variable) {
  const char* v = std::getenv(variable);
  // Set to anything but empty or exactly "0" (docs/quantization.md): "00" or "0x" turn it off too.
  return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
}

// AMX-TILE and AMX-INT8 (CPUID leaf 7: EDX bits 24 and 25), the tile configuration and data
// state enabled by the OS (XCR0 bits 17 and 18), and Linux's per-process permission for the tile
// data (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA, Linux 5.16+; Documentation/
// arch/x86/xstate.rst): without it the first tile instruction faults.
[[maybe_unused]] bool amx_granted() {
#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return false;
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  if ((edx & (1u << 24)) == 0 || (edx & (1u << 25)) == 0) return false;
  __cpuid(1, eax, ebx, ecx, edx);
  if ((ecx & (1u << 27)) == 0) return false;  // OSXSAVE: xgetbv may run
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & (3u << 17)) != (3u << 17)) return false;
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

}  // namespace

bool int8_isa_available(Int8Isa isa) {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                           __builtin_cpu_supports("f16c") && !turned_off("KESTREL_NO_AVX2");
  static const bool vnni = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") &&
                           __builtin_cpu_supports("f16c") && !turned_off("KESTREL_NO_VNNI");
  static const bool amx = vnni && !turned_off("KESTREL_NO_AMX") && amx_granted();
#else
  static const bool avx2 = false, vnni = false, amx = false;
#endif
  switch (isa) {
    case Int8Isa::kPortable: return true;
    case Int8Isa::kAvx2: return avx2;
    case Int8Isa::kAvx512Vnni: return vnni;
    case Int8Isa::kAmx: return amx;
  }
  return false;
}

Int8Isa best_int8_isa() {
  if (int8_isa_available(Int8Isa::kAmx)) return Int8Isa::kAmx;
  if (int8_isa_available(Int8Isa::kAvx512Vnni)) return Int8Isa::kAvx512Vnni;
  if (int8_isa_available(Int8Isa::kAvx2)) return Int8Isa::kAvx2;
  return Int8Isa::kPortable;
}

bool int8_simd_available() { return best_int8_isa() != Int8Isa::kPortable; }

std::vector<Int8Isa> int8_isas_available() {
  std::vector<Int8Isa> isas;
  for (Int8Isa isa : {Int8Isa::kPortable, Int8Isa::kAvx2, Int8Isa::kAvx512Vnni, Int8Isa::kAmx}) {
    if (int8_isa_available(isa)) isas.push_back(isa);
  }
  return isas;
}

const char* int8_isa_name(Int8Isa isa) {
  switch (isa) {
    case Int8Isa::kPortable: return "portable";
    case Int8Isa::kAvx2: return "avx2";
    case Int8Isa::kAvx512Vnni: return "avx512vnni";
    case Int8Isa::kAmx: return "amx";
  }
  return "?";
}

}  // namespace kestrel::kernels
