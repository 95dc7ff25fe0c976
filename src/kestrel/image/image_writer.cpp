#include "kestrel/image/image_writer.h"

#include <algorithm>
#include <ctime>
#include <fstream>
#include <sstream>

#include "kestrel/base/error.h"
#include "kestrel/formats/dequant.h"
#include "kestrel/kernels/gemv_w4_int8.h"

namespace kestrel::image {
namespace {

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read licence file " + path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A licence file goes into a GGUF string, which must be UTF-8.
bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (len == 0 || i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 0x2) return false;
    }
    i += len;
  }
  return true;
}

bool looks_like_license(const std::string& name) {
  for (const char* prefix : {"LICENSE", "LICENCE", "NOTICE", "COPYING"}) {
    if (name.rfind(prefix, 0) == 0) return true;
  }
  return name.find("TERMS") != std::string::npos;
}

}  // namespace

std::span<const std::byte> as_bytes(const void* data, size_t n) {
  return {static_cast<const std::byte*>(data), n};
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return buf;
}

std::string license_text(const std::filesystem::path& source, const std::vector<std::filesystem::path>& extra) {
  std::vector<std::filesystem::path> files = extra;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(source.parent_path(), ec)) {
    if (entry.is_regular_file() && looks_like_license(entry.path().filename().string())) {
      files.push_back(entry.path());
    }
  }
  std::string text;
  for (const auto& f : files) {
    const std::string body = read_text(f);
    if (!valid_utf8(body)) throw Error("licence file " + f.string() + " is not UTF-8 text");
    text += "==> " + f.filename().string() + " <==\n" + body + "\n";
  }
  return text;
}

void add_source_metadata(gguf::Writer& w, const gguf::File& src) {
  for (const auto& [key, value] : src.metadata()) {
    if (key == "general.alignment" || key.rfind("kestrel.", 0) == 0) continue;
    w.add(key, value);
  }
}

void write_int8_layout(gguf::Writer& w, const quant::W4Matrix& q, ThreadPool& pool) {
  const kernels::W4Int8Interleaved il = kernels::interleave_w4_int8_layout(q.view(), &pool);
  w.write(as_bytes(il.codes.data(), il.codes.size()));
  if (!il.params8()) {
    w.write(as_bytes(il.scales.data(), il.scales.size() * sizeof(uint16_t)));
    w.write(as_bytes(il.mins.data(), il.mins.size() * sizeof(uint16_t)));
    return;
  }
  w.write(as_bytes(il.scales8.data(), il.scales8.size()));
  w.write(as_bytes(il.mins8.data(), il.mins8.size()));
  w.write(as_bytes(il.row_d.data(), il.row_d.size() * sizeof(float)));
  w.write(as_bytes(il.row_m.data(), il.row_m.size() * sizeof(float)));
}

void write_converted(gguf::Writer& w, const gguf::TensorInfo& t, std::span<const std::byte> bytes,
                     gguf::TensorType type) {
  const uint64_t row = t.shape[0];
  const uint64_t src_row_bytes = gguf::row_bytes(t.type, row);
  const uint64_t rows_per_step = std::max<uint64_t>(1, (1u << 20) / row);
  std::vector<float> f32(rows_per_step * row);
  std::vector<uint16_t> b16(rows_per_step * row);
  for (uint64_t r = 0; r < t.rows(); r += rows_per_step) {
    const uint64_t n_rows = std::min(rows_per_step, t.rows() - r);
    const size_t n = static_cast<size_t>(n_rows * row);
    gguf::dequantize(t.type, bytes.data() + r * src_row_bytes, f32.data(), n);
    if (type == gguf::TensorType::kF32) {
      w.write(as_bytes(f32.data(), n * sizeof(float)));
    } else {
      for (size_t i = 0; i < n; ++i) {
        b16[i] = type == gguf::TensorType::kF16 ? gguf::fp32_to_fp16(f32[i]) : gguf::fp32_to_bf16(f32[i]);
      }
      w.write(as_bytes(b16.data(), n * sizeof(uint16_t)));
    }
  }
}

}  // namespace kestrel::image
