// tools/cache_trace.h: the cache trace format `epd-encode plan` reads: one
// item request per line with its key, its entry's size and its encode cost,
// so traces can be exchanged and replayed without images (docs/PLAN.md).
//
// JSON Lines; blank lines are skipped; fields other than these are ignored:
//   {"key": "6f1c...", "bytes": 4587520, "cost_s": 0.0123, "t_ms": 12.5, "tenant": "a"}
//   key      non-empty string: the content key (64 hex digits) or any id;
//            equal strings are the same entry
//   bytes    integer, 0 <= bytes <= 2^62 - 1: the entry's charge
//   cost_s   number >= 0: encode seconds a miss costs (measured, or
//            modelled); optional: bytes x default_seconds_per_byte
//   t_ms     number >= 0, optional: arrival time (carried, not used)
//   tenant   string, optional (carried, not used)
// A line with a non-empty string "error" and no "bytes" is skipped (and
// counted in CacheTraceOptions::skipped): a replay manifest (`replay --out`,
// tools/replay_manifest.h) is a cache trace with the replay's measured
// costs, and its failed items, which carry no bytes, cached nothing. Any
// other line with "error" is read as usual.
// Errors name the file and line: "t.jsonl:7: bytes must be an integer >= 0";
// also the line at which the encode seconds summed so far stop being finite
// (each cost_s is finite, but two near 1.8e308 are not).
// A line with "images" or "videos" is a replay trace (docs/REPLAY.md): the
// error says to give --images and --model so plan can derive keys, sizes
// and costs.
//
// Keys become 64-bit hashes (KeyHash: FNV-1a, then the SplitMix64
// finaliser), the same on every machine; two distinct keys collide with
// probability about n^2 / 2^65 (3 x 10^-6 for 10^7 keys).
//
// Thread safety: pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "epd/core/status.h"
#include "epd/plan/miss_ratio_curve.h"

namespace epd::cli {

std::uint64_t KeyHash(std::string_view key);

struct CacheTraceOptions {
  double default_seconds_per_byte = 1e-9;  // for lines without cost_s
  // Called every 65536 lines with (bytes read, bytes total), for a progress bar.
  std::function<void(std::size_t, std::size_t)> progress;
  // When set, incremented for each failed-item line skipped (see above).
  std::size_t* skipped = nullptr;
};

// Parses the text; `name` prefixes error messages.
StatusOr<std::vector<CacheAccess>> ParseCacheTrace(std::string_view text, const std::string& name,
                                                   const CacheTraceOptions& options = {});
// Reads and parses a file; kInvalidArgument when it cannot be read.
StatusOr<std::vector<CacheAccess>> ReadCacheTrace(const std::string& path, const CacheTraceOptions& options = {});

// Whether the first non-blank line of `text` is a replay trace line (has
// "images" or "videos").
bool LooksLikeReplayTrace(std::string_view text);

}  // namespace epd::cli
