// checkpoint_tower_bench: per-image forward time of the libtorch checkpoint
// towers (epd/checkpoint_tower/checkpoint_tower.h) on one photo, with the same workload and
// method as bench/checkpoint_reference_bench.py, so the two tables can be put
// side by side (docs/BENCHMARKS.md).
//
//   checkpoint_tower_bench [--models DIR | --model DIR] [--photo FILE]
//                          [--repeats N] [--threads 1,2] [--batches 1]
//                          [--device cpu] [--dtype f32|bf16] [--json OUT.json]
//                          [--attention fused|unfused]
//
// Workload: for each tiny-<arch> checkpoint under --models (default
// build/models, written by the tiny_checkpoints target), the photo (default
// scikit-image's astronaut.png, 512x512) is decoded and preprocessed once with
// the checkpoint's own PreprocessConfig (epd::DecodeAndPreprocess); that time
// is reported apart and is not part of the forward time. For each thread
// count, the tower is loaded with num_threads = N, runs one warm-up Encode of
// the single image, then --repeats Encodes. Columns: median and minimum wall
// time per image (steady_clock) and the median process CPU time
// (CLOCK_PROCESS_CPUTIME_ID), in ms. Weights and the forward are float32.
//
// For other sizes and devices (docs/GPU.md): --model DIR benchmarks that one
// checkpoint instead of the three tiny ones; --batches 1,8,32 encodes B copies
// of the image in one Encode call and reports the call's time divided by B
// (per image) and images/s; --device cuda and --dtype bf16 set
// CheckpointTowerOptions::device / compute_dtype; --attention unfused turns
// CheckpointTowerOptions::fused_attention off (CUDA with libtorch >= 2 only;
// elsewhere both are the unfused path). The output is copied to host
// memory, so each timed call ends after the device finished.
//
// Exit status 0 on success; any error goes to stderr with status 1.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "epd/checkpoint_tower/checkpoint_tower.h"
#include "epd/media/preprocess.h"
#include "epd/model/checkpoint.h"
#include "tool_flags.h"

namespace {

constexpr const char* kDefaultPhoto = "/usr/lib/python3/dist-packages/skimage/data/astronaut.png";
constexpr const char* kArchs[] = {"qwen2_vl", "qwen2_5_vl", "qwen3_vl"};

struct Row {
  std::string arch;
  int threads = 0;
  int batch = 1;
  epd::GridTHW grid;
  std::int64_t patches = 0;
  std::int64_t tokens = 0;
  std::int64_t depth = 0;
  std::int64_t width = 0;
  double preprocess_ms = 0;
  double median_ms = 0;
  double min_ms = 0;
  double median_cpu_ms = 0;
  int repeats = 0;
};

int Fail(const std::string& message) {
  std::cerr << "checkpoint_tower_bench: " << message << "\n";
  return 1;
}

double ProcessCpuMs() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

double WallMs() {
  using Ms = std::chrono::duration<double, std::milli>;
  return Ms(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The median as Python's statistics.median takes it (mean of the middle two
// for an even count), so both benches summarise alike.
double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int Run(int argc, char** argv) {
  std::string models = "build/models", model, photo = kDefaultPhoto, json_out, device = "cpu", dtype = "f32";
  int repeats = 5;
  std::vector<int> thread_counts = {1, 2};
  std::vector<int> batches = {1};
  std::string attention = "fused";
  epd::tower_tools::FlagParser flags;
  flags.Text("--models", &models);
  flags.Text("--model", &model);
  flags.Text("--photo", &photo);
  flags.Text("--json", &json_out);
  flags.Text("--device", &device);
  flags.Int("--repeats", 1, &repeats);
  flags.Choice("--dtype", {"f32", "bf16"}, &dtype);
  flags.Choice("--attention", {"fused", "unfused"}, &attention);
  flags.IntList("--threads", 1, &thread_counts);
  flags.IntList("--batches", 1, &batches);
  if (epd::Status s = flags.Parse(argc, argv); !s.ok()) return Fail(s.message());
  const bool fused_attention = attention == "fused";

  std::ifstream file(photo, std::ios::binary);
  if (!file) return Fail("cannot read --photo " + photo);
  const std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());

  std::vector<std::string> dirs;
  if (!model.empty()) {
    dirs.push_back(model);
  } else {
    for (const char* arch : kArchs) dirs.push_back(models + "/tiny-" + arch);
  }

  std::vector<Row> rows;
  for (const std::string& dir : dirs) {
    auto checkpoint = epd::OpenCheckpoint(dir);
    if (!checkpoint.ok()) return Fail(checkpoint.status().ToString());
    const epd::VisionConfig& vision = (*checkpoint)->vision();

    const double p0 = WallMs();
    auto image = epd::DecodeAndPreprocess(bytes, (*checkpoint)->preprocess());
    const double preprocess_ms = WallMs() - p0;
    if (!image.ok()) return Fail(photo + ": " + image.status().ToString());
    epd::TowerItem item;
    item.patches = image->patches.data();
    item.grid = image->grid;
    item.patch_dim = image->patch_dim;

    for (int threads : thread_counts) {
      epd::CheckpointTowerOptions opts;
      opts.num_threads = threads;
      opts.device = device;
      opts.compute_dtype = dtype == "bf16" ? epd::DType::kBFloat16 : epd::DType::kFloat32;
      opts.fused_attention = fused_attention;
      auto tower = epd::LoadCheckpointTower(*checkpoint, opts);
      if (!tower.ok()) return Fail(tower.status().ToString());
      for (int batch : batches) {
        const std::vector<epd::TowerItem> items(static_cast<std::size_t>(batch), item);
        auto warm = (*tower)->Encode(items);
        if (!warm.ok()) return Fail(warm.status().ToString());
        std::vector<double> walls, cpus;
        for (int r = 0; r < repeats; ++r) {
          const double w0 = WallMs(), c0 = ProcessCpuMs();
          auto out = (*tower)->Encode(items);
          walls.push_back((WallMs() - w0) / batch);
          cpus.push_back((ProcessCpuMs() - c0) / batch);
          if (!out.ok()) return Fail(out.status().ToString());
        }
        Row row;
        row.arch = std::string(epd::VisionArchName(vision.arch));
        row.threads = threads;
        row.batch = batch;
        row.grid = image->grid;
        row.patches = image->grid.patches();
        row.tokens = warm->tokens / batch;
        row.depth = vision.depth;
        row.width = vision.width;
        row.preprocess_ms = preprocess_ms;
        row.median_ms = Median(walls);
        row.min_ms = *std::min_element(walls.begin(), walls.end());
        row.median_cpu_ms = Median(cpus);
        row.repeats = repeats;
        rows.push_back(row);
      }
    }
  }

  double load[1] = {0};
  if (getloadavg(load, 1) != 1) load[0] = -1;
  const std::string base = photo.substr(photo.find_last_of('/') + 1);
  std::printf(
      "C++ checkpoint towers (epd/checkpoint_tower/checkpoint_tower.h, %s on %s, %s attention), %s, %zu bytes, load "
      "average %.2f\n\n",
      dtype.c_str(), device.c_str(), fused_attention ? "fused" : "unfused", base.c_str(), bytes.size(), load[0]);
  std::printf(
      "| arch | threads | batch | depth x width | grid (t,h,w) | tokens | preprocess ms | forward ms/image (median) | "
      "min | CPU ms (median) | images/s (median) |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    std::printf("| %s | %d | %d | %lld x %lld | (%lld, %lld, %lld) | %lld | %.1f | %.1f | %.1f | %.1f | %.1f |\n",
                r.arch.c_str(), r.threads, r.batch, static_cast<long long>(r.depth), static_cast<long long>(r.width),
                static_cast<long long>(r.grid.t), static_cast<long long>(r.grid.h), static_cast<long long>(r.grid.w),
                static_cast<long long>(r.tokens), r.preprocess_ms, r.median_ms, r.min_ms, r.median_cpu_ms,
                1e3 / r.median_ms);
  }

  if (!json_out.empty()) {
    nlohmann::json doc;
    doc["schema"] = "epd-bench-checkpoint-tower/1";
    doc["photo"] = photo;
    doc["load_average"] = load[0];
    doc["device"] = device;
    doc["rows"] = nlohmann::json::array();
    for (const Row& r : rows) {
      doc["rows"].push_back({{"arch", r.arch},
                             {"dtype", dtype},
                             {"threads", r.threads},
                             {"batch", r.batch},
                             {"grid_thw", {r.grid.t, r.grid.h, r.grid.w}},
                             {"patches", r.patches},
                             {"tokens", r.tokens},
                             {"depth", r.depth},
                             {"width", r.width},
                             {"preprocess_ms", r.preprocess_ms},
                             {"median_ms", r.median_ms},
                             {"min_ms", r.min_ms},
                             {"median_cpu_ms", r.median_cpu_ms},
                             {"repeats", r.repeats}});
    }
    std::ofstream out(json_out);
    out << doc.dump(2) << "\n";
    if (!out) return Fail("cannot write --json " + json_out);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return epd::tower_tools::RunReportingExceptions("checkpoint_tower_bench", Run, argc, argv);
}
