// One Redis server of the shared tier behind a connection pool
// (src/l3/redis_shard.h). Blocking hiredis calls with a per-socket timeout
// (redisSetTimeout), not the async API: the callers are already off the
// worker thread, and a pool of blocking connections gives parallel calls
// without an event loop; a slow Redis costs each call at most `timeout`.
#include "redis_shard.h"

#include <algorithm>

namespace epd::internal {
namespace {

std::string ReplyErrorKind(std::string_view message) {
  if (message.rfind("OOM", 0) == 0) return "oom";
  if (message.rfind("NOAUTH", 0) == 0 || message.rfind("WRONGPASS", 0) == 0 ||
      message.find("AUTH") != std::string_view::npos)
    return "auth";
  return "reply";
}

}  // namespace

Shard::Shard(RedisUrl url, const RedisTierOptions& o) : url_(std::move(url)), name_(url_.Name()), opt_(o) {
  backoff_ = opt_.reconnect_min;
}

Shard::~Shard() {
  for (redisContext* c : idle_) redisFree(c);
}

bool Shard::down() const {
  MutexLock lock(mu_);
  return down_;
}

CommandResult Shard::Run(const std::vector<std::string_view>& argv, bool asking) {
  CommandResult out;
  out.node = name_;
  redisContext* c = nullptr;
  {
    MutexLock lock(mu_);
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
  const int argc = static_cast<int>(args.size());
  auto* r = asking ? RunAsking(c, argc, args.data(), lens.data())
                   : static_cast<redisReply*>(redisCommandArgv(c, argc, args.data(), lens.data()));
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

redisReply* Shard::RunAsking(redisContext* c, int argc, const char** args, const std::size_t* lens) {
  if (redisAppendCommand(c, "ASKING") != REDIS_OK || redisAppendCommandArgv(c, argc, args, lens) != REDIS_OK) {
    return nullptr;
  }
  void* first = nullptr;
  void* second = nullptr;
  if (redisGetReply(c, &first) != REDIS_OK) return nullptr;
  Reply asking(static_cast<redisReply*>(first));
  if (redisGetReply(c, &second) != REDIS_OK) return nullptr;
  Reply command(static_cast<redisReply*>(second));
  if (asking != nullptr && asking->type == REDIS_REPLY_ERROR) return asking.release();
  return command.release();
}

std::string Shard::IoKind(const redisContext* c) {
  const std::string_view e(c->errstr);
  if (c->err == REDIS_ERR_IO &&
      (e.find("temporarily unavailable") != std::string_view::npos || e.find("timed out") != std::string_view::npos))
    return "timeout";
  return "io";
}

redisContext* Shard::Connect(std::string* kind, std::string* error) {
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

void Shard::MarkDown() {
  MutexLock lock(mu_);
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

void Shard::MarkUp(redisContext* c) {
  MutexLock lock(mu_);
  down_ = false;
  backoff_ = opt_.reconnect_min;
  idle_.push_back(c);
}

}  // namespace epd::internal
