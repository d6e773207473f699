// epd/core/job_scheduler.h: the deterministic token-budget batcher of the
// encode stage, keyed by a numeric job id.
//
// JobScheduler collects pending vision computations (cache misses) and packs
// them into vision-tower batches bounded by a per-batch token budget and an
// item count. Batches depend only on the sequence of Add()/Remove() calls and
// the jobs' fields, never on timing, addresses or hash order, so every
// tensor-parallel rank that sees the same calls forms the same batch
// (non-identical batches would deadlock the collectives inside a
// tensor-parallel tower). The encode worker uses it with its job ids;
// EncodeScheduler (epd/core/encode_scheduler.h) is the reference-parity API
// over it, keyed by (request_id, item_index).
//
// Packing is greedy, as in the engine reference: jobs are admitted in order
// until the next one would push the batch past max_tokens_per_batch or
// max_items_per_batch; the first job that does not fit ends the batch (no
// skipping ahead, which would reorder work). A job whose cost alone exceeds
// the token budget is returned alone, so it always makes progress. kFair may
// also bound a batch's share costs (max_share_per_batch). An empty batch
// comes back only when nothing is pending.
//
// Orders:
//   kByKey  ascending ScheduledJob::by_key (request id bytes, then
//           submission, then item index, then part), ties by id: the
//           reference's (request_id, item_index) order. It starves a request
//           whose id sorts late while earlier-sorting work keeps arriving.
//   kFifo   arrival order of first add; a re-add overwrites the job but keeps
//           its position. A job waits at most for the jobs added before it,
//           so its wait is bounded. The C++ default.
//   kFair   fair across tenants (ScheduledJob::tenant), weighted by cost:
//           start-time fair queueing with virtual finish tags, computed only
//           from the sequence of Add/Remove/NextBatch calls and the jobs'
//           share costs (never from clocks). Each tenant's jobs keep their
//           arrival order; across tenants, a job's tag is
//             start  = max(V, finish tag of the tenant's previous job)
//             finish = start + share cost (ScheduledJob::share(), >= 1)
//           and jobs are served by (finish, arrival). V, the virtual time, is
//           the largest start tag served so far; it resets to 0 with every
//           tenant's history when nothing is pending. So a tenant that queued
//           a long run of expensive jobs first gets its share, and one that
//           arrives later is served after at most about one share's worth of
//           each other tenant's cost, not after the whole run. With one
//           tenant kFair is kFifo. (Goyal, Vin and Cheng, "Start-time Fair
//           Queueing", SIGCOMM 1996; the finish-tag order is that of WFQ,
//           Demers, Keshav and Shenker, SIGCOMM 1989.)
//
// Add() is idempotent on the id: a re-add overwrites (keeping the job's
// position and, in kFair, its tenant and tags). Costs are post-merge token
// counts: Add() throws epd::Error(kInvalidArgument) for a negative cost or
// share cost, or one that would take the pending total past 2^63 - 1, and
// changes nothing.
//
// Complexity (n pending, k returned, m tenants known): Add O(log n + log m),
// Remove O(log n + log m), NextBatch O(k (log n + log m)), so draining n jobs
// is O(n log n). kFair remembers a tenant while it has pending jobs, or its
// finish tag is ahead of V (at most the tenants served since the queue was
// last empty).
//
// Thread safety: thread-compatible. Ownership: jobs are copied in and moved
// out.
//
// Example:
//   JobScheduler s(/*max_tokens_per_batch=*/4096, /*max_items_per_batch=*/16);
//   s.Add({.id = 1, .cost = 324});
//   s.Add({.id = 2, .cost = 1225});
//   for (auto batch = s.NextBatch(); !batch.empty(); batch = s.NextBatch()) Run(batch);
#pragma once

#include <compare>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "epd/core/status.h"

namespace epd {

enum class ScheduleOrder : std::uint8_t { kByKey = 0, kFifo = 1, kFair = 2 };

// "by_key", "fifo" or "fair": the order as flags, the Python module and
// reports spell it.
inline std::string_view ScheduleOrderName(ScheduleOrder order) {
  switch (order) {
    case ScheduleOrder::kFifo:
      return "fifo";
    case ScheduleOrder::kFair:
      return "fair";
    case ScheduleOrder::kByKey:
      break;
  }
  return "by_key";
}

// The order ScheduleOrderName names; kInvalidArgument naming the text otherwise.
inline StatusOr<ScheduleOrder> ParseScheduleOrder(std::string_view text) {
  for (ScheduleOrder o : {ScheduleOrder::kByKey, ScheduleOrder::kFifo, ScheduleOrder::kFair}) {
    if (text == ScheduleOrderName(o)) return o;
  }
  return InvalidArgument("schedule order must be 'by_key', 'fifo' or 'fair', got '" + std::string(text) + "'");
}

// A job's place in the kByKey order, compared field by field (the request
// id as bytes, std::string's comparison). The worker fills request_id with
// the request's id, submission with its own submission number (so a new
// request reusing an id sorts after the old one's surviving jobs), item with
// the item index and part with a video's temporal chunk (0 otherwise).
// EncodeScheduler fills request_id and item only.
struct ByKeyRank {
  std::string request_id;
  std::uint64_t submission = 0;
  std::int64_t item = 0;
  std::int64_t part = 0;
  // NOLINTNEXTLINE(modernize-use-nullptr): clang-tidy 14 flags the 0 the compiler synthesizes for a defaulted <=>.
  friend auto operator<=>(const ByKeyRank&, const ByKeyRank&) = default;
  friend bool operator==(const ByKeyRank&, const ByKeyRank&) = default;
};

// One computation awaiting the tower. `cost` is its post-merge token count,
// the budget unit.
struct ScheduledJob {
  std::uint64_t id = 0;  // unique among pending jobs
  std::int64_t cost = 0;
  // kFair only (the other orders ignore both): who the job is queued for
  // (e.g. a client address or a tenant id; "" is a tenant too), and what it
  // costs its tenant's share, in any unit that is the same for every job
  // (the worker uses post-merge tokens plus decoded pixels / 784); <= 0 =
  // `cost`. Must be >= 0.
  std::string tenant{};
  std::int64_t share_cost = 0;
  // kByKey only; also names the job in Add's error messages.
  ByKeyRank by_key{};

  // What kFair charges the tenant: share_cost, else cost, at least 1.
  std::int64_t share() const { return share_cost > 0 ? share_cost : (cost > 0 ? cost : 1); }
};

class JobScheduler {
 public:
  using Id = std::uint64_t;

  // Throws epd::Error(kInvalidArgument) naming the argument when either bound
  // is <= 0, or max_share_per_batch < 0. `max_share_per_batch` (kFair only;
  // 0 = unbounded) bounds a batch's sum of ScheduledJob::share() the way
  // max_tokens_per_batch bounds its tokens (the first job always fits).
  JobScheduler(std::int64_t max_tokens_per_batch, std::int64_t max_items_per_batch,
               ScheduleOrder order = ScheduleOrder::kFifo, std::int64_t max_share_per_batch = 0);

  // Adds or overwrites the job under job.id. Throws
  // epd::Error(kInvalidArgument) for a cost < 0 or share_cost < 0 (naming
  // by_key's item and request id), or a pending token total that would exceed
  // 2^63 - 1; nothing changes then.
  void Add(ScheduledJob job);
  // Drops the job; returns whether it was pending.
  bool Remove(Id id);
  bool Contains(Id id) const { return jobs_.count(id) != 0; }
  // The pending job `id`, or null. The pointer is valid until it is removed
  // or returned by NextBatch.
  const ScheduledJob* Find(Id id) const;

  // Pops and returns the next batch; empty only when nothing is pending.
  std::vector<ScheduledJob> NextBatch();
  // The ids NextBatch() would return now, in order, without popping them.
  // O(k log n).
  std::vector<Id> PeekBatch() const;
  // kFifo: true when the next batch is closed, i.e. it ends before the last
  // pending job or holds max_items_per_batch jobs, so no job added later can
  // join it (the batch NextBatch returns now is the one it would return after
  // more Adds). Always false for the other orders, where a later job may sort
  // first. O(k log n).
  bool NextBatchClosed() const;

  // A pending job's place in line, for work done ahead of its batch (the
  // worker's decode prefetch): kFifo and kFair serve pending jobs in
  // ascending rank, and a pending job's rank never changes; kByKey gives
  // arrival order. Unique among pending jobs. REQUIRES: Contains(id).
  // O(log n).
  using Rank = std::pair<__int128, std::uint64_t>;
  Rank RankOf(Id id) const;

  std::size_t pending_size() const { return jobs_.size(); }
  std::int64_t pending_tokens() const { return pending_tokens_; }
  std::int64_t max_tokens_per_batch() const { return max_tokens_per_batch_; }
  std::int64_t max_items_per_batch() const { return max_items_per_batch_; }
  ScheduleOrder order() const { return order_; }

 private:
  // kFair tags: sums of share costs, 128-bit so that no sequence of adds
  // (each < 2^63, fewer than 2^64 of them) can wrap.
  using Tag = __int128;
  struct Slot {
    ScheduledJob job;
    std::uint64_t seq;  // arrival of the first add; the kFifo position
    Tag start = 0;      // kFair: virtual start and finish tags
    Tag finish = 0;
  };
  struct Tenant {
    Tag finish = 0;            // finish tag of its latest job
    std::int64_t pending = 0;  // its jobs pending
  };
  using JobMap = std::map<Id, Slot>;

  void CheckCosts(const ScheduledJob& job, std::int64_t replaced_cost, std::int64_t* total) const;
  // Takes the node out of whichever order index holds it, and its tenant's
  // count (kFair); does not erase it from jobs_.
  void Unlink(JobMap::iterator it);
  // The nodes NextBatch() pops next, in order (the greedy packing rule), and
  // whether the walk stopped before the last pending job.
  std::vector<JobMap::const_iterator> Select(bool* stopped_early = nullptr) const;
  // kFair: one job of tenant `t` left the queue; an idle tenant is
  // forgotten, or remembered in idle_ while its finish tag is ahead of V.
  void Departed(std::map<std::string, Tenant>::iterator t);
  // kFair: V advanced to at least `start`; forgets idle tenants it passed.
  void Advance(Tag start);
  // Nothing pending: every tenant starts even again (and V stays small).
  void ResetIfEmpty();

  std::int64_t max_tokens_per_batch_;
  std::int64_t max_items_per_batch_;
  ScheduleOrder order_;
  std::int64_t max_share_per_batch_;
  JobMap jobs_;
  // The orders, each mapping to the job's node in jobs_ (std::map iterators
  // stay valid until that node is erased); exactly one is in use.
  std::map<std::pair<ByKeyRank, Id>, JobMap::iterator> by_key_;     // kByKey
  std::map<std::uint64_t, JobMap::iterator> fifo_;                  // kFifo: seq
  std::map<std::pair<Tag, std::uint64_t>, JobMap::iterator> fair_;  // kFair: (finish, seq)
  std::map<std::string, Tenant> tenants_;                           // kFair
  std::set<std::pair<Tag, std::string>> idle_;                      // kFair: idle tenants ahead of V, by tag
  Tag virtual_time_ = 0;
  std::uint64_t next_seq_ = 0;
  std::int64_t pending_tokens_ = 0;
};

}  // namespace epd
