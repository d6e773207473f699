// Qwen2-VL, Qwen2.5-VL and Qwen3-VL vision towers in libtorch's C++ API: the
// per-model glue. This file loads the weights into the shared layout of
// tower_model.h and implements the VisionTower (batch checks, metadata
// cache, pixel staging, CUDA graphs, output conversion); the forward itself
// is tower_forward.cc, the fused steps and the attention adapter tower_ops.cc.
//
// Weights: each tensor is memcpy'd out of the mapping into an aligned CPU
// tensor of its stored dtype, then converted to the compute dtype and moved
// to the device. The Checkpoint (and its mappings) is dropped after load.
#include "epd/checkpoint_tower/checkpoint_tower.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "forward_layout.h"
#include "torch_common.h"
#include "tower_model.h"
#include "tower_ops.h"

#ifndef EPD_TOWER_CUDA
#define EPD_TOWER_CUDA 0
#endif
#if EPD_TOWER_CUDA
#include "tower_graphs.h"
#endif

namespace epd {
namespace internal {
namespace {

// VisionRotaryEmbedding's theta.
constexpr double kRopeTheta = 10000.0;

at::ScalarType StoredType(TensorDType d) {
  switch (d) {
    case TensorDType::kBF16:
      return at::kBFloat16;
    case TensorDType::kF16:
      return at::kHalf;
    default:
      return at::kFloat;  // the checkpoint admits only F32 besides
  }
}

// Reads the checkpoint's tensors into one device and dtype.
class WeightReader {
 public:
  WeightReader(const Checkpoint& ck, c10::Device device, at::ScalarType compute)
      : ck_(ck), device_(device), compute_(compute) {}

  Tensor Weight(const std::string& name) const {
    const TensorView* v = ck_.Tensor(name);
    // OpenCheckpoint guarantees every expected tensor; this is a programming error.
    TORCH_CHECK(v != nullptr, "checkpoint tensor ", name, " missing after validation");
    Tensor host = at::empty(v->shape, at::TensorOptions().dtype(StoredType(v->dtype)));
    if (!v->bytes.empty()) std::memcpy(host.data_ptr(), v->bytes.data(), v->bytes.size());
    return host.to(device_, compute_, /*non_blocking=*/false, /*copy=*/true);
  }
  Linear LoadLinear(const std::string& name, bool bias = true) const {
    Linear l;
    l.weight = Weight(name + ".weight");
    if (bias) l.bias = Weight(name + ".bias");
    return l;
  }
  Norm LoadNorm(const std::string& name) const {
    Norm n;
    n.weight = Weight(name + ".weight");
    n.rms = ck_.Tensor(name + ".bias") == nullptr;  // RMSNorm has no bias (Qwen2.5-VL)
    if (!n.rms) n.bias = Weight(name + ".bias");
    return n;
  }

 private:
  const Checkpoint& ck_;
  c10::Device device_;
  at::ScalarType compute_;
};

// `t` zero-padded along `dim` to `size` (unchanged when already that size).
Tensor ZeroPad(const Tensor& t, std::int64_t dim, std::int64_t size) {
  if (t.size(dim) == size) return t;
  std::vector<std::int64_t> shape = t.sizes().vec();
  shape[static_cast<std::size_t>(dim)] = size - t.size(dim);
  return at::cat({t, at::zeros(shape, t.options())}, dim);
}

// fc1 -> act -> fc2 (padded to `width` units), or Qwen2.5-VL's SwiGLU with
// gate and up fused into one GEMM (gate's units first, then up's).
Mlp LoadMlp(const WeightReader& r, const VisionConfig& cfg, const std::string& p, bool fusion) {
  Mlp m;
  m.fused = fusion;
  m.gated = cfg.arch == VisionArch::kQwen25VL;
  m.width = fusion ? PaddedMlpWidth(cfg.mlp_hidden) : cfg.mlp_hidden;
  Linear down;
  if (!m.gated) {
    const bool qwen3 = cfg.arch == VisionArch::kQwen3VL;
    const Linear fc1 = r.LoadLinear(p + (qwen3 ? "mlp.linear_fc1" : "mlp.fc1"));
    m.in = {ZeroPad(fc1.weight, 0, m.width), ZeroPad(fc1.bias, 0, m.width)};
    down = r.LoadLinear(p + (qwen3 ? "mlp.linear_fc2" : "mlp.fc2"));
  } else if (fusion) {
    const Linear gate = r.LoadLinear(p + "mlp.gate_proj");
    const Linear up = r.LoadLinear(p + "mlp.up_proj");
    m.in.weight = at::cat({ZeroPad(gate.weight, 0, m.width), ZeroPad(up.weight, 0, m.width)}, 0);
    m.in.bias = at::cat({ZeroPad(gate.bias, 0, m.width), ZeroPad(up.bias, 0, m.width)}, 0);
    down = r.LoadLinear(p + "mlp.down_proj");
  } else {
    m.gate = r.LoadLinear(p + "mlp.gate_proj");
    m.up = r.LoadLinear(p + "mlp.up_proj");
    down = r.LoadLinear(p + "mlp.down_proj");
  }
  m.out = {ZeroPad(down.weight, 1, m.width).contiguous(), down.bias};
  return m;
}

Merger LoadMerger(const WeightReader& r, const VisionConfig& cfg, const std::string& prefix, bool post_norm) {
  Merger m;
  m.post_norm = post_norm;
  const bool qwen3 = cfg.arch == VisionArch::kQwen3VL;
  m.norm = r.LoadNorm(prefix + (qwen3 ? "norm" : "ln_q"));
  m.fc1 = r.LoadLinear(prefix + (qwen3 ? "linear_fc1" : "mlp.0"));
  m.fc2 = r.LoadLinear(prefix + (qwen3 ? "linear_fc2" : "mlp.2"));
  return m;
}

}  // namespace

TowerWeights LoadTowerWeights(const Checkpoint& ck, c10::Device device, at::ScalarType compute, bool mlp_fusion) {
  TowerWeights w;
  w.cfg = ck.vision();
  w.device = device;
  w.compute = compute;
  w.act = ParseAct(w.cfg.hidden_act);
  const VisionConfig& cfg = w.cfg;
  const WeightReader r(ck, device, compute);
  w.patch_embed.weight = r.Weight("patch_embed.proj.weight").reshape({cfg.width, cfg.patch_dim()});
  if (cfg.arch == VisionArch::kQwen3VL) {
    w.patch_embed.bias = r.Weight("patch_embed.proj.bias");
    w.pos_table = r.Weight("pos_embed.weight");
    w.pos_side = static_cast<std::int64_t>(std::llround(std::sqrt(static_cast<double>(cfg.num_position_embeddings))));
  }
  // VisionRotaryEmbedding(dim = head_dim / 2): inv_freq = 1 / theta^(arange(0, dim, 2) / dim), float32.
  const std::int64_t rot_dim = cfg.head_dim() / 2;
  w.inv_freq = at::reciprocal(at::pow(kRopeTheta, at::arange(0, rot_dim, 2, at::kFloat) / static_cast<double>(rot_dim)))
                   .to(device);
  for (std::int64_t i = 0; i < cfg.depth; ++i) {
    const std::string p = "blocks." + std::to_string(i) + ".";
    Block b;
    b.norm1 = r.LoadNorm(p + "norm1");
    b.norm2 = r.LoadNorm(p + "norm2");
    b.qkv = r.LoadLinear(p + "attn.qkv");
    b.proj = r.LoadLinear(p + "attn.proj");
    b.mlp = LoadMlp(r, cfg, p, mlp_fusion);
    w.blocks.push_back(std::move(b));
  }
  w.merger = LoadMerger(r, cfg, "merger.", /*post_norm=*/false);
  for (std::int64_t j = 0; j < cfg.deepstack_layers(); ++j) {
    w.deepstack.push_back(LoadMerger(r, cfg, "deepstack_merger_list." + std::to_string(j) + ".", /*post_norm=*/true));
  }
  return w;
}

}  // namespace internal

namespace {

using at::Tensor;
using internal::ForwardMeta;
using internal::HostBytes;
using internal::TorchMessage;
using internal::ToScalarType;

// Keeps a device-resident output's tensors alive (TowerOutput::device_owner).
struct DeviceOutputTensors {
  Tensor main;
  Tensor deepstack;
};

const char* AttentionName(internal::AttentionImpl a) {
  switch (a) {
    case internal::AttentionImpl::kVarlen:
      return "varlen";
    case internal::AttentionImpl::kGrouped:
      return "grouped-sdpa";
    case internal::AttentionImpl::kExplicit:
      return "explicit";
  }
  return "?";
}

class CheckpointTower final : public VisionTower {
 public:
  StatusOr<TowerOutput> Encode(std::span<const TowerItem> items) override;

  std::int64_t patch_dim() const override { return cfg().patch_dim(); }
  std::int64_t merge_size() const override { return cfg().merge_size; }
  std::int64_t hidden() const override { return cfg().out_hidden; }
  std::int64_t deepstack_layers() const override { return cfg().deepstack_layers(); }
  DType dtype() const override { return output_dtype_; }
  bool output_on_device() const override { return output_on_device_; }
  // Every block attends within a frame (full attention) or within a window
  // of a frame (Qwen2.5-VL); rotary and learned positions use (row, column)
  // only and repeat per frame; the merger folds m*m patches of one frame.
  bool temporal_chunks_independent() const override { return true; }
  std::string Describe() const override;

  // Copies the weights out of `ck` and resolves the options. Throws
  // c10::Error / std::exception.
  void Build(const Checkpoint& ck, const CheckpointTowerOptions& options, c10::Device device, int threads);
  CheckpointTowerStats Stats() const;

 private:
  const VisionConfig& cfg() const { return weights_.cfg; }
  // The batch's rows [patches, patch_dim] in the compute dtype, in pinned
  // host memory when the tower is on CUDA (so the copy to the device is
  // asynchronous), converted from each item's float32 rows.
  Tensor StagePixels(std::span<const TowerItem> items, std::int64_t patches) const;
  std::pair<Tensor, Tensor> Forward(std::span<const TowerItem> items, std::int64_t patches, bool* graphed);

  internal::TowerWeights weights_;
  internal::ForwardSettings settings_;
  std::string dir_;
  int num_threads_ = 1;
  DType output_dtype_ = DType::kFloat32;
  bool output_on_device_ = false;
  std::size_t graph_max_batch_ = 0;
  std::string notes_;
  std::int64_t forwards_ = 0;
  std::unique_ptr<internal::GridListCache<const ForwardMeta>> meta_cache_;
#if EPD_TOWER_CUDA
  std::unique_ptr<internal::TowerGraphs> graphs_;
#endif
};

std::string CheckpointTower::Describe() const {
  std::string s = "checkpoint:" + dir_ + " (" + std::string(VisionArchName(cfg().arch)) + ", " + weights_.device.str() +
                  ", " + std::to_string(num_threads_) + (num_threads_ == 1 ? " thread" : " threads") + ", hidden " +
                  std::to_string(cfg().out_hidden) + ", deepstack " + std::to_string(cfg().deepstack_layers()) + ", " +
                  std::string(DTypeName(output_dtype_));
  if (weights_.device.is_cuda()) {
    s += std::string(", attention ") + AttentionName(settings_.attention) +
         (settings_.kernels ? ", fused kernels" : ", ATen kernels") +
         (graph_max_batch_ > 0 ? ", CUDA graphs up to batch " + std::to_string(graph_max_batch_) : "");
  }
  return s + ")";
}

void CheckpointTower::Build(const Checkpoint& ck, const CheckpointTowerOptions& options, c10::Device device,
                            int threads) {
  dir_ = ck.dir();
  num_threads_ = threads;
  output_dtype_ = options.output_dtype;
  output_on_device_ = options.output_on_device;
  const at::ScalarType compute = ToScalarType(options.compute_dtype);
  weights_ = internal::LoadTowerWeights(ck, device, compute, options.mlp_fusion);
  settings_.kernels = options.fused_kernels && internal::KernelsCompiled() && device.is_cuda();
  settings_.attention = internal::AttentionImpl::kExplicit;
  if (options.fused_attention && device.is_cuda()) {
    settings_.attention = internal::AttentionImpl::kGrouped;
    if (options.varlen_attention) {
      const std::string why = internal::FlashVarlenUnavailable(device, compute);
      if (why.empty()) {
        settings_.attention = internal::AttentionImpl::kVarlen;
      } else {
        notes_ = why;
      }
    }
  }
  meta_cache_ = std::make_unique<internal::GridListCache<const ForwardMeta>>(
      static_cast<std::size_t>(options.metadata_cache_size));
#if EPD_TOWER_CUDA
  if (device.is_cuda() && options.cuda_graph_max_batch > 0) {
    graph_max_batch_ = static_cast<std::size_t>(options.cuda_graph_max_batch);
    graphs_ = std::make_unique<internal::TowerGraphs>(static_cast<std::size_t>(options.cuda_graph_cache_size), device);
  }
#endif
}

CheckpointTowerStats CheckpointTower::Stats() const {
  CheckpointTowerStats s;
  s.forwards = forwards_;
  const internal::GridCacheStats m = meta_cache_->stats();
  s.metadata_hits = m.hits;
  s.metadata_misses = m.misses;
  s.metadata_evictions = m.evictions;
  s.metadata_entries = m.size;
  s.attention = AttentionName(settings_.attention);
  s.fused_kernels = settings_.kernels;
  s.notes = notes_;
#if EPD_TOWER_CUDA
  if (graphs_ != nullptr) {
    const internal::GraphStats g = graphs_->stats();
    s.graph_replays = g.replays;
    s.graph_captures = g.captures;
    s.graph_evictions = g.cache.evictions;
    s.graph_entries = g.cache.size;
    if (!g.disabled_by.empty()) s.notes += (s.notes.empty() ? "" : "; ") + ("CUDA graphs off: " + g.disabled_by);
  }
#endif
  return s;
}

Tensor CheckpointTower::StagePixels(std::span<const TowerItem> items, std::int64_t patches) const {
  RECORD_USER_SCOPE("epd::tower_stage_pixels");
  const std::int64_t dim = cfg().patch_dim();
  Tensor host =
      at::empty({patches, dim}, at::TensorOptions().dtype(weights_.compute).pinned_memory(weights_.device.is_cuda()));
  std::int64_t row = 0;
  for (const TowerItem& item : items) {
    const std::int64_t n = item.grid.patches();
    const Tensor src = at::from_blob(const_cast<float*>(item.patches), {n, dim}, at::kFloat);
    host.narrow(0, row, n).copy_(src);
    row += n;
  }
  return host;
}

std::pair<Tensor, Tensor> CheckpointTower::Forward(std::span<const TowerItem> items, std::int64_t patches,
                                                   bool* graphed) {
  std::vector<GridTHW> grids;
  grids.reserve(items.size());
  for (const TowerItem& item : items) grids.push_back(item.grid);
  const auto key = internal::GridListCache<const ForwardMeta>::MakeKey(grids);
  internal::ForwardSettings settings = settings_;
  // cu_seqlens are int32 in the flash contract.
  if (settings.attention == internal::AttentionImpl::kVarlen && patches > INT32_MAX) {
    settings.attention = internal::AttentionImpl::kGrouped;
  }
  std::shared_ptr<const ForwardMeta> meta = meta_cache_->Find(key);
  if (meta == nullptr) {
    meta = internal::BuildForwardMeta(weights_, grids, settings);
    meta_cache_->Insert(key, meta);
  }
  const Tensor host = StagePixels(items, patches);
  ++forwards_;
  *graphed = false;
#if EPD_TOWER_CUDA
  if (graphs_ != nullptr && items.size() <= graph_max_batch_) {
    *graphed = true;
    const ForwardMeta& m = *meta;
    return graphs_->Run(key, meta, host,
                        [&](const Tensor& pixels) { return internal::RunForward(weights_, m, pixels, settings); });
  }
#endif
  return internal::RunForward(weights_, *meta, host.to(weights_.device, /*non_blocking=*/true), settings);
}

StatusOr<TowerOutput> CheckpointTower::Encode(std::span<const TowerItem> items) {
  std::int64_t total_patches = 0;
  std::int64_t total_tokens = 0;
  if (Status s =
          internal::ValidateTowerItems(items, cfg().patch_dim(), cfg().merge_size, &total_patches, &total_tokens);
      !s.ok()) {
    return s;
  }
  TowerOutput out;
  out.tokens = total_tokens;
  out.hidden = cfg().out_hidden;
  out.deepstack_layers = cfg().deepstack_layers();
  out.dtype = output_dtype_;
  if (items.empty()) return out;
  try {
    c10::InferenceMode inference_mode;
    if (at::get_num_threads() != num_threads_) at::set_num_threads(num_threads_);
    bool graphed = false;
    auto [main, deepstack] = Forward(items, total_patches, &graphed);
    RECORD_USER_SCOPE("epd::tower_output");
    const at::ScalarType dtype = ToScalarType(output_dtype_);
    if (output_on_device_) {
      // A graph's outputs are overwritten by its next replay: always copy them.
      auto owner = std::make_shared<DeviceOutputTensors>();
      owner->main = main.to(main.device(), dtype, /*non_blocking=*/false, /*copy=*/graphed).contiguous();
      owner->deepstack = deepstack.to(deepstack.device(), dtype, false, graphed).contiguous();
      torch::cuda::synchronize(weights_.device.index());
      out.device_main = static_cast<const std::byte*>(owner->main.data_ptr());
      out.device_deepstack =
          out.deepstack_layers > 0 ? static_cast<const std::byte*>(owner->deepstack.data_ptr()) : nullptr;
      out.device_owner = std::move(owner);
    } else {
      out.main = HostBytes(main, dtype);
      out.deepstack = HostBytes(deepstack, dtype);
    }
  } catch (const std::exception& e) {
    return Internal("checkpoint tower " + dir_ + ": forward failed: " + TorchMessage(e));
  }
  return out;
}

}  // namespace

StatusOr<std::unique_ptr<VisionTower>> LoadCheckpointTower(const std::shared_ptr<const Checkpoint>& checkpoint,
                                                           const CheckpointTowerOptions& options) {
  if (checkpoint == nullptr) return InvalidArgument("checkpoint tower: checkpoint is null");
  if (options.num_threads < 0) {
    return InvalidArgument("checkpoint tower num_threads must be >= 0 (0 = all cores), got " +
                           std::to_string(options.num_threads));
  }
  if (options.metadata_cache_size < 0 || options.cuda_graph_max_batch < 0) {
    return InvalidArgument("checkpoint tower metadata_cache_size and cuda_graph_max_batch must be >= 0, got " +
                           std::to_string(options.metadata_cache_size) + " and " +
                           std::to_string(options.cuda_graph_max_batch));
  }
  if (options.cuda_graph_max_batch > 0 && options.cuda_graph_cache_size < 1) {
    return InvalidArgument("checkpoint tower cuda_graph_cache_size must be >= 1 with CUDA graphs on, got " +
                           std::to_string(options.cuda_graph_cache_size));
  }
  StatusOr<c10::Device> device = internal::ParseDevice(options.device);
  if (!device.ok()) return device.status();
  if (options.output_on_device && device->is_cpu()) {
    return InvalidArgument("checkpoint tower output_on_device needs a cuda device, got '" + options.device + "'");
  }
  if (options.tune_malloc) internal::TuneMallocOnce();
  int threads = options.num_threads;
  if (threads == 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  auto tower = std::make_unique<CheckpointTower>();
  try {
    c10::InferenceMode inference_mode;
    at::set_num_threads(threads);
    tower->Build(*checkpoint, options, *device, threads);
  } catch (const std::exception& e) {
    return Internal("checkpoint tower " + checkpoint->dir() + ": loading the weights failed: " + TorchMessage(e));
  }
  return std::unique_ptr<VisionTower>(std::move(tower));
}

StatusOr<std::unique_ptr<VisionTower>> LoadCheckpointTower(const CheckpointTowerOptions& options) {
  if (options.dir.empty()) return InvalidArgument("checkpoint tower dir is empty");
  StatusOr<std::shared_ptr<const Checkpoint>> ck = OpenCheckpoint(options.dir);
  if (!ck.ok()) return ck.status();
  return LoadCheckpointTower(*ck, options);
}

std::optional<CheckpointTowerStats> GetCheckpointTowerStats(const VisionTower& tower) {
  const auto* t = dynamic_cast<const CheckpointTower*>(&tower);
  if (t == nullptr) return std::nullopt;
  return t->Stats();
}

}  // namespace epd
