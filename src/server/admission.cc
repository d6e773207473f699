// See admission.h. The budget is a plain mutex + condition variable: calls
// are few (one per request) and each holds it for a few instructions, so a
// lock-free counter would buy nothing, and waiting needs the condition
// variable anyway. Waiters are not queued first-come-first-served: whichever
// fits when bytes come back goes first (a small call may pass a large one),
// which keeps small requests flowing during a burst of large ones.
#include "admission.h"

#include <algorithm>

#include <grpcpp/server_context.h>

#include <cstdio>
#include <utility>

namespace epd::internal {

RequestBudget::RequestBudget(std::int64_t capacity_bytes, std::int64_t burst_bytes, std::function<void()> on_drained)
    : capacity_(capacity_bytes), burst_bytes_(burst_bytes), on_drained_(std::move(on_drained)) {}

Status RequestBudget::Acquire(std::int64_t bytes, Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_until(lock, deadline, [&] { return in_flight_ + bytes <= capacity_; })) {
    const std::int64_t held = in_flight_;
    lock.unlock();
    constexpr double kMiB = 1 << 20;
    char text[200];
    std::snprintf(text, sizeof(text), "%.1f MiB of requests are in flight; this one (%.1f MiB) would pass the ",
                  static_cast<double>(held) / kMiB, static_cast<double>(bytes) / kMiB);
    char cap[64];
    std::snprintf(cap, sizeof(cap), "%.1f MiB", static_cast<double>(capacity_) / kMiB);
    return ResourceExhausted(std::string(text) + "in-flight request budget of " + cap +
                             " (--max-inflight-request-mb); retry with backoff");
  }
  in_flight_ += bytes;
  peak_since_drained_ = std::max(peak_since_drained_, in_flight_);
  return Status::Ok();
}

void RequestBudget::Release(std::int64_t bytes) {
  bool drained = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    in_flight_ -= bytes;
    if (in_flight_ == 0) {
      drained = peak_since_drained_ >= burst_bytes_;
      peak_since_drained_ = 0;
    }
  }
  cv_.notify_all();
  if (drained && on_drained_) on_drained_();
}

std::int64_t RequestBudget::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_flight_;
}

std::string PeerWithoutPort(const std::string& peer) {
  const bool v4 = peer.rfind("ipv4:", 0) == 0, v6 = peer.rfind("ipv6:", 0) == 0;
  const std::size_t colon = peer.rfind(':');
  if ((!v4 && !v6) || colon == std::string::npos || colon <= 5) return peer;
  const std::string host = peer.substr(0, colon);
  // An IPv6 address has colons of its own: the port follows its closing
  // bracket, written "]" or, URI-escaped, "%5D".
  if (v6 && !(host.ends_with("]") || host.ends_with("%5D") || host.ends_with("%5d"))) return peer;
  return host;
}

StatusOr<std::string> TenantOf(const grpc::ServerContextBase& ctx, const std::string& tenant_key) {
  if (!tenant_key.empty()) {
    const auto& md = ctx.client_metadata();
    if (auto it = md.find(grpc::string_ref(tenant_key)); it != md.end()) {
      const std::string value(it->second.data(), it->second.size());
      bool printable = !value.empty() && value.size() <= 128;
      for (const char c : value) printable = printable && c >= 0x20 && c <= 0x7e;
      if (!printable) {
        return InvalidArgument("the metadata '" + tenant_key +
                               "' must be 1..128 bytes of printable ASCII (a tenant id); got " +
                               std::to_string(value.size()) + " bytes");
      }
      return "tenant:" + value;
    }
  }
  return PeerWithoutPort(ctx.peer());
}

}  // namespace epd::internal
