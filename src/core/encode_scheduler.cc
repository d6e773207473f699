// EncodeScheduler (epd/core/encode_scheduler.h): (request_id, item_index)
// keys mapped to JobScheduler ids. Invariant: ids_ holds exactly the pending
// items' keys, each under the id of its job in jobs_, whose by_key rank is
// (request_id, 0, item_index, 0), so kByKey orders by the key itself.
#include "epd/core/encode_scheduler.h"

namespace epd {
namespace {

PendingEncodeItem ItemOf(ScheduledJob&& job) {
  return PendingEncodeItem{std::move(job.by_key.request_id), job.by_key.item, job.cost, std::move(job.tenant),
                           job.share_cost};
}

}  // namespace

EncodeScheduler::EncodeScheduler(std::int64_t max_tokens_per_batch, std::int64_t max_items_per_batch,
                                 ScheduleOrder order, std::int64_t max_share_per_batch)
    : jobs_(max_tokens_per_batch, max_items_per_batch, order, max_share_per_batch) {}

void EncodeScheduler::Add(PendingEncodeItem item) {
  auto it = ids_.find(item.key());
  const JobScheduler::Id id = it != ids_.end() ? it->second : next_id_;
  ScheduledJob job{
      id, item.cost, std::move(item.tenant), item.share_cost, {std::move(item.request_id), 0, item.item_index, 0}};
  Key key{job.by_key.request_id, job.by_key.item};
  jobs_.Add(std::move(job));  // throws before anything changes
  if (it == ids_.end()) {
    ids_.emplace(std::move(key), id);
    ++next_id_;
  }
}

bool EncodeScheduler::Remove(const Key& key) {
  auto it = ids_.find(key);
  if (it == ids_.end()) return false;
  jobs_.Remove(it->second);
  ids_.erase(it);
  return true;
}

std::vector<PendingEncodeItem> EncodeScheduler::NextBatch() {
  std::vector<PendingEncodeItem> batch;
  for (ScheduledJob& job : jobs_.NextBatch()) {
    PendingEncodeItem item = ItemOf(std::move(job));
    ids_.erase(item.key());
    batch.push_back(std::move(item));
  }
  return batch;
}

std::vector<EncodeScheduler::Key> EncodeScheduler::PeekBatch() const {
  std::vector<Key> keys;
  for (const JobScheduler::Id id : jobs_.PeekBatch()) {
    const ScheduledJob* job = jobs_.Find(id);
    keys.emplace_back(job->by_key.request_id, job->by_key.item);
  }
  return keys;
}

}  // namespace epd
