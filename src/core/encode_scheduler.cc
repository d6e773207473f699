// The scheduler keeps one ordered map from (request_id, item_index) to the
// item, which is itself the kByKey order, and, in kFifo mode, a second map
// from arrival sequence to that item's node. Invariant: in kFifo mode every
// pending key has exactly one fifo_ entry, under the sequence of its first add.
#include "epd/encode_scheduler.h"

#include "epd/status.h"

namespace epd {

EncodeScheduler::EncodeScheduler(std::int64_t max_tokens_per_batch, std::int64_t max_items_per_batch,
                                 ScheduleOrder order)
    : max_tokens_per_batch_(max_tokens_per_batch), max_items_per_batch_(max_items_per_batch), order_(order) {
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
  if (item.cost < 0) {
    throw Error(StatusCode::kInvalidArgument, "cost must be >= 0 (a post-merge token count), got " +
                                                  std::to_string(item.cost) + " for item " + std::to_string(item.item_index) +
                                                  " of request '" + item.request_id + "'");
  }
  std::int64_t total = 0;
  if (__builtin_add_overflow(pending_tokens_ - (overwrite ? it->second.item.cost : 0), item.cost, &total)) {
    throw Error(StatusCode::kInvalidArgument,
                "cost " + std::to_string(item.cost) + " would take the pending token total (" +
                    std::to_string(pending_tokens_) + ") past 2^63 - 1");
  }
  if (overwrite) {
    pending_tokens_ = total;
    it->second.item = std::move(item);
    return;
  }
  const std::uint64_t seq = next_seq_++;
  pending_tokens_ = total;
  auto inserted = items_.emplace_hint(it, std::move(key), Slot{std::move(item), seq});
  if (order_ == ScheduleOrder::kFifo) fifo_.emplace(seq, inserted);
}

bool EncodeScheduler::Remove(const Key& key) {
  auto it = items_.find(key);
  if (it == items_.end()) return false;
  if (order_ == ScheduleOrder::kFifo) fifo_.erase(it->second.seq);
  pending_tokens_ -= it->second.item.cost;
  items_.erase(it);
  return true;
}

std::vector<PendingEncodeItem> EncodeScheduler::NextBatch() {
  std::vector<PendingEncodeItem> batch;
  // 128-bit so that a sum of huge costs cannot wrap and pass the budget check
  // (the reference's Python ints never overflow).
  __int128 used = 0;
  // Admits the item at `it` unless it would overflow a non-empty batch.
  auto admit = [&](ItemMap::iterator it) {
    const std::int64_t cost = it->second.item.cost;
    if (!batch.empty() && (used + cost > max_tokens_per_batch_ ||
                           static_cast<std::int64_t>(batch.size()) >= max_items_per_batch_)) {
      return false;
    }
    used += cost;
    pending_tokens_ -= cost;
    batch.push_back(std::move(it->second.item));
    return true;
  };
  if (order_ == ScheduleOrder::kByKey) {
    while (!items_.empty() && admit(items_.begin())) items_.erase(items_.begin());
  } else {
    while (!fifo_.empty()) {
      auto it = fifo_.begin()->second;
      if (!admit(it)) break;
      items_.erase(it);
      fifo_.erase(fifo_.begin());
    }
  }
  return batch;
}

}  // namespace epd
