// Task states, all changed under mu_:
//   kQueued   in queue_, no one decoding it
//   kRunning  a helper (or, for an inline Take, the caller) is decoding it
//   kDone     a helper finished; result holds it and it counts in ready_
//   kGone     taken or dropped; stale queue_ entries in this state are skipped
// A helper that finishes a task dropped while running discards the result
// without counting it in ready_.
#include "prefetch_decoder.h"

#include <optional>
#include <span>

namespace epd::internal {

struct PrefetchDecoder::Task {
  enum class State { kQueued, kRunning, kDone, kGone };
  MediaBytes media;
  std::function<StatusOr<PreprocessedImage>()> make;  // instead of media, when set
  State state = State::kQueued;
  bool dropped = false;
  std::optional<StatusOr<PreprocessedImage>> result;
};

PrefetchDecoder::PrefetchDecoder(PreprocessConfig config, DecodeLimits limits, int threads, std::int64_t lookahead)
    : config_(config), limits_(limits), lookahead_(lookahead) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
}

PrefetchDecoder::~PrefetchDecoder() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

std::shared_ptr<PrefetchDecoder::Task> PrefetchDecoder::Enqueue(MediaBytes media) {
  auto task = std::make_shared<Task>();
  task->media = std::move(media);
  return Push(std::move(task));
}

std::shared_ptr<PrefetchDecoder::Task> PrefetchDecoder::Enqueue(std::function<StatusOr<PreprocessedImage>()> make) {
  auto task = std::make_shared<Task>();
  task->make = std::move(make);
  return Push(std::move(task));
}

std::shared_ptr<PrefetchDecoder::Task> PrefetchDecoder::Push(std::shared_ptr<Task> task) {
  if (threads_.empty()) return task;  // decoded by Take
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(task);
  }
  work_cv_.notify_one();
  return task;
}

StatusOr<PreprocessedImage> PrefetchDecoder::Decode(Task& task) const {
  if (task.make) return task.make();
  return DecodeAndPreprocess(task.media.span(), config_, limits_);
}

StatusOr<PreprocessedImage> PrefetchDecoder::Take(const std::shared_ptr<Task>& task) {
  std::unique_lock<std::mutex> lock(mu_);
  if (task->state == Task::State::kQueued) {
    // No helper has started it: decode here rather than wait behind others.
    task->state = Task::State::kGone;
    lock.unlock();
    StatusOr<PreprocessedImage> r = Decode(*task);
    task->media = MediaBytes();
    task->make = nullptr;
    return r;
  }
  done_cv_.wait(lock, [&] { return task->state == Task::State::kDone; });
  StatusOr<PreprocessedImage> r = std::move(*task->result);
  task->result.reset();
  task->state = Task::State::kGone;
  --ready_;
  lock.unlock();
  work_cv_.notify_one();  // room for one more prefetched result
  return r;
}

void PrefetchDecoder::Drop(const std::shared_ptr<Task>& task) {
  std::unique_lock<std::mutex> lock(mu_);
  switch (task->state) {
    case Task::State::kQueued:
      task->state = Task::State::kGone;
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
      lock.unlock();
      work_cv_.notify_one();
      break;
    case Task::State::kGone:
      break;
  }
}

void PrefetchDecoder::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] {
      while (!queue_.empty() && queue_.front()->state != Task::State::kQueued) queue_.pop_front();
      return stop_ || (!queue_.empty() && ready_ < lookahead_);
    });
    if (stop_) return;
    std::shared_ptr<Task> task = std::move(queue_.front());
    queue_.pop_front();
    task->state = Task::State::kRunning;
    lock.unlock();
    StatusOr<PreprocessedImage> r = Decode(*task);
    lock.lock();
    task->media = MediaBytes();
    task->make = nullptr;
    if (task->dropped) {
      task->state = Task::State::kGone;
      continue;
    }
    task->result = std::move(r);
    task->state = Task::State::kDone;
    ++ready_;
    done_cv_.notify_all();
  }
}

}  // namespace epd::internal
