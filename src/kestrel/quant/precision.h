// Precisions of a model's layer matrices.
#pragma once

#include <string>

namespace kestrel::quant {

enum class Precision {
  kSource,  // as the source file has them (F32 and Q8_0 in place, other types as float32)
  kAuto,    // a GGUF's tensors in the nearest kernel form (quant/gguf_convert.h); an image as built
  kW4A16,   // INT4 groups with fp16 scales (quant/w4.h); activations float32
  kBF16,    // bfloat16: the unquantized baseline
  kFP16,    // IEEE fp16: the unquantized baseline, as TensorRT Edge-LLM builds it
};

/// Parses "source", "auto", "w4a16", "bf16" or "fp16"; throws kestrel::Error otherwise.
Precision parse_precision(const std::string& name);
const char* precision_name(Precision precision);

}  // namespace kestrel::quant
