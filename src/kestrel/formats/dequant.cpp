// Dequantization of ggml block formats. Layouts follow ggml-common.h; the arithmetic follows
// ggml-quants.c (dequantize_row_*) operation for operation, so that results match ggml and
// gguf-py bit for bit. Products and differences are kept in separate statements so that no
// compiler contracts them into a fused multiply-add (which would change the rounding).
#include "kestrel/formats/dequant.h"

#include <bit>
#include <cstring>
#include <string>

namespace kestrel::gguf {
namespace {

constexpr size_t kQk = 32;    // elements per block of the legacy quants (Q4_0 ... Q8_1)
constexpr size_t kQkK = 256;  // elements per super-block of the K-quants

struct Layout {
  size_t elements;
  size_t bytes;
};

// Block layouts of every type in TensorType; nullopt-like {0, 0} for values outside the enum.
Layout layout_of(TensorType type) {
  switch (type) {
    case TensorType::kF32: return {1, 4};
    case TensorType::kF16: return {1, 2};
    case TensorType::kBF16: return {1, 2};
    case TensorType::kF64: return {1, 8};
    case TensorType::kI8: return {1, 1};
    case TensorType::kI16: return {1, 2};
    case TensorType::kI32: return {1, 4};
    case TensorType::kI64: return {1, 8};
    case TensorType::kQ4_0: return {kQk, 2 + kQk / 2};
    case TensorType::kQ4_1: return {kQk, 4 + kQk / 2};
    case TensorType::kQ5_0: return {kQk, 2 + 4 + kQk / 2};
    case TensorType::kQ5_1: return {kQk, 4 + 4 + kQk / 2};
    case TensorType::kQ8_0: return {kQk, 2 + kQk};
    case TensorType::kQ8_1: return {kQk, 4 + kQk};
    case TensorType::kQ2_K: return {kQkK, kQkK / 16 + kQkK / 4 + 4};
    case TensorType::kQ3_K: return {kQkK, kQkK / 8 + kQkK / 4 + 12 + 2};
    case TensorType::kQ4_K: return {kQkK, 4 + 12 + kQkK / 2};
    case TensorType::kQ5_K: return {kQkK, 4 + 12 + kQkK / 8 + kQkK / 2};
    case TensorType::kQ6_K: return {kQkK, kQkK / 2 + kQkK / 4 + kQkK / 16 + 2};
    case TensorType::kQ8_K: return {kQkK, 4 + kQkK + kQkK / 16 * 2};
  }
  return {0, 0};
}

Layout checked_layout(TensorType type) {
  Layout layout = layout_of(type);
  if (layout.elements == 0) {
    throw GgufError(GgufErrorKind::kUnknownTensorType,
                    "unknown tensor type id " + std::to_string(static_cast<uint32_t>(type)));
  }
  return layout;
}

uint16_t load_u16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

uint32_t load_u32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

float load_f16(const uint8_t* p) { return fp16_to_fp32(load_u16(p)); }

// y = d * q, with q a small integer.
inline float scaled(float d, int q) { return d * static_cast<float>(q); }

// y = d * q - m, rounded after each operation.
inline float scaled_minus(float d, int q, float m) {
  const float product = d * static_cast<float>(q);
  return product - m;
}

// y = d * q + m, rounded after each operation.
inline float scaled_plus(float d, int q, float m) {
  const float product = d * static_cast<float>(q);
  return product + m;
}

void dequant_q4_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const uint8_t* qs = b + 2;
  for (size_t j = 0; j < kQk / 2; ++j) {
    y[j] = scaled(d, (qs[j] & 0x0F) - 8);
    y[j + kQk / 2] = scaled(d, (qs[j] >> 4) - 8);
  }
}

void dequant_q4_1(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const float m = load_f16(b + 2);
  const uint8_t* qs = b + 4;
  for (size_t j = 0; j < kQk / 2; ++j) {
    y[j] = scaled_plus(d, qs[j] & 0x0F, m);
    y[j + kQk / 2] = scaled_plus(d, qs[j] >> 4, m);
  }
}

// The 5-bit values of Q5_0/Q5_1: low nibbles in qs, fifth bits in the 32-bit mask qh.
inline int q5_low(const uint8_t* qs, uint32_t qh, size_t j) {
  return (qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1u) << 4);
}
inline int q5_high(const uint8_t* qs, uint32_t qh, size_t j) {
  return (qs[j] >> 4) | static_cast<int>(((qh >> (j + kQk / 2)) & 1u) << 4);
}

void dequant_q5_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const uint32_t qh = load_u32(b + 2);
  const uint8_t* qs = b + 6;
  for (size_t j = 0; j < kQk / 2; ++j) {
    y[j] = scaled(d, q5_low(qs, qh, j) - 16);
    y[j + kQk / 2] = scaled(d, q5_high(qs, qh, j) - 16);
  }
}

void dequant_q5_1(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const float m = load_f16(b + 2);
  const uint32_t qh = load_u32(b + 4);
  const uint8_t* qs = b + 8;
  for (size_t j = 0; j < kQk / 2; ++j) {
    y[j] = scaled_plus(d, q5_low(qs, qh, j), m);
    y[j + kQk / 2] = scaled_plus(d, q5_high(qs, qh, j), m);
  }
}

void dequant_q8_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  for (size_t j = 0; j < kQk; ++j) y[j] = scaled(d, static_cast<int8_t>(b[2 + j]));
}

// Q2_K: scales[16] (4-bit scale | 4-bit min), qs[64] (2-bit values), d, dmin.
void dequant_q2_k(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* q = b + 16;
  const float d = load_f16(b + 80);
  const float dmin = load_f16(b + 82);
  size_t is = 0;
  for (size_t half = 0; half < 2; ++half, q += 32) {
    for (int shift = 0; shift < 8; shift += 2) {
      for (size_t part = 0; part < 2; ++part) {
        const uint8_t sc = scales[is++];
        const float dl = scaled(d, sc & 0x0F);
        const float ml = scaled(dmin, sc >> 4);
        for (size_t l = 0; l < 16; ++l)
          *y++ = scaled_minus(dl, (q[l + 16 * part] >> shift) & 3, ml);
      }
    }
  }
}

// The 6-bit scale k (0..15) of Q3_K: low 4 bits from bytes 0..7, high 2 bits from bytes 8..11.
int q3_k_scale(const uint8_t* scales, size_t k) {
  const int low = k < 8 ? scales[k] & 0x0F : scales[k - 8] >> 4;
  const int high = (scales[8 + k % 4] >> (2 * (k / 4))) & 3;
  return (low | (high << 4)) - 32;
}

// Q3_K: hmask[32] (third bits), qs[64] (low 2 bits), scales[12] (16 packed 6-bit scales), d.
void dequant_q3_k(const uint8_t* b, float* y) {
  const uint8_t* hmask = b;
  const uint8_t* q = b + 32;
  const uint8_t* scales = b + 96;
  const float d = load_f16(b + 108);
  size_t is = 0;
  unsigned mask = 1;
  for (size_t half = 0; half < 2; ++half, q += 32) {
    for (int shift = 0; shift < 8; shift += 2, mask <<= 1) {
      for (size_t part = 0; part < 2; ++part) {
        const float dl = scaled(d, q3_k_scale(scales, is++));
        for (size_t l = 16 * part; l < 16 * part + 16; ++l) {
          const int value = ((q[l] >> shift) & 3) - ((hmask[l] & mask) ? 0 : 4);
          *y++ = scaled(dl, value);
        }
      }
    }
  }
}

// Q4_K: d, dmin, scales[12], qs[128]; 8 sub-blocks of 32, each y = d*sc*q - dmin*m.
void dequant_q4_k(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const float dmin = load_f16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* q = b + 16;
  for (size_t is = 0; is < 8; is += 2, q += 32) {
    int sc = 0;
    int m = 0;
    k_quant_scale_min(scales, is, &sc, &m);
    const float d1 = scaled(d, sc);
    const float m1 = scaled(dmin, m);
    k_quant_scale_min(scales, is + 1, &sc, &m);
    const float d2 = scaled(d, sc);
    const float m2 = scaled(dmin, m);
    for (size_t l = 0; l < 32; ++l) *y++ = scaled_minus(d1, q[l] & 0x0F, m1);
    for (size_t l = 0; l < 32; ++l) *y++ = scaled_minus(d2, q[l] >> 4, m2);
  }
}

// Q5_K: as Q4_K plus qh[32] holding the fifth bit of each value.
void dequant_q5_k(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const float dmin = load_f16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* ql = b + 48;
  unsigned bit = 1;
  for (size_t is = 0; is < 8; is += 2, ql += 32, bit <<= 2) {
    int sc = 0;
    int m = 0;
    k_quant_scale_min(scales, is, &sc, &m);
    const float d1 = scaled(d, sc);
    const float m1 = scaled(dmin, m);
    k_quant_scale_min(scales, is + 1, &sc, &m);
    const float d2 = scaled(d, sc);
    const float m2 = scaled(dmin, m);
    for (size_t l = 0; l < 32; ++l) {
      *y++ = scaled_minus(d1, (ql[l] & 0x0F) + ((qh[l] & bit) ? 16 : 0), m1);
    }
    for (size_t l = 0; l < 32; ++l) {
      *y++ = scaled_minus(d2, (ql[l] >> 4) + ((qh[l] & (bit << 1)) ? 16 : 0), m2);
    }
  }
}

// Q6_K: ql[128] (low 4 bits), qh[64] (high 2 bits), int8 scales[16], d.
void dequant_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = load_f16(b + 208);
  for (size_t half = 0; half < 2; ++half, y += 128, ql += 64, qh += 32, sc += 8) {
    for (size_t l = 0; l < 32; ++l) {
      const size_t is = l / 16;
      const int q1 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = scaled(scaled(d, sc[is]), q1);
      y[l + 32] = scaled(scaled(d, sc[is + 2]), q2);
      y[l + 64] = scaled(scaled(d, sc[is + 4]), q3);
      y[l + 96] = scaled(scaled(d, sc[is + 6]), q4);
    }
  }
}

using BlockFn = void (*)(const uint8_t*, float*);

BlockFn block_fn(TensorType type) {
  switch (type) {
    case TensorType::kQ4_0: return dequant_q4_0;
    case TensorType::kQ4_1: return dequant_q4_1;
    case TensorType::kQ5_0: return dequant_q5_0;
    case TensorType::kQ5_1: return dequant_q5_1;
    case TensorType::kQ8_0: return dequant_q8_0;
    case TensorType::kQ2_K: return dequant_q2_k;
    case TensorType::kQ3_K: return dequant_q3_k;
    case TensorType::kQ4_K: return dequant_q4_k;
    case TensorType::kQ5_K: return dequant_q5_k;
    case TensorType::kQ6_K: return dequant_q6_k;
    default: return nullptr;
  }
}

}  // namespace

void k_quant_scale_min(const uint8_t* scales, size_t j, int* scale, int* min) {
  if (j < 4) {
    *scale = scales[j] & 63;
    *min = scales[j + 4] & 63;
  } else {
    *scale = (scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4);
    *min = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
  }
}

const char* tensor_type_name(TensorType type) {
  switch (type) {
    case TensorType::kF32: return "F32";
    case TensorType::kF16: return "F16";
    case TensorType::kQ4_0: return "Q4_0";
    case TensorType::kQ4_1: return "Q4_1";
    case TensorType::kQ5_0: return "Q5_0";
    case TensorType::kQ5_1: return "Q5_1";
    case TensorType::kQ8_0: return "Q8_0";
    case TensorType::kQ8_1: return "Q8_1";
    case TensorType::kQ2_K: return "Q2_K";
    case TensorType::kQ3_K: return "Q3_K";
    case TensorType::kQ4_K: return "Q4_K";
    case TensorType::kQ5_K: return "Q5_K";
    case TensorType::kQ6_K: return "Q6_K";
    case TensorType::kQ8_K: return "Q8_K";
    case TensorType::kI8: return "I8";
    case TensorType::kI16: return "I16";
    case TensorType::kI32: return "I32";
    case TensorType::kI64: return "I64";
    case TensorType::kF64: return "F64";
    case TensorType::kBF16: return "BF16";
  }
  return "unknown";
}

bool is_supported(TensorType type) {
  return type == TensorType::kF32 || type == TensorType::kF16 || type == TensorType::kBF16 ||
         block_fn(type) != nullptr;
}

size_t block_elements(TensorType type) { return checked_layout(type).elements; }

size_t block_bytes(TensorType type) { return checked_layout(type).bytes; }

uint64_t row_bytes(TensorType type, uint64_t n) {
  const Layout layout = checked_layout(type);
  if (n % layout.elements != 0) {
    throw GgufError(GgufErrorKind::kBadShape, std::string("row of ") + std::to_string(n) +
                                                  " elements is not a whole number of " +
                                                  tensor_type_name(type) + " blocks of " +
                                                  std::to_string(layout.elements));
  }
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(n / layout.elements, uint64_t{layout.bytes}, &bytes)) {
    throw GgufError(GgufErrorKind::kSizeOverflow,
                    "byte size of a row of " + std::to_string(n) + " elements overflows 64 bits");
  }
  return bytes;
}

void dequantize(TensorType type, const void* src, float* dst, size_t n) {
  if (!is_supported(type)) {
    throw GgufError(GgufErrorKind::kUnknownTensorType,
                    std::string("cannot dequantize tensor type ") + tensor_type_name(type) +
                        " (id " + std::to_string(static_cast<uint32_t>(type)) + ")");
  }
  const Layout layout = checked_layout(type);
  if (n % layout.elements != 0) {
    throw GgufError(GgufErrorKind::kBadShape,
                    std::to_string(n) + " elements are not a whole number of " +
                        tensor_type_name(type) + " blocks of " + std::to_string(layout.elements));
  }
  const auto* bytes = static_cast<const uint8_t*>(src);
  switch (type) {
    case TensorType::kF32: std::memcpy(dst, src, n * sizeof(float)); return;
    case TensorType::kF16:
      for (size_t i = 0; i < n; ++i) dst[i] = load_f16(bytes + 2 * i);
      return;
    case TensorType::kBF16:
      for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(load_u16(bytes + 2 * i));
      return;
    default: break;
  }
  const BlockFn fn = block_fn(type);
  for (size_t block = 0; block < n / layout.elements; ++block) {
    fn(bytes + block * layout.bytes, dst + block * layout.elements);
  }
}

float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exponent = (h >> 10) & 0x1F;
  const uint32_t mantissa = h & 0x3FF;
  if (exponent == 0x1F) {  // inf or NaN; the payload is kept
    return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13));
  }
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float32
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

uint16_t fp32_to_fp16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const auto sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const uint32_t abs = bits & 0x7FFFFFFF;
  if (abs > 0x7F800000) {  // NaN: quiet, keep the top of the payload
    return static_cast<uint16_t>(sign | 0x7E00 | ((abs >> 13) & 0x3FF));
  }
  if (abs >= 0x477FF000) return static_cast<uint16_t>(sign | 0x7C00);  // >= 65520 rounds to inf
  if (abs >= 0x38800000) {  // normal half (>= 2^-14): round the mantissa to nearest even
    const uint32_t rounded = abs + 0xFFF + ((abs >> 13) & 1);
    return static_cast<uint16_t>(sign | ((rounded >> 13) - (112u << 10)));
  }
  if (abs <= 0x33000000) return sign;  // <= 2^-25 (half the smallest subnormal): ties to zero
  // Subnormal half: value / 2^-24, rounded to nearest even.
  const uint32_t exponent = abs >> 23;
  const uint32_t mantissa = (abs & 0x7FFFFF) | 0x800000;
  const uint32_t shift = 126 - exponent;  // 14..24
  uint32_t quotient = mantissa >> shift;
  const uint32_t remainder = mantissa & ((1u << shift) - 1);
  const uint32_t halfway = 1u << (shift - 1);
  if (remainder > halfway || (remainder == halfway && (quotient & 1))) ++quotient;
  return static_cast<uint16_t>(sign | quotient);
}

float bf16_to_fp32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

uint16_t fp32_to_bf16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  if ((bits & 0x7FFFFFFF) > 0x7F800000) {  // NaN: keep sign and payload top, force quiet
    return static_cast<uint16_t>((bits >> 16) | 0x40);
  }
  // Round to nearest even; overflow carries into the exponent and correctly gives inf.
  return static_cast<uint16_t>((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
}

}  // namespace kestrel::gguf
