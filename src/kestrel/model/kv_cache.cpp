#include "kestrel/model/kv_cache.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "kestrel/base/error.h"
#include "kestrel/model/model.h"

namespace kestrel::model {

namespace {

KvTensor tensor_for(KvType type, const LayerCacheSpec& s) {
  KvTensor t;
  t.type = type;
  t.stride = s.stride;
  t.head_dim = s.head_dim != 0 ? s.head_dim : s.stride;
  t.block = kernels::kv_q8_block(t.head_dim);
  return t;
}

}  // namespace

std::string kv_types_name(const KvTypes& t) {
  const auto name = [](KvType x) { return std::string(kernels::kv_type_name(x)); };
  const auto rotated = [&](KvType x) { return name(x) + (t.k_hadamard && x == KvType::kQ8 ? " (Hadamard-rotated)" : ""); };
  return t.k == t.v ? rotated(t.k) : "K " + rotated(t.k) + ", V " + rotated(t.v);
}

void KvTensor::write(size_t slot, const float* x) {
  if (rotated) {
    thread_local std::vector<float> r;
    r.assign(x, x + stride);
    for (size_t h = 0; h < stride; h += head_dim) kernels::hadamard_rotate(&r[h], head_dim);
    kernels::kv_write_row(type, r.data(), stride, block, &q[slot * stride], &scales[slot * (stride / block)]);
  } else if (type == KvType::kQ8) {
    kernels::kv_write_row(type, x, stride, block, &q[slot * stride], &scales[slot * (stride / block)]);
  } else {
    kernels::kv_write_row(type, x, stride, block, &half[slot * stride], nullptr);
  }
}

void KvTensor::copy_out(size_t slot, uint8_t* bytes) const {
  if (type == KvType::kQ8) {
    std::memcpy(bytes, &q[slot * stride], stride);
    std::memcpy(bytes + stride, &scales[slot * (stride / block)], 2 * (stride / block));
  } else {
    std::memcpy(bytes, &half[slot * stride], 2 * stride);
  }
}

void KvTensor::copy_in(size_t slot, const uint8_t* bytes) {
  if (type == KvType::kQ8) {
    std::memcpy(&q[slot * stride], bytes, stride);
    std::memcpy(&scales[slot * (stride / block)], bytes + stride, 2 * (stride / block));
  } else {
    std::memcpy(&half[slot * stride], bytes, 2 * stride);
  }
}

kernels::KvHeadView KvTensor::head(size_t g, size_t hd) const {
  kernels::KvHeadView v;
  v.type = type;
  v.stride = stride;
  v.block = block;
  if (type == KvType::kQ8) {
    v.data = q.data() + g * hd;
    v.scales = scales.data() + g * hd / block;
    v.scale_stride = stride / block;
  } else {
    v.data = half.data() + g * hd;
  }
  return v;
}

size_t KvCache::bytes_for(const std::vector<LayerCacheSpec>& specs, const KvTypes& types) {
  size_t total = 0;
  for (const auto& s : specs) {
    total += s.capacity * (tensor_for(types.k, s).slot_bytes() + tensor_for(types.v, s).slot_bytes());
  }
  return total;
}

KvCache KvCache::allocate(size_t n_ctx, const std::vector<LayerCacheSpec>& specs, const KvTypes& types) {
  check_memory("the KV cache for a context of " + std::to_string(n_ctx) + " tokens", bytes_for(specs, types));
  KvCache cache;
  cache.n_ctx = n_ctx;
  cache.types_ = types;
  cache.tokens_.reserve(n_ctx);
  for (const auto& s : specs) {
    LayerCache lc;
    lc.capacity = s.capacity;
    lc.stride = s.stride;
    lc.window = s.window;
    for (auto [t, type] : {std::pair{&lc.k, types.k}, std::pair{&lc.v, types.v}}) {
      *t = tensor_for(type, s);
      t->rotated = type == KvType::kQ8 && types.k_hadamard;
      if (t->rotated && (t->head_dim & (t->head_dim - 1)) != 0) {
        throw Error("KV cache: the Hadamard rotation needs a power-of-two head size, not " +
                    std::to_string(t->head_dim));
      }
      if (type == KvType::kQ8) {
        if (s.stride % t->block != 0) throw Error("KV cache: q8 blocks do not divide a layer's row");
        t->q.assign(lc.capacity * lc.stride, 0);
        t->scales.assign(lc.capacity * (lc.stride / t->block), 0);
      } else {
        t->half.assign(lc.capacity * lc.stride, 0);
      }
    }
    cache.layers.push_back(std::move(lc));
  }
  return cache;
}

size_t KvCache::bytes() const {
  size_t total = 0;
  for (const auto& layer : layers) total += layer.k.bytes() + layer.v.bytes();
  return total;
}

size_t KvCache::read_bytes() const {
  size_t total = 0;
  for (const auto& layer : layers) {
    if (layer.capacity == 0) continue;
    const size_t seen = layer.window > 0 ? std::min(n_past + 1, layer.window) : n_past + 1;
    total += seen * (layer.k.slot_bytes() + layer.v.slot_bytes());
  }
  return total;
}

size_t KvCache::min_ring_capacity() const {
  size_t cap = 0;
  for (const auto& l : layers) {
    if (l.capacity > 0 && l.capacity < n_ctx) cap = cap == 0 ? l.capacity : std::min(cap, l.capacity);
  }
  return cap;
}

size_t KvCache::max_ring_window() const {
  size_t w = 0;
  for (const auto& l : layers) {
    if (l.capacity > 0 && l.capacity < n_ctx) w = std::max(w, l.window);
  }
  return w;
}

void KvCache::append(std::span<const TokenId> ids, bool prefill) {
  if (prefill && prefilled_ == n_past) prefilled_ = n_past + ids.size();
  tokens_.insert(tokens_.end(), ids.begin(), ids.end());
  n_past += ids.size();
  if (const size_t cap = min_ring_capacity(); cap > 0 && n_past > cap) {
    ring_floor_ = std::max(ring_floor_, n_past - cap);
  }
}

size_t KvCache::exact_prefix(size_t n) const {
  // The next query, at position n, reads positions max(0, n - W + 1) .. n - 1 of each ring.
  const size_t w = max_ring_window();
  const size_t needed_from = w > 0 && n + 1 > w ? n + 1 - w : 0;
  return needed_from >= ring_floor_ ? n : 0;
}

size_t KvCache::truncate(size_t n) {
  if (n > n_past) {
    throw Error("KV cache: cannot truncate to " + std::to_string(n) + " positions, it holds " +
                std::to_string(n_past));
  }
  const size_t keep = exact_prefix(n);
  if (keep == 0) {
    clear();
    return 0;
  }
  n_past = keep;
  prefilled_ = std::min(prefilled_, keep);
  tokens_.resize(keep);
  return keep;
}

void KvCache::adopt_prefix(std::span<const TokenId> ids) {
  if (ids.size() > n_ctx) {
    throw Error("KV cache: a prefix of " + std::to_string(ids.size()) + " positions does not fit a context of " +
                std::to_string(n_ctx));
  }
  tokens_.assign(ids.begin(), ids.end());
  n_past = prefilled_ = ids.size();
  const size_t cap = min_ring_capacity();
  ring_floor_ = cap > 0 && n_past > cap ? n_past - cap : 0;
}

void KvCache::clear() {
  n_past = 0;
  prefilled_ = 0;
  tokens_.clear();
  ring_floor_ = 0;
}

size_t common_prefix(std::span<const TokenId> a, std::span<const TokenId> b) {
  const size_t n = std::min(a.size(), b.size());
  return static_cast<size_t>(std::mismatch(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(n), b.begin()).first - a.begin());
}

}  // namespace kestrel::model
