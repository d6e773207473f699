// Items/s of the TorchScript tower on a CUDA device, by batch size.
//
// Each item is by default a 512x512 image's worth of patches (Qwen2-VL
// smart_resize gives 504x504: grid 1x36x36, 1296 patches, 324 tokens;
// --side 16 is a 224x224 image: 256 patches, 64 tokens) with random values
// (the forward's cost does not depend on them). Encode() includes the input
// upload and, by default, the output copy back to host memory; with
// --output-on-device the output stays in VRAM (TorchTowerOptions::
// output_on_device), as the worker with a GPU tier uses it.
//
//   tower_gpu_bench --model default_tower.pt [--device cuda:0] [--batches 1,2,4,8,16,32]
//                   [--iters 20] [--dtype bfloat16|float32] [--output-on-device] [--side 36]
// Prints one markdown row per batch size. Exits 2 if the tower cannot be
// loaded on the device (e.g. libtorch without CUDA).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "epd/torch_tower/torch_tower.h"

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const std::string& what, int code = 1) {
  std::fprintf(stderr, "tower_gpu_bench: %s\n", what.c_str());
  std::exit(code);
}

std::vector<int> ParseList(const std::string& s) {
  std::vector<int> out;
  std::size_t pos = 0;
  while (pos <= s.size()) {
    const std::size_t comma = s.find(',', pos);
    const int v = std::atoi(s.substr(pos, comma - pos).c_str());
    if (v < 1) Die("--batches: '" + s + "' must list positive integers");
    out.push_back(v);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  epd::TorchTowerOptions opts;
  opts.device = "cuda:0";
  opts.output_dtype = epd::DType::kBFloat16;
  std::vector<int> batches = {1, 2, 4, 8, 16, 32};
  int iters = 20;
  int side = 36;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) Die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--model") {
      opts.model_path = next();
    } else if (a == "--device") {
      opts.device = next();
    } else if (a == "--batches") {
      batches = ParseList(next());
    } else if (a == "--side") {
      side = std::atoi(next().c_str());
      if (side < 2 || side % 2 != 0 || side > 512) Die("--side must be an even number of patches in [2, 512]");
    } else if (a == "--output-on-device") {
      opts.output_on_device = true;
    } else if (a == "--iters") {
      iters = std::max(1, std::atoi(next().c_str()));
    } else if (a == "--dtype") {
      const std::string d = next();
      if (d == "float32") {
        opts.output_dtype = epd::DType::kFloat32;
      } else if (d != "bfloat16") {
        Die("--dtype must be bfloat16 or float32, got '" + d + "'");
      }
    } else {
      Die("unknown argument '" + a + "'");
    }
  }
  if (opts.model_path.empty()) Die("--model is required");
  auto loaded = epd::LoadTorchScriptTower(opts);
  if (!loaded.ok()) Die(loaded.status().ToString(), 2);
  epd::VisionTower& tower = **loaded;
  std::printf("tower: %s, output in %s memory, items of grid 1x%dx%d (%d patches, %d tokens)\n\n",
              tower.Describe().c_str(), opts.output_on_device ? "device" : "host", side, side, side * side,
              side * side / 4);
  std::printf("| batch | items/s | tokens/s | ms per batch |\n|---|---|---|---|\n");

  const epd::GridTHW grid{1, side, side};
  const int max_batch = *std::max_element(batches.begin(), batches.end());
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<std::vector<float>> images(static_cast<std::size_t>(max_batch));
  for (auto& img : images) {
    img.resize(static_cast<std::size_t>(grid.patches() * tower.patch_dim()));
    for (float& x : img) x = normal(rng);
  }
  const std::int64_t tokens_per_item = grid.patches() / (tower.merge_size() * tower.merge_size());
  for (int b : batches) {
    std::vector<epd::TowerItem> items;
    for (int i = 0; i < b; ++i) items.push_back({images[static_cast<std::size_t>(i)].data(), grid, tower.patch_dim()});
    for (int w = 0; w < 3; ++w) {  // warm-up: kernels, allocator, autotuning
      auto out = tower.Encode(items);
      if (!out.ok()) Die(out.status().ToString());
    }
    const Clock::time_point t0 = Clock::now();
    for (int it = 0; it < iters; ++it) {
      auto out = tower.Encode(items);
      if (!out.ok()) Die(out.status().ToString());
    }
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    const double items_per_s = static_cast<double>(b) * iters / s;
    std::printf("| %d | %.1f | %.0f | %.2f |\n", b, items_per_s, items_per_s * static_cast<double>(tokens_per_item),
                1000.0 * s / iters);
    std::fflush(stdout);
  }
  return 0;
}
