#include "kestrel/image/hf_awq_gptq.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>

#include "kestrel/base/error.h"
#include "kestrel/formats/dequant.h"
#include "kestrel/quant/w4.h"

namespace kestrel::image {

using nlohmann::json;
namespace st = safetensors;

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// A string field of the config (nullopt when absent or null).
std::optional<std::string> string_field(const json& q, const char* key) {
  if (!q.contains(key) || q[key].is_null()) return std::nullopt;
  if (!q[key].is_string()) return std::string("<not a string>");
  return lower(q[key].get<std::string>());
}

const json* quantization_config(const json& config) {
  if (config.contains("quantization_config") && config["quantization_config"].is_object()) {
    return &config["quantization_config"];
  }
  if (config.contains("text_config") && config["text_config"].is_object() &&
      config["text_config"].contains("quantization_config") && config["text_config"]["quantization_config"].is_object()) {
    return &config["text_config"]["quantization_config"];
  }
  return nullptr;
}

std::string shape_str(const std::vector<uint64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

const st::TensorInfo& tensor(const st::Checkpoint& ckpt, const std::string& name) {
  if (!ckpt.has(name)) throw Error(ckpt.dir().string() + ": the checkpoint has no tensor '" + name + "'");
  return ckpt.info(name);
}

std::vector<int32_t> read_i32(const st::Checkpoint& ckpt, const std::string& name, const std::vector<uint64_t>& shape) {
  const auto& info = tensor(ckpt, name);
  if (info.dtype != st::Dtype::kI32 || info.shape != shape) {
    throw Error(ckpt.dir().string() + ": tensor '" + name + "' is " + st::dtype_name(info.dtype) + " " +
                shape_str(info.shape) + "; expected I32 " + shape_str(shape));
  }
  const auto data = ckpt.data(name);
  std::vector<int32_t> out(info.n_elements());
  std::memcpy(out.data(), data.data(), out.size() * sizeof(int32_t));
  return out;
}

// Stores `code` (0..15) as input c of a kW4 row.
inline void put_code(uint8_t* row, size_t c, size_t group_size, uint32_t code) {
  const size_t g = c / group_size, i = c % group_size, half = group_size / 2;
  uint8_t& byte = row[g * half + (i < half ? i : i - half)];
  byte = static_cast<uint8_t>(i < half ? (byte & 0xF0u) | code : (byte & 0x0Fu) | (code << 4));
}

void check_codes(size_t words, size_t want_words, size_t cols, size_t group_size, const char* what) {
  if (group_size == 0 || group_size % 2 != 0 || cols % group_size != 0 || words != want_words) {
    throw Error(std::string(what) + " unpacking: " + std::to_string(words) + " words (expected " +
                std::to_string(want_words) + "), group size " + std::to_string(group_size) + ", " +
                std::to_string(cols) + " inputs");
  }
}

template <typename T>
std::span<const std::byte> bytes_of(const std::vector<T>& v) {
  return {reinterpret_cast<const std::byte*>(v.data()), v.size() * sizeof(T)};
}

}  // namespace

std::optional<AwqGptqScheme> awq_gptq_scheme(const json& config, const std::filesystem::path& dir) {
  std::string where = (dir / "config.json").string();
  const json* q = quantization_config(config);
  json file_config;
  std::optional<std::string> method;
  if (q == nullptr) {
    const auto path = dir / "quantize_config.json";
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) return std::nullopt;
    file_config = st::read_json(path);
    if (!file_config.is_object()) throw Error(path.string() + " is not a JSON object");
    q = &file_config;
    where = path.string();
    method = "gptq";  // AutoGPTQ's file; versions before 0.7 name no quant_method
  }
  if (string_field(*q, "quant_method")) method = string_field(*q, "quant_method");
  else if (string_field(*q, "method")) method = string_field(*q, "method");
  if (!method || (*method != "awq" && *method != "gptq")) return std::nullopt;
  const bool awq = *method == "awq";
  auto bad = [&](const std::string& what) {
    return Error(where + ": " + (awq ? "AWQ" : "GPTQ") + " quantization_config " + what +
                 "; kestrel build imports 4-bit weights in groups of a multiple of 32 inputs, " +
                 (awq ? "AWQ's \"gemm\" packing with zero points" : "GPTQ's gptq / gptq_v2 packing in int32 words") +
                 " (docs/export.md)");
  };
  AwqGptqScheme s;
  if (!q->contains("bits") || !(*q)["bits"].is_number_integer() || (*q)["bits"].get<int64_t>() != 4) {
    throw bad("has bits " + (q->contains("bits") ? (*q)["bits"].dump() : std::string("(none)")));
  }
  if (!q->contains("group_size") || !(*q)["group_size"].is_number_integer()) throw bad("has no integer group_size");
  const int64_t group = (*q)["group_size"].get<int64_t>();
  if (group == -1) throw bad("has group_size -1 (one group per row)");
  if (group <= 0 || group % 32 != 0) throw bad("has group_size " + std::to_string(group));
  s.group_size = static_cast<size_t>(group);
  if (q->contains("pack_dtype") && !q->at("pack_dtype").is_null()) {
    const auto pd = string_field(*q, "pack_dtype");
    if (pd != "int32" && pd != "torch.int32") throw bad("has pack_dtype " + q->at("pack_dtype").dump());
  }
  if (q->contains("dynamic") && !(*q)["dynamic"].is_null() && !((*q)["dynamic"].is_object() && (*q)["dynamic"].empty())) {
    throw bad("has per-module `dynamic` overrides");
  }
  if (q->contains("lm_head") && (*q)["lm_head"] == true) throw bad("quantizes lm_head (Gemma's head is the tied embedding)");
  if (awq) {
    s.format = PackedInt4Format::kAwqGemm;
    const auto version = string_field(*q, "version") ? string_field(*q, "version") : string_field(*q, "format");
    if (version && *version != "gemm") throw bad("has version / format '" + *version + "'");
    if (string_field(*q, "backend") == "llm-awq") throw bad("has backend llm-awq (llm-awq's GEMV_FAST packing)");
    if (q->contains("zero_point") && (*q)["zero_point"] != true) throw bad("has zero_point false");
    s.symmetric = false;
    s.name = "awq-gemm";
  } else {
    s.format = PackedInt4Format::kGptq;
    const auto cf = string_field(*q, "checkpoint_format");
    const auto f = string_field(*q, "format");
    if (cf && f && *cf != *f) throw bad("has checkpoint_format '" + *cf + "' but format '" + *f + "'");
    const std::string fmt = cf ? *cf : f ? *f : "gptq";
    if (fmt != "gptq" && fmt != "gptq_v2") throw bad("has checkpoint format '" + fmt + "'");
    s.gptq_v1 = fmt == "gptq";
    if (q->contains("sym") && !(*q)["sym"].is_boolean()) throw bad("has a sym that is not true or false");
    s.symmetric = q->value("sym", true);
    s.name = fmt;
  }
  return s;
}

bool is_awq_gptq_aux(const std::string& name) {
  for (const char* suffix : {".qzeros", ".scales", ".g_idx"}) {
    const size_t k = std::strlen(suffix);
    if (name.size() > k && name.compare(name.size() - k, k, suffix) == 0) return true;
  }
  return false;
}

std::pair<uint64_t, uint64_t> awq_gptq_linear_shape(const st::Checkpoint& ckpt, const std::string& hf_base,
                                                    const AwqGptqScheme& scheme) {
  const auto& qw = tensor(ckpt, hf_base + ".qweight");
  const auto& sc = tensor(ckpt, hf_base + ".scales");
  if (qw.shape.size() != 2 || sc.shape.size() != 2) {
    throw Error(ckpt.dir().string() + ": " + hf_base + ".qweight " + shape_str(qw.shape) + " and .scales " +
                shape_str(sc.shape) + " are not matrices");
  }
  const uint64_t rows = sc.shape[1];
  const uint64_t cols = scheme.format == PackedInt4Format::kAwqGemm ? qw.shape[0] : qw.shape[0] * 8;
  const std::vector<uint64_t> want_qw = scheme.format == PackedInt4Format::kAwqGemm
                                            ? std::vector<uint64_t>{cols, rows / 8}
                                            : std::vector<uint64_t>{cols / 8, rows};
  if (rows == 0 || cols == 0 || qw.shape != want_qw || (scheme.format == PackedInt4Format::kAwqGemm && rows % 8 != 0) ||
      cols % scheme.group_size != 0 || sc.shape[0] != cols / scheme.group_size) {
    throw Error(ckpt.dir().string() + ": " + hf_base + ".qweight " + shape_str(qw.shape) + " and .scales " +
                shape_str(sc.shape) + " do not fit one " + scheme.name + " Linear with groups of " +
                std::to_string(scheme.group_size) + " inputs");
  }
  return {rows, cols};
}

std::vector<uint8_t> awq_unpack_codes(std::span<const int32_t> qweight, size_t rows, size_t cols, size_t group_size) {
  check_codes(qweight.size(), rows % 8 == 0 ? cols * rows / 8 : 0, cols, group_size, "AWQ");
  std::vector<uint8_t> out(rows * cols / 2, 0);
  const size_t words = rows / 8;
  for (size_t r = 0; r < rows; ++r) {
    uint8_t* row = out.data() + r * cols / 2;
    const unsigned shift = 4 * kAwqNibble[r % 8];
    for (size_t c = 0; c < cols; ++c) {
      put_code(row, c, group_size, (static_cast<uint32_t>(qweight[c * words + r / 8]) >> shift) & 0xFu);
    }
  }
  return out;
}

std::vector<uint8_t> awq_unpack_zeros(std::span<const int32_t> qzeros, size_t rows, size_t n_groups) {
  if (rows % 8 != 0 || qzeros.size() != n_groups * rows / 8) {
    throw Error("AWQ unpacking: " + std::to_string(qzeros.size()) + " zero-point words for " + std::to_string(rows) +
                " outputs (a multiple of 8) in " + std::to_string(n_groups) + " groups");
  }
  std::vector<uint8_t> out(rows * n_groups);
  for (size_t r = 0; r < rows; ++r) {
    const unsigned shift = 4 * kAwqNibble[r % 8];
    for (size_t g = 0; g < n_groups; ++g) {
      out[r * n_groups + g] = static_cast<uint8_t>((static_cast<uint32_t>(qzeros[g * rows / 8 + r / 8]) >> shift) & 0xFu);
    }
  }
  return out;
}

std::vector<uint8_t> gptq_unpack_codes(std::span<const int32_t> qweight, size_t rows, size_t cols, size_t group_size) {
  check_codes(qweight.size(), cols % 8 == 0 ? cols / 8 * rows : 0, cols, group_size, "GPTQ");
  std::vector<uint8_t> out(rows * cols / 2, 0);
  for (size_t r = 0; r < rows; ++r) {
    uint8_t* row = out.data() + r * cols / 2;
    for (size_t c = 0; c < cols; ++c) {
      put_code(row, c, group_size, (static_cast<uint32_t>(qweight[(c / 8) * rows + r]) >> (4 * (c % 8))) & 0xFu);
    }
  }
  return out;
}

std::vector<uint8_t> gptq_unpack_zeros(std::span<const int32_t> qzeros, size_t rows, size_t n_groups, bool v1) {
  const size_t words = (rows + 7) / 8;
  if (qzeros.size() != n_groups * words) {
    throw Error("GPTQ unpacking: " + std::to_string(qzeros.size()) + " zero-point words for " + std::to_string(rows) +
                " outputs in " + std::to_string(n_groups) + " groups (expected " + std::to_string(n_groups * words) + ")");
  }
  std::vector<uint8_t> out(rows * n_groups);
  for (size_t g = 0; g < n_groups; ++g) {
    for (size_t wi = 0; wi < words; ++wi) {
      uint32_t word = static_cast<uint32_t>(qzeros[g * words + wi]);
      if (v1) word += 0x11111111u;  // modulo 2^32, as GPTQModel's v1 -> v2 conversion
      for (size_t k = 0; k < 8 && wi * 8 + k < rows; ++k) {
        out[(wi * 8 + k) * n_groups + g] = static_cast<uint8_t>((word >> (4 * k)) & 0xFu);
      }
    }
  }
  return out;
}

void write_awq_gptq_linear(gguf::Writer& w, const st::Checkpoint& ckpt, const std::string& hf_base, size_t rows,
                           size_t cols, const AwqGptqScheme& scheme, const std::function<void(const std::string&)>& log) {
  const size_t G = scheme.group_size;
  const auto [r0, c0] = awq_gptq_linear_shape(ckpt, hf_base, scheme);
  if (r0 != rows || c0 != cols) {
    throw Error(ckpt.dir().string() + ": " + hf_base + " is [" + std::to_string(r0) + ", " + std::to_string(c0) +
                "], config.json implies [" + std::to_string(rows) + ", " + std::to_string(cols) + "]");
  }
  const size_t n_groups = cols / G;
  const bool awq = scheme.format == PackedInt4Format::kAwqGemm;
  const std::string where = ckpt.dir().string() + ": " + hf_base;

  // The groups must be runs of G consecutive inputs: g_idx[c] = c / G (GPTQ; AWQ has none).
  if (!awq && ckpt.has(hf_base + ".g_idx")) {
    const auto& gi = ckpt.info(hf_base + ".g_idx");
    if (gi.shape != std::vector<uint64_t>{cols} || (gi.dtype != st::Dtype::kI32 && gi.dtype != st::Dtype::kI64)) {
      throw Error(where + ".g_idx is " + st::dtype_name(gi.dtype) + " " + shape_str(gi.shape) + "; expected I32 [" +
                  std::to_string(cols) + "]");
    }
    const auto data = ckpt.data(hf_base + ".g_idx");
    size_t moved = 0;
    for (size_t c = 0; c < cols; ++c) {
      int64_t g = 0;
      if (gi.dtype == st::Dtype::kI32) {
        int32_t v;
        std::memcpy(&v, data.data() + 4 * c, 4);
        g = v;
      } else {
        std::memcpy(&g, data.data() + 8 * c, 8);
      }
      moved += g != static_cast<int64_t>(c / G);
    }
    if (moved > 0) {
      throw Error(where + ".g_idx puts " + std::to_string(moved) + " of " + std::to_string(cols) +
                  " inputs outside their run of " + std::to_string(G) +
                  " (activation order, desc_act without static groups): Kestrel's groups are runs of consecutive "
                  "inputs, so this checkpoint cannot be kept exactly; quantize with desc_act=False (or static_groups=True)");
    }
  }

  const auto qweight = read_i32(ckpt, hf_base + ".qweight",
                                awq ? std::vector<uint64_t>{cols, rows / 8} : std::vector<uint64_t>{cols / 8, rows});
  w.write(bytes_of(awq ? awq_unpack_codes(qweight, rows, cols, G) : gptq_unpack_codes(qweight, rows, cols, G)));
  ckpt.release(hf_base + ".qweight");

  // Scales [n_groups, rows] -> [rows, n_groups], fp16.
  const std::string scale_name = hf_base + ".scales";
  const auto& sinfo = ckpt.info(scale_name);
  const auto sdata = ckpt.data(scale_name);
  std::vector<uint16_t> scales(rows * n_groups);
  size_t inexact = 0;
  for (size_t g = 0; g < n_groups; ++g) {
    for (size_t r = 0; r < rows; ++r) {
      const size_t i = g * rows + r;
      uint16_t h = 0;
      float v = 0;
      switch (sinfo.dtype) {
        case st::Dtype::kF16: std::memcpy(&h, sdata.data() + 2 * i, 2); v = gguf::fp16_to_fp32(h); break;
        case st::Dtype::kBF16: std::memcpy(&h, sdata.data() + 2 * i, 2); v = gguf::bf16_to_fp32(h); h = gguf::fp32_to_fp16(v); break;
        case st::Dtype::kF32: std::memcpy(&v, sdata.data() + 4 * i, 4); h = gguf::fp32_to_fp16(v); break;
        default: throw Error(where + ".scales has dtype " + st::dtype_name(sinfo.dtype) + " (F16, BF16 or F32 expected)");
      }
      if (!(v >= 0.0f) || !std::isfinite(v)) throw Error(where + ".scales holds a negative or non-finite scale");
      if (gguf::fp16_to_fp32(h) != v) ++inexact;
      scales[r * n_groups + g] = h;
    }
  }
  if (inexact > 0 && log) {
    log(hf_base + ": " + std::to_string(inexact) + " of " + std::to_string(scales.size()) +
        " scales are not exact in fp16 and were rounded");
  }
  w.write(bytes_of(scales));
  ckpt.release(scale_name);

  const std::string zname = hf_base + ".qzeros";
  const auto qzeros = read_i32(ckpt, zname, {n_groups, awq ? rows / 8 : (rows + 7) / 8});
  const auto z = awq ? awq_unpack_zeros(qzeros, rows, n_groups) : gptq_unpack_zeros(qzeros, rows, n_groups, scheme.gptq_v1);
  if (scheme.gptq_v1 && log) {
    // A stored nibble 15 is a zero point 0 (its borrow taken from the next nibble): GPTQModel and
    // transformers read the word as here; AutoGPTQ's kernels (+1 per nibble) read the neighbour
    // one lower. Said, not refused: the word-wise reading is the writer's (GPTQModel's) own.
    size_t words_with_zero = 0;
    for (const int32_t word : qzeros) {
      const auto u = static_cast<uint32_t>(word);
      for (unsigned k = 0; k < 8; ++k) {
        if (((u >> (4 * k)) & 0xFu) == 0xFu) {
          ++words_with_zero;
          break;
        }
      }
    }
    if (words_with_zero > 0) {
      log(hf_base + ": " + std::to_string(words_with_zero) + " of " + std::to_string(qzeros.size()) +
          " v1 qzeros words hold a zero point 0 (stored as 15 with a borrow): read word-wise as GPTQModel and "
          "transformers do (AutoGPTQ's kernels read its neighbour one lower)");
    }
  }
  if (scheme.symmetric) {
    const size_t off = static_cast<size_t>(std::count_if(z.begin(), z.end(), [](uint8_t v) { return v != 8; }));
    if (off > 0) {
      throw Error(where + ": " + std::to_string(off) + " of " + std::to_string(z.size()) +
                  " zero points are not 8 in a sym=true checkpoint (damaged qzeros, or the wrong checkpoint_format)");
    }
    return;
  }
  std::vector<uint16_t> mins(rows * n_groups);
  for (size_t i = 0; i < mins.size(); ++i) mins[i] = quant::integer_zero_point_min(scales[i], z[i]);
  w.write(bytes_of(mins));
}

}  // namespace kestrel::image
