// epd/core/cache_options.h: what an EmbeddingCache (epd/core/embedding_cache.h)
// is built with and what it hands on: the eviction policy, an entry's cost,
// the construction options, and the checks of byte counts and costs.
//
// Eviction policies (CacheOptions::eviction):
//   - kLru (the default): the least recently used entry goes first; the
//     engine reference's semantics, kept exactly (the parity tests).
//   - kGdsf, GreedyDual-Size-Frequency (L. Cherkasova, HP Labs HPL-98-69,
//     1998; Squid's `heap GDSF`): each entry has priority = clock +
//     frequency x cost / size, in seconds per byte, where cost is
//     EntryCost::seconds (the measured time to produce it; a put without one
//     charges nbytes x default_seconds_per_byte), size is max(nbytes, 1) and
//     frequency counts its references (a put is one, each hit or re-put one
//     more). Under GdsfFrequency::kHistory (the default) the count outlives
//     eviction: from the first eviction on, every reference is also recorded
//     in a TinyLFU-style history (epd/core/admission_filter.h: a doorkeeper
//     and a count-min sketch, halved every window of gdsf_history_window
//     references; auto: 30 x the entries held at the first eviction, at least
//     1024; Einziger et al., ACM TOS 2017), and the frequency is the larger of
//     the resident count and the history's estimate. kResident is
//     Cherkasova's rule: the count starts again at 1 on each re-entry. The
//     victim is the entry of lowest priority, ties to the oldest touch; the
//     clock then becomes max(clock, victim's priority), so the entries left
//     behind age without being touched. A put never evicts the key it puts
//     (Cao and Irani's rule): room is made for the newcomer, which is then
//     ranked with the clock its victims set. With refetch_seconds_per_byte
//     set (a tier above another), an entry of at most refetch_max_bytes is
//     ranked by nbytes x refetch_seconds_per_byte instead of its cost, since a
//     miss there costs only the copy back from the tier below.
//   - kAdaptive: the victim of LRU, of GDSF or of GDSF with probation
//     (CacheOptions::gdsf_probation), whichever policy a trio of online
//     miniature caches says currently saves the most encode seconds. Every
//     entry is kept in both orders (recency, and GDSF's priority with its
//     frequency, history and clock, exactly as under kGdsf); each eviction
//     takes the leader's victim; the clock moves only on a heap victim; an
//     entry is ranked with probation while that policy leads. The leader is
//     decided by epd/core/policy_duel.h: from the first eviction on, the keys
//     of a hash sample (rate R, at least 1/32, raised until R x the entries
//     then held is at least 64) go through three miniature caches of R x the
//     capacity, one per policy, each scoring the seconds of its hits with an
//     exponential decay; a policy leads while its score is strictly higher
//     than the leader's would be (GDSF leads before the first eviction and
//     on ties, then probation, then LRU). The miniatures follow Waldspurger et
//     al., "Cache Modeling and Optimization using Miniature Simulations"
//     (USENIX ATC 2017), which sizes and tunes caches from them; following the
//     better miniature is this project's rule. Why: GDSF wins where popularity
//     is skewed and lasting, LRU where reuse follows recency, as in multi-turn
//     chat, where each turn re-sends the image (docs/PLAN.md measures both).
//
// Thread safety: plain data and pure functions.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

#include "epd/core/status.h"
#include "epd/core/tenant_quota.h"

namespace epd {

// Which entry a full cache evicts (see the comment at the top).
enum class EvictionPolicy : std::uint8_t { kLru = 0, kGdsf = 1, kAdaptive = 2 };

inline std::string_view EvictionPolicyName(EvictionPolicy p) {
  switch (p) {
    case EvictionPolicy::kGdsf:
      return "gdsf";
    case EvictionPolicy::kAdaptive:
      return "adaptive";
    case EvictionPolicy::kLru:
      break;
  }
  return "lru";
}

// "lru", "gdsf" or "adaptive"; kInvalidArgument naming the text otherwise.
inline StatusOr<EvictionPolicy> ParseEvictionPolicy(std::string_view text) {
  if (text == "lru") return EvictionPolicy::kLru;
  if (text == "gdsf") return EvictionPolicy::kGdsf;
  if (text == "adaptive") return EvictionPolicy::kAdaptive;
  return Status(StatusCode::kInvalidArgument,
                "eviction must be lru, gdsf or adaptive, got '" + std::string(text) + "'");
}

// What producing an entry cost and how often it was referenced: GDSF's C and
// f. Plain data; every cache keeps it, kGdsf and kAdaptive order by it.
struct EntryCost {
  static constexpr double kUnmeasured = -1;
  // Seconds it took to produce the entry (decode, preprocessing and its share
  // of its tower batch), finite and >= 0; kUnmeasured: the cache charges
  // nbytes x CacheOptions::default_seconds_per_byte.
  double seconds = kUnmeasured;
  // References so far, >= 1; a tier hands it on when an entry moves.
  std::uint64_t frequency = 1;
  // The tenant the entry is charged to (epd/core/tenant_quota.h); read only
  // by a cache with tenant reservations, handed on by Pop and the costed
  // hook so that a demotion or promotion keeps the charge.
  TenantId tenant = kSharedTenant;
};

// Where GDSF takes an entry's frequency from (see the header comment).
enum class GdsfFrequency : std::uint8_t { kHistory = 0, kResident = 1 };

// Construction options of an EmbeddingCache; the defaults are the
// reference's cache.
struct CacheOptions {
  EvictionPolicy eviction = EvictionPolicy::kLru;
  // Seconds per byte charged to an entry put without a measured cost
  // (1e-9 s/B: about a GPU tower's rate for Qwen2.5-VL, ~7 ms for a 4 MB
  // entry). Under GDSF only its ratio to measured costs matters.
  double default_seconds_per_byte = 1e-9;
  // GDSF, for a tier above another: when >= 0, an entry of at most
  // refetch_max_bytes is ranked by nbytes x refetch_seconds_per_byte (the
  // copy back from the tier below) instead of its cost. < 0: off.
  double refetch_seconds_per_byte = -1;
  std::int64_t refetch_max_bytes = 0;
  // GDSF's frequency: kHistory (the default) remembers references across
  // evictions in an aged count-min sketch; kResident is Cherkasova's rule,
  // which counts only while the entry is held (see the header comment).
  GdsfFrequency gdsf_frequency = GdsfFrequency::kHistory;
  // Requests per aging window of the history (kHistory); 0: sized when the
  // cache first fills, to 30 x the entries it then holds, at least 1024.
  std::uint64_t gdsf_history_window = 0;
  // GDSF with probation: once the history exists (kHistory, from the first
  // eviction on), an entry of frequency 1 (a key not referenced in the
  // window before) is ranked at the clock alone, below every entry
  // referenced again, so a one-hit wonder displaces no entry that earned its
  // place; its next reference ranks it as GDSF does. This is W-TinyLFU's
  // admission (Einziger et al., ACM TOS 2017) in GDSF's terms, one of
  // kAdaptive's three experts (which sets it per miniature; the full cache
  // follows the duel, not this flag). Under kResident it never applies: a
  // re-entering key has frequency 1 there, however often it was seen.
  bool gdsf_probation = false;
};

// What a Pop() hands back: the value, the bytes it was charged, and its cost
// and frequency (for a tier below).
template <typename V>
struct PoppedEntry {
  V value;
  std::int64_t nbytes;
  EntryCost cost{};
};

// The largest capacity or charge, in bytes, an EmbeddingCache accepts:
// 2^62 - 1, so that a full cache plus one more charge (< 2^63) always fits the
// int64 byte counter (the reference's Python ints have no bound; no memory
// comes near this one).
inline constexpr std::int64_t kMaxCacheBytes = (std::int64_t{1} << 62) - 1;

// a + b for a byte count that only grows (bytes hit, bytes written, summed
// over accesses, not bounded by a capacity): stops at INT64_MAX instead of
// wrapping, which a signed sum may not do (entries of 2^61 - 1 bytes pass it
// in five accesses). Exact below it. REQUIRES: a, b >= 0.
inline constexpr std::int64_t AddBytesSaturating(std::int64_t a, std::int64_t b) {
  std::int64_t sum = 0;
  return __builtin_add_overflow(a, b, &sum) ? INT64_MAX : sum;
}

// The error for a byte count `name` (a capacity or a charge) outside
// [0, kMaxCacheBytes]; `got` is its decimal text, so that a caller holding a
// wider integer (Python's) reports it exactly.
inline Status CacheBytesOutOfRange(const std::string& name, bool negative, const std::string& got) {
  return Status(StatusCode::kInvalidArgument,
                negative ? name + " must be >= 0, got " + got
                         : name + " must be <= " + std::to_string(kMaxCacheBytes) + " (2^62 - 1), got " + got);
}

// Throws epd::Error(kInvalidArgument) unless 0 <= bytes <= kMaxCacheBytes.
inline void CheckCacheBytes(const std::string& name, std::int64_t bytes) {
  if (bytes < 0 || bytes > kMaxCacheBytes) throw Error(CacheBytesOutOfRange(name, bytes < 0, std::to_string(bytes)));
}

// Throws epd::Error(kInvalidArgument) unless `cost` is kUnmeasured or finite
// and >= 0, with frequency >= 1.
inline void CheckEntryCost(const EntryCost& cost) {
  if (cost.seconds != EntryCost::kUnmeasured && !(std::isfinite(cost.seconds) && cost.seconds >= 0)) {
    throw Error(Status(StatusCode::kInvalidArgument,
                       "cost seconds must be finite and >= 0 (or unmeasured), got " + std::to_string(cost.seconds)));
  }
  if (cost.frequency < 1) throw Error(Status(StatusCode::kInvalidArgument, "cost frequency must be >= 1, got 0"));
}

// Throws epd::Error(kInvalidArgument) unless the per-byte rates are usable.
inline void CheckCacheOptions(const CacheOptions& o) {
  if (!(std::isfinite(o.default_seconds_per_byte) && o.default_seconds_per_byte >= 0)) {
    throw Error(Status(StatusCode::kInvalidArgument, "default_seconds_per_byte must be finite and >= 0, got " +
                                                         std::to_string(o.default_seconds_per_byte)));
  }
  if (!std::isfinite(o.refetch_seconds_per_byte)) {
    throw Error(Status(StatusCode::kInvalidArgument, "refetch_seconds_per_byte must be finite"));
  }
}

}  // namespace epd
