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

int Run(int argc, char** argv) {
  std::string model, trace, photo = "/usr/lib/python3/dist-packages/skimage/data/astronaut.png", device = "cuda",
                            dtype = "bf16", config = "default";
  int batch = 8, calls = 3, threads = 1;
  epd::tower_tools::FlagParser flags;
  flags.Texts(
      {{"--model", &model}, {"--trace", &trace}, {"--photo", &photo}, {"--device", &device}, {"--config", &config}});
  flags.Choice("--dtype", {"f32", "bf16"}, &dtype);
  std::string output = "host";
  flags.Choice("--output", {"host", "device"}, &output);
  flags.Int("--batch", 1, &batch);
  flags.Int("--calls", 1, &calls);
  flags.Int("--threads", 1, &threads);
  if (epd::Status s = flags.Parse(argc, argv); !s.ok()) return Fail(s.message());
  if (model.empty() || trace.empty()) return Fail("usage: checkpoint_tower_profile --model DIR --trace OUT.json ...");

  auto checkpoint = epd::OpenCheckpoint(model);
  if (!checkpoint.ok()) return Fail(checkpoint.status().ToString());
  std::ifstream file(photo, std::ios::binary);
  if (!file) return Fail("cannot read --photo " + photo);
  const std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  auto image = epd::DecodeAndPreprocess(bytes, (*checkpoint)->preprocess());
  if (!image.ok()) return Fail(photo + ": " + image.status().ToString());

  epd::CheckpointTowerOptions opts;
  opts.num_threads = threads;
  opts.device = device;
  opts.compute_dtype = dtype == "bf16" ? epd::DType::kBFloat16 : epd::DType::kFloat32;
  opts.output_on_device = output == "device";
  opts.output_dtype = opts.compute_dtype;
  if (!epd::tower_tools::ApplyStepConfig(config, &opts)) return Fail("unknown --config " + config);
  auto tower = epd::LoadCheckpointTower(*checkpoint, opts);
  if (!tower.ok()) return Fail(tower.status().ToString());
  epd::TowerItem item{image->patches.data(), image->grid, image->patch_dim};
  const std::vector<epd::TowerItem> items(static_cast<std::size_t>(batch), item);
  for (int i = 0; i < 2; ++i) {
    auto warm = (*tower)->Encode(items);
    if (!warm.ok()) return Fail("warm-up: " + warm.status().ToString());
  }

  const prof::ProfilerConfig cfg(impl::ProfilerState::KINETO, /*report_input_shapes=*/false,
                                 /*profile_memory=*/false);
  std::set<impl::ActivityType> activities{impl::ActivityType::CPU};
  if (device.rfind("cuda", 0) == 0) activities.insert(impl::ActivityType::CUDA);
  prof::prepareProfiler(cfg, activities);
  prof::enableProfiler(cfg, activities);
  std::vector<double> ms;
  for (int i = 0; i < calls; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    epd::Status status = epd::Status::Ok();
    {
      RECORD_USER_SCOPE("epd::encode");
      auto out = (*tower)->Encode(items);
      if (!out.ok()) status = out.status();
    }
    if (!status.ok()) {
      prof::disableProfiler();
      return Fail(status.ToString());
    }
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::unique_ptr<prof::ProfilerResult> result = prof::disableProfiler();
  try {
    result->save(trace);
  } catch (const c10::Error& e) {  // e.g. a libtorch built without Kineto (Debian's)
    return Fail("cannot write the trace: " + std::string(e.what_without_backtrace()));
  }
  std::printf("%s (%s, batch %d, config %s): %s\n", model.c_str(), device.c_str(), batch, config.c_str(),
              (*tower)->Describe().c_str());
  for (std::size_t i = 0; i < ms.size(); ++i) {
    std::printf("profiled call %zu: %.2f ms (%.2f ms/image)\n", i, ms[i], ms[i] / batch);
  }
  std::printf("trace: %s\n", trace.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return epd::tower_tools::RunReportingExceptions("checkpoint_tower_profile", Run, argc, argv);
}
