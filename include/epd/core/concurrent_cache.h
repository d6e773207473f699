// epd/core/concurrent_cache.h: a thread-safe, sharded EmbeddingCache.
//
// ConcurrentEmbeddingCache<K, V> splits the key space over `shards`
// independent EmbeddingCaches, each behind its own mutex, chosen by the key's
// hash. Unlike one cache behind one lock, two threads touching different shards
// never wait for each other; unlike a lock-free design, every shard is still an
// exact LRU.
//
// Semantics differ from EmbeddingCache in two documented ways:
//   - LRU is per shard: each shard holds capacity_bytes / shards (the first
//     capacity_bytes % shards shards hold one byte more), and evicts its own
//     least recently used entry. With shards = 1 it is one exact LRU.
//   - The eviction hook runs after the shard's lock is released. Victims are
//     collected under the lock and handed to the hook afterwards, so a hook
//     that copies an embedding off the device, or frees it, never runs inside a
//     mutex. Hooks for one Put() run in eviction order on the calling thread;
//     hooks of different threads may interleave.
//
// Complexity: as EmbeddingCache, plus one uncontended mutex per call.
// Counters are summed over shards on read (O(shards), each under its lock).
// Ownership: as EmbeddingCache; Get() returns a copy of the value (for
// EmbeddingPtr: shared ownership, valid after eviction).
// Thread safety: thread-safe. The hook must be thread-safe if several threads
// put.
//
// Example:
//   ConcurrentEmbeddingCache<ContentKey, EmbeddingPtr, ContentKeyHash> cache(1 << 30, 16);
//   std::thread t([&] { cache.Put(k, emb, emb->nbytes()); });
//   auto v = cache.Get(k);
//   t.join();
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "epd/core/embedding_cache.h"

namespace epd {

template <typename K, typename V, typename Hash = std::hash<K>, typename Eq = std::equal_to<K>>
class ConcurrentEmbeddingCache {
 public:
  using EvictHook = typename EmbeddingCache<K, V, Hash, Eq>::EvictHook;

  // Throws epd::Error(kInvalidArgument) when capacity_bytes is outside
  // [0, kMaxCacheBytes] or shards < 1.
  explicit ConcurrentEmbeddingCache(std::int64_t capacity_bytes, int shards = 16, EvictHook on_evict = nullptr,
                                    Hash hash = Hash(), Eq eq = Eq())
      : hash_(hash), on_evict_(std::move(on_evict)) {
    CheckCacheBytes("capacity_bytes", capacity_bytes);
    if (shards < 1) throw Error(StatusCode::kInvalidArgument, "shards must be >= 1, got " + std::to_string(shards));
    shards_.reserve(static_cast<std::size_t>(shards));
    for (int i = 0; i < shards; ++i) {
      const std::int64_t cap = capacity_bytes / shards + (i < capacity_bytes % shards ? 1 : 0);
      shards_.push_back(std::make_unique<Shard>(cap, hash, eq));
    }
  }

  std::optional<V> Get(const K& key) {
    Shard& s = ShardFor(key);
    std::lock_guard<std::mutex> lock(s.mu);
    return s.cache.Get(key);
  }

  // As EmbeddingCache::put; the hook runs after the lock is released.
  void Put(const K& key, V value, std::int64_t nbytes) {
    Shard& s = ShardFor(key);
    std::vector<Victim> victims;
    {
      std::lock_guard<std::mutex> lock(s.mu);
      s.cache.Put(key, std::move(value), nbytes);
      victims.swap(s.victims);
    }
    // Values in `victims` are released here, outside the lock, if no hook takes them.
    if (on_evict_) {
      for (Victim& v : victims) on_evict_(v.key, std::move(v.value), v.nbytes);
    }
  }

  std::optional<PoppedEntry<V>> Pop(const K& key) {
    Shard& s = ShardFor(key);
    std::lock_guard<std::mutex> lock(s.mu);
    return s.cache.Pop(key);
  }

  bool Contains(const K& key) const {
    Shard& s = ShardFor(key);
    std::lock_guard<std::mutex> lock(s.mu);
    return s.cache.Contains(key);
  }

  std::size_t size() const {
    return Sum([](const auto& c) { return c.size(); });
  }
  std::int64_t current_bytes() const {
    return Sum([](const auto& c) { return c.current_bytes(); });
  }
  std::int64_t capacity_bytes() const {
    return Sum([](const auto& c) { return c.capacity_bytes(); });
  }
  std::uint64_t hits() const {
    return Sum([](const auto& c) { return c.hits(); });
  }
  std::uint64_t misses() const {
    return Sum([](const auto& c) { return c.misses(); });
  }
  std::uint64_t evictions() const {
    return Sum([](const auto& c) { return c.evictions(); });
  }
  int shard_count() const { return static_cast<int>(shards_.size()); }

 private:
  struct Victim {
    K key;
    V value;
    std::int64_t nbytes;
  };
  struct Shard {
    Shard(std::int64_t cap, const Hash& hash, const Eq& eq)
        : cache(
              cap,
              [this](const K& key, V&& value, std::int64_t nbytes) {
                victims.push_back(Victim{key, std::move(value), nbytes});
              },
              hash, eq) {}
    mutable std::mutex mu;
    std::vector<Victim> victims;  // filled under mu by the inner hook, drained by Put()
    EmbeddingCache<K, V, Hash, Eq> cache;
  };

  Shard& ShardFor(const K& key) const {
    // Mix the high bits in: the inner index uses the low bits of the same hash.
    const std::uint64_t h = static_cast<std::uint64_t>(hash_(key));
    return *shards_[((h >> 40) ^ (h >> 17)) % shards_.size()];
  }

  template <typename F>
  auto Sum(F f) const {
    decltype(f(shards_[0]->cache)) total{};
    for (const auto& s : shards_) {
      std::lock_guard<std::mutex> lock(s->mu);
      total += f(s->cache);
    }
    return total;
  }

  Hash hash_;
  EvictHook on_evict_;
  std::vector<std::unique_ptr<Shard>> shards_;
};

}  // namespace epd
