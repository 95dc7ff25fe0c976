#include "kestrel/kernels/int8_isa.h"

#include <cstdlib>
#include <cstring>

namespace kestrel::kernels {
namespace {

[[maybe_unused]] bool turned_off(const char* variable) {
  const char* v = std::getenv(variable);
  // Set to anything but empty or exactly "0" (docs/quantization.md): "00" or "0x" turn it off too.
  return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
}

}  // namespace

bool int8_isa_available(Int8Isa isa) {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                           __builtin_cpu_supports("f16c") && !turned_off("KESTREL_NO_AVX2");
  static const bool vnni = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") &&
                           __builtin_cpu_supports("f16c") && !turned_off("KESTREL_NO_VNNI");
#else
  static const bool avx2 = false, vnni = false;
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
