#include "kestrel/head/flashhead_format.h"

#include "kestrel/base/error.h"

namespace kestrel::head {

std::optional<std::span<const TokenId>> find_row_order(const gguf::File& file) {
  const gguf::TensorInfo* info = file.find_tensor(kRowTokensTensor);
  if (info == nullptr) return std::nullopt;
  if (info->type != gguf::TensorType::kI32 || info->shape.size() != 1) {
    throw Error(std::string("image tensor ") + kRowTokensTensor + " must be a 1-D I32 tensor");
  }
  const auto bytes = file.tensor_data(*info);
  return std::span<const TokenId>(reinterpret_cast<const TokenId*>(bytes.data()),
                                  static_cast<size_t>(info->shape[0]));
}

}  // namespace kestrel::head
