#include "kestrel/kernels/int8_isa.h"

#include "kestrel/kernels/kernel_options.h"

#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace kestrel::kernels {
namespace {

// CPUID leaf 7 EDX bit `bit` (AMX-BF16 22, AMX-TILE 24).
[[maybe_unused]] bool cpuid7_edx(unsigned bit) {
#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return false;
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  return (edx & (1u << bit)) != 0;
#else
  (void)bit;
  return false;
#endif
}

}  // namespace

bool amx_tiles_granted() {
  static const bool granted = [] {
#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__)
    if (!cpuid7_edx(24)) return false;
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    __cpuid(1, eax, ebx, ecx, edx);
    if ((ecx & (1u << 27)) == 0) return false;  // OSXSAVE: xgetbv may run
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) return false;  // XTILECFG and XTILEDATA enabled by the OS
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
    return false;
#endif
  }();
  return granted;
}

bool amx_bf16_cpu() { return cpuid7_edx(22); }

bool int8_isa_available(Int8Isa isa) {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool cpu_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                               __builtin_cpu_supports("f16c");
  static const bool cpu_vnni = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") &&
                               __builtin_cpu_supports("f16c");
  const bool avx2 = cpu_avx2 && kernel_options().avx2, vnni = cpu_vnni && kernel_options().avx512_vnni;
#else
  const bool avx2 = false, vnni = false;
#endif
  switch (isa) {
    case Int8Isa::kPortable: return true;
    case Int8Isa::kAvx2: return avx2;
    case Int8Isa::kAvx512Vnni: return vnni;
  }
  return false;
}

Int8Isa best_int8_isa() {
  if (int8_isa_available(Int8Isa::kAvx512Vnni)) return Int8Isa::kAvx512Vnni;
  if (int8_isa_available(Int8Isa::kAvx2)) return Int8Isa::kAvx2;
  return Int8Isa::kPortable;
}

bool int8_simd_available() { return best_int8_isa() != Int8Isa::kPortable; }

std::vector<Int8Isa> int8_isas_available() {
  std::vector<Int8Isa> isas;
  for (Int8Isa isa : {Int8Isa::kPortable, Int8Isa::kAvx2, Int8Isa::kAvx512Vnni}) {
    if (int8_isa_available(isa)) isas.push_back(isa);
  }
  return isas;
}

const char* int8_isa_name(Int8Isa isa) {
  switch (isa) {
    case Int8Isa::kPortable: return "portable";
    case Int8Isa::kAvx2: return "avx2";
    case Int8Isa::kAvx512Vnni: return "avx512vnni";
  }
  return "?";
}

}  // namespace kestrel::kernels
