// checkpoint_tower_bench: per-image forward time of the libtorch checkpoint
// towers (epd/checkpoint_tower/checkpoint_tower.h) on one photo, with the same workload and
// method as bench/checkpoint_reference_bench.py, so the two tables can be put
// side by side (docs/BENCHMARKS.md).
//
//   checkpoint_tower_bench [--models DIR | --model DIR] [--photo FILE]
//                          [--repeats N] [--threads 1,2] [--batches 1]
//                          [--device cpu] [--dtype f32|bf16] [--json OUT.json]
//                          [--attention fused|unfused] [--configs default]
//                          [--mixed 0|1] [--output host|device]
//                          [--out-dtype f32|bf16]
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
// The restructure's steps (docs/GPU.md "Tower restructure"): --configs
// runs each named configuration in turn, each adding one step to the one
// before it (CheckpointTowerOptions fields in brackets):
//   baseline     the checkpoint's separate MLP GEMMs at their own width, the
//                metadata rebuilt every forward, SDPA per segment length, ATen
//                ops, no graphs [mlp_fusion, metadata_cache_size 0,
//                varlen_attention, fused_kernels, cuda_graph_max_batch 0 off]
//   restructure  + fused gate-up GEMM padded to 64, metadata cache
//   attention    + one flash varlen call per block
//   fusions      + the fused kernels
//   graphs       + CUDA graphs (batches <= 4): the defaults
//   default      the CheckpointTowerOptions defaults, unchanged
// --mixed adds, per configuration, one call of 8 items of 8 sizes: the photo
// preprocessed with min_pixels = max_pixels = s^2 for s = 224, 320, 448, 512,
// 640, 768, 896, 1024 (smart_resize then picks the nearest grid), reported
// as batch 8 with its grids listed.
// --output device keeps the output in device memory
// (CheckpointTowerOptions::output_on_device, the serving path with the GPU
// tier: no device-to-host copy in the timed call); --out-dtype sets
// output_dtype. The default, host float32, is what the CPU tables used.
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
#include "tower_steps.h"

namespace {

constexpr const char* kDefaultPhoto = "/usr/lib/python3/dist-packages/skimage/data/astronaut.png";
constexpr const char* kArchs[] = {"qwen2_vl", "qwen2_5_vl", "qwen3_vl"};

struct Row {
  std::string arch;
  std::string config = "default";
  int threads = 0;
  int batch = 1;
  std::vector<epd::GridTHW> grids;  // one per item of the timed call
  std::int64_t patches = 0;         // per image (mean over the call's items)
  std::int64_t tokens = 0;          // per image (mean)
  std::int64_t depth = 0;
  std::int64_t width = 0;
  double preprocess_ms = 0;
  double median_ms = 0;  // per image
  double min_ms = 0;
  double median_cpu_ms = 0;
  int repeats = 0;
  epd::CheckpointTowerStats stats;
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

// The mixed-size batch: the photo at 8 target areas (see the header comment).
constexpr int kMixedSides[] = {224, 320, 448, 512, 640, 768, 896, 1024};

struct Workload {
  std::vector<epd::PreprocessedImage> images;  // own the rows
  std::vector<epd::TowerItem> items;
  double preprocess_ms = 0;  // of the first image
};

epd::TowerItem ItemOf(const epd::PreprocessedImage& image) {
  epd::TowerItem item;
  item.patches = image.patches.data();
  item.grid = image.grid;
  item.patch_dim = image.patch_dim;
  return item;
}

// Times `repeats` Encodes of `items` after one warm-up; per image.
epd::Status TimeCalls(epd::VisionTower& tower, const std::vector<epd::TowerItem>& items, int repeats, Row* row) {
  auto warm = tower.Encode(items);
  if (!warm.ok()) return warm.status();
  std::vector<double> walls, cpus;
  const auto n = static_cast<double>(items.size());
  for (int r = 0; r < repeats; ++r) {
    const double w0 = WallMs(), c0 = ProcessCpuMs();
    auto out = tower.Encode(items);
    walls.push_back((WallMs() - w0) / n);
    cpus.push_back((ProcessCpuMs() - c0) / n);
    if (!out.ok()) return out.status();
  }
  row->batch = static_cast<int>(items.size());
  row->tokens = warm->tokens / static_cast<std::int64_t>(items.size());
  for (const epd::TowerItem& it : items) {
    row->grids.push_back(it.grid);
    row->patches += it.grid.patches();
  }
  row->patches /= static_cast<std::int64_t>(items.size());
  row->median_ms = Median(walls);
  row->min_ms = *std::min_element(walls.begin(), walls.end());
  row->median_cpu_ms = Median(cpus);
  row->repeats = repeats;
  if (auto s = epd::GetCheckpointTowerStats(tower)) row->stats = *s;
  return epd::Status::Ok();
}

std::string GridText(const epd::GridTHW& g) {
  char text[96];
  std::snprintf(text, sizeof(text), "(%lld, %lld, %lld)", static_cast<long long>(g.t), static_cast<long long>(g.h),
                static_cast<long long>(g.w));
  return text;
}

void PrintTable(const std::vector<Row>& rows) {
  std::printf(
      "| arch | config | threads | batch | depth x width | grid (t,h,w) | tokens | preprocess ms | forward "
      "ms/image (median) | min | CPU ms (median) | images/s (median) | attention |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    const bool mixed =
        std::any_of(r.grids.begin(), r.grids.end(), [&](const epd::GridTHW& g) { return !(g == r.grids.front()); });
    const std::string grid = mixed ? "mixed (" + std::to_string(r.grids.size()) + " sizes)" : GridText(r.grids.front());
    std::printf("| %s | %s | %d | %d | %lld x %lld | %s | %lld | %.1f | %.2f | %.2f | %.1f | %.1f | %s%s |\n",
                r.arch.c_str(), r.config.c_str(), r.threads, r.batch, static_cast<long long>(r.depth),
                static_cast<long long>(r.width), grid.c_str(), static_cast<long long>(r.tokens), r.preprocess_ms,
                r.median_ms, r.min_ms, r.median_cpu_ms, 1e3 / r.median_ms, r.stats.attention.c_str(),
                r.stats.fused_kernels ? ", kernels" : "");
  }
}

nlohmann::json RowJson(const Row& r, const std::string& dtype) {
  nlohmann::json grids = nlohmann::json::array();
  for (const epd::GridTHW& g : r.grids) grids.push_back({g.t, g.h, g.w});
  const epd::GridTHW& g0 = r.grids.front();
  return {{"arch", r.arch},
          {"config", r.config},
          {"dtype", dtype},
          {"threads", r.threads},
          {"batch", r.batch},
          {"grid_thw", {g0.t, g0.h, g0.w}},
          {"grids", grids},
          {"patches", r.patches},
          {"tokens", r.tokens},
          {"depth", r.depth},
          {"width", r.width},
          {"preprocess_ms", r.preprocess_ms},
          {"median_ms", r.median_ms},
          {"min_ms", r.min_ms},
          {"median_cpu_ms", r.median_cpu_ms},
          {"repeats", r.repeats},
          {"attention", r.stats.attention},
          {"fused_kernels", r.stats.fused_kernels},
          {"graph_replays", r.stats.graph_replays},
          {"graph_captures", r.stats.graph_captures},
          {"metadata_hits", r.stats.metadata_hits},
          {"metadata_misses", r.stats.metadata_misses},
          {"notes", r.stats.notes}};
}

struct BenchFlags {
  std::string models = "build/models", model, photo = kDefaultPhoto, json_out, device = "cpu", dtype = "f32";
  int repeats = 5;
  int mixed = 0;
  std::vector<int> thread_counts = {1, 2};
  std::vector<int> batches = {1};
  std::string attention = "fused";
  std::string configs_flag = "default";
  std::string output = "host", out_dtype = "f32";
  std::vector<std::string> configs;  // --configs, split and checked
};

// `s` with its code name in the message, as Fail prints a library's error.
epd::Status Described(const epd::Status& s) { return {s.code(), s.ToString()}; }

// The flags; an error's message is what Fail prints.
epd::Status ParseBenchFlags(int argc, char** argv, BenchFlags* f) {
  epd::tower_tools::FlagParser flags;
  flags.Texts({{"--models", &f->models}, {"--model", &f->model}, {"--photo", &f->photo}});
  flags.Texts({{"--json", &f->json_out}, {"--device", &f->device}, {"--configs", &f->configs_flag}});
  flags.Int("--repeats", 1, &f->repeats);
  flags.Int("--mixed", 0, &f->mixed);
  flags.Choice("--dtype", {"f32", "bf16"}, &f->dtype);
  flags.Choice("--attention", {"fused", "unfused"}, &f->attention);
  flags.Choice("--output", {"host", "device"}, &f->output);
  flags.Choice("--out-dtype", {"f32", "bf16"}, &f->out_dtype);
  flags.IntList("--threads", 1, &f->thread_counts);
  flags.IntList("--batches", 1, &f->batches);
  if (epd::Status s = flags.Parse(argc, argv); !s.ok()) return s;
  std::stringstream list(f->configs_flag);
  for (std::string c; std::getline(list, c, ',');) {
    epd::CheckpointTowerOptions probe;
    if (!epd::tower_tools::ApplyStepConfig(c, &probe)) {
      return epd::InvalidArgument("--configs: unknown configuration '" + c +
                                  "' (baseline, restructure, attention, fusions, graphs, default)");
    }
    f->configs.push_back(c);
  }
  if (f->configs.empty()) return epd::InvalidArgument("--configs is empty");
  return epd::Status::Ok();
}

// The photo preprocessed once with the checkpoint's config (`one`, timed),
// and with --mixed at each of kMixedSides (`sizes`).
epd::Status PrepareWorkloads(const epd::Checkpoint& checkpoint, const std::vector<std::uint8_t>& bytes,
                             const BenchFlags& f, Workload* one, Workload* sizes) {
  const double p0 = WallMs();
  auto image = epd::DecodeAndPreprocess(bytes, checkpoint.preprocess());
  one->preprocess_ms = WallMs() - p0;
  if (!image.ok()) return epd::InvalidArgument(f.photo + ": " + image.status().ToString());
  one->images.push_back(std::move(*image));
  if (f.mixed == 0) return epd::Status::Ok();
  for (int side : kMixedSides) {
    epd::PreprocessConfig cfg = checkpoint.preprocess();
    cfg.min_pixels = cfg.max_pixels = static_cast<std::int64_t>(side) * side;
    auto im = epd::DecodeAndPreprocess(bytes, cfg);
    if (!im.ok()) {
      return epd::InvalidArgument(f.photo + " at " + std::to_string(side) + "^2: " + im.status().ToString());
    }
    sizes->images.push_back(std::move(*im));
  }
  for (const auto& im : sizes->images) sizes->items.push_back(ItemOf(im));
  return epd::Status::Ok();
}

epd::CheckpointTowerOptions BenchTowerOptions(const BenchFlags& f, const std::string& config, int threads) {
  epd::CheckpointTowerOptions opts;
  opts.num_threads = threads;
  opts.device = f.device;
  opts.compute_dtype = f.dtype == "bf16" ? epd::DType::kBFloat16 : epd::DType::kFloat32;
  opts.fused_attention = f.attention == "fused";
  opts.output_on_device = f.output == "device";
  opts.output_dtype = f.out_dtype == "bf16" ? epd::DType::kBFloat16 : epd::DType::kFloat32;
  epd::tower_tools::ApplyStepConfig(config, &opts);
  return opts;
}

// One row per --batches size of `one`'s image, and one for the mixed batch.
epd::Status TimeWorkloads(epd::VisionTower& tower, const Workload& one, const Workload& sizes, const BenchFlags& f,
                          const Row& base, std::vector<Row>* rows) {
  for (int batch : f.batches) {
    Row row = base;
    const std::vector<epd::TowerItem> items(static_cast<std::size_t>(batch), ItemOf(one.images.front()));
    if (epd::Status s = TimeCalls(tower, items, f.repeats, &row); !s.ok()) return Described(s);
    rows->push_back(std::move(row));
  }
  if (!sizes.items.empty()) {
    Row row = base;
    if (epd::Status s = TimeCalls(tower, sizes.items, f.repeats, &row); !s.ok()) return Described(s);
    rows->push_back(std::move(row));
  }
  return epd::Status::Ok();
}

// Every configuration and thread count of the checkpoint in `dir`.
epd::Status BenchCheckpoint(const std::string& dir, const std::vector<std::uint8_t>& bytes, const BenchFlags& f,
                            std::vector<Row>* rows) {
  auto checkpoint = epd::OpenCheckpoint(dir);
  if (!checkpoint.ok()) return Described(checkpoint.status());
  const epd::VisionConfig& vision = (*checkpoint)->vision();
  Workload one, sizes;
  if (epd::Status s = PrepareWorkloads(**checkpoint, bytes, f, &one, &sizes); !s.ok()) return s;
  for (const std::string& config : f.configs) {
    for (int threads : f.thread_counts) {
      auto tower = epd::LoadCheckpointTower(*checkpoint, BenchTowerOptions(f, config, threads));
      if (!tower.ok()) return Described(tower.status());
      Row base;
      base.arch = std::string(epd::VisionArchName(vision.arch));
      base.config = config;
      base.threads = threads;
      base.depth = vision.depth;
      base.width = vision.width;
      base.preprocess_ms = one.preprocess_ms;
      if (epd::Status s = TimeWorkloads(**tower, one, sizes, f, base, rows); !s.ok()) return s;
    }
  }
  return epd::Status::Ok();
}

void PrintReport(const BenchFlags& f, const std::vector<Row>& rows, std::size_t photo_bytes, double load) {
  const std::string base = f.photo.substr(f.photo.find_last_of('/') + 1);
  std::printf(
      "C++ checkpoint towers (epd/checkpoint_tower/checkpoint_tower.h, %s on %s, %s attention, output %s %s), %s, %zu "
      "bytes, load average %.2f\n\n",
      f.dtype.c_str(), f.device.c_str(), f.attention == "fused" ? "fused" : "unfused", f.output.c_str(),
      f.out_dtype.c_str(), base.c_str(), photo_bytes, load);
  PrintTable(rows);
  for (const Row& r : rows) {
    if (!r.stats.notes.empty()) std::printf("\nnote (%s): %s\n", r.config.c_str(), r.stats.notes.c_str());
  }
}

epd::Status WriteJson(const BenchFlags& f, const std::vector<Row>& rows, double load) {
  nlohmann::json doc;
  doc["schema"] = "epd-bench-checkpoint-tower/1";  // fields added since: config, grids, attention, ...
  doc["photo"] = f.photo;
  doc["load_average"] = load;
  doc["device"] = f.device;
  doc["output"] = f.output;
  doc["out_dtype"] = f.out_dtype;
  doc["rows"] = nlohmann::json::array();
  for (const Row& r : rows) doc["rows"].push_back(RowJson(r, f.dtype));
  std::ofstream out(f.json_out);
  out << doc.dump(2) << "\n";
  if (!out) return epd::InvalidArgument("cannot write --json " + f.json_out);
  return epd::Status::Ok();
}

int Run(int argc, char** argv) {
  BenchFlags f;
  if (epd::Status s = ParseBenchFlags(argc, argv, &f); !s.ok()) return Fail(s.message());
  std::ifstream file(f.photo, std::ios::binary);
  if (!file) return Fail("cannot read --photo " + f.photo);
  const std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());

  std::vector<std::string> dirs;
  if (!f.model.empty()) {
    dirs.push_back(f.model);
  } else {
    for (const char* arch : kArchs) dirs.push_back(f.models + "/tiny-" + arch);
  }
  std::vector<Row> rows;
  for (const std::string& dir : dirs) {
    if (epd::Status s = BenchCheckpoint(dir, bytes, f, &rows); !s.ok()) return Fail(s.message());
  }

  double load[1] = {0};
  if (getloadavg(load, 1) != 1) load[0] = -1;
  PrintReport(f, rows, bytes.size(), load[0]);
  if (!f.json_out.empty()) {
    if (epd::Status s = WriteJson(f, rows, load[0]); !s.ok()) return Fail(s.message());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return epd::tower_tools::RunReportingExceptions("checkpoint_tower_bench", Run, argc, argv);
}
