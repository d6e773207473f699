// epd/gpu/host_memory_pool.h: a bytes-bounded allocator that carves blocks out of
// one fixed arena, for the L2 tier's pinned host memory.
//
// Pinning memory (cudaHostAlloc) is slow (it maps and locks pages; tens of
// milliseconds per GiB) and the pinned total is a system-wide resource, so
// the CUDA device pins one arena up front, sized by the L2 capacity
// (`--host-cache-mb`), and HostMemoryPool hands out blocks of it. The pool is
// pure bookkeeping: it never touches the arena's bytes, so FakeDevice runs the
// same logic over ordinary memory and the CPU tests exercise it.
//
// Policy: best fit. A request is rounded up to kAlignment (256 bytes, the
// alignment cudaMalloc gives, so copies run at full speed) and takes the
// smallest free block that holds it (ties: lowest offset, so placement is
// deterministic); the rest of that block stays free. Free() coalesces the
// block with free neighbours at once, so two adjacent free blocks never exist.
//
// Fragmentation: with entries of mixed sizes, free space can be split into
// blocks each smaller than a request although their sum is larger; Allocate
// then fails (nullptr) even though bytes_free() >= the request. Best fit keeps
// large free blocks intact longer than first fit does, and rounding wastes at
// most kAlignment - 1 bytes per block. The tier treats a failure exactly like
// an L2 too small: the demotion is dropped and counted, never a crash. Give
// the arena headroom over the L2 byte capacity (see docs/GPU.md: at least the
// largest entry, because a demotion allocates its block before L2 evicts to
// make room).
//
// Complexity: Allocate and Free are O(log b), b = free blocks plus live
// blocks (two ordered maps and an ordered set).
// Ownership: the arena belongs to the caller and must outlive the pool; a
// returned pointer stays valid until passed to Free().
// Thread safety: thread-safe (one internal mutex); a tier entry's block may be
// freed on whichever thread drops the entry's last reference.
//
// Example:
//   std::vector<std::byte> arena(64 << 20);
//   epd::HostMemoryPool pool(arena.data(), arena.size());
//   std::byte* p = pool.Allocate(1 << 20);   // nullptr when no block fits
//   if (p != nullptr) pool.Free(p);
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <utility>

#include "epd/core/mutex.h"

namespace epd {

struct HostMemoryPoolStats {
  std::size_t capacity_bytes = 0;  // usable arena bytes (rounded down to kAlignment)
  std::size_t bytes_in_use = 0;    // sum of live blocks, after rounding
  std::size_t live_blocks = 0;
  std::size_t free_blocks = 0;         // fragments of free space
  std::size_t largest_free_block = 0;  // the largest request that would succeed now
  std::uint64_t allocations = 0;       // successful Allocate calls
  std::uint64_t failed_allocations = 0;
};

class HostMemoryPool {
 public:
  static constexpr std::size_t kAlignment = 256;

  // `base` must be kAlignment-aligned (cudaHostAlloc and aligned new are);
  // a misaligned tail of the arena is not used. capacity_bytes may be 0 (every
  // Allocate fails).
  HostMemoryPool(std::byte* base, std::size_t capacity_bytes);

  HostMemoryPool(const HostMemoryPool&) = delete;
  HostMemoryPool& operator=(const HostMemoryPool&) = delete;

  // A block of at least `bytes` bytes (0 is served as one kAlignment unit, so
  // every block has a distinct address), or nullptr when no free block fits.
  std::byte* Allocate(std::size_t bytes);

  // Returns a block. REQUIRES: p came from this pool's Allocate and was not
  // freed since (checked: anything else is ignored and returns false).
  bool Free(std::byte* p);

  // The rounded size of the live block at p, 0 when p is not one.
  std::size_t BlockSize(const std::byte* p) const;

  HostMemoryPoolStats stats() const;
  std::size_t capacity_bytes() const { return capacity_; }

 private:
  static std::size_t RoundUp(std::size_t bytes);
  void InsertFree(std::size_t offset, std::size_t size) EPD_REQUIRES(mu_);
  void EraseFree(std::map<std::size_t, std::size_t>::iterator it) EPD_REQUIRES(mu_);

  std::byte* const base_;
  const std::size_t capacity_;
  mutable Mutex mu_;
  std::map<std::size_t, std::size_t> free_by_offset_ EPD_GUARDED_BY(mu_);           // offset -> size
  std::set<std::pair<std::size_t, std::size_t>> free_by_size_ EPD_GUARDED_BY(mu_);  // (size, offset)
  std::map<std::size_t, std::size_t> live_ EPD_GUARDED_BY(mu_);                     // offset -> size
  std::size_t in_use_ EPD_GUARDED_BY(mu_) = 0;
  std::uint64_t allocations_ EPD_GUARDED_BY(mu_) = 0;
  std::uint64_t failed_ EPD_GUARDED_BY(mu_) = 0;
};

}  // namespace epd
