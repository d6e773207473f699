// The worker thread is the only one that touches worker_ (its options are
// immutable and read from any thread). Other threads talk to it through the
// inbox under mu_; results go back through the callbacks and a promise per
// request. Commands are taken from the inbox in batches (all that are queued)
// so a burst of submits costs one lock round-trip. Tower batches run on the
// worker's own tower thread (StartBatch/FinishBatch), so this thread keeps
// draining the inbox while the tower runs: hits are served and misses queued
// (and their decoding started) without waiting for the batch.
#include "epd/worker_loop.h"

#include <cassert>
#include <utility>

namespace epd {
namespace {

using Clock = std::chrono::steady_clock;

// Runs the user's on_done (which may throw), then fulfils the promise either way.
void Finish(const std::function<void(const RequestResult&)>& on_done, std::promise<RequestResult>& promise,
            const RequestResult& result) {
  try {
    if (on_done) on_done(result);
  } catch (...) {
    promise.set_value(result);
    throw;
  }
  promise.set_value(result);
}

}  // namespace

WorkerLoop::WorkerLoop(std::unique_ptr<EncodeWorker> worker) : worker_(std::move(worker)) {
  assert(worker_ != nullptr);
  stats_ = worker_->stats();
  thread_ = std::thread([this] { Run(); });
}

WorkerLoop::~WorkerLoop() { Shutdown(std::chrono::milliseconds(0)); }

std::future<RequestResult> WorkerLoop::Submit(EncodeRequest request, RequestCallbacks callbacks) {
  auto promise = std::make_shared<std::promise<RequestResult>>();
  std::future<RequestResult> future = promise->get_future();
  // Hash here, on the caller's thread, outside the lock.
  std::vector<StatusOr<ContentKey>> keys = worker_->ItemKeys(request);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (accepting_) {
      inbox_.push_back(Command{false, std::move(request), std::move(callbacks), std::move(keys), promise});
      cv_.notify_one();
      return future;
    }
  }
  RequestResult refused{request.id, Status(StatusCode::kUnavailable, "the encode worker is shutting down"), {}};
  try {
    Finish(callbacks.on_done, *promise, refused);
  } catch (...) {
    // The future carries the result; the caller's callback error stays its own.
  }
  return future;
}

void WorkerLoop::Cancel(std::string id) {
  std::lock_guard<std::mutex> lock(mu_);
  Command c;
  c.cancel = true;
  c.request.id = std::move(id);
  inbox_.push_back(std::move(c));
  cv_.notify_one();
}

WorkerStats WorkerLoop::Stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return stats_;
}

void WorkerLoop::Wake() {
  std::lock_guard<std::mutex> lock(mu_);
  woken_ = true;
  cv_.notify_one();
}

void WorkerLoop::Shutdown(std::chrono::milliseconds grace) {
  std::lock_guard<std::mutex> serial(shutdown_mu_);
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    accepting_ = false;
    stopping_ = true;
    deadline_ = Clock::now() + grace;
    cv_.notify_one();
  }
  thread_.join();
}

void WorkerLoop::Process(Command& c) {
  if (c.cancel) {
    worker_->Cancel(c.request.id);
    return;
  }
  std::shared_ptr<std::promise<RequestResult>> promise = std::move(c.promise);
  std::function<void(const RequestResult&)> user_done = std::move(c.callbacks.on_done);
  // Publish before completing, so Stats() already counts a request its caller saw finish.
  RequestCallbacks callbacks{std::move(c.callbacks.on_item), [this, user_done, promise](const RequestResult& r) {
                               Publish();
                               Finish(user_done, *promise, r);
                             }};
  std::string id = c.request.id;
  Status s = worker_->Submit(std::move(c.request), std::move(callbacks), std::move(c.keys));
  if (!s.ok()) {
    try {
      Finish(user_done, *promise, RequestResult{std::move(id), std::move(s), {}});
    } catch (...) {
      // A throwing callback must not take the worker thread down.
    }
  }
}

void WorkerLoop::Publish() {
  WorkerStats s = worker_->stats();
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_ = std::move(s);
}

void WorkerLoop::Run() {
  // Wakes this thread when the tower thread finishes a batch; BatchFinished()
  // is set before it runs, and taking mu_ orders that with the wait below.
  auto batch_done = [this] {
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_one();
  };
  bool blocked = false;    // the last StartBatch found the sink full
  bool stop_seen = false;  // stopping_ observed: do not wake on it again
  for (;;) {
    const bool tower_idle = !worker_->TowerBusy();
    const bool can_start = tower_idle && worker_->HasQueuedWork() && !blocked;
    // After a stop, an empty worker must reach the exit below without waiting.
    const bool drained = !worker_->HasQueuedWork() && worker_->OutstandingBatches() == 0;
    std::deque<Command> commands;
    bool stopping;
    Clock::time_point deadline;
    {
      std::unique_lock<std::mutex> lock(mu_);
      auto wake = [&] {
        return !inbox_.empty() || woken_ || worker_->BatchFinished() || (stopping_ && !stop_seen);
      };
      if (blocked && tower_idle) {
        cv_.wait_for(lock, std::chrono::milliseconds(1), wake);  // poll the sink
      } else if (!can_start && !(stop_seen && drained)) {
        cv_.wait(lock, wake);
      }
      woken_ = false;
      commands.swap(inbox_);
      stopping = stopping_;
      deadline = deadline_;
    }
    stop_seen = stopping;
    for (Command& c : commands) Process(c);

    // stopping_ and accepting_ change together under mu_, so once `stopping`
    // is seen no Submit can enqueue after the drain above.
    if (stopping) {
      const bool expired = Clock::now() >= deadline;
      if (expired || (!worker_->HasQueuedWork() && worker_->OutstandingBatches() == 0)) {
        // Started batches cannot be interrupted: let them deliver.
        while (worker_->OutstandingBatches() > 0) worker_->FinishBatch();
        worker_->FailAll(Status(StatusCode::kUnavailable, "the encode worker shut down before the item was encoded"));
        Publish();
        return;
      }
    }
    // Keep the tower fed first, then collect what it finished: the collect
    // (copies, cache, callbacks) overlaps the next batch.
    blocked = false;
    if (!worker_->TowerBusy() && worker_->HasQueuedWork()) blocked = !worker_->StartBatch(batch_done);
    while (worker_->BatchFinished()) worker_->FinishBatch();
    Publish();
  }
}

}  // namespace epd
