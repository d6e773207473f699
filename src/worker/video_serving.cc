// VideoServing (video_serving.h).
//
// State. A Decode is one container decode, shared by the identical videos
// waiting on it (`users`); it lives in pending_ (dedup) until no item needs
// it, and in in_flight_ until its completion is taken. An Item is one video
// item of one request: the JobQueue holds it as a barrier until it is
// expanded or abandoned, the JobTable as the item's sink until delivered.
// Invariants between calls: an Item not yet expanded or abandoned holds its
// Decode and counts in its `users`; a Decode with no user and not done has
// been told to stop.
#include "video_serving.h"

#include <algorithm>
#include <optional>
#include <stop_token>
#include <utility>

#include "item_rules.h"

namespace epd::internal {

struct VideoServing::Decode {
  ContentKey key;
  std::string tenant;                    // who started it: its decodes_by_tenant_ count
  VideoInput input;                      // shares the request's buffers
  std::optional<KeyNamespace> chunk_ns;  // its chunk keys' namespace
  std::stop_source stop;
  // Set on the decode thread under mu_ before the Decode enters done_; read
  // by the owner only after TakeCompletions took it.
  std::optional<StatusOr<PreparedVideo>> result;
  bool done = false;  // owner: taken by TakeCompletions
  int users = 0;      // owner: items not yet expanded or abandoned
};

class VideoServing::Item final : public ItemSink, public GateBarrier {
 public:
  Item(VideoServing& owner, std::shared_ptr<Decode> decode, RequestNum request, std::int64_t index,
       Clock::time_point arrived, std::int64_t expected_tokens, const ContentKey& key)
      : owner(owner),
        decode(std::move(decode)),
        request(request),
        index(index),
        arrived(arrived),
        expected_tokens(expected_tokens),
        key(key) {}

  bool Resolved() const override { return abandoned || decode->done; }
  bool Abandoned() const override { return abandoned; }
  void Expand() override { owner.Expand(*this); }
  void Abandon() override {
    if (abandoned || expanded) return;
    abandoned = true;
    owner.Release(*decode);
  }
  std::optional<ItemResult> Take(std::int64_t part, ItemResult r) override {
    if (r.status.ok()) {
      chunks[static_cast<std::size_t>(part)] = std::move(r.embedding);
    } else if (failure.ok()) {
      failure = Status(r.status.code(), "temporal chunk " + std::to_string(part) + ": " + r.status.message());
    }
    queue_ms = std::max(queue_ms, r.queue_ms);
    tower_ms = std::max(tower_ms, r.tower_ms);
    if (--remaining > 0) return std::nullopt;
    return owner.Assemble(*this);
  }

  VideoServing& owner;
  std::shared_ptr<Decode> decode;  // until expanded
  const RequestNum request;
  const std::int64_t index;
  const Clock::time_point arrived;
  const std::int64_t expected_tokens;
  const ContentKey key;  // the whole-video key
  bool abandoned = false;
  bool expanded = false;
  // The assembly, once expanded into chunks.
  GridTHW grid;
  std::shared_ptr<const VideoTiming> timing;
  std::vector<EmbeddingPtr> chunks;    // by temporal index; null until in
  std::vector<ContentKey> chunk_keys;  // by temporal index (the assembly's cost)
  std::int64_t remaining = 0;          // chunk results still to come
  Status failure;                      // the first chunk's failure
  double queue_ms = 0;                 // the slowest chunk's
  double tower_ms = 0;
};

VideoServing::VideoServing(Parts parts)
    : p_(parts),
      chunked_(parts.options.video_chunk_cache && parts.tower.temporal_chunks_independent()),
      timings_(parts.options.max_video_timings),
      pool_(parts.options.decode_threads) {}

VideoServing::~VideoServing() {
  MutexLock lock(mu_);
  wake_ = nullptr;
  for (const std::shared_ptr<Decode>& d : in_flight_) d->stop.request_stop();
  // pool_ is destroyed first of the members: it waits for the decodes.
}

bool VideoServing::Serve(RequestNum r, EncodeItemInput& item, std::optional<KeyNamespace> chunk_ns,
                         Clock::time_point arrived, ItemResult& res) {
  ++p_.stats.video_items;
  Status refused = CheckExpectedTokensSign(item.expected_tokens);
  // An exact repeat: one lookup, no decode.
  if (std::shared_ptr<const VideoTiming> t = timings_.Find(res.key);
      refused.ok() && t != nullptr && p_.cache.ServeHit(res.key, item.expected_tokens, res)) {
    res.video = std::move(t);
    return false;
  }
  if (refused.ok()) refused = CheckBeforeDecode(p_.options, *item.video);
  if (!refused.ok()) {
    ++p_.stats.misses;
    res.status = std::move(refused);
    return false;
  }
  // The same video, queued or running whole.
  if (!chunked_ && p_.options.dedup_in_flight && p_.table.Join(r, res, arrived)) return true;
  std::shared_ptr<Decode> d;
  if (auto p = pending_.find(res.key); p != pending_.end()) d = p->second;
  if (d != nullptr && !chunked_) {
    ++p_.stats.joins;  // it will join the whole video's job
    res.source = ItemSource::kJoined;
  } else {
    ++p_.stats.misses;
    res.source = ItemSource::kMiss;
  }
  if (d == nullptr) d = StartDecode(res.key, *item.video, std::move(chunk_ns), p_.table.tenant(r));
  ++d->users;
  const std::int64_t index = res.index;
  auto v = std::make_shared<Item>(*this, d, r, index, arrived, item.expected_tokens, res.key);
  p_.table.SetSink(r, index, v);
  p_.table.Hold(r, std::move(res));
  p_.queue.AddBarrier(std::move(v), p_.table.tenant(r), {p_.table.id(r), r, index, 0});
  // A decode already completed (shared with an identical video not expanded
  // yet) resolves the barrier at once; normally an unresolved one ahead of
  // it passes it later, but nothing must wait on a completion already taken.
  if (d->done) p_.queue.Flush();
  return true;
}

Status VideoServing::CheckDecodeCap(const EncodeRequest& request, const std::vector<StatusOr<ContentKey>>& keys) const {
  const std::int64_t cap = p_.options.max_video_decodes_per_tenant;
  if (cap == 0) return Status::Ok();
  std::vector<ContentKey> starts;  // the keys whose decode the request would start
  for (std::size_t i = 0; i < request.items.size(); ++i) {
    const EncodeItemInput& item = request.items[i];
    if (!item.is_video() || !keys[i].ok()) continue;
    const ContentKey& key = *keys[i];
    const bool no_decode = !CheckExpectedTokensSign(item.expected_tokens).ok() ||
                           !CheckBeforeDecode(p_.options, *item.video).ok() ||
                           (timings_.Find(key) != nullptr && p_.cache.Contains(key)) || pending_.count(key) != 0 ||
                           (!chunked_ && p_.options.dedup_in_flight && p_.table.InFlight(key).has_value());
    const bool shared = p_.options.dedup_in_flight && std::find(starts.begin(), starts.end(), key) != starts.end();
    if (!no_decode && !shared) starts.push_back(key);
  }
  if (starts.empty()) return Status::Ok();
  const auto t = decodes_by_tenant_.find(request.tenant);
  const std::int64_t queued = t == decodes_by_tenant_.end() ? 0 : t->second;
  const auto n = static_cast<std::int64_t>(starts.size());
  if (queued + n <= cap) return Status::Ok();
  return ResourceExhausted("tenant '" + request.tenant + "' has " + std::to_string(queued) +
                           " video decodes queued and request '" + request.id + "' would start " + std::to_string(n) +
                           " more, past max_video_decodes_per_tenant (" + std::to_string(cap) +
                           "); retry when one completes");
}

std::shared_ptr<VideoServing::Decode> VideoServing::StartDecode(const ContentKey& key, const VideoInput& input,
                                                                std::optional<KeyNamespace> chunk_ns,
                                                                const std::string& tenant) {
  auto d = std::make_shared<Decode>();
  d->key = key;
  d->tenant = tenant;
  d->input = input;
  d->chunk_ns = std::move(chunk_ns);
  ++decodes_by_tenant_[tenant];
  if (p_.options.dedup_in_flight) pending_[key] = d;
  in_flight_.push_back(d);
  ++p_.stats.video_decodes;
  pool_.Post(tenant, [this, d] {
    const Clock::time_point start = Clock::now();
    StatusOr<PreparedVideo> r = d->stop.stop_requested()
                                    ? StatusOr<PreparedVideo>(Cancelled("the video's request ended before its decode"))
                                    : PrepareVideo(p_.options, d->input, d->chunk_ns, d->stop.get_token());
    if (r.ok()) r->decode_seconds = std::chrono::duration<double>(Clock::now() - start).count();
    MutexLock lock(mu_);
    d->result.emplace(std::move(r));
    done_.push_back(d);
    ready_.store(true, std::memory_order_release);
    done_cv_.NotifyAll();
    if (wake_) wake_();
  });
  return d;
}

void VideoServing::SetWake(std::function<void()> wake) {
  MutexLock lock(mu_);
  wake_ = std::move(wake);
}

std::int64_t VideoServing::TakeCompletions() {
  if (!CompletionReady()) return 0;
  std::vector<std::shared_ptr<Decode>> done;
  {
    MutexLock lock(mu_);
    done.swap(done_);
    ready_.store(false, std::memory_order_release);
  }
  for (const std::shared_ptr<Decode>& d : done) {
    d->done = true;
    std::erase(in_flight_, d);
    if (auto t = decodes_by_tenant_.find(d->tenant); --t->second == 0) decodes_by_tenant_.erase(t);
    if (d->users == 0) Retire(*d);
  }
  return static_cast<std::int64_t>(done.size());
}

void VideoServing::AwaitCompletion() {
  MutexLock lock(mu_);
  while (done_.empty()) done_cv_.Wait(mu_);
}

void VideoServing::Release(Decode& d) {
  if (--d.users == 0) Retire(d);
}

void VideoServing::Retire(Decode& d) {
  if (!d.done) d.stop.request_stop();  // its late completion is ignored
  if (auto p = pending_.find(d.key); p != pending_.end() && p->second.get() == &d) pending_.erase(p);
}

void VideoServing::Cached(const ContentKey& key, std::shared_ptr<const VideoTiming> timing) {
  timings_.Put(key, std::move(timing));
}

void VideoServing::Expand(Item& v) {
  if (v.abandoned) return;
  v.expanded = true;
  const std::shared_ptr<Decode> d = std::move(v.decode);
  Release(*d);
  const StatusOr<PreparedVideo>& p = *d->result;
  Status s = p.ok() ? CheckExpectedTokens(v.expected_tokens, "the video", p->grid, p_.options.preprocess.merge_size)
                    : p.status();
  if (!s.ok()) {
    ItemResult res;
    res.status = std::move(s);
    Post(v, std::move(res));
    return;
  }
  chunked_ ? ExpandChunks(v, *p) : ExpandWhole(v, *p);
}

JobWork VideoServing::Work(const Item& v, JobId id, std::int64_t part, std::int64_t cost,
                           std::function<StatusOr<PreprocessedImage>()> make) const {
  // Under kFair a video job's share is its tokens: its frames are decoded.
  return JobWork{id, cost,           0, p_.table.tenant(v.request), {p_.table.id(v.request), v.request, v.index, part},
                 {}, std::move(make)};
}

void VideoServing::ExpandWhole(Item& v, const PreparedVideo& p) {
  const JobTable::Waiter w{v.request, v.index, v.arrived};
  // An identical video expanded before this one made the job: join it.
  if (std::optional<JobId> j = p_.table.InFlight(v.key)) {
    p_.table.Wait(*j, w);
    return;
  }
  const JobId id = p_.table.NewJob(v.key);
  p_.table.job(id).video_timing = p.timing;
  p_.table.job(id).prior_seconds = p.decode_seconds;
  p_.table.Wait(id, w);
  p_.queue.AddNow(Work(v, id, 0, p.grid.tokens(p_.options.preprocess.merge_size),
                       [video = p.video, cfg = p_.options.preprocess] { return PreprocessWholeVideo(*video, cfg); }));
}

std::int64_t VideoServing::NewChunkJobs(const PreparedVideo& p) const {
  return CountNewJobs(p.chunk_keys, p_.options.dedup_in_flight,
                      [&](const ContentKey& k) { return p_.cache.Contains(k) || p_.table.InFlight(k).has_value(); });
}

void VideoServing::ExpandChunks(Item& v, const PreparedVideo& p) {
  // The queue bound, now that the chunks are known (Submit counted the video
  // as one job): the video fails alone, and queues nothing.
  if (Status s = CheckQueueBound(VideoSubject(), NewChunkJobs(p), p_.queue.load(), p_.options.max_pending_items);
      !s.ok()) {
    ItemResult res;
    res.status = std::move(s);
    Post(v, std::move(res));
    return;
  }
  v.grid = p.grid;
  v.timing = p.timing;
  v.chunks.assign(static_cast<std::size_t>(p.grid.t), nullptr);
  v.chunk_keys = p.chunk_keys;
  // Each chunk's share of the container decode: chunks have equal tokens,
  // so by tokens it is an equal share.
  const double decode_share = p.decode_seconds / static_cast<double>(p.grid.t);
  const std::int64_t chunk_tokens = GridTHW{1, p.grid.h, p.grid.w}.tokens(p_.options.preprocess.merge_size);
  for (std::int64_t c = 0; c < p.grid.t; ++c) {
    const ContentKey& key = p.chunk_keys[static_cast<std::size_t>(c)];
    const JobTable::Waiter w{v.request, v.index, v.arrived, c};
    if (std::optional<JobId> j = p_.table.InFlight(key)) {
      ++p_.stats.chunk_joins;
      p_.table.Wait(*j, w);
      ++v.remaining;
      continue;
    }
    if (std::optional<WorkerCache::Hit> hit = p_.cache.Lookup(key, chunk_tokens)) {
      ++p_.stats.chunk_hits;
      v.chunks[static_cast<std::size_t>(c)] = std::move(hit->embedding);
      continue;
    }
    ++p_.stats.chunk_misses;
    const JobId id = p_.table.NewJob(key);
    p_.table.job(id).prior_seconds = decode_share;
    p_.table.Wait(id, w);
    ++v.remaining;
    p_.queue.AddNow(Work(v, id, c, chunk_tokens, [video = p.video, c, cfg = p_.options.preprocess] {
      return PreprocessChunk(*video, c, cfg);
    }));
  }
  if (v.remaining == 0) Post(v, Assemble(v));  // every chunk was cached
}

ItemResult VideoServing::Assemble(Item& v) {
  ItemResult res;
  res.queue_ms = v.queue_ms;
  res.tower_ms = v.tower_ms;
  if (!v.failure.ok()) {
    res.status = v.failure;
  } else if (StatusOr<EmbeddingPtr> whole = ConcatChunks(v.chunks, v.grid, p_.options.preprocess.merge_size);
             !whole.ok()) {
    res.status = whole.status();
  } else {
    // With a GPU tier L1 holds device embeddings; the concatenation was made
    // on the host. A failed copy serves (and caches) the host one.
    res.embedding = p_.cache.OnDevice(std::move(*whole));
    res.encode_seconds = ChunkSeconds(v.chunk_keys);  // what the cache and the shared tier charge for it
    p_.cache.Put(v.key, res.embedding, p_.cache.CostFor(res.encode_seconds, p_.table.tenant(v.request)));
    timings_.Put(v.key, v.timing);
    res.video = v.timing;
  }
  v.chunks.clear();
  res.index = v.index;
  res.key = v.key;
  res.source = ItemSource::kMiss;
  res.total_ms = Ms(Clock::now() - v.arrived);
  return res;
}

double VideoServing::ChunkSeconds(const std::vector<ContentKey>& keys) const {
  double seconds = 0;
  for (const ContentKey& k : keys) {
    if (std::optional<EntryCost> c = p_.cache.CostOf(k)) seconds += c->seconds;
  }
  return seconds;
}

void VideoServing::Post(const Item& v, ItemResult res) {
  res.index = v.index;
  res.key = v.key;
  res.source = p_.table.held(v.request, v.index).source;
  res.total_ms = Ms(Clock::now() - v.arrived);
  p_.table.Post(v.request, std::move(res));
}

}  // namespace epd::internal
