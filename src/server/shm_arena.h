// src/server/shm_arena.h (internal to epd::server): the shared-memory arena
// behind DELIVERY_SHM (docs/SHM.md).
//
// One memfd of a fixed size, mapped read-write by the server. Each item sent
// by reference gets a span of it (Allocate), the server copies the rows in
// once, and the span is leased to the client under (offset, generation)
// until the client releases it or the lease's deadline passes; then the span
// returns to the free list and may be overwritten. The bytes under lease are
// therefore bounded by the arena's size: when no free span is large enough,
// Allocate says so and the caller sends the bytes inline (and counts it).
//
// Invariant: every byte of the arena is in exactly one of two places, a free
// block (free_, keyed by offset, neighbours coalesced) or a lease (leases_,
// keyed by offset). Expiry walks a FIFO of (deadline, offset, generation):
// the lease time is one constant, so deadlines grow in allocation order and
// the FIFO is sorted; an entry whose lease was released earlier (its
// generation no longer matches) is skipped. Expired leases are swept at the
// start of every Allocate, Release and Stats.
//
// Security: the memfd has mode 0600 and no name in any file system. A client
// opens it as /proc/<server pid>/fd/<fd>, which the kernel allows only to a
// process that may ptrace-read the server (the same user, or root), and then
// checks the inode's mode. Its size is sealed (F_SEAL_GROW/SHRINK), so no
// mapping can be cut short under a reader.
//
// Complexity: Allocate O(log f + e), Release O(log f + log l), where f is the
// number of free blocks, l of leases, e of leases that expire in the sweep.
// Thread safety: thread-safe (one mutex); the returned span's bytes are the
// caller's to write until it returns them to a client.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "epd/server_stats.h"
#include "epd/status.h"

namespace epd::internal {

class ShmArena {
 public:
  using Clock = std::chrono::steady_clock;
  // Spans start at multiples of this, and their lengths are rounded up to it
  // (what ShmStats::leased_bytes counts).
  static constexpr std::uint64_t kGranule = 64;

  struct Span {
    std::uint64_t offset = 0;
    std::uint64_t length = 0;  // as asked, not rounded
    std::uint64_t generation = 0;
    std::byte* data = nullptr;  // the server's writable view of the span
  };

  // A fresh memfd of `capacity_bytes` (rounded up to kGranule), mapped and
  // pre-faulted (the memory is committed here, not on first use).
  // `lease`: how long a span stays leased without a release. `now` replaces
  // the steady clock (tests). Errors: kInvalidArgument for a capacity <= 0 or
  // a lease <= 0; kUnavailable when the kernel refuses the memfd or the
  // memory (the message names the call and errno).
  static StatusOr<std::unique_ptr<ShmArena>> Create(std::int64_t capacity_bytes, std::chrono::milliseconds lease,
                                                    std::function<Clock::time_point()> now = nullptr);
  ~ShmArena();  // unmaps and closes; clients' own mappings stay valid
  ShmArena(const ShmArena&) = delete;
  ShmArena& operator=(const ShmArena&) = delete;

  // A span of `length` bytes leased until now + lease, or nullopt when no
  // free block is large enough (nothing changes then).
  std::optional<Span> Allocate(std::uint64_t length);

  // Ends the lease at `offset` if its generation is `generation`.
  // kFailedPrecondition otherwise (released already, expired, or never
  // handed out), counted in ShmStats::refused_releases; nothing changes.
  Status Release(std::uint64_t offset, std::uint64_t generation);

  // An item the caller asked to send by reference but sent inline.
  void CountFallback();

  ShmStats Stats();

  int fd() const { return fd_; }
  pid_t pid() const { return pid_; }
  std::uint64_t segment() const { return segment_; }
  std::uint64_t capacity() const { return capacity_; }
  std::chrono::milliseconds lease() const { return lease_; }
  // The memfd's name, "epd-shm-<segment as 16 hex digits>"; a client checks
  // that /proc/<pid>/fd/<fd> links to "/memfd:<name> (deleted)".
  const std::string& name() const { return name_; }

 private:
  struct Lease {
    std::uint64_t size = 0;  // rounded to kGranule
    std::uint64_t generation = 0;
  };
  struct Expiry {
    Clock::time_point deadline;
    std::uint64_t offset = 0;
    std::uint64_t generation = 0;
  };

  ShmArena() = default;
  Clock::time_point Now() const { return now_ ? now_() : Clock::now(); }
  void SweepLocked(Clock::time_point now);
  void FreeLocked(std::uint64_t offset, std::uint64_t size);

  int fd_ = -1;
  pid_t pid_ = 0;
  std::byte* base_ = nullptr;
  std::uint64_t capacity_ = 0;
  std::uint64_t segment_ = 0;
  std::string name_;
  std::chrono::milliseconds lease_{0};
  std::function<Clock::time_point()> now_;

  std::mutex mu_;
  std::map<std::uint64_t, std::uint64_t> free_;  // offset -> size; guarded by mu_
  std::map<std::uint64_t, Lease> leases_;        // guarded by mu_
  std::deque<Expiry> expiry_;                    // guarded by mu_
  std::uint64_t next_generation_ = 1;            // guarded by mu_
  ShmStats stats_;                               // guarded by mu_ (leased_bytes, leases kept current)
};

}  // namespace epd::internal
