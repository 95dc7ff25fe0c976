#include "kestrel/image/channel_scaling.h"

#include <algorithm>

#include "kestrel/base/error.h"
#include "kestrel/formats/dequant.h"

namespace kestrel::image {
namespace {

std::string blk(size_t il, const char* name) {
  return "blk." + std::to_string(il) + "." + name + ".weight";
}

const std::vector<float>* find(const std::map<std::string, std::vector<float>>& m, const std::string& name) {
  const auto it = m.find(name);
  return it == m.end() ? nullptr : &it->second;
}

std::vector<float> dequantized(const gguf::File& file, const gguf::TensorInfo& t) {
  std::vector<float> out(t.n_elements);
  gguf::dequantize(t.type, file.tensor_data(t).data(), out.data(), out.size());
  return out;
}

}  // namespace

void ChannelScaling::apply(const std::string& name, float* data, size_t rows, size_t cols) const {
  auto check = [&](const std::vector<float>& s, size_t n) {
    if (s.size() != n) {
      throw Error("channel scaling of " + name + ": " + std::to_string(s.size()) + " scales for " +
                  std::to_string(n) + " channels");
    }
  };
  if (const auto* s = find(column_scale, name)) {
    check(*s, cols);
    for (size_t r = 0; r < rows; ++r) {
      for (size_t i = 0; i < cols; ++i) data[r * cols + i] *= (*s)[i];
    }
  }
  if (const auto* s = find(row_divisor, name)) {
    check(*s, rows);
    for (size_t r = 0; r < rows; ++r) {
      for (size_t i = 0; i < cols; ++i) data[r * cols + i] /= (*s)[r];
    }
  }
  if (const auto* s = find(vector_divisor, name)) {
    check(*s, rows * cols);
    for (size_t i = 0; i < rows * cols; ++i) data[i] /= (*s)[i];
  }
}

std::vector<ScalingGroup> scaling_groups(const gguf::File& file) {
  const std::string arch = file.find_string("general.architecture").value_or("");
  if (arch != "gemma3" && arch != "gemma4") return {};
  const uint64_t n_layers = file.get_uint(arch + ".block_count");
  std::vector<ScalingGroup> groups;
  auto present = [&](std::initializer_list<const char*> names, size_t il) {
    std::vector<std::string> out;
    for (const char* n : names) {
      if (file.find_tensor(blk(il, n)) != nullptr) out.push_back(blk(il, n));
    }
    return out;
  };
  for (size_t il = 0; il < n_layers; ++il) {
    if (file.find_tensor(blk(il, "attn_norm")) != nullptr) {
      groups.push_back({present({"attn_q", "attn_k", "attn_v"}, il), blk(il, "attn_norm"), ""});
    }
    if (file.find_tensor(blk(il, "ffn_norm")) != nullptr) {
      groups.push_back({present({"ffn_gate", "ffn_up"}, il), blk(il, "ffn_norm"), ""});
    }
    if (file.find_tensor(blk(il, "ffn_up")) != nullptr) {
      groups.push_back({present({"ffn_down"}, il), "", blk(il, "ffn_up")});
    }
    if (arch == "gemma3" && file.find_tensor(blk(il, "attn_v")) != nullptr) {
      const uint64_t heads = file.get_uint(arch + ".attention.head_count");
      const uint64_t kv = file.get_uint(arch + ".attention.head_count_kv");
      const uint64_t hd = file.get_uint(arch + ".attention.value_length");
      if (kv > 0 && heads % kv == 0) {
        groups.push_back({present({"attn_output"}, il), "", blk(il, "attn_v"), static_cast<size_t>(heads / kv),
                          static_cast<size_t>(hd)});
      }
    }
  }
  std::erase_if(groups, [](const ScalingGroup& g) { return g.matrices.empty(); });
  return groups;
}

std::vector<float> fold_row_scales(const ScalingGroup& group, const std::vector<float>& s) {
  if (group.heads_per_kv == 0) return s;
  const size_t hd = group.head_dim, rep = group.heads_per_kv;
  if (hd == 0 || s.size() % (hd * rep) != 0) throw Error("channel scaling: heads do not divide the input");
  std::vector<float> t(s.size() / rep);
  for (size_t g = 0; g < t.size() / hd; ++g) {
    for (size_t j = 0; j < hd; ++j) t[g * hd + j] = s[g * rep * hd + j];
  }
  return t;
}

ChannelScaling search_channel_scaling(
    const gguf::File& file, const quant::ActivationStatsMap& stats, const quant::W4Params& params,
    size_t grid_points, ThreadPool& pool,
    const std::function<void(size_t, size_t, const std::string&, const quant::AwqSearchResult&)>& progress,
    const std::function<bool(const std::string&)>& is_int4) {
  ChannelScaling scaling;
  const auto groups = scaling_groups(file);
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const ScalingGroup& g = groups[gi];
    std::vector<std::string> searched;  // the group's INT4 matrices
    for (const auto& name : g.matrices) {
      if (!is_int4 || is_int4(name)) searched.push_back(name);
    }
    if (searched.empty()) continue;  // nothing in INT4: no scaling to gain
    const auto it = stats.find(g.matrices.front());
    if (it == stats.end() || it->second->n_sample() == 0) continue;
    const quant::ActivationStats& st = *it->second;
    std::vector<std::vector<float>> dense;
    std::vector<quant::DenseView> views;
    bool usable = true;
    for (const auto& name : g.matrices) {
      const gguf::TensorInfo& t = *file.find_tensor(name);
      if (t.shape.size() != 2 || t.shape[0] != st.cols || t.shape[0] % params.group_size != 0) {
        usable = false;
        break;
      }
      if (std::find(searched.begin(), searched.end(), name) == searched.end()) continue;
      dense.push_back(dequantized(file, t));
      views.push_back({dense.back().data(), static_cast<size_t>(t.shape[1]), static_cast<size_t>(t.shape[0])});
    }
    if (!usable) continue;
    const size_t rep = std::max<size_t>(g.heads_per_kv, 1);
    if (!g.fold_rows.empty()) {
      const gguf::TensorInfo* t = file.find_tensor(g.fold_rows);
      if (t == nullptr || t->shape.size() != 2 || t->shape[1] * rep != st.cols) continue;
      if (g.heads_per_kv > 0 && (g.head_dim == 0 || st.cols % (g.head_dim * rep) != 0)) continue;
    }
    // Query heads that read one KV head must share its scales: average their magnitudes.
    std::vector<float> magnitude = st.mean_abs;
    if (g.heads_per_kv > 0) {
      const size_t hd = g.head_dim;
      for (size_t kv = 0; kv < st.cols / (hd * rep); ++kv) {
        for (size_t j = 0; j < hd; ++j) {
          float sum = 0.0f;
          for (size_t h = 0; h < rep; ++h) sum += st.mean_abs[(kv * rep + h) * hd + j];
          for (size_t h = 0; h < rep; ++h) magnitude[(kv * rep + h) * hd + j] = sum / static_cast<float>(rep);
        }
      }
    }
    if (!g.fold_vector.empty()) {
      const gguf::TensorInfo* t = file.find_tensor(g.fold_vector);
      if (t == nullptr || t->shape.size() != 1 || t->shape[0] != st.cols) continue;
    }
    const auto result = quant::search_awq_scales(views, st, magnitude.data(), params, grid_points, pool);
    if (progress) progress(gi + 1, groups.size(), searched.front(), result);
    if (result.alpha == 0.0f) continue;  // no scaling won
    for (const auto& name : g.matrices) scaling.column_scale[name] = result.scales;
    if (!g.fold_vector.empty()) scaling.vector_divisor[g.fold_vector] = result.scales;
    if (!g.fold_rows.empty()) scaling.row_divisor[g.fold_rows] = fold_row_scales(g, result.scales);
  }
  return scaling;
}

}  // namespace kestrel::image
