// eviction_bench: GDSF against LRU, in two modes.
//
//   eviction_bench [Google Benchmark flags]
//       get (hit) and put (miss + eviction) under each policy at 10^5
//       entries, in the same run (docs/BENCHMARKS.md, "Cache economics").
//   eviction_bench --simulate TRACE [--lru-hit 0.3,0.5,0.7] [--fractions 0.1,0.3]
//                  [--tiered L1_FRACTION,L2_FRACTION] [--window N]
//       replays a cache trace (tools/cache_trace.h) through a whole
//       EmbeddingCache under LRU, GDSF and adaptive at the capacities where the
//       exact LRU curve's encode-seconds hit ratio is each --lru-hit value
//       (and at each --fractions share of the working set), and, with
//       --tiered, through TieredEmbeddingCache (L1 and L2 as shares of the
//       working set) without and with the doorkeeper; prints one JSON object.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "cache_trace.h"
#include "epd/core/content_key_type.h"
#include "epd/core/embedding.h"
#include "epd/core/embedding_cache.h"
#include "epd/plan/mini_sim.h"
#include "epd/plan/plan.h"
#include "epd/plan/shards.h"

namespace epd::bench {
namespace {

constexpr std::int64_t kEntries = 100'000;
constexpr std::int64_t kCharge = 4 << 20;

ContentKey KeyOf(std::uint64_t id) {
  ContentKey k;
  for (std::uint64_t j = 0; j < 4; ++j) {
    const std::uint64_t w = ShardsSampler::Mix(id * 4 + j);
    std::memcpy(k.bytes.data() + 8 * j, &w, 8);
  }
  return k;
}

using Cache = EmbeddingCache<ContentKey, EmbeddingPtr, ContentKeyHash>;

// A full cache of kEntries entries with costs spread 10x per byte.
std::unique_ptr<Cache> Filled(EvictionPolicy p) {
  auto c = std::make_unique<Cache>(kEntries * kCharge, CacheOptions{p});
  for (std::int64_t i = 0; i < kEntries; ++i) {
    c->Put(KeyOf(static_cast<std::uint64_t>(i)), nullptr, kCharge, {1e-3 * (1 + static_cast<double>(i % 10))});
  }
  return c;
}

void BM_GetHit(benchmark::State& state, EvictionPolicy p) {
  auto c = Filled(p);
  std::vector<ContentKey> keys;
  for (std::uint64_t i = 0; i < 1 << 16; ++i) keys.push_back(KeyOf(ShardsSampler::Mix(i) % kEntries));
  std::size_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(c->Get(keys[i++ & 0xffff]));
  }
  state.SetItemsProcessed(state.iterations());
}

// Each put is a new key into a full cache: one insertion and one eviction.
void BM_PutEvict(benchmark::State& state, EvictionPolicy p) {
  auto c = Filled(p);
  std::uint64_t next = kEntries;
  std::vector<ContentKey> keys;
  for (std::uint64_t i = 0; i < 1 << 16; ++i) keys.push_back(KeyOf(kEntries + i));
  std::size_t i = 0;
  for (auto _ : state) {
    c->Put(keys[i & 0xffff], nullptr, kCharge, {1e-3 * (1 + static_cast<double>(next++ % 10))});
    if ((++i & 0xffff) == 0) {
      state.PauseTiming();
      for (auto& k : keys) k = KeyOf(next + (&k - keys.data()) + (std::uint64_t{1} << 40));
      state.ResumeTiming();
    }
  }
  state.SetItemsProcessed(state.iterations());
}

BENCHMARK_CAPTURE(BM_GetHit, lru, EvictionPolicy::kLru);
BENCHMARK_CAPTURE(BM_GetHit, gdsf, EvictionPolicy::kGdsf);
BENCHMARK_CAPTURE(BM_GetHit, adaptive, EvictionPolicy::kAdaptive);
BENCHMARK_CAPTURE(BM_PutEvict, lru, EvictionPolicy::kLru);
BENCHMARK_CAPTURE(BM_PutEvict, gdsf, EvictionPolicy::kGdsf);
BENCHMARK_CAPTURE(BM_PutEvict, adaptive, EvictionPolicy::kAdaptive);

std::vector<double> Doubles(const std::string& csv) {
  std::vector<double> out;
  std::stringstream in(csv);
  for (std::string x; std::getline(in, x, ',');) out.push_back(std::stod(x));
  return out;
}

// Encode seconds saved by one whole cache under `options` over the trace (a
// get per access, a put on each miss), and its hit ratios by seconds and by
// objects; for the GDSF variants that MiniSim's SimPolicy does not name.
struct Whole {
  double seconds_saved = 0, hit_ratio = 0, object_hit_ratio = 0;
  double lru_share = 0;  // of the evictions, the share whose victim was LRU's
};
Whole ReplayWhole(std::span<const CacheAccess> trace, const CacheOptions& options, double capacity) {
  EmbeddingCache<std::uint64_t, char> cache(static_cast<std::int64_t>(capacity), options);
  double total = 0, hits = 0;
  for (const CacheAccess& a : trace) {
    total += a.seconds;
    if (cache.Get(a.key).has_value()) {
      hits += 1;
      continue;
    }
    cache.Put(a.key, 0, a.bytes, {a.seconds});
  }
  return {
      cache.hit_seconds(), total > 0 ? cache.hit_seconds() / total : 0,
      trace.empty() ? 0 : hits / static_cast<double>(trace.size()),
      cache.evictions() == 0 ? 0 : static_cast<double>(cache.lru_victims()) / static_cast<double>(cache.evictions())};
}

// The window of GDSF's history for --history-mult m: m x the entries of
// mean size that `capacity` holds (0: the cache's own sizing).
std::uint64_t g_history_mult = 0;
double g_mean_bytes = 1;

// MiniSim at rate 1: every request, in a cache of the full capacity.
MiniSimOptions FullScale() {
  MiniSimOptions m;
  m.rate = 1.0;
  return m;
}

nlohmann::json Compare(std::span<const CacheAccess> trace, double capacity) {
  const SimResult lru = SimulateCapacity(trace, {EvictionPolicy::kLru, false}, capacity, FullScale());
  CacheOptions history{EvictionPolicy::kGdsf};
  if (g_history_mult > 0) {
    history.gdsf_history_window =
        static_cast<std::uint64_t>(static_cast<double>(g_history_mult) * capacity / g_mean_bytes);
  }
  CacheOptions resident{EvictionPolicy::kGdsf};
  resident.gdsf_frequency = GdsfFrequency::kResident;
  const SimResult gdsf = SimulateCapacity(trace, {EvictionPolicy::kGdsf, false}, capacity, FullScale());
  const Whole h = g_history_mult > 0 ? ReplayWhole(trace, history, capacity) : Whole{};
  const Whole classic = ReplayWhole(trace, resident, capacity);
  const Whole adaptive = ReplayWhole(trace, CacheOptions{EvictionPolicy::kAdaptive}, capacity);
  return {{"capacity_bytes", capacity},
          {"gdsf_resident_seconds_saved", classic.seconds_saved},
          {"gdsf_resident_hit_ratio", classic.hit_ratio},
          {"gdsf_resident_object_hit_ratio", classic.object_hit_ratio},
          {"gdsf_window_seconds_saved", h.seconds_saved},
          {"adaptive_seconds_saved", adaptive.seconds_saved},
          {"adaptive_hit_ratio", adaptive.hit_ratio},
          {"adaptive_object_hit_ratio", adaptive.object_hit_ratio},
          {"adaptive_lru_share", adaptive.lru_share},
          {"lru_seconds_saved", lru.hits.seconds},
          {"gdsf_seconds_saved", gdsf.hits.seconds},
          {"lru_hit_ratio", 1 - lru.MissRatio().seconds},
          {"gdsf_hit_ratio", 1 - gdsf.MissRatio().seconds},
          {"lru_object_hit_ratio", 1 - lru.MissRatio().objects},
          {"gdsf_object_hit_ratio", 1 - gdsf.MissRatio().objects}};
}

int Simulate(const std::string& path, const std::vector<double>& lru_hits, const std::vector<double>& fractions,
             const std::vector<double>& tiered, std::uint64_t window) {
  auto trace = cli::ReadCacheTrace(path);
  if (!trace.ok()) {
    std::fprintf(stderr, "eviction_bench: %s\n", trace.status().ToString().c_str());
    return 1;
  }
  std::unordered_map<std::uint64_t, std::int64_t> sizes;
  for (const CacheAccess& a : *trace) sizes[a.key] = a.bytes;
  double working_set = 0;
  for (const auto& [k, b] : sizes) working_set += static_cast<double>(b);
  g_mean_bytes = sizes.empty() ? 1 : working_set / static_cast<double>(sizes.size());
  nlohmann::json j = {{"trace", path}, {"requests", trace->size()}, {"working_set_bytes", working_set}};
  const ReuseHistogram exact = ExactReuseHistogram(*trace);
  j["max_hit_ratio"] = exact.MaxHitRatio().seconds;
  j["by_lru_hit"] = nlohmann::json::array();
  for (double h : lru_hits) {
    const double cap = exact.CapacityFor(Weighting::kSeconds, h);
    if (cap > 0) j["by_lru_hit"].push_back(Compare(*trace, cap));
  }
  j["by_fraction"] = nlohmann::json::array();
  for (double f : fractions) j["by_fraction"].push_back(Compare(*trace, f * working_set));
  if (tiered.size() == 2) {
    for (bool dk : {false, true}) {
      plan::PlanOptions o;
      o.eviction = EvictionPolicy::kGdsf;
      o.l1_admission = dk ? L1Admission::kDoorkeeper : L1Admission::kNone;
      o.doorkeeper_window = window;
      const plan::TierHits h = plan::ReplayTiers(*trace, tiered[0] * working_set, tiered[1] * working_set, 0, o);
      const double hit = h.Ratio(h.l1, Weighting::kSeconds) + h.Ratio(h.l2, Weighting::kSeconds);
      j[dk ? "tiered_doorkeeper" : "tiered_none"] = {{"l1_write_bytes", h.l1_write_bytes},
                                                     {"seconds_hit_ratio", hit},
                                                     {"l1_seconds_hit_ratio", h.Ratio(h.l1, Weighting::kSeconds)}};
    }
  }
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace epd::bench

int main(int argc, char** argv) {
  std::string simulate, lru_hit = "0.3,0.5,0.7", fractions, tiered;
  std::uint64_t window = 1 << 16;
  for (int i = 1; i + 1 < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--simulate")
      simulate = argv[++i];
    else if (a == "--lru-hit")
      lru_hit = argv[++i];
    else if (a == "--fractions")
      fractions = argv[++i];
    else if (a == "--tiered")
      tiered = argv[++i];
    else if (a == "--window")
      window = std::stoull(argv[++i]);
    else if (a == "--history-mult")
      epd::bench::g_history_mult = std::stoull(argv[++i]);
  }
  if (!simulate.empty()) {
    return epd::bench::Simulate(simulate, epd::bench::Doubles(lru_hit), epd::bench::Doubles(fractions),
                                epd::bench::Doubles(tiered), window);
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}
