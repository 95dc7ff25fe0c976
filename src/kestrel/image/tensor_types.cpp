#include "kestrel/image/tensor_types.h"

#include "kestrel/base/error.h"
#include "kestrel/image/image.h"

namespace kestrel::image {

const char* storage_name(MatrixStorage storage) {
  switch (storage) {
    case MatrixStorage::kInt4: return "w4";
    case MatrixStorage::kQ8_0: return "q8_0";
    case MatrixStorage::kBF16: return "bf16";
  }
  return "?";
}

TensorTypeOverride parse_tensor_type(std::string_view spec) {
  std::string quoted = "--tensor-type '";
  quoted.append(spec);
  quoted += '\'';
  const size_t eq = spec.rfind('=');
  if (eq == std::string_view::npos) throw Error(quoted + ": expected PATTERN=TYPE, e.g. attn_v=q8_0");
  const std::string_view pattern = spec.substr(0, eq), type = spec.substr(eq + 1);
  if (pattern.empty()) throw Error(quoted + ": the pattern before '=' is empty");
  bool component_start = true;
  for (const char c : pattern) {
    const bool word = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
    if (c == '.' && !component_start) {
      component_start = true;
      continue;
    }
    if (!word) {
      throw Error(quoted + ": the pattern must be dot-separated name components of letters, digits, '_' "
                  "or '-' (e.g. ffn_down, blk.3, blk.3.ffn_down.weight)");
    }
    component_start = false;
  }
  if (component_start) throw Error(quoted + ": the pattern ends with '.'");
  TensorTypeOverride o;
  o.pattern = std::string(pattern);
  if (type == "w4") {
    o.storage = MatrixStorage::kInt4;
  } else if (type == "q8_0") {
    o.storage = MatrixStorage::kQ8_0;
  } else if (type == "bf16") {
    o.storage = MatrixStorage::kBF16;
  } else {
    throw Error(quoted + ": unknown type '" + std::string(type) + "' (w4, q8_0 or bf16)");
  }
  return o;
}

bool pattern_matches(std::string_view pattern, std::string_view name) {
  if (pattern.empty()) return false;
  // An occurrence of the pattern bounded by the name's ends or dots on both sides.
  for (size_t at = name.find(pattern); at != std::string_view::npos; at = name.find(pattern, at + 1)) {
    const size_t end = at + pattern.size();
    if ((at == 0 || name[at - 1] == '.') && (end == name.size() || name[end] == '.')) return true;
  }
  return false;
}

bool is_layer_matrix(const gguf::TensorInfo& t) {
  return t.shape.size() == 2 && t.name.rfind("blk.", 0) == 0 && t.name.size() > 7 &&
         t.name.compare(t.name.size() - 7, 7, ".weight") == 0;
}

MatrixStorage storage_of(std::string_view name, std::span<const TensorTypeOverride> overrides) {
  MatrixStorage s = MatrixStorage::kInt4;
  for (const auto& o : overrides) {
    if (pattern_matches(o.pattern, name)) s = o.storage;
  }
  return s;
}

void check_overrides_match(const gguf::File& file, std::span<const TensorTypeOverride> overrides) {
  for (const auto& o : overrides) {
    bool any = false;
    bool prequantized = false;  // matches an INT4 matrix the source already holds (name.q4)
    const std::string_view q4 = kQ4Suffix;
    for (const auto& t : file.tensors()) {
      if (is_layer_matrix(t) && pattern_matches(o.pattern, t.name)) {
        any = true;
        break;
      }
      const std::string_view name = t.name;
      if (name.size() > q4.size() && name.substr(name.size() - q4.size()) == q4 &&
          pattern_matches(o.pattern, name.substr(0, name.size() - q4.size()))) {
        prequantized = true;
      }
    }
    if (!any && prequantized) {
      throw Error("--tensor-type " + o.pattern + "=" + storage_name(o.storage) +
                  ": the layer matrices it names are already INT4 in the source (a quantized checkpoint: "
                  "compressed-tensors, AWQ or GPTQ), and the build keeps them exactly as quantized; "
                  "--tensor-type can only set the storage of the matrices the build quantizes itself. For "
                  "another storage, build from the unquantized checkpoint");
    }
    if (!any) {
      throw Error("--tensor-type " + o.pattern + "=" + storage_name(o.storage) +
                  ": the pattern matches no layer matrix of the source (layer matrices are named like "
                  "blk.0.attn_q.weight; a pattern matches whole dot-separated components, e.g. attn_v, "
                  "ffn_down, blk.3, blk.3.ffn_down.weight)");
    }
  }
}

std::string overrides_string(std::span<const TensorTypeOverride> overrides) {
  std::string s;
  for (const auto& o : overrides) {
    if (!s.empty()) s += ",";
    s += o.pattern + "=" + storage_name(o.storage);
  }
  return s;
}

}  // namespace kestrel::image
