// src/http/handler_pool.h (internal): the threads an HttpEndpoint runs its
// handlers on. A FIFO queue and `threads` workers.
//
// Thread safety: Submit and Shutdown from any thread (Shutdown not from a
// worker). Shutdown runs what is queued, then joins the workers; a Submit
// after it returns false and runs nothing.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

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
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return false;
      queue_.push_back(std::move(task));
    }
    cv_.notify_one();
    return true;
  }

  void Shutdown() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_ && workers_.empty()) return;
      closed_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : workers_) t.join();
    workers_.clear();
  }

 private:
  void Run() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return closed_ || !queue_.empty(); });
        if (queue_.empty()) return;  // closed and drained
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;  // guarded by mu_
  bool closed_ = false;                      // guarded by mu_
  std::vector<std::thread> workers_;
};

}  // namespace epd::internal
