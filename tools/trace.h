// tools/trace.h: replay traces for `epd-encode replay`: the JSON Lines trace
// format, and a deterministic generator over a directory of images.
//
// Trace format (JSON Lines, one request per line; blank lines are skipped):
//   {"id": "r1", "arrival_ms": 12.5, "images": ["a.jpg", "sub/b.png"]}
//   id          string, unique within the trace [default "line-<N>"]
//   arrival_ms  number >= 0 and below kMaxArrivalMs, when the request
//               arrives, relative to the start of the replay [default 0]
//   images      array of image paths; relative ones are resolved against
//               the --images directory (or the working directory without it)
//   videos      array of video paths (MP4, WebM, ...), resolved likewise;
//               each is one video item after the images (docs/VIDEO.md).
//               A request needs at least one image or video.
// Errors name the line: "trace.jsonl:7: images must be a non-empty array of strings".
//
// Generator (GenerateTrace), a pure function of its arguments:
//   requests   N, ids "gen-000001" ... in arrival order
//   images     each request holds k images, k uniform in [min_images,
//              max_images] (1-4); each image drawn independently (so a request
//              may repeat one) from a Zipf(s) law over the sorted image list:
//              P(rank r) proportional to 1 / r^s, rank 1 = first file name.
//              s = 0 is uniform; larger s repeats the head more.
//   arrivals   arrival_ms = i * 1000 / rate_per_s (evenly spaced)
//   random     SplitMix64 seeded with `seed` (Steele, Lea, Flood: "Fast
//              splittable pseudorandom number generators", OOPSLA 2014), not
//              <random>'s distributions, whose output differs between
//              standard libraries; so a seed gives the same trace everywhere.
//
// Thread safety: pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cli_util.h"
#include "epd/core/status.h"

namespace epd::cli {

// The bound on arrival_ms: replay --realtime waits until start + arrival_ms
// on steady_clock, in int64 nanoseconds (at most 9.22e12 ms); 9e12 leaves
// room for a start of up to 7 years of uptime.
inline constexpr std::int64_t kMaxArrivalMs = 9'000'000'000'000;

struct TraceRequest {
  std::string id;
  double arrival_ms = 0;
  std::vector<std::string> images;
  std::vector<std::string> videos;

  // Every item's path, in item order: the images, then the videos.
  std::vector<std::string> paths() const {
    std::vector<std::string> all = images;
    all.insert(all.end(), videos.begin(), videos.end());
    return all;
  }
  bool is_video(std::size_t item) const { return item >= images.size(); }
};

// Parses a JSON Lines trace; `name` prefixes error messages.
StatusOr<std::vector<TraceRequest>> ParseTrace(const std::string& text, const std::string& name);
// Reads `path` (a regular file of at most max_bytes: ReadRegularFile) and
// parses it; kInvalidArgument "cannot read trace PATH: why" otherwise.
StatusOr<std::vector<TraceRequest>> ReadTrace(const std::string& path,
                                              std::int64_t max_bytes = kDefaultMaxRequestBytes);

// The trace as JSON Lines, readable by ParseTrace.
std::string TraceToJsonLines(const std::vector<TraceRequest>& trace);

// Regular files under `dir` (not recursive) ending in .jpg, .jpeg, .png,
// .webp, .gif or .bmp (any case): their file names (paths relative to `dir`),
// sorted. kInvalidArgument when `dir` is not a directory or holds no image.
StatusOr<std::vector<std::string>> ListImages(const std::string& dir);

struct GeneratorOptions {
  std::int64_t requests = 200;
  double zipf_s = 1.0;
  std::uint64_t seed = 1;
  double rate_per_s = 100;
  int min_images = 1;
  int max_images = 4;
};

// See the header comment. REQUIRES: images non-empty, requests >= 0,
// zipf_s >= 0, rate_per_s > 0, 1 <= min_images <= max_images.
std::vector<TraceRequest> GenerateTrace(const std::vector<std::string>& images, const GeneratorOptions& options);

}  // namespace epd::cli
