// epd/worker/encode_worker.h: the encode stage's worker: content-keyed cache in front
// of a deterministic token-budget batcher in front of a vision tower.
//
// EncodeWorker follows the engine reference's encode loop (the cache is
// checked on arrival and only misses go to the EncodeScheduler), and adds what
// a server needs around it: in-flight deduplication, per-item failure
// isolation, backpressure, cancellation and counters.
//
// An item's path through Submit():
//   1. Its content key is derived BEFORE decoding: CallerContentKey when the
//      caller supplied a key, else ComputeContentKey over the encoded bytes
//      (model id + every preprocessing field + bytes; epd/media/content_key.h).
//   2. The expected-tokens rule: an item whose expected_tokens is negative, or
//      differs from the count its image header gives (ProbeGrid), fails at
//      once with kInvalidArgument, whatever the cache holds.
//   3. Key already queued or being encoded (by this or another request):
//      the item joins that computation (ItemSource::kJoined). The tower runs
//      once per distinct key, duplicates inside one request included.
//   4. Cache hit (L1, or L2 promoted to L1): checked against the shape the
//      request expects: tokens (EncodeItemInput::expected_tokens, else the
//      count the image header gives via ProbeGrid), hidden
//      size, deepstack layers and dtype (the tower's). A match is delivered at
//      once, main and deepstack halves both (one Embedding holds both). A
//      mismatch counts in WorkerStats::shape_mismatches and goes on as a miss.
//   5. Miss: queued on the scheduler with cost = post-merge tokens, which the
//      header gives (ProbeGrid) without decoding. A bad
//      header (unknown format, zero size, more pixels than DecodeLimits
//      allows) fails only this item at once, kInvalidArgument.
// A video item (EncodeItemInput::video; docs/VIDEO.md) takes a path of its own:
// its whole-video key (ComputeVideoKey over its bytes and sampling) hit in
// L1/L2 is delivered inside Submit without a decode; so is a refusal that
// needs no decode (bad sampling, no decode_video for a container).
// Otherwise Submit starts its decode as a task on the worker's video decode
// threads (never the owning thread; an identical video whose decode is still
// pending shares it) and returns. Hits, joins, L3 adoptions and cancels of
// every other item are served at once while it decodes. The video then acts
// as a GATE on the batches its chunks could join (src/worker/job_queue.h):
//   - kFifo, kByKey (arrival order, no tenants): misses submitted after it
//     (in its request or later ones) become jobs (joinable, counted by
//     max_pending_items) but are HELD in arrival order, off the scheduler,
//     and StartBatch() starts no batch while a decode is pending, unless the
//     next batch is closed (kFifo: it ends before the last queued job or is
//     full, so nothing submitted later could join it). Once the decode
//     completes (Poll(), also inside StartBatch() and Step(); WorkerLoop
//     wakes on it via SetWake) the video's chunks are queued where it was
//     submitted, then the jobs held behind it, up to the next pending video:
//     every batch is the one the calls would form had each video been
//     decoded inside its Submit.
//   - kFair (issue 40): only its own tenant's later misses are held (the
//     tenant's lane); the video holds a slot in the fair order, and batches
//     of the work ahead of that slot, any tenant's, start at once. When the
//     slot heads the order StartBatch() waits for the decode (and Step()
//     blocks for it), then queues the chunks, tagged from the tenant's
//     history, and the lane's misses behind them. A video's chunks join the
//     batches formed from its slot on, never one formed before it.
// Either way decode timing decides only WHEN a batch starts, never what it
// holds. The video is cut into temporal chunks (temporal_patch_size frames
// each, keyed by ComputeVideoChunkKey), each served as an image would be
// (hit, join, or a job of grid (1, h, w) costing its post-merge tokens); a
// chunk's hit or miss is decided against the cache as it is when the video
// is expanded (a batch collected meanwhile may have cached, or evicted, one
// of its chunks). When its last chunk is ready the chunks' rows are
// concatenated in order (grid (t, h, w)), cached under the whole-video key
// and delivered with ItemResult::video. A failed chunk fails the video
// (naming the chunk). With a tower that does not declare
// temporal_chunks_independent() (or video_chunk_cache off) a video is one
// job of grid (t, h, w) instead, joined and cached by its whole-video key
// only. Submit's max_pending_items check counts a pending video as one job
// (its chunks are only known after the decode); once decoded, a video whose
// chunks to queue (neither cached nor in flight) would pass the bound fails
// alone, kResourceExhausted (retry later) or kInvalidArgument when they alone
// exceed it, and queues nothing. Cancel (or FailAll) of a request whose video
// is decoding lets what the video held go on at once and, when no other
// request shares the decode, stops it between two frames (decode_video's
// stop token); its late completion is ignored. One tenant's video decodes
// (EncodeRequest::tenant) hold at most max(1, decode_threads - 1) of the
// max(1, decode_threads) decode threads; the others queue. A tenant has at
// most max_video_decodes_per_tenant decodes queued or running: Submit refuses
// a request that would start more with kResourceExhausted, changing nothing.
// Helper threads decode and preprocess queued misses in the order the
// scheduler will serve them (arrival order, or the fair order for kFair) while
// the tower runs (at most decode_lookahead finished ahead), so decoding
// overlaps the tower instead of adding to it. Batches depend only on the
// sequence of Submit/Cancel/StartBatch calls and the header costs, never on
// decode timing (with kFair, and with a pending video, decode timing decides
// only WHEN StartBatch succeeds, not what the batch holds).
//
// A batch runs in two halves, so the owning thread can keep submitting while
// the tower works (WorkerLoop does):
//   StartBatch()  takes the scheduler's next batch and hands it to the
//                 worker's tower thread, which takes the decoded images
//                 (decoding any a helper has not started; bad pixel data fails
//                 only that item, kInvalidArgument) and runs the tower once.
//   FinishBatch() waits for it, checks the output (rows == sum of the items'
//                 tokens, byte sizes match the shape), copies each item's rows
//                 into its OWN Embedding (never a view into the batch output;
//                 charged exactly main + deepstack bytes), caches it and
//                 delivers it to every waiter, including items that joined
//                 while it ran.
// Step() is StartBatch() + FinishBatch(), and first waits for a pending video
// decode that gates the batch. One batch runs on the tower at a
// time, but the next may be started as soon as the previous one's tower call
// has returned, before it is collected, so the collect overlaps the tower
// (at most two batches outstanding: one running, one awaiting FinishBatch).
//
// Failures stay local: a failed tower call fails only that batch's items
// (kInternal, the tower's message); an output of the wrong shape likewise
// (kInternal naming expected vs got); the worker keeps serving. Caches and
// counters are unaffected by a failure.
//
// Messages: an item's status message says what is wrong, not which item:
// ItemResult::index says that. An edge that sends the message out of the
// process (the server, a tool's report) names the item there, once.
//
// Results: an ItemResult per item, delivered by `on_item` as soon as the item
// is ready (hits and header errors inside Submit, a video's decode errors and
// all-cached videos inside Poll/StartBatch/Step, the rest inside
// FinishBatch/Step; any order across items), then one RequestResult (items by
// index) through `on_done` once every item is delivered, inside the call that
// finished the last one.
// REQUIRES: callbacks must not call back into this EncodeWorker (they run
// while its state is mid-update) and should return quickly. An exception a
// callback throws is caught and counted (WorkerStats::callback_exceptions).
//
// Request-level outcomes of Submit (returned, and no callback fires):
//   kInvalidArgument    empty request id
//   kAlreadyExists      a request with this id is still in flight
//   kInvalidArgument    its misses alone exceed max_pending_items (it could
//                       never be admitted; the message names the limit)
//   kResourceExhausted  queueing its misses on top of those pending would
//                       exceed max_pending_items (retry later)
//   (nothing of a refused request is queued or delivered)
// Cancel(id) completes the request at once with kCancelled: items not yet
// delivered get kCancelled; queued computations no other request waits on are
// removed from the scheduler; those another request waits on stay. A
// computation already running finishes and is cached.
//
// Complexity: Submit O(items * (bytes hashed + header parse + log pending));
// Step O(batch log pending) plus decodes not done ahead, the tower and one
// copy of its output; Poll O(1) without a completed decode, else O(chunks and
// held jobs * log pending).
// Memory: a queued miss holds its encoded bytes; a decoded one its
// preprocessed patches (patches * patch_dim * 4 bytes, ~6 MB for a 512x512
// image), at most decode_lookahead + decode_threads of them ahead of Step.
// A decoded video holds its sampled frames (at most
// VideoLimits::max_decoded_bytes) until its last chunk is preprocessed.
// Bound the bytes with max_pending_items.
//
// Thread safety: thread-compatible: one thread owns the worker and calls
// everything (the decode helpers, the video decode threads and the tower
// thread are internal and never run callbacks, except StartBatch's
// on_finished and SetWake's wake). BatchFinished(), DecodeFinished() and
// SetWake() are the exceptions: they may be called from any thread. Encode runs on the tower thread
// while the owner may call the tower's metadata accessors (hidden() etc.),
// so those must be safe concurrently with Encode (immutable values, as in
// every backend here). ItemKeys() is the exception: it only reads the immutable
// options and may run on any thread (WorkerLoop hashes on the submitting
// threads with it). Use WorkerLoop (epd/worker/worker_loop.h) to drive a worker from
// several threads.
//
// Example:
//   epd::WorkerOptions opt;
//   opt.model_id = "qwen2-vl-7b";
//   auto worker = epd::EncodeWorker::Create(opt, std::move(tower));
//   (*worker)->Submit({"req-1", {{jpeg_bytes}}},
//                     {.on_done = [](const epd::RequestResult& r) { Ship(r); }});
//   while ((*worker)->HasQueuedWork()) (*worker)->Step();   // or StartBatch/FinishBatch
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "epd/core/content_key_type.h"
#include "epd/core/encode_types.h"
#include "epd/core/status.h"
#include "epd/core/vision_tower.h"
#include "epd/worker/encode_request.h"
#include "epd/worker/worker_options.h"

namespace epd {

namespace internal {
class LoopSubmit;
struct AdoptedValue;
}  // namespace internal

class EncodeWorker {
 public:
  // Validates the options against the tower (WorkerOptions::ValidateFor:
  // kInvalidArgument). Takes ownership of the tower.
  static StatusOr<std::unique_ptr<EncodeWorker>> Create(WorkerOptions options, std::unique_ptr<VisionTower> tower);
  // Waits for outstanding tower calls, and for video decodes (told to stop).
  // Requests still in flight are dropped without callbacks; call FailAll
  // first to complete them.
  ~EncodeWorker();
  EncodeWorker(const EncodeWorker&) = delete;
  EncodeWorker& operator=(const EncodeWorker&) = delete;

  // The content key of every item of `request` (step 1 above), or the reason
  // there is none (an empty caller key). Thread-safe.
  std::vector<StatusOr<ContentKey>> ItemKeys(const EncodeRequest& request) const;

  // Accepts a request (see the header comment). `keys`, when non-empty, must
  // be ItemKeys(request) (e.g. computed on another thread); empty = computed
  // here. Returns OK when accepted; then on_done fires exactly once, possibly
  // before Submit returns.
  Status Submit(EncodeRequest request, RequestCallbacks callbacks = {}, std::vector<StatusOr<ContentKey>> keys = {});

  // Runs at most one tower batch and delivers its items (or collects the
  // oldest batch StartBatch left outstanding, if any), waiting first for a
  // video decode that gates it. Returns the number of computations in the
  // batch: 0 when nothing is queued or sink_full() holds.
  std::int64_t Step();

  // Handles completed video decodes (Poll), then starts the next batch on the
  // tower thread and returns at once; false (nothing started) when the tower
  // is busy (TowerBusy()), two batches are outstanding, nothing is queued,
  // a video decode gates the batch (WaitingOnDecode()), or sink_full() holds. `on_finished`, if
  // set, runs ON THE TOWER THREAD when the tower call returns; it must only
  // wake the owner (e.g. notify a condition variable) and must not throw.
  bool StartBatch(std::function<void()> on_finished = nullptr);
  // Collects the oldest outstanding batch (waiting for its tower call if
  // needed): caches and delivers its results. Returns its number of
  // computations; 0 when no batch is outstanding.
  std::int64_t FinishBatch();
  // Batches started and not yet collected by FinishBatch (0, 1 or 2).
  std::int64_t OutstandingBatches() const;
  // A started batch's tower call has not returned yet.
  bool TowerBusy() const;
  // The oldest outstanding batch's tower call has returned (FinishBatch will
  // not wait). Thread-safe.
  bool BatchFinished() const;

  // True while anything is left to do for Step(): computations queued or
  // held, or a video decode pending.
  bool HasQueuedWork() const;

  // Video decodes run on the worker's decode threads (see the header
  // comment); their completions are handled on the owning thread, by Poll()
  // (and inside StartBatch and Step).
  // `wake` runs on a decode thread each time a decode completes: it must only
  // wake the owner (e.g. notify a condition variable) and must not throw.
  // Set it before the first Submit; null = none. Thread-safe.
  void SetWake(std::function<void()> wake);
  // A completed decode waits for Poll(). Thread-safe and lock-free (safe in a
  // condition variable's predicate).
  bool DecodeFinished() const;
  // Handles every completed decode: its video's chunks are served and queued,
  // then the computations held behind it (kFair: once its slot heads the
  // order, inside StartBatch or Step); results ready now are delivered.
  // Returns the number of decodes handled (0: nothing to do, O(1)).
  std::int64_t Poll();
  // True while StartBatch() starts nothing because a video decode is pending
  // (the gate; see the header comment).
  bool WaitingOnDecode() const;
  // Video decodes started and not yet handled by Poll (running, queued for
  // a decode thread, or completed).
  std::int64_t DecodesPending() const;

  // True when an item with this key would be served here without the shared
  // tier: it is cached in L1 or L2, or queued or running (joinable). Does not
  // touch the LRU order. O(1).
  bool HasLocal(const ContentKey& key) const;

  // A shared-tier value (EncodeItemInput::ready) that the adoption check
  // refused, and why: its grid, tokens, width, dtype or deepstack layers
  // differ from what the item predicts, or it holds non-finite rows.
  struct RefusedValue {
    ContentKey key;
    std::string why;
  };
  // The values refused since the last call, oldest first (each also counted
  // in WorkerStats::adopt_rejections). WorkerLoop hands them to
  // SharedTier::RejectAsync, which deletes them from the tier.
  std::vector<RefusedValue> TakeRefused();

  // Cancels the in-flight request `id`; false when there is none.
  bool Cancel(const std::string& id);

  // Completes every in-flight request with `status` (as Cancel, for
  // shutdown) and empties the queue; outstanding batches still finish (their
  // results are cached when collected). Returns how many requests it completed.
  std::int64_t FailAll(const Status& status);

  WorkerStats stats() const;
  const WorkerOptions& options() const;
  const VisionTower& tower() const;

 private:
  friend class internal::LoopSubmit;  // WorkerLoop's shared-tier values
  struct Impl;
  explicit EncodeWorker(std::unique_ptr<Impl> impl);
  Status SubmitAdopting(EncodeRequest request, RequestCallbacks callbacks, std::vector<StatusOr<ContentKey>> keys,
                        std::vector<internal::AdoptedValue> adopted);
  std::unique_ptr<Impl> impl_;
};

}  // namespace epd
