// The prefix cache shared by every session of a server: keys and values of prompt prefixes kept
// in blocks of positions, keyed by a hash of all the tokens up to the block's end, so that a
// conversation whose prompt starts with what another one already prefilled (a system prompt, a
// tool list, a document, its own earlier turns) copies those positions instead of computing
// them. Bounded in bytes, least recently used first out; optionally kept on disk.
//
// The idea is vLLM's automatic prefix caching (blocks keyed by a chained hash of their tokens)
// and llama-server's --cache-ram; the exactness rule is Kestrel's own (model/kv_cache.h): only
// positions written by chunks of prefill size are stored, so a restored prefix holds the bits a
// cold prefill of the same tokens writes, and answers do not depend on where a prefix came from.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <list>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kestrel/model/kv_cache.h"

namespace kestrel::runtime {

using model::TokenId;

/// Counters of a PrefixCache, readable from any thread (the /metrics endpoint).
struct PrefixCacheStats {
  std::atomic<uint64_t> lookups{0};          // restore() calls
  std::atomic<uint64_t> hits{0};             // restore() calls that copied at least one block
  std::atomic<uint64_t> restored_tokens{0};  // positions copied into sessions
  std::atomic<uint64_t> stored_blocks{0};    // blocks added (from sessions or disk)
  std::atomic<uint64_t> evicted_blocks{0};   // blocks dropped from memory to stay under the bound
  std::atomic<uint64_t> disk_writes{0};      // blocks written to --cache-dir
  std::atomic<uint64_t> disk_reads{0};       // blocks read back from --cache-dir
  std::atomic<uint64_t> disk_rejected{0};    // files of --cache-dir ignored (damaged, another model)
  std::atomic<uint64_t> blocks{0};           // blocks in memory now
  std::atomic<uint64_t> bytes{0};            // bytes of keys and values in memory now
};

/// A block's key: a 128-bit hash (XXH3) of its parent's key and its own token ids, so that a key
/// names the whole prefix [0, block end).
using BlockKey = std::array<uint64_t, 2>;

/// The prefix cache. Not thread-safe (the scheduler's thread owns it); stats() is.
class PrefixCache {
 public:
  /// A cache for sequences of `layout`'s shape (a KvCache of the model: its layers' capacity,
  /// stride and window), at most `max_bytes` bytes of keys and values in memory (0: nothing is
  /// kept). Blocks hold block_tokens() positions: 32, or the smallest sliding window when that is
  /// smaller (a block completed by a step must still be whole in every ring). `dir` (optional):
  /// blocks evicted from memory, and all of them at destruction, are written there and read back
  /// on a miss, also by a later process; `model_id` names the model and every setting that changes
  /// the bits of its keys and values (files of another id are ignored). Files record the KV
  /// element types (`--cache-type-k` / `-v`): a file of other types is ignored with a warning.
  /// Throws kestrel::Error when `dir` cannot be created.
  PrefixCache(const model::KvCache& layout, size_t max_bytes, std::filesystem::path dir = {},
              std::string model_id = {});
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  size_t block_tokens() const { return block_; }
  size_t max_bytes() const { return max_bytes_; }
  /// Bytes of keys and values one block holds.
  size_t block_bytes() const { return block_bytes_; }

  /// Stores every complete block of positions [0, cache.prefilled()) that is not stored yet and
  /// that the cache still holds whole (a sliding ring keeps only its last positions). Cheap when
  /// nothing is new: the blocks' keys are hashed again from the start (a few microseconds per
  /// thousand tokens), their data copied only when missing.
  void publish(const model::KvCache& cache);

  /// The longest prefix of `prompt` that stored blocks (in memory or in the directory) cover,
  /// in whole blocks and at most `limit` positions. Touches nothing.
  size_t match(std::span<const TokenId> prompt, size_t limit);

  /// Copies that prefix (match(prompt, limit) positions) into `cache`, which is cleared first,
  /// and returns its length (0: `cache` is left unchanged). The cache then holds exactly what a
  /// cold prefill of those tokens leaves (KvCache::adopt_prefix). Marks the blocks used. Throws
  /// kestrel::Error when `cache`'s element types are not the layout's.
  size_t restore(std::span<const TokenId> prompt, size_t limit, model::KvCache& cache);

  const PrefixCacheStats& stats() const { return stats_; }

 private:
  struct Block;
  using Lru = std::list<BlockKey>;
  struct KeyHash {
    size_t operator()(const BlockKey& k) const { return static_cast<size_t>(k[0] ^ (k[1] * 0x9E3779B97F4A7C15ull)); }
  };

  BlockKey key_of(const BlockKey& parent, std::span<const TokenId> tokens) const;
  /// The block at `key` holding `tokens`, from memory or the directory; null when neither has it.
  Block* find(const BlockKey& key, std::span<const TokenId> tokens);
  void insert(const BlockKey& key, std::unique_ptr<Block> block);
  void evict_to(size_t bytes);
  /// Marks a chain (root first) used, its root most recently.
  void touch(std::span<Block* const> chain);
  void write_file(const BlockKey& key, const Block& block);
  std::unique_ptr<Block> read_file(const BlockKey& key, std::span<const TokenId> tokens);
  std::filesystem::path file_of(const BlockKey& key) const;

  struct LayerShape {
    size_t capacity = 0, stride = 0;
    bool ring = false;
    size_t k_bytes = 0, v_bytes = 0;  // per slot (KvTensor::slot_bytes)
  };
  model::KvTypes types_;          // of the caches it copies from and into (file headers record them)
  size_t k_block_ = 0, v_block_ = 0;  // q8 blocks
  std::vector<LayerShape> layers_;
  size_t n_ctx_ = 0;
  size_t block_ = 32;
  size_t block_bytes_ = 0;
  size_t max_bytes_ = 0;
  std::filesystem::path dir_;
  std::string model_id_;
  uint64_t id_hash_ = 0;
  std::unordered_map<BlockKey, std::unique_ptr<Block>, KeyHash> blocks_;
  Lru lru_;  // front: most recently used
  size_t bytes_ = 0;
  std::unordered_set<std::string> rejected_;  // files warned about once
  PrefixCacheStats stats_;
};

}  // namespace kestrel::runtime
