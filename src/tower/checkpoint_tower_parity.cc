// checkpoint_tower_parity: the checkpoint tower on a device in a low
// precision against the same checkpoint on the CPU in float32, on photos
// (issue 24, "Correctness": the CUDA bf16 tower against the CPU float32 tower
// on 4 real photos of different sizes, mean row cosine >= 0.999 and
// relative L2 <= 3e-2).
//
//   checkpoint_tower_parity --model DIR --photos A.png,B.jpg,... [--device cuda]
//       [--dtype bf16] [--cpu-threads 0] [--json OUT.json]
//       [--min-cosine 0.999] [--max-rel-l2 0.03]
//
// Each photo is preprocessed with the checkpoint's own config and encoded
// alone on both towers (float32 output). Per photo and output (main, and
// deepstack when the tower has it): the mean over rows of the cosine between
// the device row and the CPU row, and ||device - cpu||_2 / ||cpu||_2 over the
// whole output. Prints a Markdown table. Exit status: 0 when every photo
// meets both bounds, 2 when one misses, 1 on an error.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
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

int Fail(const std::string& message) {
  std::fprintf(stderr, "checkpoint_tower_parity: %s\n", message.c_str());
  return 1;
}

std::vector<float> Floats(const std::vector<std::byte>& bytes) {
  std::vector<float> v(bytes.size() / sizeof(float));
  if (!v.empty()) std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

struct Agreement {
  double mean_cosine = 0;
  double rel_l2 = 0;
};

// Rows of `width` floats; both vectors the same size.
Agreement Compare(const std::vector<float>& got, const std::vector<float>& want, std::int64_t width) {
  Agreement a;
  const std::size_t rows = want.size() / static_cast<std::size_t>(width);
  double diff2 = 0, want2 = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    double dot = 0, g2 = 0, w2 = 0;
    for (std::size_t c = 0; c < static_cast<std::size_t>(width); ++c) {
      const double g = got[r * static_cast<std::size_t>(width) + c];
      const double w = want[r * static_cast<std::size_t>(width) + c];
      dot += g * w;
      g2 += g * g;
      w2 += w * w;
      diff2 += (g - w) * (g - w);
    }
    want2 += w2;
    a.mean_cosine += dot / std::sqrt(std::max(g2 * w2, 1e-300));
  }
  a.mean_cosine /= static_cast<double>(rows);
  a.rel_l2 = std::sqrt(diff2 / std::max(want2, 1e-300));
  return a;
}

std::unique_ptr<epd::VisionTower> Load(const std::shared_ptr<const epd::Checkpoint>& ck, const std::string& device,
                                       epd::DType compute, int threads, std::string* error) {
  epd::CheckpointTowerOptions o;
  o.device = device;
  o.compute_dtype = compute;
  o.num_threads = threads;
  auto t = epd::LoadCheckpointTower(ck, o);
  if (!t.ok()) {
    *error = t.status().ToString();
    return nullptr;
  }
  return std::move(*t);
}

struct ParityFlags {
  std::string model, photos_flag, device = "cuda", dtype = "bf16", json_out;
  int cpu_threads = 0;
  double min_cosine = 0, max_rel = 0;  // --min-cosine, --max-rel-l2
  std::vector<std::string> photos;     // --photos, split
};

// The flags; an error's message is what Fail prints. A bound that is not a
// number throws (std::stod), which RunReportingExceptions reports.
epd::Status ParseParityFlags(int argc, char** argv, ParityFlags* f) {
  std::string min_cosine_s = "0.999", max_rel_s = "0.03";
  epd::tower_tools::FlagParser flags;
  flags.Texts({{"--model", &f->model}, {"--photos", &f->photos_flag}, {"--device", &f->device}});
  flags.Texts({{"--json", &f->json_out}, {"--min-cosine", &min_cosine_s}, {"--max-rel-l2", &max_rel_s}});
  flags.Choice("--dtype", {"f32", "bf16"}, &f->dtype);
  flags.Int("--cpu-threads", 0, &f->cpu_threads);
  if (epd::Status s = flags.Parse(argc, argv); !s.ok()) return s;
  if (f->model.empty() || f->photos_flag.empty()) {
    return epd::InvalidArgument("usage: checkpoint_tower_parity --model DIR --photos A,B,...");
  }
  f->min_cosine = std::stod(min_cosine_s);
  f->max_rel = std::stod(max_rel_s);
  std::stringstream list(f->photos_flag);
  for (std::string p; std::getline(list, p, ',');) f->photos.push_back(p);
  return epd::Status::Ok();
}

// One photo on both towers: a table row per output (main, and deepstack when
// the tower has it), printed and added to `rows`; *all_ok turns false when
// one misses a bound. An error's message is what Fail prints.
epd::Status ComparePhoto(const std::string& photo, const epd::Checkpoint& checkpoint, epd::VisionTower& cpu,
                         epd::VisionTower& dev, const ParityFlags& f, nlohmann::json* rows, bool* all_ok) {
  std::ifstream file(photo, std::ios::binary);
  if (!file) return epd::InvalidArgument("cannot read photo " + photo);
  const std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  auto image = epd::DecodeAndPreprocess(bytes, checkpoint.preprocess());
  if (!image.ok()) return epd::InvalidArgument(photo + ": " + image.status().ToString());
  const epd::TowerItem item{image->patches.data(), image->grid, image->patch_dim};
  auto want = cpu.Encode({&item, 1});
  auto got = dev.Encode({&item, 1});
  if (!want.ok()) return epd::InvalidArgument("cpu: " + want.status().ToString());
  if (!got.ok()) return epd::InvalidArgument(f.device + ": " + got.status().ToString());
  const epd::GridTHW& g = image->grid;
  char grid[96];
  std::snprintf(grid, sizeof(grid), "(%lld, %lld, %lld)", static_cast<long long>(g.t), static_cast<long long>(g.h),
                static_cast<long long>(g.w));
  const std::string name = photo.substr(photo.find_last_of('/') + 1);
  for (const char* output : {"main", "deepstack"}) {
    const bool main = std::string(output) == "main";
    if (!main && want->deepstack_layers == 0) continue;
    const std::int64_t width = main ? want->hidden : want->hidden * want->deepstack_layers;
    const Agreement a =
        Compare(Floats(main ? got->main : got->deepstack), Floats(main ? want->main : want->deepstack), width);
    const bool ok = a.mean_cosine >= f.min_cosine && a.rel_l2 <= f.max_rel;
    *all_ok = *all_ok && ok;
    std::printf("| %s | %s | %s | %.5f | %.4f | %s |\n", name.c_str(), grid, output, a.mean_cosine, a.rel_l2,
                ok ? "yes" : "NO");
    rows->push_back({{"photo", name},
                     {"grid_thw", {g.t, g.h, g.w}},
                     {"output", output},
                     {"mean_row_cosine", a.mean_cosine},
                     {"rel_l2", a.rel_l2},
                     {"ok", ok}});
  }
  return epd::Status::Ok();
}

int Run(int argc, char** argv) {
  ParityFlags f;
  if (epd::Status s = ParseParityFlags(argc, argv, &f); !s.ok()) return Fail(s.message());
  auto checkpoint = epd::OpenCheckpoint(f.model);
  if (!checkpoint.ok()) return Fail(checkpoint.status().ToString());
  std::string error;
  auto cpu = Load(*checkpoint, "cpu", epd::DType::kFloat32, f.cpu_threads, &error);
  if (cpu == nullptr) return Fail(error);
  auto dev = Load(*checkpoint, f.device, f.dtype == "bf16" ? epd::DType::kBFloat16 : epd::DType::kFloat32, 1, &error);
  if (dev == nullptr) return Fail(error);

  std::printf("parity: %s on %s in %s against the CPU in float32 (%s)\n\n", f.model.c_str(), f.device.c_str(),
              f.dtype.c_str(), dev->Describe().c_str());
  std::printf(
      "| photo | grid (t,h,w) | output | mean row cosine | relative L2 | within bounds |\n|---|---|---|---|---|---|\n");
  nlohmann::json rows = nlohmann::json::array();
  bool all_ok = true;
  for (const std::string& photo : f.photos) {
    if (epd::Status s = ComparePhoto(photo, **checkpoint, *cpu, *dev, f, &rows, &all_ok); !s.ok()) {
      return Fail(s.message());
    }
  }
  std::printf("\nbounds: mean row cosine >= %g, relative L2 <= %g: %s\n", f.min_cosine, f.max_rel,
              all_ok ? "met" : "MISSED");
  if (!f.json_out.empty()) {
    nlohmann::json doc = {{"schema", "epd-tower-parity/1"},
                          {"model", f.model},
                          {"device", f.device},
                          {"dtype", f.dtype},
                          {"rows", rows},
                          {"min_cosine", f.min_cosine},
                          {"max_rel_l2", f.max_rel},
                          {"met", all_ok}};
    std::ofstream out(f.json_out);
    out << doc.dump(2) << "\n";
    if (!out) return Fail("cannot write --json " + f.json_out);
  }
  return all_ok ? 0 : 2;
}

}  // namespace

int main(int argc, char** argv) {
  return epd::tower_tools::RunReportingExceptions("checkpoint_tower_parity", Run, argc, argv);
}
