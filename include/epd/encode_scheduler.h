// epd/encode_scheduler.h: the deterministic token-budget batcher of the
// encode stage.
//
// EncodeScheduler collects pending vision items (cache misses) and packs them
// into vision-tower batches bounded by a per-batch token budget and an item
// count. Batches depend only on the sequence of Add()/Remove() calls, never on
// timing, addresses or hash order, so every tensor-parallel rank that sees the
// same calls forms the same batch (non-identical batches would deadlock the
// collectives inside a tensor-parallel tower).
//
// Packing is greedy, as in the engine reference: items are admitted in order
// until the next one would push the batch past max_tokens_per_batch or
// max_items_per_batch; the first item that does not fit ends the batch (no
// skipping ahead, which would reorder work). An item whose cost alone exceeds
// the token budget is returned alone, so it always makes progress. An empty
// batch comes back only when nothing is pending.
//
// Two orders:
//   kByKey  (request_id, item_index) ascending: the reference's order. It
//           starves a request whose id sorts late while earlier-sorting work
//           keeps arriving.
//   kFifo   arrival order of first add; a re-add overwrites the item but keeps
//           its position. An item waits at most for the items added before
//           it, so its wait is bounded. The C++ default.
//
// Add() is idempotent on (request_id, item_index): a re-add overwrites.
// Costs are post-merge token counts: Add() throws epd::Error(kInvalidArgument)
// for a negative cost, or one that would take the pending total past 2^63 - 1,
// and changes nothing. (The reference accepts any Python int; a negative cost
// would make the budget meaningless, and an unbounded sum cannot be counted.)
//
// Complexity (n pending, k returned): add O(log n), remove O(log n),
// next_batch O(k log n), so draining n items is O(n log n). (The reference
// re-sorts all pending items on every next_batch: O(n^2 log n) to drain.)
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
#include <tuple>
#include <utility>
#include <vector>

namespace epd {

// One vision item awaiting encode, identified within its request. `cost` is
// the item's post-merge token count, the budget unit.
struct PendingEncodeItem {
  std::string request_id;
  std::int64_t item_index = 0;
  std::int64_t cost = 0;

  std::pair<std::string, std::int64_t> key() const { return {request_id, item_index}; }
  friend bool operator==(const PendingEncodeItem&, const PendingEncodeItem&) = default;
};

enum class ScheduleOrder : std::uint8_t { kByKey = 0, kFifo = 1 };

class EncodeScheduler {
 public:
  using Key = std::pair<std::string, std::int64_t>;

  // Throws epd::Error(kInvalidArgument) naming the argument when either bound
  // is <= 0.
  EncodeScheduler(std::int64_t max_tokens_per_batch, std::int64_t max_items_per_batch,
                  ScheduleOrder order = ScheduleOrder::kFifo);

  // Adds or overwrites the item under item.key(). Throws
  // epd::Error(kInvalidArgument) for a cost < 0 or a pending token total that
  // would exceed 2^63 - 1; nothing changes then.
  void Add(PendingEncodeItem item);
  // Drops the item under `key`; returns whether it was pending.
  bool Remove(const Key& key);
  bool Contains(const Key& key) const { return items_.count(key) != 0; }

  // Pops and returns the next batch; empty only when nothing is pending.
  std::vector<PendingEncodeItem> NextBatch();

  std::size_t pending_size() const { return items_.size(); }
  std::int64_t pending_tokens() const { return pending_tokens_; }
  std::int64_t max_tokens_per_batch() const { return max_tokens_per_batch_; }
  std::int64_t max_items_per_batch() const { return max_items_per_batch_; }
  ScheduleOrder order() const { return order_; }

 private:
  struct Slot {
    PendingEncodeItem item;
    std::uint64_t seq;  // arrival of the first add; the kFifo position
  };

  std::int64_t max_tokens_per_batch_;
  std::int64_t max_items_per_batch_;
  ScheduleOrder order_;
  using ItemMap = std::map<Key, Slot>;
  ItemMap items_;  // ordered by key: the kByKey order
  // seq -> the item's node in items_ (std::map iterators stay valid until
  // that node is erased): the kFifo order, with no second key lookup per pop.
  std::map<std::uint64_t, ItemMap::iterator> fifo_;
  std::uint64_t next_seq_ = 0;
  std::int64_t pending_tokens_ = 0;
};

}  // namespace epd
