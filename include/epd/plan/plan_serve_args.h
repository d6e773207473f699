// epd/plan/plan_serve_args.h: the `epd-encode serve` (and `replay`) flags that
// run one of plan's sizing rows, so that a plan is not read off in one unit
// and typed back in another.
//
// plan prints its sizes in decimal units (1 GB = 10^9 bytes), while the
// worker's --cache-mb and --host-cache-mb count MiB (2^20 bytes; the worker
// multiplies by 1 << 20, tools/worker_flags.cc): a plan's "8.29 GB" typed
// back as --host-cache-mb 8290 would be 8.69 GB. plan also sizes for
// --eviction gdsf by default, where the worker's default is lru; the flags
// carry the policy (and the doorkeeper's window), so a server run with them
// keeps what the plan was sized for.
//
// L3 has no flag here: its size is Redis's `maxmemory`, set on the Redis
// server (docs/L3.md; docs/PLAN.md, "What Redis charges a value").
#pragma once

#include <cstdint>
#include <string>

#include "epd/core/cache_options.h"
#include "epd/core/tiered_cache.h"

namespace epd::plan {

// The whole MiB at or above `bytes` (>= 0): the smallest --cache-mb /
// --host-cache-mb that holds them, at most the kMaxCacheBytes >> 20 the
// worker takes. Bytes under 0 or not finite give 0.
std::int64_t MibAtLeast(double bytes);

// "--eviction E [--l1-admission doorkeeper --l1-admission-window W]
// --cache-mb A --host-cache-mb B" for a row whose L1 and L2 are `l1_bytes`
// and `l2_bytes`; `window` is named only with the doorkeeper. Pure; O(1).
std::string ServeArgs(double l1_bytes, double l2_bytes, EvictionPolicy eviction, L1Admission admission,
                      std::uint64_t window);

}  // namespace epd::plan
