// src/worker/tower_runner.h (internal to epd::worker): the encode worker's
// tower thread and the batches it runs.
//
// The owning thread fills a Batch (the jobs the scheduler chose, each with
// its prefetch decode handle) and hands it to Start(). The tower thread takes
// batches in start order: for each it takes the decoded images from the
// PrefetchDecoder (decoding any that no helper has started), runs
// VisionTower::Encode once, fires the batch's on_finished and marks it done.
// Collect() gives the oldest started batch back to the owner, waiting for
// its tower call if needed.
//
// Ownership: a Batch belongs to the runner from Start() until Collect()
// returns it. The tower thread touches only the batch it runs and the
// decoder (which has its own lock); the owner reads a batch again only after
// Collect(), i.e. after `done` was set under the runner's mutex.
//
// Thread safety: Start, Collect, Outstanding and Busy are called by the
// owning thread only; Finished() may be read from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "epd/core/mutex.h"
#include "epd/core/status.h"
#include "epd/core/vision_tower.h"
#include "epd/media/preprocess.h"
#include "prefetch_decoder.h"

namespace epd::internal {

// One computation of a started batch.
struct BatchEntry {
  std::uint64_t job = 0;                          // the worker's job id
  std::shared_ptr<PrefetchDecoder::Task> decode;  // taken (and cleared) by the tower thread
  Status decode_status;                           // the decode's error, if any
  PreprocessedImage image;
  double decode_seconds = 0;  // wall time of its decode and preprocessing
};

// A started batch. Filled by the owner, then the tower thread's until `done`,
// then the owner's again.
struct Batch {
  using Clock = std::chrono::steady_clock;

  std::vector<BatchEntry> entries;
  std::function<void()> on_finished;  // runs on the tower thread; must not throw
  bool done = false;                  // guarded by TowerRunner::mu_ (another object's lock: not annotatable)
  std::int64_t decoded = 0;           // entries sent to the tower
  std::int64_t tokens = 0;            // their post-merge tokens
  StatusOr<TowerOutput> out = Status(StatusCode::kInternal, "no item of the batch decoded");
  Clock::time_point start;  // tower call start
  double tower_ms = 0;
};

// The measured cost of entry `e` of the finished batch `b`, in seconds: its
// decode and preprocessing, plus `prior_seconds` (work done before it was
// queued: a video chunk's share of its container decode), plus its share of
// the tower call apportioned by post-merge tokens, tower_s * tokens_e /
// b.tokens (docs/PLAN.md, "What the worker passes").
double EntrySeconds(const Batch& b, const BatchEntry& e, double prior_seconds);

class TowerRunner {
 public:
  // `tower` and `decoder` must outlive the runner. Starts the tower thread.
  TowerRunner(VisionTower& tower, PrefetchDecoder& decoder);
  // Waits for every started batch's tower call, then stops the thread.
  ~TowerRunner();
  TowerRunner(const TowerRunner&) = delete;
  TowerRunner& operator=(const TowerRunner&) = delete;

  // Hands `batch` to the tower thread (runs after those started before it).
  void Start(std::unique_ptr<Batch> batch);
  // The oldest started batch, once its tower call has returned (waits for
  // it); null when none is outstanding.
  std::unique_ptr<Batch> Collect();

  // Started batches not yet collected.
  std::int64_t Outstanding() const { return static_cast<std::int64_t>(outstanding_.size()); }
  // A started batch's tower call has not returned yet.
  bool Busy() const { return Outstanding() > finished_.load(std::memory_order_acquire); }
  // The oldest outstanding batch's tower call has returned. Thread-safe.
  bool Finished() const { return finished_.load(std::memory_order_acquire) > 0; }

 private:
  void Loop();
  // On the tower thread: decode what the helpers have not, then one Encode.
  void Run(Batch& b);

  VisionTower& tower_;
  PrefetchDecoder& decoder_;
  // The owner's view, oldest first: at most one running plus the finished.
  std::deque<std::unique_ptr<Batch>> outstanding_;
  std::atomic<int> finished_{0};  // batches the tower thread is through with, not yet collected
  Mutex mu_;
  CondVar cv_;
  std::deque<Batch*> queue_ EPD_GUARDED_BY(mu_);
  bool stop_ EPD_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last member: starts after everything it uses
};

}  // namespace epd::internal
