// src/worker/job_queue.h (internal to epd::worker): the jobs that are not yet
// in a tower batch, and the gate that keeps batches independent of video
// decode timing.
//
// A job goes through here from its creation to its batch: queued on the
// JobScheduler (by job id, with its by-key rank, cost, share cost and tenant)
// and handed to the PrefetchDecoder at its scheduler rank, or HELD behind a
// barrier. A barrier (GateBarrier) stands for a video whose container is
// still being decoded: the jobs its decode will make belong in the scheduler
// where the video was submitted, before every job submitted after it. So:
//   - while a barrier is pending, Add holds each new job in arrival order
//     (it is a job already: joinable and counted by the queue bound, but not
//     on the scheduler and not prefetched);
//   - Flush, once the head barrier is resolved (its decode completed or its
//     item was abandoned), calls its Expand, which queues the video's jobs
//     with AddNow, then queues the held jobs behind it, in order, up to the
//     next unresolved barrier;
//   - while any barrier is pending, NextBatch starts nothing (Gated()),
//     unless the scheduler's next batch is closed (kFifo: it ends before its
//     last pending job or is full, so no later job could join it).
// Hence every batch holds exactly what it would hold had each video been
// decoded inside its Submit: decode timing decides only WHEN a batch starts.
//
// Invariants between calls: the scheduler holds exactly the queued jobs, and
// queued_ their prefetch handles; held_ holds the held jobs and pending
// barriers in arrival order, and starts with an unresolved barrier or is
// empty once Flush has run.
//
// Complexity: Add, AddNow O(log n); Remove O(log n) for a queued job, O(held)
// for a held one; Flush O(jobs it queues * log n); NextBatch O(k log n).
// Thread safety: thread-compatible (the worker's owning thread).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "epd/core/job_scheduler.h"
#include "epd/media/preprocess.h"
#include "epd/worker/encode_request.h"
#include "epd/worker/worker_options.h"
#include "job_table.h"
#include "prefetch_decoder.h"
#include "tower_runner.h"

namespace epd::internal {

// A pending video's place in the queue (video_serving.h implements it).
class GateBarrier {
 public:
  virtual ~GateBarrier() = default;
  // True once the queue may pass it: the decode completed or the item left.
  virtual bool Resolved() const = 0;
  // Called once, by Flush, when the barrier is at the head and resolved. It
  // may queue jobs with JobQueue::AddNow (never Add or Flush) and post
  // results to the JobTable.
  virtual void Expand() = 0;
};

// One job's scheduling: what the scheduler needs and what makes its rows.
struct JobWork {
  JobId id = 0;
  std::int64_t cost = 0;        // post-merge tokens
  std::int64_t share_cost = 0;  // kFair (0 = cost)
  std::string tenant;
  ByKeyRank rank;
  // The rows: an image's bytes (decoded and preprocessed by the
  // PrefetchDecoder), or, when set, a computation that makes them (a video's
  // chunk, over frames already decoded).
  MediaBytes media;
  std::function<StatusOr<PreprocessedImage>()> make;
};

class JobQueue {
 public:
  // `options` and `decoder` must outlive the queue.
  JobQueue(const WorkerOptions& options, PrefetchDecoder& decoder);

  // Queues `w`, or holds it while a barrier is pending.
  void Add(JobWork w);
  // Queues `w` now, ahead of every held job. Only from GateBarrier::Expand.
  void AddNow(JobWork w);
  // Appends a barrier: jobs added after it are held until Flush passes it.
  void AddBarrier(std::shared_ptr<GateBarrier> barrier);
  // Passes the resolved barriers at the head (see the header comment).
  void Flush();
  // Takes job `id` out, held or queued (dropping its prefetch decode);
  // false when it is neither (it is running).
  bool Remove(JobId id);

  // True when NextBatch must wait for a pending barrier.
  bool Gated() const;
  // The next batch's entries (each with its prefetch handle), taken off the
  // scheduler; empty when nothing is queued, Gated(), or (kFair with decode
  // helpers) an item of the batch is not decoded yet: then every such item
  // is marked as needed, so the batch makes progress and the tower thread
  // never decodes, or waits on, an expensive image while other tenants'
  // work could run.
  std::vector<BatchEntry> NextBatch();

  std::int64_t queued() const { return static_cast<std::int64_t>(scheduler_.pending_size()); }
  std::int64_t held() const { return held_jobs_; }
  std::int64_t barriers() const { return barriers_; }
  // Tokens of the queued and held jobs.
  std::int64_t pending_tokens() const { return scheduler_.pending_tokens() + held_tokens_; }
  // What the queue bound counts as pending: queued and held jobs, and each
  // pending barrier as one job (a video not decoded yet, as Submit counts it).
  std::int64_t load() const { return queued() + held_jobs_ + barriers_; }

 private:
  struct Held {
    JobWork work;                          // unless `barrier`
    std::shared_ptr<GateBarrier> barrier;  // set for a barrier
  };
  void Queue(JobWork w);
  bool NextBatchDecoded();

  const WorkerOptions& options_;
  PrefetchDecoder& decoder_;
  JobScheduler scheduler_;
  std::unordered_map<JobId, std::shared_ptr<PrefetchDecoder::Task>> queued_;
  std::deque<Held> held_;
  std::int64_t held_jobs_ = 0;
  std::int64_t held_tokens_ = 0;
  std::int64_t barriers_ = 0;
};

}  // namespace epd::internal
