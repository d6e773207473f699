// src/openai/fetch_pool.h (internal): the threads MediaSource fetches on.
//
// A FIFO of jobs run by at most `max_threads` threads, started as the
// queue needs them (a pool that never fetches holds no thread). Jobs run in
// the order posted; a job that posts a follow-up puts it at the back, which
// is how MediaSource takes turns between requests (media_source.cc).
//
// Thread safety: Post is thread-safe and never runs the job on the calling
// thread. Stop (and so destruction) runs every job still queued, including
// jobs those jobs post, then joins the threads: REQUIRES that no thread
// other than the pool's own posts once Stop has started.
// Ownership: the pool owns its threads and the queued jobs.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "epd/core/mutex.h"

namespace epd::internal {

class FetchPool {
 public:
  explicit FetchPool(int max_threads);  // values < 1 count as 1
  ~FetchPool();                         // Stop()

  // Runs every job still queued, including jobs those jobs post, then joins
  // the threads; the pool stays usable by its own threads until then.
  // Idempotent. Must not be called from a pool thread.
  void Stop();
  FetchPool(const FetchPool&) = delete;
  FetchPool& operator=(const FetchPool&) = delete;

  // Queues `job` (which must not throw: a throw is caught and dropped);
  // starts a thread when every started one is busy and the bound allows.
  // Throws std::system_error only if no thread can be started at all.
  void Post(std::function<void()> job);

  // Threads started so far (<= max_threads).
  std::size_t threads() const;

 private:
  void Loop();

  const std::size_t max_threads_;
  mutable Mutex mu_;
  CondVar cv_;
  std::deque<std::function<void()>> queue_ EPD_GUARDED_BY(mu_);
  std::vector<std::thread> threads_ EPD_GUARDED_BY(mu_);
  std::size_t idle_ EPD_GUARDED_BY(mu_) = 0;  // threads waiting for a job
  bool stopping_ EPD_GUARDED_BY(mu_) = false;
};

}  // namespace epd::internal
