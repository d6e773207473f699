// The worker thread is the only one that touches worker_ (its options are
// immutable and read from any thread). Other threads talk to it through the
// inbox under mu_; results go back through the callbacks and a promise per
// request. Commands are taken from the inbox in batches (all that are queued)
// so a burst of submits costs one lock round-trip. Tower batches run on the
// worker's own tower thread (StartBatch/FinishBatch), and video containers on
// its decode threads, so this thread keeps draining the inbox while the tower
// runs or a video decodes: hits are served and misses queued (and their
// decoding started) without waiting for either.
#include "epd/worker/worker_loop.h"

#include <algorithm>
#include <cassert>
#include <utility>

#include "loop_command.h"
#include "shared_tier_lookup.h"

namespace epd {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

WorkerLoop::WorkerLoop(std::unique_ptr<EncodeWorker> worker) : worker_(std::move(worker)) {
  assert(worker_ != nullptr);
  stats_ = worker_->stats();
  if (worker_->options().shared_tier != nullptr) {
    parking_ = std::make_unique<internal::SharedTierParking>(worker_->options().shared_tier);
  }
  commands_ = std::make_unique<internal::CommandRunner>(
      *worker_, parking_.get(),
      [this](Command c) {
        MutexLock lock(mu_);
        PushLocked(std::move(c));
      },
      [this] { Publish(); });
  // A completed video decode wakes the thread (DecodeFinished is in the
  // wait's predicate); taking mu_ orders the notify with the wait.
  worker_->SetWake([this] {
    MutexLock lock(mu_);
    cv_.NotifyOne();
  });
  thread_ = std::thread([this] { Run(); });
}

WorkerLoop::~WorkerLoop() { Shutdown(std::chrono::milliseconds(0)); }

std::future<RequestResult> WorkerLoop::Submit(EncodeRequest request, RequestCallbacks callbacks, Ticket* ticket) {
  auto promise = std::make_shared<std::promise<RequestResult>>();
  std::future<RequestResult> future = promise->get_future();
  // Hash here, on the caller's thread, outside the lock.
  std::vector<StatusOr<ContentKey>> keys = worker_->ItemKeys(request);
  {
    MutexLock lock(mu_);
    if (accepting_) {
      Command c;
      c.request = std::move(request);
      c.callbacks = std::move(callbacks);
      c.keys = std::move(keys);
      c.promise = promise;
      c.ticket = next_ticket_++;
      if (ticket != nullptr) *ticket = c.ticket;
      PushLocked(std::move(c));
      return future;
    }
  }
  // The future carries the result; the caller's callback error stays its own.
  internal::Refuse(callbacks.on_done, *promise, request.id,
                   Status(StatusCode::kUnavailable, "the encode worker is shutting down"));
  return future;
}

void WorkerLoop::PushLocked(Command c) {
  inbox_.push_back(std::move(c));
  cv_.NotifyOne();
}

void WorkerLoop::Cancel(std::string id, Ticket ticket) {
  Command c;
  c.cancel = true;
  c.ticket = ticket;
  c.request.id = std::move(id);
  auto push = [&] {
    MutexLock lock(mu_);
    PushLocked(std::move(c));
  };
  // A parked request: its waits end, and it is cancelled in the worker when
  // it arrives there (SharedTierParking orders the two).
  if (parking_ != nullptr) {
    parking_->Cancel(c.request.id, ticket, push);
  } else {
    push();
  }
}

WorkerStats WorkerLoop::Stats() const {
  MutexLock lock(stats_mu_);
  return stats_;
}

void WorkerLoop::Wake() {
  MutexLock lock(mu_);
  woken_ = true;
  cv_.NotifyOne();
}

void WorkerLoop::Shutdown(std::chrono::milliseconds grace) {
  MutexLock serial(shutdown_mu_);
  if (!thread_.joinable()) return;
  {
    MutexLock lock(mu_);
    accepting_ = false;
  }
  // Parked requests come back (with the values found so far) before the
  // thread is told to stop, so the drain below submits them.
  if (parking_ != nullptr) parking_->Stop();
  {
    MutexLock lock(mu_);
    stopping_ = true;
    deadline_ = Clock::now() + grace;
    cv_.NotifyOne();
  }
  thread_.join();
  worker_->SetWake(nullptr);  // no decode thread touches mu_ after this
}

SharedTierStats WorkerLoop::SharedTierStatsSnapshot() const {
  return parking_ != nullptr ? parking_->Stats() : SharedTierStats{};
}

void WorkerLoop::Publish() {
  WorkerStats s = worker_->stats();
  MutexLock lock(stats_mu_);
  stats_ = std::move(s);
}

void WorkerLoop::Run() {
  bool blocked = false;    // the last StartBatch found the sink full
  bool stop_seen = false;  // stopping_ observed: do not wake on it again
  for (;;) {
    const bool tower_idle = !worker_->TowerBusy();
    // A pending video decode gates batches: wait for its completion instead.
    const bool can_start = tower_idle && worker_->HasQueuedWork() && !blocked && !worker_->WaitingOnDecode();
    // After a stop, an empty worker must reach the exit below without waiting.
    const bool drained = !worker_->HasQueuedWork() && worker_->OutstandingBatches() == 0;
    std::vector<Command> commands;
    bool stopping;
    Clock::time_point deadline;
    {
      MutexLock lock(mu_);
      auto wake = [&]() EPD_REQUIRES(mu_) {
        return !inbox_.empty() || woken_ || worker_->BatchFinished() || worker_->DecodeFinished() ||
               (stopping_ && !stop_seen);
      };
      if (blocked && tower_idle) {  // poll the sink
        const Clock::time_point until = Clock::now() + std::chrono::milliseconds(1);
        while (!wake() && cv_.WaitUntil(mu_, until) == std::cv_status::no_timeout) {
        }
      } else if (!can_start && !(stop_seen && drained)) {
        while (!wake()) cv_.Wait(mu_);
      }
      woken_ = false;
      commands.swap(inbox_);
      stopping = stopping_;
      deadline = deadline_;
    }
    stop_seen = stopping;
    if (!Turn(commands, stopping, deadline, &blocked)) return;
  }
}

bool WorkerLoop::Turn(std::vector<Command>& commands, bool stopping, Clock::time_point deadline, bool* blocked) {
  for (Command& c : commands) commands_->Process(c);
  worker_->Poll();  // completed video decodes
  // stopping_ and accepting_ change together under mu_, so once `stopping`
  // is seen no Submit can enqueue after the drain above.
  if (stopping) {
    const bool expired = Clock::now() >= deadline;
    if (expired || (!worker_->HasQueuedWork() && worker_->OutstandingBatches() == 0)) {
      // Started batches cannot be interrupted: let them deliver.
      while (worker_->OutstandingBatches() > 0) worker_->FinishBatch();
      worker_->FailAll(Status(StatusCode::kUnavailable, "the encode worker shut down before the item was encoded"));
      Publish();
      return false;
    }
  }
  // Keep the tower fed first, then collect what it finished: the collect
  // (copies, cache, callbacks) overlaps the next batch. The tower thread's
  // on_finished wakes this thread; BatchFinished() is set before it runs.
  *blocked = false;
  if (!worker_->TowerBusy() && worker_->HasQueuedWork() && !worker_->WaitingOnDecode()) {
    *blocked = !worker_->StartBatch([this] {
      MutexLock lock(mu_);
      cv_.NotifyOne();
    });
  }
  while (worker_->BatchFinished()) worker_->FinishBatch();
  Publish();
  return true;
}

}  // namespace epd
