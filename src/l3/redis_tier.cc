// RedisTier: SharedTier on Redis through hiredis's blocking API.
//
// Design notes.
// - Blocking hiredis calls with a per-socket timeout (redisSetTimeout), not
//   the async API: the callers are already off the worker thread (the
//   WorkerLoop's lookup threads and this tier's writer thread), and a pool of
//   blocking connections per shard gives parallel calls without an event
//   loop. Benefits: small, easy to reason about; a slow Redis costs each call
//   at most `timeout`. Costs: one connection per concurrent caller per shard
//   (a handful: lookup_threads + 1).
// - A connection that saw an I/O error or timeout is closed, never reused
//   (hiredis leaves such a context unusable), and the shard is marked down
//   for a backoff; an error reply leaves the connection usable.
// - Writes go through one writer thread and a queue bounded in bytes, so a
//   slow or full Redis costs at most that much memory and never stalls the
//   worker. A write is followed by the release of this process's lease (the
//   value first, then the lease: a waiter that sees the lease gone finds the
//   value).
// - The lease release is compare-and-delete in Lua: deleting only when the
//   lease still holds our owner id, so a lease that lapsed and was taken by
//   another process survives our late release.
#include "epd/l3/redis_tier.h"

#include <hiredis/hiredis.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "epd/l3/l3_ring.h"
#include "epd/l3/l3_value.h"
#include "epd/media/content_key.h"

namespace epd {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kReleaseScript =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end";

bool ParsePort(std::string_view s, int lo, int hi, int* out) {
  if (s.empty()) return false;
  int v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || v < lo || v > hi) return false;
  *out = v;
  return true;
}

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

// The outcome of one command: a reply, or the kind of failure and its text.
struct CommandResult {
  Reply reply;
  std::string error_kind;  // empty when reply is set and is not an error reply
  std::string error;
};

std::string ReplyErrorKind(std::string_view message) {
  if (message.rfind("OOM", 0) == 0) return "oom";
  if (message.rfind("NOAUTH", 0) == 0 || message.rfind("WRONGPASS", 0) == 0 ||
      message.find("AUTH") != std::string_view::npos)
    return "auth";
  return "reply";
}

class Shard {
 public:
  Shard(RedisUrl url, const RedisTierOptions& o) : url_(std::move(url)), name_(url_.Name()), opt_(o) {
    backoff_ = opt_.reconnect_min;
  }
  ~Shard() {
    for (redisContext* c : idle_) redisFree(c);
  }
  const std::string& name() const { return name_; }
  bool down() const {
    std::lock_guard<std::mutex> lock(mu_);
    return down_;
  }

  // Runs one command (argv) on a pooled connection. Never throws.
  CommandResult Run(const std::vector<std::string_view>& argv) {
    CommandResult out;
    redisContext* c = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (down_ && Clock::now() < retry_at_) {
        out.error_kind = "down";
        out.error = "shard " + name_ + " is down; reconnecting after a backoff";
        return out;
      }
      if (!idle_.empty()) {
        c = idle_.back();
        idle_.pop_back();
      }
    }
    if (c == nullptr) {
      std::string kind, error;
      c = Connect(&kind, &error);
      if (c == nullptr) {
        MarkDown();
        out.error_kind = kind;
        out.error = error;
        return out;
      }
    }
    std::vector<const char*> args;
    std::vector<std::size_t> lens;
    for (std::string_view a : argv) {
      args.push_back(a.data());
      lens.push_back(a.size());
    }
    auto* r = static_cast<redisReply*>(redisCommandArgv(c, static_cast<int>(args.size()), args.data(), lens.data()));
    if (r == nullptr) {
      out.error_kind = IoKind(c);
      out.error = "shard " + name_ + ": " + (c->errstr[0] != '\0' ? std::string(c->errstr) : "no reply");
      redisFree(c);
      MarkDown();
      return out;
    }
    out.reply.reset(r);
    if (r->type == REDIS_REPLY_ERROR) {
      out.error = "shard " + name_ + ": " + std::string(r->str, r->len);
      out.error_kind = ReplyErrorKind(std::string_view(r->str, r->len));
    }
    MarkUp(c);
    return out;
  }

 private:
  static std::string IoKind(const redisContext* c) {
    const std::string_view e(c->errstr);
    if (c->err == REDIS_ERR_IO &&
        (e.find("temporarily unavailable") != std::string_view::npos || e.find("timed out") != std::string_view::npos))
      return "timeout";
    return "io";
  }

  // A new, authenticated connection with the timeout set, or nullptr.
  redisContext* Connect(std::string* kind, std::string* error) {
    timeval tv{};
    tv.tv_sec = static_cast<time_t>(opt_.timeout.count() / 1000);
    tv.tv_usec = static_cast<suseconds_t>((opt_.timeout.count() % 1000) * 1000);
    redisContext* c = redisConnectWithTimeout(url_.host.c_str(), url_.port, tv);
    if (c == nullptr || c->err) {
      *kind = c != nullptr && IoKind(c) == "timeout" ? "timeout" : "connect";
      *error = "cannot connect to " + name_ + ": " + (c != nullptr ? std::string(c->errstr) : "out of memory");
      if (c != nullptr) redisFree(c);
      return nullptr;
    }
    redisSetTimeout(c, tv);
    auto setup = [&](const std::vector<std::string>& argv) {
      std::vector<const char*> a;
      std::vector<std::size_t> l;
      for (const std::string& s : argv) {
        a.push_back(s.data());
        l.push_back(s.size());
      }
      Reply r(static_cast<redisReply*>(redisCommandArgv(c, static_cast<int>(a.size()), a.data(), l.data())));
      if (r == nullptr) {
        *kind = IoKind(c);
        *error = "shard " + name_ + ": " + c->errstr;
        return false;
      }
      if (r->type == REDIS_REPLY_ERROR) {
        *kind = argv[0] == "AUTH" ? "auth" : "reply";
        *error = "shard " + name_ + ": " + argv[0] + " failed: " + std::string(r->str, r->len);
        return false;
      }
      return true;
    };
    bool ok = true;
    if (!url_.password.empty()) {
      ok = url_.user.empty() ? setup({"AUTH", url_.password}) : setup({"AUTH", url_.user, url_.password});
    }
    if (ok && url_.db != 0) ok = setup({"SELECT", std::to_string(url_.db)});
    if (!ok) {
      redisFree(c);
      return nullptr;
    }
    return c;
  }

  void MarkDown() {
    std::lock_guard<std::mutex> lock(mu_);
    if (down_) {
      backoff_ = std::min(backoff_ * 2, opt_.reconnect_max);
    } else {
      backoff_ = opt_.reconnect_min;
    }
    down_ = true;
    retry_at_ = Clock::now() + backoff_;
    // Pooled connections to a server that failed are likely dead too.
    for (redisContext* c : idle_) redisFree(c);
    idle_.clear();
  }
  void MarkUp(redisContext* c) {
    std::lock_guard<std::mutex> lock(mu_);
    down_ = false;
    backoff_ = opt_.reconnect_min;
    idle_.push_back(c);
  }

  const RedisUrl url_;
  const std::string name_;
  const RedisTierOptions& opt_;
  mutable std::mutex mu_;
  std::vector<redisContext*> idle_;    // guarded by mu_
  bool down_ = false;                  // guarded by mu_
  Clock::time_point retry_at_;         // guarded by mu_
  std::chrono::milliseconds backoff_;  // guarded by mu_
};

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
  RedisTier(RedisTierOptions o, std::vector<RedisUrl> urls) : opt_(std::move(o)) {
    std::vector<std::string> names;
    for (RedisUrl& u : urls) {
      names.push_back(u.Name());
      shards_.push_back(std::make_unique<Shard>(std::move(u), opt_));
    }
    ring_ = std::make_unique<HashRing>(std::move(names), opt_.virtual_nodes);
    writer_ = std::thread([this] { WriterLoop(); });
  }

  ~RedisTier() override {
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      stopping_ = true;
      queue_cv_.notify_all();
    }
    writer_.join();
  }

  StatusOr<EmbeddingPtr> Get(const ContentKey& key) override {
    Count([](SharedTierStats& s) { ++s.gets; });
    const std::string k = ValueKey(key);
    Shard& shard = ShardOf(key);
    CommandResult r = shard.Run({"GET", k});
    if (!Ok(r)) return Status(StatusCode::kUnavailable, "L3 " + r.error);
    if (r.reply->type == REDIS_REPLY_NIL) {
      Count([](SharedTierStats& s) { ++s.misses; });
      return EmbeddingPtr();
    }
    if (r.reply->type != REDIS_REPLY_STRING) {
      Fail("reply", "shard " + shard.name() + ": GET answered type " + std::to_string(r.reply->type));
      return Status(StatusCode::kUnavailable, "L3 GET: unexpected reply type");
    }
    StatusOr<EmbeddingPtr> e = DecodeL3Value(std::string_view(r.reply->str, r.reply->len), key, kContentKeyVersion);
    if (!e.ok()) {
      Count([](SharedTierStats& s) {
        ++s.corrupt;
        ++s.misses;
      });
      Log("corrupt", "key " + key.Hex().substr(0, 16) + " on " + shard.name() + ": " + e.status().message());
      // Deleted so no other process fetches and rejects it again; the
      // encode that follows writes a good one. (A good value written in
      // between would be deleted too: a lost hit, never a wrong value.)
      Ok(shard.Run({"DEL", k}));
      return EmbeddingPtr();
    }
    Count([](SharedTierStats& s) { ++s.hits; });
    return e;
  }

  LeaseResult TryLease(const ContentKey& key) override {
    Shard& shard = ShardOf(key);
    const std::string k = LeaseKey(key);
    const std::string px = std::to_string(opt_.lease.count());
    CommandResult r = shard.Run({"SET", k, opt_.owner_id, "NX", "PX", px});
    if (!Ok(r)) return LeaseResult::kError;
    if (r.reply->type == REDIS_REPLY_STATUS) {
      {
        std::lock_guard<std::mutex> lock(held_mu_);
        held_.insert(key);
      }
      Count([](SharedTierStats& s) { ++s.leases_acquired; });
      return LeaseResult::kAcquired;
    }
    CommandResult holder = shard.Run({"GET", k});
    if (!Ok(holder)) return LeaseResult::kError;
    if (holder.reply->type == REDIS_REPLY_STRING &&
        std::string_view(holder.reply->str, holder.reply->len) == opt_.owner_id) {
      return LeaseResult::kHeldByUs;
    }
    // Taken by another process (or it lapsed just now: the next poll takes it).
    return LeaseResult::kHeldByOther;
  }

  void PutAsync(const ContentKey& key, EmbeddingPtr embedding) override { Enqueue(key, std::move(embedding)); }
  void ReleaseAsync(const ContentKey& key) override {
    {
      std::lock_guard<std::mutex> lock(held_mu_);
      if (held_.count(key) == 0) return;
    }
    Enqueue(key, nullptr);
  }

  LeaseWaitPolicy wait_policy() const override { return opt_.wait; }

  SharedTierStats Stats() const override {
    std::lock_guard<std::mutex> lock(stats_mu_);
    SharedTierStats s = stats_;
    s.degraded = false;
    for (const auto& shard : shards_) s.degraded = s.degraded || shard->down();
    s.degraded = s.degraded || last_failed_.load();
    return s;
  }

  std::string Describe() const override {
    std::string out;
    for (const std::string& n : ring_->names()) out += (out.empty() ? "redis://" : ",redis://") + n;
    return out;
  }

 private:
  struct WriteJob {
    ContentKey key;
    EmbeddingPtr embedding;  // null: release the lease only
    std::int64_t bytes = 0;
  };

  Shard& ShardOf(const ContentKey& key) { return *shards_[ring_->ShardFor(key)]; }
  std::string ValueKey(const ContentKey& key) const { return opt_.key_prefix + "v:" + key.Hex(); }
  std::string LeaseKey(const ContentKey& key) const { return opt_.key_prefix + "lease:" + key.Hex(); }

  template <typename F>
  void Count(F f) const {
    std::lock_guard<std::mutex> lock(stats_mu_);
    f(stats_);
  }

  // True when `r` is a usable reply; otherwise counts and logs the failure.
  bool Ok(const CommandResult& r) {
    if (r.error_kind.empty()) {
      last_failed_ = false;
      return true;
    }
    Fail(r.error_kind, r.error);
    return false;
  }
  void Fail(const std::string& kind, const std::string& message) {
    last_failed_ = true;
    Count([&](SharedTierStats& s) { ++s.errors[kind]; });
    Log(kind, message);
  }

  // Passes `message` to the log at most once per log_interval per distinct
  // (kind, message), with how many were held back since.
  void Log(const std::string& kind, const std::string& message) {
    if (!opt_.log) return;
    const std::string id = kind + '\0' + message;
    std::string line;
    {
      std::lock_guard<std::mutex> lock(log_mu_);
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

  void Enqueue(const ContentKey& key, EmbeddingPtr e) {
    const std::int64_t bytes = e != nullptr ? static_cast<std::int64_t>(e->nbytes()) : 0;
    std::lock_guard<std::mutex> lock(queue_mu_);
    if (e != nullptr && queued_bytes_ + bytes > opt_.max_write_queue_bytes) {
      Count([](SharedTierStats& s) { ++s.write_drops; });
      Log("queue", "the write queue is full (" + std::to_string(opt_.max_write_queue_bytes) +
                       " bytes); dropping writes until it drains");
      e = nullptr;  // still release the lease, if held
    }
    const std::int64_t charged = e != nullptr ? bytes : 0;
    queued_bytes_ += charged;
    queue_.push_back({key, std::move(e), charged});
    queue_cv_.notify_one();
  }

  void WriterLoop() {
    for (;;) {
      WriteJob job;
      {
        std::unique_lock<std::mutex> lock(queue_mu_);
        queue_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) break;  // stopping and drained
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      if (job.embedding != nullptr) Write(job);
      Release(job.key);
      std::lock_guard<std::mutex> lock(queue_mu_);
      queued_bytes_ -= job.bytes;
    }
    // Leases still held (their encodes never finished): release them so no
    // other process waits for their expiry.
    std::set<ContentKey> held;
    {
      std::lock_guard<std::mutex> lock(held_mu_);
      held = held_;
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
    const std::string value = EncodeL3Value(job.key, **host, kContentKeyVersion);
    const std::string k = ValueKey(job.key);
    CommandResult r = opt_.ttl.count() > 0
                          ? ShardOf(job.key).Run({"SET", k, value, "PX", std::to_string(opt_.ttl.count() * 1000)})
                          : ShardOf(job.key).Run({"SET", k, value});
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
    {
      std::lock_guard<std::mutex> lock(held_mu_);
      if (held_.erase(key) == 0) return;
    }
    CommandResult r = ShardOf(key).Run({"EVAL", kReleaseScript, "1", LeaseKey(key), opt_.owner_id});
    if (!Ok(r)) return;  // it lapses by itself after `lease`
    if (r.reply->type == REDIS_REPLY_INTEGER && r.reply->integer == 1) {
      Count([](SharedTierStats& s) { ++s.leases_released; });
    }
  }

  struct LogState {
    Clock::time_point last;
    std::uint64_t held_back = 0;
  };

  const RedisTierOptions opt_;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::unique_ptr<HashRing> ring_;

  mutable std::mutex stats_mu_;
  mutable SharedTierStats stats_;  // guarded by stats_mu_
  std::atomic<bool> last_failed_{false};

  std::mutex log_mu_;
  std::map<std::string, LogState> logged_;  // guarded by log_mu_

  std::mutex held_mu_;
  std::set<ContentKey> held_;  // leases this process holds; guarded by held_mu_

  std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::deque<WriteJob> queue_;     // guarded by queue_mu_
  std::int64_t queued_bytes_ = 0;  // guarded by queue_mu_
  bool stopping_ = false;          // guarded by queue_mu_
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
  std::vector<RedisUrl> urls;
  std::set<std::string> names;
  for (const std::string& u : o.urls) {
    StatusOr<RedisUrl> parsed = ParseRedisUrl(u);
    if (!parsed.ok()) return parsed.status();
    if (!names.insert(parsed->Name()).second) return InvalidArgument("--l3 lists " + parsed->Name() + " twice");
    urls.push_back(*std::move(parsed));
  }
  if (o.owner_id.empty()) o.owner_id = DefaultOwnerId();
  return std::shared_ptr<SharedTier>(std::make_shared<RedisTier>(std::move(o), std::move(urls)));
}

}  // namespace epd
