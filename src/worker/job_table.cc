// JobTable (job_table.h).
#include "job_table.h"

#include <algorithm>
#include <utility>

namespace epd::internal {

std::optional<RequestNum> JobTable::Find(const std::string& id) const {
  auto it = request_ids_.find(id);
  if (it == request_ids_.end()) return std::nullopt;
  return it->second;
}

RequestNum JobTable::Open(std::string id, std::string tenant, RequestCallbacks callbacks, std::size_t items) {
  const RequestNum num = next_request_++;
  request_ids_.emplace(id, num);
  Request& r = requests_[num];
  r.id = std::move(id);
  r.tenant = std::move(tenant);
  r.callbacks = std::move(callbacks);
  r.results.resize(items);
  for (std::size_t i = 0; i < items; ++i) r.results[i].index = static_cast<std::int64_t>(i);
  r.items.resize(items);
  r.remaining = static_cast<std::int64_t>(items);
  return num;
}

void JobTable::CompleteIfEmpty(RequestNum r) {
  auto it = requests_.find(r);
  if (it != requests_.end() && it->second.items.empty()) Complete(it, Status::Ok());
}

std::vector<RequestNum> JobTable::OpenRequests() const {
  std::vector<RequestNum> nums;
  nums.reserve(requests_.size());
  for (const auto& [num, r] : requests_) nums.push_back(num);
  std::sort(nums.begin(), nums.end());
  return nums;
}

void JobTable::Hold(RequestNum r, ItemResult res) {
  Request& req = requests_.at(r);
  const std::size_t i = static_cast<std::size_t>(res.index);
  req.results.at(i) = std::move(res);
}

void JobTable::SetSink(RequestNum r, std::int64_t index, std::shared_ptr<ItemSink> sink) {
  requests_.at(r).items.at(static_cast<std::size_t>(index)).sink = std::move(sink);
}

JobId JobTable::NewJob(const ContentKey& key) {
  const JobId id = next_job_++;
  jobs_[id].key = key;
  if (dedup_) by_key_[key] = id;
  return id;
}

std::optional<JobId> JobTable::InFlight(const ContentKey& key) const {
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return std::nullopt;
  return it->second;
}

void JobTable::Wait(JobId job, const Waiter& w) {
  Job& j = jobs_.at(job);
  if (j.waiters.empty() && j.tenant.empty()) j.tenant = requests_.at(w.request).tenant;
  j.waiters.push_back(w);
  std::vector<JobId>& waits = requests_.at(w.request).items.at(static_cast<std::size_t>(w.index)).waits;
  if (std::find(waits.begin(), waits.end(), job) == waits.end()) waits.push_back(job);
}

bool JobTable::Join(RequestNum r, ItemResult& res, Clock::time_point arrived) {
  const std::optional<JobId> j = InFlight(res.key);
  if (!j.has_value()) return false;
  ++stats_.joins;
  Wait(*j, {r, res.index, arrived});
  res.source = ItemSource::kJoined;
  Hold(r, std::move(res));
  return true;
}

void JobTable::EraseJob(JobId id) {
  auto it = jobs_.find(id);
  if (auto k = by_key_.find(it->second.key); k != by_key_.end() && k->second == id) by_key_.erase(k);
  jobs_.erase(it);
}

void JobTable::Post(RequestNum r, ItemResult result, std::int64_t part) {
  posted_.push_back({r, std::move(result), part});
}

void JobTable::DeliverJob(JobId id, const BatchTiming& timing, const EmbeddingPtr& embedding, const Status& status) {
  const Job& job = jobs_.at(id);
  const Clock::time_point now = Clock::now();
  for (const Waiter& w : job.waiters) {
    ItemResult res;
    res.index = w.index;
    res.key = job.key;
    res.source = requests_.at(w.request).results.at(static_cast<std::size_t>(w.index)).source;
    res.queue_ms = std::max(0.0, Ms(timing.start - w.arrived));
    res.tower_ms = timing.tower_ms;
    res.total_ms = Ms(now - w.arrived);
    if (embedding != nullptr) {
      res.embedding = embedding;
      res.video = job.video_timing;
      res.encode_seconds = timing.entry_seconds;
    } else {
      res.status = status;
    }
    Post(w.request, std::move(res), w.part);
  }
}

void JobTable::Fire() {
  // Callbacks may not call back into the worker, so nothing is posted while
  // this runs; a sink's Take may cache, which posts nothing either.
  std::vector<Posted> posted = std::move(posted_);
  posted_.clear();
  for (Posted& d : posted) {
    auto it = requests_.find(d.request);
    if (it == requests_.end()) continue;  // unreachable: an abort posts nothing
    Request& r = it->second;
    const auto i = static_cast<std::size_t>(d.result.index);
    ItemState& item = r.items.at(i);
    if (d.part >= 0) {
      std::optional<ItemResult> whole = item.sink->Take(d.part, std::move(d.result));
      if (!whole.has_value()) continue;  // the item still waits on other parts
      d.result = std::move(*whole);
    }
    if (!d.result.status.ok()) ++stats_.errors[d.result.status.code()];
    r.results[i] = std::move(d.result);
    item = ItemState{};
    item.delivered = true;
    --r.remaining;
    if (r.callbacks.on_item) Call([&] { r.callbacks.on_item(r.results[i]); });
    if (r.remaining == 0) Complete(it, Status::Ok());
  }
}

void JobTable::Abort(RequestNum num, const Status& status, const std::function<void(JobId)>& drop) {
  auto it = requests_.find(num);
  Request& r = it->second;
  for (std::size_t i = 0; i < r.items.size(); ++i) {
    ItemState& item = r.items[i];
    if (item.delivered) continue;
    for (const JobId j : item.waits) {
      Job& job = jobs_.at(j);
      std::erase_if(job.waiters,
                    [&](const Waiter& w) { return w.request == num && w.index == static_cast<std::int64_t>(i); });
      if (job.waiters.empty() && !job.running) {
        drop(j);
        EraseJob(j);
      }
    }
    if (item.sink != nullptr) item.sink->Abandon();
    item = ItemState{};
    r.results[i].status = status;
    r.results[i].embedding = nullptr;
    ++stats_.errors[status.code()];
  }
  // Posted results of this request would find it gone; none can be pending
  // here (Fire runs before any call returns).
  ++stats_.cancelled_requests;
  Complete(it, status);
}

void JobTable::Complete(std::unordered_map<RequestNum, Request>::iterator it, Status status) {
  Request r = std::move(it->second);
  requests_.erase(it);
  request_ids_.erase(r.id);
  RequestResult result{std::move(r.id), std::move(status), std::move(r.results)};
  if (r.callbacks.on_done) Call([&] { r.callbacks.on_done(result); });
}

template <typename F>
void JobTable::Call(F&& f) {
  try {
    f();
  } catch (...) {
    ++stats_.callback_exceptions;
  }
}

}  // namespace epd::internal
