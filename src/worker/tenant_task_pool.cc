// TenantTaskPool (tenant_task_pool.h). A thread that finishes a task wakes
// every waiter: the tenant it frees may be the one a queued task waits for.
#include "tenant_task_pool.h"

#include <algorithm>
#include <utility>

namespace epd::internal {

TenantTaskPool::TenantTaskPool(int threads) {
  const int n = std::max(1, threads);
  share_ = std::max(1, n - 1);
  threads_.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) threads_.emplace_back([this] { Loop(); });
}

TenantTaskPool::~TenantTaskPool() {
  std::deque<Task> dropped;
  {
    MutexLock lock(mu_);
    stop_ = true;
    dropped.swap(queue_);
  }
  cv_.NotifyAll();
  for (std::thread& t : threads_) t.join();
}

void TenantTaskPool::Post(std::string tenant, std::function<void()> task) {
  {
    MutexLock lock(mu_);
    queue_.push_back({std::move(tenant), std::move(task)});
  }
  cv_.NotifyAll();
}

std::deque<TenantTaskPool::Task>::iterator TenantTaskPool::PickLocked() {
  return std::find_if(queue_.begin(), queue_.end(), [&](const Task& t) EPD_REQUIRES(mu_) {
    auto r = running_.find(t.tenant);
    return r == running_.end() || r->second < share_;
  });
}

void TenantTaskPool::Loop() {
  MutexLock lock(mu_);
  for (;;) {
    std::deque<Task>::iterator next;
    while (!stop_ && (next = PickLocked()) == queue_.end()) cv_.Wait(mu_);
    if (stop_) return;
    Task task = std::move(*next);
    queue_.erase(next);
    ++running_[task.tenant];
    lock.Unlock();
    try {
      task.run();
    } catch (...) {
      // Documented: a task must not throw; the pool survives one that does.
    }
    task.run = nullptr;  // destroyed outside the lock, before the count drops
    lock.Lock();
    if (auto r = running_.find(task.tenant); --r->second == 0) running_.erase(r);
    cv_.NotifyAll();
  }
}

}  // namespace epd::internal
