#include "kestrel/runtime/kernels_report.h"

#include "kestrel/kernels/kernel_options.h"

namespace kestrel::runtime {

nlohmann::json kernels_json(const model::ModelInfo& info) {
  return {{"switches", kernels::kernel_options_name(kernels::kernel_options())},
          {"layers", {{"decode", info.layer_decode_kernels}, {"prefill", info.layer_prefill_kernels}}},
          {"head", {{"decode", info.head_decode_kernel}, {"prefill", info.head_prefill_kernel}}}};
}

}  // namespace kestrel::runtime
