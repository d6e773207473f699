// The tower thread. Why a thread of its own (rather than Encode on the
// owner): while the tower runs, the owner keeps accepting requests, serving
// hits and queueing misses whose decode then overlaps the tower; and it can
// start the next batch before collecting (copying out, caching, delivering)
// the one that just finished, so the collect overlaps the tower too. The
// cost is one more thread, and corrupt pixel data is reported when its batch
// runs rather than at Submit.
#include "tower_runner.h"

#include <exception>
#include <string>
#include <utility>

namespace epd::internal {

double EntrySeconds(const Batch& b, const BatchEntry& e, double prior_seconds) {
  const double tower_s = b.tower_ms / 1e3;
  const double share =
      b.tokens > 0 ? tower_s * static_cast<double>(e.image.tokens()) / static_cast<double>(b.tokens) : 0;
  return e.decode_seconds + prior_seconds + share;
}

TowerRunner::TowerRunner(VisionTower& tower, PrefetchDecoder& decoder)
    : tower_(tower), decoder_(decoder), thread_([this] { Loop(); }) {}

TowerRunner::~TowerRunner() {
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  cv_.NotifyAll();
  thread_.join();
}

void TowerRunner::Start(std::unique_ptr<Batch> batch) {
  {
    MutexLock lock(mu_);
    queue_.push_back(batch.get());
  }
  outstanding_.push_back(std::move(batch));
  cv_.NotifyAll();
}

std::unique_ptr<Batch> TowerRunner::Collect() {
  if (outstanding_.empty()) return nullptr;
  std::unique_ptr<Batch> b = std::move(outstanding_.front());
  outstanding_.pop_front();
  {
    MutexLock lock(mu_);
    while (!b->done) cv_.Wait(mu_);
  }
  finished_.fetch_sub(1, std::memory_order_relaxed);
  return b;
}

void TowerRunner::Loop() {
  MutexLock lock(mu_);
  for (;;) {
    while (!stop_ && queue_.empty()) cv_.Wait(mu_);
    if (queue_.empty()) return;  // stopping, nothing left to run
    Batch* b = queue_.front();
    queue_.pop_front();
    lock.Unlock();
    Run(*b);
    {
      // Notify before `done`: once it is set the owner may collect the batch
      // and whatever the callback points to may go away.
      std::function<void()> notify = std::move(b->on_finished);
      finished_.fetch_add(1, std::memory_order_release);
      if (notify) notify();
    }
    lock.Lock();
    b->done = true;
    cv_.NotifyAll();
  }
}

void TowerRunner::Run(Batch& b) {
  std::vector<TowerItem> items;
  items.reserve(b.entries.size());
  for (BatchEntry& e : b.entries) {
    StatusOr<PreprocessedImage> pre = decoder_.Take(e.decode, &e.decode_seconds);
    e.decode = nullptr;
    if (!pre.ok()) {
      e.decode_status = pre.status();
      continue;
    }
    e.image = std::move(*pre);
    // patch_dim was checked against the tower once, in EncodeWorker::Create.
    TowerItem item;
    item.patches = e.image.patches.data();
    item.grid = e.image.grid;
    items.push_back(item);
    b.tokens += e.image.tokens();
  }
  b.decoded = static_cast<std::int64_t>(items.size());
  b.start = Batch::Clock::now();
  if (!items.empty()) {
    try {
      b.out = tower_.Encode(items);
    } catch (const std::exception& e) {
      b.out = Internal(std::string("vision tower threw: ") + e.what());
    } catch (...) {
      b.out = Internal("vision tower threw a non-standard exception");
    }
  }
  b.tower_ms = std::chrono::duration<double, std::milli>(Batch::Clock::now() - b.start).count();
}

}  // namespace epd::internal
