// cache_bench: the embedding caches against peer caches and against the
// memory-latency floor, all in one binary so every figure shares one machine,
// one compiler and one run.
//
// Conventions shared by every benchmark (docs/BENCHMARKS.md repeats them):
//   - Keys are epd::ContentKey, 32 uniformly random bytes (a SHA-256 digest in
//     production), hashed by ContentKeyHash (its first 8 bytes). leveldb and
//     RocksDB's LRUCache get the same 32 bytes as a Slice; RocksDB's
//     HyperClockCache only accepts 16-byte keys, so it gets the first 16.
//   - Values are epd::EmbeddingPtr to distinct (empty) Embeddings, so a hit
//     copies a shared_ptr, i.e. one atomic increment on a control block that
//     is not in any cache line the cache itself touched. Peers store a heap
//     box holding the EmbeddingPtr (the natural void* adaptor) and a hit copies
//     the EmbeddingPtr out of the box, then releases the handle.
//   - Every entry is charged kCharge bytes (one 324-token bf16 embedding of
//     hidden size 2048), and capacities are whole multiples of it, the same
//     bytes for every cache.
//   - Access streams are precomputed arrays of keys, read sequentially, so
//     neither the RNG nor a key-table gather is in the timed loop.
//   - Results go through benchmark::DoNotOptimize.
//
// Extra mode: `cache_bench --dump_streams=DIR` writes the Zipf/uniform key
// streams as little-endian uint32 ranks (plus streams.json) for
// bench/reference_bench.py, so the Python reference replays the exact same
// accesses, and exits without running benchmarks.
#include <benchmark/benchmark.h>
#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "baseline/embedding_cache_eacf3f7.h"
#include "epd/core/concurrent_cache.h"
#include "epd/core/content_key_type.h"
#include "epd/core/embedding.h"
#include "epd/core/embedding_cache.h"
#include "epd/core/tiered_cache.h"

#ifdef EPD_BENCH_HAVE_LEVELDB
#include <leveldb/cache.h>
#endif
#ifdef EPD_BENCH_HAVE_ROCKSDB
#include <rocksdb/cache.h>
#endif

namespace epd::bench {
namespace {

// 324 tokens x hidden 2048 x 2 bytes (bf16): a 504x504 image in Qwen2-VL.
constexpr std::int64_t kCharge = std::int64_t{324} * 2048 * 2;
constexpr std::size_t kResident = 1'000'000;  // entries in the "large" cache
constexpr std::size_t kHot = 10'000;          // entries in the CPU-cache-resident set
constexpr std::int64_t kHitTimedOps = std::int64_t{1} << 22;

// Key streams of the peer comparison: a cache of 2^18 entries (a realistic
// host tier: 2^18 x kCharge is 348 GB) over a universe of 4x that, so misses
// happen; each miss is followed by a put (get-or-insert). Smaller than the
// 10^6 of the get-hit runs so that the whole section fits its time budget.
constexpr std::size_t kStreamCapacity = std::size_t{1} << 18;
constexpr std::uint64_t kUniverse = 4 * kStreamCapacity;
constexpr std::size_t kStreamLen = std::size_t{1} << 21;
constexpr std::size_t kStreamWarm = kStreamLen / 2;  // ops before the timed window
constexpr std::int64_t kStreamTimed = static_cast<std::int64_t>(kStreamLen - kStreamWarm);

// Disjoint id ranges, so a key of one role never equals a key of another.
constexpr std::uint64_t kResidentBase = 0;
constexpr std::uint64_t kMissBase = std::uint64_t{1} << 40;
constexpr std::uint64_t kFreshBase = std::uint64_t{2} << 40;
constexpr std::uint64_t kUniverseBase = std::uint64_t{3} << 40;
constexpr std::uint64_t kTierBase = std::uint64_t{4} << 40;

// The splitmix64 output function: a bijection on 64 bits with good avalanche
// (Steele, Lea, Flood, "Fast splittable pseudorandom number generators",
// OOPSLA 2014). Python's reference_bench.py does not need it: it replays the
// dumped ranks.
constexpr std::uint64_t Mix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t Next() { return Mix64(state_++); }
  // Uniform in [0, n); the modulo bias is below 2^-40 for the n used here.
  std::uint64_t Below(std::uint64_t n) { return Next() % n; }
  // Uniform in (0, 1).
  double Unit() { return (static_cast<double>(Next() >> 11) + 0.5) * 0x1.0p-53; }

 private:
  std::uint64_t state_;
};

// Key `id`: four Mix64 words. Distinct ids give distinct first words, because
// Mix64 is a bijection and the inputs 4*id differ.
ContentKey KeyOf(std::uint64_t id) {
  ContentKey k;
  for (std::uint64_t j = 0; j < 4; ++j) {
    const std::uint64_t w = Mix64(id * 4 + j);
    std::memcpy(k.bytes.data() + 8 * j, &w, 8);
  }
  return k;
}

// Zipf over ranks 1..n, P(k) proportional to k^-s (s > 0, s != 1), by
// rejection-inversion: W. Hormann and G. Derflinger, "Rejection-inversion to
// generate variates from monotone discrete distributions", ACM TOMACS 6(3),
// 1996. O(1) expected per sample, no table.
class ZipfSampler {
 public:
  ZipfSampler(std::uint64_t n, double s) : n_(static_cast<double>(n)), s_(s) {
    h_x1_ = H(1.5) - 1.0;
    h_n_ = H(n_ + 0.5);
    squeeze_ = 2.0 - HInv(H(2.5) - std::pow(2.0, -s_));
  }
  std::uint64_t Sample(Rng& rng) const {
    for (;;) {
      const double u = h_n_ + rng.Unit() * (h_x1_ - h_n_);
      const double x = HInv(u);
      const double k = std::clamp(std::floor(x + 0.5), 1.0, n_);
      if (k - x <= squeeze_ || u >= H(k + 0.5) - std::pow(k, -s_)) return static_cast<std::uint64_t>(k);
    }
  }

 private:
  // H is an antiderivative of x^-s; HInv its inverse.
  double H(double x) const { return (std::pow(x, 1.0 - s_) - 1.0) / (1.0 - s_); }
  double HInv(double y) const { return std::pow(1.0 + y * (1.0 - s_), 1.0 / (1.0 - s_)); }
  double n_, s_, h_x1_, h_n_, squeeze_;
};

// Heap bytes in use (all arenas; includes mmapped chunks). Counts malloc and
// operator new alike, so it also sees leveldb/RocksDB's malloc'd handles.
std::size_t HeapInUse() {
  const struct mallinfo2 mi = mallinfo2();
  return mi.uordblks + mi.hblkhd;
}

// One distinct, empty Embedding per resident entry. Built once, before any
// heap measurement, and shared by every benchmark.
const std::vector<EmbeddingPtr>& ValuePool() {
  static const std::vector<EmbeddingPtr> pool = [] {
    std::vector<EmbeddingPtr> v;
    v.reserve(kResident);
    for (std::size_t i = 0; i < kResident; ++i) v.push_back(std::make_shared<const Embedding>());
    return v;
  }();
  return pool;
}

std::size_t NextPow2(std::size_t x) {
  std::size_t p = 1;
  while (p < x) p <<= 1;
  return p;
}

// Random keys among the n resident keys KeyOf(kResidentBase + [0, n)).
const std::vector<ContentKey>& HitStream(std::size_t n) {
  static std::map<std::size_t, std::vector<ContentKey>> streams;
  auto [it, inserted] = streams.try_emplace(n);
  if (inserted) {
    const std::size_t len = std::min<std::size_t>(std::size_t{1} << 21, NextPow2(16 * n));
    Rng rng(0x1234 + n);
    it->second.reserve(len);
    for (std::size_t i = 0; i < len; ++i) it->second.push_back(KeyOf(kResidentBase + rng.Below(n)));
  }
  return it->second;
}

// Keys never inserted anywhere.
const std::vector<ContentKey>& MissStream() {
  static const std::vector<ContentKey> keys = [] {
    std::vector<ContentKey> v;
    v.reserve(std::size_t{1} << 21);
    for (std::size_t i = 0; i < (std::size_t{1} << 21); ++i) v.push_back(KeyOf(kMissBase + Mix64(i)));
    return v;
  }();
  return keys;
}

enum class StreamKind { kZipf08 = 0, kZipf11 = 1, kUniform = 2 };
constexpr const char* kStreamNames[] = {"zipf0.8", "zipf1.1", "uniform"};

struct KeyStream {
  std::vector<std::uint32_t> ranks;  // 1..kUniverse
  std::vector<ContentKey> keys;      // KeyOf(kUniverseBase + rank)
};

std::vector<std::uint32_t> MakeRanks(StreamKind kind) {
  std::vector<std::uint32_t> ranks(kStreamLen);
  Rng rng(0xC0FFEE + static_cast<std::uint64_t>(kind));
  if (kind == StreamKind::kUniform) {
    for (auto& r : ranks) r = static_cast<std::uint32_t>(1 + rng.Below(kUniverse));
  } else {
    // Rank 1 is the most popular; KeyOf() scatters ranks over the key space.
    const ZipfSampler zipf(kUniverse, kind == StreamKind::kZipf08 ? 0.8 : 1.1);
    for (auto& r : ranks) r = static_cast<std::uint32_t>(zipf.Sample(rng));
  }
  return ranks;
}

const KeyStream& Stream(StreamKind kind) {
  static KeyStream streams[3];
  KeyStream& s = streams[static_cast<int>(kind)];
  if (s.keys.empty()) {
    s.ranks = MakeRanks(kind);
    s.keys.reserve(kStreamLen);
    for (std::uint32_t r : s.ranks) s.keys.push_back(KeyOf(kUniverseBase + r));
  }
  return s;
}

// ---------------------------------------------------------------------------
// Cache adaptors. Each has: kName, kThreadSafe, a constructor from (capacity
// bytes, expected entries), Get (null on a miss) and Put.

using EpdCache = EmbeddingCache<ContentKey, EmbeddingPtr, ContentKeyHash>;
using EpdConcurrentCache = ConcurrentEmbeddingCache<ContentKey, EmbeddingPtr, ContentKeyHash>;

class EpdLru {
 public:
  static constexpr const char* kName = "epd";
  static constexpr bool kThreadSafe = false;
  EpdLru(std::int64_t capacity, std::size_t) : c_(capacity) {}
  EmbeddingPtr Get(const ContentKey& k) {
    std::optional<EmbeddingPtr> v = c_.Get(k);
    return v ? std::move(*v) : EmbeddingPtr();
  }
  void Put(const ContentKey& k, const EmbeddingPtr& v, std::int64_t charge) { c_.Put(k, v, charge); }
  std::size_t BookkeepingBytes() const { return c_.bookkeeping_bytes(); }
  std::size_t Size() const { return c_.size(); }

 private:
  EpdCache c_;
};

// The header as it stood at eacf3f7, before GDSF (bench/baseline/): today's
// LRU get-hit must be no slower (issue 41).
class EpdLruEacf3f7 {
 public:
  static constexpr const char* kName = "epd_eacf3f7";
  static constexpr bool kThreadSafe = false;
  EpdLruEacf3f7(std::int64_t capacity, std::size_t) : c_(capacity) {}
  EmbeddingPtr Get(const ContentKey& k) {
    std::optional<EmbeddingPtr> v = c_.Get(k);
    return v ? std::move(*v) : EmbeddingPtr();
  }
  void Put(const ContentKey& k, const EmbeddingPtr& v, std::int64_t charge) { c_.Put(k, v, charge); }

 private:
  baseline_eacf3f7::EmbeddingCache<ContentKey, EmbeddingPtr, ContentKeyHash> c_;
};

// EmbeddingCache under GDSF or adaptive eviction (puts carry no measured
// cost, so GDSF ranks by frequency, then by touch).
template <EvictionPolicy P>
class EpdRanked {
 public:
  static constexpr const char* kName = P == EvictionPolicy::kGdsf ? "epd_gdsf" : "epd_adaptive";
  static constexpr bool kThreadSafe = false;
  EpdRanked(std::int64_t capacity, std::size_t) : c_(capacity, CacheOptions{P}) {}
  EmbeddingPtr Get(const ContentKey& k) {
    std::optional<EmbeddingPtr> v = c_.Get(k);
    return v ? std::move(*v) : EmbeddingPtr();
  }
  void Put(const ContentKey& k, const EmbeddingPtr& v, std::int64_t charge) { c_.Put(k, v, charge); }

 private:
  EpdCache c_;
};

// EmbeddingCache with a plain 8-byte value instead of a shared_ptr: the same
// lookup and recency work without the atomic reference count, to separate the
// cache's own cost from the cost of handing out shared ownership. Only in the
// get-hit benchmarks.
class EpdPlainValue {
 public:
  static constexpr const char* kName = "epd_u64value";
  static constexpr bool kThreadSafe = false;
  EpdPlainValue(std::int64_t capacity, std::size_t) : c_(capacity) {}
  std::uintptr_t Get(const ContentKey& k) {
    std::optional<std::uintptr_t> v = c_.Get(k);
    return v ? *v : 0;
  }
  void Put(const ContentKey& k, const EmbeddingPtr& v, std::int64_t charge) {
    c_.Put(k, reinterpret_cast<std::uintptr_t>(v.get()), charge);
  }

 private:
  EmbeddingCache<ContentKey, std::uintptr_t, ContentKeyHash> c_;
};

class EpdSharded {
 public:
  static constexpr const char* kName = "epd_sharded16";
  static constexpr bool kThreadSafe = true;
  EpdSharded(std::int64_t capacity, std::size_t) : c_(capacity, 16) {}
  EmbeddingPtr Get(const ContentKey& k) {
    std::optional<EmbeddingPtr> v = c_.Get(k);
    return v ? std::move(*v) : EmbeddingPtr();
  }
  void Put(const ContentKey& k, const EmbeddingPtr& v, std::int64_t charge) { c_.Put(k, v, charge); }

 private:
  EpdConcurrentCache c_;
};

// The textbook LRU: a hash map to nodes of a recency list.
class MapListLru {
 public:
  static constexpr const char* kName = "map_list";
  static constexpr bool kThreadSafe = false;
  MapListLru(std::int64_t capacity, std::size_t expected) : capacity_(capacity) { map_.reserve(expected); }
  EmbeddingPtr Get(const ContentKey& k) {
    auto it = map_.find(k);
    if (it == map_.end()) return nullptr;
    lru_.splice(lru_.begin(), lru_, it->second);
    return it->second->value;
  }
  void Put(const ContentKey& k, const EmbeddingPtr& v, std::int64_t charge) {
    if (charge > capacity_) return;
    auto it = map_.find(k);
    if (it != map_.end()) {
      used_ += charge - it->second->charge;
      it->second->value = v;
      it->second->charge = charge;
      lru_.splice(lru_.begin(), lru_, it->second);
    } else {
      lru_.push_front(Node{k, v, charge});
      map_.emplace(k, lru_.begin());
      used_ += charge;
    }
    while (used_ > capacity_) {
      used_ -= lru_.back().charge;
      map_.erase(lru_.back().key);
      lru_.pop_back();
    }
  }

 private:
  struct Node {
    ContentKey key;
    EmbeddingPtr value;
    std::int64_t charge;
  };
  std::int64_t capacity_;
  std::int64_t used_ = 0;
  std::list<Node> lru_;
  std::unordered_map<ContentKey, std::list<Node>::iterator, ContentKeyHash> map_;
};

#ifdef EPD_BENCH_HAVE_LEVELDB
// leveldb::NewLRUCache: 16 shards, each an LRU behind a mutex.
class LevelDbLru {
 public:
  static constexpr const char* kName = "leveldb_lru";
  static constexpr bool kThreadSafe = true;
  LevelDbLru(std::int64_t capacity, std::size_t) : c_(leveldb::NewLRUCache(static_cast<std::size_t>(capacity))) {}
  EmbeddingPtr Get(const ContentKey& k) {
    leveldb::Cache::Handle* h = c_->Lookup(Slice(k));
    if (h == nullptr) return nullptr;
    EmbeddingPtr v = *static_cast<const EmbeddingPtr*>(c_->Value(h));
    c_->Release(h);
    return v;
  }
  void Put(const ContentKey& k, const EmbeddingPtr& v, std::int64_t charge) {
    c_->Release(c_->Insert(Slice(k), new EmbeddingPtr(v), static_cast<std::size_t>(charge), &DeleteBox));
  }

 private:
  static leveldb::Slice Slice(const ContentKey& k) {
    return leveldb::Slice(reinterpret_cast<const char*>(k.bytes.data()), k.bytes.size());
  }
  static void DeleteBox(const leveldb::Slice&, void* v) { delete static_cast<EmbeddingPtr*>(v); }
  std::unique_ptr<leveldb::Cache> c_;
};
#endif

#ifdef EPD_BENCH_HAVE_ROCKSDB
void DeleteRocksBox(const rocksdb::Slice&, void* v) { delete static_cast<EmbeddingPtr*>(v); }

// Shared by both RocksDB caches; KeyBytes is 32 for LRUCache, 16 for
// HyperClockCache (its only supported key size).
template <std::size_t KeyBytes>
class RocksAdaptor {
 public:
  static constexpr bool kThreadSafe = true;
  EmbeddingPtr Get(const ContentKey& k) {
    rocksdb::Cache::Handle* h = c_->Lookup(Slice(k));
    if (h == nullptr) return nullptr;
    EmbeddingPtr v = *static_cast<const EmbeddingPtr*>(c_->Value(h));
    c_->Release(h);
    return v;
  }
  void Put(const ContentKey& k, const EmbeddingPtr& v, std::int64_t charge) {
    const rocksdb::Status st =
        c_->Insert(Slice(k), new EmbeddingPtr(v), static_cast<std::size_t>(charge), &DeleteRocksBox);
    if (!st.ok()) ++failed_inserts_;
  }
  std::uint64_t failed_inserts() const { return failed_inserts_; }

 protected:
  static rocksdb::Slice Slice(const ContentKey& k) {
    return rocksdb::Slice(reinterpret_cast<const char*>(k.bytes.data()), KeyBytes);
  }
  std::shared_ptr<rocksdb::Cache> c_;
  std::atomic<std::uint64_t> failed_inserts_{0};
};

// RocksDB LRUCache as a plain LRU: high_pri_pool_ratio 0 (the default 0.5 is
// midpoint insertion, a different policy), metadata not charged (so the same
// bytes hold the same entries as every other cache), 64 shards (automatic:
// at least 512 KiB each, at most 2^6).
class RocksLru : public RocksAdaptor<32> {
 public:
  static constexpr const char* kName = "rocksdb_lru";
  RocksLru(std::int64_t capacity, std::size_t) {
    rocksdb::LRUCacheOptions o(static_cast<std::size_t>(capacity), /*num_shard_bits=*/-1,
                               /*strict_capacity_limit=*/false, /*high_pri_pool_ratio=*/0.0);
    o.metadata_charge_policy = rocksdb::kDontChargeCacheMetadata;
    c_ = rocksdb::NewLRUCache(o);
  }
};

// RocksDB HyperClockCache (a lock-free CLOCK): not LRU, so its hit ratio is
// expected to differ.
class RocksHyperClock : public RocksAdaptor<16> {
 public:
  static constexpr const char* kName = "rocksdb_hcc";
  RocksHyperClock(std::int64_t capacity, std::size_t) {
    c_ = rocksdb::HyperClockCacheOptions(static_cast<std::size_t>(capacity), static_cast<std::size_t>(kCharge),
                                         /*num_shard_bits=*/-1, /*strict_capacity_limit=*/false,
                                         /*memory_allocator=*/nullptr, rocksdb::kDontChargeCacheMetadata)
             .MakeSharedCache();
  }
};
#endif

template <class C>
void Fill(C& c, std::size_t n) {
  const auto& pool = ValuePool();
  for (std::size_t i = 0; i < n; ++i) c.Put(KeyOf(kResidentBase + i), pool[i % pool.size()], kCharge);
}

template <class C>
std::uint64_t FailedInserts(const C& c) {
  if constexpr (requires { c.failed_inserts(); }) {
    return c.failed_inserts();
  } else {
    return 0;
  }
}

// Working set of EmbeddingCache at n entries in steady state (bookkeeping plus
// the keys and values held inline), recorded by BM_GetHit<EpdLru>, used to
// size the pointer-chase floor.
std::map<std::size_t, std::size_t>& EpdWorkingSet() {
  static std::map<std::size_t, std::size_t> ws;
  return ws;
}

std::size_t EpdWorkingSetBytes(std::size_t n) {
  auto& ws = EpdWorkingSet();
  if (auto it = ws.find(n); it != ws.end()) return it->second;
  EpdLru c(static_cast<std::int64_t>(n) * kCharge, n);
  Fill(c, n);
  const auto& keys = HitStream(n);
  for (std::size_t i = 0; i < 2 * n; ++i) benchmark::DoNotOptimize(c.Get(keys[i & (keys.size() - 1)]));
  return ws[n] = c.BookkeepingBytes() + n * (sizeof(ContentKey) + sizeof(EmbeddingPtr));
}

// ---------------------------------------------------------------------------
// A. Get-hit with n resident entries (capacity 1.25 n entries, so sharded
// peers hold every key too). Also reports heap bytes per entry, measured
// around the fill, and for EmbeddingCache its bookkeeping_bytes().
template <class C>
void BM_GetHit(benchmark::State& state) {
  const std::size_t n = static_cast<std::size_t>(state.range(0));
  ValuePool();
  const auto& keys = HitStream(n);
  const std::size_t mask = keys.size() - 1;
  const std::size_t heap0 = HeapInUse();
  auto c = std::make_unique<C>(static_cast<std::int64_t>(n + n / 4) * kCharge, n);
  Fill(*c, n);
  const double heap_fill = static_cast<double>(HeapInUse() - heap0);
  double bookkeeping_fill = 0;
  if constexpr (requires { c->BookkeepingBytes(); }) bookkeeping_fill = static_cast<double>(c->BookkeepingBytes());
  // Bring recency structures to steady state (EmbeddingCache's log reaches
  // its compaction bound after ~2n touches; the timed gets span two more).
  for (std::size_t i = 0; i < 2 * n; ++i) benchmark::DoNotOptimize(c->Get(keys[i & mask]));
  std::size_t i = 0;
  std::int64_t hits = 0;
  for (auto _ : state) {
    auto v = c->Get(keys[i++ & mask]);
    hits += static_cast<bool>(v);
    benchmark::DoNotOptimize(v);
  }
  const double heap_steady = static_cast<double>(HeapInUse() - heap0);
  const double dn = static_cast<double>(n);
  state.SetItemsProcessed(state.iterations());
  state.counters["hit_ratio"] = static_cast<double>(hits) / static_cast<double>(state.iterations());
  state.counters["heap_B_per_entry_fill"] = heap_fill / dn;
  state.counters["heap_B_per_entry_steady"] = heap_steady / dn;
  state.counters["failed_inserts"] = static_cast<double>(FailedInserts(*c));
  if constexpr (requires { c->BookkeepingBytes(); }) {
    state.counters["bookkeeping_B_per_entry_fill"] = bookkeeping_fill / dn;
    state.counters["bookkeeping_B_per_entry"] = static_cast<double>(c->BookkeepingBytes()) / dn;
    EpdWorkingSet()[n] = c->BookkeepingBytes() + n * (sizeof(ContentKey) + sizeof(EmbeddingPtr));
    state.counters["working_set_bytes"] = static_cast<double>(EpdWorkingSet()[n]);
  }
}

// Get-miss on EmbeddingCache with n resident entries.
void BM_EpdGetMiss(benchmark::State& state) {
  const std::size_t n = static_cast<std::size_t>(state.range(0));
  const auto& keys = MissStream();
  const std::size_t mask = keys.size() - 1;
  EpdLru c(static_cast<std::int64_t>(n) * kCharge, n);
  Fill(c, n);
  std::size_t i = 0;
  std::int64_t hits = 0;
  for (auto _ : state) {
    EmbeddingPtr v = c.Get(keys[i++ & mask]);
    hits += (v != nullptr);
    benchmark::DoNotOptimize(v);
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["hit_ratio"] = static_cast<double>(hits) / static_cast<double>(state.iterations());
}

// Put of a new key into a full EmbeddingCache of n entries: one eviction per
// put. The keys cycle over 2n ids in a fixed order, so each one was evicted
// n puts before it comes back.
void BM_EpdPutEvict(benchmark::State& state) {
  const std::size_t n = static_cast<std::size_t>(state.range(0));
  const auto& pool = ValuePool();
  std::vector<ContentKey> keys;
  keys.reserve(2 * n);
  for (std::size_t i = 0; i < 2 * n; ++i) keys.push_back(KeyOf(kFreshBase + i));
  EpdCache c(static_cast<std::int64_t>(n) * kCharge);
  for (std::size_t i = 0; i < n; ++i) c.Put(keys[i], pool[i % pool.size()], kCharge);
  std::size_t i = n;
  for (auto _ : state) {
    c.Put(keys[i], pool[i % pool.size()], kCharge);
    if (++i == keys.size()) i = 0;
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["evictions_per_put"] = static_cast<double>(c.evictions()) / static_cast<double>(state.iterations());
}

// ---------------------------------------------------------------------------
// Tiered promote and demote. Identity copies: L1 10^4 entries, L2 10^5.
// Memcpy copies (each copy allocates a new Embedding and copies its kCharge
// payload): L1 16 entries, L2 64, to bound memory at ~110 MB.
using Tiered = TieredEmbeddingCache<ContentKey, EmbeddingPtr, ContentKeyHash>;

Tiered::CopyFn MakeCopy(bool memcpy_copies) {
  if (memcpy_copies) return [](const EmbeddingPtr& v) -> EmbeddingPtr { return std::make_shared<const Embedding>(*v); };
  return [](const EmbeddingPtr& v) { return v; };
}

EmbeddingPtr PayloadValue() {
  auto e = std::make_shared<Embedding>();
  e->tokens = 324;
  e->hidden = 2048;
  e->dtype = DType::kBFloat16;
  e->main.assign(static_cast<std::size_t>(kCharge), std::byte{1});
  return e;
}

// A get that misses L1 and hits L2: one promotion (host->device copy) and the
// demotion of L1's LRU entry it causes (device->host copy). The keys cycle in
// insertion order, so the key asked for is always the globally oldest one,
// which lives in L2.
void BM_TieredPromote(benchmark::State& state, bool memcpy_copies) {
  const std::size_t n1 = memcpy_copies ? 16 : kHot, n2 = memcpy_copies ? 64 : 10 * kHot;
  const std::size_t total = n1 + n2;
  Tiered t(static_cast<std::int64_t>(n1) * kCharge, static_cast<std::int64_t>(n2) * kCharge, MakeCopy(memcpy_copies),
           MakeCopy(memcpy_copies));
  const auto& pool = ValuePool();
  const EmbeddingPtr payload = memcpy_copies ? PayloadValue() : nullptr;
  std::vector<ContentKey> keys;
  for (std::size_t i = 0; i < total; ++i) {
    keys.push_back(KeyOf(kTierBase + i));
    t.Put(keys.back(), memcpy_copies ? payload : pool[i], kCharge);
  }
  const std::uint64_t p0 = t.promotions(), d0 = t.demotions();
  std::size_t i = 0;
  for (auto _ : state) {
    std::optional<EmbeddingPtr> v = t.Get(keys[i]);
    benchmark::DoNotOptimize(v);
    if (++i == total) i = 0;
  }
  const double it = static_cast<double>(state.iterations());
  state.SetItemsProcessed(state.iterations());
  state.counters["promotions_per_op"] = static_cast<double>(t.promotions() - p0) / it;
  state.counters["demotions_per_op"] = static_cast<double>(t.demotions() - d0) / it;
  state.counters["l1_entries"] = static_cast<double>(n1);
  state.counters["l2_entries"] = static_cast<double>(n2);
}

// A put of a new key into a full L1: one demotion (device->host copy) into a
// full L2, which drops its own LRU entry.
void BM_TieredDemote(benchmark::State& state, bool memcpy_copies) {
  const std::size_t n1 = memcpy_copies ? 16 : kHot, n2 = memcpy_copies ? 64 : 10 * kHot;
  const std::size_t total = 2 * (n1 + n2);
  Tiered t(static_cast<std::int64_t>(n1) * kCharge, static_cast<std::int64_t>(n2) * kCharge, MakeCopy(memcpy_copies),
           MakeCopy(memcpy_copies));
  const auto& pool = ValuePool();
  const EmbeddingPtr payload = memcpy_copies ? PayloadValue() : nullptr;
  std::vector<ContentKey> keys;
  for (std::size_t i = 0; i < total; ++i) keys.push_back(KeyOf(kTierBase + kResident + i));
  for (std::size_t i = 0; i < n1 + n2; ++i) t.Put(keys[i], memcpy_copies ? payload : pool[i], kCharge);
  const std::uint64_t d0 = t.demotions();
  std::size_t i = n1 + n2;
  for (auto _ : state) {
    t.Put(keys[i], memcpy_copies ? payload : pool[i % pool.size()], kCharge);
    if (++i == total) i = 0;
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["demotions_per_op"] =
      static_cast<double>(t.demotions() - d0) / static_cast<double>(state.iterations());
}

// ---------------------------------------------------------------------------
// The pointer-chase floor: one dependent load per op over a buffer of the
// given size, one 64-byte line per element, visited in a random cyclic order
// (Sattolo's algorithm gives a single cycle through every line), so every
// load is a cache (and TLB) miss that cannot overlap with the next one.
void PointerChase(benchmark::State& state, std::size_t bytes) {
  struct alignas(64) Line {
    std::uint64_t next;
  };
  const std::size_t lines = std::max<std::size_t>(2, bytes / sizeof(Line));
  std::vector<Line> buf(lines);
  for (std::size_t i = 0; i < lines; ++i) buf[i].next = i;
  Rng rng(0x5A77010);
  for (std::size_t i = lines - 1; i > 0; --i) std::swap(buf[i].next, buf[rng.Below(i)].next);
  std::uint64_t idx = 0;
  for (std::size_t i = 0; i < std::min<std::size_t>(lines, 1 << 20); ++i) idx = buf[idx].next;
  for (auto _ : state) {
    idx = buf[idx].next;
    benchmark::DoNotOptimize(idx);
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["buffer_bytes"] = static_cast<double>(lines * sizeof(Line));
}

// ---------------------------------------------------------------------------
// 1 vs 2 threads on ConcurrentEmbeddingCache (16 shards), get-hit at 10^6.
EpdConcurrentCache* g_concurrent = nullptr;

void BM_ConcurrentGetHit(benchmark::State& state) {
  const auto& keys = HitStream(kResident);
  const std::size_t mask = keys.size() - 1;
  if (state.thread_index() == 0) {
    // 1.25x the entries' bytes, as in BM_GetHit, so no shard overflows.
    g_concurrent = new EpdConcurrentCache(static_cast<std::int64_t>(kResident + kResident / 4) * kCharge, 16);
    const auto& pool = ValuePool();
    for (std::size_t i = 0; i < kResident; ++i) g_concurrent->Put(KeyOf(kResidentBase + i), pool[i], kCharge);
  }
  // Each thread walks its own part of the stream.
  std::size_t i = static_cast<std::size_t>(state.thread_index()) * (keys.size() / 2);
  std::int64_t hits = 0;
  for (auto _ : state) {
    std::optional<EmbeddingPtr> v = g_concurrent->Get(keys[i++ & mask]);
    hits += v.has_value();
    benchmark::DoNotOptimize(v);
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["hits"] = static_cast<double>(hits);
  if (state.thread_index() == 0) {
    delete g_concurrent;
    g_concurrent = nullptr;
  }
}

// ---------------------------------------------------------------------------
// B. Get-or-insert over a key stream: warm with the first half of the stream
// (untimed), then time the second half. With T threads, thread t takes ops
// kStreamWarm + t, + t + T, ... so together they replay the same window.
template <class C>
C*& SharedStreamCache() {
  static C* c = nullptr;
  return c;
}

template <class C>
bool GetOrInsert(C& c, const KeyStream& s, std::size_t i) {
  EmbeddingPtr v = c.Get(s.keys[i]);
  if (v != nullptr) {
    benchmark::DoNotOptimize(v);
    return true;
  }
  const auto& pool = ValuePool();
  c.Put(s.keys[i], pool[s.ranks[i] % pool.size()], kCharge);
  return false;
}

template <class C>
void BM_Stream(benchmark::State& state, StreamKind kind) {
  const KeyStream& s = Stream(kind);
  ValuePool();
  C*& c = SharedStreamCache<C>();
  if (state.thread_index() == 0) {
    c = new C(static_cast<std::int64_t>(kStreamCapacity) * kCharge, kStreamCapacity);
    for (std::size_t i = 0; i < kStreamWarm; ++i) GetOrInsert(*c, s, i);
  }
  const std::size_t step = static_cast<std::size_t>(state.threads());
  const std::size_t first = kStreamWarm + static_cast<std::size_t>(state.thread_index());
  std::size_t i = first;
  std::int64_t hits = 0;
  for (auto _ : state) {
    hits += GetOrInsert(*c, s, i);
    i += step;
    if (i >= kStreamLen) i = first;
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["hits"] = static_cast<double>(hits);
  state.counters["lookups"] = static_cast<double>(state.iterations());
  state.counters["hit_ratio"] = benchmark::Counter(static_cast<double>(hits) / static_cast<double>(state.iterations()),
                                                   benchmark::Counter::kAvgThreads);
  if (state.thread_index() == 0) {
    state.counters["failed_inserts"] = static_cast<double>(FailedInserts(*c));
    delete c;
    c = nullptr;
  }
}

// ---------------------------------------------------------------------------
template <class C>
void RegisterPeer() {
  const std::string name = C::kName;
  benchmark::RegisterBenchmark(("hit/" + name).c_str(), BM_GetHit<C>)->Arg(kResident)->Iterations(kHitTimedOps);
  benchmark::RegisterBenchmark(("hit/" + name).c_str(), BM_GetHit<C>)->Arg(kHot)->MinTime(0.3);
  for (int k = 0; k < 3; ++k) {
    const auto kind = static_cast<StreamKind>(k);
    const std::string sname = std::string("stream/") + kStreamNames[k] + "/" + name;
    benchmark::RegisterBenchmark(sname.c_str(), BM_Stream<C>, kind)->Iterations(kStreamTimed);
    if constexpr (C::kThreadSafe) {
      benchmark::RegisterBenchmark(sname.c_str(), BM_Stream<C>, kind)
          ->Iterations(kStreamTimed / 2)
          ->Threads(2)
          ->UseRealTime();
    }
  }
}

void RegisterAll() {
  // Ours first: the floor needs the working set that hit/epd/1000000 records.
  RegisterPeer<EpdLru>();
  benchmark::RegisterBenchmark("miss/epd", BM_EpdGetMiss)->Arg(kResident)->Iterations(kHitTimedOps);
  benchmark::RegisterBenchmark("put_evict/epd", BM_EpdPutEvict)->Arg(kResident)->Iterations(kHitTimedOps);
  benchmark::RegisterBenchmark("floor/ws_1e6", [](benchmark::State& s) {
    PointerChase(s, EpdWorkingSetBytes(kResident));
  })->Iterations(kHitTimedOps);
  benchmark::RegisterBenchmark("floor/ws_1e4", [](benchmark::State& s) {
    PointerChase(s, EpdWorkingSetBytes(kHot));
  })->MinTime(0.3);
  benchmark::RegisterBenchmark("floor/64MiB", [](benchmark::State& s) {
    PointerChase(s, 64 << 20);
  })->Iterations(kHitTimedOps);
  benchmark::RegisterBenchmark("floor/256MiB", [](benchmark::State& s) {
    PointerChase(s, 256 << 20);
  })->Iterations(kHitTimedOps);
  benchmark::RegisterBenchmark("concurrent_hit/epd_sharded16", BM_ConcurrentGetHit)
      ->Iterations(kHitTimedOps / 2)
      ->Threads(1)
      ->UseRealTime();
  benchmark::RegisterBenchmark("concurrent_hit/epd_sharded16", BM_ConcurrentGetHit)
      ->Iterations(kHitTimedOps / 2)
      ->Threads(2)
      ->UseRealTime();
  benchmark::RegisterBenchmark("tiered_promote/identity", BM_TieredPromote, false)->MinTime(0.3);
  benchmark::RegisterBenchmark("tiered_demote/identity", BM_TieredDemote, false)->MinTime(0.3);
  benchmark::RegisterBenchmark("tiered_promote/memcpy", BM_TieredPromote, true)->MinTime(0.3);
  benchmark::RegisterBenchmark("tiered_demote/memcpy", BM_TieredDemote, true)->MinTime(0.3);

  benchmark::RegisterBenchmark("hit/epd_eacf3f7", BM_GetHit<EpdLruEacf3f7>)->Arg(kResident)->Iterations(kHitTimedOps);
  benchmark::RegisterBenchmark("hit/epd_eacf3f7", BM_GetHit<EpdLruEacf3f7>)->Arg(kHot)->MinTime(0.3);
  RegisterPeer<EpdRanked<EvictionPolicy::kGdsf>>();
  RegisterPeer<EpdRanked<EvictionPolicy::kAdaptive>>();
  benchmark::RegisterBenchmark("hit/epd_u64value", BM_GetHit<EpdPlainValue>)->Arg(kResident)->Iterations(kHitTimedOps);
  benchmark::RegisterBenchmark("hit/epd_u64value", BM_GetHit<EpdPlainValue>)->Arg(kHot)->MinTime(0.3);
  RegisterPeer<EpdSharded>();
  RegisterPeer<MapListLru>();
#ifdef EPD_BENCH_HAVE_LEVELDB
  RegisterPeer<LevelDbLru>();
#endif
#ifdef EPD_BENCH_HAVE_ROCKSDB
  RegisterPeer<RocksLru>();
  RegisterPeer<RocksHyperClock>();
#endif
}

int DumpStreams(const std::string& dir) {
  std::string meta = "{\n  \"universe\": " + std::to_string(kUniverse) +
                     ",\n  \"capacity_entries\": " + std::to_string(kStreamCapacity) +
                     ",\n  \"charge\": " + std::to_string(kCharge) + ",\n  \"length\": " + std::to_string(kStreamLen) +
                     ",\n  \"warm\": " + std::to_string(kStreamWarm) +
                     ",\n  \"format\": \"little-endian uint32 ranks, 1-based\",\n  \"streams\": {";
  for (int k = 0; k < 3; ++k) {
    const std::vector<std::uint32_t> ranks = MakeRanks(static_cast<StreamKind>(k));
    const std::string file = std::string(kStreamNames[k]) + ".u32";
    std::ofstream out(std::filesystem::path(dir) / file, std::ios::binary);
    out.write(reinterpret_cast<const char*>(ranks.data()),
              static_cast<std::streamsize>(ranks.size() * sizeof(std::uint32_t)));
    if (!out) {
      std::fprintf(stderr, "cache_bench: cannot write %s/%s\n", dir.c_str(), file.c_str());
      return 1;
    }
    meta += std::string(k ? "," : "") + "\n    \"" + kStreamNames[k] + "\": \"" + file + "\"";
  }
  meta += "\n  }\n}\n";
  std::ofstream(dir + "/streams.json") << meta;
  return 0;
}

}  // namespace
}  // namespace epd::bench

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--dump_streams=", 0) == 0) return epd::bench::DumpStreams(arg.substr(15));
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("key_bytes", "32 (rocksdb_hcc: first 16)");
  benchmark::AddCustomContext("charge_bytes", std::to_string(epd::bench::kCharge));
  benchmark::AddCustomContext("stream_universe", std::to_string(epd::bench::kUniverse));
  benchmark::AddCustomContext("stream_capacity_entries", std::to_string(epd::bench::kStreamCapacity));
  benchmark::AddCustomContext("stream_ops", std::to_string(epd::bench::kStreamLen));
  epd::bench::RegisterAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
