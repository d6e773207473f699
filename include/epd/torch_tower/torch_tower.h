// epd/torch_tower/torch_tower.h: a VisionTower that runs a TorchScript module (libtorch).
//
// Where the default alternative would be to embed a hand-written ViT, this
// backend runs any tower exported with torch.jit.script that follows the
// contract in docs/TOWER.md, in short:
//   int attributes   patch_dim, merge_size, hidden_size, deepstack_layers
//   forward(pixel_values: float32 [N, patch_dim], grid_thw: int64 [n_items, 3])
//       -> Tuple[main [T, hidden_size], deepstack [T, hidden_size * deepstack_layers]]
// with T = sum over items of t*h*w / merge_size^2, rows in item order, and
// each item attending only to its own patches. The deepstack tensor is
// [T, 0] when deepstack_layers == 0. Outputs may be any floating dtype; they
// are converted to `output_dtype` (16-bit types: round to nearest even).
//
// Encode() packs the items' patch rows into one [N, patch_dim] tensor, builds
// grid_thw, runs forward under c10::InferenceMode, checks the outputs against
// the contract and copies them into TowerOutput's host buffers.
//
// Errors (never thrown; libtorch exceptions are translated here):
//   LoadTorchScriptTower:
//     kNotFound            model_path does not exist
//     kInvalidArgument     not a TorchScript archive; a contract attribute
//                          missing, not an int or out of range; no
//                          forward(pixel_values, grid_thw); bad device string
//                          or num_threads < 0; output_on_device with device
//                          "cpu"; the warm-up forward failed (Encode's
//                          message below, prefixed "warm-up forward")
//     kFailedPrecondition  device "cuda[:N]" without a usable CUDA device
//   Encode:
//     kInvalidArgument     an item with null patches, t/h/w < 1, h or w not a
//                          multiple of merge_size, or patch_dim != patch_dim()
//     kInternal            forward threw (the message is torch's), or returned
//                          the wrong type, shape or dtype (names expected vs got)
//
// Cost: Encode copies the inputs once into a tensor (N * patch_dim * 4 bytes)
// and the outputs once into the host vectors; the forward dominates. The
// default tower (scripts/make_default_tower.py) takes about 90 ms for one
// 512x512 image with 2 threads on an idle 2-core machine (docs/TOWER.md).
//
// Threads: libtorch's intra-op pool is process-wide, so num_threads applies
// to the whole process; Encode re-applies it on its calling thread (OpenMP
// keeps the count per thread). Two towers with different counts in one
// process therefore contend; use one count per process.
//
// Thread safety: thread-compatible, like every VisionTower: one thread calls
// Encode at a time. The metadata accessors are safe to call concurrently.
//
// Example:
//   epd::TorchTowerOptions opts;
//   opts.model_path = "build/models/default_tower.pt";
//   opts.num_threads = 2;
//   auto tower = epd::LoadTorchScriptTower(opts);
//   if (!tower.ok()) return tower.status();
//   epd::TowerItem item{pre.patches.data(), pre.grid, pre.patch_dim};
//   auto out = (*tower)->Encode({&item, 1});  // out->main: [tokens, hidden] float32
#pragma once

#include <memory>
#include <string>

#include "epd/core/embedding.h"
#include "epd/core/status.h"
#include "epd/core/vision_tower.h"

namespace epd {

// Where and how a tower's forward runs, and what it hands back: the fields
// every tower kind shares. TorchTowerOptions, CheckpointTowerOptions and
// ModelOptions (epd/checkpoint_tower/checkpoint_tower.h) each hold one as
// their base, so `options.device` reads the same on all three and LoadModel
// passes it on in one assignment.
struct TowerRuntimeOptions {
  // Intra-op threads. 0 = std::thread::hardware_concurrency(). libtorch's
  // own default is 1 under some launchers, which wastes the other cores.
  // Process-wide (see "Threads" above). Must be >= 0.
  int num_threads = 0;
  // "cpu", "cuda" (device 0) or "cuda:N". Inputs are moved to the device and
  // outputs copied back to host memory (unless output_on_device).
  std::string device = "cpu";
  // dtype of TowerOutput. kBFloat16 or kFloat16 halve the bytes per row;
  // the conversion rounds to nearest even.
  DType output_dtype = DType::kFloat32;
  // CUDA only: leave the output in device memory (TowerOutput::on_device(),
  // output_on_device() true) instead of copying it to host vectors. Encode
  // synchronises the device before returning, so the rows are complete; the
  // output tensors live as long as TowerOutput::device_owner. A worker then
  // needs WorkerOptions::adopt_device_rows (the GPU tier). kInvalidArgument
  // at load with device "cpu".
  bool output_on_device = false;
  // Process-wide, once, glibc only: raise malloc's mmap threshold to 32 MiB
  // and its trim threshold to 256 MiB, so the forward's large temporaries
  // are reused across calls instead of being unmapped and page-faulted back
  // in every time. Measured on the default tower (one 512x512 image, 2
  // threads): 112 -> 58-75 ms, with the same peak RSS. Turn off if the
  // process must hand freed memory back to the OS between calls (or tunes
  // malloc itself, as the CLI does).
  bool tune_malloc = true;
};

struct TorchTowerOptions : TowerRuntimeOptions {
  // Path of a TorchScript archive (torch.jit.save). Required.
  std::string model_path;
  // Run two forwards on one zero-valued merge block at load. TorchScript's
  // profiling executor profiles and then optimises a graph on its first two
  // calls, which costs about a second; warming up moves that cost out of the
  // first request and checks the output contract before serving.
  bool warm_up = true;
};

// Loads and checks the module; see the header comment for the errors.
// The returned tower owns the module. Describe() gives e.g.
// "torchscript:/path/model.pt (cpu, 2 threads, hidden 512, deepstack 2, float32)".
StatusOr<std::unique_ptr<VisionTower>> LoadTorchScriptTower(const TorchTowerOptions& options);

}  // namespace epd
