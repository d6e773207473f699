// epd/core/internal/any_policy.h (internal): the policy an EmbeddingCache
// holds, as a value: one of LRU, GDSF, adaptive, or one of them partitioned by
// tenant (epd/core/internal/cache_policy.h states the calls).
//
// MakePolicy chooses from CacheOptions::eviction; Reserve switches a policy P
// to TenantPartition<P> at the first reservation and sets it. VisitPolicy
// tests for LRU first, so the default path is one predictable branch and the
// LRU calls inline; the others go through std::visit.
// Thread safety: thread-compatible.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <variant>

#include "epd/core/cache_options.h"
#include "epd/core/internal/adaptive_policy.h"
#include "epd/core/internal/gdsf_policy.h"
#include "epd/core/internal/lru_policy.h"
#include "epd/core/internal/tenant_partition.h"
#include "epd/core/status.h"
#include "epd/core/tenant_quota.h"

namespace epd::internal {

using AnyPolicy = std::variant<LruPolicy, GdsfPolicy, AdaptivePolicy, TenantPartition<LruPolicy>,
                               TenantPartition<GdsfPolicy>, TenantPartition<AdaptivePolicy>>;

static_assert(CachePolicy<LruPolicy> && CachePolicy<GdsfPolicy> && CachePolicy<AdaptivePolicy>);
static_assert(CachePolicy<TenantPartition<LruPolicy>> && CachePolicy<TenantPartition<GdsfPolicy>> &&
              CachePolicy<TenantPartition<AdaptivePolicy>>);

inline AnyPolicy MakePolicy(const CacheOptions& o, std::int64_t capacity_bytes) {
  switch (o.eviction) {
    case EvictionPolicy::kGdsf:
      return GdsfPolicy(o);
    case EvictionPolicy::kAdaptive:
      return AdaptivePolicy(o, capacity_bytes);
    case EvictionPolicy::kLru:
      break;
  }
  return LruPolicy();
}

// Calls f on the policy held: LRU first, inline.
template <typename F>
[[gnu::always_inline]] inline decltype(auto) VisitPolicy(AnyPolicy& p, F&& f) {
  if (LruPolicy* lru = std::get_if<LruPolicy>(&p)) [[likely]]
    return f(*lru);
  return std::visit(std::forward<F>(f), p);
}
template <typename F>
[[gnu::always_inline]] inline decltype(auto) VisitPolicy(const AnyPolicy& p, F&& f) {
  if (const LruPolicy* lru = std::get_if<LruPolicy>(&p)) [[likely]]
    return f(*lru);
  return std::visit(std::forward<F>(f), p);
}

// What the cache reads of its policy.
inline double ClockOf(const AnyPolicy& p) {
  return VisitPolicy(p, [](const auto& q) { return q.clock(); });
}
inline const AdmissionFilter* HistoryOf(const AnyPolicy& p) {
  return VisitPolicy(p, [](const auto& q) { return q.history(); });
}
inline const PolicyDuel* DuelOf(const AnyPolicy& p) {
  return VisitPolicy(p, [](const auto& q) { return q.duel(); });
}
inline std::size_t MemoryOf(const AnyPolicy& p) {
  return VisitPolicy(p, [](const auto& q) { return q.memory_bytes(); });
}
// The cost a Pop or the hook hands on: the meta, and the owner under a partition.
inline EntryCost CostOf(const AnyPolicy& p, std::uint32_t e, const EntryMeta& m) {
  EntryCost c{m.seconds, m.frequency};
  VisitPolicy(p, [&](const auto& q) { q.FillCost(e, c); });
  return c;
}
[[gnu::always_inline]] inline std::uint64_t RankEpoch(const AnyPolicy& p) {
  return VisitPolicy(p, [](const auto& q) { return q.rank_epoch(); });
}

template <typename T>
struct IsPartition : std::false_type {};
template <typename P>
struct IsPartition<TenantPartition<P>> : std::true_type {};

// The ledger of a partitioned policy, or null.
inline const TenantLedger* LedgerOf(const AnyPolicy& p) {
  return std::visit(
      [](const auto& q) -> const TenantLedger* {
        if constexpr (IsPartition<std::decay_t<decltype(q)>>::value) {
          return &q.ledger();
        } else {
          return nullptr;
        }
      },
      p);
}

// Reserves `bytes` for tenant t, partitioning the policy first if it is not
// yet; the cache holds `bytes_now` in `slots` slab slots of `capacity_bytes`.
// Throws epd::Error(kInvalidArgument) when the reservations would sum past the
// capacity; nothing changes then.
inline void Reserve(AnyPolicy& p, TenantId t, std::int64_t bytes, std::int64_t capacity_bytes, std::size_t slots,
                    std::int64_t bytes_now) {
  const TenantLedger* ledger = LedgerOf(p);
  const Status s =
      ledger ? ledger->CheckReservation(t, bytes) : TenantLedger(capacity_bytes).CheckReservation(t, bytes);
  if (!s.ok()) throw Error(s);
  if (ledger == nullptr) {
    p = std::visit(
        [&](auto& q) -> AnyPolicy {
          using Q = std::decay_t<decltype(q)>;
          if constexpr (IsPartition<Q>::value) {
            return std::move(q);
          } else {
            return TenantPartition<Q>(std::move(q), capacity_bytes, slots, bytes_now);
          }
        },
        p);
  }
  std::visit(
      [&](auto& q) {
        if constexpr (IsPartition<std::decay_t<decltype(q)>>::value) q.SetReservation(t, bytes);
      },
      p);
}

}  // namespace epd::internal
