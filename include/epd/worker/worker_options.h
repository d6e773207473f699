// epd/worker/worker_options.h: how an EncodeWorker is configured: keys,
// preprocessing, decode limits, the cache tiers and their device hooks, the
// tower batch bounds and order, the queue bound, decode threads, videos,
// backpressure and the shared tier.
//
// Every field has a usable default except model_id; Validate() checks the
// fields that need no tower, EncodeWorker::Create the rest
// (epd/worker/encode_worker.h).
//
// Thread safety: a value type, thread-compatible. The worker keeps its own
// copy, immutable after Create; its std::function hooks are called as each
// field says.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <stop_token>
#include <string>

#include "epd/core/embedding.h"
#include "epd/core/job_scheduler.h"
#include "epd/core/shared_tier.h"
#include "epd/core/status.h"
#include "epd/core/tenant_quota.h"
#include "epd/core/tiered_cache.h"
#include "epd/core/vision_tower.h"
#include "epd/media/content_key.h"
#include "epd/media/image.h"
#include "epd/media/preprocess.h"
#include "epd/media/video.h"

namespace epd {

// Decodes and samples one video container (epd::video's DecodeVideo has
// this shape). Called on a video decode thread; must be thread-safe.
using VideoDecodeFn = std::function<StatusOr<SampledVideo>(
    std::span<const std::uint8_t>, const VideoSampling&, const PreprocessConfig&, const VideoLimits&, std::stop_token)>;
// The grid (t, h, w) a container will decode to, from its header alone
// (epd::video's ProbeVideo then VideoHeaderGrid). Used by ProbeItems
// (epd/worker/item_probe.h) on the caller's thread; must be thread-safe.
using VideoProbeFn = std::function<StatusOr<GridTHW>(std::span<const std::uint8_t>, const VideoSampling&,
                                                     const PreprocessConfig&, const VideoLimits&)>;

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
  // Eviction of both tiers and the L1 admission filter (TieredOptions,
  // epd/core/tiered_cache.h; --eviction, --l1-admission). kLru and kNone are
  // the reference's cache. Under kGdsf (and kAdaptive's GDSF order) each entry is ranked by its measured
  // encode cost per byte (docs/PLAN.md, "What the worker passes"); an entry
  // that L2 can hold is ranked in L1 by what its promotion would cost,
  // nbytes x promote_seconds_per_byte (seconds per byte, finite, >= 0; the
  // default 4e-11 is a 25 GB/s host-to-device copy).
  EvictionPolicy eviction = EvictionPolicy::kLru;
  L1Admission l1_admission = L1Admission::kNone;
  // The doorkeeper's window, requests (1 to 2^27, checked by Validate;
  // --l1-admission-window): a key enters L1 on a second request within it
  // (AdmissionFilterOptions).
  std::uint64_t l1_admission_window = AdmissionFilterOptions{}.window;
  double promote_seconds_per_byte = 4e-11;
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
  // Video containers are decoded on a pool of their own, of
  // max(1, decode_threads) threads, of which one tenant's decodes
  // (EncodeRequest::tenant) take at most max(1, decode_threads - 1) at once.
  int decode_threads = 1;
  // Decoded images kept ready ahead of their batch at most; 0 = 2 *
  // max_items_per_batch (the next batch plus one).
  std::int64_t decode_lookahead = 0;

  // Videos (docs/VIDEO.md). decode_video decodes and samples a container
  // (epd::video's DecodeVideo, set by the CLI and server when that library
  // is built) on the worker's video decode threads (never the owning
  // thread); empty = a video item given as container bytes fails with
  // kFailedPrecondition (frame lists still work). It must return soon after
  // its stop token is requested (the video's request was cancelled or
  // failed): between two frames, kCancelled. video_sampling is the default a
  // request's VideoInput::sampling overrides; video_limits bound every decode.
  // Chunk caching needs a tower whose temporal_chunks_independent() is
  // true; with another tower (or video_chunk_cache off) a video is encoded
  // whole, as one tower item of grid (t, h, w), cached and joined only under
  // its whole-video key.
  bool video_chunk_cache = true;
  VideoDecodeFn decode_video;
  // The header probe of a container (ProbeItems); empty = a container item
  // of a probe fails with kFailedPrecondition. Set with decode_video.
  VideoProbeFn probe_video;
  VideoSampling video_sampling;
  VideoLimits video_limits;
  // Most video decodes one tenant (EncodeRequest::tenant) may have queued
  // or running at once: posted to the video decode threads and not yet
  // completed. A request whose video items would start more is refused whole
  // with kResourceExhausted naming the tenant and this cap (retry later);
  // items that need no decode (a whole-video hit, an identical video whose
  // decode is pending) do not count. 0 = unbounded. At the default, one
  // tenant queues at most 4 decodes of up to video_limits.max_decode_seconds
  // each, and cannot fill the decode pool's queue for everyone else.
  std::int64_t max_video_decodes_per_tenant = 4;
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

  // Per-tenant cache reservations (epd/core/tenant_quota.h): each put is
  // charged to the tenant of the request that made the entry (a job's first
  // waiter; a video's chunks to the requesting tenant), and eviction takes
  // from tenants over their reservation first. Its capacities should be
  // l1_capacity_bytes and l2_capacity_bytes. Null: no quotas, the cache is
  // the reference's.
  std::shared_ptr<TenantQuotas> tenant_quotas;

  // OK, or kInvalidArgument naming the first bad field: empty model_id,
  // invalid preprocess config, max_pixels <= 0, negative capacity,
  // non-positive batch bounds, negative max_pending_items, decode_threads,
  // decode_lookahead or max_video_decodes_per_tenant, a negative or
  // non-finite promote_seconds_per_byte.
  Status Validate() const;
  // Validate(), then the checks against the tower EncodeWorker::Create
  // makes (kInvalidArgument): a patch_dim or merge_size other than the
  // preprocess config's, a tower with output_on_device() without all three of
  // adopt_device_rows, to_host and to_device.
  Status ValidateFor(const VisionTower& tower) const;
};

}  // namespace epd
