// See admission.h. The budget is a plain mutex over a counter and a map of
// waiters: calls are few (one per request) and each holds it for a few
// instructions, so a lock-free counter would buy nothing. Grants run outside
// the lock, since a grant may call back into the budget (a refused call's
// OnDone releases nothing, but an admitted one may end at once and Release).
#include "admission.h"

#include <grpcpp/server_context.h>

#include <algorithm>
#include <cstdio>
#include <utility>
#include <vector>

#include "task_pool.h"

namespace epd::internal {

RequestBudget::RequestBudget(std::int64_t capacity_bytes, std::int64_t burst_bytes, std::function<void()> on_drained,
                             TaskPool* pool)
    : capacity_(capacity_bytes), burst_bytes_(burst_bytes), on_drained_(std::move(on_drained)), pool_(pool) {}

Status RequestBudget::Refusal(std::int64_t held, std::int64_t bytes) const {
  constexpr double kMiB = 1 << 20;
  char text[200];
  std::snprintf(text, sizeof(text), "%.1f MiB of requests are in flight; this one (%.1f MiB) would pass the ",
                static_cast<double>(held) / kMiB, static_cast<double>(bytes) / kMiB);
  char cap[64];
  std::snprintf(cap, sizeof(cap), "%.1f MiB", static_cast<double>(capacity_) / kMiB);
  return ResourceExhausted(std::string(text) + "in-flight request budget of " + cap +
                           " (--max-inflight-request-mb); retry with backoff");
}

void RequestBudget::Take(std::int64_t bytes) {
  in_flight_ += bytes;
  peak_since_drained_ = std::max(peak_since_drained_, in_flight_);
}

RequestBudget::WaiterId RequestBudget::Acquire(std::int64_t bytes, Clock::time_point deadline, Grant grant) {
  MutexLock lock(mu_);
  // Room now: in, even past older waiters too large for what is left
  // (admission.h: not first-come-first-served).
  if (in_flight_ + bytes <= capacity_) {
    Take(bytes);
    lock.Unlock();
    grant(Status::Ok());
    return 0;
  }
  if (Clock::now() >= deadline) {
    const std::int64_t held = in_flight_;
    lock.Unlock();
    grant(Refusal(held, bytes));
    return 0;
  }
  const WaiterId id = next_id_++;
  waiters_.emplace(id, Waiter{bytes, std::move(grant)});
  lock.Unlock();
  pool_->PostAt(deadline, [this, id] { Expire(id); });
  return id;
}

void RequestBudget::Expire(WaiterId id) {
  MutexLock lock(mu_);
  auto it = waiters_.find(id);
  if (it == waiters_.end()) return;  // admitted or cancelled meanwhile
  Waiter w = std::move(it->second);
  waiters_.erase(it);
  const std::int64_t held = in_flight_;
  lock.Unlock();
  w.grant(Refusal(held, w.bytes));
}

void RequestBudget::Cancel(WaiterId id, const Status& why) {
  MutexLock lock(mu_);
  auto it = waiters_.find(id);
  if (it == waiters_.end()) return;
  Waiter w = std::move(it->second);
  waiters_.erase(it);
  lock.Unlock();
  w.grant(why);
}

void RequestBudget::Release(std::int64_t bytes) {
  bool drained = false;
  std::vector<Grant> admitted;
  {
    MutexLock lock(mu_);
    in_flight_ -= bytes;
    for (auto it = waiters_.begin(); it != waiters_.end() && in_flight_ < capacity_;) {
      if (in_flight_ + it->second.bytes > capacity_) {
        ++it;
        continue;
      }
      Take(it->second.bytes);
      admitted.push_back(std::move(it->second.grant));
      it = waiters_.erase(it);
    }
    if (in_flight_ == 0) {
      drained = peak_since_drained_ >= burst_bytes_;
      peak_since_drained_ = 0;
    }
  }
  for (Grant& g : admitted) pool_->Post([g = std::move(g)] { g(Status::Ok()); });
  if (drained && on_drained_) on_drained_();
}

std::int64_t RequestBudget::in_flight() const {
  MutexLock lock(mu_);
  return in_flight_;
}

std::int64_t RequestBudget::waiting() const {
  MutexLock lock(mu_);
  return static_cast<std::int64_t>(waiters_.size());
}

std::string PeerWithoutPort(const std::string& peer) {
  const bool v4 = peer.rfind("ipv4:", 0) == 0, v6 = peer.rfind("ipv6:", 0) == 0;
  const std::size_t colon = peer.rfind(':');
  if ((!v4 && !v6) || colon == std::string::npos || colon <= 5) return peer;
  std::string host = peer.substr(0, colon);
  // An IPv6 address has colons of its own: the port follows its closing
  // bracket, written "]" or, URI-escaped, "%5D".
  if (v6 && !(host.ends_with("]") || host.ends_with("%5D") || host.ends_with("%5d"))) return peer;
  return host;
}

StatusOr<std::string> TenantFrom(const std::optional<std::string>& value, const std::string& tenant_key,
                                 const std::string& peer) {
  if (tenant_key.empty() || !value.has_value()) return peer;
  bool printable = !value->empty() && value->size() <= 128;
  for (const char c : *value) printable = printable && c >= 0x20 && c <= 0x7e;
  if (!printable) {
    return InvalidArgument("the metadata '" + tenant_key +
                           "' must be 1..128 bytes of printable ASCII (a tenant id); got " +
                           std::to_string(value->size()) + " bytes");
  }
  return "tenant:" + *value;
}

StatusOr<std::string> TenantOf(const grpc::ServerContextBase& ctx, const std::string& tenant_key) {
  std::optional<std::string> value;
  if (!tenant_key.empty()) {
    const auto& md = ctx.client_metadata();
    if (auto it = md.find(grpc::string_ref(tenant_key)); it != md.end()) {
      value = std::string(it->second.data(), it->second.size());
    }
  }
  return TenantFrom(value, tenant_key, PeerWithoutPort(ctx.peer()));
}

}  // namespace epd::internal
