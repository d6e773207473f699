// JobScheduler (epd/core/job_scheduler.h). jobs_ maps each pending id to its
// slot; exactly one order index, the one of order_, maps to every pending
// node: by_key_ under (by_key, id), fifo_ under the sequence of its first
// add, fair_ under (its finish tag, that sequence). In kFair mode tenants_
// holds every tenant with a pending job (with their count) plus idle ones
// whose finish tag is still ahead of V (those are also in idle_), i.e. whose
// next job would not start at V; an idle tenant at or behind V is equivalent
// to a new one, so forgetting it changes no tag.
#include "epd/core/job_scheduler.h"

#include <algorithm>

#include "epd/core/status.h"

namespace epd {
namespace {

std::string Names(const ScheduledJob& job) {
  return " for item " + std::to_string(job.by_key.item) + " of request '" + job.by_key.request_id + "'";
}

}  // namespace

JobScheduler::JobScheduler(std::int64_t max_tokens_per_batch, std::int64_t max_items_per_batch, ScheduleOrder order,
                           std::int64_t max_share_per_batch)
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

// Costs are >= 0 and their sum fits in int64, so pending_tokens_ and every
// partial sum Select() forms stay exact.
void JobScheduler::CheckCosts(const ScheduledJob& job, std::int64_t replaced_cost, std::int64_t* total) const {
  if (job.share_cost < 0) {
    throw Error(StatusCode::kInvalidArgument,
                "share_cost must be >= 0, got " + std::to_string(job.share_cost) + Names(job));
  }
  if (job.cost < 0) {
    throw Error(StatusCode::kInvalidArgument,
                "cost must be >= 0 (a post-merge token count), got " + std::to_string(job.cost) + Names(job));
  }
  if (__builtin_add_overflow(pending_tokens_ - replaced_cost, job.cost, total)) {
    throw Error(StatusCode::kInvalidArgument, "cost " + std::to_string(job.cost) +
                                                  " would take the pending token total (" +
                                                  std::to_string(pending_tokens_) + ") past 2^63 - 1");
  }
}

void JobScheduler::Add(ScheduledJob job) {
  auto it = jobs_.lower_bound(job.id);
  const bool overwrite = it != jobs_.end() && it->first == job.id;
  std::int64_t total = 0;
  CheckCosts(job, overwrite ? it->second.job.cost : 0, &total);  // before anything changes
  pending_tokens_ = total;
  if (overwrite) {
    // The position, and the tenant the tags were charged to, stay the job's.
    Slot& slot = it->second;
    job.tenant = std::move(slot.job.tenant);
    job.by_key = std::move(slot.job.by_key);
    slot.job = std::move(job);
    return;
  }
  const std::uint64_t seq = next_seq_++;
  const Id id = job.id;
  Slot slot{std::move(job), seq};
  if (order_ == ScheduleOrder::kFair) {
    Tenant& t = tenants_[slot.job.tenant];
    if (t.pending == 0) idle_.erase({t.finish, slot.job.tenant});  // no-op for a new tenant
    slot.start = std::max(virtual_time_, t.finish);
    slot.finish = slot.start + slot.job.share();
    t.finish = slot.finish;
    ++t.pending;
  }
  auto node = jobs_.emplace_hint(it, id, std::move(slot));
  switch (order_) {
    case ScheduleOrder::kByKey:
      by_key_.emplace(std::make_pair(node->second.job.by_key, id), node);
      break;
    case ScheduleOrder::kFifo:
      fifo_.emplace(seq, node);
      break;
    case ScheduleOrder::kFair:
      fair_.emplace(std::make_pair(node->second.finish, seq), node);
      break;
  }
}

void JobScheduler::Departed(std::map<std::string, Tenant>::iterator t) {
  if (--t->second.pending > 0) return;
  if (t->second.finish <= virtual_time_) {
    tenants_.erase(t);
  } else {
    idle_.emplace(t->second.finish, t->first);
  }
}

void JobScheduler::Advance(Tag start) {
  if (start <= virtual_time_) return;
  virtual_time_ = start;
  while (!idle_.empty() && idle_.begin()->first <= virtual_time_) {
    tenants_.erase(idle_.begin()->second);
    idle_.erase(idle_.begin());
  }
}

void JobScheduler::ResetIfEmpty() {
  if (!jobs_.empty()) return;
  tenants_.clear();
  idle_.clear();
  virtual_time_ = 0;
}

void JobScheduler::Unlink(JobMap::iterator it) {
  const Slot& slot = it->second;
  switch (order_) {
    case ScheduleOrder::kByKey:
      by_key_.erase({slot.job.by_key, it->first});
      break;
    case ScheduleOrder::kFifo:
      fifo_.erase(slot.seq);
      break;
    case ScheduleOrder::kFair:
      fair_.erase({slot.finish, slot.seq});
      // The tenant keeps its finish tag: a removed job's share is not
      // refunded (a refund would depend on which later jobs were already
      // tagged).
      Departed(tenants_.find(slot.job.tenant));
      break;
  }
  pending_tokens_ -= slot.job.cost;
}

bool JobScheduler::Remove(Id id) {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return false;
  Unlink(it);
  jobs_.erase(it);
  ResetIfEmpty();
  return true;
}

const ScheduledJob* JobScheduler::Find(Id id) const {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : &it->second.job;
}

std::vector<JobScheduler::JobMap::const_iterator> JobScheduler::Select(bool* stopped_early) const {
  std::vector<JobMap::const_iterator> batch;
  // 128-bit so that a sum of huge costs cannot wrap and pass the budget check
  // (the reference's Python ints never overflow).
  __int128 used = 0, shared = 0;
  const bool bound_share = order_ == ScheduleOrder::kFair && max_share_per_batch_ > 0;
  // Takes the job at `it` unless it would overflow a non-empty batch.
  auto admit = [&](JobMap::const_iterator it) {
    const std::int64_t cost = it->second.job.cost;
    const std::int64_t share = it->second.job.share();
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
  // Walks one order index until a job does not fit.
  auto walk = [&](const auto& index) {
    auto f = index.begin();
    while (f != index.end() && admit(f->second)) ++f;
    if (stopped_early != nullptr) *stopped_early = f != index.end();
  };
  switch (order_) {
    case ScheduleOrder::kByKey:
      walk(by_key_);
      break;
    case ScheduleOrder::kFifo:
      walk(fifo_);
      break;
    case ScheduleOrder::kFair:
      walk(fair_);
      break;
  }
  return batch;
}

JobScheduler::Rank JobScheduler::RankOf(Id id) const {
  const Slot& slot = jobs_.at(id);
  return {order_ == ScheduleOrder::kFair ? slot.finish : Tag{0}, slot.seq};
}

std::vector<JobScheduler::Id> JobScheduler::PeekBatch() const {
  std::vector<Id> ids;
  for (JobMap::const_iterator it : Select()) ids.push_back(it->first);
  return ids;
}

bool JobScheduler::NextBatchClosed() const {
  if (order_ != ScheduleOrder::kFifo) return false;
  bool stopped_early = false;
  const std::size_t n = Select(&stopped_early).size();
  return stopped_early || static_cast<std::int64_t>(n) >= max_items_per_batch_;
}

std::vector<ScheduledJob> JobScheduler::NextBatch() {
  std::vector<ScheduledJob> batch;
  for (JobMap::const_iterator c : Select()) {
    auto it = jobs_.erase(c, c);  // the same node, as a mutable iterator
    Unlink(it);
    if (order_ == ScheduleOrder::kFair) Advance(it->second.start);
    batch.push_back(std::move(it->second.job));
    jobs_.erase(it);
  }
  ResetIfEmpty();
  return batch;
}

}  // namespace epd
