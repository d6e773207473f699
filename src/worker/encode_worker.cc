// EncodeWorker: the coordinator over the worker's parts.
//
// Parts (each header states its invariants):
//   item_rules.h      keys, header probe, expected tokens, queue bound, fair cost
//   worker_cache.h    L1/L2 placement, device-hook fences, L3 adoption, the hit check
//   adopt_check.h     what an adopted value must match
//   job_table.h       requests, jobs, waiters; delivery of results
//   job_queue.h       jobs not yet in a batch: the scheduler, the prefetch, the gate
//   video_serving.h   video items: lookup, decode off this thread, chunks, assembly
//   tower_runner.h    the tower thread; batch_output.h cuts its output per item
// This file keeps Create, Submit, serving one image item, batch start and
// finish, and the stats.
//
// A job is one tower computation: created by an item that misses (an image,
// a video's chunk or a whole video), held or queued in the JobQueue, running
// in a Batch the TowerRunner holds from StartBatch until FinishBatch caches
// its result, delivers it to every waiter and erases it.
//
// Threads. The owning thread does everything except: the PrefetchDecoder's
// helpers decode queued misses in the order the scheduler will serve them;
// the video decode threads decode containers (their completions are handled
// here, in Poll/StartBatch/Step); the tower thread runs each started batch.
// Batch formation sees only the calls and header costs, and the gate keeps it
// independent of video decode timing (job_queue.h).
//
// Delivery. Callbacks never run while the state is half-updated: every
// public call first brings each part to its new state, posting results to
// the JobTable, and fires them last.
#include "epd/worker/encode_worker.h"

#include <cmath>
#include <optional>
#include <utility>

#include "adopted_value.h"
#include "batch_output.h"
#include "item_rules.h"
#include "job_queue.h"
#include "job_table.h"
#include "prefetch_decoder.h"
#include "tower_runner.h"
#include "video_serving.h"
#include "worker_cache.h"

namespace epd {

using internal::Clock;
using internal::JobId;
using internal::RequestNum;

namespace {

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

}  // namespace

struct EncodeWorker::Impl {
  Impl(WorkerOptions opt, std::unique_ptr<VisionTower> t)
      : options(std::move(opt)),
        tower(std::move(t)),
        cache(options, *tower, stats),
        table(stats, options.dedup_in_flight),
        decoder(options.preprocess, options.limits, options.decode_threads,
                options.decode_lookahead > 0 ? options.decode_lookahead : 2 * options.max_items_per_batch,
                /*fair=*/options.order == ScheduleOrder::kFair),
        queue(options, decoder),
        videos({options, *tower, stats, cache, table, queue}),
        runner(*tower, decoder) {}

  WorkerOptions options;
  std::unique_ptr<VisionTower> tower;
  WorkerStats stats;
  internal::WorkerCache cache;
  internal::JobTable table;
  internal::PrefetchDecoder decoder;
  internal::JobQueue queue;
  internal::VideoServing videos;
  // Last: its destructor waits for started batches' tower calls, which use
  // the tower and the decoder above.
  internal::TowerRunner runner;

  // `adopted`: empty, or one entry per item (LoopSubmit).
  Status Submit(EncodeRequest request, RequestCallbacks callbacks, std::vector<StatusOr<ContentKey>> keys,
                std::vector<internal::AdoptedValue> adopted);
  // Submit's request-level refusals, checked before anything changes; fills
  // `keys` when the caller left it empty.
  Status Admit(const EncodeRequest& request, std::vector<StatusOr<ContentKey>>& keys) const;
  // Serves image item res.index (res.key set) of request `r`: joins a job,
  // takes a hit (L1/L2, or L3 via `adopted`, null when none), or creates a
  // job. True when the item now waits on a job (res held in the table);
  // false when `res` is ready to post.
  bool ServeImage(RequestNum r, EncodeItemInput& item, internal::AdoptedValue* adopted, Clock::time_point arrived,
                  ItemResult& res);
  // Handles completed video decodes: expansions, then the held jobs.
  std::int64_t Poll();
  bool StartBatch(std::function<void()> on_finished);
  std::int64_t FinishBatch();
  void Abort(RequestNum r, const Status& status);
  bool Known(const ContentKey& key) const { return cache.Contains(key) || table.InFlight(key).has_value(); }
};

EncodeWorker::EncodeWorker(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
EncodeWorker::~EncodeWorker() = default;

StatusOr<std::unique_ptr<EncodeWorker>> EncodeWorker::Create(WorkerOptions options,
                                                             std::unique_ptr<VisionTower> tower) {
  if (tower == nullptr) return InvalidArgument("tower is null");
  if (Status s = options.ValidateFor(*tower); !s.ok()) return s;
  return std::unique_ptr<EncodeWorker>(new EncodeWorker(std::make_unique<Impl>(std::move(options), std::move(tower))));
}

std::vector<StatusOr<ContentKey>> EncodeWorker::ItemKeys(const EncodeRequest& request) const {
  return internal::KeysFor(impl_->options, request);
}

Status EncodeWorker::Submit(EncodeRequest request, RequestCallbacks callbacks, std::vector<StatusOr<ContentKey>> keys) {
  return impl_->Submit(std::move(request), std::move(callbacks), std::move(keys), {});
}

Status EncodeWorker::SubmitAdopting(EncodeRequest request, RequestCallbacks callbacks,
                                    std::vector<StatusOr<ContentKey>> keys,
                                    std::vector<internal::AdoptedValue> adopted) {
  return impl_->Submit(std::move(request), std::move(callbacks), std::move(keys), std::move(adopted));
}

Status EncodeWorker::Impl::Submit(EncodeRequest request, RequestCallbacks callbacks,
                                  std::vector<StatusOr<ContentKey>> keys, std::vector<internal::AdoptedValue> adopted) {
  const Clock::time_point arrived = Clock::now();
  if (Status s = Admit(request, keys); !s.ok()) {
    ++stats.rejected_requests;
    return s;
  }
  if (!adopted.empty() && adopted.size() != request.items.size()) {
    return InvalidArgument("request '" + request.id + "' has " + std::to_string(request.items.size()) + " items but " +
                           std::to_string(adopted.size()) + " adopted values");
  }
  const std::size_t n = request.items.size();
  const RequestNum r = table.Open(request.id, std::move(request.tenant), std::move(callbacks), n);
  ++stats.requests;
  stats.items += n;
  for (std::size_t i = 0; i < n; ++i) {
    ItemResult res;
    res.index = static_cast<std::int64_t>(i);
    EncodeItemInput& item = request.items[i];
    if (keys[i].ok()) {
      res.key = *keys[i];
      const bool waits = item.is_video()
                             ? videos.Serve(r, item, internal::ItemNamespace(request.key_namespace, item), arrived, res)
                             : ServeImage(r, item, adopted.empty() ? nullptr : &adopted[i], arrived, res);
      if (waits) continue;
    } else {
      ++stats.misses;
      res.status = keys[i].status();
    }
    res.total_ms = Ms(Clock::now() - arrived);
    table.Post(r, std::move(res));
  }
  table.CompleteIfEmpty(r);
  table.Fire();
  return Status::Ok();
}

Status EncodeWorker::Impl::Admit(const EncodeRequest& request, std::vector<StatusOr<ContentKey>>& keys) const {
  if (request.id.empty()) return InvalidArgument("request id is empty");
  if (table.Find(request.id).has_value()) return internal::AlreadyInFlight(request.id);
  const std::size_t n = request.items.size();
  if (keys.empty() && n != 0) {
    keys = internal::KeysFor(options, request);
  } else if (keys.size() != n) {
    return InvalidArgument("request '" + request.id + "' has " + std::to_string(n) + " items but " +
                           std::to_string(keys.size()) + " keys");
  }
  if (Status s = internal::CheckRequestQueueBound(
          request.id, keys, options.dedup_in_flight, [this](const ContentKey& k) { return Known(k); }, queue.load(),
          options.max_pending_items);
      !s.ok()) {
    return s;
  }
  return videos.CheckDecodeCap(request, keys);
}

bool EncodeWorker::Impl::ServeImage(RequestNum r, EncodeItemInput& item, internal::AdoptedValue* adopted,
                                    Clock::time_point arrived, ItemResult& res) {
  const std::int64_t merge = options.preprocess.merge_size;
  internal::HeaderProbe header(item.media, options);
  if (Status s = internal::CheckImageExpectedTokens(item, header, merge); !s.ok()) {
    ++stats.misses;
    res.status = std::move(s);
    return false;
  }
  if (options.dedup_in_flight && table.Join(r, res, arrived)) return true;
  const std::int64_t want = internal::ImageTokens(item, header, merge);
  if (cache.ServeHit(res.key, want, res)) return false;
  // A shared-tier value is adopted only when L1/L2 hold nothing for the key
  // (a cached value of another shape is re-encoded).
  if (adopted != nullptr && adopted->value != nullptr && !cache.Contains(res.key)) {
    internal::AdoptExpectation expect{want, std::nullopt};
    if (!item.media.empty() && header.Get().ok()) expect.grid = header.Get()->grid;
    const EntryCost cost = cache.CostFor(adopted->seconds, table.tenant(r));
    if (std::optional<EmbeddingPtr> l3 = cache.Adopt(res.key, std::move(adopted->value), expect, cost)) {
      res.source = ItemSource::kL3;
      res.embedding = std::move(*l3);
      // The cost measured where the tower ran it, as the shared tier stored it.
      if (std::isfinite(cost.seconds) && cost.seconds >= 0) res.encode_seconds = cost.seconds;
      return false;
    }
  }
  ++stats.misses;
  res.source = ItemSource::kMiss;
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
  // Queued with the header's token count; decoded ahead of its batch by the
  // prefetch decoder, so bad pixel data surfaces in Step.
  const std::int64_t tokens = probed->grid.tokens(merge);
  const std::int64_t share =
      options.order == ScheduleOrder::kFair ? internal::FairShareCost(probed->info, tokens, options.preprocess) : 0;
  const JobId id = table.NewJob(res.key);
  table.Wait(id, {r, res.index, arrived});
  queue.Add({id, tokens, share, table.tenant(r), {table.id(r), r, res.index, 0}, std::move(item.media), {}});
  table.Hold(r, std::move(res));
  return true;
}

std::int64_t EncodeWorker::Impl::Poll() {
  const std::int64_t n = videos.TakeCompletions();
  if (n > 0) {
    queue.Flush();
    table.Fire();
  }
  return n;
}

std::int64_t EncodeWorker::Step() {
  Impl& m = *impl_;
  while (m.runner.Outstanding() == 0) {
    m.Poll();
    // A pending video decode gates the next batch: wait for it here.
    while (m.queue.Gated()) {
      m.videos.AwaitCompletion();
      m.Poll();
    }
    const std::int64_t barriers = m.queue.barriers();
    if (m.StartBatch(nullptr)) break;
    // kFair: a video expanded at the head without a job (all its chunks
    // cached, or it failed) lets the next try find a batch.
    if (m.queue.barriers() == barriers) return 0;
  }
  return m.FinishBatch();
}

bool EncodeWorker::StartBatch(std::function<void()> on_finished) { return impl_->StartBatch(std::move(on_finished)); }
std::int64_t EncodeWorker::FinishBatch() { return impl_->FinishBatch(); }
std::int64_t EncodeWorker::OutstandingBatches() const { return impl_->runner.Outstanding(); }
bool EncodeWorker::TowerBusy() const { return impl_->runner.Busy(); }
bool EncodeWorker::BatchFinished() const { return impl_->runner.Finished(); }

bool EncodeWorker::Impl::StartBatch(std::function<void()> on_finished) {
  Poll();
  if (runner.Busy() || runner.Outstanding() >= 2 || !queue.Schedulable()) return false;
  if (options.sink_full && options.sink_full()) {
    ++stats.sink_full_stalls;
    return false;
  }
  // kFair: NextBatch first expands the videos whose slot heads the order;
  // what that decides without the tower (a failed or all-cached video) is
  // delivered here.
  std::vector<internal::BatchEntry> entries = queue.NextBatch();
  if (entries.empty()) {
    table.Fire();
    return false;
  }
  auto b = std::make_unique<internal::Batch>();
  for (internal::BatchEntry& e : entries) table.job(e.job).running = true;
  b->entries = std::move(entries);
  b->on_finished = std::move(on_finished);
  runner.Start(std::move(b));
  table.Fire();
  return true;
}

std::int64_t EncodeWorker::Impl::FinishBatch() {
  std::unique_ptr<internal::Batch> b = runner.Collect();
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
  std::optional<internal::BatchOutputReader> output;
  if (failure.ok() && b->decoded > 0) output.emplace(*b->out, options.adopt_device_rows);
  for (internal::BatchEntry& e : b->entries) {
    internal::JobTable::Job& job = table.job(e.job);
    EmbeddingPtr embedding;
    Status status = e.decode_status.ok() ? failure : e.decode_status;
    internal::JobTable::BatchTiming timing{b->start, b->tower_ms};
    if (e.decode_status.ok() && failure.ok()) {
      StatusOr<EmbeddingPtr> rows = output->Next(e.image.grid, e.image.tokens());
      if (rows.ok()) {
        embedding = std::move(*rows);
        timing.entry_seconds = internal::EntrySeconds(*b, e, job.prior_seconds);
        cache.PutEncoded(job.key, embedding, cache.CostFor(timing.entry_seconds, job.tenant));
        if (job.video_timing != nullptr) videos.Cached(job.key, job.video_timing);
      } else {
        status = rows.status();
      }
    }
    table.DeliverJob(e.job, timing, embedding, status);
    table.EraseJob(e.job);
  }
  table.Fire();
  return static_cast<std::int64_t>(b->entries.size());
}

bool EncodeWorker::HasQueuedWork() const {
  const internal::JobQueue& q = impl_->queue;
  return q.queued() + q.held() + q.barriers() > 0;
}

bool EncodeWorker::HasLocal(const ContentKey& key) const { return impl_->Known(key); }

std::vector<EncodeWorker::RefusedValue> EncodeWorker::TakeRefused() {
  std::vector<RefusedValue> out;
  for (internal::WorkerCache::Refused& r : impl_->cache.TakeRefused()) out.push_back({r.key, std::move(r.why)});
  return out;
}

void EncodeWorker::SetWake(std::function<void()> wake) { impl_->videos.SetWake(std::move(wake)); }
bool EncodeWorker::DecodeFinished() const { return impl_->videos.CompletionReady(); }
std::int64_t EncodeWorker::Poll() { return impl_->Poll(); }
bool EncodeWorker::WaitingOnDecode() const { return impl_->queue.Gated(); }
std::int64_t EncodeWorker::DecodesPending() const { return impl_->videos.decodes_running(); }

void EncodeWorker::Impl::Abort(RequestNum r, const Status& status) {
  table.Abort(r, status, [this](JobId j) { queue.Remove(j); });
  queue.Flush();  // an abandoned video's barrier lets what it held go on
  table.Fire();
}

bool EncodeWorker::Cancel(const std::string& id) {
  std::optional<RequestNum> r = impl_->table.Find(id);
  if (!r.has_value()) return false;
  impl_->Abort(*r, Cancelled("request '" + id + "' was cancelled"));
  return true;
}

std::int64_t EncodeWorker::FailAll(const Status& status) {
  // Oldest first, so the order of on_done calls is deterministic.
  const std::vector<RequestNum> open = impl_->table.OpenRequests();
  for (const RequestNum r : open) impl_->Abort(r, status);
  return static_cast<std::int64_t>(open.size());
}

WorkerStats EncodeWorker::stats() const {
  const Impl& m = *impl_;
  WorkerStats s = m.stats;
  s.in_flight_requests = static_cast<std::int64_t>(m.table.open_requests());
  s.pending_items = m.queue.queued() + m.queue.held();
  s.pending_tokens = m.queue.pending_tokens();
  m.cache.Report(s);
  return s;
}

const WorkerOptions& EncodeWorker::options() const { return impl_->options; }
const VisionTower& EncodeWorker::tower() const { return *impl_->tower; }

}  // namespace epd
