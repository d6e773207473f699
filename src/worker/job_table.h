// src/worker/job_table.h (internal to epd::worker): the worker's requests,
// jobs and waiters, and the delivery of results to them.
//
// A *request* is one accepted EncodeRequest: its callbacks and, per item, its
// result so far, the jobs it waits on and whether it was delivered. A *job*
// is one tower computation: a content key and the *waiters* (request, item,
// part) that receive its result. An item waits on one job (an image, a whole
// video), on several (a video's temporal chunks: its waiters carry part =
// the chunk index) or on nothing the table knows (a video whose decode is
// pending); an item assembled from several results registers an ItemSink,
// which the table hands each part's result and which says when the item is
// complete. The table never calls into video code otherwise.
//
// Invariants between calls:
//   - by_key maps a content key to its job when dedup is on (queued, held or
//     running), so a late duplicate joins even a running computation;
//   - every waiter's request is open, with that item not yet delivered, and
//     lists the job among the item's waits;
//   - a job without waiters is one that is running (its request was
//     cancelled under way; it is still cached when it finishes) or one the
//     caller is about to erase (Abort hands those to its `drop`).
//
// Delivery: results are posted (Post, DeliverJob) while the worker's state is
// updated and fired (Fire) only once it is consistent again, so a callback
// never sees a half-updated worker. A request is erased before its on_done
// runs, so its id is free again inside the callback's caller. An exception a
// callback throws is caught and counted (WorkerStats::callback_exceptions).
// Every item result delivered with an error is counted once in
// WorkerStats::errors, at delivery (a video's chunk failures only through the
// video's own result).
//
// Complexity: Open O(items); NewJob, Wait, InFlight O(1) expected; DeliverJob
// O(waiters); Fire O(deliveries); Abort O(items + waits).
// Thread safety: thread-compatible (the worker's owning thread).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "epd/core/content_key_type.h"
#include "epd/core/encode_types.h"
#include "epd/core/status.h"

namespace epd::internal {

using Clock = std::chrono::steady_clock;
using JobId = std::uint64_t;
using RequestNum = std::uint64_t;  // the table's number for a request: its submission number, from 1

// A duration in milliseconds, as the worker's timings and stats report it
// (the one definition every worker source uses).
inline double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// Receives the part results of an item assembled from several (a video from
// its temporal chunks, video_serving.h).
class ItemSink {
 public:
  virtual ~ItemSink() = default;
  // The result of part `part` of the item (a chunk's embedding or error).
  // Returns the item's result once it is complete, nullopt while it waits for
  // more.
  virtual std::optional<ItemResult> Take(std::int64_t part, ItemResult result) = 0;
  // The item's request ended (cancel, FailAll) before the item completed.
  virtual void Abandon() {}
};

class JobTable {
 public:
  struct Waiter {
    RequestNum request = 0;
    std::int64_t index = 0;
    Clock::time_point arrived;
    std::int64_t part = -1;  // >= 0: part `part` of an item with an ItemSink
  };
  struct Job {
    ContentKey key;
    std::vector<Waiter> waiters;
    bool running = false;
    // A whole video's job (grid (t, h, w)): its timing, delivered with the
    // embedding to every waiter. Null for images and chunks.
    std::shared_ptr<const VideoTiming> video_timing;
    // The tenant of the request that first waited on it: the one its cache
    // entry is charged to (WorkerOptions::tenant_quotas).
    std::string tenant;
    // Seconds of work this job's entry cost before it was queued (a video
    // chunk's share of its container decode), added to its measured cost.
    double prior_seconds = 0;
  };
  // A batch's timing, for the results it delivers.
  struct BatchTiming {
    Clock::time_point start;  // tower call start
    double tower_ms = 0;
    double entry_seconds = -1;  // the delivered entry's measured cost (ItemResult::encode_seconds)
  };

  // `stats` must outlive the table; `dedup` registers jobs by key.
  JobTable(WorkerStats& stats, bool dedup) : stats_(stats), dedup_(dedup) {}

  // --- requests ---
  // The open request with this id, if any.
  std::optional<RequestNum> Find(const std::string& id) const;
  RequestNum Open(std::string id, std::string tenant, RequestCallbacks callbacks, std::size_t items);
  // Completes `r` at once (on_done, status OK) when it has no item.
  void CompleteIfEmpty(RequestNum r);
  const std::string& id(RequestNum r) const { return requests_.at(r).id; }
  const std::string& tenant(RequestNum r) const { return requests_.at(r).tenant; }
  std::size_t open_requests() const { return requests_.size(); }
  // Every open request, oldest first.
  std::vector<RequestNum> OpenRequests() const;
  // Records item res.index's result so far (key, source) while it waits.
  void Hold(RequestNum r, ItemResult res);
  // The item's result so far (as held).
  const ItemResult& held(RequestNum r, std::int64_t index) const { return requests_.at(r).results.at(index); }
  // The item is assembled by `sink` (its waiters with part >= 0 go to it).
  void SetSink(RequestNum r, std::int64_t index, std::shared_ptr<ItemSink> sink);

  // --- jobs ---
  // A new job for `key`, without waiters (registered by key when dedup).
  JobId NewJob(const ContentKey& key);
  // The job computing `key` (dedup only; queued, held or running), if any.
  std::optional<JobId> InFlight(const ContentKey& key) const;
  // Adds a waiter to `job`; the item then waits on it too.
  void Wait(JobId job, const Waiter& w);
  // Joins the job computing res.key, if any (dedup only): the item waits on
  // it as ItemSource::kJoined, counted in WorkerStats::joins, and its result
  // so far is `res`. False (res untouched) when there is none.
  bool Join(RequestNum r, ItemResult& res, Clock::time_point arrived);
  Job& job(JobId id) { return jobs_.at(id); }
  bool HasJob(JobId id) const { return jobs_.count(id) != 0; }
  std::size_t jobs() const { return jobs_.size(); }
  void EraseJob(JobId id);

  // --- results ---
  // Posts a result for item result.index of `r` (part -1) or for one part.
  void Post(RequestNum r, ItemResult result, std::int64_t part = -1);
  // Posts one result per waiter of `job`: `embedding`, or `status` when null.
  void DeliverJob(JobId job, const BatchTiming& timing, const EmbeddingPtr& embedding, const Status& status);
  // Fires what was posted, in order: on_item per completed item, on_done per
  // completed request.
  void Fire();

  // Ends request `r` with `status`: its waiters leave their jobs (a job left
  // without waiters and not running goes to `drop`, which must take it out
  // of the queue, and is erased), its sinks are abandoned, its undelivered
  // items get `status` (counted in errors), and on_done fires. Counts
  // cancelled_requests.
  void Abort(RequestNum r, const Status& status, const std::function<void(JobId)>& drop);

 private:
  struct ItemState {
    std::vector<JobId> waits;  // the jobs it waits on, each once
    std::shared_ptr<ItemSink> sink;
    bool delivered = false;
  };
  struct Request {
    std::string id;
    std::string tenant;
    RequestCallbacks callbacks;
    std::vector<ItemResult> results;
    std::vector<ItemState> items;
    std::int64_t remaining = 0;
  };
  struct Posted {
    RequestNum request;
    ItemResult result;
    std::int64_t part;
  };

  // Erases the request, then fires its on_done.
  void Complete(std::unordered_map<RequestNum, Request>::iterator it, Status status);
  template <typename F>
  void Call(F&& f);

  WorkerStats& stats_;
  const bool dedup_;
  std::unordered_map<RequestNum, Request> requests_;
  std::unordered_map<std::string, RequestNum> request_ids_;
  std::unordered_map<JobId, Job> jobs_;
  std::unordered_map<ContentKey, JobId, ContentKeyHash> by_key_;
  std::vector<Posted> posted_;
  RequestNum next_request_ = 1;
  JobId next_job_ = 1;
};

}  // namespace epd::internal
