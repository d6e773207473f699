// src/server/task_pool.h (internal): a few threads that run posted tasks,
// now or at a set time.
//
// EncodeServer's callback-API calls use it for the work that must not run on
// the thread that triggers it: building an inline reply (a copy of up to
// megabytes of rows) when the worker thread delivers an item; the timer
// that refuses a call still waiting for room in the request budget at its
// deadline (admission.h); and a call's write-progress timer (encode_call.h),
// cancelled when the call ends.
//
// Tasks due at the same time run in the order posted (FIFO); tasks run
// concurrently on up to `threads` threads. A task must not throw.
//
// Thread safety: Post/PostAt from any thread, tasks included.
// Shutdown (also the destructor) runs every task already due, drops the
// delayed ones, and joins the threads; posts after it are dropped.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include "epd/core/mutex.h"

namespace epd::internal {

class TaskPool {
 public:
  using Clock = std::chrono::steady_clock;

  // REQUIRES: threads >= 1.
  explicit TaskPool(int threads);
  ~TaskPool();
  TaskPool(const TaskPool&) = delete;
  TaskPool& operator=(const TaskPool&) = delete;

  // Names a posted task, for Cancel.
  struct TaskId {
    Clock::time_point when{};
    std::uint64_t seq = 0;
  };

  void Post(std::function<void()> task) { PostAt(Clock::time_point::min(), std::move(task)); }
  // Runs `task` at `when` or soon after. O(log pending).
  TaskId PostAt(Clock::time_point when, std::function<void()> task);
  // Drops task `id` if it has not started: true when it was dropped (it
  // will never run), false when it ran, is running, or was never posted
  // (a default TaskId). O(log pending).
  bool Cancel(const TaskId& id);
  void Shutdown();

 private:
  void Run();

  Mutex mu_;
  CondVar cv_;
  // (due time, post order) -> task: the earliest first, FIFO among equals.
  std::map<std::pair<Clock::time_point, std::uint64_t>, std::function<void()>> tasks_ EPD_GUARDED_BY(mu_);
  std::uint64_t next_seq_ EPD_GUARDED_BY(mu_) = 1;  // 0 names no task (a default TaskId)
  bool stopping_ EPD_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace epd::internal
