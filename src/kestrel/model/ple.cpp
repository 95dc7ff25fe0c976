#include "kestrel/model/ple.h"

#include <cmath>
#include <vector>

#include "kestrel/base/error.h"
#include "kestrel/formats/dequant.h"
#include "kestrel/image/image.h"
#include "kestrel/kernels/ops.h"

namespace kestrel::model {

PerLayerTable::PerLayerTable(const gguf::File& file, WeightStore& store, size_t n_vocab,
                             size_t row_len)
    : file_(&file), row_len_(row_len) {
  const std::string name = "per_layer_token_embd.weight";
  if (store.has(name + image::kQ4Suffix)) {  // a W4A16 image built with an INT4 embedding
    int4_ = store.source_matrix(name, n_vocab, row_len);
    return;
  }
  info_ = file.find_tensor(name);
  if (info_ == nullptr) throw Error("model file has no tensor '" + name + "'");
  if (info_->shape != std::vector<uint64_t>{row_len, n_vocab}) {
    throw Error("tensor '" + name + "' has shape {" + std::to_string(info_->shape.empty() ? 0 : info_->shape[0]) +
                ", ...}, expected {" + std::to_string(row_len) + ", " + std::to_string(n_vocab) + "}");
  }
  if (!gguf::is_supported(info_->type)) {
    throw Error("tensor '" + name + "' has type " + gguf::tensor_type_name(info_->type) +
                ", which Kestrel cannot read yet");
  }
  row_bytes_ = gguf::row_bytes(info_->type, row_len);
  file.tensor_data(*info_);  // checks that the data lies in the file
}

void PerLayerTable::row(size_t token, float* out) const {
  if (info_ == nullptr) {
    kernels::matrix_row(int4_, token, out);
    return;
  }
  const auto bytes = file_->tensor_data(*info_);
  gguf::dequantize(info_->type, bytes.data() + token * row_bytes_, out, row_len_);
}

void PerLayerInputs::compute(std::span<const TokenId> tokens, const float* x0, float* out,
                             ThreadPool& pool, ActivationObserver* observer) const {
  const size_t n = tokens.size(), width = n_layers * dim;
  if (observer) observer->observe("per_layer_model_proj.weight", x0, n, d_model);
  kernels::matmul(model_proj, x0, n, d_model, out, width, pool);
  const float proj_scale = 1.0f / std::sqrt(static_cast<float>(d_model));
  const float token_scale = std::sqrt(static_cast<float>(dim));
  const float combine = 1.0f / std::sqrt(2.0f);
  pool.parallel_for(n, 1, [&](size_t b, size_t e) {
    std::vector<float> tok(width);
    for (size_t t = b; t < e; ++t) {
      float* row = out + t * width;
      table.row(static_cast<size_t>(tokens[t]), tok.data());
      kernels::scale_inplace(row, proj_scale, width);
      for (size_t i = 0; i < n_layers; ++i) kernels::rms_norm(row + i * dim, proj_norm, row + i * dim, dim, eps);
      for (size_t j = 0; j < width; ++j) row[j] = (row[j] + tok[j] * token_scale) * combine;
    }
  });
}

}  // namespace kestrel::model
