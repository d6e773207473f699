// epd/core/policy_duel.h: which of LRU, GDSF and GDSF with probation an
// EvictionPolicy::kAdaptive cache (epd/core/embedding_cache.h) takes its next
// victim from.
//
// Three miniature caches see the same requests for a hash sample of the keys:
// one evicts by LRU, one by GDSF, one by GDSF with probation
// (CacheOptions::gdsf_probation), each with R x the full cache's capacity
// (MiniSim: Waldspurger et al., "Cache Modeling and Optimization using
// Miniature Simulations", USENIX ATC 2017, section 3: a sample at rate R
// through a cache of R x the size behaves as the full cache). Each keeps a
// score, the encode seconds of its hits with an exponential decay. The leader
// is GDSF, unless probation's score is strictly higher, unless LRU's is
// strictly higher than that (so GDSF leads at the start and on ties).
// Following the best miniature is this project's rule.
//
// The numbers, fixed when the duel starts (at the full cache's first eviction,
// holding n entries):
//   rate R      the smallest power of two >= 64 / n, clamped to [1/32, 1]: the
//               miniatures hold about 64 entries at least (as MiniSim's own
//               floor) and about 1/32 of the keys on large caches;
//   sample      a key whose 64-bit hash h has SplitMix64(h) < R x 2^64;
//   capacity    floor(R x the full capacity) bytes each (capacity >> k); the full cache's
//               CacheOptions otherwise (its GDSF history window, if set, x R;
//               no refetch rate, since the seconds fed are already the
//               rank's);
//   decay       the three scores are multiplied by 0.5^(1 / H) at each sampled
//               request, H = max(64, 4 x R x n) sampled requests: about four
//               turnovers of the miniatures' contents.
//
// Feeding (what the full cache calls, for sampled keys only). `seconds` is
// what a hit on the entry saves in the full cache, the cost GDSF ranks it by
// there: its encode cost, or in a tier above another its refetch cost
// (CacheOptions::refetch_seconds_per_byte); the miniatures rank and score by
// it as given. A non-finite `seconds` is not fed (nothing is put).
//   OnGet(h, hit, nbytes, seconds): a request (a Get, or a tier above taking
//     the entry up: EmbeddingCache::PopRequested). Each miniature, in the
//     order LRU, GDSF, probation, looks h up;
//     a hit adds its stored seconds to that miniature's score; a miss where
//     the full cache hit puts h in with (nbytes, seconds) and frequency 1,
//     since the full cache knows them; where both missed, the full cache's
//     Put that follows does it.
//   OnPut(h, nbytes, seconds, frequency): a Put. Each miniature not holding h
//     puts it, with the frequency the put carries (a promotion's, from the
//     tier below).
//
// Memory: three EmbeddingCache<uint64_t, char> of about R x n entries, about
// 150 bytes each with GDSF's history (memory_bytes() counts their
// bookkeeping, spare capacity included, and their keys).
// Limits: the miniatures hold no tenant reservations; an entry larger than
// R x the capacity never enters them, so it scores for no policy; a put
// of a key a miniature holds leaves its stored cost as it was. Time: a sampled call costs up to three
// miniature operations, O(log n); an unsampled call costs one hash mix.
// Deterministic: the same calls give the same leader wherever the full
// cache's Hash gives the same values (ContentKeyHash does; std::hash of a
// string may differ between standard libraries), so tensor-parallel ranks
// that see the same requests evict the same entries.
// Thread safety: thread-compatible, as the cache that owns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "epd/core/cache_options.h"

namespace epd {

class PolicyDuel {
 public:
  enum class Leader : std::uint8_t { kGdsf = 0, kProbation = 1, kLru = 2 };

  // `options` are the full cache's; `capacity_bytes` its capacity; `entries`
  // the entries it holds at its first eviction (>= 1).
  PolicyDuel(const CacheOptions& options, std::int64_t capacity_bytes, std::size_t entries);
  ~PolicyDuel();
  PolicyDuel(PolicyDuel&&) noexcept;
  PolicyDuel& operator=(PolicyDuel&&) noexcept;
  PolicyDuel(const PolicyDuel&) = delete;
  PolicyDuel& operator=(const PolicyDuel&) = delete;

  // Whether the key of hash `h` is in the sample.
  bool Sampled(std::uint64_t h) const { return all_ || Mix(h) < threshold_; }

  // See the header comment; call only for sampled keys.
  void OnGet(std::uint64_t h, bool full_hit, std::int64_t nbytes, double seconds);
  void OnPut(std::uint64_t h, std::int64_t nbytes, double seconds, std::uint64_t frequency);

  Leader leader() const { return leader_; }
  bool lru_leads() const { return leader_ == Leader::kLru; }
  bool probation_leads() const { return leader_ == Leader::kProbation; }
  double rate() const { return rate_; }
  double lru_score() const { return lru_score_; }
  double gdsf_score() const { return gdsf_score_; }
  double probation_score() const { return probation_score_; }
  // Times the leader changed.
  std::uint64_t switches() const { return switches_; }
  std::size_t memory_bytes() const;

  // SplitMix64's finaliser (Steele et al., OOPSLA 2014), the sampling hash.
  static std::uint64_t Mix(std::uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
  }

 private:
  struct Minis;
  void Decide();

  std::unique_ptr<Minis> minis_;
  double rate_ = 1;
  std::uint64_t threshold_ = 0;  // R x 2^64, when R < 1
  bool all_ = true;              // R = 1: every key
  double decay_ = 1;
  double lru_score_ = 0;
  double gdsf_score_ = 0;
  double probation_score_ = 0;
  Leader leader_ = Leader::kGdsf;
  std::uint64_t switches_ = 0;
};

}  // namespace epd
