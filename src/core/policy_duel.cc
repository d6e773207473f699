// The duel of epd/core/policy_duel.h: two miniature EmbeddingCaches, one LRU
// and one GDSF, over a hash sample of the keys.
#include "epd/core/policy_duel.h"

#include <algorithm>
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

CacheOptions MiniOptions(const CacheOptions& full, EvictionPolicy policy, double rate) {
  // Entries keep their full sizes in a miniature (only keys are sampled), so
  // refetch_max_bytes, a bound on an entry's size, stays as it is.
  CacheOptions o = full;
  o.eviction = policy;
  o.refetch_seconds_per_byte = -1;  // the seconds fed are the full cache's rank seconds already
  if (o.gdsf_history_window > 0) {
    o.gdsf_history_window = std::max<std::uint64_t>(
        1, static_cast<std::uint64_t>(std::floor(static_cast<double>(o.gdsf_history_window) * rate)));
  }
  return o;
}

}  // namespace

struct PolicyDuel::Minis {
  DuelMini lru;
  DuelMini gdsf;
  Minis(const CacheOptions& full, std::int64_t capacity, double rate)
      : lru(capacity, MiniOptions(full, EvictionPolicy::kLru, rate)),
        gdsf(capacity, MiniOptions(full, EvictionPolicy::kGdsf, rate)) {}
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
  lru_score_ *= decay_;
  gdsf_score_ *= decay_;
  for (DuelMini* m : {&minis_->lru, &minis_->gdsf}) {
    if (m->Get(h).has_value()) {
      (m == &minis_->lru ? lru_score_ : gdsf_score_) += m->CostOf(h)->seconds;
    } else if (full_hit) {
      m->Put(h, 0, nbytes, EntryCost{seconds});
    }
  }
  Decide();
}

void PolicyDuel::OnPut(std::uint64_t h, std::int64_t nbytes, double seconds, std::uint64_t frequency) {
  if (!std::isfinite(seconds)) return;
  for (DuelMini* m : {&minis_->lru, &minis_->gdsf}) {
    if (!m->Contains(h)) m->Put(h, 0, nbytes, EntryCost{seconds, frequency});
  }
}

void PolicyDuel::Decide() {
  const bool lru = lru_score_ > gdsf_score_;
  if (lru != lru_leads_) {
    lru_leads_ = lru;
    ++switches_;
  }
}

std::size_t PolicyDuel::memory_bytes() const {
  return sizeof(*this) + sizeof(Minis) + minis_->lru.bookkeeping_bytes() + minis_->gdsf.bookkeeping_bytes() +
         (minis_->lru.size() + minis_->gdsf.size()) * sizeof(std::uint64_t);
}

}  // namespace epd
