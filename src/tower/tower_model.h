// src/tower/tower_model.h (internal to the checkpoint towers; includes
// libtorch): the weights of a Qwen2-VL / Qwen2.5-VL / Qwen3-VL tower as the
// restructured forward uses them, the per-batch metadata on the device, and
// the forward itself (tower_forward.cc). The three towers share this code;
// they differ in norms (LayerNorm / RMSNorm), MLPs (plain / gated), windows,
// learned positions and deepstack taps, all of which are data here.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "epd/core/grid.h"
#include "epd/model/checkpoint.h"
#include "forward_layout.h"
#include "tower_ops.h"

namespace epd::internal {

// The MLP: out(act(in x)), or with `gated` (Qwen2.5-VL's SwiGLU)
// out(act(gate x) * up x). Fused at load (mlp_fusion): `in` holds gate and up
// as one [2 * width, D] GEMM, and `width` is the checkpoint's MLP width
// zero-padded to a multiple of 64, for fc1/fc2 MLPs too. Exact: the padded
// rows of `in` (weights and biases) are 0, so a padded unit's activation is
// act(0) = 0 (times up = 0 when gated), and the padded columns of `out` are
// 0 as well. Unfused (the benchmark baseline): gated MLPs keep separate
// `gate` and `up` GEMMs, and every MLP the checkpoint's width.
struct Mlp {
  Linear in;        // fc1, or the fused gate-up
  Linear gate, up;  // unfused gated only
  Linear out;
  std::int64_t width = 0;  // units after the activation (padded when fused)
  bool gated = false;
  bool fused = true;
};

struct Block {
  Norm norm1, norm2;
  Linear qkv;  // [3 D, D]: the checkpoint's one fused QKV GEMM
  Linear proj;
  Mlp mlp;
};

// Folds m*m consecutive rows, then Linear-GELU-Linear. Main merger: norm per
// patch before folding (applied by the last block's fused add + norm);
// deepstack mergers: norm after folding (post_norm).
struct Merger {
  Norm norm;
  bool post_norm = false;
  Linear fc1, fc2;
};

struct TowerWeights {
  VisionConfig cfg;
  at::ScalarType compute = at::kFloat;
  c10::Device device{c10::kCPU};
  Act act = Act::kGelu;
  Linear patch_embed;  // [width, patch_dim]; bias for Qwen3-VL only
  Tensor pos_table;    // Qwen3-VL: [num_position_embeddings, width]
  std::int64_t pos_side = 0;
  Tensor inv_freq;  // [head_dim / 4] float32: 1 / 10000^(2j / (head_dim / 2))
  std::vector<Block> blocks;
  Merger merger;
  std::vector<Merger> deepstack;
  // 0 when the tower has no window attention, else window_size / patch / m.
  std::int64_t window_blocks() const;
};

// Copies the weights out of `ck` to `device` in `compute` (torch errors
// throw). mlp_fusion: see Mlp.
TowerWeights LoadTowerWeights(const Checkpoint& ck, c10::Device device, at::ScalarType compute, bool mlp_fusion);

// Rounds an MLP width up to a multiple of 64 (the fused MLP's padded width).
inline std::int64_t PaddedMlpWidth(std::int64_t width) { return (width + 63) / 64 * 64; }

// How a forward runs (CheckpointTowerOptions, resolved at load).
struct ForwardSettings {
  bool kernels = false;  // tower_ops' CUDA kernels
  AttentionImpl attention = AttentionImpl::kExplicit;
};

// What a forward needs besides the pixels, built once per distinct grid list
// (BuildForwardMeta) and cached (GridListCache): nothing in the forward reads
// a device value on the host.
struct ForwardMeta {
  std::int64_t patches = 0;
  DeviceSegments frames;
  DeviceSegments windows;  // rows == 0 unless windowed
  Tensor window_order;     // int64 [patches / m^2] on the device; undefined unless windowed
  Tensor window_inverse;   // its inverse permutation
  // Rotary: [patches, head_dim / 2] float32, the angles' cos / sin, rows in
  // forward order (window order when windowed).
  Tensor cos, sin;
  // The same as [patches, head_dim] in the compute dtype, for the eager
  // rotary; undefined when the kernels run.
  Tensor cos_full, sin_full;
  // Qwen3-VL: [patches, width] in the compute dtype, the interpolated
  // learned positions, rows in patch order; undefined otherwise.
  Tensor learned;
};

// Builds the metadata of a batch of `grids` from the host layout, with one
// host-to-device copy of its integers (pinned and asynchronous on CUDA) and
// device-side arithmetic for the rotary tables and learned positions.
std::shared_ptr<const ForwardMeta> BuildForwardMeta(const TowerWeights& w, std::span<const GridTHW> grids,
                                                    const ForwardSettings& settings);

// The tower on packed patches `pixels` [patches, patch_dim] (compute dtype,
// on the device) with `meta` built for the same grid list. Returns (main
// [tokens, out_hidden], deepstack [tokens, out_hidden * k]), compute dtype.
// Reads nothing back to the host and allocates only through the device's
// allocator, so it can be captured into a CUDA graph.
std::pair<Tensor, Tensor> RunForward(const TowerWeights& w, const ForwardMeta& meta, const Tensor& pixels,
                                     const ForwardSettings& settings);

}  // namespace epd::internal
