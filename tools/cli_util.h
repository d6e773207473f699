// tools/cli_util.h: small helpers the epd-encode subcommands share, one home
// each: reading a whole file (any, or only a regular one under a size
// limit), the SplitMix64 generator, nearest-rank percentiles, and the
// process's malloc tuning.
//
// Thread safety: ReadFile, ReadRegularFile and Percentile are thread-safe; a SplitMix64 is
// not (one per thread); TuneMalloc is process-wide (call it once, before
// starting threads).
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "epd/core/status.h"

namespace epd::cli {

// The whole file as bytes; kNotFound ("cannot open PATH") when it cannot be
// opened.
StatusOr<std::string> ReadFile(const std::string& path);

// The largest request the server takes by default (ServerOptions::
// max_request_bytes, `serve --max-request-mb 64`), the limit `replay` puts
// on each file it reads.
inline constexpr std::int64_t kDefaultMaxRequestBytes = std::int64_t{64} << 20;

// The whole of `path` when it is a regular file of at most max_bytes bytes.
// Nothing else is read: the open does not block (a FIFO with no writer
// would hang a plain open), and /dev/zero or a directory is refused before
// a byte is read. Errors: kNotFound "cannot open PATH: <errno text>";
// kInvalidArgument naming PATH and what it is (a FIFO, a character device,
// a directory, ...) or its size against max_bytes. Cost: one read of the
// file; memory its size.
StatusOr<std::string> ReadRegularFile(const std::string& path, std::int64_t max_bytes);
// The same with no limit on the size (a trace: what matters is that it ends).
inline StatusOr<std::string> ReadRegularFile(const std::string& path) {
  return ReadRegularFile(path, std::numeric_limits<std::int64_t>::max());
}

// SplitMix64 (Steele, Lea, Flood: "Fast splittable pseudorandom number
// generators", OOPSLA 2014): one 64-bit state; each step adds the golden
// gamma 0x9e3779b97f4a7c15, then mixes with two xor-shift-multiply rounds.
// The same seed gives the same sequence on every platform, which traces and
// benchmarks rely on.
class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}
  std::uint64_t Next() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) from the top 53 bits.
  double Unit() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

 private:
  std::uint64_t state_;
};

// Nearest-rank percentile: the smallest value with at least a fraction q of
// the samples at or below it. 0 when `sorted` is empty. REQUIRES: `sorted`
// ascending, 0 <= q <= 1. O(1).
double Percentile(const std::vector<double>& sorted, double q);

// What the process spends its heap on, for TuneMalloc.
enum class MallocUse {
  // Embedding-sized messages only (client, bench-server): ~1-2 MB blocks.
  kMessages,
  // A vision tower too (serve, replay): tens of MB of temporaries per forward.
  kTower,
};

// The one owner of the process's malloc tuning (glibc only; a no-op
// elsewhere): raises the mmap threshold to 32 MiB, the largest glibc accepts
// on 64-bit, and the trim threshold to 64 MiB (kMessages) or 256 MiB (kTower),
// so freed blocks are reused instead of being unmapped or trimmed and
// page-faulted back in. Measured: hit-only serving throughput about doubled
// (docs/BENCHMARKS-server.md); the default tower's forward went from 112 to
// 58-75 ms (TorchTowerOptions::tune_malloc, which the CLI therefore turns
// off so that this stays the only setting).
void TuneMalloc(MallocUse use);

// Hands free heap pages back to the OS (glibc's malloc_trim(0), which also
// trims the arenas of other threads); a no-op elsewhere. Costs a walk of the
// heap (milliseconds for gigabytes), so call it after a burst, not per
// request: serve passes it as ServerOptions::on_requests_drained.
void ReleaseFreeMemory();

}  // namespace epd::cli
