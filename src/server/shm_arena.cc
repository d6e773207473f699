// ShmArena: memfd + first-fit free list + leases (shm_arena.h).
//
// Why a memfd rather than shm_open: it has no name in any file system, so no
// other process can guess or squat it, nothing is left behind when the
// server crashes, and the kernel's /proc/<pid>/fd check (ptrace-read access)
// decides who may open it. Why first fit over a coalescing free list rather
// than a ring: leases end in any order (a client releases what it is done
// with), and a ring would hold every span behind the oldest unreleased one.
#include "shm_arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <system_error>
#include <vector>

namespace epd::internal {
namespace {

Status Errno(const std::string& what) {
  return Status(StatusCode::kUnavailable, what + " failed: " + std::generic_category().message(errno));
}

std::uint64_t RoundUp(std::uint64_t n) {
  return (n + ShmArena::kGranule - 1) / ShmArena::kGranule * ShmArena::kGranule;
}

}  // namespace

StatusOr<std::unique_ptr<ShmArena>> ShmArena::Create(std::int64_t capacity_bytes, std::chrono::milliseconds lease,
                                                     std::function<Clock::time_point()> now) {
  if (capacity_bytes <= 0) {
    return InvalidArgument("shared-memory arena size must be > 0 bytes, got " + std::to_string(capacity_bytes));
  }
  if (lease.count() <= 0)
    return InvalidArgument("shared-memory lease must be > 0 ms, got " + std::to_string(lease.count()));
  std::unique_ptr<ShmArena> a(new ShmArena(lease));
  a->capacity_ = RoundUp(static_cast<std::uint64_t>(capacity_bytes));
  a->now_ = std::move(now);
  a->pid_ = getpid();
  if (getrandom(&a->segment_, sizeof(a->segment_), 0) != sizeof(a->segment_)) return Errno("getrandom");
  char name[32];
  std::snprintf(name, sizeof(name), "epd-shm-%016llx", static_cast<unsigned long long>(a->segment_));
  a->name_ = name;
  a->fd_ = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (a->fd_ < 0) return Errno("memfd_create");
  // memfd inodes start with mode 0777; /proc's ptrace check is the main
  // guard, the mode a second one.
  if (fchmod(a->fd_, 0600) != 0) return Errno("fchmod(memfd, 0600)");
  if (ftruncate(a->fd_, static_cast<off_t>(a->capacity_)) != 0) {
    return Errno("ftruncate(memfd, " + std::to_string(a->capacity_) + ")");
  }
  if (fcntl(a->fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) return Errno("sealing the memfd");
  void* p = mmap(nullptr, a->capacity_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, a->fd_, 0);
  if (p == MAP_FAILED) return Errno("mmap of the " + std::to_string(a->capacity_) + "-byte arena");
  a->base_ = static_cast<std::byte*>(p);
  MutexLock lock(a->mu_);  // not shared yet: for the analysis, at no cost
  a->free_.emplace(0, a->capacity_);
  a->stats_.capacity_bytes = static_cast<std::int64_t>(a->capacity_);
  return a;
}

ShmArena::~ShmArena() {
  if (base_ != nullptr) munmap(base_, capacity_);
  if (fd_ >= 0) close(fd_);
}

void ShmArena::FreeLocked(std::uint64_t offset, std::uint64_t size) {
  auto next = free_.lower_bound(offset);
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {  // merge into the block before
      offset = prev->first;
      size += prev->second;
      free_.erase(prev);
    }
  }
  if (next != free_.end() && offset + size == next->first) {  // and the one after
    size += next->second;
    free_.erase(next);
  }
  free_.emplace(offset, size);
}

void ShmArena::UnrefLocked(std::uint64_t offset) {
  auto it = spans_.find(offset);
  SpanState& span = it->second;
  if (--span.refs > 0) return;
  stats_.leased_bytes -= static_cast<std::int64_t>(span.size);
  if (span.published) {
    span.idle_at = idle_.insert(idle_.end(), offset);
    return;
  }
  FreeLocked(offset, span.size);
  spans_.erase(it);
}

void ShmArena::SweepLocked(Clock::time_point now) {
  while (std::optional<std::uint64_t> offset = book_.ExpireNext(now)) UnrefLocked(*offset);
}

std::optional<std::uint64_t> ShmArena::FirstFitLocked(std::uint64_t size) {
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < size) continue;
    const std::uint64_t offset = it->first, left = it->second - size;
    free_.erase(it);
    if (left > 0) free_.emplace(offset + size, left);
    return offset;
  }
  return std::nullopt;
}

ShmArena::Span ShmArena::LeaseLocked(std::uint64_t offset, std::uint64_t length, bool fresh, Clock::time_point now) {
  SpanState& span = spans_.at(offset);
  if (span.refs++ == 0) {
    if (!fresh) idle_.erase(span.idle_at);
    stats_.leased_bytes += static_cast<std::int64_t>(span.size);
  }
  const std::uint64_t generation = book_.Grant(offset, now);
  ++stats_.items;
  return Span{offset, length, generation, base_ + offset, fresh};
}

std::optional<ShmArena::Span> ShmArena::Acquire(const std::string& key, std::uint64_t length) {
  const std::uint64_t size = RoundUp(std::max<std::uint64_t>(length, 1));
  const Clock::time_point now = Now();
  MutexLock lock(mu_);
  SweepLocked(now);
  if (!key.empty()) {
    if (auto hit = by_key_.find(key); hit != by_key_.end()) {
      ++stats_.reused;
      return LeaseLocked(hit->second, length, /*fresh=*/false, now);
    }
  }
  std::optional<std::uint64_t> offset = FirstFitLocked(size);
  // Evict idle spans, least recently used first, until one block fits.
  while (!offset.has_value() && !idle_.empty()) {
    const std::uint64_t victim = idle_.front();
    idle_.pop_front();
    auto it = spans_.find(victim);
    by_key_.erase(it->second.key);
    FreeLocked(victim, it->second.size);
    spans_.erase(it);
    ++stats_.evicted;
    offset = FirstFitLocked(size);
  }
  if (!offset.has_value()) return std::nullopt;
  spans_.emplace(*offset, SpanState{size, key, false, 0, {}});
  return LeaseLocked(*offset, length, /*fresh=*/true, now);
}

void ShmArena::Publish(const Span& span) {
  MutexLock lock(mu_);
  auto it = spans_.find(span.offset);
  if (it == spans_.end() || it->second.key.empty() || it->second.published) return;
  // Two writers of one key can race; the first to finish is the one shared,
  // the other span ends with its own leases.
  if (!by_key_.emplace(it->second.key, span.offset).second) return;
  it->second.published = true;
  if (it->second.refs == 0) it->second.idle_at = idle_.insert(idle_.end(), span.offset);
}

Status ShmArena::Release(std::uint64_t offset, std::uint64_t generation) {
  const Clock::time_point now = Now();
  MutexLock lock(mu_);
  SweepLocked(now);
  // A lease at another offset is refused like one that does not exist.
  if (!book_.Release(generation, offset).ok()) {
    return Status(StatusCode::kFailedPrecondition, "no lease at offset " + std::to_string(offset) +
                                                       " with generation " + std::to_string(generation) +
                                                       ": released already, expired, or never handed out");
  }
  UnrefLocked(offset);
  return Status::Ok();
}

std::uint64_t ShmArena::OpenOwner() {
  MutexLock lock(mu_);
  return book_.OpenOwner();
}

bool ShmArena::Adopt(std::uint64_t generation, std::uint64_t owner) {
  const Clock::time_point now = Now();
  MutexLock lock(mu_);
  SweepLocked(now);
  return book_.Adopt(generation, owner);
}

std::size_t ShmArena::ReleaseOwner(std::uint64_t owner) {
  const Clock::time_point now = Now();
  MutexLock lock(mu_);
  SweepLocked(now);
  const std::vector<std::uint64_t> offsets = book_.ReleaseOwner(owner);
  for (const std::uint64_t offset : offsets) UnrefLocked(offset);
  return offsets.size();
}

void ShmArena::CountFallback() {
  MutexLock lock(mu_);
  ++stats_.fallbacks;
}

ShmStats ShmArena::Stats() {
  const Clock::time_point now = Now();
  MutexLock lock(mu_);
  SweepLocked(now);
  ShmStats s = stats_;
  CopyLeaseCounts(book_.counts(), &s);
  return s;
}

}  // namespace epd::internal
