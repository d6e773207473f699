// epd/core/encode_scheduler.h: the deterministic token-budget batcher of the
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
// the token budget is returned alone, so it always makes progress. kFair may
// also bound a batch's share costs (max_share_per_batch). An empty
// batch comes back only when nothing is pending.
//
// Two orders:
//   kByKey  (request_id, item_index) ascending: the reference's order. It
//           starves a request whose id sorts late while earlier-sorting work
//           keeps arriving.
//   kFifo   arrival order of first add; a re-add overwrites the item but keeps
//           its position. An item waits at most for the items added before
//           it, so its wait is bounded. The C++ default.
//   kFair   fair across tenants (PendingEncodeItem::tenant), weighted by
//           cost: start-time fair queueing with virtual finish tags, computed
//           only from the sequence of Add/Remove/NextBatch calls and the
//           items' share costs (never from clocks). Each tenant's items keep
//           their arrival order; across tenants, an item's tag is
//             start  = max(V, finish tag of the tenant's previous item)
//             finish = start + share cost (PendingEncodeItem::share(), >= 1)
//           and items are served by (finish, arrival). V, the virtual time, is
//           the largest start tag served so far; it resets to 0 with every
//           tenant's history when nothing is pending. So a tenant that queued
//           a long run of expensive items first gets its share, and one that
//           arrives later is served after at most about one share's worth
//           of each other tenant's cost, not after the whole run. With one
//           tenant kFair is kFifo. (Goyal, Vin and Cheng, "Start-time Fair
//           Queueing", SIGCOMM 1996; the finish-tag order is that of WFQ,
//           Demers, Keshav and Shenker, SIGCOMM 1989.)
//
// Add() is idempotent on (request_id, item_index): a re-add overwrites.
// Costs are post-merge token counts: Add() throws epd::Error(kInvalidArgument)
// for a negative cost, or one that would take the pending total past 2^63 - 1,
// and changes nothing. (The reference accepts any Python int; a negative cost
// would make the budget meaningless, and an unbounded sum cannot be counted.)
//
// Complexity (n pending, k returned, m tenants known): add O(log n + log m),
// remove O(log n + log m), next_batch O(k (log n + log m)), so draining n
// items is O(n log n). kFair remembers a tenant while it has pending items,
// or its finish tag is ahead of V (at most the tenants served since the
// queue was last empty). (The reference
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
#include <set>
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
  // kFair only (the other orders ignore both): who the item is queued for
  // (e.g. a client address or a tenant id; "" is a tenant too), and what it
  // costs its tenant's share, in any unit that is the same for every item
  // (the worker uses post-merge tokens plus decoded pixels / 784); <= 0 =
  // `cost`. Must be >= 0.
  std::string tenant{};
  std::int64_t share_cost = 0;

  std::pair<std::string, std::int64_t> key() const { return {request_id, item_index}; }
  // What kFair charges the tenant: share_cost, else cost, at least 1.
  std::int64_t share() const { return share_cost > 0 ? share_cost : (cost > 0 ? cost : 1); }
  friend bool operator==(const PendingEncodeItem&, const PendingEncodeItem&) = default;
};

enum class ScheduleOrder : std::uint8_t { kByKey = 0, kFifo = 1, kFair = 2 };

class EncodeScheduler {
 public:
  using Key = std::pair<std::string, std::int64_t>;

  // Throws epd::Error(kInvalidArgument) naming the argument when either bound
  // is <= 0.
  // `max_share_per_batch` (kFair only; 0 = unbounded) bounds a batch's sum
  // of PendingEncodeItem::share() the way max_tokens_per_batch bounds its
  // tokens (the first item always fits). The worker sets it so that an item
  // whose decode is expensive is not batched with cheap ones, which would
  // make them wait for its decode.
  EncodeScheduler(std::int64_t max_tokens_per_batch, std::int64_t max_items_per_batch,
                  ScheduleOrder order = ScheduleOrder::kFifo, std::int64_t max_share_per_batch = 0);

  // Adds or overwrites the item under item.key(). Throws
  // epd::Error(kInvalidArgument) for a cost < 0 or share_cost < 0, or a
  // pending token total that would exceed 2^63 - 1; nothing changes then. An
  // overwrite keeps the item's position (and, in kFair, its tenant and tags).
  void Add(PendingEncodeItem item);
  // Drops the item under `key`; returns whether it was pending.
  bool Remove(const Key& key);
  bool Contains(const Key& key) const { return items_.count(key) != 0; }

  // Pops and returns the next batch; empty only when nothing is pending.
  std::vector<PendingEncodeItem> NextBatch();
  // The keys NextBatch() would return now, in order, without popping them.
  // O(k log n).
  std::vector<Key> PeekBatch() const;

  // A pending item's place in line, for work done ahead of its batch (the
  // worker's decode prefetch): kFifo and kFair serve pending items in
  // ascending rank, and a pending item's rank never changes; kByKey gives
  // arrival order. Unique among pending items. REQUIRES: Contains(key).
  // O(log n).
  using Rank = std::pair<__int128, std::uint64_t>;
  Rank RankOf(const Key& key) const;

  std::size_t pending_size() const { return items_.size(); }
  std::int64_t pending_tokens() const { return pending_tokens_; }
  std::int64_t max_tokens_per_batch() const { return max_tokens_per_batch_; }
  std::int64_t max_items_per_batch() const { return max_items_per_batch_; }
  ScheduleOrder order() const { return order_; }

 private:
  // kFair tags: sums of share costs, 128-bit so that no sequence of adds
  // (each < 2^63, fewer than 2^64 of them) can wrap.
  using Tag = __int128;
  struct Slot {
    PendingEncodeItem item;
    std::uint64_t seq;  // arrival of the first add; the kFifo position
    Tag start = 0;      // kFair: virtual start and finish tags
    Tag finish = 0;
  };
  struct Tenant {
    Tag finish = 0;            // finish tag of its latest item
    std::int64_t pending = 0;  // its items pending
  };

  std::int64_t max_tokens_per_batch_;
  std::int64_t max_items_per_batch_;
  ScheduleOrder order_;
  std::int64_t max_share_per_batch_;
  using ItemMap = std::map<Key, Slot>;
  ItemMap items_;  // ordered by key: the kByKey order
  // seq -> the item's node in items_ (std::map iterators stay valid until
  // that node is erased): the kFifo order, with no second key lookup per pop.
  std::map<std::uint64_t, ItemMap::iterator> fifo_;
  // kFair: (finish tag, seq) -> the item's node; the tenants by name; V.
  std::map<std::pair<Tag, std::uint64_t>, ItemMap::iterator> fair_;
  std::map<std::string, Tenant> tenants_;
  // Idle tenants (no item pending) whose finish tag is ahead of V, by tag.
  std::set<std::pair<Tag, std::string>> idle_;
  Tag virtual_time_ = 0;
  std::uint64_t next_seq_ = 0;

  // The nodes NextBatch() pops next, in order (the greedy packing rule).
  std::vector<ItemMap::const_iterator> Select() const;
  // kFair: one item of tenant `t` left the queue; an idle tenant is
  // forgotten, or remembered in idle_ while its finish tag is ahead of V.
  void Departed(std::map<std::string, Tenant>::iterator t);
  // kFair: V advanced to at least `start`; forgets idle tenants it passed.
  void Advance(Tag start);
  std::int64_t pending_tokens_ = 0;
};

}  // namespace epd
