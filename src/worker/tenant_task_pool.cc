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
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    dropped.swap(queue_);
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void TenantTaskPool::Post(std::string tenant, std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back({std::move(tenant), std::move(task)});
  }
  cv_.notify_all();
}

std::deque<TenantTaskPool::Task>::iterator TenantTaskPool::PickLocked() {
  return std::find_if(queue_.begin(), queue_.end(), [&](const Task& t) {
    auto r = running_.find(t.tenant);
    return r == running_.end() || r->second < share_;
  });
}

void TenantTaskPool::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    std::deque<Task>::iterator next;
    cv_.wait(lock, [&] { return stop_ || (next = PickLocked()) != queue_.end(); });
    if (stop_) return;
    Task task = std::move(*next);
    queue_.erase(next);
    ++running_[task.tenant];
    lock.unlock();
    try {
      task.run();
    } catch (...) {
      // Documented: a task must not throw; the pool survives one that does.
    }
    task.run = nullptr;  // destroyed outside the lock, before the count drops
    lock.lock();
    if (auto r = running_.find(task.tenant); --r->second == 0) running_.erase(r);
    cv_.notify_all();
  }
}

}  // namespace epd::internal
