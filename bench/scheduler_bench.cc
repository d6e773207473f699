// scheduler_bench: EncodeScheduler drain time against the number of pending
// items, and the latency of one next_batch() with 10^5 items pending.
//
// Workload (bench/reference_bench.py builds the same one for the Python
// reference): item i belongs to request i / 2 as item_index i % 2; request r's
// id is the 16 lower-case hex digits of Mix64(r), so key order differs from
// arrival order; item i costs 16 + Mix64(i) % 1284 tokens (16..1299, a
// thumbnail to a ~1 megapixel image after 2x2 merge). Batches hold at most
// kMaxTokens tokens and kMaxItems items. Items are added in index order.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "epd/core/encode_scheduler.h"

namespace epd::bench {
namespace {

constexpr std::int64_t kMaxTokens = 16384;
constexpr std::int64_t kMaxItems = 64;

// The splitmix64 output function (Steele, Lea, Flood, OOPSLA 2014); also in
// reference_bench.py, where it must stay identical.
constexpr std::uint64_t Mix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

PendingEncodeItem MakeItem(std::uint64_t i) {
  char id[17];
  std::snprintf(id, sizeof(id), "%016llx", static_cast<unsigned long long>(Mix64(i / 2)));
  return PendingEncodeItem{id, static_cast<std::int64_t>(i % 2), static_cast<std::int64_t>(16 + Mix64(i) % 1284)};
}

std::vector<PendingEncodeItem> MakeItems(std::size_t n) {
  std::vector<PendingEncodeItem> items;
  items.reserve(n);
  for (std::size_t i = 0; i < n; ++i) items.push_back(MakeItem(i));
  return items;
}

// Time to pull every batch out of a scheduler holding n items (the adds are
// not timed).
void BM_Drain(benchmark::State& state, ScheduleOrder order) {
  const std::size_t n = static_cast<std::size_t>(state.range(0));
  const std::vector<PendingEncodeItem> items = MakeItems(n);
  std::int64_t batches = 0;
  for (auto _ : state) {
    state.PauseTiming();
    auto s = std::make_unique<EncodeScheduler>(kMaxTokens, kMaxItems, order);
    for (const auto& it : items) s->Add(it);
    state.ResumeTiming();
    std::size_t drained = 0;
    for (auto b = s->NextBatch(); !b.empty(); b = s->NextBatch()) {
      drained += b.size();
      ++batches;
    }
    benchmark::DoNotOptimize(drained);
    state.PauseTiming();
    if (drained != n) state.SkipWithError("drain lost items");
    s.reset();
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(n));
  state.counters["batches"] = static_cast<double>(batches) / static_cast<double>(state.iterations());
}

// One next_batch() with n items pending; the popped items are replaced by new
// ones (untimed) so every call sees n pending.
void BM_NextBatch(benchmark::State& state, ScheduleOrder order) {
  const std::size_t n = static_cast<std::size_t>(state.range(0));
  EncodeScheduler s(kMaxTokens, kMaxItems, order);
  std::uint64_t next = 0;
  for (; next < n; ++next) s.Add(MakeItem(next));
  std::int64_t items = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<PendingEncodeItem> b = s.NextBatch();
    const auto t1 = std::chrono::steady_clock::now();
    state.SetIterationTime(std::chrono::duration<double>(t1 - t0).count());
    items += static_cast<std::int64_t>(b.size());
    for (std::size_t k = 0; k < b.size(); ++k) s.Add(MakeItem(next++));
  }
  state.counters["items_per_batch"] = static_cast<double>(items) / static_cast<double>(state.iterations());
}

void RegisterAll() {
  for (auto [order, name] : {std::pair{ScheduleOrder::kByKey, "by_key"}, std::pair{ScheduleOrder::kFifo, "fifo"}}) {
    auto* drain = benchmark::RegisterBenchmark((std::string("drain/") + name).c_str(), BM_Drain, order);
    for (std::int64_t n : {1'000, 10'000, 100'000, 1'000'000}) drain->Arg(n);
    // by_key also at the reference's intermediate sizes, for one ratio per size.
    if (order == ScheduleOrder::kByKey) {
      for (std::int64_t n : {2'000, 5'000, 20'000, 50'000}) drain->Arg(n);
    }
    drain->Unit(benchmark::kMillisecond)->MinTime(0.2);
    benchmark::RegisterBenchmark((std::string("next_batch/") + name).c_str(), BM_NextBatch, order)
        ->Arg(100'000)
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond)
        ->MinTime(0.2);
  }
}

}  // namespace
}  // namespace epd::bench

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("max_tokens_per_batch", std::to_string(epd::bench::kMaxTokens));
  benchmark::AddCustomContext("max_items_per_batch", std::to_string(epd::bench::kMaxItems));
  epd::bench::RegisterAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
