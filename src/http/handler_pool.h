// src/http/handler_pool.h (internal): the threads an HttpEndpoint runs its
// handlers on. A FIFO queue and `threads` workers.
//
// Thread safety: Submit and Shutdown from any thread (Shutdown not from a
// worker). Shutdown runs what is queued, then joins the workers; a Submit
// after it returns false and runs nothing.
#pragma once

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "epd/core/mutex.h"

namespace epd::internal {

class HandlerPool {
 public:
  explicit HandlerPool(int threads) {
    for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { Run(); });
  }
  ~HandlerPool() { Shutdown(); }
  HandlerPool(const HandlerPool&) = delete;
  HandlerPool& operator=(const HandlerPool&) = delete;

  bool Submit(std::function<void()> task) {
    {
      MutexLock lock(mu_);
      if (closed_) return false;
      queue_.push_back(std::move(task));
    }
    cv_.NotifyOne();
    return true;
  }

  void Shutdown() {
    {
      MutexLock lock(mu_);
      if (closed_ && workers_.empty()) return;
      closed_ = true;
    }
    cv_.NotifyAll();
    for (std::thread& t : workers_) t.join();
    workers_.clear();
  }

 private:
  void Run() {
    for (;;) {
      std::function<void()> task;
      {
        MutexLock lock(mu_);
        while (!closed_ && queue_.empty()) cv_.Wait(mu_);
        if (queue_.empty()) return;  // closed and drained
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task();
    }
  }

  Mutex mu_;
  CondVar cv_;
  std::deque<std::function<void()>> queue_ EPD_GUARDED_BY(mu_);
  bool closed_ EPD_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace epd::internal
