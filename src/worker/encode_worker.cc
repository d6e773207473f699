// Design notes.
//
// State. A *job* is one tower computation: a content key, the handle of its
// prefetch decode, and the waiters (request, item index) that receive its
// result. A job is *queued* (on the scheduler under exactly one scheduler
// key) until StartBatch() takes it, then *running*
// (in a Batch of `outstanding`) until FinishBatch() caches its result,
// delivers it and erases it. Invariants between calls:
//   - job_by_sched holds exactly the queued jobs, and the scheduler exactly
//     their scheduler keys; running jobs are exactly those of `outstanding`;
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
// one tower thread takes each started batch's decoded images (decoding any
// no helper has started) and runs VisionTower::Encode, batches in start
// order. The tower thread touches only the Batches it was handed and the
// decoder (which has its own lock); the owning thread reads a Batch again
// only after its `done` is set under tower_mu. Benefits: while the tower
// runs, the owner keeps accepting requests, serving hits and queueing misses
// whose decode then overlaps the tower; and it can start the next batch
// before collecting (copying out, caching, delivering) the one that just
// finished, so the collect overlaps the tower too. Costs: one more thread,
// and corrupt pixel data is reported when its batch runs rather than at
// Submit. Batch formation sees only the scheduler calls and header costs, so
// it does not depend on decode timing.
//
// Delivery. Callbacks never run while the state is half-updated: Submit and
// FinishBatch first bring every structure to its new state, collecting the
// results to deliver, and only then fire on_item / on_done. A request is
// erased before its on_done runs, so the id is free again inside the
// callback's caller.
//
// Copies. Each item's rows are copied out of the batch's TowerOutput into a
// fresh Embedding (main and deepstack halves, contiguous), so the cache never
// aliases a buffer the tower may reuse for its next batch.
#include "epd/encode_worker.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <span>
#include <thread>
#include <unordered_map>
#include <utility>

#include "epd/tiered_cache.h"
#include "prefetch_decoder.h"

namespace epd {
namespace {

using Clock = std::chrono::steady_clock;
using Cache = TieredEmbeddingCache<ContentKey, EmbeddingPtr, ContentKeyHash>;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

std::span<const std::uint8_t> Bytes(const std::string& s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

std::vector<StatusOr<ContentKey>> KeysFor(const WorkerOptions& o, const EncodeRequest& request) {
  std::vector<StatusOr<ContentKey>> keys;
  keys.reserve(request.items.size());
  for (const EncodeItemInput& item : request.items) {
    if (item.caller_key.has_value()) {
      keys.push_back(CallerContentKey(o.model_id, o.preprocess, *item.caller_key));
    } else {
      keys.push_back(ComputeContentKey(o.model_id, o.preprocess, Bytes(item.media), o.key_mode));
    }
  }
  return keys;
}

}  // namespace

std::string_view ItemSourceName(ItemSource source) {
  switch (source) {
    case ItemSource::kL1: return "l1";
    case ItemSource::kL2: return "l2";
    case ItemSource::kMiss: return "miss";
    case ItemSource::kJoined: return "joined";
  }
  return "unknown";
}

bool RequestResult::all_ok() const {
  if (!status.ok()) return false;
  return std::all_of(items.begin(), items.end(), [](const ItemResult& r) { return r.status.ok(); });
}

struct EncodeWorker::Impl {
  struct Waiter {
    std::uint64_t request;
    std::int64_t index;
    Clock::time_point arrived;
  };
  struct Job {
    ContentKey key;
    std::shared_ptr<internal::PrefetchDecoder::Task> decode;  // moved to the Batch when it starts
    EncodeScheduler::Key sched_key;
    std::vector<Waiter> waiters;
    bool running = false;
  };
  // A started batch. Filled by StartBatch, then owned by the tower thread
  // until `done`, then read by FinishBatch.
  struct BatchEntry {
    std::uint64_t job;
    std::shared_ptr<internal::PrefetchDecoder::Task> decode;
    Status decode_status;  // the decode's error, if any
    PreprocessedImage image;
  };
  struct Batch {
    std::vector<BatchEntry> entries;
    std::function<void()> on_finished;
    bool done = false;         // guarded by tower_mu: the tower thread is through with it
    std::int64_t decoded = 0;  // entries sent to the tower
    std::int64_t tokens = 0;   // their post-merge tokens
    StatusOr<TowerOutput> out = Status(StatusCode::kInternal, "no item of the batch decoded");
    Clock::time_point start;  // tower call start
    double tower_ms = 0;
  };
  struct Request {
    std::string id;
    RequestCallbacks callbacks;
    std::vector<ItemResult> results;
    std::vector<std::uint64_t> job;  // per item: the job it waits on, 0 = none
    std::vector<bool> delivered;
    std::int64_t remaining = 0;
  };
  // A result computed while the state was updated, fired afterwards.
  struct Delivery {
    std::uint64_t request;
    ItemResult result;
  };

  Impl(WorkerOptions opt, std::unique_ptr<VisionTower> t)
      : options(std::move(opt)),
        tower(std::move(t)),
        cache(options.l1_bytes, options.l2_bytes, FencedToHost(), options.to_device),
        scheduler(options.max_tokens_per_batch, options.max_items_per_batch, options.order),
        decoder(options.preprocess, options.limits, options.decode_threads,
                options.decode_lookahead > 0 ? options.decode_lookahead : 2 * options.max_items_per_batch),
        tower_thread([this] { TowerLoop(); }) {}

  // Waits for started batches' tower calls, then stops the tower thread.
  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(tower_mu);
      tower_stop = true;
    }
    tower_cv.notify_all();
    tower_thread.join();
  }

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

  // Started batches not yet collected by FinishBatch, oldest first (the
  // owner's view): at most one running on the tower thread plus one
  // finished. The tower thread runs them in this order.
  std::deque<std::unique_ptr<Batch>> outstanding;
  std::atomic<int> finished{0};  // batches the tower thread is through with, not yet collected
  std::mutex tower_mu;
  std::condition_variable tower_cv;
  std::deque<Batch*> tower_queue;  // guarded by tower_mu
  bool tower_stop = false;         // guarded by tower_mu
  std::thread tower_thread;        // last member: starts after everything it uses

  bool TowerBusy() const { return static_cast<int>(outstanding.size()) > finished.load(std::memory_order_acquire); }

  // The grid the image will have, from its header alone; the errors a
  // decode would give for a bad header (format, zero size, pixel limit).
  StatusOr<GridTHW> HeaderGrid(const std::string& media) const {
    StatusOr<ImageInfo> info = ProbeImage(Bytes(media));
    if (!info.ok()) return info.status();
    const std::int64_t pixels = std::int64_t{info->width} * info->height;
    if (pixels > options.limits.max_pixels) {
      return InvalidArgument("too many pixels: " + std::to_string(info->width) + "x" + std::to_string(info->height) +
                             " = " + std::to_string(pixels) + " exceeds the limit " +
                             std::to_string(options.limits.max_pixels));
    }
    return GridForImage(info->height, info->width, options.preprocess);
  }

  // Tokens a hit must have for this item; 0 when unknown (no expected count
  // and no readable header, e.g. a caller key sent without the media).
  std::int64_t ExpectedTokens(const EncodeItemInput& item) const {
    if (item.expected_tokens > 0) return item.expected_tokens;
    StatusOr<GridTHW> grid = HeaderGrid(item.media);
    return grid.ok() ? grid->tokens(options.preprocess.merge_size) : 0;
  }

  bool ShapeMatches(const Embedding& e, const EncodeItemInput& item) const {
    if (e.hidden != tower->hidden() || e.deepstack_layers != tower->deepstack_layers() ||
        e.dtype != tower->dtype() || e.nbytes() != e.ExpectedBytes()) {
      return false;
    }
    const std::int64_t expected = ExpectedTokens(item);
    return expected == 0 || expected == e.tokens;
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
      if (const std::uint64_t j = r.job[i]; j != 0) {
        Job& job = jobs.at(j);
        std::erase_if(job.waiters, [&](const Waiter& w) {
          return w.request == request_id && w.index == static_cast<std::int64_t>(i);
        });
        if (job.waiters.empty() && !job.running) {
          scheduler.remove(job.sched_key);
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

  // OK when `out` is a well-formed output for `items` items of `tokens`
  // post-merge tokens in total; else the kInternal error failing the batch.
  Status CheckOutput(const StatusOr<TowerOutput>& out, std::int64_t items, std::int64_t tokens) const {
    if (!out.ok()) return Internal("vision tower failed: " + out.status().message());
    const TowerOutput& o = *out;
    const std::size_t dsize = DTypeSize(o.dtype);
    if (o.rows != tokens) {
      return Internal("vision tower returned " + std::to_string(o.rows) + " rows for a batch of " +
                      std::to_string(items) + " items totalling " + std::to_string(tokens) + " tokens");
    }
    if (o.hidden != tower->hidden() || o.deepstack_layers != tower->deepstack_layers() || o.dtype != tower->dtype()) {
      return Internal("vision tower output is hidden " + std::to_string(o.hidden) + ", deepstack " +
                      std::to_string(o.deepstack_layers) + ", " + std::string(DTypeName(o.dtype)) +
                      "; the tower declares hidden " + std::to_string(tower->hidden()) + ", deepstack " +
                      std::to_string(tower->deepstack_layers()) + ", " + std::string(DTypeName(tower->dtype())));
    }
    if (o.on_device()) {
      // Sizes are the backend's to keep; only the pointers can be checked.
      if ((o.main_bytes() > 0 && o.device_main == nullptr) ||
          (o.deepstack_bytes() > 0 && o.device_deepstack == nullptr)) {
        return Internal("vision tower output is on the device but its " +
                        std::string(o.device_main == nullptr ? "main" : "deepstack") + " pointer is null");
      }
      if (!options.adopt_device_rows) {
        return Internal("vision tower output is on the device, but the worker has no adopt_device_rows hook");
      }
      return Status::Ok();
    }
    if (o.main.size() != static_cast<std::size_t>(o.rows * o.hidden) * dsize ||
        o.deepstack.size() != static_cast<std::size_t>(o.rows * o.hidden * o.deepstack_layers) * dsize) {
      return Internal("vision tower output holds " + std::to_string(o.main.size()) + "+" +
                      std::to_string(o.deepstack.size()) + " bytes, its shape [" + std::to_string(o.rows) + ", " +
                      std::to_string(o.hidden) + "] x (1 + " + std::to_string(o.deepstack_layers) + ") needs " +
                      std::to_string(o.rows * o.hidden * (1 + o.deepstack_layers) * dsize));
    }
    return Status::Ok();
  }

  // options.to_host behind a fence, as the cache's demotion copy: one that
  // throws (a device failure) is counted and returns null, which drops that
  // victim (epd/tiered_cache.h). Letting it unwind out of the cache instead
  // would abandon the eviction half-way: L1 left over its capacity (VRAM
  // over budget) and the get or put that triggered it failed, so a promoted
  // entry already back in L1 would be served as a miss.
  Cache::CopyFn FencedToHost() {
    if (!options.to_host) return nullptr;
    return [this](const EmbeddingPtr& e) -> EmbeddingPtr {
      try {
        return options.to_host(e);
      } catch (...) {
        ++stats.cache_errors;
        return nullptr;
      }
    };
  }

  // A get behind a fence: a promotion copy that throws (a device failure in
  // the GPU tier's hooks) is counted and turns into a miss, never an
  // exception out of Submit. The tiered cache has already left itself
  // consistent (epd/tiered_cache.h).
  std::optional<EmbeddingPtr> CacheGet(const ContentKey& key, CacheTier* tier) {
    try {
      return cache.get(key, tier);
    } catch (...) {
      ++stats.cache_errors;
      *tier = CacheTier::kMiss;
      return std::nullopt;
    }
  }
  // A put cannot throw from a tier copy: its only copies are demotions,
  // fenced by FencedToHost.
  void CachePut(const ContentKey& key, const EmbeddingPtr& e) {
    cache.put(key, e, static_cast<std::int64_t>(e->nbytes()));
  }

  // options.adopt_device_rows behind a fence: its errors, exceptions, a null
  // result or one whose shape or byte count differs from `rows` become the
  // item's status (kInternal, or the hook's own status).
  StatusOr<EmbeddingPtr> Adopt(const DeviceRows& rows) {
    StatusOr<EmbeddingPtr> adopted = EmbeddingPtr();
    try {
      adopted = options.adopt_device_rows(rows);
    } catch (const std::exception& ex) {
      return Internal(std::string("adopt_device_rows threw: ") + ex.what());
    } catch (...) {
      return Internal("adopt_device_rows threw a non-standard exception");
    }
    if (!adopted.ok()) return adopted;
    if (*adopted == nullptr) return Internal("adopt_device_rows returned no embedding");
    const Embedding& got = **adopted;
    if (got.tokens != rows.tokens || got.hidden != rows.hidden || got.deepstack_layers != rows.deepstack_layers ||
        got.dtype != rows.dtype || got.nbytes() != got.ExpectedBytes()) {
      return Internal("adopt_device_rows returned an embedding of " + std::to_string(got.tokens) + " tokens x " +
                      std::to_string(got.hidden) + " x (1 + " + std::to_string(got.deepstack_layers) + ") " +
                      std::string(DTypeName(got.dtype)) + " (" + std::to_string(got.nbytes()) +
                      " bytes) for rows of " + std::to_string(rows.tokens) + " x " + std::to_string(rows.hidden) +
                      " x (1 + " + std::to_string(rows.deepstack_layers) + ") " + std::string(DTypeName(rows.dtype)));
    }
    return adopted;
  }

  Status Submit(EncodeRequest request, RequestCallbacks callbacks, std::vector<StatusOr<ContentKey>> keys);
  bool StartBatch(std::function<void()> on_finished);
  std::int64_t FinishBatch();
  void TowerLoop();
  void RunBatch(Batch& b);
};

EncodeWorker::EncodeWorker(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
EncodeWorker::~EncodeWorker() = default;

StatusOr<std::unique_ptr<EncodeWorker>> EncodeWorker::Create(WorkerOptions options,
                                                            std::unique_ptr<VisionTower> tower) {
  if (tower == nullptr) return InvalidArgument("tower is null");
  if (options.model_id.empty()) return InvalidArgument("model_id is empty");
  if (Status s = options.preprocess.Validate(); !s.ok()) return InvalidArgument("preprocess: " + s.message());
  if (options.limits.max_pixels <= 0) {
    return InvalidArgument("limits.max_pixels must be > 0, got " + std::to_string(options.limits.max_pixels));
  }
  if (options.l1_bytes < 0) return InvalidArgument("l1_bytes must be >= 0, got " + std::to_string(options.l1_bytes));
  if (options.l2_bytes < 0) return InvalidArgument("l2_bytes must be >= 0, got " + std::to_string(options.l2_bytes));
  if (options.max_tokens_per_batch <= 0) {
    return InvalidArgument("max_tokens_per_batch must be > 0, got " + std::to_string(options.max_tokens_per_batch));
  }
  if (options.max_items_per_batch <= 0) {
    return InvalidArgument("max_items_per_batch must be > 0, got " + std::to_string(options.max_items_per_batch));
  }
  if (options.max_pending_items < 0) {
    return InvalidArgument("max_pending_items must be >= 0, got " + std::to_string(options.max_pending_items));
  }
  if (options.decode_threads < 0) {
    return InvalidArgument("decode_threads must be >= 0, got " + std::to_string(options.decode_threads));
  }
  if (options.decode_lookahead < 0) {
    return InvalidArgument("decode_lookahead must be >= 0, got " + std::to_string(options.decode_lookahead));
  }
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
    // VRAM in use could reach l1_bytes + l2_bytes.
    return InvalidArgument("tower '" + tower->Describe() + "' leaves its output in device memory, but " +
                           (!options.adopt_device_rows ? "adopt_device_rows"
                            : !options.to_host        ? "to_host"
                                                      : "to_device") +
                           " is not set (take all three hooks from the GPU tier: MakeEmbeddingTierHooks)");
  }
  return std::unique_ptr<EncodeWorker>(
      new EncodeWorker(std::make_unique<Impl>(std::move(options), std::move(tower))));
}

std::vector<StatusOr<ContentKey>> EncodeWorker::ItemKeys(const EncodeRequest& request) const {
  return KeysFor(impl_->options, request);
}

Status EncodeWorker::Submit(EncodeRequest request, RequestCallbacks callbacks,
                            std::vector<StatusOr<ContentKey>> keys) {
  return impl_->Submit(std::move(request), std::move(callbacks), std::move(keys));
}

Status EncodeWorker::Impl::Submit(EncodeRequest request, RequestCallbacks callbacks,
                                  std::vector<StatusOr<ContentKey>> keys) {
  const Clock::time_point arrived = Clock::now();
  auto reject = [&](Status s) {
    ++stats.rejected_requests;
    return s;
  };
  if (request.id.empty()) return reject(InvalidArgument("request id is empty"));
  if (request_ids.count(request.id) != 0) {
    return reject(AlreadyExists("request '" + request.id + "' is already in flight"));
  }
  const std::size_t n = request.items.size();
  if (keys.empty() && n != 0) {
    keys = KeysFor(options, request);
  } else if (keys.size() != n) {
    return reject(InvalidArgument("request '" + request.id + "' has " + std::to_string(n) + " items but " +
                                  std::to_string(keys.size()) + " keys"));
  }

  // Queue limit, checked before anything changes: an upper bound on the jobs
  // this request would add (keys neither cached nor already in flight).
  if (options.max_pending_items > 0) {
    std::int64_t new_jobs = 0;
    std::vector<ContentKey> counted;
    for (const StatusOr<ContentKey>& k : keys) {
      if (!k.ok() || cache.contains(*k)) continue;
      if (options.dedup_in_flight) {
        if (job_by_key.count(*k) != 0 || std::find(counted.begin(), counted.end(), *k) != counted.end()) continue;
        counted.push_back(*k);
      }
      ++new_jobs;
    }
    // More misses than the whole queue holds can never be admitted, however
    // long the caller waits: that is the request's fault, not the load's.
    if (new_jobs > options.max_pending_items) {
      return reject(InvalidArgument("request '" + request.id + "' has " + std::to_string(new_jobs) +
                                    " items to queue for the tower (neither cached nor in flight), more than the "
                                    "queue holds at once (max_pending_items " +
                                    std::to_string(options.max_pending_items) +
                                    "); split it into requests of at most that many new images"));
    }
    const std::int64_t pending = static_cast<std::int64_t>(scheduler.pending_size());
    if (pending + new_jobs > options.max_pending_items) {
      return reject(ResourceExhausted("request '" + request.id + "' would queue " + std::to_string(new_jobs) +
                                      " items on top of " + std::to_string(pending) + " pending; the limit is " +
                                      std::to_string(options.max_pending_items)));
    }
  }

  const std::uint64_t rid = next_request++;
  char seq[24];
  std::snprintf(seq, sizeof(seq), "%020llu", static_cast<unsigned long long>(rid));
  const std::string sched_id = request.id + '\0' + seq;
  request_ids.emplace(request.id, rid);
  Request& r = requests[rid];
  r.id = request.id;
  r.callbacks = std::move(callbacks);
  r.results.resize(n);
  r.job.assign(n, 0);
  r.delivered.assign(n, false);
  r.remaining = static_cast<std::int64_t>(n);
  ++stats.requests;
  stats.items += n;

  std::vector<Delivery> ready;
  for (std::size_t i = 0; i < n; ++i) {
    EncodeItemInput& item = request.items[i];
    ItemResult res;
    res.index = static_cast<std::int64_t>(i);
    if (!keys[i].ok()) {
      ++stats.misses;
      res.status = keys[i].status();
      CountError(res.status.code());
      res.total_ms = Ms(Clock::now() - arrived);
      ready.push_back({rid, std::move(res)});
      continue;
    }
    const ContentKey key = *keys[i];
    res.key = key;

    if (options.dedup_in_flight) {
      if (auto j = job_by_key.find(key); j != job_by_key.end()) {
        ++stats.joins;
        jobs.at(j->second).waiters.push_back({rid, res.index, arrived});
        r.job[i] = j->second;
        r.results[i] = std::move(res);
        r.results[i].source = ItemSource::kJoined;
        continue;
      }
    }

    CacheTier tier = CacheTier::kMiss;
    std::optional<EmbeddingPtr> hit = CacheGet(key, &tier);
    if (hit.has_value()) {
      if (ShapeMatches(**hit, item)) {
        tier == CacheTier::kL1 ? ++stats.hits_l1 : ++stats.hits_l2;
        res.source = tier == CacheTier::kL1 ? ItemSource::kL1 : ItemSource::kL2;
        res.embedding = std::move(*hit);
        res.total_ms = Ms(Clock::now() - arrived);
        ready.push_back({rid, std::move(res)});
        continue;
      }
      ++stats.shape_mismatches;
    }

    ++stats.misses;
    res.source = ItemSource::kMiss;
    // Queued with the header's token count; decoded ahead of its batch by
    // the prefetch decoder, so bad pixel data surfaces in Step.
    StatusOr<GridTHW> grid = HeaderGrid(item.media);
    if (!grid.ok()) {
      res.status = Status(grid.status().code(), "item " + std::to_string(i) + ": " + grid.status().message());
      CountError(res.status.code());
      res.total_ms = Ms(Clock::now() - arrived);
      ready.push_back({rid, std::move(res)});
      continue;
    }
    const std::uint64_t job_id = next_job++;
    Job& job = jobs[job_id];
    job.key = key;
    job.sched_key = {sched_id, res.index};
    job.waiters.push_back({rid, res.index, arrived});
    job.decode = decoder.Enqueue(std::move(item.media));
    scheduler.add({job.sched_key.first, job.sched_key.second, grid->tokens(options.preprocess.merge_size)});
    job_by_sched.emplace(job.sched_key, job_id);
    if (options.dedup_in_flight) job_by_key[key] = job_id;
    r.job[i] = job_id;
    r.results[i] = std::move(res);
  }

  if (n == 0) {
    Complete(requests.find(rid), Status::Ok());
    return Status::Ok();
  }
  Fire(ready);
  return Status::Ok();
}

std::int64_t EncodeWorker::Step() {
  if (impl_->outstanding.empty() && !impl_->StartBatch(nullptr)) return 0;
  return impl_->FinishBatch();
}

bool EncodeWorker::StartBatch(std::function<void()> on_finished) { return impl_->StartBatch(std::move(on_finished)); }
std::int64_t EncodeWorker::FinishBatch() { return impl_->FinishBatch(); }
std::int64_t EncodeWorker::OutstandingBatches() const { return static_cast<std::int64_t>(impl_->outstanding.size()); }
bool EncodeWorker::TowerBusy() const { return impl_->TowerBusy(); }
bool EncodeWorker::BatchFinished() const { return impl_->finished.load(std::memory_order_acquire) > 0; }

bool EncodeWorker::Impl::StartBatch(std::function<void()> on_finished) {
  if (TowerBusy() || outstanding.size() >= 2 || scheduler.pending_size() == 0) return false;
  if (options.sink_full && options.sink_full()) {
    ++stats.sink_full_stalls;
    return false;
  }
  auto b = std::make_unique<Batch>();
  for (const PendingEncodeItem& p : scheduler.next_batch()) {
    auto it = job_by_sched.find(p.key());
    const std::uint64_t id = it->second;
    job_by_sched.erase(it);
    Job& job = jobs.at(id);
    job.running = true;
    b->entries.push_back({id, std::move(job.decode), Status::Ok(), {}});
  }
  b->on_finished = std::move(on_finished);
  {
    std::lock_guard<std::mutex> lock(tower_mu);
    tower_queue.push_back(b.get());
  }
  outstanding.push_back(std::move(b));
  tower_cv.notify_all();
  return true;
}

void EncodeWorker::Impl::TowerLoop() {
  std::unique_lock<std::mutex> lock(tower_mu);
  for (;;) {
    tower_cv.wait(lock, [&] { return tower_stop || !tower_queue.empty(); });
    if (tower_queue.empty()) return;  // stopping, nothing left to run
    Batch* b = tower_queue.front();
    tower_queue.pop_front();
    lock.unlock();
    RunBatch(*b);
    {
      // Notify before `done`: once it is set the owner may collect the batch
      // and whatever the callback points to may go away.
      std::function<void()> notify = std::move(b->on_finished);
      finished.fetch_add(1, std::memory_order_release);
      if (notify) notify();
    }
    lock.lock();
    b->done = true;
    tower_cv.notify_all();
  }
}

// On the tower thread: decode what the helpers have not, then one Encode.
void EncodeWorker::Impl::RunBatch(Batch& b) {
  std::vector<TowerItem> items;
  items.reserve(b.entries.size());
  for (BatchEntry& e : b.entries) {
    StatusOr<PreprocessedImage> pre = decoder.Take(e.decode);
    e.decode = nullptr;
    if (!pre.ok()) {
      e.decode_status = pre.status();
      continue;
    }
    e.image = std::move(*pre);
    // patch_dim was checked against the tower once, in Create().
    TowerItem item;
    item.patches = e.image.patches.data();
    item.grid = e.image.grid;
    items.push_back(item);
    b.tokens += e.image.tokens();
  }
  b.decoded = static_cast<std::int64_t>(items.size());
  b.start = Clock::now();
  if (!items.empty()) {
    try {
      b.out = tower->Encode(items);
    } catch (const std::exception& e) {
      b.out = Internal(std::string("vision tower threw: ") + e.what());
    } catch (...) {
      b.out = Internal("vision tower threw a non-standard exception");
    }
  }
  b.tower_ms = Ms(Clock::now() - b.start);
}

std::int64_t EncodeWorker::Impl::FinishBatch() {
  if (outstanding.empty()) return 0;
  std::unique_ptr<Batch> b = std::move(outstanding.front());
  outstanding.pop_front();
  {
    std::unique_lock<std::mutex> lock(tower_mu);
    tower_cv.wait(lock, [&] { return b->done; });
  }
  finished.fetch_sub(1, std::memory_order_relaxed);

  // `failure` fails every decoded item: the tower's error or a malformed output.
  Status failure;
  if (b->decoded > 0) {
    failure = CheckOutput(b->out, b->decoded, b->tokens);
    ++stats.tower_batches;
    stats.tower_items += static_cast<std::uint64_t>(b->decoded);
    stats.tower_tokens += static_cast<std::uint64_t>(b->tokens);
    stats.tower_seconds += b->tower_ms / 1e3;
    if (!failure.ok()) ++stats.tower_failures;
  }

  std::vector<Delivery> ready;
  std::size_t main_off = 0, deep_off = 0;
  for (BatchEntry& e : b->entries) {
    Job& job = jobs.at(e.job);
    EmbeddingPtr embedding;
    Status status = failure;
    if (!e.decode_status.ok()) {
      status = e.decode_status;
    } else if (failure.ok()) {
      // This item's rows of the batch output: [main_off, +main_bytes) and
      // [deep_off, +deep_bytes), wherever the output lives.
      const TowerOutput& o = *b->out;
      const std::int64_t tokens = e.image.tokens();
      const std::size_t main_bytes = static_cast<std::size_t>(tokens * o.hidden) * DTypeSize(o.dtype);
      const std::size_t deep_bytes = main_bytes * static_cast<std::size_t>(o.deepstack_layers);
      if (o.on_device()) {
        // The GPU tier copies them device -> device into an L1 entry; the
        // batch output stays alive until that copy lands.
        DeviceRows rows;
        rows.tokens = tokens;
        rows.hidden = o.hidden;
        rows.deepstack_layers = o.deepstack_layers;
        rows.dtype = o.dtype;
        rows.main = o.device_main + main_off;
        rows.deepstack = o.device_deepstack == nullptr ? nullptr : o.device_deepstack + deep_off;
        rows.owner = o.device_owner;
        StatusOr<EmbeddingPtr> adopted = Adopt(rows);
        if (adopted.ok()) {
          embedding = std::move(*adopted);
        } else {
          status = adopted.status();
        }
      } else {
        auto m = std::make_shared<Embedding>();
        m->tokens = tokens;
        m->hidden = o.hidden;
        m->deepstack_layers = o.deepstack_layers;
        m->dtype = o.dtype;
        m->main.assign(o.main.begin() + main_off, o.main.begin() + main_off + main_bytes);
        m->deepstack.assign(o.deepstack.begin() + deep_off, o.deepstack.begin() + deep_off + deep_bytes);
        embedding = std::move(m);
      }
      main_off += main_bytes;
      deep_off += deep_bytes;
      if (embedding != nullptr) CachePut(job.key, embedding);
    }
    const Clock::time_point now = Clock::now();
    for (const Waiter& w : job.waiters) {
      ItemResult res;
      res.index = w.index;
      res.key = job.key;
      res.source = requests.at(w.request).results[w.index].source;
      res.queue_ms = std::max(0.0, Ms(b->start - w.arrived));
      res.tower_ms = b->tower_ms;
      res.total_ms = Ms(now - w.arrived);
      if (embedding != nullptr) {
        res.embedding = embedding;
      } else {
        // A decode error names the item, like the header errors of Submit.
        res.status = e.decode_status.ok()
                         ? status
                         : Status(status.code(), "item " + std::to_string(w.index) + ": " + status.message());
        CountError(res.status.code());
      }
      ready.push_back({w.request, std::move(res)});
    }
    EraseJob(e.job);
  }
  Fire(ready);
  return static_cast<std::int64_t>(b->entries.size());
}

bool EncodeWorker::HasQueuedWork() const { return impl_->scheduler.pending_size() != 0; }

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
  s.l1_bytes = m.cache.l1().current_bytes();
  s.l2_bytes = m.cache.l2().current_bytes();
  s.l1_entries = static_cast<std::int64_t>(m.cache.l1().size());
  s.l2_entries = static_cast<std::int64_t>(m.cache.l2().size());
  return s;
}

const WorkerOptions& EncodeWorker::options() const { return impl_->options; }
const VisionTower& EncodeWorker::tower() const { return *impl_->tower; }

}  // namespace epd
