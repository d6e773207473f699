// The scheduler keeps one ordered map from (request_id, item_index) to the
// item, which is itself the kByKey order, and, in kFifo mode, a second map
// from arrival sequence to that item's node. Invariant: in kFifo mode every
// pending key has exactly one fifo_ entry, under the sequence of its first add.
// In kFair mode every pending key has exactly one fair_ entry, under (its
// finish tag, that sequence), and tenants_ holds every tenant with a pending
// item (with their count) plus idle ones whose finish tag is still ahead of
// V (those are also in idle_), i.e. whose next item would not start at V; an
// idle tenant at or behind V is equivalent to a new one, so forgetting it
// changes no tag.
#include "epd/core/encode_scheduler.h"

#include <algorithm>

#include "epd/core/status.h"

namespace epd {

EncodeScheduler::EncodeScheduler(std::int64_t max_tokens_per_batch, std::int64_t max_items_per_batch,
                                 ScheduleOrder order, std::int64_t max_share_per_batch)
    : max_tokens_per_batch_(max_tokens_per_batch),
      max_items_per_batch_(max_items_per_batch),
      order_(order),
      max_share_per_batch_(max_share_per_batch) {
  if (max_share_per_batch < 0) {
    throw Error(StatusCode::kInvalidArgument,
                "max_share_per_batch must be >= 0 (0 = unbounded), got " + std::to_string(max_share_per_batch));
  }
  if (max_tokens_per_batch <= 0) {
    throw Error(StatusCode::kInvalidArgument,
                "max_tokens_per_batch must be > 0, got " + std::to_string(max_tokens_per_batch));
  }
  if (max_items_per_batch <= 0) {
    throw Error(StatusCode::kInvalidArgument,
                "max_items_per_batch must be > 0, got " + std::to_string(max_items_per_batch));
  }
}

void EncodeScheduler::Add(PendingEncodeItem item) {
  Key key = item.key();
  auto it = items_.lower_bound(key);
  const bool overwrite = it != items_.end() && it->first == key;
  // Costs are >= 0 and their sum fits in int64, so pending_tokens_ and every
  // partial sum next_batch() forms stay exact. Checked before anything changes.
  if (item.share_cost < 0) {
    throw Error(StatusCode::kInvalidArgument, "share_cost must be >= 0, got " + std::to_string(item.share_cost) +
                                                  " for item " + std::to_string(item.item_index) + " of request '" +
                                                  item.request_id + "'");
  }
  if (item.cost < 0) {
    throw Error(StatusCode::kInvalidArgument,
                "cost must be >= 0 (a post-merge token count), got " + std::to_string(item.cost) + " for item " +
                    std::to_string(item.item_index) + " of request '" + item.request_id + "'");
  }
  std::int64_t total = 0;
  if (__builtin_add_overflow(pending_tokens_ - (overwrite ? it->second.item.cost : 0), item.cost, &total)) {
    throw Error(StatusCode::kInvalidArgument, "cost " + std::to_string(item.cost) +
                                                  " would take the pending token total (" +
                                                  std::to_string(pending_tokens_) + ") past 2^63 - 1");
  }
  if (overwrite) {
    pending_tokens_ = total;
    // The tenant the tags were charged to stays the item's.
    std::string tenant = std::move(it->second.item.tenant);
    it->second.item = std::move(item);
    it->second.item.tenant = std::move(tenant);
    return;
  }
  const std::uint64_t seq = next_seq_++;
  pending_tokens_ = total;
  Slot slot{std::move(item), seq};
  if (order_ == ScheduleOrder::kFair) {
    Tenant& t = tenants_[slot.item.tenant];
    if (t.pending == 0) idle_.erase({t.finish, slot.item.tenant});  // no-op for a new tenant
    slot.start = std::max(virtual_time_, t.finish);
    slot.finish = slot.start + slot.item.share();
    t.finish = slot.finish;
    ++t.pending;
  }
  const Tag finish = slot.finish;
  auto inserted = items_.emplace_hint(it, std::move(key), std::move(slot));
  if (order_ == ScheduleOrder::kFifo) fifo_.emplace(seq, inserted);
  if (order_ == ScheduleOrder::kFair) fair_.emplace(std::make_pair(finish, seq), inserted);
}

void EncodeScheduler::Departed(std::map<std::string, Tenant>::iterator t) {
  if (--t->second.pending > 0) return;
  if (t->second.finish <= virtual_time_) {
    tenants_.erase(t);
  } else {
    idle_.emplace(t->second.finish, t->first);
  }
}

void EncodeScheduler::Advance(Tag start) {
  if (start <= virtual_time_) return;
  virtual_time_ = start;
  while (!idle_.empty() && idle_.begin()->first <= virtual_time_) {
    tenants_.erase(idle_.begin()->second);
    idle_.erase(idle_.begin());
  }
}

bool EncodeScheduler::Remove(const Key& key) {
  auto it = items_.find(key);
  if (it == items_.end()) return false;
  if (order_ == ScheduleOrder::kFifo) fifo_.erase(it->second.seq);
  if (order_ == ScheduleOrder::kFair) {
    fair_.erase({it->second.finish, it->second.seq});
    // The tenant keeps its finish tag: a removed item's share is not refunded
    // (a refund would depend on which later items were already tagged).
    Departed(tenants_.find(it->second.item.tenant));
  }
  pending_tokens_ -= it->second.item.cost;
  items_.erase(it);
  if (items_.empty()) {
    tenants_.clear();
    idle_.clear();
    virtual_time_ = 0;
  }
  return true;
}

std::vector<EncodeScheduler::ItemMap::const_iterator> EncodeScheduler::Select() const {
  std::vector<ItemMap::const_iterator> batch;
  // 128-bit so that a sum of huge costs cannot wrap and pass the budget check
  // (the reference's Python ints never overflow).
  __int128 used = 0, shared = 0;
  const bool bound_share = order_ == ScheduleOrder::kFair && max_share_per_batch_ > 0;
  // Takes the item at `it` unless it would overflow a non-empty batch.
  auto admit = [&](ItemMap::const_iterator it) {
    const std::int64_t cost = it->second.item.cost;
    const std::int64_t share = it->second.item.share();
    if (!batch.empty() &&
        (used + cost > max_tokens_per_batch_ || static_cast<std::int64_t>(batch.size()) >= max_items_per_batch_ ||
         (bound_share && shared + share > max_share_per_batch_))) {
      return false;
    }
    used += cost;
    shared += share;
    batch.push_back(it);
    return true;
  };
  switch (order_) {
    case ScheduleOrder::kByKey:
      for (auto it = items_.begin(); it != items_.end() && admit(it); ++it) {
      }
      break;
    case ScheduleOrder::kFifo:
      for (auto f = fifo_.begin(); f != fifo_.end() && admit(f->second); ++f) {
      }
      break;
    case ScheduleOrder::kFair:
      for (auto f = fair_.begin(); f != fair_.end() && admit(f->second); ++f) {
      }
      break;
  }
  return batch;
}

EncodeScheduler::Rank EncodeScheduler::RankOf(const Key& key) const {
  const Slot& slot = items_.at(key);
  return {order_ == ScheduleOrder::kFair ? slot.finish : Tag{0}, slot.seq};
}

std::vector<EncodeScheduler::Key> EncodeScheduler::PeekBatch() const {
  std::vector<Key> keys;
  for (ItemMap::const_iterator it : Select()) keys.push_back(it->first);
  return keys;
}

std::vector<PendingEncodeItem> EncodeScheduler::NextBatch() {
  std::vector<PendingEncodeItem> batch;
  for (ItemMap::const_iterator c : Select()) {
    auto it = items_.erase(c, c);  // the same node, as a mutable iterator
    Slot& slot = it->second;
    if (order_ == ScheduleOrder::kFifo) fifo_.erase(slot.seq);
    if (order_ == ScheduleOrder::kFair) {
      fair_.erase({slot.finish, slot.seq});
      Departed(tenants_.find(slot.item.tenant));
      Advance(slot.start);
    }
    pending_tokens_ -= slot.item.cost;
    batch.push_back(std::move(slot.item));
    items_.erase(it);
  }
  if (items_.empty()) {
    // Nothing pending: every tenant starts even again (and V stays small).
    tenants_.clear();
    idle_.clear();
    virtual_time_ = 0;
  }
  return batch;
}

}  // namespace epd
