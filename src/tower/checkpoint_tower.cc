// Qwen2-VL, Qwen2.5-VL and Qwen3-VL vision towers in libtorch's C++ API:
// one translation unit for the three, since they share the patch embedding,
// the rotary embedding, the attention and the block structure, and differ in
// norms, MLPs, position handling and mergers.
//
// Design notes.
// * The forward is eager ATen calls on [tokens, width] tensors; there is no
//   padding and no batch dimension. Items are packed, and what keeps them
//   apart is the attention segments, each inside one frame of one item. So
//   batch-vs-alone equality holds by construction, up to the reassociation
//   of matmuls whose row count differs.
// * Segments of equal length (the frames or windows of same-sized images)
//   are stacked into one [g, heads, n, head_dim] batch, wherever they sit in
//   the packed sequence: an AttentionPlan, made once per forward, groups the
//   segments by length (gathering rows with index_select when a group is
//   not one contiguous run). A block's attention is then one batched call
//   per distinct length (3 for Qwen2.5-VL's windows of any number of
//   same-sized images), not one per run: on a GPU the forward is otherwise
//   bound by kernel launches (docs/GPU.md, "Real-size checkpoint tower").
// * Qwen2.5-VL's window order: tokens are permuted merge block by merge
//   block (the m*m patches of a block stay together), window after window,
//   so that each window is a contiguous segment; the merger then folds
//   consecutive rows as usual, and its output rows are put back in raster
//   order with index_copy (the inverse permutation).
// * Precision: the rotary angles and the interpolation weights are computed
//   in float32 the way transformers does (inv_freq by pow on an arange,
//   positions times inv_freq), because the reference comparison is at 1e-4.
// * Weights: each tensor is memcpy'd out of the mapping into an aligned CPU
//   tensor of its stored dtype, then converted to the compute dtype and moved
//   to the device. The Checkpoint (and its mappings) is dropped after load.
#include "epd/checkpoint_tower/checkpoint_tower.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "torch_common.h"

namespace epd {
namespace {

using at::Tensor;
using internal::HostBytes;
using internal::ParseDevice;
using internal::TorchMessage;
using internal::ToScalarType;
using internal::ValidateTowerItems;

// Every norm of the three towers uses eps 1e-6 (modeling_*.py).
constexpr double kNormEps = 1e-6;
// VisionRotaryEmbedding's theta.
constexpr double kRopeTheta = 10000.0;

struct Linear {
  Tensor weight;  // [out, in]
  Tensor bias;    // [out] or undefined
  Tensor operator()(const Tensor& x) const { return at::linear(x, weight, bias); }
};

struct Norm {
  Tensor weight;
  Tensor bias;  // undefined for RMSNorm
  bool rms = false;
  Tensor operator()(const Tensor& x) const {
    if (rms) {
      // Qwen2RMSNorm: x * rsqrt(mean(x^2) + eps), in float32, then * weight.
      const Tensor xf = x.to(at::kFloat);
      const Tensor normed = xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + kNormEps);
      return weight * normed.to(x.scalar_type());
    }
    return at::layer_norm(x, {weight.size(0)}, weight, bias, kNormEps);
  }
};

enum class Act { kQuickGelu, kSilu, kGeluTanh, kGelu };

Tensor Activate(Act act, const Tensor& x) {
  switch (act) {
    case Act::kQuickGelu:
      return x * at::sigmoid(1.702 * x);  // transformers' QuickGELUActivation
    case Act::kSilu:
      return at::silu(x);
    case Act::kGeluTanh:
      return at::gelu(x, "tanh");
    case Act::kGelu:
      return at::gelu(x);
  }
  return x;
}

struct Block {
  Norm norm1, norm2;
  Linear qkv, proj;
  // Qwen2-VL / Qwen3-VL: fc2(act(fc1 x)). Qwen2.5-VL: down(act(gate x) * up x).
  Linear fc1, fc2;
  Linear gate, up, down;
  bool swiglu = false;
};

// fold m*m consecutive rows, then MLP; norm before (pre) or after (post) folding.
struct Merger {
  Norm norm;
  bool post_norm = false;
  Linear fc1, fc2;
  Tensor operator()(const Tensor& x, std::int64_t fold) const {
    Tensor h = post_norm ? norm(x.reshape({-1, x.size(1) * fold})) : norm(x).reshape({-1, x.size(1) * fold});
    return fc2(at::gelu(fc1(h)));
  }
};

// One attention segment: rows [begin, begin + length) of the packed sequence.
struct Segment {
  std::int64_t begin;
  std::int64_t length;
};

// Segments grouped by length, for one batched attention call per group.
// A group whose segments are one contiguous run of rows is read with narrow
// (no copy); otherwise `rows` (int64, on the tower's device) lists its rows,
// segment after segment.
struct AttentionGroup {
  std::int64_t length = 0;  // rows per segment
  std::int64_t count = 0;   // segments
  std::int64_t begin = -1;  // first row when contiguous, else -1
  Tensor rows;              // [count * length] when not contiguous
};
using AttentionPlan = std::vector<AttentionGroup>;

// Groups `segments` by length, in order of first appearance. O(rows).
AttentionPlan PlanAttention(const std::vector<Segment>& segments, const c10::Device& device) {
  std::vector<std::int64_t> lengths;
  std::vector<std::vector<const Segment*>> members;
  for (const Segment& s : segments) {
    const auto it = std::find(lengths.begin(), lengths.end(), s.length);
    const std::size_t k = static_cast<std::size_t>(it - lengths.begin());
    if (it == lengths.end()) {
      lengths.push_back(s.length);
      members.emplace_back();
    }
    members[k].push_back(&s);
  }
  AttentionPlan plan;
  for (std::size_t k = 0; k < lengths.size(); ++k) {
    AttentionGroup g;
    g.length = lengths[k];
    g.count = static_cast<std::int64_t>(members[k].size());
    bool contiguous = true;
    for (std::size_t i = 1; i < members[k].size(); ++i) {
      contiguous = contiguous && members[k][i]->begin == members[k][i - 1]->begin + g.length;
    }
    if (contiguous) {
      g.begin = members[k].front()->begin;
    } else {
      std::vector<std::int64_t> rows;
      rows.reserve(static_cast<std::size_t>(g.count * g.length));
      for (const Segment* s : members[k]) {
        for (std::int64_t r = 0; r < g.length; ++r) rows.push_back(s->begin + r);
      }
      g.rows = at::tensor(rows, at::kLong).to(device);
    }
    plan.push_back(std::move(g));
  }
  return plan;
}

Tensor RotateHalf(const Tensor& x) {
  const std::int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

class CheckpointTower final : public VisionTower {
 public:
  StatusOr<TowerOutput> Encode(std::span<const TowerItem> items) override;

  std::int64_t patch_dim() const override { return cfg_.patch_dim(); }
  std::int64_t merge_size() const override { return cfg_.merge_size; }
  std::int64_t hidden() const override { return cfg_.out_hidden; }
  std::int64_t deepstack_layers() const override { return cfg_.deepstack_layers(); }
  DType dtype() const override { return output_dtype_; }
  bool output_on_device() const override { return output_on_device_; }
  // Every block attends within a frame (full attention) or within a window
  // of a frame (Qwen2.5-VL); rotary and learned positions use (row, column)
  // only and repeat per frame; the merger folds m*m patches of one frame.
  bool temporal_chunks_independent() const override { return true; }
  std::string Describe() const override {
    return "checkpoint:" + dir_ + " (" + std::string(VisionArchName(cfg_.arch)) + ", " + device_.str() + ", " +
           std::to_string(num_threads_) + (num_threads_ == 1 ? " thread" : " threads") + ", hidden " +
           std::to_string(cfg_.out_hidden) + ", deepstack " + std::to_string(cfg_.deepstack_layers()) + ", " +
           std::string(DTypeName(output_dtype_)) + ")";
  }

  // Copies the weights out of `ck`. Throws c10::Error / std::exception.
  void Build(const Checkpoint& ck, const CheckpointTowerOptions& options, c10::Device device, int threads);

 private:
  Tensor Weight(const Checkpoint& ck, const std::string& name) const;
  Linear LoadLinear(const Checkpoint& ck, const std::string& name, bool bias = true) const;
  Norm LoadNorm(const Checkpoint& ck, const std::string& name) const;
  Merger LoadMerger(const Checkpoint& ck, const std::string& prefix, bool post_norm) const;

  // [N, head_dim] cos and sin of the 2D rotary angles, rows in patch order.
  std::pair<Tensor, Tensor> Rotary(std::span<const TowerItem> items, std::int64_t total) const;
  // Qwen3-VL: [N, width] interpolated learned positions, rows in patch order.
  Tensor LearnedPositions(std::span<const TowerItem> items) const;
  // Qwen2.5-VL: the window order of the merge blocks (a permutation of
  // [0, N / m^2)) and the window segments in that order, in patches.
  void Windows(std::span<const TowerItem> items, std::vector<std::int64_t>* order,
               std::vector<Segment>* segments) const;
  Tensor Attention(const Block& b, const Tensor& x, const Tensor& cos, const Tensor& sin,
                   const AttentionPlan& plan) const;
  Tensor Mlp(const Block& b, const Tensor& x) const;
  // Runs the tower on packed patches; returns (main, deepstack).
  std::pair<Tensor, Tensor> Forward(std::span<const TowerItem> items, const Tensor& pixels) const;

  VisionConfig cfg_;
  std::string dir_;
  c10::Device device_{c10::kCPU};
  at::ScalarType compute_ = at::kFloat;
  int num_threads_ = 1;
  DType output_dtype_ = DType::kFloat32;
  bool output_on_device_ = false;
  bool fused_attention_ = true;
  Act act_ = Act::kGelu;

  Linear patch_embed_;  // [width, patch_dim]; bias for Qwen3-VL only
  Tensor pos_table_;    // Qwen3-VL: [num_position_embeddings, width]
  std::int64_t pos_side_ = 0;
  Tensor inv_freq_;  // [head_dim / 4] float32, on the device
  std::vector<Block> blocks_;
  Merger merger_;
  std::vector<Merger> deepstack_;
};

// Keeps a device-resident output's tensors alive (TowerOutput::device_owner).
struct DeviceOutputTensors {
  Tensor main;
  Tensor deepstack;
};

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

Tensor CheckpointTower::Weight(const Checkpoint& ck, const std::string& name) const {
  const TensorView* v = ck.Tensor(name);
  // OpenCheckpoint guarantees every expected tensor; this is a programming error.
  TORCH_CHECK(v != nullptr, "checkpoint tensor ", name, " missing after validation");
  Tensor host = at::empty(v->shape, at::TensorOptions().dtype(StoredType(v->dtype)));
  if (!v->bytes.empty()) std::memcpy(host.data_ptr(), v->bytes.data(), v->bytes.size());
  return host.to(device_, compute_, /*non_blocking=*/false, /*copy=*/true);
}

Linear CheckpointTower::LoadLinear(const Checkpoint& ck, const std::string& name, bool bias) const {
  Linear l;
  l.weight = Weight(ck, name + ".weight");
  if (bias) l.bias = Weight(ck, name + ".bias");
  return l;
}

Norm CheckpointTower::LoadNorm(const Checkpoint& ck, const std::string& name) const {
  Norm n;
  n.weight = Weight(ck, name + ".weight");
  n.rms = ck.Tensor(name + ".bias") == nullptr;  // RMSNorm has no bias (Qwen2.5-VL)
  if (!n.rms) n.bias = Weight(ck, name + ".bias");
  return n;
}

Merger CheckpointTower::LoadMerger(const Checkpoint& ck, const std::string& prefix, bool post_norm) const {
  Merger m;
  m.post_norm = post_norm;
  if (cfg_.arch == VisionArch::kQwen3VL) {
    m.norm = LoadNorm(ck, prefix + "norm");
    m.fc1 = LoadLinear(ck, prefix + "linear_fc1");
    m.fc2 = LoadLinear(ck, prefix + "linear_fc2");
  } else {
    m.norm = LoadNorm(ck, prefix + "ln_q");
    m.fc1 = LoadLinear(ck, prefix + "mlp.0");
    m.fc2 = LoadLinear(ck, prefix + "mlp.2");
  }
  return m;
}

void CheckpointTower::Build(const Checkpoint& ck, const CheckpointTowerOptions& options, c10::Device device,
                            int threads) {
  cfg_ = ck.vision();
  dir_ = ck.dir();
  device_ = device;
  compute_ = ToScalarType(options.compute_dtype);
  num_threads_ = threads;
  output_dtype_ = options.output_dtype;
  output_on_device_ = options.output_on_device;
  fused_attention_ = options.fused_attention;
  const std::string& a = cfg_.hidden_act;
  act_ = a == "quick_gelu"          ? Act::kQuickGelu
         : a == "silu"              ? Act::kSilu
         : a == "gelu_pytorch_tanh" ? Act::kGeluTanh
                                    : Act::kGelu;
  const bool qwen3 = cfg_.arch == VisionArch::kQwen3VL;
  patch_embed_.weight = Weight(ck, "patch_embed.proj.weight").reshape({cfg_.width, cfg_.patch_dim()});
  if (qwen3) {
    patch_embed_.bias = Weight(ck, "patch_embed.proj.bias");
    pos_table_ = Weight(ck, "pos_embed.weight");
    pos_side_ = static_cast<std::int64_t>(std::llround(std::sqrt(static_cast<double>(cfg_.num_position_embeddings))));
  }
  // VisionRotaryEmbedding(dim = head_dim / 2): inv_freq = 1 / theta^(arange(0, dim, 2) / dim), float32.
  const std::int64_t rot_dim = cfg_.head_dim() / 2;
  inv_freq_ = at::reciprocal(at::pow(kRopeTheta, at::arange(0, rot_dim, 2, at::kFloat) / static_cast<double>(rot_dim)))
                  .to(device_);
  for (std::int64_t i = 0; i < cfg_.depth; ++i) {
    const std::string p = "blocks." + std::to_string(i) + ".";
    Block b;
    b.norm1 = LoadNorm(ck, p + "norm1");
    b.norm2 = LoadNorm(ck, p + "norm2");
    b.qkv = LoadLinear(ck, p + "attn.qkv");
    b.proj = LoadLinear(ck, p + "attn.proj");
    switch (cfg_.arch) {
      case VisionArch::kQwen2VL:
        b.fc1 = LoadLinear(ck, p + "mlp.fc1");
        b.fc2 = LoadLinear(ck, p + "mlp.fc2");
        break;
      case VisionArch::kQwen25VL:
        b.swiglu = true;
        b.gate = LoadLinear(ck, p + "mlp.gate_proj");
        b.up = LoadLinear(ck, p + "mlp.up_proj");
        b.down = LoadLinear(ck, p + "mlp.down_proj");
        break;
      case VisionArch::kQwen3VL:
        b.fc1 = LoadLinear(ck, p + "mlp.linear_fc1");
        b.fc2 = LoadLinear(ck, p + "mlp.linear_fc2");
        break;
    }
    blocks_.push_back(std::move(b));
  }
  merger_ = LoadMerger(ck, "merger.", /*post_norm=*/false);
  for (std::int64_t j = 0; j < cfg_.deepstack_layers(); ++j) {
    deepstack_.push_back(LoadMerger(ck, "deepstack_merger_list." + std::to_string(j) + ".", /*post_norm=*/true));
  }
}

std::pair<Tensor, Tensor> CheckpointTower::Rotary(std::span<const TowerItem> items, std::int64_t total) const {
  // (row, column) of every patch in the packed order: per frame, merge blocks
  // in raster order, the m*m patches of a block in raster order.
  const std::int64_t m = cfg_.merge_size;
  Tensor pos = at::empty({total, 2}, at::kFloat);
  float* p = pos.data_ptr<float>();
  for (const TowerItem& item : items) {
    const GridTHW& g = item.grid;
    for (std::int64_t t = 0; t < g.t; ++t) {
      for (std::int64_t by = 0; by < g.h / m; ++by) {
        for (std::int64_t bx = 0; bx < g.w / m; ++bx) {
          for (std::int64_t iy = 0; iy < m; ++iy) {
            for (std::int64_t ix = 0; ix < m; ++ix) {
              *p++ = static_cast<float>(by * m + iy);
              *p++ = static_cast<float>(bx * m + ix);
            }
          }
        }
      }
    }
  }
  pos = pos.to(device_);
  // angles [N, head_dim / 2] = [row * inv_freq, column * inv_freq]; emb = [angles, angles].
  const Tensor angles = at::cat(
      {pos.select(1, 0).unsqueeze(1) * inv_freq_.unsqueeze(0), pos.select(1, 1).unsqueeze(1) * inv_freq_.unsqueeze(0)},
      1);
  const Tensor emb = at::cat({angles, angles}, 1);
  return {emb.cos(), emb.sin()};
}

Tensor CheckpointTower::LearnedPositions(std::span<const TowerItem> items) const {
  // Qwen3VLVisionModel.fast_pos_embed_interpolate: for an h x w grid, rows
  // sample linspace(0, side - 1, h) (align_corners), columns likewise; each
  // patch blends the four table entries around its sample with bilinear
  // weights; then rows are reordered into merge blocks and repeated per frame.
  const std::int64_t m = cfg_.merge_size;
  const std::int64_t side = pos_side_;
  std::vector<Tensor> parts;
  for (const TowerItem& item : items) {
    const GridTHW& g = item.grid;
    const auto axis = [&](std::int64_t n) {
      const Tensor s = at::linspace(0.0, static_cast<double>(side - 1), n, at::kFloat);
      const Tensor lo = s.to(at::kLong);  // truncation == floor for s >= 0
      const Tensor hi = (lo + 1).clamp_max(side - 1);
      const Tensor frac = s - lo.to(at::kFloat);
      return std::make_tuple(lo, hi, frac);
    };
    auto [h_lo, h_hi, dh] = axis(g.h);
    auto [w_lo, w_hi, dw] = axis(g.w);
    auto idx = [&](const Tensor& r, const Tensor& c) { return (r.unsqueeze(1) * side + c.unsqueeze(0)).reshape(-1); };
    auto wgt = [&](const Tensor& a, const Tensor& b) { return (a.unsqueeze(1) * b.unsqueeze(0)).reshape({-1, 1}); };
    const Tensor one_h = 1 - dh;
    const Tensor one_w = 1 - dw;
    auto take = [&](const Tensor& index, const Tensor& weight) {
      return pos_table_.index_select(0, index.to(device_)) * weight.to(device_, compute_);
    };
    Tensor e = take(idx(h_lo, w_lo), wgt(one_h, one_w));
    e = e + take(idx(h_lo, w_hi), wgt(one_h, dw));
    e = e + take(idx(h_hi, w_lo), wgt(dh, one_w));
    e = e + take(idx(h_hi, w_hi), wgt(dh, dw));
    e = e.view({g.h / m, m, g.w / m, m, cfg_.width}).permute({0, 2, 1, 3, 4}).reshape({g.h * g.w, cfg_.width});
    parts.push_back(g.t == 1 ? e : e.repeat({g.t, 1}));
  }
  return at::cat(parts, 0);
}

void CheckpointTower::Windows(std::span<const TowerItem> items, std::vector<std::int64_t>* order,
                              std::vector<Segment>* segments) const {
  // get_window_index (Qwen2.5-VL): a window is vm x vm merge blocks,
  // vm = window_size / merge_size / patch_size; windows tile each frame in
  // raster order (the last row/column of windows may be cut short), and
  // blocks within a window are in raster order.
  const std::int64_t m = cfg_.merge_size;
  const std::int64_t unit = m * m;
  const std::int64_t vm = cfg_.window_size / m / cfg_.patch_size;
  std::int64_t base = 0;   // first merge block of the frame
  std::int64_t start = 0;  // first patch row of the next window
  for (const TowerItem& item : items) {
    const GridTHW& g = item.grid;
    const std::int64_t bh = g.h / m;
    const std::int64_t bw = g.w / m;
    for (std::int64_t t = 0; t < g.t; ++t, base += bh * bw) {
      for (std::int64_t wy = 0; wy < bh; wy += vm) {
        for (std::int64_t wx = 0; wx < bw; wx += vm) {
          const std::int64_t y_end = std::min(wy + vm, bh);
          const std::int64_t x_end = std::min(wx + vm, bw);
          for (std::int64_t y = wy; y < y_end; ++y) {
            for (std::int64_t x = wx; x < x_end; ++x) order->push_back(base + y * bw + x);
          }
          const std::int64_t n = (y_end - wy) * (x_end - wx) * unit;
          segments->push_back({start, n});
          start += n;
        }
      }
    }
  }
}

Tensor CheckpointTower::Attention(const Block& b, const Tensor& x, const Tensor& cos, const Tensor& sin,
                                  const AttentionPlan& plan) const {
  const std::int64_t n = x.size(0);
  const std::int64_t heads = cfg_.num_heads;
  const std::int64_t hd = cfg_.head_dim();
  const Tensor qkv = b.qkv(x).view({n, 3, heads, hd});
  // Rotary in float32 (apply_rotary_pos_emb_vision), back to the compute dtype.
  auto rotate = [&](const Tensor& t) {
    const Tensor f = t.to(at::kFloat);
    return (f * cos.unsqueeze(1) + RotateHalf(f) * sin.unsqueeze(1)).to(compute_);
  };
  const Tensor q = rotate(qkv.select(1, 0));
  const Tensor k = rotate(qkv.select(1, 1));
  const Tensor v = qkv.select(1, 2);
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  // One group: its segments' rows, stacked [g, H, len, hd].
  auto run = [&](const AttentionGroup& group) {
    const std::int64_t g = group.count;
    const std::int64_t len = group.length;
    auto stack = [&](const Tensor& t) {  // [rows, H, hd] -> [g, H, len, hd]
      const Tensor r = group.begin >= 0 ? t.narrow(0, group.begin, g * len) : t.index_select(0, group.rows);
      return r.view({g, len, heads, hd}).permute({0, 2, 1, 3});
    };
    const Tensor qs = stack(q);
    const Tensor ks = stack(k);
    const Tensor vs = stack(v);
    Tensor o;
#if TORCH_VERSION_MAJOR >= 2
    if (device_.is_cuda() && fused_attention_) {
      o = at::scaled_dot_product_attention(qs, ks, vs);  // fused (flash / memory-efficient) kernels
    }
#endif
    if (!o.defined()) {
      Tensor scores = at::matmul(qs, ks.transpose(-2, -1)) * scale;
      const Tensor probs = at::softmax(scores, -1, at::kFloat).to(compute_);
      o = at::matmul(probs, vs);
    }
    return o.permute({0, 2, 1, 3}).reshape({g * len, heads * hd});
  };
  Tensor out;
  if (plan.size() == 1 && plan[0].begin == 0 && plan[0].count * plan[0].length == n) {
    out = run(plan[0]);
  } else {
    out = at::empty({n, heads * hd}, q.options());
    for (const AttentionGroup& group : plan) {
      const Tensor o = run(group);
      if (group.begin >= 0) {
        out.narrow(0, group.begin, o.size(0)).copy_(o);
      } else {
        out.index_copy_(0, group.rows, o);
      }
    }
  }
  return b.proj(out);
}

Tensor CheckpointTower::Mlp(const Block& b, const Tensor& x) const {
  if (b.swiglu) return b.down(Activate(act_, b.gate(x)) * b.up(x));
  return b.fc2(Activate(act_, b.fc1(x)));
}

std::pair<Tensor, Tensor> CheckpointTower::Forward(std::span<const TowerItem> items, const Tensor& pixels) const {
  const std::int64_t n = pixels.size(0);
  const std::int64_t unit = cfg_.merge_size * cfg_.merge_size;
  Tensor x = patch_embed_(pixels);
  if (cfg_.arch == VisionArch::kQwen3VL) x = x + LearnedPositions(items);
  auto [cos, sin] = Rotary(items, n);

  // Full-attention segments: each frame of each item.
  std::vector<Segment> frames;
  std::int64_t start = 0;
  for (const TowerItem& item : items) {
    for (std::int64_t t = 0; t < item.grid.t; ++t, start += item.grid.h * item.grid.w) {
      frames.push_back({start, item.grid.h * item.grid.w});
    }
  }
  std::vector<Segment> windows;
  Tensor window_order;
  if (cfg_.arch == VisionArch::kQwen25VL) {
    std::vector<std::int64_t> order;
    Windows(items, &order, &windows);
    window_order = at::tensor(order, at::kLong).to(device_);
    auto permute = [&](const Tensor& t) {
      return t.view({n / unit, unit, t.size(1)}).index_select(0, window_order).view({n, t.size(1)});
    };
    x = permute(x);
    cos = permute(cos);
    sin = permute(sin);
  }
  const AttentionPlan frame_plan = PlanAttention(frames, device_);
  const AttentionPlan window_plan = windows.empty() ? AttentionPlan{} : PlanAttention(windows, device_);
  const std::vector<std::int64_t>& full = cfg_.fullatt_block_indexes;
  const std::vector<std::int64_t>& taps = cfg_.deepstack_visual_indexes;
  std::vector<Tensor> deep(taps.size());
  for (std::int64_t i = 0; i < cfg_.depth; ++i) {
    const Block& b = blocks_[static_cast<std::size_t>(i)];
    const bool windowed = cfg_.arch == VisionArch::kQwen25VL && std::find(full.begin(), full.end(), i) == full.end();
    x = x + Attention(b, b.norm1(x), cos, sin, windowed ? window_plan : frame_plan);
    x = x + Mlp(b, b.norm2(x));
    for (std::size_t j = 0; j < taps.size(); ++j) {
      if (taps[j] == i) deep[j] = deepstack_[j](x, unit);
    }
  }
  Tensor main = merger_(x, unit);
  if (window_order.defined()) main = at::empty_like(main).index_copy_(0, window_order, main);
  Tensor deepstack = deep.empty() ? at::empty({main.size(0), 0}, main.options()) : at::cat(deep, 1);
  return {main, deepstack};
}

StatusOr<TowerOutput> CheckpointTower::Encode(std::span<const TowerItem> items) {
  std::int64_t total_patches = 0;
  std::int64_t total_tokens = 0;
  if (Status s = ValidateTowerItems(items, cfg_.patch_dim(), cfg_.merge_size, &total_patches, &total_tokens); !s.ok()) {
    return s;
  }
  TowerOutput out;
  out.tokens = total_tokens;
  out.hidden = cfg_.out_hidden;
  out.deepstack_layers = cfg_.deepstack_layers();
  out.dtype = output_dtype_;
  if (items.empty()) return out;
  try {
    c10::InferenceMode inference_mode;
    if (at::get_num_threads() != num_threads_) at::set_num_threads(num_threads_);
    Tensor pixels = at::empty({total_patches, cfg_.patch_dim()}, at::kFloat);
    float* dst = pixels.data_ptr<float>();
    for (const TowerItem& item : items) {
      const std::int64_t count = item.grid.patches() * cfg_.patch_dim();
      std::memcpy(dst, item.patches, static_cast<std::size_t>(count) * sizeof(float));
      dst += count;
    }
    pixels = pixels.to(device_, compute_);
    auto [main, deepstack] = Forward(items, pixels);
    const at::ScalarType dtype = ToScalarType(output_dtype_);
    if (output_on_device_) {
      auto owner = std::make_shared<DeviceOutputTensors>();
      owner->main = main.to(dtype).contiguous();
      owner->deepstack = deepstack.to(dtype).contiguous();
      torch::cuda::synchronize(device_.index());
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

StatusOr<std::unique_ptr<VisionTower>> LoadCheckpointTower(std::shared_ptr<const Checkpoint> checkpoint,
                                                           const CheckpointTowerOptions& options) {
  if (checkpoint == nullptr) return InvalidArgument("checkpoint tower: checkpoint is null");
  if (options.num_threads < 0) {
    return InvalidArgument("checkpoint tower num_threads must be >= 0 (0 = all cores), got " +
                           std::to_string(options.num_threads));
  }
  StatusOr<c10::Device> device = ParseDevice(options.device);
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
  return LoadCheckpointTower(std::move(*ck), options);
}

}  // namespace epd
