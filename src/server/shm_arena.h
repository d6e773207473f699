// src/server/shm_arena.h (internal to epd::server): the shared-memory arena
// behind DELIVERY_SHM (docs/SHM.md).
//
// One memfd of a fixed size, mapped read-write by the server. An item's rows
// are written into a span of it once per content key, and every reply that
// delivers that key while the span lives leases the same span (Acquire): a
// repeat hit costs the server no copy at all. Embeddings are immutable per
// key, so sharing is safe. Each lease is (offset, generation), generations
// unique per lease, and ends when the client releases it or its deadline
// passes. A span with no lease left stays in the arena, idle, for the next
// hit on its key, until space is needed: idle spans are evicted least
// recently used first. Bytes under lease are bounded by the arena's size:
// when neither a free block nor evicting idle spans makes room, Acquire says
// so and the caller sends the bytes inline (and counts it).
//
// Invariant: every byte of the arena is in exactly one free block (free_,
// keyed by offset, neighbours coalesced) or one span (spans_). A span is
// either leased (refs > 0) or idle (refs == 0, on the LRU list idle_, and
// findable by key); a span still being written is leased by its writer and
// not yet findable. The leases themselves (generations, expiry, owners) are
// kept by a LeaseBook (lease_book.h), each holding its span's offset;
// expired leases are swept at the start of every Acquire, Release, Adopt,
// ReleaseOwner and Stats.
//
// Owners (lease sessions, shm_session.h): a lease may be put under one live
// owner (Adopt); ReleaseOwner ends every lease still under it at once and
// retires the owner. An owner never lengthens a lease: expiry ends owned
// leases as it ends the others (LeaseBook).
//
// Security: the memfd has mode 0600 and no name in any file system. A client
// opens it as /proc/<server pid>/fd/<fd>, which the kernel allows only to a
// process that may ptrace-read the server (the same user, or root), and then
// checks the inode's mode. Its size is sealed (F_SEAL_GROW/SHRINK), so no
// mapping can be cut short under a reader.
//
// Complexity: Acquire of a key with a live span O(1 + e); of a new key
// O(f + v log f + e); Release O(log f + e); f free blocks, v idle spans
// evicted, e leases that expire in the sweep. OpenOwner and Adopt O(1 + e);
// ReleaseOwner O(k log f + e) for the owner's k live leases.
// Thread safety: thread-safe (one mutex); the returned span's bytes are the
// caller's to write until it returns them to a client.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include "epd/core/mutex.h"
#include "epd/core/status.h"
#include "epd/rpc/server_stats.h"
#include "lease_book.h"

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
    // True: a new span; the caller writes the rows, then calls Publish. False:
    // the key's rows are there already (nothing to write).
    bool fresh = false;
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

  // A lease, until now + lease, on the span holding `key`'s rows (`length`
  // bytes), or on a new span for them; nullopt when there is no room even
  // after evicting every idle span. An empty key is never shared.
  // REQUIRES: every call with the same key passes the same length.
  std::optional<Span> Acquire(const std::string& key, std::uint64_t length);
  // The rows of a fresh span are written: later Acquires of its key share it.
  void Publish(const Span& span);

  // Ends the lease at `offset` if its generation is `generation`.
  // kFailedPrecondition otherwise (released already, expired, or never
  // handed out), counted in ShmStats::refused_releases; nothing changes.
  Status Release(std::uint64_t offset, std::uint64_t generation);

  // An item the caller asked to send by reference but sent inline.
  void CountFallback();

  // A new owner (a nonzero tag, never reused), live until ReleaseOwner.
  std::uint64_t OpenOwner();
  // Puts the live lease `generation` under the live `owner`. False, and
  // nothing changes, when the owner was never opened or is released
  // already, or when the lease has ended (released or expired) or is
  // under an owner already.
  bool Adopt(std::uint64_t generation, std::uint64_t owner);
  // Ends every lease still under `owner`, as Release would, counted in
  // ShmStats::session_reclaimed (not `released`), and retires the owner:
  // later Adopts under it fail. Returns how many leases it ended; 0 for an
  // owner that is unknown or released already (harmless to repeat).
  std::size_t ReleaseOwner(std::uint64_t owner);

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
  struct SpanState {
    std::uint64_t size = 0;                      // rounded to kGranule
    std::string key;                             // empty: never shared
    bool published = false;                      // findable in by_key_
    std::int64_t refs = 0;                       // leases on it
    std::list<std::uint64_t>::iterator idle_at;  // valid iff refs == 0
  };
  explicit ShmArena(std::chrono::milliseconds lease) : lease_(lease), book_(lease) {}
  Clock::time_point Now() const { return now_ ? now_() : Clock::now(); }
  void SweepLocked(Clock::time_point now) EPD_REQUIRES(mu_);
  void FreeLocked(std::uint64_t offset, std::uint64_t size) EPD_REQUIRES(mu_);
  // One lease fewer on the span at `offset`; the last one makes it idle (or
  // frees it when it is not findable by key).
  void UnrefLocked(std::uint64_t offset) EPD_REQUIRES(mu_);
  std::optional<std::uint64_t> FirstFitLocked(std::uint64_t size) EPD_REQUIRES(mu_);
  Span LeaseLocked(std::uint64_t offset, std::uint64_t length, bool fresh, Clock::time_point now) EPD_REQUIRES(mu_);

  int fd_ = -1;
  pid_t pid_ = 0;
  std::byte* base_ = nullptr;
  std::uint64_t capacity_ = 0;
  std::uint64_t segment_ = 0;
  std::string name_;
  std::chrono::milliseconds lease_{0};
  std::function<Clock::time_point()> now_;

  Mutex mu_;
  std::map<std::uint64_t, std::uint64_t> free_ EPD_GUARDED_BY(mu_);            // offset -> size
  std::map<std::uint64_t, SpanState> spans_ EPD_GUARDED_BY(mu_);               // by offset
  std::unordered_map<std::string, std::uint64_t> by_key_ EPD_GUARDED_BY(mu_);  // published spans
  std::list<std::uint64_t> idle_ EPD_GUARDED_BY(mu_);                          // idle spans, least recently used first
  LeaseBook book_ EPD_GUARDED_BY(mu_);                                         // each lease holds its span's offset
  // The arena's own counters (leased_bytes kept current); the lease counts
  // come from book_ in Stats.
  ShmStats stats_ EPD_GUARDED_BY(mu_);
};

}  // namespace epd::internal
