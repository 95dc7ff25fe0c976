// Per-tensor storage overrides of a W4A16 build (`kestrel build --tensor-type PATTERN=TYPE`),
// in the manner of llama-quantize's --tensor-type.
//
// Matching rule: a tensor name is a sequence of dot-separated components
// ("blk", "3", "ffn_down", "weight"). A PATTERN matches a name when its own components occur
// in the name as a contiguous run of whole components: "ffn_down" matches every
// "blk.N.ffn_down.weight", "blk.3" every matrix of layer 3, "3.ffn_down" and
// "blk.3.ffn_down.weight" only that matrix, "blk" every layer matrix; "ffn" or "down" match
// nothing (not whole components). Only layer matrices (2-D "blk.*.weight" tensors) take
// overrides. When several overrides match one matrix, the last one given wins.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kestrel/formats/gguf.h"

namespace kestrel::image {

/// How a layer matrix is stored in a W4A16 image.
enum class MatrixStorage {
  kInt4,  // INT4 groups of the build's group size (".q4" / ".scales" / ".mins" tensors)
  kQ8_0,  // ggml Q8_0 blocks (32 int8 weights and an fp16 scale), under the plain name
  kBF16,  // bfloat16, under the plain name
};

struct TensorTypeOverride {
  std::string pattern;
  MatrixStorage storage = MatrixStorage::kInt4;
};

/// "w4", "q8_0" or "bf16".
const char* storage_name(MatrixStorage storage);

/// Parses "PATTERN=TYPE" (TYPE: w4, q8_0, bf16). PATTERN: one or more non-empty dot-separated
/// components of [A-Za-z0-9_-]. Throws kestrel::Error naming the problem (no '=', empty or
/// malformed pattern, unknown type).
TensorTypeOverride parse_tensor_type(std::string_view spec);

/// Whether `pattern` matches the tensor `name` (the rule at the top of this file).
bool pattern_matches(std::string_view pattern, std::string_view name);

/// Whether `t` is a layer matrix: a 2-D tensor named "blk.*.weight".
bool is_layer_matrix(const gguf::TensorInfo& t);

/// The storage of the layer matrix `name`: the last matching override's, else kInt4.
MatrixStorage storage_of(std::string_view name, std::span<const TensorTypeOverride> overrides);

/// Throws kestrel::Error when an override's pattern matches no layer matrix of `file`.
void check_overrides_match(const gguf::File& file, std::span<const TensorTypeOverride> overrides);

/// "attn_v=q8_0,ffn_down=q8_0": the overrides as recorded in an image (empty when none).
std::string overrides_string(std::span<const TensorTypeOverride> overrides);

}  // namespace kestrel::image
