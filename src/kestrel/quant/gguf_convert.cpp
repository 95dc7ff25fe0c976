#include "kestrel/quant/gguf_convert.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <string>

#include "kestrel/base/error.h"
#include "kestrel/formats/dequant.h"

namespace kestrel::quant {
namespace {

using gguf::TensorType;

constexpr size_t kGroup = 32;

uint16_t load_u16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

void check_size(TensorType type, std::span<const std::byte> data, size_t rows, size_t cols) {
  if (cols % gguf::block_elements(type) != 0 || data.size() != rows * gguf::row_bytes(type, cols)) {
    throw Error(std::string("a ") + gguf::tensor_type_name(type) + " tensor of " + std::to_string(rows) +
                " rows of " + std::to_string(cols) + " cannot be " + std::to_string(data.size()) + " bytes");
  }
}

// fp16 of a float32 group parameter; throws where it does not fit (fp16's largest is 65504).
uint16_t checked_fp16(float v) {
  const uint16_t h = gguf::fp32_to_fp16(v);
  if ((h & 0x7C00) == 0x7C00) throw Error("a Q4_K group parameter (" + std::to_string(v) + ") overflows fp16");
  return h;
}

// One Q4_0 / Q4_1 block (32 weights) is one group: the codes are in the kW4 nibble order already.
void convert_q4_legacy(TensorType type, const uint8_t* block, uint8_t* qs, uint16_t* scale, uint16_t* min) {
  *scale = load_u16(block);
  if (type == TensorType::kQ4_1) *min = load_u16(block + 2);
  std::memcpy(qs, block + (type == TensorType::kQ4_1 ? 4 : 2), kGroup / 2);
}

// One Q4_K super-block (256 weights: d, dmin, 12 scale bytes, 128 code bytes) into 8 groups.
// Its codes come in chunks of 64 weights: byte l of chunk c holds weight l of sub-block 2c in its
// low nibble and weight l of sub-block 2c + 1 in its high one; a kW4 group holds its weight j in
// the low nibble of byte j and weight j + 16 in the high nibble.
void convert_q4_k(const uint8_t* block, uint8_t* qs, uint16_t* scales, uint16_t* mins) {
  const float d = gguf::fp16_to_fp32(load_u16(block));
  const float dmin = gguf::fp16_to_fp32(load_u16(block + 2));
  const uint8_t* packed = block + 4;
  const uint8_t* codes = block + 16;
  for (size_t s = 0; s < 8; ++s) {
    int sc = 0, m = 0;
    gguf::k_quant_scale_min(packed, s, &sc, &m);
    scales[s] = checked_fp16(d * static_cast<float>(sc));
    mins[s] = checked_fp16(-(dmin * static_cast<float>(m)));
    const uint8_t* chunk = codes + (s / 2) * 32;
    const unsigned shift = (s % 2) * 4;
    for (size_t j = 0; j < kGroup / 2; ++j) {
      const unsigned lo = (chunk[j] >> shift) & 0x0F, hi = (chunk[j + kGroup / 2] >> shift) & 0x0F;
      qs[s * kGroup / 2 + j] = static_cast<uint8_t>(lo | hi << 4);
    }
  }
}

}  // namespace

void quantize_q8_0(const float* x, size_t n, std::byte* out) {
  for (size_t b = 0; b < n / kGroup; ++b) {
    const float* v = x + b * kGroup;
    float amax = 0.0f;
    for (size_t i = 0; i < kGroup; ++i) amax = std::max(amax, std::fabs(v[i]));
    const float d = amax / 127.0f;
    const float inv = d > 0.0f ? 1.0f / d : 0.0f;
    const uint16_t d16 = gguf::fp32_to_fp16(d);
    std::byte* block = out + b * 34;
    std::memcpy(block, &d16, 2);
    for (size_t i = 0; i < kGroup; ++i) {
      block[2 + i] = static_cast<std::byte>(static_cast<int8_t>(std::lround(v[i] * inv)));
    }
  }
}

KernelForm kernel_form(TensorType type) {
  if (!gguf::is_supported(type)) {
    throw Error(std::string("tensor type ") + gguf::tensor_type_name(type) + " cannot be read by Kestrel yet");
  }
  switch (type) {
    case TensorType::kQ8_0:
    case TensorType::kBF16:
    case TensorType::kF16:
    case TensorType::kF32: return KernelForm::kInPlace;
    case TensorType::kQ4_0:
    case TensorType::kQ4_1:
    case TensorType::kQ4_K: return KernelForm::kInt4;
    default: return KernelForm::kQ8_0;
  }
}

W4Matrix w4_from_gguf(TensorType type, std::span<const std::byte> data, size_t rows, size_t cols,
                      ThreadPool& pool) {
  if (type != TensorType::kQ4_0 && type != TensorType::kQ4_1 && type != TensorType::kQ4_K) {
    throw Error(std::string("w4_from_gguf: ") + gguf::tensor_type_name(type) + " has no exact INT4 form");
  }
  check_size(type, data, rows, cols);
  W4Matrix q;
  q.rows = rows;
  q.cols = cols;
  q.group_size = kGroup;
  const size_t n_groups = rows * cols / kGroup;
  q.qs.resize(rows * cols / 2);
  q.scales.resize(n_groups);
  if (type != TensorType::kQ4_0) q.mins.resize(n_groups);
  const size_t block = gguf::block_elements(type), block_bytes = gguf::block_bytes(type);
  const size_t n_blocks = rows * cols / block, groups_per_block = block / kGroup;
  const auto* src = reinterpret_cast<const uint8_t*>(data.data());
  // Overflow is found inside the loop, on a pool thread; the first message is rethrown here.
  std::string overflow;
  std::mutex overflow_mutex;
  pool.parallel_for(n_blocks, 256, [&](size_t begin, size_t end) {
    try {
      for (size_t b = begin; b < end; ++b) {
        const size_t g = b * groups_per_block;
        uint8_t* qs = q.qs.data() + g * kGroup / 2;
        uint16_t* mins = q.mins.empty() ? nullptr : &q.mins[g];
        if (type == TensorType::kQ4_K) {
          convert_q4_k(src + b * block_bytes, qs, &q.scales[g], mins);
        } else {
          convert_q4_legacy(type, src + b * block_bytes, qs, &q.scales[g], mins);
        }
      }
    } catch (const Error& e) {
      std::lock_guard lock(overflow_mutex);
      if (overflow.empty()) overflow = e.what();
    }
  });
  if (!overflow.empty()) throw Error(overflow);
  return q;
}

std::vector<std::byte> q8_0_from_gguf(TensorType type, std::span<const std::byte> data, size_t rows,
                                      size_t cols, ThreadPool& pool) {
  if (cols % kGroup != 0) {
    throw Error("a tensor with rows of " + std::to_string(cols) + " cannot be stored as Q8_0 (not a multiple of 32)");
  }
  check_size(type, data, rows, cols);
  const size_t src_row = gguf::row_bytes(type, cols), dst_row = cols / kGroup * 34;
  std::vector<std::byte> out(rows * dst_row);
  pool.parallel_for(rows, 16, [&](size_t begin, size_t end) {
    std::vector<float> row(cols);
    for (size_t r = begin; r < end; ++r) {
      gguf::dequantize(type, data.data() + r * src_row, row.data(), cols);
      quantize_q8_0(row.data(), cols, out.data() + r * dst_row);
    }
  });
  return out;
}

}  // namespace kestrel::quant
