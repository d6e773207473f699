// epd/core/admission_filter.h: a TinyLFU-style admission filter, a doorkeeper
// Bloom filter in front of a count-min sketch, aged by windows.
//
// It answers "how often was this key requested lately?" in a few bytes per
// request, so that a cache tier can keep one-hit wonders out (G. Einziger,
// R. Friedman, B. Manes, "TinyLFU: A Highly Efficient Cache Admission
// Policy", ACM TOS 2017; the doorkeeper is their section 4.2).
//   - Record(h) counts one request for the key whose 64-bit hash is h and
//     returns its estimated requests in the current window, this one
//     included: a key's first request sets its doorkeeper bits (estimate 1,
//     nothing in the sketch); each later one increments the sketch (estimate
//     1 + sketch). Estimate(h) reads the same number without counting.
//   - After `window` requests the window ends: the doorkeeper is cleared and
//     every sketch counter halved (TinyLFU's reset), so counts age and a key
//     must be requested again to pass.
//   - Estimates never undercount within a window; they overcount only by
//     hash collisions: the doorkeeper's false-positive rate at a full window
//     of distinct keys is about (1 - e^(-k/b))^k with b = bits_per_request and
//     k = 6 probes: 0.09% at the default b = 16. The sketch has 4 rows of
//     8-bit saturating counters (255), width the power of two >= window.
// Tiered use (epd/core/tiered_cache.h, L1Admission::kDoorkeeper): an entry
// enters L1 once Estimate >= 2, i.e. on its second request within a window.
//
// Hashes: h should be well mixed in its low bits (a std::hash of a string or
// ContentKeyHash); the filter remixes it with the SplitMix64 finaliser
// (Steele, Lea, Flood, OOPSLA 2014) and derives the probes by double hashing
// (Kirsch and Mitzenmacher, "Less Hashing, Same Performance", ESA 2006).
//
// Complexity: Record and Estimate O(1): 6 bit probes and 4 counters; a
// window's end costs O(memory) once per `window` requests (amortised O(1)).
// Memory: window x bits_per_request / 8 bytes of doorkeeper plus 4 x width
// bytes of sketch (window 65536: 128 KiB + 256 KiB).
// Thread safety: thread-compatible.
//
// Example:
//   AdmissionFilter f({.window = 1 << 16});
//   f.Record(h);        // 1: first request
//   f.Record(h);        // 2: admit now
#pragma once

#include <cstdint>
#include <vector>

namespace epd {

struct AdmissionFilterOptions {
  // Requests per window, >= 1. Size it to several times the entries the
  // guarded tier holds (Caffeine uses 10x); a key must repeat within it.
  std::uint64_t window = std::uint64_t{1} << 16;
  // Doorkeeper bits per windowed request, >= 1 (16: 0.09% false positives).
  int bits_per_request = 16;
};

class AdmissionFilter {
 public:
  // Throws epd::Error(kInvalidArgument) for window < 1, bits_per_request < 1,
  // or a filter over 2^40 bits.
  explicit AdmissionFilter(const AdmissionFilterOptions& options = {});

  // Counts a request for hash h; returns its estimate in this window (>= 1).
  std::uint32_t Record(std::uint64_t h);
  // The estimate without counting (0: not requested in this window).
  std::uint32_t Estimate(std::uint64_t h) const;

  std::uint64_t window() const { return options_.window; }
  // Windows ended so far.
  std::uint64_t resets() const { return resets_; }
  std::size_t memory_bytes() const { return bits_.capacity() * 8 + sketch_.capacity(); }

 private:
  static constexpr int kProbes = 6;
  static constexpr int kRows = 4;

  bool InDoorkeeper(std::uint64_t m) const;
  std::uint32_t SketchMin(std::uint64_t m) const;
  void EndWindow();

  AdmissionFilterOptions options_;
  std::uint64_t bit_mask_;
  std::uint64_t width_mask_;
  std::vector<std::uint64_t> bits_;
  std::vector<std::uint8_t> sketch_;  // kRows rows of width_mask_ + 1
  std::uint64_t in_window_ = 0;
  std::uint64_t resets_ = 0;
};

}  // namespace epd
