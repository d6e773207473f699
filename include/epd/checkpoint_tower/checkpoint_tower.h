// epd/checkpoint_tower/checkpoint_tower.h: VisionTowers that run Qwen2-VL, Qwen2.5-VL and
// Qwen3-VL vision towers natively in libtorch, from a Hugging Face
// checkpoint directory (epd/model/checkpoint.h), and the one function that loads
// whatever --model names.
//
// Where LoadTorchScriptTower (epd/torch_tower/torch_tower.h) runs a module someone
// exported to our contract, these towers are written here, in C++, after the
// architecture descriptions in transformers/models/{qwen2_vl,qwen2_5_vl,
// qwen3_vl}/modeling_*.py, and read the checkpoint's own tensors:
//   Qwen2-VL    Conv3d patch embedding (a linear map of the flattened patch),
//               2D rotary embedding (half of each head's frequencies turn with
//               the patch row, half with the column; inv_freq = 10000^(-2j/d),
//               d = head_dim / 2), pre-norm LayerNorm blocks, QuickGELU MLP,
//               attention within each frame of each item (cu_seqlens), and
//               the PatchMerger (LayerNorm, fold m x m patches, GELU MLP).
//   Qwen2.5-VL  RMSNorm, SwiGLU MLP with biases, and window attention: every
//               block not in fullatt_block_indexes attends within windows of
//               window_size pixels (112 = 8x8 patches = 4x4 merge blocks),
//               tokens permuted window by window before the blocks and back
//               after the merger. Windows at the right and bottom edges are
//               cut short when the grid is not a multiple of the window.
//   Qwen3-VL    patch 16 with bias, a learned position table bilinearly
//               interpolated (align_corners) to each item's grid, GELU(tanh)
//               MLP, LayerNorm, and deepstack: after each block in
//               deepstack_visual_indexes, deepstack_merger_list[j] (norm after
//               folding) maps the hidden state to [T, out_hidden].
// Outputs follow the VisionTower contract (epd/core/vision_tower.h):
//   main       [T, out_hidden]
//   deepstack  [T, out_hidden * k], k = len(deepstack_visual_indexes); columns
//              [j * out_hidden, (j + 1) * out_hidden) hold merger j's output,
//              in the order of deepstack_visual_indexes (docs/TOWER.md).
// Items never influence each other: every attention segment lies inside one
// frame of one item, and every other op is per token.
//
// Attention: on CPU, matmul + softmax per segment (consecutive segments of
// equal length are batched into one matmul). On CUDA, with libtorch >= 2,
// at::scaled_dot_product_attention over the same groups (fused kernels);
// with libtorch 1.x the CPU path runs on the device.
//
// Weights are copied out of the checkpoint's mappings once, at load, into
// tensors of `compute_dtype` on the device; the checkpoint itself is then
// released.
//
// Errors:
//   LoadCheckpointTower: every OpenCheckpoint error (epd/model/checkpoint.h);
//     kInvalidArgument for num_threads < 0, a bad device string,
//     output_on_device on cpu; kFailedPrecondition for cuda without CUDA.
//   Encode: kInvalidArgument for items as in epd/torch_tower/torch_tower.h (null
//     patches, bad grid, h or w not a multiple of merge_size, patch_dim
//     mismatch); kInternal when libtorch throws (its message).
//
// Cost: O(sum over items of t*h*w * width^2 * depth) for the linear layers
// plus the attention, O(segment length^2) per segment. Load converts the
// tower's tensors once (one pass over its bytes).
//
// Threads: as epd/torch_tower/torch_tower.h (num_threads is process-wide; Encode
// re-applies it on its calling thread).
// Thread safety: thread-compatible, like every VisionTower.
//
// Example:
//   epd::CheckpointTowerOptions opts;
//   opts.dir = "/models/Qwen2.5-VL-7B-Instruct";
//   opts.num_threads = 8;
//   auto tower = epd::LoadCheckpointTower(opts);
//   if (!tower.ok()) return tower.status();
//   auto out = (*tower)->Encode({&item, 1});  // out->main: [tokens, 3584] float32
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "epd/core/embedding.h"
#include "epd/core/status.h"
#include "epd/core/vision_tower.h"
#include "epd/media/preprocess.h"
#include "epd/model/checkpoint.h"

namespace epd {

struct CheckpointTowerOptions {
  // The checkpoint directory. Required by LoadCheckpointTower(options).
  std::string dir;
  // Intra-op threads; 0 = std::thread::hardware_concurrency().
  int num_threads = 0;
  // "cpu", "cuda" (device 0) or "cuda:N".
  std::string device = "cpu";
  // dtype the weights are converted to at load and the forward runs in.
  // kFloat32 matches the reference to ~1e-5; kBFloat16 is for GPUs (softmax
  // and norms still accumulate in float32 inside libtorch).
  DType compute_dtype = DType::kFloat32;
  // dtype of TowerOutput (16-bit types round to nearest even).
  DType output_dtype = DType::kFloat32;
  // CUDA only: leave the output in device memory (see epd/torch_tower/torch_tower.h).
  bool output_on_device = false;
  // As TorchTowerOptions::tune_malloc.
  bool tune_malloc = true;
  // CUDA with libtorch >= 2 only: attention through
  // at::scaled_dot_product_attention (flash / memory-efficient kernels).
  // false keeps the explicit matmul + float32 softmax + matmul, the path a
  // CPU or libtorch 1.x build always takes (for benchmarks comparing the two).
  bool fused_attention = true;
};

// Opens options.dir and builds its tower. Describe() gives e.g.
// "checkpoint:/models/q (qwen2_5_vl, cpu, 8 threads, hidden 3584, deepstack 0, float32)".
StatusOr<std::unique_ptr<VisionTower>> LoadCheckpointTower(const CheckpointTowerOptions& options);

// The same from an opened checkpoint (options.dir is ignored).
StatusOr<std::unique_ptr<VisionTower>> LoadCheckpointTower(std::shared_ptr<const Checkpoint> checkpoint,
                                                           const CheckpointTowerOptions& options);

// What --model loads, decided by what the path is.
struct ModelOptions {
  // A checkpoint directory, or a TorchScript archive file (docs/TOWER.md).
  std::string path;
  int num_threads = 0;
  std::string device = "cpu";
  DType output_dtype = DType::kFloat32;
  bool output_on_device = false;
  // As TorchTowerOptions::tune_malloc, for either kind. A process that tunes
  // malloc itself (the CLI: tools/cli_util.h) turns it off.
  bool tune_malloc = true;
};

struct LoadedModel {
  std::unique_ptr<VisionTower> tower;
  // "checkpoint" or "torchscript".
  std::string kind;
  // From the checkpoint (preprocessor_config.json); nullopt for TorchScript,
  // whose archive says nothing about preprocessing.
  std::optional<PreprocessConfig> preprocess;
  // The checkpoint's model id (epd/model/checkpoint.h); empty for TorchScript.
  std::string model_id;
};

// A directory -> OpenCheckpoint + LoadCheckpointTower; a regular file ->
// LoadTorchScriptTower; anything else -> kNotFound naming the path.
StatusOr<LoadedModel> LoadModel(const ModelOptions& options);

}  // namespace epd
