// src/plan/plan_serve_args.cc: see epd/plan/plan_serve_args.h.
#include "epd/plan/plan_serve_args.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace epd::plan {

std::int64_t MibAtLeast(double bytes) {
  if (!std::isfinite(bytes) || bytes <= 0) return 0;
  // The worker takes at most kMaxCacheBytes >> 20 MiB (tools/worker_flags.cc).
  const double mib = std::ceil(bytes / static_cast<double>(1 << 20));
  return std::min(static_cast<std::int64_t>(std::min(mib, 0x1p62)), kMaxCacheBytes >> 20);
}

std::string ServeArgs(double l1_bytes, double l2_bytes, EvictionPolicy eviction, L1Admission admission,
                      std::uint64_t window) {
  std::string s = fmt::format("--eviction {}", EvictionPolicyName(eviction));
  if (admission == L1Admission::kDoorkeeper) {
    s += fmt::format(" --l1-admission doorkeeper --l1-admission-window {}", window);
  }
  s += fmt::format(" --cache-mb {} --host-cache-mb {}", MibAtLeast(l1_bytes), MibAtLeast(l2_bytes));
  return s;
}

}  // namespace epd::plan
