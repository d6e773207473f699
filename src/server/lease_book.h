// src/server/lease_book.h (internal to epd::server): the lease bookkeeping
// that both zero-copy deliveries share (docs/SHM.md): ShmArena's leases on
// spans of the shared-memory arena and IpcLeases' leases on CUDA IPC
// exports. The book knows nothing of what a lease holds: each lease carries
// one 64-bit `holding` chosen by its store (a span's offset, an export's
// id), which the book hands back when the lease ends so that the store can
// drop its reference. The store owns the memory; the book owns the leases.
//
// A lease is named by its generation: 1, 2, 3, ... in grant order, never
// reused for the life of the book, so a stale or repeated release can never
// end a later lease. A lease ends exactly once, in one of three ways, each
// counted: a release (Release), its deadline (ExpireNext), or the end of its
// owner (ReleaseOwner).
//
// Expiry: every lease lasts the same `lease` from its grant, so deadlines
// grow in grant order and a FIFO of (deadline, generation) is sorted; the
// entries of leases that ended earlier are skipped when they reach the
// front. The store sweeps (calls ExpireNext until it returns nullopt) at the
// start of each of its operations.
//
// Owners (lease sessions, shm_session.h): a lease may be put under one live
// owner (Adopt); ReleaseOwner ends every lease still under it at once and
// retires the owner. An owner's set holds only live leases: a release or
// expiry takes the lease out of it too, so it never outgrows the leases the
// owner holds. An owner never lengthens a lease: owned leases expire as the
// others do. Owner tags are 1, 2, 3, ..., never reused; 0 is "no owner".
//
// Complexity: Grant, Release, OpenOwner, Adopt O(1) (hash maps, amortised);
// ExpireNext O(1 + s) for s skipped FIFO entries of leases ended earlier
// (each entry is skipped once, so O(1) amortised per lease); ReleaseOwner
// O(k) for the owner's k live leases. Memory: O(live leases + FIFO entries
// of leases granted within the last `lease` + live owners).
// Thread safety: none; the store serialises every call (ShmArena and
// IpcLeases call it under their own mutex).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace epd::internal {

class LeaseBook {
 public:
  using Clock = std::chrono::steady_clock;

  // Why a release was refused. The stores' error messages do not tell these
  // apart (a client cannot act on the difference); tests and logs may.
  enum class Refusal {
    kNone,          // not refused: the lease ended
    kNeverGranted,  // generation 0, or above every generation granted so far
    kEnded,         // granted, and ended already (released, expired, or its owner ended)
    kWrongHolding,  // live, but it holds something else than the caller named
  };

  struct Released {
    Refusal refusal = Refusal::kNone;
    std::uint64_t holding = 0;  // what the ended lease held; valid iff ok()
    bool ok() const { return refusal == Refusal::kNone; }
  };

  // Counters; `leases` is a level, the others only grow.
  struct Counts {
    std::int64_t leases = 0;             // live leases now
    std::uint64_t granted = 0;           // leases ever granted
    std::uint64_t released = 0;          // ended by Release
    std::uint64_t expired = 0;           // ended by their deadline (ExpireNext)
    std::uint64_t owner_released = 0;    // ended by ReleaseOwner
    std::uint64_t refused_releases = 0;  // Release calls that ended nothing
  };

  // `lease`: how long every lease lasts from its grant. REQUIRES: > 0 (the
  // stores check it and name their own flag).
  explicit LeaseBook(std::chrono::milliseconds lease) : lease_(lease) {}

  // A new lease on `holding`, until now + lease, and no owner. Returns its
  // generation (> every earlier one).
  std::uint64_t Grant(std::uint64_t holding, Clock::time_point now);

  // Ends the oldest live lease whose deadline is <= now, counted in
  // `expired`, and returns what it held; nullopt when none is due.
  std::optional<std::uint64_t> ExpireNext(Clock::time_point now);

  // Ends the live lease `generation`, counted in `released`, when it holds
  // `holding` (or whatever it holds, when `holding` is nullopt). Otherwise
  // nothing changes but `refused_releases`, and the result says why.
  Released Release(std::uint64_t generation, std::optional<std::uint64_t> holding = std::nullopt);

  // A new live owner (a nonzero tag, never reused).
  std::uint64_t OpenOwner();
  // Puts the live lease `generation` under the live `owner`. False, and
  // nothing changes, when the owner was never opened or is retired, or when
  // the lease has ended or is under an owner already.
  bool Adopt(std::uint64_t generation, std::uint64_t owner);
  // Ends every lease still under `owner`, counted in `owner_released`, and
  // retires the owner (later Adopts under it fail). Returns what each ended
  // lease held, in no particular order; empty for an owner that is unknown
  // or retired already (harmless to repeat).
  std::vector<std::uint64_t> ReleaseOwner(std::uint64_t owner);

  bool IsLive(std::uint64_t generation) const { return live_.contains(generation); }
  // The owner of the live lease `generation`; 0 when it has none or has ended.
  std::uint64_t OwnerOf(std::uint64_t generation) const;
  const Counts& counts() const { return counts_; }
  std::chrono::milliseconds lease() const { return lease_; }

 private:
  struct Live {
    std::uint64_t holding = 0;
    std::uint64_t owner = 0;  // 0: none
  };
  struct Expiry {
    Clock::time_point deadline;
    std::uint64_t generation = 0;
  };

  // Forgets the live lease `it` (and takes it out of its owner's set);
  // returns what it held. Counts nothing but `leases`.
  std::uint64_t EndLive(std::unordered_map<std::uint64_t, Live>::iterator it);

  const std::chrono::milliseconds lease_;
  std::unordered_map<std::uint64_t, Live> live_;  // by generation
  std::deque<Expiry> expiry_;                     // deadline order (= grant order)
  // Live owners -> generations of their live leases.
  std::unordered_map<std::uint64_t, std::unordered_set<std::uint64_t>> owners_;
  std::uint64_t next_generation_ = 1;
  std::uint64_t next_owner_ = 1;
  Counts counts_;
};

// Copies a book's counters into the same-named fields of a store's stats
// (ShmStats, IpcStats): leases, released, expired, refused_releases, and
// session_reclaimed (the book's owner_released).
template <typename Stats>
void CopyLeaseCounts(const LeaseBook::Counts& c, Stats* s) {
  s->leases = c.leases;
  s->released = c.released;
  s->expired = c.expired;
  s->refused_releases = c.refused_releases;
  s->session_reclaimed = c.owner_released;
}

}  // namespace epd::internal
