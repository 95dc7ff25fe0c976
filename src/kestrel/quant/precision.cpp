#include "kestrel/quant/precision.h"

#include "kestrel/base/error.h"

namespace kestrel::quant {

Precision parse_precision(const std::string& name) {
  if (name == "source") return Precision::kSource;
  if (name == "auto") return Precision::kAuto;
  if (name == "w4a16") return Precision::kW4A16;
  if (name == "bf16") return Precision::kBF16;
  if (name == "fp16") return Precision::kFP16;
  throw Error("unknown precision '" + name + "' (expected source, auto, w4a16, bf16 or fp16)");
}

const char* precision_name(Precision precision) {
  switch (precision) {
    case Precision::kSource: return "source";
    case Precision::kAuto: return "auto";
    case Precision::kW4A16: return "w4a16";
    case Precision::kBF16: return "bf16";
    case Precision::kFP16: return "fp16";
  }
  return "?";
}

}  // namespace kestrel::quant
