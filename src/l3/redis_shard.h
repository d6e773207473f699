// src/l3/redis_shard.h (internal to epd::l3): one Redis server of the shared
// tier (epd/l3/redis_tier.h) behind a pool of blocking hiredis connections.
//
// - A connection that saw an I/O error or timeout is closed, never reused
//   (hiredis leaves such a context unusable), and the shard is marked down
//   for a backoff (reconnect_min doubling to reconnect_max); while it is
//   down, Run fails at once with kind "down". An error reply leaves the
//   connection usable.
// - Every new connection sends AUTH (the URL's password, or user and
//   password) and SELECT (the URL's database) before its first command.
//
// Thread safety: thread-safe; Run from several threads uses as many
// connections (one per concurrent caller).
#pragma once

#include <hiredis/hiredis.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "epd/core/mutex.h"
#include "epd/core/thread_annotations.h"
#include "epd/l3/redis_tier.h"

namespace epd::internal {

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

// The outcome of one command: a reply, or the kind of failure and its text.
struct CommandResult {
  Reply reply;
  std::string error_kind;  // empty when reply is set and is not an error reply
  std::string error;
  std::string node;  // the shard's name ("host:port/db")
};

class Shard {
 public:
  // `o` must outlive the shard (the tier owns both).
  Shard(RedisUrl url, const RedisTierOptions& o);
  ~Shard();
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;

  const std::string& name() const { return name_; }
  bool down() const;

  // Runs one command (argv) on a pooled connection. Never throws. Error
  // kinds: "connect", "timeout", "io", "oom", "auth", "reply", "down".
  // `asking`: sends ASKING first on the same connection (Redis Cluster's
  // ASK redirection, src/l3/redis_cluster.h); its reply is not returned
  // unless it is an error.
  CommandResult Run(const std::vector<std::string_view>& argv, bool asking = false);

 private:
  using Clock = std::chrono::steady_clock;
  static std::string IoKind(const redisContext* c);
  // A new, authenticated connection with the timeout set, or nullptr.
  redisContext* Connect(std::string* kind, std::string* error);
  void MarkDown();
  void MarkUp(redisContext* c);
  // Sends ASKING then argv on `c`, pipelined; the second reply, or the
  // first when it is an error. nullptr on an I/O error.
  static redisReply* RunAsking(redisContext* c, int argc, const char** args, const std::size_t* lens);

  const RedisUrl url_;
  const std::string name_;
  const RedisTierOptions& opt_;
  mutable Mutex mu_;
  std::vector<redisContext*> idle_ EPD_GUARDED_BY(mu_);
  bool down_ EPD_GUARDED_BY(mu_) = false;
  Clock::time_point retry_at_ EPD_GUARDED_BY(mu_);
  std::chrono::milliseconds backoff_ EPD_GUARDED_BY(mu_);
};

}  // namespace epd::internal
