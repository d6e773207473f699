// See fetch_pool.h.
#include "fetch_pool.h"

#include <algorithm>
#include <system_error>

namespace epd::internal {

FetchPool::FetchPool(int max_threads) : max_threads_(static_cast<std::size_t>(std::max(1, max_threads))) {}

FetchPool::~FetchPool() { Stop(); }

void FetchPool::Stop() {
  std::vector<std::thread> threads;
  {
    MutexLock lock(mu_);
    stopping_ = true;
    threads.swap(threads_);  // no thread starts once stopping_ is set
  }
  cv_.NotifyAll();
  for (std::thread& t : threads) t.join();
}

void FetchPool::Post(std::function<void()> job) {
  MutexLock lock(mu_);
  queue_.push_back(std::move(job));
  // While stopping, the posting thread is a pool thread: it runs the job.
  if (!stopping_ && queue_.size() > idle_ && threads_.size() < max_threads_) {
    try {
      threads_.emplace_back([this] { Loop(); });
      return;
    } catch (const std::system_error&) {
      if (threads_.empty()) {
        queue_.pop_back();
        throw;
      }
    }
  }
  lock.Unlock();
  cv_.NotifyOne();
}

std::size_t FetchPool::threads() const {
  MutexLock lock(mu_);
  return threads_.size();
}

void FetchPool::Loop() {
  MutexLock lock(mu_);
  for (;;) {
    ++idle_;
    while (queue_.empty() && !stopping_) cv_.Wait(mu_);
    --idle_;
    if (queue_.empty()) return;  // stopping, and nothing left to run
    std::function<void()> job = std::move(queue_.front());
    queue_.pop_front();
    lock.Unlock();
    try {
      job();
    } catch (...) {  // NOLINT(bugprone-empty-catch): a job must not throw; one that does must not end the pool
    }
    job = nullptr;  // what the job captured is released outside the lock
    lock.Lock();
  }
}

}  // namespace epd::internal
