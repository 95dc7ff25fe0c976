#include "kestrel/quant/compressed_tensors.h"

#include <string>

#include "kestrel/base/error.h"

namespace kestrel::quant::ct {
namespace {

void check_layout(size_t rows, size_t cols, size_t group_size, size_t q4_bytes, size_t words) {
  if (group_size == 0 || group_size % 2 != 0 || cols % group_size != 0 || cols % 8 != 0) {
    throw Error("compressed-tensors packing: group size " + std::to_string(group_size) +
                " must be even and divide the row length " + std::to_string(cols) + " (a multiple of 8)");
  }
  if (q4_bytes != rows * cols / 2 || words != rows * cols / 8) {
    throw Error("compressed-tensors packing: " + std::to_string(q4_bytes) + " code bytes and " +
                std::to_string(words) + " words for a [" + std::to_string(rows) + ", " + std::to_string(cols) +
                "] matrix");
  }
}

// Kestrel's code of column c within its row's bytes.
inline uint32_t code_at(const uint8_t* row, size_t c, size_t group_size) {
  const size_t g = c / group_size, i = c % group_size, half = group_size / 2;
  const uint8_t byte = row[g * half + (i < half ? i : i - half)];
  return i < half ? byte & 0xFu : byte >> 4;
}

}  // namespace

std::vector<int32_t> pack_weight(std::span<const uint8_t> q4, size_t rows, size_t cols, size_t group_size) {
  check_layout(rows, cols, group_size, q4.size(), rows * cols / 8);
  std::vector<int32_t> out(rows * cols / 8);
  for (size_t r = 0; r < rows; ++r) {
    const uint8_t* row = q4.data() + r * cols / 2;
    for (size_t w = 0; w < cols / 8; ++w) {
      uint32_t word = 0;
      for (size_t k = 0; k < 8; ++k) word |= code_at(row, w * 8 + k, group_size) << (4 * k);
      out[r * cols / 8 + w] = static_cast<int32_t>(word);
    }
  }
  return out;
}

std::vector<uint8_t> unpack_weight(std::span<const int32_t> packed, size_t rows, size_t cols, size_t group_size) {
  check_layout(rows, cols, group_size, rows * cols / 2, packed.size());
  std::vector<uint8_t> out(rows * cols / 2, 0);
  const size_t half = group_size / 2;
  for (size_t r = 0; r < rows; ++r) {
    uint8_t* row = out.data() + r * cols / 2;
    for (size_t c = 0; c < cols; ++c) {
      const auto word = static_cast<uint32_t>(packed[r * cols / 8 + c / 8]);
      const auto code = static_cast<uint8_t>((word >> (4 * (c % 8))) & 0xFu);
      const size_t g = c / group_size, i = c % group_size;
      uint8_t& byte = row[g * half + (i < half ? i : i - half)];
      byte = static_cast<uint8_t>(i < half ? (byte & 0xF0u) | code : (byte & 0x0Fu) | (code << 4));
    }
  }
  return out;
}

std::vector<int32_t> pack_zero_points(std::span<const uint8_t> z, size_t rows, size_t n_groups) {
  if (z.size() != rows * n_groups) {
    throw Error("compressed-tensors packing: " + std::to_string(z.size()) + " zero points for " +
                std::to_string(rows) + " rows of " + std::to_string(n_groups) + " groups");
  }
  const size_t row_words = (rows + 7) / 8;
  std::vector<int32_t> out(row_words * n_groups, 0);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t g = 0; g < n_groups; ++g) {
      const uint8_t v = z[r * n_groups + g];
      if (v > 15) throw Error("compressed-tensors packing: zero point " + std::to_string(v) + " is not 0..15");
      auto& word = out[(r / 8) * n_groups + g];
      word = static_cast<int32_t>(static_cast<uint32_t>(word) | (uint32_t{v} << (4 * (r % 8))));
    }
  }
  return out;
}

std::vector<uint8_t> unpack_zero_points(std::span<const int32_t> packed, size_t rows, size_t n_groups) {
  const size_t row_words = (rows + 7) / 8;
  if (packed.size() != row_words * n_groups) {
    throw Error("compressed-tensors unpacking: " + std::to_string(packed.size()) + " zero-point words for " +
                std::to_string(rows) + " rows of " + std::to_string(n_groups) + " groups (expected " +
                std::to_string(row_words * n_groups) + ")");
  }
  std::vector<uint8_t> out(rows * n_groups);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t g = 0; g < n_groups; ++g) {
      const auto word = static_cast<uint32_t>(packed[(r / 8) * n_groups + g]);
      out[r * n_groups + g] = static_cast<uint8_t>((word >> (4 * (r % 8))) & 0xFu);
    }
  }
  return out;
}

}  // namespace kestrel::quant::ct
