// Which kernels a loaded model runs, as the JSON `kestrel run --json` and the server's /props
// print (kernels/registry.h chooses them).
#pragma once

#include <nlohmann/json.hpp>

#include "kestrel/model/model.h"

namespace kestrel::runtime {

/// {"switches": "default" or the --kernels list in force, "layers": {"decode": [...],
/// "prefill": [...]}, "head": {"decode": ..., "prefill": ...}}: kernels::kernel_label names, the
/// layers' distinct ones (ModelInfo). A FlashHead image's head label is its stage 2 and dense
/// products' kernel (both read the head's rows).
nlohmann::json kernels_json(const model::ModelInfo& info);

}  // namespace kestrel::runtime
