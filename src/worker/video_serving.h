// src/worker/video_serving.h (internal to epd::worker): how the worker serves
// a video item: the whole-video lookup, the container decode off the owning
// thread, the expansion into temporal-chunk jobs once decoded, and the
// assembly of the chunks' rows into the video's embedding.
//
// A video item's path (docs/VIDEO.md):
//   Serve (inside Submit):
//     - its whole-video key hit in L1/L2 with a known timing is delivered at
//       once, without a decode;
//     - what needs no decode to refuse is refused at once (bad sampling, a
//       container without decode_video, a negative expected_tokens);
//     - a whole video already queued or running (a tower without
//       independent temporal chunks) is joined;
//     - otherwise the item waits on a decode: an identical video's decode
//       still pending is shared (no second decode), else a new one is posted
//       to the video decode threads (TenantTaskPool, sized
//       max(1, decode_threads), one tenant at most max(1, n - 1) of them).
//       The item is a barrier in the JobQueue (what is submitted after it is
//       held) and the ItemSink of its request's item.
//   Completion (TakeCompletions, on the owning thread): a finished decode
//   resolves its items' barriers; JobQueue::Flush then expands each in
//   arrival order (Expand): a decode error, the expected-tokens rule or the
//   queue bound fails the item alone; else each chunk is joined, served from
//   the cache (the one hit check) or becomes a job of grid (1, h, w), queued
//   where the video was submitted. A tower without independent chunks gets
//   one job of grid (t, h, w) instead, joined and cached under the
//   whole-video key only.
//   Assembly (Take, from the JobTable's Fire): when the last chunk is in,
//   the rows are concatenated in order (grid (t, h, w)), cached under the
//   whole-video key with the timing kept for later whole-video hits, and
//   delivered; a failed chunk fails the video, naming the chunk.
//   Abandon (the request was cancelled or failed): the barrier resolves at
//   once (so what was held behind it goes on), and when no other item shares
//   the decode it is told to stop (its stop token: decode_video returns
//   between frames) and its late completion is ignored.
//
// Cap (CheckDecodeCap, from Submit): one tenant has at most
// max_video_decodes_per_tenant decodes posted and not yet completed; a
// request that would start more is refused whole (kResourceExhausted).
//
// Counts video_items, video_decodes (decodes started), chunk_hits /
// chunk_joins / chunk_misses (at expansion), and misses / joins / hits for
// the item itself at Serve.
//
// Thread safety: thread-compatible (the worker's owning thread), except
// CompletionReady and SetWake, which are thread-safe. The decode threads run
// PrepareVideo and push completions under mu_; they call `wake` (under mu_)
// after each, and it must only wake the owner.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "epd/core/encode_types.h"
#include "epd/core/mutex.h"
#include "epd/core/vision_tower.h"
#include "epd/worker/encode_request.h"
#include "epd/worker/worker_options.h"
#include "job_queue.h"
#include "job_table.h"
#include "tenant_task_pool.h"
#include "video_items.h"
#include "worker_cache.h"

namespace epd::internal {

class VideoServing {
 public:
  // What it works with; every part must outlive it.
  struct Parts {
    const WorkerOptions& options;
    const VisionTower& tower;
    WorkerStats& stats;
    WorkerCache& cache;
    JobTable& table;
    JobQueue& queue;
  };
  explicit VideoServing(Parts parts);
  // Tells every decode still running to stop, and waits for it.
  ~VideoServing();
  VideoServing(const VideoServing&) = delete;
  VideoServing& operator=(const VideoServing&) = delete;

  // Serves video item res.index of request `r` (res.key is its whole-video
  // key). True when the item now waits (on a decode or on jobs; res is then
  // held in the table); false when `res` is ready to post (a hit or an
  // error). `chunk_ns`: the namespace its temporal chunks are keyed in.
  bool Serve(RequestNum r, EncodeItemInput& item, std::optional<KeyNamespace> chunk_ns, Clock::time_point arrived,
             ItemResult& res);

  // Submit's cap on queued decodes (issue 40): OK, or kResourceExhausted,
  // naming the tenant and max_video_decodes_per_tenant, when the decodes the
  // request's video items would start (neither a whole-video hit, nor
  // refused before a decode, nor sharing a pending decode or whole-video job)
  // would take its tenant's decodes posted and not yet completed past the
  // cap. Checked before anything changes, so a refused request leaves no
  // trace and no other request is touched.
  Status CheckDecodeCap(const EncodeRequest& request, const std::vector<StatusOr<ContentKey>>& keys) const;

  // A whole video's job finished and its embedding is cached under `key`:
  // its timing is kept for whole-video hits.
  void Cached(const ContentKey& key, std::shared_ptr<const VideoTiming> timing);

  // Runs on a decode thread after each decode completes (see the header
  // comment); null = none. Thread-safe.
  void SetWake(std::function<void()> wake);
  // A completed decode waits for TakeCompletions. Thread-safe, lock-free.
  bool CompletionReady() const { return ready_.load(std::memory_order_acquire); }
  // Resolves the items of every completed decode; the caller then runs
  // JobQueue::Flush. Returns the number of decodes taken.
  std::int64_t TakeCompletions();
  // Blocks until a completed decode waits for TakeCompletions. REQUIRES: a
  // decode was posted and not taken yet (decodes_running() > 0).
  void AwaitCompletion();
  // Decodes posted and not yet taken by TakeCompletions.
  std::int64_t decodes_running() const { return static_cast<std::int64_t>(in_flight_.size()); }

 private:
  class Item;
  struct Decode;

  // `chunk_ns`: the namespace of the video's temporal chunk keys.
  std::shared_ptr<Decode> StartDecode(const ContentKey& key, const VideoInput& input,
                                      std::optional<KeyNamespace> chunk_ns, const std::string& tenant);
  // An item no longer needs its decode (expanded or abandoned).
  void Release(Decode& d);
  // No item needs `d`: stops it when still running, forgets it from pending_.
  void Retire(Decode& d);
  // Expansion (Item::Expand) and its two shapes.
  void Expand(Item& v);
  void ExpandWhole(Item& v, const PreparedVideo& p);
  void ExpandChunks(Item& v, const PreparedVideo& p);
  // Counts the chunk keys that would become new jobs (the queue bound).
  std::int64_t NewChunkJobs(const PreparedVideo& p) const;
  JobWork Work(const Item& v, JobId id, std::int64_t part, std::int64_t cost,
               std::function<StatusOr<PreprocessedImage>()> make) const;
  // The video's result once every chunk is in (Item::Take), cached under
  // the whole-video key with the sum of its chunks' costs.
  ItemResult Assemble(Item& v);
  // The costs the cache holds for `keys`, summed (a chunk evicted meanwhile
  // adds nothing).
  double ChunkSeconds(const std::vector<ContentKey>& keys) const;
  // Posts the item's final result.
  void Post(const Item& v, ItemResult res);

  const Parts p_;
  const bool chunked_;  // temporal chunks cached and encoded one by one
  VideoTimingCache timings_;
  // dedup_in_flight: pending decodes by whole-video key, until no item
  // needs them.
  std::unordered_map<ContentKey, std::shared_ptr<Decode>, ContentKeyHash> pending_;
  // Posted and not yet taken by TakeCompletions (stopped at destruction).
  std::vector<std::shared_ptr<Decode>> in_flight_;
  // in_flight_ counted by the tenant that started each (no zero entries).
  std::map<std::string, std::int64_t> decodes_by_tenant_;

  mutable Mutex mu_;
  CondVar done_cv_;
  std::vector<std::shared_ptr<Decode>> done_ EPD_GUARDED_BY(mu_);
  std::function<void()> wake_ EPD_GUARDED_BY(mu_);
  std::atomic<bool> ready_{false};  // !done_.empty(), readable without mu_
  TenantTaskPool pool_;             // last: its threads use everything above
};

}  // namespace epd::internal
