// epd/worker/worker_loop.h: an EncodeWorker driven by one dedicated thread, with a
// thread-safe front door.
//
// Why one thread: EncodeWorker's batches are a pure function of the order of
// its Submit/Cancel/Step calls. Putting every call on one thread that owns
// the worker, the cache and the tower keeps that order a simple sequence (the
// order commands reach the inbox), with no lock around the tower or the cache.
// Other threads only push commands and read a stats snapshot.
//
// Loop: the thread drains the inbox (submits and cancels, in arrival order),
// starts the next batch if the tower is idle (EncodeWorker::StartBatch: the
// tower runs on the worker's own tower thread), then collects any batch the
// tower has finished (FinishBatch: copies, cache, callbacks, overlapping the
// batch just started), publishes a stats snapshot, and repeats; it sleeps
// when there is nothing to do. So while a batch runs, new requests are still
// accepted, hits served and misses queued for decoding. A video decode that
// completes on the worker's decode threads wakes it too (EncodeWorker::
// SetWake); it then handles the completion (EncodeWorker::Poll), so hits and
// other requests are served while a video decodes, and batches wait for the
// decode only as the worker's gate requires. When the worker's sink is full
// it polls every millisecond (or on Wake()).
//
// Submit hashes the request's content keys on the CALLING thread
// (EncodeWorker::ItemKeys) before enqueueing, so several submitting threads
// hash in parallel and the worker thread does not. Decode and preprocessing
// of misses happen on the worker's own helper threads (its PrefetchDecoder,
// WorkerOptions::decode_threads) or, for a miss no helper has reached, on its
// tower thread; video containers on its video decode threads; only for items
// that miss, never on the loop's thread.
//
// Callbacks (on_item, on_done) run on the worker thread, except on_done of a
// request submitted after Shutdown began, which runs on the submitting thread.
// They must not block (a blocked callback stalls every request) and must not
// call back into the EncodeWorker; calling WorkerLoop::Submit/Cancel/Stats
// from a callback is fine (those only enqueue or copy).
//
// Shutdown(grace): stops accepting (later Submits complete at once with
// kUnavailable), processes commands already enqueued, keeps running batches
// until the queue is empty or `grace` has passed (a batch already running
// finishes; none starts after the deadline), then completes every request
// still in flight with kUnavailable and joins the thread. The destructor calls
// Shutdown(0) when it has not run.
//
// Shared tier (WorkerOptions::shared_tier set): the worker thread checks
// each submitted request's keys against L1/L2 and in-flight work
// (EncodeWorker::HasLocal). A request with a key found nowhere there is
// parked: the loop's lookup threads ask the shared tier about those keys,
// taking or waiting on the cluster-wide lease (src/worker/
// shared_tier_lookup.h: Get, SET NX PX, poll with backoff until the value
// appears, the lease lapses and is taken over, or LeaseWaitPolicy::wait
// passes). The request then goes to the worker with the values found as
// EncodeItemInput::ready (served as ItemSource::kL3 after the worker's shape
// check); the rest are encoded. Every successful tower result (ItemSource::
// kMiss) is queued for writing to the tier, which then releases this
// process's lease; a failed or cancelled miss releases it at once. A request
// all of whose keys are local never waits on the network. Cancel reaches a
// parked request too: its waits end, and it is cancelled in the worker as
// soon as it arrives there. Parking makes the order requests reach the
// worker depend on the tier's response times, so batches stay a function of
// the worker's command sequence but that sequence is no longer the submit
// order. A tier that is down costs each parked request one failed call
// (fast while the tier backs off).
//
// Every Submit's on_done fires exactly once and its future becomes ready
// exactly once; a request the worker refuses completes with the refusal
// (kAlreadyExists, kResourceExhausted, kInvalidArgument) as
// RequestResult::status and no items.
//
// Thread safety: thread-safe (every public method may be called from any
// thread, concurrently). Ownership: the loop owns the worker and its tower.
//
// Example:
//   epd::WorkerLoop loop(std::move(worker));
//   std::future<epd::RequestResult> f = loop.Submit({"req-1", {{jpeg_bytes}}});
//   epd::RequestResult r = f.get();   // r.items[0].embedding
//   loop.Shutdown(std::chrono::seconds(5));
#pragma once

#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "epd/core/mutex.h"
#include "epd/worker/encode_worker.h"

namespace epd {
namespace internal {
struct LoopCommand;
class CommandRunner;
class SharedTierParking;
}  // namespace internal

class WorkerLoop {
 public:
  // Starts the worker thread. REQUIRES: worker != nullptr.
  explicit WorkerLoop(std::unique_ptr<EncodeWorker> worker);
  ~WorkerLoop();
  WorkerLoop(const WorkerLoop&) = delete;
  WorkerLoop& operator=(const WorkerLoop&) = delete;

  // Names one Submit call, for Cancel. Tickets start at 1 and are never
  // reused; 0 names none.
  using Ticket = std::uint64_t;

  // Enqueues `request`; see the header comment for when callbacks fire. The
  // future holds the same RequestResult on_done receives. `ticket`, when
  // non-null, receives this submission's ticket.
  std::future<RequestResult> Submit(EncodeRequest request, RequestCallbacks callbacks = {}, Ticket* ticket = nullptr);

  // Enqueues a cancel of the in-flight request `id` (EncodeWorker::Cancel);
  // a no-op when none is in flight by the time the worker thread gets to it.
  // With a non-zero `ticket` from Submit, only that submission is cancelled: when the
  // worker refused it (ALREADY_EXISTS, another request holds `id`), the
  // request that holds the id is left alone. Callers that take ids from
  // clients should pass it, or one client could cancel another's request by
  // reusing its id.
  void Cancel(std::string id, Ticket ticket = 0);

  // The worker's counters as of the end of the last loop iteration, and never
  // older than the last request whose on_done has fired: a caller that saw a
  // request complete sees its hits and misses counted.
  WorkerStats Stats() const;

  // Wakes the worker thread, e.g. when the sink that sink_full() watches has
  // drained, so it need not wait for its next poll.
  void Wake();

  // See the header comment. Idempotent; blocks until the thread has exited.
  void Shutdown(std::chrono::milliseconds grace);

  // The shared tier's counters plus this loop's lease waits; all zero when
  // WorkerOptions::shared_tier is null (see has_shared_tier()).
  SharedTierStats SharedTierStatsSnapshot() const;
  bool has_shared_tier() const { return parking_ != nullptr; }

  // The options the worker was created with (immutable).
  const WorkerOptions& options() const { return worker_->options(); }

 private:
  using Command = internal::LoopCommand;

  void Run();
  // One pass of Run after its wait: the commands, decode completions, the
  // next batch and what the tower finished. False once the loop is done.
  bool Turn(std::vector<Command>& commands, bool stopping, std::chrono::steady_clock::time_point deadline,
            bool* blocked);
  // Queues `c` and wakes the thread.
  void PushLocked(Command c) EPD_REQUIRES(mu_);
  void Publish();

  std::unique_ptr<EncodeWorker> worker_;  // touched only by thread_ (options() excepted)
  // Null without a shared tier. Stopped by Shutdown before the thread.
  std::unique_ptr<internal::SharedTierParking> parking_;
  // What thread_ does with each command (src/worker/loop_command.h).
  std::unique_ptr<internal::CommandRunner> commands_;

  mutable Mutex mu_;
  CondVar cv_;
  std::vector<Command> inbox_ EPD_GUARDED_BY(mu_);  // in arrival order
  Ticket next_ticket_ EPD_GUARDED_BY(mu_) = 1;
  bool accepting_ EPD_GUARDED_BY(mu_) = true;
  bool stopping_ EPD_GUARDED_BY(mu_) = false;
  bool woken_ EPD_GUARDED_BY(mu_) = false;
  std::chrono::steady_clock::time_point deadline_ EPD_GUARDED_BY(mu_);

  mutable Mutex stats_mu_;
  WorkerStats stats_ EPD_GUARDED_BY(stats_mu_);

  Mutex shutdown_mu_;  // serialises Shutdown callers
  std::thread thread_;
};

}  // namespace epd
