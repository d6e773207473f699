// Design notes.
//
// State. A *job* is one tower computation: a content key, the handle of its
// prefetch decode, and the waiters (request, item index) that receive its
// result. A job is *queued* (on the scheduler under exactly one scheduler
// key) until StartBatch() takes it, then *running*
// (in a Batch the TowerRunner holds) until FinishBatch() caches its result,
// delivers it and erases it. Invariants between calls:
//   - job_by_sched holds exactly the queued jobs, and the scheduler exactly
//     their scheduler keys; running jobs are exactly those of the runner's batches;
//   - job_by_key maps a content key to its (queued or running) job when dedup
//     is on, so a late duplicate joins even a running computation;
//   - every queued job has >= 1 waiter (a running one may have none: it was
//     cancelled under way and is still cached when it finishes); every waiter's
//     request is in `requests` with that item not yet delivered.
// A scheduler key is (request id + '\0' + zero-padded submission number, item
// index) of the item that created the job. The submission number keeps keys
// unique when a cancelled request's job lives on for another waiter and a new
// request reuses the id; the '\0' separator keeps kByKey ordering by request
// id first.
//
// Threads. The owning thread does everything except two things: helper
// threads of the PrefetchDecoder decode queued misses in arrival order, and
// the TowerRunner's thread (tower_runner.h) takes each started batch's
// decoded images and runs VisionTower::Encode, batches in start order.
// Batch formation sees only the scheduler calls and header costs, so it does
// not depend on decode timing.
//
// Delivery. Callbacks never run while the state is half-updated: Submit and
// FinishBatch first bring every structure to its new state, collecting the
// results to deliver, and only then fire on_item / on_done. A request is
// erased before its on_done runs, so the id is free again inside the
// callback's caller.
//
// Copies. Each item's rows are copied out of the batch's TowerOutput into a
// fresh Embedding (batch_output.h), so the cache never aliases a buffer the
// tower may reuse for its next batch.
#include "epd/worker/encode_worker.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <span>
#include <unordered_map>
#include <utility>

#include "batch_output.h"
#include "epd/core/tiered_cache.h"
#include "prefetch_decoder.h"
#include "tower_runner.h"
#include "video_items.h"

namespace epd {
namespace {

using Clock = std::chrono::steady_clock;
using Cache = TieredEmbeddingCache<ContentKey, EmbeddingPtr, ContentKeyHash>;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

std::vector<StatusOr<ContentKey>> KeysFor(const WorkerOptions& o, const EncodeRequest& request) {
  std::vector<StatusOr<ContentKey>> keys;
  keys.reserve(request.items.size());
  for (const EncodeItemInput& item : request.items) {
    if (item.is_video()) {
      if (item.caller_key.has_value() || !item.media.empty()) {
        keys.push_back(
            InvalidArgument("a video item carries image bytes or a caller_key; a video is keyed by its "
                            "own bytes and sampling"));
      } else {
        keys.push_back(internal::VideoItemKey(o, *item.video));
      }
    } else if (item.caller_key.has_value()) {
      keys.push_back(CallerContentKey(o.model_id, o.preprocess, *item.caller_key));
    } else {
      keys.push_back(ComputeContentKey(o.model_id, o.preprocess, item.media.span(), o.key_mode));
    }
  }
  return keys;
}

// An item's header grid (ProbeGrid), probed at most once per item.
class HeaderProbe {
 public:
  HeaderProbe(const MediaBytes& media, const WorkerOptions& options) : media_(media), options_(options) {}
  const StatusOr<ProbedGrid>& Get() {
    if (!probed_.has_value()) probed_.emplace(ProbeGrid(media_.span(), options_.preprocess, options_.limits));
    return *probed_;
  }

 private:
  const MediaBytes& media_;
  const WorkerOptions& options_;
  std::optional<StatusOr<ProbedGrid>> probed_;
};

// The expected-tokens rule (EncodeItemInput::expected_tokens): >= 0, and
// when the item carries an image whose header reads, equal to the tokens
// that header gives. An unreadable header is left to the miss path, which
// names the decode error.
Status CheckExpectedTokens(const EncodeItemInput& item, HeaderProbe& header, std::int64_t merge_size) {
  if (item.expected_tokens < 0) {
    return InvalidArgument("expected_tokens is " + std::to_string(item.expected_tokens) +
                           "; it must be >= 0 (0 = unknown)");
  }
  if (item.expected_tokens == 0 || item.media.empty()) return Status::Ok();
  const StatusOr<ProbedGrid>& probed = header.Get();
  if (!probed.ok()) return Status::Ok();
  const GridTHW& g = probed->grid;
  const std::int64_t tokens = g.tokens(merge_size);
  if (tokens == item.expected_tokens) return Status::Ok();
  return InvalidArgument("expected_tokens is " + std::to_string(item.expected_tokens) + " but the " +
                         std::to_string(probed->info.width) + "x" + std::to_string(probed->info.height) +
                         " image gives " + std::to_string(tokens) + " tokens (grid " + std::to_string(g.t) + "x" +
                         std::to_string(g.h) + "x" + std::to_string(g.w) + ", merge " + std::to_string(merge_size) +
                         ")");
}

// What a miss costs its tenant under kFair: its post-merge tokens (the
// tower's work) plus its stored pixels in token-sized units (decode and
// resize work, which for a huge image dwarfs the tower's).
std::int64_t FairShareCost(const ImageInfo& info, std::int64_t tokens, const PreprocessConfig& p) {
  const std::int64_t pixels_per_token = p.factor() * p.factor();
  return tokens + std::int64_t{info.width} * info.height / std::max<std::int64_t>(pixels_per_token, 1);
}

// kFair's bound on a batch's share costs: twice the token budget. An image
// stored at about its resized size costs about 2 x its tokens (tokens plus as
// many pixel units), so such batches are bounded by tokens as before; an
// image whose decode dwarfs its tokens (an 8000x8000 PNG: ~83,000 units for
// 1,280 tokens) runs in a batch of its own instead of making the cheap images
// batched with it wait for its decode.
std::int64_t FairShareBound(const WorkerOptions& o) {
  return o.order == ScheduleOrder::kFair ? 2 * o.max_tokens_per_batch : 0;
}

}  // namespace

bool RequestResult::all_ok() const {
  if (!status.ok()) return false;
  return std::all_of(items.begin(), items.end(), [](const ItemResult& r) { return r.status.ok(); });
}

struct EncodeWorker::Impl {
  struct Waiter {
    std::uint64_t request;
    std::int64_t index;
    Clock::time_point arrived;
    std::int64_t chunk = -1;  // >= 0: the item is a video and this job is its temporal chunk `chunk`
  };
  // A video item waiting on its chunks (video_items.h).
  struct VideoAssembly {
    ContentKey whole_key;
    GridTHW grid;
    std::shared_ptr<const VideoTiming> timing;
    std::vector<EmbeddingPtr> chunks;  // by temporal index; null until ready
    std::vector<std::uint64_t> jobs;   // the jobs it waits on (each once)
    std::int64_t remaining = 0;        // chunks not ready yet
    Status failure;                    // the first chunk's failure
    double queue_ms = 0;               // its slowest chunk's
    double tower_ms = 0;
  };
  struct Job {
    ContentKey key;
    std::shared_ptr<internal::PrefetchDecoder::Task> decode;  // moved to the Batch when it starts
    EncodeScheduler::Key sched_key;
    std::vector<Waiter> waiters;
    bool running = false;
    // A whole video's job (grid (t, h, w)): its timing, delivered to every
    // waiter and kept for whole-video hits. Null for images and chunks.
    std::shared_ptr<const VideoTiming> video_timing;
  };
  struct Request {
    std::string id;
    std::string tenant;  // EncodeRequest::tenant
    RequestCallbacks callbacks;
    std::vector<ItemResult> results;
    std::vector<std::uint64_t> job;  // per item: the job it waits on, 0 = none
    std::vector<bool> delivered;
    std::int64_t remaining = 0;
    std::map<std::int64_t, VideoAssembly> videos;  // by item index, until delivered
  };
  using Batch = internal::Batch;
  using BatchEntry = internal::BatchEntry;
  // A result computed while the state was updated, fired afterwards.
  struct Delivery {
    std::uint64_t request;
    ItemResult result;
    std::int64_t chunk = -1;  // >= 0: one temporal chunk of video item result.index
  };

  Impl(WorkerOptions opt, std::unique_ptr<VisionTower> t)
      : options(std::move(opt)),
        tower(std::move(t)),
        cache(options.l1_capacity_bytes, options.l2_capacity_bytes, FencedToHost(), options.to_device),
        scheduler(options.max_tokens_per_batch, options.max_items_per_batch, options.order, FairShareBound(options)),
        decoder(options.preprocess, options.limits, options.decode_threads,
                options.decode_lookahead > 0 ? options.decode_lookahead : 2 * options.max_items_per_batch,
                /*fair=*/options.order == ScheduleOrder::kFair),
        runner(*tower, decoder),
        video_timings(options.max_video_timings) {}

  WorkerOptions options;
  std::unique_ptr<VisionTower> tower;
  Cache cache;
  EncodeScheduler scheduler;
  internal::PrefetchDecoder decoder;

  std::unordered_map<std::uint64_t, Request> requests;
  std::unordered_map<std::string, std::uint64_t> request_ids;
  std::unordered_map<std::uint64_t, Job> jobs;
  std::unordered_map<ContentKey, std::uint64_t, ContentKeyHash> job_by_key;
  std::map<EncodeScheduler::Key, std::uint64_t> job_by_sched;
  std::uint64_t next_request = 1;
  std::uint64_t next_job = 1;
  WorkerStats stats;
  bool placed_in_l2 = false;  // CachePut has put an entry straight into L2 (see L2Only)

  // Last: its destructor waits for started batches' tower calls, which use
  // the tower and the decoder above.
  internal::TowerRunner runner;
  internal::VideoTimingCache video_timings;

  // Tokens a hit must have for this item; 0 when unknown (no expected count
  // and no readable header, e.g. a caller key sent without the media).
  std::int64_t ExpectedTokens(const EncodeItemInput& item, HeaderProbe& header) const {
    if (item.expected_tokens > 0) return item.expected_tokens;
    const StatusOr<ProbedGrid>& probed = header.Get();
    return probed.ok() ? probed->grid.tokens(options.preprocess.merge_size) : 0;
  }

  bool ShapeMatches(const Embedding& e, const EncodeItemInput& item, HeaderProbe& header) const {
    const std::int64_t expected = ExpectedTokens(item, header);
    return e.shape() == tower->OutputShape(expected == 0 ? e.tokens : expected) && e.nbytes() == e.ExpectedBytes();
  }

  void CountError(StatusCode code) { ++stats.errors[code]; }

  // Fires the collected deliveries in order; completes requests that have
  // no item left.
  void Fire(std::vector<Delivery>& deliveries) {
    for (Delivery& d : deliveries) {
      auto it = requests.find(d.request);
      if (it == requests.end()) continue;  // unreachable: aborts fire nothing
      Request& r = it->second;
      const std::int64_t i = d.result.index;
      if (d.chunk >= 0 && !TakeChunk(r, d)) continue;  // the video still waits on other chunks
      r.results[i] = std::move(d.result);
      r.delivered[i] = true;
      r.job[i] = 0;
      --r.remaining;
      if (r.callbacks.on_item) Call([&] { r.callbacks.on_item(r.results[i]); });
      if (r.remaining == 0) Complete(it, Status::Ok());
    }
  }

  // Erases the request, then fires its on_done.
  void Complete(std::unordered_map<std::uint64_t, Request>::iterator it, Status status) {
    Request r = std::move(it->second);
    requests.erase(it);
    request_ids.erase(r.id);
    RequestResult result{std::move(r.id), std::move(status), std::move(r.results)};
    if (r.callbacks.on_done) Call([&] { r.callbacks.on_done(result); });
  }

  template <typename F>
  void Call(F&& f) {
    try {
      f();
    } catch (...) {
      ++stats.callback_exceptions;
    }
  }

  void EraseJob(std::uint64_t job_id) {
    auto it = jobs.find(job_id);
    Job& job = it->second;
    if (job.decode != nullptr) decoder.Drop(job.decode);
    if (!job.running) job_by_sched.erase(job.sched_key);
    if (auto k = job_by_key.find(job.key); k != job_by_key.end() && k->second == job_id) job_by_key.erase(k);
    jobs.erase(it);
  }

  // Removes the request's waiters from their jobs (dropping queued jobs left
  // without a waiter; a running one finishes and is cached), fails its
  // undelivered items with `status` and completes it with `status`.
  void Abort(std::uint64_t request_id, const Status& status) {
    auto it = requests.find(request_id);
    Request& r = it->second;
    for (std::size_t i = 0; i < r.results.size(); ++i) {
      if (r.delivered[i]) continue;
      std::vector<std::uint64_t> waited;
      if (r.job[i] != 0) waited.push_back(r.job[i]);
      if (auto v = r.videos.find(static_cast<std::int64_t>(i)); v != r.videos.end()) waited = v->second.jobs;
      for (const std::uint64_t j : waited) {
        Job& job = jobs.at(j);
        std::erase_if(job.waiters, [&](const Waiter& w) {
          return w.request == request_id && w.index == static_cast<std::int64_t>(i);
        });
        if (job.waiters.empty() && !job.running) {
          scheduler.Remove(job.sched_key);
          EraseJob(j);
        }
      }
      r.results[i].status = status;
      r.results[i].embedding = nullptr;
      CountError(status.code());
    }
    ++stats.cancelled_requests;
    Complete(it, status);
  }

  // options.to_host behind a fence, as the cache's demotion copy: one that
  // throws (a device failure) is counted and returns null, which drops that
  // victim (epd/core/tiered_cache.h). Letting it unwind out of the cache instead
  // would abandon the eviction half-way: L1 left over its capacity (VRAM
  // over budget) and the get or put that triggered it failed, so a promoted
  // entry already back in L1 would be served as a miss.
  Cache::CopyFn FencedToHost() {
    if (!options.to_host) return nullptr;
    return [this](const EmbeddingPtr& e) { return HostCopy(e); };
  }
  EmbeddingPtr HostCopy(const EmbeddingPtr& e) {
    if (!options.to_host) return e;
    try {
      return options.to_host(e);
    } catch (...) {
      ++stats.cache_errors;
      return nullptr;
    }
  }

  // The worker's placement policy for an entry too big for L1 but not for L2.
  // The tiered cache (the reference's semantics) would skip it at put and
  // lose it at promotion, so such an image ran the tower on every repeat.
  // Instead CachePut places it in L2 directly (after the device-to-host copy a
  // demotion makes), and CacheGet serves an L2 hit on it without promoting it
  // (L1 could not take it): a host-to-device copy for the caller, the entry
  // stays in L2 as its most recently used.
  bool L2Only(std::int64_t nbytes) const {
    return nbytes > cache.l1().capacity_bytes() && nbytes <= cache.l2().capacity_bytes();
  }
  std::optional<EmbeddingPtr> L2OnlyGet(const ContentKey& key) {
    if (cache.l1().Contains(key)) return std::nullopt;
    std::optional<PoppedEntry<EmbeddingPtr>> held = cache.l2().Pop(key);
    if (!held.has_value()) return std::nullopt;
    EmbeddingPtr host = held->value;
    // Back as MRU; the same charge again evicts nothing.
    cache.l2().Put(key, std::move(held->value), held->nbytes);
    if (!L2Only(held->nbytes)) return std::nullopt;  // promotable: the tiered get takes it
    return options.to_device ? options.to_device(host) : host;
  }

  // A get behind a fence: a promotion copy that throws (a device failure in
  // the GPU tier's hooks) is counted and turns into a miss, never an
  // exception out of Submit. The tiered cache has already left itself
  // consistent (epd/core/tiered_cache.h).
  std::optional<EmbeddingPtr> CacheGet(const ContentKey& key, CacheTier* tier) {
    try {
      if (placed_in_l2) {
        if (std::optional<EmbeddingPtr> held = L2OnlyGet(key)) {
          *tier = CacheTier::kL2;
          return held;
        }
      }
      return cache.Get(key, tier);
    } catch (...) {
      ++stats.cache_errors;
      *tier = CacheTier::kMiss;
      return std::nullopt;
    }
  }
  // A value the shared tier (L3) supplied: checked like any hit, then cached
  // in L1 (moved to the device first when the tiers live there). nullopt when
  // its shape differs (counted) or the copy fails; the item is then encoded.
  // Joins the job already computing res.key (queued or running), if there is
  // one: the item becomes one of its waiters (ItemSource::kJoined) and
  // r.results takes `res`. Returns false, leaving `res`, when there is none.
  bool JoinInFlight(std::uint64_t rid, ItemResult& res, Clock::time_point arrived) {
    const auto j = job_by_key.find(res.key);
    if (j == job_by_key.end()) return false;
    Request& r = requests.at(rid);
    const std::int64_t i = res.index;
    ++stats.joins;
    jobs.at(j->second).waiters.push_back({rid, i, arrived});
    r.job[i] = j->second;
    r.results[i] = std::move(res);
    r.results[i].source = ItemSource::kJoined;
    return true;
  }

  std::optional<EmbeddingPtr> AdoptReady(const ContentKey& key, EmbeddingPtr ready, const EncodeItemInput& item,
                                         HeaderProbe& header) {
    if (!ShapeMatches(*ready, item, header)) {
      ++stats.shape_mismatches;
      return std::nullopt;
    }
    if (options.to_device) {
      try {
        ready = options.to_device(ready);
      } catch (...) {
        ++stats.cache_errors;
        return std::nullopt;
      }
    }
    CachePut(key, ready);
    return ready;
  }

  // A put cannot throw from a tier copy: its only copies are demotions and
  // the L2 placement, fenced by HostCopy.
  void CachePut(const ContentKey& key, const EmbeddingPtr& e) {
    const auto nbytes = static_cast<std::int64_t>(e->nbytes());
    if (!L2Only(nbytes)) {
      cache.Put(key, e, nbytes);
      return;
    }
    cache.l1().Pop(key);  // a stale L1 copy (a re-encode): the tiers stay exclusive
    EmbeddingPtr host = HostCopy(e);
    if (host == nullptr) return;  // the copy failed: dropped, as a failed demotion is
    cache.l2().Put(key, std::move(host), nbytes);
    placed_in_l2 = true;
  }

  // Queues one result per waiter of `job`: the embedding, or `status`.
  void Deliver(const Job& job, const Batch& b, const EmbeddingPtr& embedding, const Status& status,
               std::vector<Delivery>& ready) {
    const Clock::time_point now = Clock::now();
    for (const Waiter& w : job.waiters) {
      ItemResult res;
      res.index = w.index;
      res.key = job.key;
      res.source = requests.at(w.request).results[w.index].source;
      if (embedding != nullptr) res.video = job.video_timing;
      res.queue_ms = std::max(0.0, Ms(b.start - w.arrived));
      res.tower_ms = b.tower_ms;
      res.total_ms = Ms(now - w.arrived);
      if (embedding != nullptr) {
        res.embedding = embedding;
      } else {
        res.status = status;
        if (w.chunk < 0) CountError(res.status.code());  // a video counts once, when it completes
      }
      ready.push_back({w.request, std::move(res), w.chunk});
    }
  }

  Status Submit(EncodeRequest request, RequestCallbacks callbacks, std::vector<StatusOr<ContentKey>> keys);
  // Submit's request-level refusals, checked before anything changes; fills
  // `keys` when the caller left it empty.
  Status Admit(const EncodeRequest& request, std::vector<StatusOr<ContentKey>>& keys) const;
  // Whether `key` would become a new tower job, for the max_pending_items
  // checks: not cached, and (with dedup_in_flight) neither in flight nor
  // already in `counted`, to which it is then added.
  bool CountsAsNewJob(const ContentKey& key, std::vector<ContentKey>& counted) const {
    if (cache.Contains(key)) return false;
    if (!options.dedup_in_flight) return true;
    if (job_by_key.count(key) != 0 || std::find(counted.begin(), counted.end(), key) != counted.end()) return false;
    counted.push_back(key);
    return true;
  }
  // Serves item res.index (res.key set) of request `rid`: joins a job, or
  // takes a hit, or queues a new job. True when the item now waits on a job
  // (res moved into the request); false when `res` is ready to deliver.
  bool ServeItem(std::uint64_t rid, const std::string& sched_id, EncodeItemInput& item, Clock::time_point arrived,
                 ItemResult& res);
  // ServeItem for a video item: a whole-video hit, or its chunks each served
  // as an image is (hit, join or a new job). True when it waits on jobs.
  bool ServeVideo(std::uint64_t rid, const std::string& sched_id, EncodeItemInput& item, Clock::time_point arrived,
                  ItemResult& res);
  // Fire's step for a chunk delivery `d`: records the chunk in its video's
  // assembly; when it was the last one, turns d.result into the video's
  // result and returns true (deliver it), else false.
  bool TakeChunk(Request& r, Delivery& d);
  // The video's result from its complete assembly: the chunks concatenated
  // (cached under the whole-video key) or the first chunk failure.
  void FinishVideo(VideoAssembly& a, ItemResult& res);
  bool StartBatch(std::function<void()> on_finished);
  std::int64_t FinishBatch();

  // kFair with decode helpers: true once every item of the next batch is
  // decoded (marking the rest as needed), so the tower thread never decodes,
  // or waits on, an expensive image while other tenants' work could run.
  // Other orders: always true (the tower thread decodes what is missing).
  bool NextBatchDecoded() {
    if (options.order != ScheduleOrder::kFair || decoder.threads() == 0) return true;
    bool ready = true;
    for (const EncodeScheduler::Key& k : scheduler.PeekBatch()) {
      const Job& job = jobs.at(job_by_sched.at(k));
      if (decoder.Ready(job.decode)) continue;
      decoder.Need(job.decode);
      ready = false;
    }
    return ready;
  }
};

EncodeWorker::EncodeWorker(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
EncodeWorker::~EncodeWorker() = default;

StatusOr<std::unique_ptr<EncodeWorker>> EncodeWorker::Create(WorkerOptions options,
                                                             std::unique_ptr<VisionTower> tower) {
  if (tower == nullptr) return InvalidArgument("tower is null");
  if (Status s = options.Validate(); !s.ok()) return s;
  if (tower->patch_dim() != options.preprocess.patch_dim()) {
    return InvalidArgument("tower patch_dim " + std::to_string(tower->patch_dim()) +
                           " differs from the preprocess config's " + std::to_string(options.preprocess.patch_dim()));
  }
  if (tower->merge_size() != options.preprocess.merge_size) {
    return InvalidArgument("tower merge_size " + std::to_string(tower->merge_size()) +
                           " differs from the preprocess config's " + std::to_string(options.preprocess.merge_size));
  }
  if (tower->output_on_device() && (!options.adopt_device_rows || !options.to_host || !options.to_device)) {
    // Without to_host an L1 victim in VRAM would move to L2 as it is, so the
    // VRAM in use could reach l1_capacity_bytes + l2_capacity_bytes.
    return InvalidArgument("tower '" + tower->Describe() + "' leaves its output in device memory, but " +
                           (!options.adopt_device_rows ? "adopt_device_rows"
                            : !options.to_host         ? "to_host"
                                                       : "to_device") +
                           " is not set (take all three hooks from the GPU tier: MakeEmbeddingTierHooks)");
  }
  return std::unique_ptr<EncodeWorker>(new EncodeWorker(std::make_unique<Impl>(std::move(options), std::move(tower))));
}

std::vector<StatusOr<ContentKey>> EncodeWorker::ItemKeys(const EncodeRequest& request) const {
  return KeysFor(impl_->options, request);
}

Status EncodeWorker::Submit(EncodeRequest request, RequestCallbacks callbacks, std::vector<StatusOr<ContentKey>> keys) {
  return impl_->Submit(std::move(request), std::move(callbacks), std::move(keys));
}

Status EncodeWorker::Impl::Submit(EncodeRequest request, RequestCallbacks callbacks,
                                  std::vector<StatusOr<ContentKey>> keys) {
  const Clock::time_point arrived = Clock::now();
  if (Status s = Admit(request, keys); !s.ok()) {
    ++stats.rejected_requests;
    return s;
  }
  const std::uint64_t rid = next_request++;
  char seq[24];
  std::snprintf(seq, sizeof(seq), "%020llu", static_cast<unsigned long long>(rid));
  const std::string sched_id = request.id + '\0' + seq;
  const std::size_t n = request.items.size();
  request_ids.emplace(request.id, rid);
  Request& r = requests[rid];
  r.id = request.id;
  r.tenant = std::move(request.tenant);
  r.callbacks = std::move(callbacks);
  r.results.resize(n);
  r.job.assign(n, 0);
  r.delivered.assign(n, false);
  r.remaining = static_cast<std::int64_t>(n);
  ++stats.requests;
  stats.items += n;

  std::vector<Delivery> ready;
  for (std::size_t i = 0; i < n; ++i) {
    ItemResult res;
    res.index = static_cast<std::int64_t>(i);
    if (keys[i].ok()) {
      res.key = *keys[i];
      if (ServeItem(rid, sched_id, request.items[i], arrived, res)) continue;  // waits on a job
    } else {
      ++stats.misses;
      res.status = keys[i].status();
    }
    if (!res.status.ok()) CountError(res.status.code());
    res.total_ms = Ms(Clock::now() - arrived);
    ready.push_back({rid, std::move(res)});
  }

  if (n == 0) {
    Complete(requests.find(rid), Status::Ok());
    return Status::Ok();
  }
  Fire(ready);
  return Status::Ok();
}

Status EncodeWorker::Impl::Admit(const EncodeRequest& request, std::vector<StatusOr<ContentKey>>& keys) const {
  if (request.id.empty()) return InvalidArgument("request id is empty");
  if (request_ids.count(request.id) != 0) return AlreadyExists("request '" + request.id + "' is already in flight");
  const std::size_t n = request.items.size();
  if (keys.empty() && n != 0) {
    keys = KeysFor(options, request);
  } else if (keys.size() != n) {
    return InvalidArgument("request '" + request.id + "' has " + std::to_string(n) + " items but " +
                           std::to_string(keys.size()) + " keys");
  }
  if (options.max_pending_items == 0) return Status::Ok();
  // An upper bound on the jobs this request would add: keys neither cached
  // nor already in flight.
  std::int64_t new_jobs = 0;
  std::vector<ContentKey> counted;
  for (const StatusOr<ContentKey>& k : keys) {
    if (k.ok() && CountsAsNewJob(*k, counted)) ++new_jobs;
  }
  // More misses than the whole queue holds can never be admitted, however
  // long the caller waits: that is the request's fault, not the load's.
  if (new_jobs > options.max_pending_items) {
    return InvalidArgument("request '" + request.id + "' has " + std::to_string(new_jobs) +
                           " items to queue for the tower (neither cached nor in flight), more than the "
                           "queue holds at once (max_pending_items " +
                           std::to_string(options.max_pending_items) +
                           "); split it into requests of at most that many new images");
  }
  const std::int64_t pending = static_cast<std::int64_t>(scheduler.pending_size());
  if (pending + new_jobs > options.max_pending_items) {
    return ResourceExhausted("request '" + request.id + "' would queue " + std::to_string(new_jobs) +
                             " items on top of " + std::to_string(pending) + " pending; the limit is " +
                             std::to_string(options.max_pending_items));
  }
  return Status::Ok();
}

bool EncodeWorker::Impl::ServeItem(std::uint64_t rid, const std::string& sched_id, EncodeItemInput& item,
                                   Clock::time_point arrived, ItemResult& res) {
  Request& r = requests.at(rid);
  const std::int64_t i = res.index;
  if (item.is_video()) return ServeVideo(rid, sched_id, item, arrived, res);
  HeaderProbe header(item.media, options);
  if (Status s = CheckExpectedTokens(item, header, options.preprocess.merge_size); !s.ok()) {
    ++stats.misses;
    res.status = std::move(s);
    return false;
  }
  if (options.dedup_in_flight && JoinInFlight(rid, res, arrived)) return true;

  CacheTier tier = CacheTier::kMiss;
  std::optional<EmbeddingPtr> hit = CacheGet(res.key, &tier);
  if (hit.has_value()) {
    if (ShapeMatches(**hit, item, header)) {
      tier == CacheTier::kL1 ? ++stats.hits_l1 : ++stats.hits_l2;
      res.source = tier == CacheTier::kL1 ? ItemSource::kL1 : ItemSource::kL2;
      res.embedding = std::move(*hit);
      return false;
    }
    ++stats.shape_mismatches;
  } else if (item.ready != nullptr) {
    if (std::optional<EmbeddingPtr> l3 = AdoptReady(res.key, std::move(item.ready), item, header)) {
      ++stats.hits_l3;
      res.source = ItemSource::kL3;
      res.embedding = std::move(*l3);
      return false;
    }
  }

  ++stats.misses;
  res.source = ItemSource::kMiss;
  // Queued with the header's token count; decoded ahead of its batch by the
  // prefetch decoder, so bad pixel data surfaces in Step.
  if (item.media.empty() && item.caller_key.has_value()) {
    res.status = InvalidArgument(
        "its caller_key is not cached on this server and it carries no image bytes to encode; resend it with "
        "`image` set");
    return false;
  }
  const StatusOr<ProbedGrid>& probed = header.Get();
  if (!probed.ok()) {
    res.status = probed.status();
    return false;
  }
  const std::int64_t tokens = probed->grid.tokens(options.preprocess.merge_size);
  const std::uint64_t job_id = next_job++;
  Job& job = jobs[job_id];
  job.key = res.key;
  job.sched_key = {sched_id, i};
  job.waiters.push_back({rid, i, arrived});
  PendingEncodeItem pending{job.sched_key.first, job.sched_key.second, tokens};
  if (options.order == ScheduleOrder::kFair) {
    pending.tenant = r.tenant;
    pending.share_cost = FairShareCost(probed->info, tokens, options.preprocess);
  }
  scheduler.Add(std::move(pending));
  // `header` is not used after this.
  job.decode = decoder.Enqueue(std::move(item.media), scheduler.RankOf(job.sched_key), r.tenant);
  job_by_sched.emplace(job.sched_key, job_id);
  if (options.dedup_in_flight) job_by_key[res.key] = job_id;
  r.job[i] = job_id;
  r.results[i] = std::move(res);
  return true;
}

bool EncodeWorker::Impl::ServeVideo(std::uint64_t rid, const std::string& sched_id, EncodeItemInput& item,
                                    Clock::time_point arrived, ItemResult& res) {
  ++stats.video_items;
  const std::int64_t i = res.index;
  const std::int64_t merge = options.preprocess.merge_size;
  if (item.expected_tokens < 0) {
    ++stats.misses;
    res.status = InvalidArgument("expected_tokens is " + std::to_string(item.expected_tokens) +
                                 "; it must be >= 0 (0 = unknown)");
    return false;
  }
  // An exact repeat: one lookup, no decode.
  CacheTier tier = CacheTier::kMiss;
  if (std::shared_ptr<const VideoTiming> timing = video_timings.Find(res.key); timing != nullptr) {
    std::optional<EmbeddingPtr> hit = CacheGet(res.key, &tier);
    if (hit.has_value()) {
      const Embedding& e = **hit;
      const bool tokens_ok = item.expected_tokens == 0 || item.expected_tokens == e.tokens;
      if (tokens_ok && e.shape() == tower->OutputShape(e.tokens) && e.nbytes() == e.ExpectedBytes()) {
        tier == CacheTier::kL1 ? ++stats.hits_l1 : ++stats.hits_l2;
        res.source = tier == CacheTier::kL1 ? ItemSource::kL1 : ItemSource::kL2;
        res.embedding = std::move(*hit);
        res.video = std::move(timing);
        return false;
      }
      ++stats.shape_mismatches;
    }
  }
  Request& r = requests.at(rid);
  const bool chunked = options.video_chunk_cache && tower->temporal_chunks_independent();
  // The same video, queued or running whole.
  if (!chunked && options.dedup_in_flight && JoinInFlight(rid, res, arrived)) return true;
  ++stats.misses;
  res.source = ItemSource::kMiss;
  ++stats.video_decodes;
  StatusOr<internal::PreparedVideo> prepared = internal::PrepareVideo(options, *item.video);
  if (!prepared.ok()) {
    res.status = prepared.status();
    return false;
  }
  const std::int64_t tokens = prepared->grid.tokens(merge);
  if (item.expected_tokens > 0 && item.expected_tokens != tokens) {
    res.status =
        InvalidArgument("expected_tokens is " + std::to_string(item.expected_tokens) + " but the video gives " +
                        std::to_string(tokens) + " tokens (grid " + std::to_string(prepared->grid.t) + "x" +
                        std::to_string(prepared->grid.h) + "x" + std::to_string(prepared->grid.w) + ")");
    return false;
  }

  char item_tag[24];
  std::snprintf(item_tag, sizeof(item_tag), "%020lld", static_cast<long long>(i));
  // Video jobs' scheduler keys: (sched_id + '\1' + item index, chunk index),
  // unique per submission, item and chunk, and ordered after the request's
  // image items under kByKey.
  const std::string video_sched = sched_id + '\1' + item_tag;
  auto new_job = [&](const ContentKey& key, std::int64_t c, std::int64_t cost,
                     std::function<StatusOr<PreprocessedImage>()> make) {
    const std::uint64_t job_id = next_job++;
    Job& job = jobs[job_id];
    job.key = key;
    job.sched_key = {video_sched, c};
    PendingEncodeItem pending{job.sched_key.first, job.sched_key.second, cost};
    // Under kFair a chunk's share is its tokens: its frames are decoded already.
    if (options.order == ScheduleOrder::kFair) pending.tenant = r.tenant;
    scheduler.Add(std::move(pending));
    job.decode = decoder.Enqueue(std::move(make), scheduler.RankOf(job.sched_key), r.tenant);
    job_by_sched.emplace(job.sched_key, job_id);
    if (options.dedup_in_flight) job_by_key[key] = job_id;
    return job_id;
  };
  if (!chunked) {
    // The whole video as one tower item of grid (t, h, w).
    const std::uint64_t job_id = new_job(res.key, 0, tokens, [video = prepared->video, cfg = options.preprocess] {
      return internal::PreprocessWholeVideo(*video, cfg);
    });
    Job& job = jobs.at(job_id);
    job.video_timing = prepared->timing;
    job.waiters.push_back({rid, i, arrived});
    r.job[i] = job_id;
    r.results[i] = std::move(res);
    return true;
  }

  // The queue bound (max_pending_items), now that the chunks are known:
  // Submit's check counted the video as one job. Only the chunks that will
  // become jobs count (neither cached nor in flight); the video fails alone,
  // and what it would have queued is not queued.
  if (options.max_pending_items > 0) {
    std::int64_t new_jobs = 0;
    std::vector<ContentKey> counted;
    for (const ContentKey& key : prepared->chunk_keys) {
      if (CountsAsNewJob(key, counted)) ++new_jobs;
    }
    const std::int64_t pending = static_cast<std::int64_t>(scheduler.pending_size());
    if (new_jobs > options.max_pending_items) {
      res.status = InvalidArgument("the video has " + std::to_string(new_jobs) +
                                   " temporal chunks to queue for the tower, more than the queue holds at once "
                                   "(max_pending_items " +
                                   std::to_string(options.max_pending_items) +
                                   "); sample fewer frames (max_frames, fps) or split the video");
      return false;
    }
    if (pending + new_jobs > options.max_pending_items) {
      res.status =
          ResourceExhausted("the video would queue " + std::to_string(new_jobs) + " temporal chunks on top of " +
                            std::to_string(pending) + " pending; the limit is " +
                            std::to_string(options.max_pending_items) + " (retry later)");
      return false;
    }
  }

  VideoAssembly a;
  a.whole_key = res.key;
  a.grid = prepared->grid;
  a.timing = prepared->timing;
  a.chunks.resize(static_cast<std::size_t>(a.grid.t));
  const GridTHW chunk_grid{1, a.grid.h, a.grid.w};
  const std::int64_t chunk_tokens = chunk_grid.tokens(merge);
  auto wait_on = [&](std::uint64_t job_id, std::int64_t c) {
    jobs.at(job_id).waiters.push_back({rid, i, arrived, c});
    if (std::find(a.jobs.begin(), a.jobs.end(), job_id) == a.jobs.end()) a.jobs.push_back(job_id);
    ++a.remaining;
  };
  for (std::int64_t c = 0; c < a.grid.t; ++c) {
    const ContentKey& key = prepared->chunk_keys[static_cast<std::size_t>(c)];
    if (options.dedup_in_flight) {
      if (auto j = job_by_key.find(key); j != job_by_key.end()) {
        ++stats.chunk_joins;
        wait_on(j->second, c);
        continue;
      }
    }
    CacheTier chunk_tier = CacheTier::kMiss;
    if (std::optional<EmbeddingPtr> hit = CacheGet(key, &chunk_tier); hit.has_value()) {
      const Embedding& e = **hit;
      if (e.shape() == tower->OutputShape(chunk_tokens) && e.nbytes() == e.ExpectedBytes()) {
        ++stats.chunk_hits;
        a.chunks[static_cast<std::size_t>(c)] = std::move(*hit);
        continue;
      }
      ++stats.shape_mismatches;
    }
    ++stats.chunk_misses;
    wait_on(new_job(key, c, chunk_tokens,
                    [video = prepared->video, c, cfg = options.preprocess] { return PreprocessChunk(*video, c, cfg); }),
            c);
  }
  if (a.remaining == 0) {  // every chunk was cached
    FinishVideo(a, res);
    return false;
  }
  r.results[i] = std::move(res);
  r.videos.emplace(i, std::move(a));
  return true;
}

bool EncodeWorker::Impl::TakeChunk(Request& r, Delivery& d) {
  const std::int64_t i = d.result.index;
  VideoAssembly& a = r.videos.at(i);
  if (d.result.status.ok()) {
    a.chunks[static_cast<std::size_t>(d.chunk)] = std::move(d.result.embedding);
  } else if (a.failure.ok()) {
    a.failure =
        Status(d.result.status.code(), "temporal chunk " + std::to_string(d.chunk) + ": " + d.result.status.message());
  }
  a.queue_ms = std::max(a.queue_ms, d.result.queue_ms);
  a.tower_ms = std::max(a.tower_ms, d.result.tower_ms);
  if (--a.remaining > 0) return false;
  ItemResult res = std::move(r.results[i]);  // key and source set by ServeVideo
  res.queue_ms = a.queue_ms;
  res.tower_ms = a.tower_ms;
  res.total_ms = d.result.total_ms;
  FinishVideo(a, res);
  if (!res.status.ok()) CountError(res.status.code());
  d.result = std::move(res);
  r.videos.erase(i);
  return true;
}

void EncodeWorker::Impl::FinishVideo(VideoAssembly& a, ItemResult& res) {
  if (!a.failure.ok()) {
    res.status = a.failure;
    return;
  }
  StatusOr<EmbeddingPtr> whole = internal::ConcatChunks(a.chunks, a.grid, options.preprocess.merge_size);
  if (!whole.ok()) {
    res.status = whole.status();
    return;
  }
  EmbeddingPtr e = std::move(*whole);
  if (options.to_device) {
    // With a GPU tier L1 holds device embeddings; the concatenation was
    // made on the host. A failed copy serves (and caches) the host one.
    try {
      if (EmbeddingPtr d = options.to_device(e); d != nullptr) e = std::move(d);
    } catch (...) {
      ++stats.cache_errors;
    }
  }
  CachePut(a.whole_key, e);
  video_timings.Put(a.whole_key, a.timing);
  res.embedding = std::move(e);
  res.video = a.timing;
}

std::int64_t EncodeWorker::Step() {
  if (impl_->runner.Outstanding() == 0 && !impl_->StartBatch(nullptr)) return 0;
  return impl_->FinishBatch();
}

bool EncodeWorker::StartBatch(std::function<void()> on_finished) { return impl_->StartBatch(std::move(on_finished)); }
std::int64_t EncodeWorker::FinishBatch() { return impl_->FinishBatch(); }
std::int64_t EncodeWorker::OutstandingBatches() const { return impl_->runner.Outstanding(); }
bool EncodeWorker::TowerBusy() const { return impl_->runner.Busy(); }
bool EncodeWorker::BatchFinished() const { return impl_->runner.Finished(); }

bool EncodeWorker::Impl::StartBatch(std::function<void()> on_finished) {
  if (runner.Busy() || runner.Outstanding() >= 2 || scheduler.pending_size() == 0) return false;
  if (options.sink_full && options.sink_full()) {
    ++stats.sink_full_stalls;
    return false;
  }
  if (!NextBatchDecoded()) return false;
  auto b = std::make_unique<Batch>();
  for (const PendingEncodeItem& p : scheduler.NextBatch()) {
    auto it = job_by_sched.find(p.key());
    const std::uint64_t id = it->second;
    job_by_sched.erase(it);
    Job& job = jobs.at(id);
    job.running = true;
    b->entries.push_back({id, std::move(job.decode), Status::Ok(), {}});
  }
  b->on_finished = std::move(on_finished);
  runner.Start(std::move(b));
  return true;
}

std::int64_t EncodeWorker::Impl::FinishBatch() {
  std::unique_ptr<Batch> b = runner.Collect();
  if (b == nullptr) return 0;

  // `failure` fails every decoded item: the tower's error or a malformed output.
  Status failure;
  if (b->decoded > 0) {
    failure =
        internal::CheckOutput(b->out, b->decoded, b->tokens, *tower, static_cast<bool>(options.adopt_device_rows));
    ++stats.tower_batches;
    stats.tower_items += static_cast<std::uint64_t>(b->decoded);
    stats.tower_tokens += static_cast<std::uint64_t>(b->tokens);
    stats.tower_seconds += b->tower_ms / 1e3;
    if (!failure.ok()) ++stats.tower_failures;
  }

  std::vector<Delivery> ready;
  std::optional<internal::BatchOutputReader> output;
  if (failure.ok() && b->decoded > 0) output.emplace(*b->out, options.adopt_device_rows);
  for (BatchEntry& e : b->entries) {
    Job& job = jobs.at(e.job);
    EmbeddingPtr embedding;
    Status status = failure;
    if (!e.decode_status.ok()) {
      status = e.decode_status;
    } else if (failure.ok()) {
      StatusOr<EmbeddingPtr> rows = output->Next(e.image.grid, e.image.tokens());
      if (rows.ok()) {
        embedding = std::move(*rows);
        CachePut(job.key, embedding);
        if (job.video_timing != nullptr) video_timings.Put(job.key, job.video_timing);
      } else {
        status = rows.status();
      }
    }
    Deliver(job, *b, embedding, status, ready);
    EraseJob(e.job);
  }
  Fire(ready);
  return static_cast<std::int64_t>(b->entries.size());
}

bool EncodeWorker::HasQueuedWork() const { return impl_->scheduler.pending_size() != 0; }

bool EncodeWorker::HasLocal(const ContentKey& key) const {
  return impl_->cache.Contains(key) || impl_->job_by_key.count(key) != 0;
}

bool EncodeWorker::Cancel(const std::string& id) {
  auto it = impl_->request_ids.find(id);
  if (it == impl_->request_ids.end()) return false;
  impl_->Abort(it->second, Cancelled("request '" + id + "' was cancelled"));
  return true;
}

std::int64_t EncodeWorker::FailAll(const Status& status) {
  // Oldest first, so the order of on_done calls is deterministic.
  std::vector<std::uint64_t> ids;
  ids.reserve(impl_->requests.size());
  for (const auto& [rid, r] : impl_->requests) ids.push_back(rid);
  std::sort(ids.begin(), ids.end());
  for (std::uint64_t rid : ids) impl_->Abort(rid, status);
  return static_cast<std::int64_t>(ids.size());
}

WorkerStats EncodeWorker::stats() const {
  const Impl& m = *impl_;
  WorkerStats s = m.stats;
  s.in_flight_requests = static_cast<std::int64_t>(m.requests.size());
  s.pending_items = static_cast<std::int64_t>(m.scheduler.pending_size());
  s.pending_tokens = m.scheduler.pending_tokens();
  s.l1_evictions = m.cache.l1().evictions();
  s.l2_evictions = m.cache.l2().evictions();
  s.demotions = m.cache.demotions();
  s.promotions = m.cache.promotions();
  s.l1_used_bytes = m.cache.l1().current_bytes();
  s.l2_used_bytes = m.cache.l2().current_bytes();
  s.l1_entries = static_cast<std::int64_t>(m.cache.l1().size());
  s.l2_entries = static_cast<std::int64_t>(m.cache.l2().size());
  return s;
}

const WorkerOptions& EncodeWorker::options() const { return impl_->options; }
const VisionTower& EncodeWorker::tower() const { return *impl_->tower; }

}  // namespace epd
