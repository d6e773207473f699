// The duel of epd/core/policy_duel.h: three miniature EmbeddingCaches (LRU,
// GDSF, GDSF with probation) over a hash sample of the keys.
#include "epd/core/policy_duel.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "epd/core/embedding_cache.h"

namespace epd {

// Miniature entries are keyed by the full key's 64-bit hash, already mixed
// well enough by the caller's hash to serve as its own.
struct DuelKeyHash {
  std::size_t operator()(std::uint64_t h) const { return static_cast<std::size_t>(h); }
};
using DuelMini = EmbeddingCache<std::uint64_t, char, DuelKeyHash>;

namespace {

constexpr int kMaxRateShift = 5;  // R >= 1/32
constexpr std::size_t kMinEntries = 64;
constexpr double kTurnovers = 4;

CacheOptions MiniOptions(const CacheOptions& full, EvictionPolicy policy, bool probation, double rate) {
  // Entries keep their full sizes in a miniature (only keys are sampled), so
  // refetch_max_bytes, a bound on an entry's size, stays as it is.
  CacheOptions o = full;
  o.eviction = policy;
  o.gdsf_probation = probation;
  o.refetch_seconds_per_byte = -1;  // the seconds fed are the full cache's rank seconds already
  if (o.gdsf_history_window > 0) {
    o.gdsf_history_window = std::max<std::uint64_t>(
        1, static_cast<std::uint64_t>(std::floor(static_cast<double>(o.gdsf_history_window) * rate)));
  }
  return o;
}

}  // namespace

// The three miniatures, in the order they are fed: LRU, GDSF, probation.
struct PolicyDuel::Minis {
  std::array<DuelMini, 3> caches;
  Minis(const CacheOptions& full, std::int64_t capacity, double rate)
      : caches{DuelMini(capacity, MiniOptions(full, EvictionPolicy::kLru, false, rate)),
               DuelMini(capacity, MiniOptions(full, EvictionPolicy::kGdsf, false, rate)),
               DuelMini(capacity, MiniOptions(full, EvictionPolicy::kGdsf, true, rate))} {}
};

PolicyDuel::PolicyDuel(const CacheOptions& options, std::int64_t capacity_bytes, std::size_t entries) {
  // R = 2^-k: the smallest power of two >= 64 / n within [1/32, 1], in
  // integers, so that the rate, the threshold and the capacity are exact.
  const std::size_t n = std::max<std::size_t>(entries, 1);
  int k = 0;
  while (k < kMaxRateShift && n >= (kMinEntries << (k + 1))) ++k;
  rate_ = std::ldexp(1.0, -k);
  all_ = k == 0;
  threshold_ = all_ ? 0 : std::uint64_t{1} << (64 - k);
  const double half_life = std::max(static_cast<double>(kMinEntries), kTurnovers * rate_ * static_cast<double>(n));
  decay_ = std::pow(0.5, 1.0 / half_life);
  minis_ = std::make_unique<Minis>(options, capacity_bytes >> k, rate_);
}

PolicyDuel::~PolicyDuel() = default;
PolicyDuel::PolicyDuel(PolicyDuel&&) noexcept = default;
PolicyDuel& PolicyDuel::operator=(PolicyDuel&&) noexcept = default;

void PolicyDuel::OnGet(std::uint64_t h, bool full_hit, std::int64_t nbytes, double seconds) {
  if (!std::isfinite(seconds)) full_hit = false;  // nothing to put: see the header
  double* scores[] = {&lru_score_, &gdsf_score_, &probation_score_};
  for (double* score : scores) *score *= decay_;
  for (std::size_t i = 0; i < minis_->caches.size(); ++i) {
    DuelMini& m = minis_->caches[i];
    if (m.Get(h).has_value()) {
      *scores[i] += m.CostOf(h)->seconds;
    } else if (full_hit) {
      m.Put(h, 0, nbytes, EntryCost{seconds});
    }
  }
  Decide();
}

void PolicyDuel::OnPut(std::uint64_t h, std::int64_t nbytes, double seconds, std::uint64_t frequency) {
  if (!std::isfinite(seconds)) return;
  for (DuelMini& m : minis_->caches) {
    if (!m.Contains(h)) m.Put(h, 0, nbytes, EntryCost{seconds, frequency});
  }
}

void PolicyDuel::Decide() {
  Leader best = Leader::kGdsf;
  double best_score = gdsf_score_;
  if (probation_score_ > best_score) {
    best = Leader::kProbation;
    best_score = probation_score_;
  }
  if (lru_score_ > best_score) best = Leader::kLru;
  if (best != leader_) {
    leader_ = best;
    ++switches_;
  }
}

std::size_t PolicyDuel::memory_bytes() const {
  std::size_t n = sizeof(*this) + sizeof(Minis);
  for (const DuelMini& m : minis_->caches) n += m.bookkeeping_bytes() + m.size() * sizeof(std::uint64_t);
  return n;
}

}  // namespace epd
