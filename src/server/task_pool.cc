#include "task_pool.h"

#include <cassert>

namespace epd::internal {

TaskPool::TaskPool(int threads) {
  assert(threads >= 1);
  threads_.reserve(threads);
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
}

TaskPool::~TaskPool() { Shutdown(); }

TaskPool::TaskId TaskPool::PostAt(Clock::time_point when, std::function<void()> task) {
  TaskId id;
  {
    MutexLock lock(mu_);
    if (stopping_) return id;
    id = TaskId{when, next_seq_++};
    tasks_.emplace(std::make_pair(when, id.seq), std::move(task));
  }
  cv_.NotifyOne();
  return id;
}

bool TaskPool::Cancel(const TaskId& id) {
  std::function<void()> dropped;  // destroyed outside the lock: it may own anything
  {
    MutexLock lock(mu_);
    auto it = tasks_.find(std::make_pair(id.when, id.seq));
    if (it == tasks_.end()) return false;
    dropped = std::move(it->second);
    tasks_.erase(it);
  }
  return true;
}

void TaskPool::Shutdown() {
  {
    MutexLock lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.NotifyAll();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

void TaskPool::Run() {
  MutexLock lock(mu_);
  for (;;) {
    if (tasks_.empty()) {
      if (stopping_) return;
      cv_.Wait(mu_);
      continue;
    }
    auto first = tasks_.begin();
    const Clock::time_point due = first->first.first;
    if (due > Clock::now()) {
      if (stopping_) return;  // delayed tasks are dropped at shutdown
      cv_.WaitUntil(mu_, due);
      continue;
    }
    std::function<void()> task = std::move(first->second);
    tasks_.erase(first);
    // Another thread may take the next task while this one runs.
    if (!tasks_.empty()) cv_.NotifyOne();
    lock.Unlock();
    task();
    lock.Lock();
  }
}

}  // namespace epd::internal
