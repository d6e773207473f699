// See reply_budget.h. One mutex over two small hash maps and a few sums:
// every Encode reply passes here a few times (buffer, hold, unhold,
// unbuffer), each a handful of instructions under the lock.
#include "reply_budget.h"

#include <cassert>
#include <cstdio>
#include <utility>

namespace epd::internal {
namespace {

std::string MiB(std::int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return text;
}

}  // namespace

ReplyBudget::ReplyBudget(Limits limits, std::function<void()> on_room, std::function<void()> on_drained)
    : limits_(limits), on_room_(std::move(on_room)), on_drained_(std::move(on_drained)) {}

ReplyBudget::Account ReplyBudget::Open(const std::string& tenant, const std::string& connection) {
  MutexLock lock(mu_);
  Account a;
  a.tenant_ = &*tenants_.try_emplace(tenant).first;
  a.connection_ = &*connections_.try_emplace(connection).first;
  ++a.tenant_->second.calls;
  ++a.connection_->second.calls;
  return a;
}

void ReplyBudget::Close(Account& account) {
  if (!account.open()) return;
  MutexLock lock(mu_);
  // A scope whose last call closed holds nothing (REQUIRES of Close); it is
  // erased so that clients coming and going leave no entries behind.
  for (auto [scopes, entry] : {std::pair{&tenants_, account.tenant_}, std::pair{&connections_, account.connection_}}) {
    Scope& s = entry->second;
    assert(s.calls > 0);
    if (--s.calls == 0 && s.buffered == 0 && s.held == 0) scopes->erase(entry->first);
  }
  account = Account();
}

bool ReplyBudget::Buffer(const Account& account, std::int64_t bytes) {
  MutexLock lock(mu_);
  Scope& t = account.tenant_->second;
  const std::int64_t before = InShare(t.buffered);
  t.buffered += bytes;
  buffered_ += bytes;
  capped_.store(capped_.load(std::memory_order_relaxed) + InShare(t.buffered) - before, std::memory_order_relaxed);
  return t.buffered > limits_.tenant_share_bytes;
}

void ReplyBudget::Unbuffer(const Account& account, std::int64_t bytes) {
  if (bytes == 0) return;
  bool room;
  {
    MutexLock lock(mu_);
    Scope& t = account.tenant_->second;
    const std::int64_t before = InShare(t.buffered);
    t.buffered -= bytes;
    buffered_ -= bytes;
    const std::int64_t was = capped_.load(std::memory_order_relaxed);
    const std::int64_t now = was + InShare(t.buffered) - before;
    capped_.store(now, std::memory_order_relaxed);
    room = was > limits_.buffered_bytes && now <= limits_.buffered_bytes;
  }
  // Crossing back under the bound: let the worker start batches now rather
  // than at its next 1 ms poll.
  if (room && on_room_) on_room_();
}

Status ReplyBudget::Hold(const Account& account, std::int64_t bytes) {
  MutexLock lock(mu_);
  Scope& c = account.connection_->second;
  if (c.held > 0 && c.held + bytes > limits_.connection_held_bytes) {
    ++refusals_;
    return ResourceExhausted("the replies this connection has not read hold " + MiB(c.held) + "; this one (" +
                             MiB(bytes) + ") would pass the per-connection reply budget of " +
                             MiB(limits_.connection_held_bytes) +
                             " (--max-reply-mb-per-connection): read the streams already open, or open fewer at once");
  }
  if (held_ > 0 && held_ + bytes > limits_.held_bytes) {
    ++refusals_;
    return ResourceExhausted("the replies not yet sent to clients hold " + MiB(held_) + "; this one (" + MiB(bytes) +
                             ") would pass the server's reply budget of " + MiB(limits_.held_bytes) +
                             " (--max-reply-mb); retry with backoff");
  }
  c.held += bytes;
  held_ += bytes;
  if (held_ > peak_since_drained_) peak_since_drained_ = held_;
  return Status::Ok();
}

void ReplyBudget::Unhold(const Account& account, std::int64_t bytes) {
  if (bytes == 0) return;
  bool drained = false;
  {
    MutexLock lock(mu_);
    account.connection_->second.held -= bytes;
    held_ -= bytes;
    if (held_ == 0) {
      drained = peak_since_drained_ >= limits_.burst_bytes;
      peak_since_drained_ = 0;
    }
  }
  if (drained && on_drained_) on_drained_();
}

ReplyBudget::Stats ReplyBudget::Snapshot() const {
  Stats s;
  {
    MutexLock lock(mu_);
    s.buffered_bytes = buffered_;
    s.held_bytes = held_;
    s.refusals = refusals_;
  }
  s.throttled_calls = throttled_.load(std::memory_order_relaxed);
  s.write_timeouts = write_timeouts_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace epd::internal
