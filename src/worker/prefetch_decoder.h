// src/worker/prefetch_decoder.h (internal to epd::worker): decodes and
// preprocesses queued misses on helper threads while the tower runs.
//
// The worker queues a miss on the scheduler with the token count its header
// gives (cheap), and hands the bytes to Enqueue(). Helper threads decode
// tasks in Enqueue order, keeping at most `lookahead` finished results that
// nobody has taken (bounded memory: a 512x512 image's patches are ~6 MB).
// When the tower thread runs a batch it Take()s each item's result: a
// finished result is handed over, a running decode is waited for, and a task
// no helper has started is decoded on the tower thread at once (so the batch
// never waits behind unrelated work). Batch formation never depends on decode timing:
// the scheduler sees only header-derived costs.
//
// With threads == 0 no helper runs and Take() decodes on the caller.
//
// Thread safety: Enqueue and Drop are called by the worker's owning thread,
// Take by its tower thread (TowerRunner); the helpers and those two
// synchronise through one mutex. A task is taken or dropped at most once.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "epd/encode_worker.h"
#include "epd/image.h"
#include "epd/preprocess.h"
#include "epd/status.h"

namespace epd::internal {

class PrefetchDecoder {
 public:
  struct Task;  // opaque; owned jointly by the worker and the decoder

  PrefetchDecoder(PreprocessConfig config, DecodeLimits limits, int threads, std::int64_t lookahead);
  ~PrefetchDecoder();  // stops and joins the helpers; pending tasks are abandoned
  PrefetchDecoder(const PrefetchDecoder&) = delete;
  PrefetchDecoder& operator=(const PrefetchDecoder&) = delete;

  // Queues `media` for decoding; the returned handle is passed to Take or Drop.
  std::shared_ptr<Task> Enqueue(MediaBytes media);
  // Queues a computation that makes the rows itself (a video's temporal
  // chunk: PreprocessChunk over frames already decoded), run like a decode.
  std::shared_ptr<Task> Enqueue(std::function<StatusOr<PreprocessedImage>()> make);

  // The decoded and preprocessed image, or the decode error (kInvalidArgument).
  StatusOr<PreprocessedImage> Take(const std::shared_ptr<Task>& task);

  // Forgets the task (cancelled work): a queued task is skipped, a running
  // one's result discarded.
  void Drop(const std::shared_ptr<Task>& task);

 private:
  void Run();
  StatusOr<PreprocessedImage> Decode(Task& task) const;
  std::shared_ptr<Task> Push(std::shared_ptr<Task> task);

  const PreprocessConfig config_;
  const DecodeLimits limits_;
  const std::int64_t lookahead_;

  std::mutex mu_;
  std::condition_variable work_cv_;  // helpers: a task or room appeared, or stop
  std::condition_variable done_cv_;  // Take: a running task finished
  std::deque<std::shared_ptr<Task>> queue_;
  std::int64_t ready_ = 0;  // finished results not yet taken
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace epd::internal
