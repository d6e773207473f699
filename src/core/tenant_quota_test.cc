// Tenant reservations (epd/core/tenant_quota.h) in EmbeddingCache and
// TieredEmbeddingCache, under LRU and GDSF. Expected values come from the
// model in the header, worked out beside each assertion, or from the trace
// itself (a tenant whose working set fits its reservation misses only on
// first sight of each key).
#include "epd/core/tenant_quota.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "epd/core/embedding_cache.h"
#include "epd/core/tiered_cache.h"

namespace epd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

using Cache = EmbeddingCache<std::uint64_t, int>;
using Tiered = TieredEmbeddingCache<std::uint64_t, int>;

constexpr TenantId kReserved = 1;
constexpr TenantId kFlood = 2;

EntryCost Charged(TenantId t, double seconds = EntryCost::kUnmeasured) {
  EntryCost c;
  c.seconds = seconds;
  c.tenant = t;
  return c;
}

Cache NewCache(std::int64_t cap, EvictionPolicy p, std::vector<std::uint64_t>* evicted = nullptr) {
  return Cache(cap, CacheOptions{p}, [evicted](const std::uint64_t& k, int&&, std::int64_t, const EntryCost&) {
    if (evicted != nullptr) evicted->push_back(k);
  });
}

TEST(TenantLedgerTest, ReservationsMustFitTheCapacity) {
  TenantLedger l(1000);
  l.SetReservation(1, 600);
  l.SetReservation(2, 400);
  EXPECT_EQ(l.total_reserved(), 1000);
  EXPECT_EQ(l.shared_pool(), 0);
  try {
    l.SetReservation(3, 1);
    FAIL() << "a reservation past the capacity was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(e.status().message(), HasSubstr("tenant 3"));
    EXPECT_THAT(e.status().message(), HasSubstr("1001 bytes"));
  }
  EXPECT_EQ(l.reserved(3), 0);  // nothing changed
  l.SetReservation(1, 100);     // replacing one frees room
  EXPECT_EQ(l.shared_pool(), 500);
  EXPECT_TRUE(l.Admits(2, 900));  // 400 + 500
  EXPECT_FALSE(l.Admits(2, 901));
}

TEST(TenantQuotaParseTest, ReadsMiBAndNamesTheFlagOnError) {
  auto named = ParseTenantQuota("--tenant-quota", "acme=64/512", true);
  ASSERT_TRUE(named.ok());
  EXPECT_EQ(named->first, "acme");
  EXPECT_EQ(named->second.l1, 64LL << 20);
  EXPECT_EQ(named->second.l2, 512LL << 20);
  auto def = ParseTenantQuota("--tenant-quota-default", "0/8", false);
  ASSERT_TRUE(def.ok());
  EXPECT_EQ(def->second.l2, 8LL << 20);
  for (const char* bad : {"acme", "=1/2", "acme=1", "acme=-1/2", "acme=1/x", "acme=1.5/2"}) {
    auto r = ParseTenantQuota("--tenant-quota", bad, true);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_THAT(r.status().message(), HasSubstr("--tenant-quota '"));
  }
}

TEST(TenantQuotasTest, SumOfReservationsIsCheckedPerTier) {
  TenantQuotas::Options o;
  o.capacity = {100LL << 20, 1000LL << 20};
  o.named = {{"a", {60LL << 20, 100LL << 20}}, {"b", {30LL << 20, 100LL << 20}}};
  o.default_reservation = TierBytes{20LL << 20, 0};
  auto q = TenantQuotas::Create(o);
  ASSERT_FALSE(q.ok());
  EXPECT_THAT(q.status().message(), HasSubstr("--tenant-quota"));
  EXPECT_THAT(q.status().message(), HasSubstr("L1 reservations"));
  EXPECT_THAT(q.status().message(), HasSubstr("110 MiB"));  // 60 + 30 + 20
  o.default_reservation = TierBytes{5LL << 20, 0};
  o.named.push_back({"a", {}});
  EXPECT_THAT(TenantQuotas::Create(o).status().message(), HasSubstr("'a' is given twice"));
}

TEST(TenantQuotasTest, NamedFirstThenDefaultsWhileRoomRemains) {
  TenantQuotas::Options o;
  o.capacity = {100, 100};
  o.named = {{"a", {60, 10}}};
  o.default_reservation = TierBytes{15, 30};
  auto q = TenantQuotas::Create(o);
  ASSERT_TRUE(q.ok()) << q.status().message();
  TenantQuotas& t = **q;
  EXPECT_EQ(t.Intern("a"), 1);
  EXPECT_EQ(t.Intern(""), kSharedTenant);
  const TenantId x = t.Intern("x");
  const TenantId y = t.Intern("y");
  const TenantId z = t.Intern("z");
  EXPECT_EQ(t.Intern("x"), x);
  // L1: 60 + 15 + 15 = 90 <= 100, a third default would make 105; L2: 10 +
  // 30 + 30 = 70, a third 100 (fits) -- the L1 bound denies z.
  EXPECT_EQ(t.reservation(x).l1, 15);
  EXPECT_EQ(t.reservation(y).l2, 30);
  EXPECT_EQ(t.reservation(z).l1, 0);
  EXPECT_EQ(t.reservation(z).l2, 0);
  EXPECT_EQ(t.defaults_denied(), 1u);
  EXPECT_EQ(t.name(z), "z");
}

// Entries of a tenant within its reservation are never victims; an
// over-reservation tenant loses its own LRU entry even when another
// tenant's entries are older.
TEST(TenantQuotaCacheTest, EvictsFromTheTenantOverItsReservationInItsOwnOrder) {
  std::vector<std::uint64_t> evicted;
  Cache c = NewCache(40, EvictionPolicy::kLru, &evicted);
  c.SetTenantReservation(kReserved, 20);
  c.SetTenantReservation(kFlood, 20);
  c.Put(1, 0, 10, Charged(kFlood));  // oldest
  c.Put(2, 0, 10, Charged(kFlood));
  c.Put(3, 0, 10, Charged(kReserved));
  c.Put(4, 0, 10, Charged(kReserved));
  c.Put(5, 0, 10, Charged(kReserved));  // kReserved holds 30 > 20: its LRU (3) goes, not 1
  EXPECT_THAT(evicted, ElementsAre(3u));
  c.Get(4);
  c.Put(6, 0, 10, Charged(kReserved));  // 5 is now its LRU
  EXPECT_THAT(evicted, ElementsAre(3u, 5u));
  EXPECT_EQ(c.tenants()->bytes(kReserved), 20);
  EXPECT_EQ(c.tenants()->bytes(kFlood), 20);
  EXPECT_EQ(c.tenants()->row(kReserved).evictions, 2u);
  EXPECT_EQ(c.tenants()->row(kFlood).evictions, 0u);
}

class TenantRefusalTest : public ::testing::TestWithParam<EvictionPolicy> {};

TEST_P(TenantRefusalTest, RefusesWhatTheReservationPlusSharedPoolCannotHold) {
  Cache c = NewCache(100, GetParam());
  c.SetTenantReservation(kReserved, 70);  // shared pool: 30
  c.Put(1, 0, 70, Charged(kReserved));
  c.Put(2, 0, 30, Charged(kFlood));
  EXPECT_FALSE(c.Put(3, 0, 31, Charged(kFlood)));  // 31 > 0 + 30
  EXPECT_EQ(c.refusals(), 1u);
  EXPECT_EQ(c.tenants()->row(kFlood).refusals, 1u);
  EXPECT_FALSE(c.Put(2, 0, 40, Charged(kFlood)));  // a refused replace leaves 2 as it was
  EXPECT_TRUE(c.Contains(2));
  EXPECT_EQ(c.tenants()->bytes(kFlood), 30);
  EXPECT_TRUE(c.Contains(1));
  EXPECT_TRUE(c.Put(4, 0, 100, Charged(kReserved)));  // 100 <= 70 + 30: evicts 2, then its own 1
  EXPECT_FALSE(c.Contains(1));
  EXPECT_FALSE(c.Contains(2));
  EXPECT_EQ(c.current_bytes(), 100);
  EXPECT_EQ(c.refusals(), 2u);
}
INSTANTIATE_TEST_SUITE_P(Policies, TenantRefusalTest,
                         ::testing::Values(EvictionPolicy::kLru, EvictionPolicy::kGdsf, EvictionPolicy::kAdaptive),
                         [](const auto& info) { return std::string(EvictionPolicyName(info.param)); });

TEST(TenantQuotaCacheTest, NoReservationMeansNoLedgerAndTheTenantIsIgnored) {
  std::vector<std::uint64_t> evicted;
  Cache c = NewCache(20, EvictionPolicy::kLru, &evicted);
  c.Put(1, 0, 10, Charged(kReserved));
  c.Put(2, 0, 10, Charged(kFlood));
  c.Put(3, 0, 10, Charged(kReserved));
  EXPECT_EQ(c.tenants(), nullptr);
  EXPECT_THAT(evicted, ElementsAre(1u));  // plain LRU
  EXPECT_EQ(c.Pop(3)->cost.tenant, kSharedTenant);
}

// The test: a tenant flooding unique images leaves a reserved
// tenant's hit ratio unchanged within one point. The reserved tenant's 40
// keys (400 bytes) fit its 500-byte reservation, so alone it misses only on
// each key's first access: the expected ratio comes from the trace, not the
// cache. The flood puts 3 unique keys per reserved access, each costing 50x
// more to encode, so that GDSF without reservations would keep the flood.

template <typename C, typename Reserve>
double ReservedHitRatio(C& cache, Reserve reserve, bool flood, bool quotas, std::uint64_t seed) {
  if (quotas) reserve(cache);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::uint64_t> pick(0, 39);
  std::uint64_t unique = 1000;
  int hits = 0;
  const int n = 3000;
  for (int i = 0; i < n; ++i) {
    const std::uint64_t k = pick(rng);
    if (cache.Get(k).has_value()) {
      ++hits;
    } else {
      cache.Put(k, 0, 10, Charged(kReserved, 1e-8));
    }
    for (int j = 0; flood && j < 3; ++j) {
      const std::uint64_t f = unique++;
      if (!cache.Get(f).has_value()) cache.Put(f, 0, 10, Charged(kFlood, 5e-7));
    }
  }
  return static_cast<double>(hits) / n;
}

double TraceRatio(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::uint64_t> pick(0, 39);
  std::set<std::uint64_t> seen;
  int hits = 0;
  for (int i = 0; i < 3000; ++i) hits += seen.insert(pick(rng)).second ? 0 : 1;
  return hits / 3000.0;
}

class FloodTest : public ::testing::TestWithParam<EvictionPolicy> {};

TEST_P(FloodTest, ReservedTenantKeepsItsHitRatioInOneCache) {
  auto reserve = [](Cache& c) { c.SetTenantReservation(kReserved, 500); };
  for (std::uint64_t seed : {1u, 2u, 3u}) {
    Cache with = NewCache(1000, GetParam());
    Cache without = NewCache(1000, GetParam());
    const double alone = TraceRatio(seed);
    const double quota = ReservedHitRatio(with, reserve, true, true, seed);
    const double none = ReservedHitRatio(without, reserve, true, false, seed);
    EXPECT_NEAR(quota, alone, 0.01) << "seed " << seed;
    // Under adaptive the flood of one-off keys need not hurt: its probation
    // expert ranks them below the reserved keys (0.92 on seeds 1 and 2); the
    // reservation's guarantee above holds for every policy.
    if (GetParam() != EvictionPolicy::kAdaptive) {
      EXPECT_LT(none, alone - 0.2) << "the flood must hurt without a reservation, seed " << seed;
    }
    EXPECT_EQ(with.tenants()->row(kReserved).evictions, 0u);
    EXPECT_GT(with.tenants()->row(kFlood).evictions, 8000u);  // ~9000 flood puts, 60 of them held
  }
}

TEST_P(FloodTest, ReservedTenantKeepsItsHitRatioInTheTieredCache) {
  // L1 and L2 of 50 entries each, less than the ~120 flood keys between two
  // uses of a reserved key. The reserved tenant reserves 30 entries in each:
  // its 40 keys fit the two together (what L1 sheds is demoted into its L2
  // reservation, and an L2 hit is a hit); the flood is dropped from L2.
  auto reserve = [](Tiered& c) { c.SetTenantReservation(kReserved, 300, 300); };
  for (std::uint64_t seed : {4u, 5u}) {
    Tiered with(500, 500, TieredOptions{GetParam()});
    Tiered without(500, 500, TieredOptions{GetParam()});
    const double alone = TraceRatio(seed);
    EXPECT_NEAR(ReservedHitRatio(with, reserve, true, true, seed), alone, 0.01) << "seed " << seed;
    // The flood must hurt without a reservation. Less than in one cache under
    // GDSF: L1 ranks by promotion cost, the same for both tenants, so its
    // frequency history keeps most reserved keys (0.84 against 0.99 alone
    // for seeds 4 and 5; 0.2 below alone under Cherkasova's resident count).
    // Under adaptive the flood need not hurt: on seed 5 the duel's LRU order
    // keeps the reserved keys by itself (0.887, as alone); the reservation's
    // guarantee above is what holds for every policy.
    const double unreserved = ReservedHitRatio(without, reserve, true, false, seed);
    if (GetParam() != EvictionPolicy::kAdaptive) {
      EXPECT_LT(unreserved, alone - 0.1) << "seed " << seed;
    }
    EXPECT_EQ(with.l2().tenants()->row(kReserved).evictions, 0u);  // nothing of it lost
  }
}

// Demotions and promotions keep the charge: per tenant, L1 bytes + L2 bytes
// equal the bytes of the keys the test put for it that the cache still holds.
TEST_P(FloodTest, DemoteAndPromoteKeepTheCharge) {
  Tiered c(100, 300, TieredOptions{GetParam()});
  c.SetTenantReservation(kReserved, 40, 100);
  c.SetTenantReservation(kFlood, 20, 50);
  std::map<std::uint64_t, std::pair<TenantId, std::int64_t>> put;
  std::mt19937_64 rng(9);
  for (int i = 0; i < 2000; ++i) {
    const std::uint64_t k = rng() % 60;
    const TenantId t = k % 3 == 0 ? kReserved : kFlood;
    if (!c.Get(k).has_value()) {
      const std::int64_t n = 5 + static_cast<std::int64_t>(k % 4) * 5;
      c.Put(k, 0, n, Charged(t, 1e-9 * static_cast<double>(k + 1)));
      put[k] = {t, n};
    }
  }
  ASSERT_GT(c.promotions(), 100u);
  ASSERT_GT(c.demotions(), 100u);
  std::map<TenantId, std::int64_t> held;
  for (const auto& [k, tn] : put) {
    if (c.Contains(k)) held[tn.first] += tn.second;
  }
  for (TenantId t : {kReserved, kFlood}) {
    EXPECT_EQ(c.l1().tenants()->bytes(t) + c.l2().tenants()->bytes(t), held[t]) << "tenant " << t;
  }
  EXPECT_EQ(c.l1().tenants()->bytes(kSharedTenant), 0);
  // Every entry in L2 is charged to its own tenant.
  c.l2().ForEachInEvictionOrder(
      [&](const std::uint64_t& k, const int&, std::int64_t) { EXPECT_EQ(c.l2().CostOf(k)->tenant, put.at(k).first); });
}

INSTANTIATE_TEST_SUITE_P(Policies, FloodTest,
                         ::testing::Values(EvictionPolicy::kLru, EvictionPolicy::kGdsf, EvictionPolicy::kAdaptive),
                         [](const auto& info) { return std::string(EvictionPolicyName(info.param)); });

TEST(TenantQuotaTieredTest, AReservationPastEitherTierChangesNothing) {
  Tiered c(100, 50);
  c.SetTenantReservation(kReserved, 60, 50);
  try {
    c.SetTenantReservation(kFlood, 40, 1);
    FAIL() << "L2 over its capacity was accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.status().message(), HasSubstr("L2: "));
  }
  EXPECT_EQ(c.l1().tenants()->reserved(kFlood), 0);  // L1 was not changed either
  EXPECT_EQ(c.l1().tenants()->shared_pool(), 40);
}

}  // namespace
}  // namespace epd
