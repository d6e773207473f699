// src/worker/tenant_task_pool.h (internal to epd::worker): a fixed pool of
// threads running posted tasks in arrival order, of which one tenant's tasks
// hold at most max(1, threads - 1) threads at once. The worker runs its video
// container decodes here (video_serving.h), so one tenant's long decodes
// never leave another tenant's video without a thread: a task whose tenant
// is at its share waits, and the next task of another tenant runs instead.
//
// Order: a free thread takes the oldest queued task whose tenant is under its
// share. With one thread the share is 1, which is the whole pool: tasks run
// one at a time in arrival order.
//
// Complexity: Post O(1); picking a task O(queued tasks).
// Thread safety: thread-safe. Tasks run on the pool's threads and must not
// throw (an exception that escapes one is swallowed and the thread goes on).
// Ownership: the pool owns the tasks until they have run; the destructor
// runs no queued task (they are destroyed unrun) and waits for the running
// ones, so a task must return promptly once whatever it waits on is told to
// stop.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "epd/core/mutex.h"

namespace epd::internal {

class TenantTaskPool {
 public:
  // Starts max(1, threads) threads.
  explicit TenantTaskPool(int threads);
  // Drops the queued tasks, waits for the running ones, joins the threads.
  ~TenantTaskPool();
  TenantTaskPool(const TenantTaskPool&) = delete;
  TenantTaskPool& operator=(const TenantTaskPool&) = delete;

  // Queues `task` for `tenant`.
  void Post(std::string tenant, std::function<void()> task);

  int threads() const { return static_cast<int>(threads_.size()); }
  // The most threads one tenant's tasks hold at once: max(1, threads() - 1).
  int share() const { return share_; }

 private:
  struct Task {
    std::string tenant;
    std::function<void()> run;
  };
  void Loop();
  // The oldest queued task whose tenant is under its share, or end().
  std::deque<Task>::iterator PickLocked() EPD_REQUIRES(mu_);

  int share_ = 1;
  Mutex mu_;
  CondVar cv_;
  std::deque<Task> queue_ EPD_GUARDED_BY(mu_);
  std::map<std::string, int> running_ EPD_GUARDED_BY(mu_);  // tasks running per tenant
  bool stop_ EPD_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace epd::internal
