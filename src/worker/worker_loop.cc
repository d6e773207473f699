// The worker thread is the only one that touches worker_ (its options are
// immutable and read from any thread). Other threads talk to it through the
// inbox under mu_; results go back through the callbacks and a promise per
// request. Commands are taken from the inbox in batches (all that are queued)
// so a burst of submits costs one lock round-trip. Tower batches run on the
// worker's own tower thread (StartBatch/FinishBatch), so this thread keeps
// draining the inbox while the tower runs: hits are served and misses queued
// (and their decoding started) without waiting for the batch.
#include "epd/worker/worker_loop.h"

#include <algorithm>
#include <cassert>
#include <utility>

#include "shared_tier_lookup.h"

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
  if (worker_->options().shared_tier != nullptr) {
    lookup_ = std::make_unique<internal::SharedTierLookup>(worker_->options().shared_tier);
  }
  thread_ = std::thread([this] { Run(); });
}

WorkerLoop::~WorkerLoop() { Shutdown(std::chrono::milliseconds(0)); }

std::future<RequestResult> WorkerLoop::Submit(EncodeRequest request, RequestCallbacks callbacks, Ticket* ticket) {
  auto promise = std::make_shared<std::promise<RequestResult>>();
  std::future<RequestResult> future = promise->get_future();
  // Hash here, on the caller's thread, outside the lock.
  std::vector<StatusOr<ContentKey>> keys = worker_->ItemKeys(request);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (accepting_) {
      Command c;
      c.request = std::move(request);
      c.callbacks = std::move(callbacks);
      c.keys = std::move(keys);
      c.promise = promise;
      c.ticket = next_ticket_++;
      if (ticket != nullptr) *ticket = c.ticket;
      inbox_.push_back(std::move(c));
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

void WorkerLoop::Cancel(std::string id, Ticket ticket) {
  std::lock_guard<std::mutex> lock(mu_);
  // A parked request: end its waits; it is cancelled in the worker when it
  // arrives there (the lookup's `done` reads the flag under mu_).
  if (auto p = parked_.find(id); p != parked_.end() && (ticket == 0 || p->second.ticket == ticket)) {
    p->second.batch->cancelled = true;
  }
  Command c;
  c.cancel = true;
  c.ticket = ticket;
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
  }
  // Parked requests come back (with the values found so far) before the
  // thread is told to stop, so the drain below submits them.
  if (lookup_ != nullptr) lookup_->Stop();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    deadline_ = Clock::now() + grace;
    cv_.notify_one();
  }
  thread_.join();
}

void WorkerLoop::Process(Command& c) {
  if (c.cancel) {
    // A cancel for one submission leaves a request another one holds the id
    // for alone (refused as ALREADY_EXISTS, its own cancel must not reach it).
    if (c.ticket != 0) {
      auto h = holder_.find(c.request.id);
      if (h == holder_.end() || h->second != c.ticket) return;
    }
    worker_->Cancel(c.request.id);
    return;
  }
  if (lookup_ != nullptr && !c.resolved) {
    c.callbacks = WithSharedTier(std::move(c.callbacks));
    if (Park(c)) return;
  }
  std::shared_ptr<std::promise<RequestResult>> promise = std::move(c.promise);
  std::function<void(const RequestResult&)> user_done = std::move(c.callbacks.on_done);
  std::string id = c.request.id;
  const Ticket ticket = c.ticket;
  // Recorded before the worker sees the request, since a request of hits
  // completes inside Submit. An id already held stays with its holder: the
  // worker refuses this submission.
  const bool holds = holder_.try_emplace(id, ticket).second;
  // Publish before completing, so Stats() already counts a request its caller saw finish.
  RequestCallbacks callbacks{std::move(c.callbacks.on_item),
                             [this, user_done, promise, id, ticket](const RequestResult& r) {
                               if (auto h = holder_.find(id); h != holder_.end() && h->second == ticket)
                                 holder_.erase(h);
                               Publish();
                               Finish(user_done, *promise, r);
                             }};
  const bool cancelled = c.cancelled;
  Status s = worker_->Submit(std::move(c.request), std::move(callbacks), std::move(c.keys));
  if (s.ok() && cancelled) worker_->Cancel(id);
  if (!s.ok() && holds) holder_.erase(id);
  if (!s.ok()) {
    try {
      Finish(user_done, *promise, RequestResult{std::move(id), std::move(s), {}});
    } catch (...) {
      // A throwing callback must not take the worker thread down.
    }
  }
}

bool WorkerLoop::Park(Command& c) {
  // The keys no local tier can serve, each once, and the items they belong to.
  std::vector<ContentKey> keys;
  std::vector<std::pair<std::size_t, std::size_t>> item_key;  // (item, index into keys)
  for (std::size_t i = 0; i < c.keys.size() && i < c.request.items.size(); ++i) {
    // Videos stay local: their whole-video value carries sampling timestamps
    // the shared tier does not hold, and their chunk keys exist only after
    // the decode on the worker thread (docs/L3.md, known limits).
    if (c.request.items[i].is_video()) continue;
    if (!c.keys[i].ok() || c.request.items[i].ready != nullptr || worker_->HasLocal(*c.keys[i])) continue;
    auto k = std::find(keys.begin(), keys.end(), *c.keys[i]);
    if (k == keys.end()) k = keys.insert(k, *c.keys[i]);
    item_key.emplace_back(i, static_cast<std::size_t>(k - keys.begin()));
  }
  if (keys.empty()) return false;
  const std::string id = c.request.id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (parked_.count(id) != 0) {
      Status dup = AlreadyExists("request '" + id + "' is already in flight");
      try {
        Finish(c.callbacks.on_done, *c.promise, RequestResult{id, std::move(dup), {}});
      } catch (...) {
      }
      return true;
    }
  }
  auto parked = std::make_shared<Command>(std::move(c));
  auto batch = std::make_shared<internal::LookupBatch>();
  batch->keys = std::move(keys);
  internal::LookupBatch* b = batch.get();  // the lookup's tasks own `batch` until `done` has run
  batch->done = [this, parked, b, item_key = std::move(item_key), id] {
    for (const auto& [item, k] : item_key) parked->request.items[item].ready = b->values[k];
    parked->resolved = true;
    std::lock_guard<std::mutex> lock(mu_);
    parked->cancelled = b->cancelled.load();
    parked_.erase(id);
    inbox_.push_back(std::move(*parked));
    cv_.notify_one();
  };
  {
    std::lock_guard<std::mutex> lock(mu_);
    parked_[id] = Parked{c.ticket, batch};
  }
  if (!lookup_->Submit(batch)) {  // stopping: submit it as it is
    std::lock_guard<std::mutex> lock(mu_);
    parked_.erase(id);
    c = std::move(*parked);
    return false;
  }
  return true;
}

RequestCallbacks WorkerLoop::WithSharedTier(RequestCallbacks callbacks) {
  std::shared_ptr<SharedTier> tier = worker_->options().shared_tier;
  auto user_item = std::move(callbacks.on_item);
  auto user_done = std::move(callbacks.on_done);
  return RequestCallbacks{[tier, user_item](const ItemResult& r) {
                            // A video (ItemResult::video set) is not looked up in L3 (Park), so it
                            // holds no lease and its value is not written either.
                            if (r.source == ItemSource::kMiss && r.video == nullptr) {
                              if (r.status.ok() && r.embedding != nullptr) {
                                tier->PutAsync(r.key, r.embedding);  // releases our lease after the write
                              } else {
                                tier->ReleaseAsync(r.key);
                              }
                            }
                            if (user_item) user_item(r);
                          },
                          [tier, user_done](const RequestResult& r) {
                            // Items never delivered (cancelled): their leases, if ours.
                            for (const ItemResult& item : r.items) {
                              if (!item.status.ok()) tier->ReleaseAsync(item.key);
                            }
                            if (user_done) user_done(r);
                          }};
}

SharedTierStats WorkerLoop::SharedTierStatsSnapshot() const {
  return lookup_ != nullptr ? lookup_->Stats() : SharedTierStats{};
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
      auto wake = [&] { return !inbox_.empty() || woken_ || worker_->BatchFinished() || (stopping_ && !stop_seen); };
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
