// RedisTier: SharedTier on Redis through hiredis's blocking API.
//
// Design notes.
// - Each Redis is a Shard (src/l3/redis_shard.h): a pool of blocking
//   connections with a per-socket timeout, marked down for a backoff after
//   an I/O error. The callers are already off the worker thread (the
//   WorkerLoop's lookup threads and this tier's writer thread). A Router
//   (src/l3/redis_router.h) picks the shard of a key: the ring of
//   independent servers, or Redis Cluster's slot map (redis_cluster.h).
// - Every command names one key, and on a cluster a value and its lease
//   carry the content key as their hash tag, so they share a slot: the
//   Lua compare-and-deletes (one key each) and the lease's SET NX never
//   cross slots.
// - Writes go through one writer thread and a queue bounded in bytes, so a
//   slow or full Redis costs at most that much memory and never stalls the
//   worker. A write is followed by the release of this process's lease (the
//   value first, then the lease: a waiter that sees the lease gone finds the
//   value).
// - Every delete is a compare-and-delete in Lua, so it never removes what
//   another process wrote meanwhile: a lease release deletes only the exact
//   lease value this process set (a lease that lapsed and was taken by
//   another process survives our late release); a rejected value is deleted
//   only while it still holds the exact bytes read; a value the caller
//   refused (RejectAsync) only while its header, whose checksum or tag covers
//   the rows, is still the one read.
// - With a keyring, a lease that fails authentication is treated as absent:
//   compare-and-deleted, then this process sets its own.
#include "epd/l3/redis_tier.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "epd/core/mutex.h"
#include "epd/l3/l3_lease.h"
#include "epd/l3/l3_value.h"
#include "epd/media/content_key.h"
#include "redis_cluster.h"
#include "redis_router.h"

namespace epd {
namespace {

using Clock = std::chrono::steady_clock;
using internal::CommandResult;
using internal::Router;

// Deletes KEYS[1] only while it holds exactly ARGV[1].
constexpr const char* kCompareDeleteScript =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end";
// Deletes KEYS[1] only while its first ARGV[2] bytes are exactly ARGV[1].
constexpr const char* kPrefixDeleteScript =
    "if redis.call('GETRANGE', KEYS[1], 0, tonumber(ARGV[2]) - 1) == ARGV[1] then "
    "return redis.call('DEL', KEYS[1]) else return 0 end";
// Header bytes remembered per hit for RejectAsync (the longer format's).
constexpr std::size_t kRememberBytes = kL3KeyedHeaderBytes;
constexpr std::size_t kRememberMax = 1024;

bool ParsePort(std::string_view s, int lo, int hi, int* out) {
  if (s.empty()) return false;
  int v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || v < lo || v > hi) return false;
  *out = v;
  return true;
}

std::int64_t WallMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string DefaultOwnerId() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') std::snprintf(host, sizeof(host), "localhost");
  std::random_device rd;
  char suffix[17];
  std::snprintf(suffix, sizeof(suffix), "%08x%08x", rd(), rd());
  return std::string(host) + ":" + std::to_string(getpid()) + ":" + suffix;
}

class RedisTier final : public SharedTier {
 public:
  // `cluster`: `urls` are the seeds of a Redis Cluster, else the ring's shards.
  RedisTier(RedisTierOptions o, std::vector<RedisUrl> urls, bool cluster)
      : opt_(std::move(o)), open_(cluster ? "{" : ""), close_(cluster ? "}" : "") {
    value_opts_.keyring = opt_.keyring;
    value_opts_.merge_size = opt_.merge_size;
    router_ = cluster ? std::unique_ptr<Router>(std::make_unique<internal::ClusterRouter>(std::move(urls), opt_))
                      : internal::MakeRingRouter(std::move(urls), opt_);
    writer_ = std::thread([this] { WriterLoop(); });
  }

  ~RedisTier() override {
    {
      MutexLock lock(queue_mu_);
      stopping_ = true;
      queue_cv_.NotifyAll();
    }
    writer_.join();
  }

  using SharedTier::Get;
  using SharedTier::PutAsync;

  StatusOr<EmbeddingPtr> Get(const ContentKey& key, double* encode_seconds) override {
    if (encode_seconds != nullptr) *encode_seconds = kL3Unmeasured;
    Count([](SharedTierStats& s) { ++s.gets; });
    const std::string k = ValueKey(key);
    CommandResult r = Run(key, k, {"GET", k});
    if (!Ok(r)) return Status(StatusCode::kUnavailable, "L3 " + r.error);
    if (r.reply->type == REDIS_REPLY_NIL) {
      Count([](SharedTierStats& s) { ++s.misses; });
      return EmbeddingPtr();
    }
    if (r.reply->type != REDIS_REPLY_STRING) {
      Fail("reply", "shard " + r.node + ": GET answered type " + std::to_string(r.reply->type), r.node);
      return Status(StatusCode::kUnavailable, "L3 GET: unexpected reply type");
    }
    const std::string_view bytes(r.reply->str, r.reply->len);
    StatusOr<EmbeddingPtr> e = DecodeL3Value(bytes, key, kContentKeyVersion, value_opts_, encode_seconds);
    if (!e.ok()) {
      const bool auth = e.status().code() == StatusCode::kUnauthenticated;
      Count([auth](SharedTierStats& s) {
        ++(auth ? s.auth_failures : s.corrupt);
        ++s.misses;
      });
      Log(auth ? "unauthenticated" : "corrupt",
          "key " + key.Hex().substr(0, 16) + " on " + r.node + ": " + e.status().message());
      // Deleted so no other process fetches and rejects it again; the
      // encode that follows writes a good one. Only these exact bytes: a
      // valid value written since survives.
      Ok(Run(key, k, {"EVAL", kCompareDeleteScript, "1", k, bytes}));
      return EmbeddingPtr();
    }
    Remember(key, bytes.substr(0, std::min(bytes.size(), kRememberBytes)));
    Count([](SharedTierStats& s) { ++s.hits; });
    return e;
  }

  LeaseResult TryLease(const ContentKey& key) override {
    const std::string k = LeaseKey(key);
    const std::string px = std::to_string(opt_.lease.count());
    StatusOr<std::string> mine = MakeLeaseValue(opt_.keyring.get(), key, opt_.owner_id, WallMs() + opt_.lease.count());
    if (!mine.ok()) {
      Fail("lease", mine.status().message());
      return LeaseResult::kError;
    }
    // Twice at most: a forged lease found on the first try is deleted and
    // the SET NX repeated once.
    for (int attempt = 0; attempt < 2; ++attempt) {
      CommandResult r = Run(key, k, {"SET", k, *mine, "NX", "PX", px});
      if (!Ok(r)) return LeaseResult::kError;
      if (r.reply->type == REDIS_REPLY_STATUS) {
        {
          MutexLock lock(held_mu_);
          held_[key] = *mine;
        }
        Count([](SharedTierStats& s) { ++s.leases_acquired; });
        return LeaseResult::kAcquired;
      }
      CommandResult holder = Run(key, k, {"GET", k});
      if (!Ok(holder)) return LeaseResult::kError;
      // Gone (it lapsed just now): the next poll takes it.
      if (holder.reply->type != REDIS_REPLY_STRING) return LeaseResult::kHeldByOther;
      const std::string_view found(holder.reply->str, holder.reply->len);
      StatusOr<std::string> owner = LeaseOwner(opt_.keyring.get(), key, found, WallMs());
      if (owner.ok()) return *owner == opt_.owner_id ? LeaseResult::kHeldByUs : LeaseResult::kHeldByOther;
      Count([](SharedTierStats& s) { ++s.lease_auth_failures; });
      Log("unauthenticated", "key " + key.Hex().substr(0, 16) + " on " + holder.node + ": " + owner.status().message());
      Ok(Run(key, k, {"EVAL", kCompareDeleteScript, "1", k, found}));
    }
    // Forged again between our delete and our SET NX: the next poll retries.
    return LeaseResult::kHeldByOther;
  }

  void PutAsync(const ContentKey& key, EmbeddingPtr embedding, double encode_seconds) override {
    Enqueue({key, std::move(embedding), 0, std::nullopt, encode_seconds});
  }
  void ReleaseAsync(const ContentKey& key) override {
    {
      MutexLock lock(held_mu_);
      if (held_.count(key) == 0) return;
    }
    Enqueue({key, nullptr, 0, std::nullopt});
  }
  void RejectAsync(const ContentKey& key, const std::string& why) override {
    Count([](SharedTierStats& s) { ++s.corrupt; });
    Log("corrupt", "key " + key.Hex().substr(0, 16) + ": refused by the caller: " + why);
    std::optional<std::string> header;
    {
      MutexLock lock(remember_mu_);
      if (auto it = remembered_.find(key); it != remembered_.end()) header = it->second.second;
    }
    if (header) Enqueue({key, nullptr, 0, std::move(header)});
  }

  LeaseWaitPolicy wait_policy() const override { return opt_.wait; }

  SharedTierStats Stats() const override {
    MutexLock lock(stats_mu_);
    SharedTierStats s = stats_;
    router_->AddStats(s);
    s.degraded = router_->degraded() || last_failed_.load();
    return s;
  }

  std::string Describe() const override { return router_->Describe(); }

 private:
  struct WriteJob {
    ContentKey key;
    EmbeddingPtr embedding;  // null: release the lease only (or reject)
    std::int64_t bytes = 0;
    // Set: delete the value while it begins with these bytes (RejectAsync);
    // no write, no release.
    std::optional<std::string> reject_header;
    double encode_seconds = kL3Unmeasured;  // the value's cost field (-1: none)
  };

  CommandResult Run(const ContentKey& key, std::string_view redis_key, const std::vector<std::string_view>& argv) {
    return router_->Run(key, redis_key, argv);
  }
  // On a cluster the hex is the key's hash tag ("epd:v:{<hex>}").
  std::string ValueKey(const ContentKey& key) const { return opt_.key_prefix + "v:" + open_ + key.Hex() + close_; }
  std::string LeaseKey(const ContentKey& key) const { return opt_.key_prefix + "lease:" + open_ + key.Hex() + close_; }

  template <typename F>
  void Count(F f) const {
    MutexLock lock(stats_mu_);
    f(stats_);
  }

  // True when `r` is a usable reply; otherwise counts and logs the failure.
  bool Ok(const CommandResult& r) {
    if (r.error_kind.empty()) {
      last_failed_ = false;
      return true;
    }
    Fail(r.error_kind, r.error, r.node);
    return false;
  }
  void Fail(const std::string& kind, const std::string& message, const std::string& node = std::string()) {
    last_failed_ = true;
    Count([&](SharedTierStats& s) {
      ++s.errors[kind];
      if (!node.empty()) ++s.node_errors[node];
    });
    Log(kind, message);
  }

  // Passes `message` to the log at most once per log_interval per distinct
  // (kind, message), with how many were held back since.
  void Log(const std::string& kind, const std::string& message) {
    if (!opt_.log) return;
    const std::string id = kind + '\0' + message;
    std::string line;
    {
      MutexLock lock(log_mu_);
      LogState& st = logged_[id];
      const Clock::time_point now = Clock::now();
      if (st.last != Clock::time_point() && now - st.last < opt_.log_interval) {
        ++st.held_back;
        return;
      }
      line = "L3 " + kind + " error: " + message;
      if (st.held_back > 0) line += " (" + std::to_string(st.held_back) + " more since the last report)";
      st.last = now;
      st.held_back = 0;
    }
    opt_.log(line);
  }

  // Keeps the header of a value just served, for RejectAsync (the last
  // kRememberMax keys).
  void Remember(const ContentKey& key, std::string_view header) {
    MutexLock lock(remember_mu_);
    const std::uint64_t seq = ++remember_seq_;
    remembered_[key] = {seq, std::string(header)};
    remember_fifo_.emplace_back(seq, key);
    while (remember_fifo_.size() > kRememberMax) {
      const auto [old_seq, old_key] = remember_fifo_.front();
      remember_fifo_.pop_front();
      if (auto it = remembered_.find(old_key); it != remembered_.end() && it->second.first == old_seq) {
        remembered_.erase(it);
      }
    }
  }

  void Enqueue(WriteJob job) {
    const EmbeddingPtr& e = job.embedding;
    const std::int64_t bytes = e != nullptr ? static_cast<std::int64_t>(e->nbytes()) : 0;
    MutexLock lock(queue_mu_);
    if (e != nullptr && queued_bytes_ + bytes > opt_.max_write_queue_bytes) {
      Count([](SharedTierStats& s) { ++s.write_drops; });
      Log("queue", "the write queue is full (" + std::to_string(opt_.max_write_queue_bytes) +
                       " bytes); dropping writes until it drains");
      job.embedding = nullptr;  // still release the lease, if held
    }
    job.bytes = job.embedding != nullptr ? bytes : 0;
    queued_bytes_ += job.bytes;
    queue_.push_back(std::move(job));
    queue_cv_.NotifyOne();
  }

  void WriterLoop() {
    for (;;) {
      WriteJob job;
      {
        MutexLock lock(queue_mu_);
        while (!stopping_ && queue_.empty()) queue_cv_.Wait(queue_mu_);
        if (queue_.empty()) break;  // stopping and drained
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      if (job.reject_header) {
        Reject(job.key, *job.reject_header);
      } else {
        if (job.embedding != nullptr) Write(job);
        Release(job.key);
      }
      MutexLock lock(queue_mu_);
      queued_bytes_ -= job.bytes;
    }
    // Leases still held (their encodes never finished): release them so no
    // other process waits for their expiry.
    std::vector<ContentKey> held;
    {
      MutexLock lock(held_mu_);
      for (const auto& [k, v] : held_) held.push_back(k);
    }
    for (const ContentKey& k : held) Release(k);
  }

  void Write(const WriteJob& job) {
    StatusOr<EmbeddingPtr> host = ToHost(job.embedding);
    if (!host.ok()) {
      Count([](SharedTierStats& s) { ++s.write_drops; });
      Log("copy", "cannot copy an embedding to the host for L3: " + host.status().message());
      return;
    }
    std::string value;
    try {
      value = EncodeL3Value(job.key, **host, kContentKeyVersion, value_opts_, job.encode_seconds);
    } catch (const Error& e) {
      Count([](SharedTierStats& s) { ++s.write_drops; });
      Log("encode", std::string("cannot encode an L3 value: ") + e.what());
      return;
    }
    const std::string k = ValueKey(job.key);
    const std::string px = std::to_string(opt_.ttl.count() * 1000);
    CommandResult r =
        opt_.ttl.count() > 0 ? Run(job.key, k, {"SET", k, value, "PX", px}) : Run(job.key, k, {"SET", k, value});
    if (!Ok(r)) {
      Count([](SharedTierStats& s) { ++s.write_drops; });
      return;
    }
    Count([&](SharedTierStats& s) {
      ++s.writes;
      s.write_bytes += value.size();
    });
  }

  void Release(const ContentKey& key) {
    std::string mine;
    {
      MutexLock lock(held_mu_);
      auto it = held_.find(key);
      if (it == held_.end()) return;
      mine = std::move(it->second);
      held_.erase(it);
    }
    const std::string k = LeaseKey(key);
    CommandResult r = Run(key, k, {"EVAL", kCompareDeleteScript, "1", k, mine});
    if (!Ok(r)) return;  // it lapses by itself after `lease`
    if (r.reply->type == REDIS_REPLY_INTEGER && r.reply->integer == 1) {
      Count([](SharedTierStats& s) { ++s.leases_released; });
    }
  }

  void Reject(const ContentKey& key, const std::string& header) {
    const std::string k = ValueKey(key);
    Ok(Run(key, k, {"EVAL", kPrefixDeleteScript, "1", k, header, std::to_string(header.size())}));
  }

  struct LogState {
    Clock::time_point last;
    std::uint64_t held_back = 0;
  };

  const RedisTierOptions opt_;
  L3ValueOptions value_opts_;
  const std::string open_, close_;  // the hash tag's braces on a cluster, else empty
  std::unique_ptr<Router> router_;

  mutable Mutex stats_mu_;
  mutable SharedTierStats stats_ EPD_GUARDED_BY(stats_mu_);
  std::atomic<bool> last_failed_{false};

  Mutex log_mu_;
  std::map<std::string, LogState> logged_ EPD_GUARDED_BY(log_mu_);

  Mutex held_mu_;
  // Leases this process holds, with the exact value it set.
  std::map<ContentKey, std::string> held_ EPD_GUARDED_BY(held_mu_);

  Mutex remember_mu_;
  std::uint64_t remember_seq_ EPD_GUARDED_BY(remember_mu_) = 0;
  std::map<ContentKey, std::pair<std::uint64_t, std::string>> remembered_ EPD_GUARDED_BY(remember_mu_);
  std::deque<std::pair<std::uint64_t, ContentKey>> remember_fifo_ EPD_GUARDED_BY(remember_mu_);

  Mutex queue_mu_;
  CondVar queue_cv_;
  std::deque<WriteJob> queue_ EPD_GUARDED_BY(queue_mu_);
  std::int64_t queued_bytes_ EPD_GUARDED_BY(queue_mu_) = 0;
  bool stopping_ EPD_GUARDED_BY(queue_mu_) = false;
  std::thread writer_;
};

}  // namespace

std::string RedisUrl::Name() const { return host + ":" + std::to_string(port) + "/" + std::to_string(db); }

StatusOr<RedisUrl> ParseRedisUrl(std::string_view url) {
  // Shown in errors without its credentials.
  std::string shown(url);
  if (const std::size_t at = shown.rfind('@'); at != std::string::npos) {
    const std::size_t start = shown.find("://") == std::string::npos ? 0 : shown.find("://") + 3;
    shown.replace(start, at - start, "<credentials>");
  }
  auto bad = [&](const std::string& why) { return InvalidArgument("--l3 URL '" + shown + "': " + why); };
  constexpr std::string_view kScheme = "redis://";
  if (url.rfind("rediss://", 0) == 0) {
    return bad("rediss:// (TLS) is not supported: Debian's hiredis 0.14 has no TLS; see docs/L3.md for a TLS proxy");
  }
  if (url.rfind(kScheme, 0) != 0) return bad("must start with redis://");
  std::string_view rest = url.substr(kScheme.size());
  RedisUrl out;
  if (const std::size_t at = rest.rfind('@'); at != std::string_view::npos) {
    std::string_view cred = rest.substr(0, at);
    rest = rest.substr(at + 1);
    const std::size_t colon = cred.find(':');
    if (colon == std::string_view::npos) return bad("credentials must be [user]:password");
    out.user = std::string(cred.substr(0, colon));
    out.password = std::string(cred.substr(colon + 1));
    if (out.password.empty()) return bad("empty password");
  }
  if (const std::size_t slash = rest.find('/'); slash != std::string_view::npos) {
    std::string_view db = rest.substr(slash + 1);
    rest = rest.substr(0, slash);
    if (!db.empty() && !ParsePort(db, 0, 65535, &out.db)) return bad("database must be a number in 0..65535");
  }
  std::string_view host = rest;
  if (const std::size_t colon = rest.rfind(':');
      colon != std::string_view::npos && rest.find(']') == std::string_view::npos) {
    host = rest.substr(0, colon);
    if (!ParsePort(rest.substr(colon + 1), 1, 65535, &out.port)) return bad("port must be in 1..65535");
  }
  if (host.empty()) return bad("empty host");
  out.host = std::string(host);
  return out;
}

StatusOr<std::shared_ptr<SharedTier>> OpenRedisTier(RedisTierOptions o) {
  if (o.urls.empty()) return InvalidArgument("the shared tier needs at least one redis:// URL");
  if (o.timeout.count() <= 0) return InvalidArgument("--l3-timeout-ms must be > 0");
  if (o.lease.count() <= 0 && o.wait.single_flight) return InvalidArgument("--l3-lease-ms must be > 0");
  if (o.ttl.count() < 0) return InvalidArgument("--l3-ttl-s must be >= 0");
  if (o.max_write_queue_bytes <= 0) return InvalidArgument("the L3 write queue size must be > 0");
  if (o.wait.wait.count() < 0 || o.wait.poll_initial.count() <= 0 || o.wait.poll_max < o.wait.poll_initial ||
      o.wait.lookup_threads <= 0) {
    return InvalidArgument("the L3 lease wait policy needs wait >= 0, 0 < poll_initial <= poll_max, threads > 0");
  }
  if (o.key_prefix.empty()) return InvalidArgument("the L3 key prefix is empty");
  if (o.merge_size < 1 || o.merge_size > 64) return InvalidArgument("the L3 merge size must be in 1..64");
  if (o.owner_id.empty()) o.owner_id = DefaultOwnerId();
  const auto is_cluster = [](const std::string& u) { return u.rfind("redis-cluster://", 0) == 0; };
  if (std::any_of(o.urls.begin(), o.urls.end(), is_cluster)) {
    if (o.urls.size() != 1) {
      return InvalidArgument("--l3 redis-cluster:// lists every seed in one URL and cannot be mixed with other --l3");
    }
    if (o.key_prefix.find_first_of("{}") != std::string::npos) {
      return InvalidArgument("--l3-prefix '" + o.key_prefix +
                             "' holds a brace: on Redis Cluster the key's hash tag is the content key's");
    }
    StatusOr<std::vector<RedisUrl>> seeds = internal::ParseClusterUrl(o.urls.front());
    if (!seeds.ok()) return seeds.status();
    return std::shared_ptr<SharedTier>(std::make_shared<RedisTier>(std::move(o), *std::move(seeds), true));
  }
  std::vector<RedisUrl> urls;
  std::set<std::string> names;
  for (const std::string& u : o.urls) {
    StatusOr<RedisUrl> parsed = ParseRedisUrl(u);
    if (!parsed.ok()) return parsed.status();
    if (!names.insert(parsed->Name()).second) return InvalidArgument("--l3 lists " + parsed->Name() + " twice");
    urls.push_back(*std::move(parsed));
  }
  return std::shared_ptr<SharedTier>(std::make_shared<RedisTier>(std::move(o), std::move(urls), false));
}

}  // namespace epd
