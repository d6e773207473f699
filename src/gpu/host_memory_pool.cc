// HostMemoryPool: best fit over an arena, with immediate coalescing.
//
// Invariant: the arena [0, usable) is exactly partitioned into live blocks
// (live_) and free blocks (free_by_offset_), and no two free blocks are
// adjacent. free_by_size_ mirrors free_by_offset_ as (size, offset) pairs so
// the best fit is one lower_bound. Sizes and offsets are multiples of
// kAlignment, so every block stays aligned.
#include "epd/gpu/host_memory_pool.h"

#include <cassert>
#include <cstdint>

namespace epd {

HostMemoryPool::HostMemoryPool(std::byte* base, std::size_t capacity_bytes)
    : base_(base), capacity_(capacity_bytes / kAlignment * kAlignment) {
  assert(reinterpret_cast<std::uintptr_t>(base) % kAlignment == 0);
  if (capacity_ > 0) InsertFree(0, capacity_);
}

std::size_t HostMemoryPool::RoundUp(std::size_t bytes) {
  if (bytes == 0) return kAlignment;
  return (bytes + kAlignment - 1) / kAlignment * kAlignment;
}

void HostMemoryPool::InsertFree(std::size_t offset, std::size_t size) {
  free_by_offset_.emplace(offset, size);
  free_by_size_.emplace(size, offset);
}

void HostMemoryPool::EraseFree(std::map<std::size_t, std::size_t>::iterator it) {
  free_by_size_.erase({it->second, it->first});
  free_by_offset_.erase(it);
}

std::byte* HostMemoryPool::Allocate(std::size_t bytes) {
  MutexLock lock(mu_);
  // Checked before rounding so a huge request cannot wrap around.
  if (bytes > capacity_) {
    ++failed_;
    return nullptr;
  }
  const std::size_t size = RoundUp(bytes);
  auto fit = free_by_size_.lower_bound({size, 0});
  if (fit == free_by_size_.end()) {
    ++failed_;
    return nullptr;
  }
  const std::size_t block_size = fit->first;
  const std::size_t offset = fit->second;
  EraseFree(free_by_offset_.find(offset));
  if (block_size > size) InsertFree(offset + size, block_size - size);
  live_.emplace(offset, size);
  in_use_ += size;
  ++allocations_;
  return base_ + offset;
}

bool HostMemoryPool::Free(std::byte* p) {
  MutexLock lock(mu_);
  if (p < base_ || p >= base_ + capacity_) return false;
  std::size_t offset = static_cast<std::size_t>(p - base_);
  auto live = live_.find(offset);
  if (live == live_.end()) return false;
  std::size_t size = live->second;
  live_.erase(live);
  in_use_ -= size;
  // Merge with the free neighbours, if any, so free space stays maximal.
  auto next = free_by_offset_.lower_bound(offset);
  if (next != free_by_offset_.end() && next->first == offset + size) {
    size += next->second;
    EraseFree(next);
  }
  auto after = free_by_offset_.lower_bound(offset);
  if (after != free_by_offset_.begin()) {
    auto prev = std::prev(after);
    if (prev->first + prev->second == offset) {
      offset = prev->first;
      size += prev->second;
      EraseFree(prev);
    }
  }
  InsertFree(offset, size);
  return true;
}

std::size_t HostMemoryPool::BlockSize(const std::byte* p) const {
  MutexLock lock(mu_);
  if (p < base_ || p >= base_ + capacity_) return 0;
  auto live = live_.find(static_cast<std::size_t>(p - base_));
  return live == live_.end() ? 0 : live->second;
}

HostMemoryPoolStats HostMemoryPool::stats() const {
  MutexLock lock(mu_);
  HostMemoryPoolStats s;
  s.capacity_bytes = capacity_;
  s.bytes_in_use = in_use_;
  s.live_blocks = live_.size();
  s.free_blocks = free_by_offset_.size();
  s.largest_free_block = free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
  s.allocations = allocations_;
  s.failed_allocations = failed_;
  return s;
}

}  // namespace epd
