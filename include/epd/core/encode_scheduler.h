// epd/core/encode_scheduler.h: the deterministic token-budget batcher keyed
// by (request_id, item_index): the engine reference's API.
//
// EncodeScheduler is a thin adapter over JobScheduler (epd/core/job_scheduler.h,
// which documents the packing rule, the three orders, kFair's tags and the
// complexity): each (request_id, item_index) is one job whose kByKey rank is
// (request_id, item_index), so kByKey is the reference's order. It serves the
// Python module and the reference-parity tests; the encode worker uses
// JobScheduler directly with its job ids.
//
// Add() is idempotent on (request_id, item_index): a re-add overwrites (and
// keeps the item's position and, in kFair, its tenant and tags). Costs are
// post-merge token counts: Add() throws epd::Error(kInvalidArgument) for a
// negative cost, or one that would take the pending total past 2^63 - 1, and
// changes nothing. (The reference accepts any Python int; a negative cost
// would make the budget meaningless, and an unbounded sum cannot be counted.)
//
// Complexity: JobScheduler's plus O(log n) per call for the key -> job map.
// (The reference re-sorts all pending items on every next_batch: O(n^2 log n)
// to drain.)
//
// Thread safety: thread-compatible. Ownership: items are copied in and moved
// out.
//
// Example:
//   EncodeScheduler s(/*max_tokens_per_batch=*/4096, /*max_items_per_batch=*/16);
//   s.Add({"req-1", 0, 324});
//   s.Add({"req-1", 1, 1225});
//   for (auto batch = s.NextBatch(); !batch.empty(); batch = s.NextBatch()) Run(batch);
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "epd/core/job_scheduler.h"

namespace epd {

// One vision item awaiting encode, identified within its request. `cost` is
// the item's post-merge token count, the budget unit.
struct PendingEncodeItem {
  std::string request_id;
  std::int64_t item_index = 0;
  std::int64_t cost = 0;
  // kFair only: as ScheduledJob::tenant and ScheduledJob::share_cost.
  std::string tenant{};
  std::int64_t share_cost = 0;

  std::pair<std::string, std::int64_t> key() const { return {request_id, item_index}; }
  // What kFair charges the tenant: share_cost, else cost, at least 1.
  std::int64_t share() const { return share_cost > 0 ? share_cost : (cost > 0 ? cost : 1); }
  friend bool operator==(const PendingEncodeItem&, const PendingEncodeItem&) = default;
};

class EncodeScheduler {
 public:
  using Key = std::pair<std::string, std::int64_t>;
  using Rank = JobScheduler::Rank;

  // As JobScheduler's constructor (same bounds, same errors).
  EncodeScheduler(std::int64_t max_tokens_per_batch, std::int64_t max_items_per_batch,
                  ScheduleOrder order = ScheduleOrder::kFifo, std::int64_t max_share_per_batch = 0);

  // Adds or overwrites the item under item.key(). Throws
  // epd::Error(kInvalidArgument) for a cost < 0 or share_cost < 0, or a
  // pending token total that would exceed 2^63 - 1; nothing changes then. An
  // overwrite keeps the item's position (and, in kFair, its tenant and tags).
  void Add(PendingEncodeItem item);
  // Drops the item under `key`; returns whether it was pending.
  bool Remove(const Key& key);
  bool Contains(const Key& key) const { return ids_.count(key) != 0; }

  // Pops and returns the next batch; empty only when nothing is pending.
  std::vector<PendingEncodeItem> NextBatch();
  // The keys NextBatch() would return now, in order, without popping them.
  std::vector<Key> PeekBatch() const;
  // JobScheduler::RankOf of the item's job. REQUIRES: Contains(key).
  Rank RankOf(const Key& key) const { return jobs_.RankOf(ids_.at(key)); }

  std::size_t pending_size() const { return jobs_.pending_size(); }
  std::int64_t pending_tokens() const { return jobs_.pending_tokens(); }
  std::int64_t max_tokens_per_batch() const { return jobs_.max_tokens_per_batch(); }
  std::int64_t max_items_per_batch() const { return jobs_.max_items_per_batch(); }
  ScheduleOrder order() const { return jobs_.order(); }

 private:
  JobScheduler jobs_;
  std::map<Key, JobScheduler::Id> ids_;  // exactly the pending items
  JobScheduler::Id next_id_ = 1;
};

}  // namespace epd
