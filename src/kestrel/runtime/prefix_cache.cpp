#include "kestrel/runtime/prefix_cache.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <system_error>

#include "kestrel/base/error.h"

namespace kestrel::runtime {
namespace {

constexpr size_t kMaxBlockTokens = 32;
constexpr char kMagic[8] = {'K', 'S', 'T', 'R', 'L', 'K', 'V', '1'};
// 2: the KV element types and q8 block sizes in the header (1 had fp16 keys and values only).
constexpr uint32_t kFileVersion = 2;

// The file's fixed header: magic, version, block tokens, the model id's hash, the key, the
// payload's size, the element types of K and V (kernels::KvType) and their q8 blocks. Then the
// block's token ids, its keys and values, and an XXH3-64 of all that precedes it.
struct FileHeader {
  char magic[8];
  uint32_t version;
  uint32_t block_tokens;
  uint64_t id_hash;
  uint64_t key[2];
  uint64_t payload_bytes;
  uint8_t k_type, v_type;
  uint16_t k_block, v_block;
  uint8_t reserved[2];
};
static_assert(sizeof(FileHeader) == 56);

// The header's record of the element types (q8 blocks only where a type is q8).
void set_types(FileHeader& h, const model::KvTypes& t, size_t k_block, size_t v_block) {
  h.k_type = static_cast<uint8_t>(t.k);
  h.v_type = static_cast<uint8_t>(t.v);
  h.k_block = static_cast<uint16_t>(t.k == model::KvType::kQ8 ? k_block : 0);
  h.v_block = static_cast<uint16_t>(t.v == model::KvType::kQ8 ? v_block : 0);
}

}  // namespace

struct PrefixCache::Block {
  std::vector<TokenId> tokens;   // [block_tokens]
  std::vector<uint8_t> kv;       // per layer with a cache: K's slots [block] then V's (slot_bytes each)
  Lru::iterator lru;
  bool on_disk = false;          // the directory has this block already
};

PrefixCache::PrefixCache(const model::KvCache& layout, size_t max_bytes, std::filesystem::path dir,
                         std::string model_id)
    : n_ctx_(layout.n_ctx), max_bytes_(max_bytes), dir_(std::move(dir)), model_id_(std::move(model_id)) {
  size_t per_position = 0;
  types_ = layout.types();
  for (const auto& l : layout.layers) {
    const bool ring = l.capacity > 0 && l.capacity < layout.n_ctx;
    layers_.push_back({l.capacity, l.stride, ring, l.k.slot_bytes(), l.v.slot_bytes()});
    if (l.capacity > 0) {
      per_position += l.k.slot_bytes() + l.v.slot_bytes();
      k_block_ = l.k.block, v_block_ = l.v.block;
    }
    if (ring && l.window > 0) block_ = std::min(block_, l.window);
  }
  block_ = std::clamp<size_t>(block_, 1, kMaxBlockTokens);
  block_bytes_ = block_ * per_position;
  id_hash_ = XXH3_64bits(model_id_.data(), model_id_.size());
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    if (ec || !std::filesystem::is_directory(dir_)) {
      throw Error("--cache-dir " + dir_.string() + ": cannot create the directory" + (ec ? " (" + ec.message() + ")" : ""));
    }
  }
}

PrefixCache::~PrefixCache() {
  if (dir_.empty()) return;
  for (const auto& [key, block] : blocks_) {
    if (block->on_disk) continue;
    try {
      write_file(key, *block);
    } catch (...) {  // a full disk must not turn a shutdown into a crash; the block is only lost
    }
  }
}

BlockKey PrefixCache::key_of(const BlockKey& parent, std::span<const TokenId> tokens) const {
  std::vector<uint8_t> buf(sizeof(BlockKey) + tokens.size_bytes());
  std::memcpy(buf.data(), parent.data(), sizeof(BlockKey));
  std::memcpy(buf.data() + sizeof(BlockKey), tokens.data(), tokens.size_bytes());
  const XXH128_hash_t h = XXH3_128bits_withSeed(buf.data(), buf.size(), id_hash_);
  return {h.low64, h.high64};
}

void PrefixCache::publish(const model::KvCache& cache) {
  if (max_bytes_ < block_bytes_) return;
  const auto tokens = cache.tokens();
  const size_t n_blocks = cache.prefilled() / block_;
  const size_t floor = cache.ring_floor();
  std::vector<Block*> chain;
  BlockKey parent{id_hash_, 0};
  for (size_t b = 0; b < n_blocks; ++b) {
    const auto t = tokens.subspan(b * block_, block_);
    const BlockKey key = key_of(parent, t);
    parent = key;
    if (auto it = blocks_.find(key); it != blocks_.end()) {
      // A different prefix under the same 128-bit key: keep the stored one, store nothing after it.
      if (!std::equal(t.begin(), t.end(), it->second->tokens.begin())) break;
      chain.push_back(it->second.get());
      lru_.splice(lru_.begin(), lru_, chain.back()->lru);  // not evicted by this chain's next inserts
      continue;
    }
    // A block the rings have partly overwritten cannot be stored, nor (unreachable without it)
    // those after it; nor blocks past what the bound holds of one chain.
    if (b * block_ < floor || (chain.size() + 1) * block_bytes_ > max_bytes_) break;
    auto block = std::make_unique<Block>();
    block->tokens.assign(t.begin(), t.end());
    block->kv.resize(block_bytes_);
    uint8_t* out = block->kv.data();
    for (size_t l = 0; l < layers_.size(); ++l) {
      const LayerShape& s = layers_[l];
      if (s.capacity == 0) continue;
      const model::LayerCache& lc = cache.layers[l];
      for (const model::KvTensor* src : {&lc.k, &lc.v}) {
        for (size_t p = b * block_; p < (b + 1) * block_; ++p) {
          src->copy_out(p % s.capacity, out);
          out += src->slot_bytes();
        }
      }
    }
    chain.push_back(block.get());
    insert(key, std::move(block));
  }
  touch(chain);
}

void PrefixCache::touch(std::span<Block* const> chain) {
  // The deepest block first, the root last: the least recently used end then holds the leaves,
  // so that eviction takes a chain from its end and never strands a child behind a lost parent.
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) lru_.splice(lru_.begin(), lru_, (*it)->lru);
}

void PrefixCache::insert(const BlockKey& key, std::unique_ptr<Block> block) {
  evict_to(max_bytes_ - block_bytes_);
  lru_.push_front(key);
  block->lru = lru_.begin();
  blocks_.emplace(key, std::move(block));
  bytes_ += block_bytes_;
  ++stats_.stored_blocks;
  stats_.blocks = blocks_.size();
  stats_.bytes = bytes_;
}

void PrefixCache::evict_to(size_t bytes) {
  while (bytes_ > bytes && !lru_.empty()) {
    const BlockKey key = lru_.back();
    auto it = blocks_.find(key);
    if (!dir_.empty() && !it->second->on_disk) {
      try {
        write_file(key, *it->second);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "kestrel: warning: prefix cache: %s\n", e.what());
      }
    }
    blocks_.erase(it);
    lru_.pop_back();
    bytes_ -= block_bytes_;
    ++stats_.evicted_blocks;
  }
  stats_.blocks = blocks_.size();
  stats_.bytes = bytes_;
}

PrefixCache::Block* PrefixCache::find(const BlockKey& key, std::span<const TokenId> tokens) {
  if (auto it = blocks_.find(key); it != blocks_.end()) {
    if (!std::equal(tokens.begin(), tokens.end(), it->second->tokens.begin())) return nullptr;
    return it->second.get();
  }
  if (dir_.empty() || max_bytes_ < block_bytes_) return nullptr;
  std::unique_ptr<Block> block = read_file(key, tokens);
  if (!block) return nullptr;
  block->on_disk = true;
  Block* raw = block.get();
  insert(key, std::move(block));
  ++stats_.disk_reads;
  return raw;
}

size_t PrefixCache::match(std::span<const TokenId> prompt, size_t limit) {
  limit = std::min({limit, prompt.size(), n_ctx_});
  BlockKey parent{id_hash_, 0};
  size_t b = 0;
  for (; (b + 1) * block_ <= limit; ++b) {
    const auto t = prompt.subspan(b * block_, block_);
    const BlockKey key = key_of(parent, t);
    if (find(key, t) == nullptr) break;
    parent = key;
  }
  return b * block_;
}

size_t PrefixCache::restore(std::span<const TokenId> prompt, size_t limit, model::KvCache& cache) {
  ++stats_.lookups;
  size_t n = match(prompt, limit);
  if (n == 0) return 0;
  // The chain again, by key (reading files in match() may have evicted the oldest of it when the
  // chain is longer than the cache holds): the prefix ends at the first block no longer here.
  std::vector<Block*> chain;
  BlockKey parent{id_hash_, 0};
  for (size_t b = 0; b * block_ < n; ++b) {
    const BlockKey key = key_of(parent, prompt.subspan(b * block_, block_));
    auto it = blocks_.find(key);
    if (it == blocks_.end()) break;
    chain.push_back(it->second.get());
    parent = key;
  }
  n = chain.size() * block_;
  if (n == 0) return 0;
  if (cache.types() != types_) throw Error("prefix cache: a KV cache of other element types");
  cache.clear();
  for (size_t b = 0; b < chain.size(); ++b) {
    const uint8_t* in = chain[b]->kv.data();
    for (size_t l = 0; l < layers_.size(); ++l) {
      const LayerShape& s = layers_[l];
      if (s.capacity == 0) continue;
      model::LayerCache& lc = cache.layers[l];
      // A ring keeps the positions a cold prefill of n tokens leaves in it: the last `capacity`.
      const size_t lo = s.ring && n > s.capacity ? n - s.capacity : 0;
      for (model::KvTensor* dst : {&lc.k, &lc.v}) {
        const size_t bytes = dst->slot_bytes();
        for (size_t p = b * block_; p < (b + 1) * block_; ++p, in += bytes) {
          if (p < lo) continue;
          dst->copy_in(p % s.capacity, in);
        }
      }
    }
  }
  cache.adopt_prefix(prompt.first(n));
  touch(chain);
  ++stats_.hits;
  stats_.restored_tokens += n;
  return n;
}

std::filesystem::path PrefixCache::file_of(const BlockKey& key) const {
  char name[48];
  std::snprintf(name, sizeof name, "%016llx%016llx.kvb", static_cast<unsigned long long>(key[1]),
                static_cast<unsigned long long>(key[0]));
  return dir_ / name;
}

void PrefixCache::write_file(const BlockKey& key, const Block& block) {
  FileHeader h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.version = kFileVersion;
  h.block_tokens = static_cast<uint32_t>(block_);
  h.id_hash = id_hash_;
  h.key[0] = key[0], h.key[1] = key[1];
  h.payload_bytes = block.tokens.size() * sizeof(TokenId) + block.kv.size();
  set_types(h, types_, k_block_, v_block_);
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  XXH3_64bits_update(st, &h, sizeof h);
  XXH3_64bits_update(st, block.tokens.data(), block.tokens.size() * sizeof(TokenId));
  XXH3_64bits_update(st, block.kv.data(), block.kv.size());
  const uint64_t sum = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  // Written beside, then renamed: a reader never sees half a file under the block's name.
  const std::filesystem::path path = file_of(key), tmp = path.string() + ".partial";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(&h), sizeof h);
    out.write(reinterpret_cast<const char*>(block.tokens.data()), static_cast<std::streamsize>(block.tokens.size() * sizeof(TokenId)));
    out.write(reinterpret_cast<const char*>(block.kv.data()), static_cast<std::streamsize>(block.kv.size()));
    out.write(reinterpret_cast<const char*>(&sum), sizeof sum);
    if (!out) {
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
      throw Error("cannot write " + tmp.string() + " (disk full?)");
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw Error("cannot rename " + tmp.string() + ": " + ec.message());
  rejected_.erase(path.string());
  ++stats_.disk_writes;
}

std::unique_ptr<PrefixCache::Block> PrefixCache::read_file(const BlockKey& key, std::span<const TokenId> tokens) {
  const std::filesystem::path path = file_of(key);
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) return nullptr;  // not there: an ordinary miss
  auto reject = [&](const char* why) -> std::unique_ptr<Block> {
    if (rejected_.insert(path.string()).second) {
      ++stats_.disk_rejected;
      std::fprintf(stderr, "kestrel: warning: prefix cache file %s ignored: %s\n", path.c_str(), why);
    }
    return nullptr;
  };
  const size_t payload = block_ * sizeof(TokenId) + block_bytes_;
  std::ifstream in(path, std::ios::binary);
  FileHeader h{};
  // The header first: a file of other KV types (another size too) says so rather than "damaged".
  if (size >= sizeof h && in.read(reinterpret_cast<char*>(&h), sizeof h) &&
      std::memcmp(h.magic, kMagic, sizeof kMagic) == 0 && h.version == kFileVersion) {
    FileHeader mine{};
    set_types(mine, types_, k_block_, v_block_);
    if (h.k_type != mine.k_type || h.v_type != mine.v_type || h.k_block != mine.k_block || h.v_block != mine.v_block) {
      const std::string why = "written with another KV cache type (this cache: " + model::kv_types_name(types_) + ")";
      return reject(why.c_str());
    }
  }
  if (size != sizeof(FileHeader) + payload + sizeof(uint64_t)) return reject("wrong size (damaged or another layout)");
  in.clear();
  in.seekg(0);
  auto block = std::make_unique<Block>();
  block->tokens.resize(block_);
  block->kv.resize(block_bytes_);
  uint64_t sum = 0;
  in.read(reinterpret_cast<char*>(&h), sizeof h);
  in.read(reinterpret_cast<char*>(block->tokens.data()), static_cast<std::streamsize>(block_ * sizeof(TokenId)));
  in.read(reinterpret_cast<char*>(block->kv.data()), static_cast<std::streamsize>(block_bytes_));
  in.read(reinterpret_cast<char*>(&sum), sizeof sum);
  if (!in) return reject("unreadable");
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0 || h.version != kFileVersion) return reject("not a prefix cache block of this version");
  if (h.block_tokens != block_ || h.id_hash != id_hash_ || h.key[0] != key[0] || h.key[1] != key[1] ||
      h.payload_bytes != payload) {
    return reject("written for another model or settings");
  }
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  XXH3_64bits_update(st, &h, sizeof h);
  XXH3_64bits_update(st, block->tokens.data(), block_ * sizeof(TokenId));
  XXH3_64bits_update(st, block->kv.data(), block_bytes_);
  const uint64_t want = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  if (want != sum) return reject("checksum mismatch (damaged)");
  if (!std::equal(tokens.begin(), tokens.end(), block->tokens.begin())) return nullptr;  // another prefix, same name
  return block;
}

}  // namespace kestrel::runtime
