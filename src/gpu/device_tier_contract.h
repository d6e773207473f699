// The tier contract every Device must satisfy, as one value-parameterised
// suite: device_tier_test.cc runs it on FakeDevice (immediate and background
// completion), cuda_device_test.cc on a real GPU. Include it from exactly one
// test file per binary and INSTANTIATE_TEST_SUITE_P(..., DeviceTierContract, ...).
//
// Every expected value is derived here from the tiering rules
// (epd/core/tiered_cache.h) and the sizes chosen, not read back from the code.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "epd/core/tiered_cache.h"
#include "epd/gpu/device.h"
#include "epd/gpu/device_tier.h"
#include "epd/gpu/host_memory_pool.h"
#include "epd/media/content_key.h"
#include "tier_test_util.h"

namespace epd {

// Opens a device with at most `device_bytes` of device memory and a pinned
// pool of `pinned_bytes`; nullptr with *why set when none can be opened
// (the test then skips).
struct DeviceFactory {
  std::string name;
  std::function<std::unique_ptr<Device>(std::size_t device_bytes, std::size_t pinned_bytes, std::string* why)> open;
};

// Keeps gtest from printing the std::function's bytes.
inline void PrintTo(const DeviceFactory& f, std::ostream* os) { *os << f.name; }

inline std::string DeviceFactoryName(const ::testing::TestParamInfo<DeviceFactory>& info) { return info.param.name; }

using GpuCache = TieredEmbeddingCache<ContentKey, TierEmbeddingPtr, ContentKeyHash>;

inline ContentKey KeyOf(std::uint64_t id) {
  ContentKey k;
  for (int i = 0; i < 8; ++i) k.bytes[i] = static_cast<std::uint8_t>(id >> (8 * i));
  k.bytes[31] = 0x5a;  // not all-zero, so key 0 is not the default key
  return k;
}

inline std::size_t RoundToPool(std::size_t bytes) {
  const std::size_t a = HostMemoryPool::kAlignment;
  return (bytes + a - 1) / a * a;
}

class DeviceTierContract : public ::testing::TestWithParam<DeviceFactory> {
 protected:
  // 16 tokens x 64 hidden x float32, 1 deepstack layer: 4096 + 4096 bytes.
  static constexpr std::int64_t kEntryBytes = 8192;
  static constexpr std::size_t kMiB = std::size_t{1} << 20;

  std::unique_ptr<Device> Open(std::size_t device_bytes, std::size_t pinned_bytes) {
    std::string why;
    std::unique_ptr<Device> dev = GetParam().open(device_bytes, pinned_bytes, &why);
    if (dev == nullptr) skip_reason_ = why;
    return dev;
  }
  static TierEmbeddingPtr Upload(Device& dev, std::uint64_t seed, MemoryKind where = MemoryKind::kDevice) {
    StatusOr<TierEmbeddingPtr> v = UploadEmbedding(dev, testing_util::MakeEmbedding(seed), where);
    EXPECT_TRUE(v.ok()) << v.status().ToString();
    return v.ok() ? *v : nullptr;
  }
  static ::testing::AssertionResult Holds(const TierEmbeddingPtr& v, std::uint64_t seed) {
    if (v == nullptr) return ::testing::AssertionFailure() << "null entry";
    StatusOr<Embedding> host = v->ToHostEmbedding();
    if (!host.ok()) return ::testing::AssertionFailure() << host.status().ToString();
    return testing_util::SameAsSeed(*host, seed);
  }
  // Lands everything and runs the deferred frees.
  static void Settle(Device& dev) {
    ASSERT_TRUE(dev.Synchronize(Stream::kOnboard).ok());
    ASSERT_TRUE(dev.Synchronize(Stream::kOffload).ok());
    EXPECT_EQ(dev.Poll(), 0u);
  }

  std::string skip_reason_;
};

#define EPD_OPEN_OR_SKIP(var, device_bytes, pinned_bytes)         \
  std::unique_ptr<Device> var = Open(device_bytes, pinned_bytes); \
  if (var == nullptr) GTEST_SKIP() << skip_reason_

TEST_P(DeviceTierContract, UploadThenShipIsByteExactInBothMemories) {
  EPD_OPEN_OR_SKIP(dev, 16 * kMiB, 16 * kMiB);
  const EmbeddingPtr bf16 = testing_util::MakeEmbedding(11, 37, 24, 2, DType::kBFloat16);
  for (MemoryKind where : {MemoryKind::kDevice, MemoryKind::kPinnedHost}) {
    StatusOr<TierEmbeddingPtr> v = UploadEmbedding(*dev, bf16, where);
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    EXPECT_EQ((*v)->where(), where);
    EXPECT_EQ((*v)->nbytes(), 37u * 24 * 3 * 2);
    ASSERT_TRUE((*v)->Wait().ok());
    EXPECT_TRUE((*v)->ready());
    StatusOr<Embedding> host = (*v)->ToHostEmbedding();
    ASSERT_TRUE(host.ok()) << host.status().ToString();
    EXPECT_EQ(host->tokens, 37);
    EXPECT_EQ(host->hidden, 24);
    EXPECT_EQ(host->deepstack_layers, 2);
    EXPECT_EQ(host->dtype, DType::kBFloat16);
    EXPECT_TRUE(testing_util::SameAsSeed(*host, 11));
  }
}

TEST_P(DeviceTierContract, OffloadThenOnboardRoundTripsByteExact) {
  EPD_OPEN_OR_SKIP(dev, 16 * kMiB, 16 * kMiB);
  TierEmbeddingPtr l1 = Upload(*dev, 5);
  StatusOr<TierEmbeddingPtr> l2 = OffloadEmbedding(*dev, l1);
  ASSERT_TRUE(l2.ok()) << l2.status().ToString();
  EXPECT_EQ((*l2)->where(), MemoryKind::kPinnedHost);
  l1.reset();  // the device may free the VRAM once the offload has landed
  EXPECT_TRUE(Holds(*l2, 5));
  StatusOr<TierEmbeddingPtr> back = OnboardEmbedding(*dev, *l2);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ((*back)->where(), MemoryKind::kDevice);
  l2 = TierEmbeddingPtr();
  EXPECT_TRUE(Holds(*back, 5));
}

TEST_P(DeviceTierContract, EmptyEmbeddingRoundTrips) {
  EPD_OPEN_OR_SKIP(dev, 16 * kMiB, 16 * kMiB);
  StatusOr<TierEmbeddingPtr> l1 = UploadEmbedding(*dev, testing_util::MakeEmbedding(3, 0, 64, 2));
  ASSERT_TRUE(l1.ok()) << l1.status().ToString();
  EXPECT_EQ((*l1)->nbytes(), 0u);
  StatusOr<TierEmbeddingPtr> l2 = OffloadEmbedding(*dev, *l1);
  ASSERT_TRUE(l2.ok()) << l2.status().ToString();
  StatusOr<Embedding> host = (*l2)->ToHostEmbedding();
  ASSERT_TRUE(host.ok());
  EXPECT_EQ(host->tokens, 0);
  EXPECT_EQ(host->hidden, 64);
  EXPECT_TRUE(host->main.empty());
}

TEST_P(DeviceTierContract, BadInputIsInvalidArgument) {
  EPD_OPEN_OR_SKIP(dev, 16 * kMiB, 16 * kMiB);
  EXPECT_EQ(UploadEmbedding(*dev, nullptr).status().code(), StatusCode::kInvalidArgument);
  auto lying = std::make_shared<Embedding>(*testing_util::MakeEmbedding(1));
  lying->tokens = 17;  // bytes are for 16 tokens
  Status st = UploadEmbedding(*dev, lying).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("do not match"), std::string::npos) << st.message();
  EXPECT_EQ(OffloadEmbedding(*dev, nullptr).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(OnboardEmbedding(*dev, nullptr).status().code(), StatusCode::kInvalidArgument);
}

// Five equal entries through L1 = 2 entries, L2 = 3 entries, then every key
// read back: each read is an L2 hit that promotes it and demotes L1's LRU.
TEST_P(DeviceTierContract, TieredCacheDemotesAndPromotesByteExact) {
  EPD_OPEN_OR_SKIP(dev, 16 * kMiB, 16 * kMiB);
  DeviceTierStats stats;
  GpuCache cache(2 * kEntryBytes, 3 * kEntryBytes, MakeOffloadFn(*dev, &stats), MakeOnboardFn(*dev, &stats));
  for (std::uint64_t k = 0; k < 5; ++k) {
    TierEmbeddingPtr v = Upload(*dev, 100 + k);
    ASSERT_EQ(v->nbytes(), static_cast<std::size_t>(kEntryBytes));
    cache.Put(KeyOf(k), v, kEntryBytes);
  }
  // L1 [k3 k4], L2 [k0 k1 k2].
  EXPECT_EQ(cache.demotions(), 3u);
  EXPECT_EQ(stats.offloads, 3u);
  EXPECT_EQ(stats.offload_bytes, 3u * kEntryBytes);
  for (std::uint64_t k = 0; k < 3; ++k) EXPECT_TRUE(cache.l2().Contains(KeyOf(k))) << k;
  for (std::uint64_t k = 0; k < 5; ++k) {
    CacheTier tier;
    std::optional<TierEmbeddingPtr> v = cache.Get(KeyOf(k), &tier);
    ASSERT_TRUE(v.has_value()) << k;
    EXPECT_EQ(tier, CacheTier::kL2) << k;
    EXPECT_EQ((*v)->where(), MemoryKind::kDevice) << k;
    EXPECT_TRUE(Holds(*v, 100 + k)) << k;
  }
  // Each of the 5 reads promoted one entry and demoted one.
  EXPECT_EQ(cache.promotions(), 5u);
  EXPECT_EQ(cache.demotions(), 8u);
  EXPECT_EQ(cache.l2_hits(), 5u);
  EXPECT_EQ(cache.misses(), 0u);
  EXPECT_EQ(stats.onboards, 5u);
  EXPECT_EQ(stats.onboard_bytes, 5u * kEntryBytes);
  EXPECT_EQ(stats.offloads, 8u);
  EXPECT_EQ(stats.offload_dropped, 0u);
  // L1 [k3 k4] again and L2 [k0 k1 k2]; every one still exact.
  for (std::uint64_t k = 0; k < 5; ++k) {
    CacheTier tier;
    std::optional<TierEmbeddingPtr> v = cache.Get(KeyOf(k), &tier);
    ASSERT_TRUE(v.has_value());
    EXPECT_TRUE(Holds(*v, 100 + k)) << k;
  }
}

// The pinned pool holds exactly one entry: the second demotion finds no
// block and is dropped as if L2 were too small; nothing else changes.
TEST_P(DeviceTierContract, PinnedPoolExhaustionDropsTheDemotion) {
  EPD_OPEN_OR_SKIP(dev, 16 * kMiB, RoundToPool(kEntryBytes));
  DeviceTierStats stats;
  GpuCache cache(kEntryBytes, 4 * kEntryBytes, MakeOffloadFn(*dev, &stats), MakeOnboardFn(*dev, &stats));
  cache.Put(KeyOf(0), Upload(*dev, 200), kEntryBytes);
  cache.Put(KeyOf(1), Upload(*dev, 201), kEntryBytes);  // demotes k0: takes the whole pool
  cache.Put(KeyOf(2), Upload(*dev, 202), kEntryBytes);  // demotes k1: no block
  EXPECT_EQ(cache.demotions(), 1u);
  EXPECT_EQ(stats.offloads, 1u);
  EXPECT_EQ(stats.offload_dropped, 1u);
  EXPECT_TRUE(cache.l2().Contains(KeyOf(0)));
  EXPECT_FALSE(cache.Contains(KeyOf(1)));
  EXPECT_EQ(dev->memory_stats().pinned_alloc_failures, 1u);
  EXPECT_FALSE(cache.Get(KeyOf(1)).has_value());
  EXPECT_EQ(cache.misses(), 1u);
  // Promoting k0 demotes k2 while k0's pinned block is still the source of
  // the onboard: the pool is still full, so k2 is dropped too.
  std::optional<TierEmbeddingPtr> k0 = cache.Get(KeyOf(0));
  ASSERT_TRUE(k0.has_value());
  EXPECT_TRUE(Holds(*k0, 200));
  EXPECT_EQ(stats.offload_dropped, 2u);
  EXPECT_FALSE(cache.Contains(KeyOf(2)));
  // Once the onboard has landed, the block is free again for the next demotion.
  Settle(*dev);
  cache.Put(KeyOf(3), Upload(*dev, 203), kEntryBytes);  // demotes k0
  EXPECT_EQ(stats.offloads, 2u);
  EXPECT_TRUE(cache.l2().Contains(KeyOf(0)));
  std::optional<TierEmbeddingPtr> again = cache.Get(KeyOf(0));
  ASSERT_TRUE(again.has_value());
  EXPECT_TRUE(Holds(*again, 200));
}

// Device memory too small for any entry: entries are uploaded to pinned
// memory, and a promotion that cannot get VRAM serves the pinned copy.
TEST_P(DeviceTierContract, OnboardWithoutDeviceMemoryServesPinnedCopy) {
  EPD_OPEN_OR_SKIP(dev, 1, 16 * kMiB);
  EXPECT_EQ(UploadEmbedding(*dev, testing_util::MakeEmbedding(1)).status().code(), StatusCode::kResourceExhausted);
  DeviceTierStats stats;
  GpuCache cache(kEntryBytes, 4 * kEntryBytes, MakeOffloadFn(*dev, &stats), MakeOnboardFn(*dev, &stats));
  cache.Put(KeyOf(0), Upload(*dev, 300, MemoryKind::kPinnedHost), kEntryBytes);
  cache.Put(KeyOf(1), Upload(*dev, 301, MemoryKind::kPinnedHost), kEntryBytes);  // demotes k0, no copy
  EXPECT_EQ(cache.demotions(), 1u);
  EXPECT_EQ(stats.offloads, 0u);  // already in host memory
  std::optional<TierEmbeddingPtr> k0 = cache.Get(KeyOf(0));
  ASSERT_TRUE(k0.has_value());
  EXPECT_EQ((*k0)->where(), MemoryKind::kPinnedHost);
  EXPECT_EQ(stats.onboard_fallbacks, 1u);
  EXPECT_EQ(stats.onboards, 0u);
  EXPECT_EQ(cache.promotions(), 1u);
  EXPECT_TRUE(Holds(*k0, 300));
}

// One thread owns the cache and hands every value it delivers to two reader
// threads, which ship it (ToHostEmbedding) and compare bytes, and drop it
// there, so entries are freed on reader threads while copies are in flight.
TEST_P(DeviceTierContract, ConcurrentReadersSeeExactBytesUnderChurn) {
  EPD_OPEN_OR_SKIP(dev, 64 * kMiB, 64 * kMiB);
  constexpr std::uint64_t kKeys = 48;
  constexpr int kOps = 3000;
  struct Delivery {
    std::uint64_t key;
    TierEmbeddingPtr value;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Delivery> queue;
  bool done = false;
  std::atomic<int> checked{0}, wrong{0};
  auto reader = [&] {
    for (;;) {
      Delivery d;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return done || !queue.empty(); });
        if (queue.empty()) return;
        d = std::move(queue.front());
        queue.pop_front();
      }
      if (!Holds(d.value, 1000 + d.key)) ++wrong;
      ++checked;
    }
  };
  std::thread r1(reader), r2(reader);
  std::uint64_t delivered = 0, promotions = 0, demotions = 0;
  {
    DeviceTierStats stats;
    GpuCache cache(6 * kEntryBytes, 18 * kEntryBytes, MakeOffloadFn(*dev, &stats), MakeOnboardFn(*dev, &stats));
    std::mt19937_64 rng(20240917);
    for (int op = 0; op < kOps; ++op) {
      const std::uint64_t k = rng() % kKeys;
      std::optional<TierEmbeddingPtr> v = cache.Get(KeyOf(k));
      if (!v.has_value()) {
        TierEmbeddingPtr fresh = Upload(*dev, 1000 + k);
        if (fresh == nullptr) break;  // already reported; the readers must still be joined
        cache.Put(KeyOf(k), fresh, kEntryBytes);
        v = fresh;
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        queue.push_back({k, *v});
      }
      cv.notify_one();
      ++delivered;
    }
    promotions = cache.promotions();
    demotions = cache.demotions();
    EXPECT_EQ(stats.offload_dropped, 0u);
    EXPECT_EQ(stats.onboard_fallbacks, 0u);
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    done = true;
  }
  cv.notify_all();
  r1.join();
  r2.join();
  EXPECT_EQ(checked.load(), kOps);
  EXPECT_EQ(wrong.load(), 0);
  // 48 keys over 24 entries of room: the workload must exercise both moves.
  EXPECT_GT(promotions, 0u);
  EXPECT_GT(demotions, 0u);
  Settle(*dev);
  const DeviceMemoryStats m = dev->memory_stats();
  EXPECT_EQ(m.device_bytes_in_use, 0u);
  EXPECT_EQ(m.pinned_bytes_in_use, 0u);
}

TEST_P(DeviceTierContract, AllMemoryReturnsOnceTheCacheIsGone) {
  EPD_OPEN_OR_SKIP(dev, 16 * kMiB, 16 * kMiB);
  {
    GpuCache cache(2 * kEntryBytes, 2 * kEntryBytes, MakeOffloadFn(*dev), MakeOnboardFn(*dev));
    for (std::uint64_t k = 0; k < 4; ++k) cache.Put(KeyOf(k), Upload(*dev, k), kEntryBytes);
    const DeviceMemoryStats m = dev->memory_stats();
    // L1 holds two entries' VRAM (plus victims whose offload may not have
    // landed); L2 two pinned blocks.
    EXPECT_GE(m.device_bytes_in_use, 2u * kEntryBytes);
    EXPECT_EQ(m.pinned_bytes_in_use, 2 * RoundToPool(kEntryBytes));
  }
  Settle(*dev);
  const DeviceMemoryStats m = dev->memory_stats();
  EXPECT_EQ(m.device_bytes_in_use, 0u);
  EXPECT_EQ(m.pinned_bytes_in_use, 0u);
  EXPECT_EQ(m.pending_releases, 0u);
}

#undef EPD_OPEN_OR_SKIP

}  // namespace epd
