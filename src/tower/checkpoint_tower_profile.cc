// checkpoint_tower_profile: a Chrome trace of the checkpoint tower's Encode
// calls under libtorch's Kineto profiler (the C++ side of torch.profiler),
// for scripts/tower_profile.py to read (docs/GPU.md "Tower restructure").
//
//   checkpoint_tower_profile --model DIR --trace OUT.json [--photo FILE]
//       [--device cuda] [--dtype bf16] [--batch 8] [--calls 3]
//       [--config default] [--threads 1] [--output host|device]
//
// Loads the tower with the named step configuration (tower_steps.h), runs
// two untimed Encodes of `batch` copies of the photo (warm-up: cuBLAS, the
// flash probe, graph capture), then `calls` Encodes with the profiler on
// (CPU and CUDA activities). Each Encode is one "epd::encode" user range;
// inside it the tower marks "epd::tower_metadata" (a metadata-cache miss
// only), "epd::tower_stage_pixels", "epd::tower_forward" and
// "epd::tower_output". Prints the wall time of each profiled call and writes
// the trace. The output dtype is the compute dtype; --output device keeps it
// in device memory (output_on_device). Exit status 1 on any error. A separate program from
// checkpoint_tower_bench, so that a libtorch whose profiler API differs
// breaks only this target (gpu-check.sh builds it on its own).
#include <ATen/record_function.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "epd/checkpoint_tower/checkpoint_tower.h"
#include "epd/media/preprocess.h"
#include "epd/model/checkpoint.h"
#include "tool_flags.h"
#include "tower_steps.h"

namespace {

namespace prof = torch::autograd::profiler;
namespace impl = torch::profiler::impl;

int Fail(const std::string& message) {
  std::fprintf(stderr, "checkpoint_tower_profile: %s\n", message.c_str());
  return 1;
}

struct ProfileFlags {
  std::string model, trace, photo = "/usr/lib/python3/dist-packages/skimage/data/astronaut.png", device = "cuda",
                            dtype = "bf16", config = "default", output = "host";
  int batch = 8, calls = 3, threads = 1;
};

// The flags; an error's message is what Fail prints.
epd::Status ParseProfileFlags(int argc, char** argv, ProfileFlags* f) {
  epd::tower_tools::FlagParser flags;
  flags.Texts({{"--model", &f->model},
               {"--trace", &f->trace},
               {"--photo", &f->photo},
               {"--device", &f->device},
               {"--config", &f->config}});
  flags.Choice("--dtype", {"f32", "bf16"}, &f->dtype);
  flags.Choice("--output", {"host", "device"}, &f->output);
  flags.Int("--batch", 1, &f->batch);
  flags.Int("--calls", 1, &f->calls);
  flags.Int("--threads", 1, &f->threads);
  if (epd::Status s = flags.Parse(argc, argv); !s.ok()) return s;
  if (f->model.empty() || f->trace.empty()) {
    return epd::InvalidArgument("usage: checkpoint_tower_profile --model DIR --trace OUT.json ...");
  }
  return epd::Status::Ok();
}

// The tower in --config's step configuration; an error's message is what
// Fail prints.
epd::StatusOr<std::unique_ptr<epd::VisionTower>> LoadProfiledTower(
    const std::shared_ptr<const epd::Checkpoint>& checkpoint, const ProfileFlags& f) {
  epd::CheckpointTowerOptions opts;
  opts.num_threads = f.threads;
  opts.device = f.device;
  opts.compute_dtype = f.dtype == "bf16" ? epd::DType::kBFloat16 : epd::DType::kFloat32;
  opts.output_on_device = f.output == "device";
  opts.output_dtype = opts.compute_dtype;
  if (!epd::tower_tools::ApplyStepConfig(f.config, &opts)) return epd::InvalidArgument("unknown --config " + f.config);
  auto tower = epd::LoadCheckpointTower(checkpoint, opts);
  if (!tower.ok()) return epd::Status(tower.status().code(), tower.status().ToString());
  return tower;
}

// --calls Encodes of `items` under the profiler, each one "epd::encode" user
// range; their wall times in *ms and the trace written to --trace.
epd::Status ProfileCalls(epd::VisionTower& tower, const std::vector<epd::TowerItem>& items, const ProfileFlags& f,
                         std::vector<double>* ms) {
  const prof::ProfilerConfig cfg(impl::ProfilerState::KINETO, /*report_input_shapes=*/false,
                                 /*profile_memory=*/false);
  std::set<impl::ActivityType> activities{impl::ActivityType::CPU};
  if (f.device.rfind("cuda", 0) == 0) activities.insert(impl::ActivityType::CUDA);
  prof::prepareProfiler(cfg, activities);
  prof::enableProfiler(cfg, activities);
  for (int i = 0; i < f.calls; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    epd::Status status = epd::Status::Ok();
    {
      RECORD_USER_SCOPE("epd::encode");
      auto out = tower.Encode(items);
      if (!out.ok()) status = out.status();
    }
    if (!status.ok()) {
      prof::disableProfiler();
      return {status.code(), status.ToString()};
    }
    ms->push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::unique_ptr<prof::ProfilerResult> result = prof::disableProfiler();
  try {
    result->save(f.trace);
  } catch (const c10::Error& e) {  // e.g. a libtorch built without Kineto (Debian's)
    return epd::Internal("cannot write the trace: " + std::string(e.what_without_backtrace()));
  }
  return epd::Status::Ok();
}

int Run(int argc, char** argv) {
  ProfileFlags f;
  if (epd::Status s = ParseProfileFlags(argc, argv, &f); !s.ok()) return Fail(s.message());
  auto checkpoint = epd::OpenCheckpoint(f.model);
  if (!checkpoint.ok()) return Fail(checkpoint.status().ToString());
  std::ifstream file(f.photo, std::ios::binary);
  if (!file) return Fail("cannot read --photo " + f.photo);
  const std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  auto image = epd::DecodeAndPreprocess(bytes, (*checkpoint)->preprocess());
  if (!image.ok()) return Fail(f.photo + ": " + image.status().ToString());
  auto tower = LoadProfiledTower(*checkpoint, f);
  if (!tower.ok()) return Fail(tower.status().message());

  epd::TowerItem item{image->patches.data(), image->grid, image->patch_dim};
  const std::vector<epd::TowerItem> items(static_cast<std::size_t>(f.batch), item);
  for (int i = 0; i < 2; ++i) {
    auto warm = (*tower)->Encode(items);
    if (!warm.ok()) return Fail("warm-up: " + warm.status().ToString());
  }
  std::vector<double> ms;
  if (epd::Status s = ProfileCalls(**tower, items, f, &ms); !s.ok()) return Fail(s.message());
  std::printf("%s (%s, batch %d, config %s): %s\n", f.model.c_str(), f.device.c_str(), f.batch, f.config.c_str(),
              (*tower)->Describe().c_str());
  for (std::size_t i = 0; i < ms.size(); ++i) {
    std::printf("profiled call %zu: %.2f ms (%.2f ms/image)\n", i, ms[i], ms[i] / f.batch);
  }
  std::printf("trace: %s\n", f.trace.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return epd::tower_tools::RunReportingExceptions("checkpoint_tower_profile", Run, argc, argv);
}
