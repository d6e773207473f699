// HostMemoryPool: rounding, best fit, coalescing, fragmentation and misuse,
// plus a randomised run checked against an independent model of the arena.
#include "epd/gpu/host_memory_pool.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <vector>

namespace epd {
namespace {

constexpr std::size_t kA = HostMemoryPool::kAlignment;

struct Arena {
  explicit Arena(std::size_t bytes) : base(static_cast<std::byte*>(std::aligned_alloc(kA, bytes))) {}
  ~Arena() { std::free(base); }
  std::byte* base;
};

TEST(HostMemoryPoolTest, RoundsRequestsUpToTheAlignment) {
  Arena arena(16 * kA);
  HostMemoryPool pool(arena.base, 16 * kA);
  std::byte* a = pool.Allocate(1);
  std::byte* b = pool.Allocate(kA + 1);
  std::byte* c = pool.Allocate(0);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(pool.BlockSize(a), kA);
  EXPECT_EQ(pool.BlockSize(b), 2 * kA);
  EXPECT_EQ(pool.BlockSize(c), kA);  // zero bytes still get a distinct block
  EXPECT_NE(a, c);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b) % kA, 0u);
  EXPECT_EQ(pool.stats().bytes_in_use, 4 * kA);
  EXPECT_EQ(pool.stats().live_blocks, 3u);
}

TEST(HostMemoryPoolTest, FillsTheArenaExactlyThenFails) {
  Arena arena(4 * kA);
  HostMemoryPool pool(arena.base, 4 * kA);
  std::vector<std::byte*> blocks;
  blocks.reserve(4);
  for (int i = 0; i < 4; ++i) blocks.push_back(pool.Allocate(kA));
  for (std::byte* p : blocks) ASSERT_NE(p, nullptr);
  EXPECT_EQ(pool.Allocate(1), nullptr);
  EXPECT_EQ(pool.stats().failed_allocations, 1u);
  EXPECT_EQ(pool.stats().largest_free_block, 0u);
  EXPECT_TRUE(pool.Free(blocks[2]));
  EXPECT_EQ(pool.Allocate(kA), blocks[2]);  // the freed block is reused
}

TEST(HostMemoryPoolTest, BestFitTakesTheSmallestBlockThatFits) {
  Arena arena(16 * kA);
  HostMemoryPool pool(arena.base, 16 * kA);
  // Layout: [a:4][b:1][c:2][d:1][rest:8]; free a and c -> free blocks of 4, 2, 8.
  std::byte* a = pool.Allocate(4 * kA);
  std::byte* b = pool.Allocate(kA);
  std::byte* c = pool.Allocate(2 * kA);
  std::byte* d = pool.Allocate(kA);
  ASSERT_TRUE(a && b && c && d);
  ASSERT_TRUE(pool.Free(a));
  ASSERT_TRUE(pool.Free(c));
  EXPECT_EQ(pool.stats().free_blocks, 3u);
  // 2 units fit in the 4-, 2- and 8-unit blocks: best fit picks c's.
  EXPECT_EQ(pool.Allocate(2 * kA), c);
  // 3 units fit in the 4- and 8-unit blocks: a's, which is smaller.
  EXPECT_EQ(pool.Allocate(3 * kA), a);
}

TEST(HostMemoryPoolTest, FreeCoalescesWithBothNeighbours) {
  Arena arena(3 * kA);
  HostMemoryPool pool(arena.base, 3 * kA);
  std::byte* a = pool.Allocate(kA);
  std::byte* b = pool.Allocate(kA);
  std::byte* c = pool.Allocate(kA);
  ASSERT_TRUE(pool.Free(a));
  ASSERT_TRUE(pool.Free(c));
  EXPECT_EQ(pool.stats().free_blocks, 2u);
  EXPECT_EQ(pool.Allocate(2 * kA), nullptr);  // 2 units free, but not adjacent
  ASSERT_TRUE(pool.Free(b));
  EXPECT_EQ(pool.stats().free_blocks, 1u);
  EXPECT_EQ(pool.stats().largest_free_block, 3 * kA);
  EXPECT_EQ(pool.Allocate(3 * kA), a);
}

// The documented failure mode: enough bytes free in total, no block large enough.
TEST(HostMemoryPoolTest, FragmentedPoolFailsAlthoughBytesAreFree) {
  Arena arena(4 * kA);
  HostMemoryPool pool(arena.base, 4 * kA);
  std::byte* p[4];
  for (auto& x : p) x = pool.Allocate(kA);
  ASSERT_TRUE(pool.Free(p[0]));
  ASSERT_TRUE(pool.Free(p[2]));
  const HostMemoryPoolStats s = pool.stats();
  EXPECT_EQ(s.capacity_bytes - s.bytes_in_use, 2 * kA);
  EXPECT_EQ(s.largest_free_block, kA);
  EXPECT_EQ(pool.Allocate(2 * kA), nullptr);
  EXPECT_EQ(pool.stats().failed_allocations, 1u);
}

TEST(HostMemoryPoolTest, RejectsForeignAndDoubleFrees) {
  Arena arena(4 * kA);
  HostMemoryPool pool(arena.base, 4 * kA);
  std::byte* a = pool.Allocate(kA);
  std::byte outside[8];
  EXPECT_FALSE(pool.Free(outside));
  EXPECT_FALSE(pool.Free(a + 1));  // inside a block, not its start
  EXPECT_TRUE(pool.Free(a));
  EXPECT_FALSE(pool.Free(a));
  EXPECT_EQ(pool.stats().bytes_in_use, 0u);
  EXPECT_EQ(pool.stats().free_blocks, 1u);
}

TEST(HostMemoryPoolTest, ZeroCapacityFailsEveryAllocation) {
  HostMemoryPool pool(nullptr, 0);
  EXPECT_EQ(pool.Allocate(0), nullptr);
  EXPECT_EQ(pool.Allocate(1), nullptr);
  EXPECT_EQ(pool.stats().failed_allocations, 2u);
}

TEST(HostMemoryPoolTest, HugeRequestFailsWithoutWrappingAround) {
  Arena arena(4 * kA);
  HostMemoryPool pool(arena.base, 4 * kA);
  EXPECT_EQ(pool.Allocate(std::numeric_limits<std::size_t>::max()), nullptr);
  EXPECT_EQ(pool.Allocate(std::numeric_limits<std::size_t>::max() - kA + 2), nullptr);
  EXPECT_EQ(pool.stats().bytes_in_use, 0u);
}

TEST(HostMemoryPoolTest, CapacityIsRoundedDownToTheAlignment) {
  Arena arena(4 * kA);
  HostMemoryPool pool(arena.base, 3 * kA + 100);
  EXPECT_EQ(pool.capacity_bytes(), 3 * kA);
  EXPECT_NE(pool.Allocate(3 * kA), nullptr);
  EXPECT_EQ(pool.Allocate(1), nullptr);
}

// Random allocate/free against a model that tracks every live block's
// [offset, end): blocks never overlap or leave the arena, the in-use figure
// matches the model's sum, and a request fails only when the model has no
// gap large enough (the pool then must not have one either, since it merges
// free space eagerly).
TEST(HostMemoryPoolTest, RandomisedRunMatchesAModelArena) {
  constexpr std::size_t kCap = 256 * kA;
  Arena arena(kCap);
  HostMemoryPool pool(arena.base, kCap);
  std::map<std::size_t, std::size_t> model;  // offset -> rounded size
  std::mt19937_64 rng(42);
  auto largest_gap = [&] {
    std::size_t best = 0, cursor = 0;
    for (const auto& [off, size] : model) {
      best = std::max(best, off - cursor);
      cursor = off + size;
    }
    return std::max(best, kCap - cursor);
  };
  for (int step = 0; step < 20000; ++step) {
    if (model.empty() || rng() % 100 < 55) {
      const std::size_t want = rng() % (12 * kA) + (rng() % 4 == 0 ? 0 : 1);
      const std::size_t rounded = want == 0 ? kA : (want + kA - 1) / kA * kA;
      const std::size_t gap = largest_gap();
      std::byte* p = pool.Allocate(want);
      if (p == nullptr) {
        ASSERT_LT(gap, rounded) << "pool failed although the model has a gap of " << gap;
        continue;
      }
      const std::size_t off = static_cast<std::size_t>(p - arena.base);
      ASSERT_EQ(off % kA, 0u);
      ASSERT_LE(off + rounded, kCap);
      auto next = model.lower_bound(off);
      if (next != model.end()) {
        ASSERT_LE(off + rounded, next->first) << "overlaps the next block";
      }
      if (next != model.begin()) {
        auto prev = std::prev(next);
        ASSERT_LE(prev->first + prev->second, off) << "overlaps the previous block";
      }
      model.emplace(off, rounded);
    } else {
      auto it = model.begin();
      std::advance(it, static_cast<long>(rng() % model.size()));
      ASSERT_TRUE(pool.Free(arena.base + it->first));
      model.erase(it);
    }
    std::size_t sum = 0;
    for (const auto& [off, size] : model) sum += size;
    ASSERT_EQ(pool.stats().bytes_in_use, sum);
    ASSERT_EQ(pool.stats().largest_free_block, largest_gap());
  }
}

}  // namespace
}  // namespace epd
