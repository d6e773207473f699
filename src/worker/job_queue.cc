// JobQueue (job_queue.h): the arrival line (kFifo, kByKey), then the lanes
// and slots (kFair).
#include "job_queue.h"

#include <algorithm>
#include <utility>

#include "item_rules.h"

namespace epd::internal {

JobQueue::JobQueue(const WorkerOptions& options, PrefetchDecoder& decoder)
    : options_(options),
      decoder_(decoder),
      scheduler_(options.max_tokens_per_batch, options.max_items_per_batch, options.order, FairShareBound(options)) {}

void JobQueue::Add(JobWork w) {
  if (Fair()) {
    if (auto lane = lanes_.find(w.tenant); lane != lanes_.end()) {
      ++held_jobs_;
      held_tokens_ += w.cost;
      lane->second.push_back({std::move(w), nullptr});
      return;
    }
    Queue(std::move(w));
    return;
  }
  if (barriers_ == 0) {
    Queue(std::move(w));
    return;
  }
  ++held_jobs_;
  held_tokens_ += w.cost;
  held_.push_back({std::move(w), nullptr});
}

void JobQueue::AddNow(JobWork w) { Queue(std::move(w)); }

void JobQueue::Queue(JobWork w) {
  const JobId id = w.id;
  scheduler_.Add({id, w.cost, w.tenant, w.share_cost, std::move(w.rank)});
  const JobScheduler::Rank rank = scheduler_.RankOf(id);
  std::shared_ptr<PrefetchDecoder::Task> task = w.make
                                                    ? decoder_.Enqueue(std::move(w.make), rank, std::move(w.tenant))
                                                    : decoder_.Enqueue(std::move(w.media), rank, std::move(w.tenant));
  queued_.emplace(id, std::move(task));
}

void JobQueue::AddBarrier(std::shared_ptr<GateBarrier> barrier, const std::string& tenant, const ByKeyRank& rank) {
  ++barriers_;
  JobWork place;
  place.rank = rank;
  if (!Fair()) {
    held_.push_back({std::move(place), std::move(barrier)});
    return;
  }
  Lane& lane = lanes_[tenant];
  const bool head = lane.empty();
  lane.push_back({std::move(place), std::move(barrier)});
  if (head) OpenSlot(tenant, rank);
}

void JobQueue::Flush() {
  if (Fair()) {
    DropAbandonedHeads();
    return;
  }
  while (!held_.empty()) {
    Held& head = held_.front();
    if (head.barrier != nullptr) {
      if (!head.barrier->Resolved()) return;
      std::shared_ptr<GateBarrier> b = std::move(head.barrier);
      held_.pop_front();
      --barriers_;
      b->Expand();
      continue;
    }
    JobWork w = std::move(head.work);
    held_.pop_front();
    --held_jobs_;
    held_tokens_ -= w.cost;
    Queue(std::move(w));
  }
}

bool JobQueue::Remove(JobId id) {
  if (auto q = queued_.find(id); q != queued_.end()) {
    scheduler_.Remove(id);
    decoder_.Drop(q->second);
    queued_.erase(q);
    return true;
  }
  return RemoveHeld(id);
}

bool JobQueue::RemoveHeld(JobId id) {
  auto match = [&](const Held& e) { return e.barrier == nullptr && e.work.id == id; };
  auto erase = [&](std::deque<Held>& line) {
    auto h = std::find_if(line.begin(), line.end(), match);
    if (h == line.end()) return false;
    --held_jobs_;
    held_tokens_ -= h->work.cost;
    line.erase(h);
    return true;
  };
  if (!Fair()) return erase(held_);
  // A lane never empties here: it starts with its barrier.
  return std::any_of(lanes_.begin(), lanes_.end(), [&](auto& lane) { return erase(lane.second); });
}

bool JobQueue::Gated() const {
  if (!Fair()) return barriers_ > 0 && !scheduler_.NextBatchClosed();
  const std::optional<JobId> head = HeadSlot();
  return head.has_value() && !lanes_.at(slots_.at(*head)).front().barrier->Resolved();
}

bool JobQueue::NextBatchDecoded() {
  if (options_.order != ScheduleOrder::kFair || decoder_.threads() == 0) return true;
  bool ready = true;
  for (const JobId id : scheduler_.PeekBatch()) {
    const std::shared_ptr<PrefetchDecoder::Task>& task = queued_.at(id);
    if (decoder_.Ready(task)) continue;
    decoder_.Need(task);
    ready = false;
  }
  return ready;
}

std::vector<BatchEntry> JobQueue::NextBatch() {
  if (Fair() ? !SettleHead() : Gated()) return {};
  if (scheduler_.pending_size() == 0 || !NextBatchDecoded()) return {};
  std::vector<BatchEntry> entries;
  for (const ScheduledJob& job : scheduler_.NextBatch()) {
    auto q = queued_.find(job.id);
    entries.push_back({job.id, std::move(q->second), Status::Ok(), {}});
    queued_.erase(q);
  }
  return entries;
}

// --- kFair: lanes and slots ---

// The image cost model's decode term (FairShareCost) for one frame of the
// largest size the video limits admit, and at least the batch share bound,
// so that no non-empty batch fits the slot.
std::int64_t JobQueue::SlotShare() const {
  const std::int64_t per_token = std::max<std::int64_t>(options_.preprocess.factor() * options_.preprocess.factor(), 1);
  return std::max(options_.video_limits.max_source_pixels / per_token, FairShareBound(options_));
}

void JobQueue::OpenSlot(const std::string& tenant, const ByKeyRank& rank) {
  const JobId id = kSlotBit | next_slot_++;
  scheduler_.Add({id, /*cost=*/0, tenant, SlotShare(), rank});
  slots_.emplace(id, tenant);
}

void JobQueue::CloseSlot(const std::string& tenant) {
  auto s = std::find_if(slots_.begin(), slots_.end(), [&](const auto& e) { return e.second == tenant; });
  scheduler_.Remove(s->first);
  slots_.erase(s);
}

void JobQueue::ReleaseLane(std::map<std::string, Lane>::iterator lane) {
  Lane& line = lane->second;
  while (!line.empty()) {
    Held& head = line.front();
    if (head.barrier == nullptr) {
      JobWork w = std::move(head.work);
      line.pop_front();
      --held_jobs_;
      held_tokens_ -= w.cost;
      Queue(std::move(w));
    } else if (head.barrier->Abandoned()) {
      line.pop_front();
      --barriers_;
    } else {
      OpenSlot(lane->first, head.work.rank);
      return;
    }
  }
  lanes_.erase(lane);
}

void JobQueue::DropAbandonedHeads() {
  for (auto lane = lanes_.begin(); lane != lanes_.end();) {
    auto next = std::next(lane);
    if (lane->second.front().barrier->Abandoned()) {
      CloseSlot(lane->first);
      lane->second.pop_front();
      --barriers_;
      ReleaseLane(lane);
    }
    lane = next;
  }
}

std::optional<JobId> JobQueue::HeadSlot() const {
  if (slots_.empty()) return std::nullopt;
  const std::vector<JobId> next = scheduler_.PeekBatch();
  if (next.empty() || (next.front() & kSlotBit) == 0) return std::nullopt;
  return next.front();
}

bool JobQueue::SettleHead() {
  for (std::optional<JobId> head = HeadSlot(); head.has_value(); head = HeadSlot()) {
    auto lane = lanes_.find(slots_.at(*head));
    std::shared_ptr<GateBarrier> b = lane->second.front().barrier;
    if (!b->Resolved()) return false;
    scheduler_.Remove(*head);
    slots_.erase(*head);
    lane->second.pop_front();
    --barriers_;
    b->Expand();  // queues the video's jobs (AddNow); an abandoned one's nothing
    ReleaseLane(lane);
  }
  return true;
}

}  // namespace epd::internal
