// epd/core/encode_types.h: what the encode stage reports about its work: how an
// item was served (ItemSource), one item's result (ItemResult), one request's
// result and the callbacks that receive them (RequestResult,
// RequestCallbacks), and the worker's counters (WorkerStats), with their
// field table (kWorkerStatsFields, epd/core/stat_fields.h).
//
// These are plain value types of the core, shared by the worker
// (epd/worker/encode_worker.h), the server's stats (epd/rpc/server_stats.h) and the
// client (epd/client/client.h), so a client or a stats reader needs neither the
// worker nor its dependencies.
//
// Thread safety: value types; thread-compatible. ItemSourceName is
// thread-safe.
//
// Example:
//   void OnItem(const epd::ItemResult& r) {
//     if (!r.status.ok()) Log("item", r.index, r.status.ToString());
//     else Count(epd::ItemSourceName(r.source), r.embedding->nbytes());
//   }
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "epd/core/content_key_type.h"
#include "epd/core/embedding.h"
#include "epd/core/stat_fields.h"
#include "epd/core/status.h"
#include "epd/core/tenant_quota.h"

namespace epd {

// How an item was served.
enum class ItemSource : std::uint8_t {
  kL1 = 0,      // L1 cache hit
  kL2 = 1,      // L2 cache hit, promoted to L1
  kMiss = 2,    // ran the tower (or failed before it)
  kJoined = 3,  // shared another item's in-flight computation
  kL3 = 4,      // found in the shared tier (L3, epd/core/shared_tier.h), promoted to L1
};
// "l1", "l2", "miss", "joined", "l3".
std::string_view ItemSourceName(ItemSource source);

// What prefill needs besides the rows for a video item (docs/PREFILL.md):
// Qwen2.5-VL's M-RoPE advances its temporal position by
// seconds_per_grid_t * tokens_per_second per temporal patch.
struct VideoTiming {
  std::vector<double> timestamps_s;  // presentation time of each sampled frame, seconds
  double sample_fps = 0;             // sampled frames per second of video
  double seconds_per_grid_t = 0;     // temporal_patch_size / sample_fps (second_per_grid_ts)
};

struct ItemResult {
  std::int64_t index = 0;  // position in EncodeRequest::items
  // OK, or why this item has no embedding. The message says what is wrong,
  // not which item (`index` does); an edge that sends it out of the process
  // names the item there.
  Status status;
  ContentKey key;  // zero when the key itself could not be derived
  // Non-null iff status.ok(); shared with the cache, immutable. With a GPU
  // tier its bytes may be in VRAM or pinned memory (Embedding::resident):
  // call ToHost() (epd/core/embedding.h) before reading them on the host.
  // embedding->grid is the image's (t, h, w) patch grid, for hits as for
  // misses (what Qwen-VL prefill needs for its M-RoPE positions).
  EmbeddingPtr embedding;
  ItemSource source = ItemSource::kMiss;
  // Set for a video item that succeeded (embedding->grid is then (t, h, w)
  // with t temporal patches); null for an image. Shared, immutable.
  std::shared_ptr<const VideoTiming> video;
  // Milliseconds: submit -> batch start, the batch's tower call, submit ->
  // delivery. Hits have queue_ms = tower_ms = 0.
  double queue_ms = 0;
  double tower_ms = 0;
  double total_ms = 0;
  // For an item the tower ran (a miss with an embedding): the entry's
  // measured encode cost in seconds, as cached (its decode and preprocessing
  // plus its token share of the batch's tower call; docs/PLAN.md), and as
  // written to the shared tier; for a video assembled from its chunks, the
  // sum of their costs as cached; for an image adopted from the shared tier
  // (source kL3), the cost stored with its value there, measured by the
  // worker that encoded it (-1 when the value has none). -1 for every other
  // item.
  double encode_seconds = -1;
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

// How a worker hands results back (epd/worker/encode_worker.h says on which
// thread, and what a callback may not do).
struct RequestCallbacks {
  // Fired once per item, as soon as it is ready. May be empty.
  std::function<void(const ItemResult&)> on_item;
  // Fired once when the request completes or is cancelled. May be empty.
  std::function<void(const RequestResult&)> on_done;
};

struct WorkerStats {
  // Accepted requests and their items. Every accepted item is counted in
  // exactly one of hits_l1, hits_l2, hits_l3, joins, misses (a bad image is a miss
  // that failed before the tower; a cancelled item keeps its class).
  std::uint64_t requests = 0;
  std::uint64_t items = 0;
  std::uint64_t hits_l1 = 0;
  std::uint64_t hits_l2 = 0;
  std::uint64_t hits_l3 = 0;  // valid values from the shared tier, now in L1
  std::uint64_t misses = 0;
  std::uint64_t joins = 0;
  // Hits (L1, L2 or L3) whose shape differed from the request's; also
  // counted in misses.
  std::uint64_t shape_mismatches = 0;
  // Video items (also counted above: a whole-video hit in hits_l1/hits_l2,
  // anything else in misses), the decodes they needed, and their temporal
  // chunks: each chunk of a decoded video counts in exactly one of
  // chunk_hits (L1 or L2), chunk_joins (an identical chunk already queued or
  // running) and chunk_misses (queued for the tower, or failed).
  std::uint64_t video_items = 0;
  std::uint64_t video_decodes = 0;
  std::uint64_t chunk_hits = 0;
  std::uint64_t chunk_misses = 0;
  std::uint64_t chunk_joins = 0;
  // Requests refused by Submit (not counted in `requests`), and cancelled.
  std::uint64_t rejected_requests = 0;
  std::uint64_t cancelled_requests = 0;

  std::uint64_t tower_batches = 0;     // tower calls, failed ones included
  std::uint64_t tower_items = 0;       // distinct computations sent to the tower
  std::uint64_t tower_tokens = 0;      // their post-merge tokens
  double tower_seconds = 0;            // wall time inside VisionTower::Encode
  std::uint64_t tower_failures = 0;    // batches failed by the tower or its output shape
  std::uint64_t sink_full_stalls = 0;  // batch starts refused because the sink was full

  // Failed items by status code (kInvalidArgument, kInternal, kCancelled, ...).
  std::map<StatusCode, std::uint64_t> errors;
  std::uint64_t callback_exceptions = 0;
  // Cache operations whose tier copy threw (WorkerOptions::to_host /
  // to_device): served as a miss, or the demoted victim dropped.
  std::uint64_t cache_errors = 0;

  // Now: requests in flight; computations queued on the scheduler (not yet in
  // a batch) and their tokens.
  std::int64_t in_flight_requests = 0;
  std::int64_t pending_items = 0;
  std::int64_t pending_tokens = 0;

  // Cache: capacity victims per tier (EmbeddingCache::evictions(); an L1
  // victim is demoted to L2 when it fits), tier moves, and occupancy.
  std::uint64_t l1_evictions = 0;
  std::uint64_t l2_evictions = 0;
  // Of those, the victims taken from the recency order
  // (EmbeddingCache::lru_victims(): all under kLru, none under kGdsf, LRU's
  // share under kAdaptive).
  std::uint64_t l1_lru_victims = 0;
  std::uint64_t l2_lru_victims = 0;
  std::uint64_t demotions = 0;
  std::uint64_t promotions = 0;
  std::int64_t l1_used_bytes = 0;  // bytes cached in L1 now
  std::int64_t l2_used_bytes = 0;  // bytes cached in L2 now
  std::int64_t l1_entries = 0;
  std::int64_t l2_entries = 0;
  // With tenant quotas (WorkerOptions::tenant_quotas): one row per tenant
  // the cache has seen, in id order (kSharedTenant first); empty without.
  std::vector<TenantCacheRow> tenant_cache;

  // Weighted hit ratios (issue 26). Per item served from a tier, the bytes
  // of its entry and its encode cost in seconds (the measured EntryCost the
  // entry was cached with: its decode and preprocessing plus its share of its
  // tower batch; docs/PLAN.md); per tower computation, the same for the
  // entry it made (miss_*). So the object, byte and encode-second hit ratios
  // of tier X are hits_X / (all hits + misses), hit_bytes_X / (all hit bytes
  // + miss_bytes) and hit_seconds_X / (all hit seconds + miss_seconds).
  // Joins are in none of them. A video's temporal chunks count as the
  // entries they are (a chunk served from L1 in hit_*_l1, a chunk the tower
  // ran in miss_*), besides the whole-video entry when that is what hit.
  // encode_seconds_saved is the three tiers' hit seconds summed: tower (and
  // decode) seconds the cache spared.
  std::uint64_t hit_bytes_l1 = 0;
  std::uint64_t hit_bytes_l2 = 0;
  std::uint64_t hit_bytes_l3 = 0;
  std::uint64_t miss_bytes = 0;
  double hit_seconds_l1 = 0;
  double hit_seconds_l2 = 0;
  double hit_seconds_l3 = 0;
  double miss_seconds = 0;
  double encode_seconds_saved = 0;
  // Bytes written into each tier (puts, promotions, demotions), and puts the
  // L1 doorkeeper sent to L2 instead (--l1-admission doorkeeper).
  std::uint64_t l1_write_bytes = 0;
  std::uint64_t l2_write_bytes = 0;
  std::uint64_t l1_admission_rejections = 0;
  // Values from the shared tier refused by the adoption check (grid, tokens,
  // width, dtype or deepstack layers other than the request predicts, or
  // non-finite rows; issue 27, fault 3): deleted there and encoded here.
  std::uint64_t adopt_rejections = 0;
};

// Every numeric field of WorkerStats, once (epd/core/stat_fields.h): the Stats
// RPC, /metrics and `replay --json` are built from this table. `errors` (by
// status code) is no number; the conversions carry it by hand (StatsResponse
// item_errors, epd_item_errors_total{code}).
// A row per field reads as a table; clang-format would give each cell a line.
// clang-format off
inline constexpr StatField<WorkerStats> kWorkerStatsFields[] = {
    // name, member, kind, unit, help,
    //   proto field, Prometheus series, replay --json key
    {"requests", &WorkerStats::requests, StatKind::kCounter, StatUnit::kCount,
     "Requests accepted by the worker",
     {"requests"}, {"epd_requests_total"}, ""},
    {"items", &WorkerStats::items, StatKind::kCounter, StatUnit::kCount,
     "Items of accepted requests",
     {"items"}, {"epd_items_total"}, ""},
    {"hits_l1", &WorkerStats::hits_l1, StatKind::kCounter, StatUnit::kCount,
     "Items served from the cache, by tier",
     {"hits_l1"}, {"epd_cache_hits_total", "tier", "l1"}, "hits_l1"},
    {"hits_l2", &WorkerStats::hits_l2, StatKind::kCounter, StatUnit::kCount,
     "Items served from the cache, by tier",
     {"hits_l2"}, {"epd_cache_hits_total", "tier", "l2"}, "hits_l2"},
    {"hits_l3", &WorkerStats::hits_l3, StatKind::kCounter, StatUnit::kCount,
     "Items served from the cache, by tier",
     {"hits_l3"}, {"epd_cache_hits_total", "tier", "l3"}, "hits_l3"},
    {"misses", &WorkerStats::misses, StatKind::kCounter, StatUnit::kCount,
     "Items that missed the cache (ran the tower or failed before it)",
     {"misses"}, {"epd_cache_misses_total"}, "misses"},
    {"joins", &WorkerStats::joins, StatKind::kCounter, StatUnit::kCount,
     "Items that joined a computation already queued or running",
     {"joins"}, {"epd_joins_total"}, "joins"},
    {"shape_mismatches", &WorkerStats::shape_mismatches, StatKind::kCounter, StatUnit::kCount,
     "Cache hits whose shape differed from the request's",
     {"shape_mismatches"}, {"epd_shape_mismatches_total"}, "shape_mismatches"},
    {"video_items", &WorkerStats::video_items, StatKind::kCounter, StatUnit::kCount,
     "Video items (also counted as cache hits or misses above)",
     {"video_items"}, {"epd_video_items_total"}, "video_items"},
    {"video_decodes", &WorkerStats::video_decodes, StatKind::kCounter, StatUnit::kCount,
     "Video items decoded (not served whole from the cache)",
     {"video_decodes"}, {"epd_video_decodes_total"}, "video_decodes"},
    {"chunk_hits", &WorkerStats::chunk_hits, StatKind::kCounter, StatUnit::kCount,
     "Temporal chunks of decoded videos, by outcome",
     {"chunk_hits"}, {"epd_video_chunks_total", "outcome", "hit"}, "chunk_hits"},
    {"chunk_misses", &WorkerStats::chunk_misses, StatKind::kCounter, StatUnit::kCount,
     "Temporal chunks of decoded videos, by outcome",
     {"chunk_misses"}, {"epd_video_chunks_total", "outcome", "miss"}, "chunk_misses"},
    {"chunk_joins", &WorkerStats::chunk_joins, StatKind::kCounter, StatUnit::kCount,
     "Temporal chunks of decoded videos, by outcome",
     {"chunk_joins"}, {"epd_video_chunks_total", "outcome", "joined"}, "chunk_joins"},
    {"rejected_requests", &WorkerStats::rejected_requests, StatKind::kCounter, StatUnit::kCount,
     "Requests the worker refused (duplicate id, queue limit)",
     {"rejected_requests"}, {"epd_rejected_requests_total"}, ""},
    {"cancelled_requests", &WorkerStats::cancelled_requests, StatKind::kCounter, StatUnit::kCount,
     "Requests cancelled (deadline, client, shutdown)",
     {"cancelled_requests"}, {"epd_cancelled_requests_total"}, ""},
    {"tower_batches", &WorkerStats::tower_batches, StatKind::kCounter, StatUnit::kCount,
     "Tower calls, failed ones included",
     {"tower_batches"}, {"epd_tower_batches_total"}, "tower_batches"},
    {"tower_items", &WorkerStats::tower_items, StatKind::kCounter, StatUnit::kCount,
     "Computations sent to the tower",
     {"tower_items"}, {"epd_tower_items_total"}, "tower_items"},
    {"tower_tokens", &WorkerStats::tower_tokens, StatKind::kCounter, StatUnit::kTokens,
     "Post-merge tokens of the computations sent to the tower",
     {"tower_tokens"}, {}, "tower_tokens"},
    // Not a series: /metrics has each batch's time in the histogram epd_tower_seconds.
    {"tower_seconds", &WorkerStats::tower_seconds, StatKind::kCounter, StatUnit::kSeconds,
     "Wall time inside VisionTower::Encode",
     {"tower_seconds"}, {}, "tower_s"},
    {"tower_failures", &WorkerStats::tower_failures, StatKind::kCounter, StatUnit::kCount,
     "Tower batches that failed",
     {"tower_failures"}, {"epd_tower_failures_total"}, ""},
    {"sink_full_stalls", &WorkerStats::sink_full_stalls, StatKind::kCounter, StatUnit::kCount,
     "Worker steps skipped because result buffers were full",
     {"sink_full_stalls"}, {"epd_sink_full_stalls_total"}, ""},
    {"callback_exceptions", &WorkerStats::callback_exceptions, StatKind::kCounter, StatUnit::kCount,
     "Request callbacks that threw (caught by the worker)",
     {}, {}, ""},
    {"cache_errors", &WorkerStats::cache_errors, StatKind::kCounter, StatUnit::kCount,
     "Cache operations whose tier copy failed (served as a miss, or the victim dropped)",
     {"cache_errors"}, {"epd_cache_errors_total"}, "cache_errors"},
    {"in_flight_requests", &WorkerStats::in_flight_requests, StatKind::kGauge, StatUnit::kCount,
     "Requests accepted and not yet complete",
     {"in_flight_requests"}, {"epd_in_flight_requests"}, ""},
    {"pending_items", &WorkerStats::pending_items, StatKind::kGauge, StatUnit::kCount,
     "Computations queued for the tower",
     {"pending_items"}, {"epd_queue_items"}, ""},
    {"pending_tokens", &WorkerStats::pending_tokens, StatKind::kGauge, StatUnit::kTokens,
     "Post-merge tokens queued for the tower",
     {"pending_tokens"}, {"epd_queue_tokens"}, ""},
    {"l1_evictions", &WorkerStats::l1_evictions, StatKind::kCounter, StatUnit::kCount,
     "Capacity victims, by tier",
     {"l1_evictions"}, {"epd_cache_evictions_total", "tier", "l1"}, ""},
    {"l2_evictions", &WorkerStats::l2_evictions, StatKind::kCounter, StatUnit::kCount,
     "Capacity victims, by tier",
     {"l2_evictions"}, {"epd_cache_evictions_total", "tier", "l2"}, ""},
    {"l1_lru_victims", &WorkerStats::l1_lru_victims, StatKind::kCounter, StatUnit::kCount,
     "Capacity victims taken from the recency order (all under lru, none under gdsf), by tier",
     {"l1_lru_victims"}, {"epd_cache_lru_victims_total", "tier", "l1"}, "l1_lru_victims"},
    {"l2_lru_victims", &WorkerStats::l2_lru_victims, StatKind::kCounter, StatUnit::kCount,
     "Capacity victims taken from the recency order (all under lru, none under gdsf), by tier",
     {"l2_lru_victims"}, {"epd_cache_lru_victims_total", "tier", "l2"}, "l2_lru_victims"},
    {"demotions", &WorkerStats::demotions, StatKind::kCounter, StatUnit::kCount,
     "L1 victims moved to L2",
     {"demotions"}, {"epd_cache_demotions_total"}, "demotions"},
    {"promotions", &WorkerStats::promotions, StatKind::kCounter, StatUnit::kCount,
     "L2 hits moved to L1",
     {"promotions"}, {"epd_cache_promotions_total"}, "promotions"},
    // replay's l1_bytes, l2_bytes (and tower_s) predate the field names; docs/REPLAY.md and bench/ read them.
    {"l1_used_bytes", &WorkerStats::l1_used_bytes, StatKind::kGauge, StatUnit::kBytes,
     "Bytes held by the cache, by tier",
     {"l1_used_bytes"}, {"epd_cache_bytes", "tier", "l1"}, "l1_bytes"},
    {"l2_used_bytes", &WorkerStats::l2_used_bytes, StatKind::kGauge, StatUnit::kBytes,
     "Bytes held by the cache, by tier",
     {"l2_used_bytes"}, {"epd_cache_bytes", "tier", "l2"}, "l2_bytes"},
    {"l1_entries", &WorkerStats::l1_entries, StatKind::kGauge, StatUnit::kCount,
     "Entries held by the cache, by tier",
     {"l1_entries"}, {"epd_cache_entries", "tier", "l1"}, ""},
    {"l2_entries", &WorkerStats::l2_entries, StatKind::kGauge, StatUnit::kCount,
     "Entries held by the cache, by tier",
     {"l2_entries"}, {"epd_cache_entries", "tier", "l2"}, ""},
    {"hit_bytes_l1", &WorkerStats::hit_bytes_l1, StatKind::kCounter, StatUnit::kBytes,
     "Bytes of the entries served from the cache, by tier",
     {"hit_bytes_l1"}, {"epd_cache_hit_bytes_total", "tier", "l1"}, "hit_bytes_l1"},
    {"hit_bytes_l2", &WorkerStats::hit_bytes_l2, StatKind::kCounter, StatUnit::kBytes,
     "Bytes of the entries served from the cache, by tier",
     {"hit_bytes_l2"}, {"epd_cache_hit_bytes_total", "tier", "l2"}, "hit_bytes_l2"},
    {"hit_bytes_l3", &WorkerStats::hit_bytes_l3, StatKind::kCounter, StatUnit::kBytes,
     "Bytes of the entries served from the cache, by tier",
     {"hit_bytes_l3"}, {"epd_cache_hit_bytes_total", "tier", "l3"}, "hit_bytes_l3"},
    {"miss_bytes", &WorkerStats::miss_bytes, StatKind::kCounter, StatUnit::kBytes,
     "Bytes of the entries the tower made",
     {"miss_bytes"}, {"epd_cache_miss_bytes_total"}, "miss_bytes"},
    {"hit_seconds_l1", &WorkerStats::hit_seconds_l1, StatKind::kCounter, StatUnit::kSeconds,
     "Measured encode cost of the entries served from the cache, by tier",
     {"hit_seconds_l1"}, {"epd_cache_hit_encode_seconds_total", "tier", "l1"}, "hit_seconds_l1"},
    {"hit_seconds_l2", &WorkerStats::hit_seconds_l2, StatKind::kCounter, StatUnit::kSeconds,
     "Measured encode cost of the entries served from the cache, by tier",
     {"hit_seconds_l2"}, {"epd_cache_hit_encode_seconds_total", "tier", "l2"}, "hit_seconds_l2"},
    {"hit_seconds_l3", &WorkerStats::hit_seconds_l3, StatKind::kCounter, StatUnit::kSeconds,
     "Measured encode cost of the entries served from the cache, by tier",
     {"hit_seconds_l3"}, {"epd_cache_hit_encode_seconds_total", "tier", "l3"}, "hit_seconds_l3"},
    {"miss_seconds", &WorkerStats::miss_seconds, StatKind::kCounter, StatUnit::kSeconds,
     "Measured encode cost of the entries the tower made",
     {"miss_seconds"}, {"epd_cache_miss_encode_seconds_total"}, "miss_seconds"},
    {"encode_seconds_saved", &WorkerStats::encode_seconds_saved, StatKind::kCounter, StatUnit::kSeconds,
     "Encode seconds the cache saved (the measured cost of every hit, all tiers)",
     {"encode_seconds_saved"}, {"epd_encode_seconds_saved_total"}, "encode_seconds_saved"},
    {"l1_write_bytes", &WorkerStats::l1_write_bytes, StatKind::kCounter, StatUnit::kBytes,
     "Bytes written into the cache, by tier (puts, promotions, demotions)",
     {"l1_write_bytes"}, {"epd_cache_write_bytes_total", "tier", "l1"}, "l1_write_bytes"},
    {"l2_write_bytes", &WorkerStats::l2_write_bytes, StatKind::kCounter, StatUnit::kBytes,
     "Bytes written into the cache, by tier (puts, promotions, demotions)",
     {"l2_write_bytes"}, {"epd_cache_write_bytes_total", "tier", "l2"}, "l2_write_bytes"},
    {"l1_admission_rejections", &WorkerStats::l1_admission_rejections, StatKind::kCounter, StatUnit::kCount,
     "Puts the L1 doorkeeper sent to L2 (a first request)",
     {"l1_admission_rejections"}, {"epd_cache_l1_admission_rejections_total"}, "l1_admission_rejections"},
    {"adopt_rejections", &WorkerStats::adopt_rejections, StatKind::kCounter, StatUnit::kCount,
     "Shared-tier values refused for not matching the request (deleted there, encoded here)",
     {"adopt_rejections"}, {"epd_adopt_rejections_total"}, "adopt_rejections"},
};
// clang-format on

}  // namespace epd
