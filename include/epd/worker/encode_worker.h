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
// L1/L2 is delivered inside Submit without a decode; otherwise it is decoded
// and sampled inside Submit (on the owning thread), cut into temporal chunks
// (temporal_patch_size frames each, keyed by ComputeVideoChunkKey), and each
// chunk is served as an image would be (hit, join, or a scheduler job of
// grid (1, h, w) costing its post-merge tokens). When its last chunk is
// ready the chunks' rows are concatenated in order (grid (t, h, w)), cached
// under the whole-video key and delivered with ItemResult::video. A failed
// chunk fails the video (naming the chunk). With a tower that does not
// declare temporal_chunks_independent() (or video_chunk_cache off) a video
// is one job of grid (t, h, w) instead, joined and cached by its whole-video
// key only. Submit's max_pending_items check counts a video as one job (its
// chunks are only known after the decode); once decoded, a video whose
// chunks to queue (neither cached nor in flight) would pass the bound fails
// alone, kResourceExhausted (retry later) or kInvalidArgument when they alone
// exceed it, and queues nothing.
// Helper threads decode and preprocess queued misses in the order the
// scheduler will serve them (arrival order, or the fair order for kFair) while
// the tower runs (at most decode_lookahead finished ahead), so decoding
// overlaps the tower instead of adding to it. Batches depend only on the
// sequence of Submit/Cancel/StartBatch calls and the header costs, never on
// decode timing (with kFair, decode timing decides only WHEN StartBatch
// succeeds, not what the batch holds).
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
// Step() is StartBatch() + FinishBatch(). One batch runs on the tower at a
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
// is ready (hits and header errors inside Submit, the rest inside
// FinishBatch/Step; any order across items),
// then one RequestResult (items by index) through `on_done` once every item
// is delivered, inside the Submit or Step call that finished the last one.
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
// copy of its output.
// Memory: a queued miss holds its encoded bytes; a decoded one its
// preprocessed patches (patches * patch_dim * 4 bytes, ~6 MB for a 512x512
// image), at most decode_lookahead + decode_threads of them ahead of Step.
// Bound the bytes with max_pending_items.
//
// Thread safety: thread-compatible: one thread owns the worker and calls
// everything (the decode helpers and the tower thread are internal and never
// run callbacks, except StartBatch's on_finished). BatchFinished() is the
// exception: it may be read from any thread. Encode runs on the tower thread
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
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "epd/core/embedding.h"
#include "epd/core/encode_scheduler.h"
#include "epd/core/encode_types.h"
#include "epd/core/shared_tier.h"
#include "epd/core/status.h"
#include "epd/core/vision_tower.h"
#include "epd/media/content_key.h"
#include "epd/media/image.h"
#include "epd/media/preprocess.h"
#include "epd/media/video.h"

namespace epd {

struct WorkerOptions {
  // Hashed into every content key: two models never share an entry. Required.
  std::string model_id;
  // Preprocessing of misses; also hashed into the keys. Must Validate().
  PreprocessConfig preprocess;
  // Decode guard (decompression bombs).
  DecodeLimits limits;
  // kSha256 unless the deployment is trusted and single-tenant (content_key.h).
  KeyMode key_mode = KeyMode::kSha256;

  // L1 ("device") and L2 (host) cache capacities, bytes, each at most
  // kMaxCacheBytes. 0 and 0 turn caching off (every item that is not joined
  // runs the tower). An embedding larger than L1 but not than L2 is cached in
  // L2 directly and served from there (a host-to-device copy per hit, no
  // promotion); the tiered cache alone, like the reference, would drop it.
  std::int64_t l1_capacity_bytes = std::int64_t{1} << 30;
  std::int64_t l2_capacity_bytes = std::int64_t{4} << 30;
  // L1 -> L2 and L2 -> L1 copies (TieredEmbeddingCache); empty = identity,
  // right when both tiers live in host memory. For L1 in VRAM and L2 in
  // pinned memory, take all three hooks from the GPU tier:
  //   EmbeddingTierHooks h = MakeEmbeddingTierHooks(device);  // epd/gpu/device_tier.h
  //   opt.to_host = h.to_host; opt.to_device = h.to_device;
  //   opt.adopt_device_rows = h.adopt_device_rows;
  // A hook that throws (a device failure) is caught: a failed promotion is
  // served as a miss, a failed demotion drops the victim (the eviction goes
  // on, so L1 stays within l1_capacity_bytes), and either counts in
  // WorkerStats::cache_errors; other requests and entries are unaffected.
  // Lifetime: the device must outlive the worker and every embedding it
  // delivered (they hold its buffers; epd/gpu/device.h).
  std::function<EmbeddingPtr(const EmbeddingPtr&)> to_host;
  std::function<EmbeddingPtr(const EmbeddingPtr&)> to_device;
  // Turns one item's rows of a device-resident tower output (VisionTower::
  // output_on_device()) into the Embedding to cache and deliver, e.g. a
  // device -> device copy into an L1 entry. Required for such a tower
  // (Create fails without it); unused otherwise. An error, or an embedding
  // whose shape, grid or byte count differs from the rows', fails that item only
  // (its status, e.g. kInternal for a device failure).
  std::function<StatusOr<EmbeddingPtr>(const DeviceRows&)> adopt_device_rows;

  // Tower batch bounds (EncodeScheduler). 8192 post-merge tokens is about six
  // 1-megapixel images, or 25 at 512x512 (324 tokens each).
  std::int64_t max_tokens_per_batch = 8192;
  std::int64_t max_items_per_batch = 16;
  // kFifo: first come, first served across all requests. kFair: fair across
  // EncodeRequest::tenant, each miss charged its post-merge tokens plus its
  // decoded pixels / (patch_size * merge_size)^2, i.e. the decode of the
  // stored image in token-sized units (an 8000x8000 PNG: 81,632 units on top
  // of its tokens). kFair also orders the decode prefetch that way, keeps one
  // helper free of any tenant already decoding, and (with decode_threads > 0)
  // starts a batch only once its items are decoded, so another tenant's
  // expensive decode never holds up the tower (docs/SERVER.md, "Fairness").
  // Batches still depend only on the sequence of calls.
  ScheduleOrder order = ScheduleOrder::kFifo;
  // Most items queued on the scheduler at once; a request that would exceed
  // it is rejected whole with kResourceExhausted, or kInvalidArgument when
  // its own misses alone exceed it. 0 = unbounded.
  std::int64_t max_pending_items = 0;
  // Join items whose key is already queued or running. Off only to measure
  // what deduplication saves.
  bool dedup_in_flight = true;

  // Helper threads that decode queued misses ahead of their batch; 0 = the
  // tower thread decodes each batch just before running it (no overlap).
  int decode_threads = 1;
  // Decoded images kept ready ahead of their batch at most; 0 = 2 *
  // max_items_per_batch (the next batch plus one).
  std::int64_t decode_lookahead = 0;

  // Videos (docs/VIDEO.md). decode_video decodes and samples a container
  // (epd::video's DecodeVideo, set by the CLI and server when that library
  // is built); empty = a video item given as container bytes fails with
  // kFailedPrecondition (frame lists still work). video_sampling is the default a
  // request's VideoInput::sampling overrides; video_limits bound every decode.
  // Chunk caching needs a tower whose temporal_chunks_independent() is
  // true; with another tower (or video_chunk_cache off) a video is encoded
  // whole, as one tower item of grid (t, h, w), cached and joined only under
  // its whole-video key.
  bool video_chunk_cache = true;
  std::function<StatusOr<SampledVideo>(std::span<const std::uint8_t>, const VideoSampling&, const PreprocessConfig&,
                                       const VideoLimits&)>
      decode_video;
  VideoSampling video_sampling;
  VideoLimits video_limits;
  // Whole-video hits need the video's timing (VideoTiming) without a decode;
  // the worker keeps it for this many whole-video keys (oldest forgotten
  // first; a forgotten one costs a decode on its next hit, whose chunks hit).
  std::int64_t max_video_timings = 65536;

  // Backpressure: while it returns true, Step()/StartBatch() start no tower
  // batch (e.g. the transfer ring towards the prefill stage is full). Empty =
  // never full. Checked when a batch starts, which may be before the previous
  // batch is collected, so up to two batches' results can still arrive after
  // it first returns true. Called on the worker's thread; must be cheap and
  // must not throw.
  std::function<bool()> sink_full;

  // The shared tier (L3) behind L1/L2, e.g. OpenRedisTier (epd/l3/redis_tier.h);
  // null = none. The worker itself never calls it (its calls block on the
  // network): WorkerLoop looks up the keys L1/L2 miss on its own threads,
  // hands valid values in as EncodeItemInput::ready, takes the cluster-wide
  // lease before a miss is encoded, and writes tower results back
  // (epd/worker/worker_loop.h). A plain EncodeWorker only serves `ready` values.
  std::shared_ptr<SharedTier> shared_tier;

  // OK, or kInvalidArgument naming the first bad field: empty model_id,
  // invalid preprocess config, max_pixels <= 0, negative capacity,
  // non-positive batch bounds, negative max_pending_items, decode_threads or
  // decode_lookahead. The hooks are checked against the tower by Create.
  Status Validate() const;
};

// An image's encoded bytes, held behind a shared pointer so that requests
// naming the same file (replay's trace, a caller re-sending an image) share
// one buffer instead of a copy each. Made implicitly from a std::string,
// which it takes over (moving in costs no copy of the bytes), or explicitly
// from a buffer the caller already shares. Immutable; copying is O(1).
class MediaBytes {
 public:
  MediaBytes() = default;
  MediaBytes(std::string bytes)  // NOLINT(google-explicit-constructor): {jpeg} reads as bytes
      : bytes_(std::make_shared<const std::string>(std::move(bytes))) {}
  MediaBytes(const char* bytes) : MediaBytes(std::string(bytes)) {}  // NOLINT(google-explicit-constructor)
  explicit MediaBytes(std::shared_ptr<const std::string> bytes) : bytes_(std::move(bytes)) {}

  std::string_view view() const { return bytes_ == nullptr ? std::string_view() : std::string_view(*bytes_); }
  std::span<const std::uint8_t> span() const {
    const std::string_view v = view();
    return {reinterpret_cast<const std::uint8_t*>(v.data()), v.size()};
  }
  std::size_t size() const { return view().size(); }
  bool empty() const { return size() == 0; }

 private:
  std::shared_ptr<const std::string> bytes_;
};

// A video item's input: the container bytes (MP4/H.264, WebM/VP9, ...:
// what WorkerOptions::decode_video reads) or a list of encoded frame images
// (SampleFrameList), exactly one of the two; and optional sampling options
// (default WorkerOptions::video_sampling).
struct VideoInput {
  MediaBytes container;
  std::vector<MediaBytes> frames;
  std::optional<VideoSampling> sampling;
};

// One image or video of a request.
struct EncodeItemInput {
  // Encoded bytes (JPEG, PNG, WebP, GIF or BMP) as received.
  MediaBytes media;
  // Optional caller-supplied content identity (e.g. a gateway's hash): the key
  // becomes CallerContentKey(model_id, preprocess, caller_key) and the bytes
  // are not hashed. The caller vouches that equal keys mean equal media. An
  // empty string fails the item with kInvalidArgument.
  std::optional<std::string> caller_key;
  // Post-merge tokens the caller's prompt reserves for the image; 0 = unknown
  // (the header's count is used to check hits). Negative, or different from
  // what the image header gives, fails the item (kInvalidArgument).
  std::int64_t expected_tokens = 0;
  // A value for this item's key found in the shared tier (L3) by WorkerLoop;
  // null otherwise. When the key is neither joinable nor in L1/L2, the worker
  // checks it against the expected shape like any hit and, if it matches,
  // caches it in L1 (through to_device when set) and delivers it as
  // ItemSource::kL3; a mismatch counts in shape_mismatches and is encoded.
  EmbeddingPtr ready;
  // Set for a video item (then `media` and `caller_key` must be empty): it is
  // decoded and sampled, cut into temporal chunks and answered from them
  // (docs/VIDEO.md). expected_tokens, when > 0, must equal the video's
  // post-merge tokens.
  std::optional<VideoInput> video;

  bool is_video() const { return video.has_value(); }
};

struct EncodeRequest {
  std::string id;  // unique among in-flight requests; non-empty
  std::vector<EncodeItemInput> items;
  // Whose request this is, for ScheduleOrder::kFair (e.g. the client's
  // address, or a tenant id it sent); ignored by the other orders. Requests
  // with the same tenant share one fair share; "" is a tenant like any other.
  std::string tenant{};
};

struct RequestResult {
  std::string id;
  // kOk when the request ran to completion (items may still have failed one
  // by one: see each ItemResult::status); otherwise why it did not complete
  // (kCancelled, or kUnavailable / kAlreadyExists / kResourceExhausted from
  // WorkerLoop). Items not delivered carry the same status.
  Status status;
  std::vector<ItemResult> items;  // by index

  // True when the request completed and every item has an embedding.
  bool all_ok() const;
};

struct RequestCallbacks {
  // Fired once per item, as soon as it is ready. May be empty.
  std::function<void(const ItemResult&)> on_item;
  // Fired once when the request completes or is cancelled. May be empty.
  std::function<void(const RequestResult&)> on_done;
};

class EncodeWorker {
 public:
  // Validates the options (WorkerOptions::Validate), a tower
  // whose patch_dim or merge_size differs from the preprocess config's, and
  // a tower with output_on_device() without all three of adopt_device_rows,
  // to_host and to_device (all kInvalidArgument). Takes ownership of the
  // tower.
  static StatusOr<std::unique_ptr<EncodeWorker>> Create(WorkerOptions options, std::unique_ptr<VisionTower> tower);
  // Waits for outstanding tower calls. Requests still in flight are dropped
  // without callbacks; call FailAll first to complete them.
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
  // oldest batch StartBatch left outstanding, if any). Returns the number of computations in
  // the batch: 0 when nothing is queued or sink_full() holds.
  std::int64_t Step();

  // Starts the next batch on the tower thread and returns at once; false
  // (nothing started) when the tower is busy (TowerBusy()), two batches are
  // outstanding, nothing is queued, or sink_full() holds. `on_finished`, if
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

  // True when the scheduler holds computations for StartBatch().
  bool HasQueuedWork() const;

  // True when an item with this key would be served here without the shared
  // tier: it is cached in L1 or L2, or queued or running (joinable). Does not
  // touch the LRU order. O(1).
  bool HasLocal(const ContentKey& key) const;

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
  struct Impl;
  explicit EncodeWorker(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace epd
