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
// The forward (src/tower/tower_forward.cc, docs/TOWER.md "The forward"):
//   - per-batch metadata (attention segments and cu_seqlens, their longest
//     lengths, Qwen2.5-VL's window order and its inverse, rotary cos/sin,
//     Qwen3-VL's interpolated positions) is built from the host-side grid
//     list and cached by grid list (metadata_cache_size); nothing in the
//     block loop reads a device value on the host;
//   - one QKV GEMM and one gate-up GEMM per block (mlp_fusion: gate and up
//     concatenated at load, the MLP width zero-padded to a multiple of 64,
//     which is exact), biases inside the GEMMs (addmm), q/k/v as views;
//   - each residual add fused with the norm after it; rotary and the norms in
//     the compute dtype with float32 accumulation;
//   - pixels staged in the compute dtype (pinned memory and an asynchronous
//     copy on CUDA).
// Attention: on CPU, matmul + float32 softmax + matmul per group of
// equal-length segments. On CUDA with float16/bfloat16 and a libtorch whose
// at::_flash_attention_forward is pinned (2.4-2.11), one flash varlen call
// per block over cu_seqlens (varlen_attention); otherwise
// at::scaled_dot_product_attention per group (libtorch >= 2), or the CPU path.
// CUDA builds (EPD_WITH_CUDA with a CUDA libtorch) add fused kernels
// (fused_kernels: residual add + norm, rotary in place, the MLP activation)
// and CUDA graphs per grid list for batches of at most cuda_graph_max_batch
// items (docs/GPU.md "Tower restructure").
//
// Weights are copied out of the checkpoint's mappings once, at load, into
// tensors of `compute_dtype` on the device; the checkpoint itself is then
// released.
//
// Errors:
//   LoadCheckpointTower: every OpenCheckpoint error (epd/model/checkpoint.h);
//     kInvalidArgument for num_threads, metadata_cache_size or
//     cuda_graph_max_batch < 0, cuda_graph_cache_size < 1 with graphs on,
//     a bad device string, output_on_device on cpu; kFailedPrecondition for
//     cuda without CUDA.
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

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "epd/core/embedding.h"
#include "epd/core/status.h"
#include "epd/core/vision_tower.h"
#include "epd/media/preprocess.h"
#include "epd/model/checkpoint.h"
#include "epd/torch_tower/torch_tower.h"

namespace epd {

// The runtime fields (num_threads, device, output_dtype, output_on_device,
// tune_malloc) are TowerRuntimeOptions' (epd/torch_tower/torch_tower.h).
struct CheckpointTowerOptions : TowerRuntimeOptions {
  // The checkpoint directory. Required by LoadCheckpointTower(options).
  std::string dir;
  // dtype the weights are converted to at load and the forward runs in.
  // kFloat32 matches the reference to ~1e-5; kBFloat16 is for GPUs (softmax
  // and norms still accumulate in float32 inside libtorch).
  DType compute_dtype = DType::kFloat32;
  // CUDA with libtorch >= 2 only: attention through fused kernels (flash
  // varlen, or at::scaled_dot_product_attention per segment length). false
  // keeps the explicit matmul + float32 softmax + matmul, the path a CPU or
  // libtorch 1.x build always takes (for benchmarks comparing the two).
  bool fused_attention = true;
  // With fused_attention, on CUDA in float16/bfloat16: one flash-attention
  // varlen call per block over cu_seqlens, when the libtorch's
  // at::_flash_attention_forward is pinned (src/tower/tower_ops.cc) and a
  // probe at load agrees with explicit attention; else SDPA per length.
  bool varlen_attention = true;
  // CUDA builds only (EPD_WITH_CUDA, CUDA libtorch): the fused kernels of
  // src/tower/tower_kernels.cu; false runs the same steps as ATen ops.
  bool fused_kernels = true;
  // Load-time MLP layout: one gate-up GEMM with the MLP width zero-padded to
  // a multiple of 64 (and fc1/fc2 padded likewise). false keeps the
  // checkpoint's separate GEMMs at its own width (a benchmark baseline).
  bool mlp_fusion = true;
  // Distinct grid lists whose forward metadata is kept (LRU); 0 rebuilds it
  // for every forward. Must be >= 0.
  int metadata_cache_size = 32;
  // CUDA builds only: batches of at most this many items run as CUDA graphs,
  // captured once per grid list (tower_graphs.h); 0 turns graphs off. >= 0.
  int cuda_graph_max_batch = 4;
  // Captured graphs kept (LRU); each holds its own device memory pool
  // (roughly one forward's activations). >= 1 when graphs are on.
  int cuda_graph_cache_size = 8;
};

// What a checkpoint tower did so far (GetCheckpointTowerStats).
struct CheckpointTowerStats {
  std::int64_t forwards = 0;  // Encode calls that ran a forward
  // The forward metadata cache (keyed by the batch's grid list).
  std::int64_t metadata_hits = 0;
  std::int64_t metadata_misses = 0;  // each built the metadata once
  std::int64_t metadata_evictions = 0;
  std::int64_t metadata_entries = 0;
  // CUDA graphs: forwards replayed, graphs captured, evicted, held.
  std::int64_t graph_replays = 0;
  std::int64_t graph_captures = 0;
  std::int64_t graph_evictions = 0;
  std::int64_t graph_entries = 0;
  // "varlen", "grouped-sdpa" or "explicit": the attention that runs.
  std::string attention;
  bool fused_kernels = false;  // the CUDA kernels run
  // Why a requested feature is off ("" when none is): flash varlen
  // unavailable, or a CUDA graph capture that failed.
  std::string notes;
};

// The stats of a tower made by LoadCheckpointTower; nullopt for any other
// VisionTower. Not synchronised with Encode: call it from Encode's thread.
std::optional<CheckpointTowerStats> GetCheckpointTowerStats(const VisionTower& tower);

// Opens options.dir and builds its tower. Describe() gives e.g.
// "checkpoint:/models/q (qwen2_5_vl, cpu, 8 threads, hidden 3584, deepstack 0, float32)".
StatusOr<std::unique_ptr<VisionTower>> LoadCheckpointTower(const CheckpointTowerOptions& options);

// The same from an opened checkpoint (options.dir is ignored); the tower
// copies the weights it needs, and keeps no reference to `checkpoint`.
StatusOr<std::unique_ptr<VisionTower>> LoadCheckpointTower(const std::shared_ptr<const Checkpoint>& checkpoint,
                                                           const CheckpointTowerOptions& options);

// What --model loads, decided by what the path is.
// The runtime fields go to whichever tower loads (TowerRuntimeOptions). A
// process that tunes malloc itself (the CLI: tools/cli_util.h) turns
// tune_malloc off.
struct ModelOptions : TowerRuntimeOptions {
  // A checkpoint directory, or a TorchScript archive file (docs/TOWER.md).
  std::string path;
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
