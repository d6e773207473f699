// JobQueue (job_queue.h).
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

void JobQueue::AddBarrier(std::shared_ptr<GateBarrier> barrier) {
  ++barriers_;
  held_.push_back({JobWork{}, std::move(barrier)});
}

void JobQueue::Flush() {
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
  auto h =
      std::find_if(held_.begin(), held_.end(), [&](const Held& e) { return e.barrier == nullptr && e.work.id == id; });
  if (h == held_.end()) return false;
  --held_jobs_;
  held_tokens_ -= h->work.cost;
  held_.erase(h);
  return true;
}

bool JobQueue::Gated() const { return barriers_ > 0 && !scheduler_.NextBatchClosed(); }

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
  if (scheduler_.pending_size() == 0 || Gated() || !NextBatchDecoded()) return {};
  std::vector<BatchEntry> entries;
  for (const ScheduledJob& job : scheduler_.NextBatch()) {
    auto q = queued_.find(job.id);
    entries.push_back({job.id, std::move(q->second), Status::Ok(), {}});
    queued_.erase(q);
  }
  return entries;
}

}  // namespace epd::internal
