// src/worker/prefetch_decoder.h (internal to epd::worker): decodes and
// preprocesses queued misses on helper threads while the tower runs.
//
// The worker queues a miss on the scheduler with the token count its header
// gives (cheap), and hands the bytes to Enqueue(). Helper threads decode
// tasks in Enqueue order, keeping at most `lookahead` finished results that
// nobody has taken (bounded memory: a 512x512 image's patches are ~6 MB).
// When the tower thread runs a batch it Take()s each item's result: a
// finished result is handed over, a running decode is waited for, and a task
// no helper has started is decoded on the tower thread at once (so the batch
// never waits behind unrelated work). Batch formation never depends on decode timing:
// the scheduler sees only header-derived costs.
//
// With threads == 0 no helper runs and Take() decodes on the caller.
//
// Order: helpers take the queued task of lowest rank (the scheduler's
// JobScheduler::RankOf, so decoding follows the order batches will be
// served in: arrival for kFifo, the fair order for kFair). With `fair` set:
//   - the last idle helper only takes a task whose tenant has no decode
//     running, so one tenant's expensive decodes never occupy every helper
//     while another tenant's work waits (with one helper the rule is void);
//   - Need() marks a task the next batch needs: it is taken even when
//     `lookahead` results are already waiting (they are speculative, it is
//     not), so a batch gated on Ready() always makes progress.
//
// Thread safety: Enqueue and Drop are called by the worker's owning thread,
// Take by its tower thread (TowerRunner); the helpers and those two
// synchronise through one mutex. A task is taken or dropped at most once.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "epd/core/job_scheduler.h"
#include "epd/core/mutex.h"
#include "epd/core/status.h"
#include "epd/media/image.h"
#include "epd/media/preprocess.h"
#include "epd/worker/encode_request.h"

namespace epd::internal {

class PrefetchDecoder {
 public:
  struct Task;  // opaque; owned jointly by the worker and the decoder

  using Rank = JobScheduler::Rank;

  PrefetchDecoder(PreprocessConfig config, DecodeLimits limits, int threads, std::int64_t lookahead, bool fair = false);
  ~PrefetchDecoder();  // stops and joins the helpers; pending tasks are abandoned
  PrefetchDecoder(const PrefetchDecoder&) = delete;
  PrefetchDecoder& operator=(const PrefetchDecoder&) = delete;

  // Queues `media` for decoding at `rank` (unique among queued tasks) for
  // `tenant`; the returned handle is passed to Take or Drop.
  std::shared_ptr<Task> Enqueue(MediaBytes media, Rank rank, std::string tenant = {});
  // Queues a computation that makes the rows itself (a video's temporal
  // chunk: PreprocessChunk over frames already decoded), run like a decode,
  // under the same rank and tenant rules.
  std::shared_ptr<Task> Enqueue(std::function<StatusOr<PreprocessedImage>()> make, Rank rank, std::string tenant = {});

  // True when a helper has finished the task (Take will not wait or decode).
  bool Ready(const std::shared_ptr<Task>& task);
  // Marks the task as needed by the next batch (see Order above).
  void Need(const std::shared_ptr<Task>& task);
  int threads() const { return thread_count_; }

  // The decoded and preprocessed image, or the decode error (kInvalidArgument).
  // `seconds`, when set, receives the decode's own wall time (seconds,
  // whichever thread ran it; not the wait for it): the entry's decode cost.
  StatusOr<PreprocessedImage> Take(const std::shared_ptr<Task>& task, double* seconds = nullptr);

  // Forgets the task (cancelled work): a queued task is skipped, a running
  // one's result discarded.
  void Drop(const std::shared_ptr<Task>& task);

 private:
  void Run();
  std::shared_ptr<Task> Push(std::shared_ptr<Task> task);
  // Runs the task's decode and records its wall time in it.
  StatusOr<PreprocessedImage> Decode(Task& task) const;
  // The queued task a helper may start now, or null.
  std::shared_ptr<Task> PickLocked() const EPD_REQUIRES(mu_);

  const PreprocessConfig config_;
  const DecodeLimits limits_;
  const std::int64_t lookahead_;
  const bool fair_;
  // The helpers' count, fixed before the first one starts: a helper reads it
  // (PickLocked) while the constructor may still be starting the others, so
  // it must not be threads_.size().
  const int thread_count_;

  Mutex mu_;
  CondVar work_cv_;                                                  // helpers: a task or room appeared, or stop
  CondVar done_cv_;                                                  // Take: a running task finished
  std::map<Rank, std::shared_ptr<Task>> queue_ EPD_GUARDED_BY(mu_);  // exactly the kQueued tasks
  std::int64_t ready_ EPD_GUARDED_BY(mu_) = 0;                       // finished results not yet taken
  int busy_ EPD_GUARDED_BY(mu_) = 0;                                 // helpers decoding
  std::map<std::string, int> running_ EPD_GUARDED_BY(mu_);           // fair_: decodes running per tenant
  bool stop_ EPD_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;  // touched only by the constructor and destructor
};

}  // namespace epd::internal
