// Throughput of the default TorchScript tower on 512x512-sized images.
//
// A 512x512 image resizes to 504x504 (Qwen2-VL smart_resize), grid 1x36x36:
// 1296 patches, 324 tokens. The benchmark encodes batches of 1, 2 and 4 such
// images (random patch rows; the forward's cost does not depend on values)
// and reports items/s and tokens/s. Attention is per image, so batching
// saves per-call overhead and widens the matrix products of the linear
// layers, but does not change the attention cost per image.
//
// Threads: EPD_TOWER_BENCH_THREADS (default 0 = all cores).
//   build/src/tower/tower_bench --benchmark_min_time=2
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <random>
#include <vector>

#include "epd/torch_tower/torch_tower.h"

namespace {

epd::VisionTower& Tower() {
  static std::unique_ptr<epd::VisionTower> tower = [] {
    epd::TorchTowerOptions opts;
    opts.model_path = EPD_DEFAULT_TOWER_PATH;
    // NOLINTNEXTLINE(concurrency-mt-unsafe): read once on the main thread, before the tower and its threads exist
    if (const char* t = std::getenv("EPD_TOWER_BENCH_THREADS")) opts.num_threads = std::atoi(t);
    auto t = epd::LoadTorchScriptTower(opts);
    if (!t.ok()) {
      std::fprintf(stderr, "tower_bench: %s\n", t.status().ToString().c_str());
      std::fflush(nullptr);
      std::_Exit(1);  // not std::exit: no static destructors run under torch's pool threads
    }
    std::fprintf(stderr, "tower_bench: %s\n", (*t)->Describe().c_str());
    return std::move(t).value();
  }();
  return *tower;
}

void BM_DefaultTower512(benchmark::State& state) {
  const epd::GridTHW grid{1, 36, 36};
  const auto batch = state.range(0);
  epd::VisionTower& tower = Tower();
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<std::vector<float>> images(batch);
  std::vector<epd::TowerItem> items;
  for (auto& img : images) {
    img.resize(grid.patches() * tower.patch_dim());
    for (float& x : img) x = normal(rng);
    items.push_back({img.data(), grid, tower.patch_dim()});
  }
  // Two warm-up forwards: TorchScript's profiling executor optimises the
  // graph after its first runs on a new shape.
  for (int i = 0; i < 2; ++i) {
    if (!tower.Encode(items).ok()) state.SkipWithError("warm-up Encode failed");
  }
  for (auto _ : state) {
    auto out = tower.Encode(items);
    if (!out.ok()) {
      state.SkipWithError(out.status().ToString().c_str());
      break;
    }
    benchmark::DoNotOptimize(out->main.data());
  }
  state.SetItemsProcessed(state.iterations() * batch);
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(state.iterations() * batch * grid.tokens()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_DefaultTower512)->Arg(1)->Arg(2)->Arg(4)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
