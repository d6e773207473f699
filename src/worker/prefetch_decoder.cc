// Task states, all changed under mu_:
//   kQueued   in queue_ (under its rank), no one decoding it
//   kRunning  a helper (or, for an inline Take, the caller) is decoding it
//   kDone     a helper finished; result holds it and it counts in ready_
//   kGone     taken or dropped (and out of queue_)
// A helper that finishes a task dropped while running discards the result
// without counting it in ready_.
#include "prefetch_decoder.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <span>

namespace epd::internal {

struct PrefetchDecoder::Task {
  enum class State { kQueued, kRunning, kDone, kGone };
  MediaBytes media;
  std::function<StatusOr<PreprocessedImage>()> make;  // instead of media, when set
  Rank rank;
  std::string tenant;
  bool needed = false;
  State state = State::kQueued;
  bool dropped = false;
  std::optional<StatusOr<PreprocessedImage>> result;
  double seconds = 0;  // wall time of the decode (or make), once it ran
};

PrefetchDecoder::PrefetchDecoder(PreprocessConfig config, DecodeLimits limits, int threads, std::int64_t lookahead,
                                 bool fair)
    : config_(config), limits_(limits), lookahead_(lookahead), fair_(fair), thread_count_(std::max(threads, 0)) {
  threads_.reserve(static_cast<std::size_t>(thread_count_));
  for (int i = 0; i < thread_count_; ++i) threads_.emplace_back([this] { Run(); });
}

PrefetchDecoder::~PrefetchDecoder() {
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  work_cv_.NotifyAll();
  for (std::thread& t : threads_) t.join();
}

std::shared_ptr<PrefetchDecoder::Task> PrefetchDecoder::Enqueue(MediaBytes media, Rank rank, std::string tenant) {
  auto task = std::make_shared<Task>();
  task->media = std::move(media);
  task->rank = rank;
  task->tenant = std::move(tenant);
  return Push(std::move(task));
}

std::shared_ptr<PrefetchDecoder::Task> PrefetchDecoder::Enqueue(std::function<StatusOr<PreprocessedImage>()> make,
                                                                Rank rank, std::string tenant) {
  auto task = std::make_shared<Task>();
  task->make = std::move(make);
  task->rank = rank;
  task->tenant = std::move(tenant);
  return Push(std::move(task));
}

std::shared_ptr<PrefetchDecoder::Task> PrefetchDecoder::Push(std::shared_ptr<Task> task) {
  if (thread_count_ == 0) return task;  // decoded by Take
  {
    MutexLock lock(mu_);
    queue_.emplace(task->rank, task);
  }
  // The reserve rule can leave a helper idle for one task and not another.
  fair_ ? work_cv_.NotifyAll() : work_cv_.NotifyOne();
  return task;
}

bool PrefetchDecoder::Ready(const std::shared_ptr<Task>& task) {
  MutexLock lock(mu_);
  return task->state == Task::State::kDone;
}

void PrefetchDecoder::Need(const std::shared_ptr<Task>& task) {
  {
    MutexLock lock(mu_);
    if (task->needed || task->state != Task::State::kQueued) return;
    task->needed = true;
  }
  work_cv_.NotifyAll();
}

std::shared_ptr<PrefetchDecoder::Task> PrefetchDecoder::PickLocked() const {
  const bool reserve = fair_ && busy_ + 1 >= thread_count_ && thread_count_ > 1;
  for (const auto& [rank, task] : queue_) {
    if (ready_ >= lookahead_ && !task->needed) continue;
    if (reserve && running_.count(task->tenant) != 0) continue;
    return task;
  }
  return nullptr;
}

StatusOr<PreprocessedImage> PrefetchDecoder::Decode(Task& task) const {
  const auto start = std::chrono::steady_clock::now();
  StatusOr<PreprocessedImage> r = task.make ? task.make() : DecodeAndPreprocess(task.media.span(), config_, limits_);
  task.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

StatusOr<PreprocessedImage> PrefetchDecoder::Take(const std::shared_ptr<Task>& task, double* seconds) {
  MutexLock lock(mu_);
  if (task->state == Task::State::kQueued) {
    // No helper has started it: decode here rather than wait behind others.
    task->state = Task::State::kGone;
    if (thread_count_ > 0) queue_.erase(task->rank);
    lock.Unlock();
    StatusOr<PreprocessedImage> r = Decode(*task);
    task->media = MediaBytes();
    task->make = nullptr;
    if (seconds != nullptr) *seconds = task->seconds;
    return r;
  }
  while (task->state != Task::State::kDone) done_cv_.Wait(mu_);
  StatusOr<PreprocessedImage> r = std::move(*task->result);
  task->result.reset();
  task->state = Task::State::kGone;
  --ready_;
  if (seconds != nullptr) *seconds = task->seconds;
  lock.Unlock();
  work_cv_.NotifyOne();  // room for one more prefetched result
  return r;
}

void PrefetchDecoder::Drop(const std::shared_ptr<Task>& task) {
  MutexLock lock(mu_);
  switch (task->state) {
    case Task::State::kQueued:
      task->state = Task::State::kGone;
      if (thread_count_ > 0) queue_.erase(task->rank);
      task->media = MediaBytes();
      task->make = nullptr;
      break;
    case Task::State::kRunning:
      task->dropped = true;
      break;
    case Task::State::kDone:
      task->result.reset();
      task->state = Task::State::kGone;
      --ready_;
      lock.Unlock();
      work_cv_.NotifyOne();
      break;
    case Task::State::kGone:
      break;
  }
}

void PrefetchDecoder::Run() {
  MutexLock lock(mu_);
  for (;;) {
    std::shared_ptr<Task> task;
    while (!stop_ && (task = PickLocked()) == nullptr) work_cv_.Wait(mu_);
    if (stop_) return;
    queue_.erase(task->rank);
    task->state = Task::State::kRunning;
    ++busy_;
    if (fair_) ++running_[task->tenant];
    lock.Unlock();
    StatusOr<PreprocessedImage> r = Decode(*task);
    lock.Lock();
    --busy_;
    if (fair_) {
      if (auto it = running_.find(task->tenant); --it->second == 0) running_.erase(it);
      work_cv_.NotifyAll();  // the reserve rule may now admit a waiting task
    }
    task->media = MediaBytes();
    task->make = nullptr;
    if (task->dropped) {
      task->state = Task::State::kGone;
      continue;
    }
    task->result = std::move(r);
    task->state = Task::State::kDone;
    ++ready_;
    done_cv_.NotifyAll();
  }
}

}  // namespace epd::internal
