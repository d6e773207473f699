// The restructured Qwen-VL tower forward and its per-batch metadata
// (tower_model.h).
//
// Design notes.
// * The forward is eager ATen calls and the fused steps of tower_ops.h on
//   [rows, width] tensors; there is no padding and no batch dimension. Items
//   are packed, and what keeps them apart is the attention segments, each
//   inside one frame of one item, so batch-vs-alone equality holds by
//   construction, up to the reassociation of GEMMs whose row count differs.
// * The residual stream x is updated in place, and each residual add is
//   fused with the norm that follows it (the next block's norm1, or the
//   main merger's norm after the last block): two AddNorm calls per block.
// * Qwen2.5-VL's window order: rows are permuted merge block by merge block
//   (the m*m patches of a block stay together), window after window, so each
//   window is a contiguous segment; the merger folds consecutive rows as
//   usual, and its output rows are gathered back to raster order with the
//   inverse permutation.
// * Metadata: everything the forward needs besides the pixels (segments,
//   cu_seqlens, window order and inverse, rotary cos/sin, Qwen3-VL's learned
//   positions) comes from ForwardMeta, built from the host-side grid list;
//   the block loop never reads a device value on the host.
// * Precision: the rotary angles and the interpolation weights are computed
//   in float32 as transformers does (inv_freq by pow on an arange, positions
//   times inv_freq), because the reference comparison is at 1e-4.
#include <ATen/record_function.h>

#include <algorithm>
#include <cstring>
#include <tuple>
#include <vector>

#include "tower_model.h"

namespace epd::internal {
namespace {

// Integers of a ForwardLayout packed into one int64 buffer, for one
// host-to-device copy; each section is a range of it.
class PackedInts {
 public:
  struct Section {
    std::int64_t offset = 0;
    std::int64_t size = 0;
  };
  template <typename I>
  Section Add(const std::vector<I>& values) {
    const Section s{static_cast<std::int64_t>(host_.size()), static_cast<std::int64_t>(values.size())};
    host_.insert(host_.end(), values.begin(), values.end());
    return s;
  }
  // Copies the buffer to `device`: from pinned memory, asynchronously, on
  // CUDA (the caching host allocator keeps the block until the copy lands).
  void Upload(const c10::Device& device) {
    Tensor staged = at::empty({static_cast<std::int64_t>(host_.size())},
                              at::TensorOptions().dtype(at::kLong).pinned_memory(device.is_cuda()));
    if (!host_.empty()) std::memcpy(staged.data_ptr(), host_.data(), host_.size() * sizeof(std::int64_t));
    device_ = staged.to(device, /*non_blocking=*/true);
  }
  Tensor Get(const Section& s) const { return device_.narrow(0, s.offset, s.size); }

 private:
  std::vector<std::int64_t> host_;
  Tensor device_;
};

struct SegmentSections {
  PackedInts::Section cu_seqlens;
  std::vector<PackedInts::Section> rows;  // per group; size 0 when contiguous
};

SegmentSections AddSegments(PackedInts& packed, const AttentionLayout& layout) {
  SegmentSections s;
  s.cu_seqlens = packed.Add(layout.cu_seqlens);
  for (const SegmentGroup& g : layout.groups) s.rows.push_back(packed.Add(g.rows));
  return s;
}

DeviceSegments ToDevice(const PackedInts& packed, const AttentionLayout& layout, const SegmentSections& s) {
  DeviceSegments d;
  d.cu_seqlens = packed.Get(s.cu_seqlens).to(at::kInt);
  d.max_length = layout.max_length;
  d.rows = layout.cu_seqlens.empty() ? 0 : layout.cu_seqlens.back();
  for (std::size_t i = 0; i < layout.groups.size(); ++i) {
    const SegmentGroup& g = layout.groups[i];
    DeviceGroup dg;
    dg.length = g.length;
    dg.count = g.count;
    dg.begin = g.begin;
    if (g.begin < 0) dg.rows = packed.Get(s.rows[i]);
    d.groups.push_back(std::move(dg));
  }
  return d;
}

// Qwen3VLVisionModel.fast_pos_embed_interpolate for one h x w grid: rows
// sample linspace(0, side - 1, h) (align_corners), columns likewise; each
// patch blends the four table entries around its sample with bilinear
// weights; rows are then reordered into merge blocks and repeated per frame.
Tensor LearnedPositions(const TowerWeights& w, const GridTHW& g) {
  const std::int64_t m = w.cfg.merge_size;
  const std::int64_t side = w.pos_side;
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(w.device);
  const auto axis = [&](std::int64_t n) {
    const Tensor s = at::linspace(0.0, static_cast<double>(side - 1), n, f32);
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
    return w.pos_table.index_select(0, index) * weight.to(w.compute);
  };
  Tensor e = take(idx(h_lo, w_lo), wgt(one_h, one_w));
  e = e + take(idx(h_lo, w_hi), wgt(one_h, dw));
  e = e + take(idx(h_hi, w_lo), wgt(dh, one_w));
  e = e + take(idx(h_hi, w_hi), wgt(dh, dw));
  const std::int64_t width = w.cfg.width;
  e = e.view({g.h / m, m, g.w / m, m, width}).permute({0, 2, 1, 3, 4}).reshape({g.h * g.w, width});
  return g.t == 1 ? e : e.repeat({g.t, 1});
}

// Rows [n, width] permuted in units of `unit` rows by `order`.
Tensor PermuteUnits(const Tensor& x, const Tensor& order, std::int64_t unit) {
  const std::int64_t n = x.size(0);
  return x.view({n / unit, unit, x.size(1)}).index_select(0, order).view({n, x.size(1)});
}

Tensor Attention(const TowerWeights& w, const Block& b, const Tensor& h, const ForwardMeta& meta,
                 const DeviceSegments& segments, const ForwardSettings& s) {
  const std::int64_t n = h.size(0);
  const std::int64_t heads = w.cfg.num_heads;
  const std::int64_t hd = w.cfg.head_dim();
  Tensor qkv = b.qkv(h);  // [n, 3 D]: q, k, v as views, no copies
  auto [q, k] = RotaryQK(qkv, heads, hd, meta.cos, meta.sin, meta.cos_full, meta.sin_full, s.kernels);
  const Tensor v = qkv.view({n, 3, heads, hd}).select(1, 2);
  return b.proj(AttendSegments(q, k, v, segments, s.attention));
}

Tensor MlpForward(const TowerWeights& w, const Mlp& mlp, const Tensor& h, const ForwardSettings& s) {
  if (mlp.fused || !mlp.gated) return mlp.out(Activation(mlp.in(h), mlp.width, w.act, mlp.gated, s.kernels));
  return mlp.out(Activation(mlp.gate(h), mlp.width, w.act, /*gated=*/false, s.kernels) * mlp.up(h));
}

// A merger on rows x [n, D]; `normed`: x already went through the main
// merger's (pre-fold) norm, fused into the last block's AddNorm.
Tensor MergerForward(const Merger& mg, const Tensor& x, std::int64_t unit, bool normed, const ForwardSettings& s) {
  const std::int64_t folded = x.size(1) * unit;
  Tensor f;
  if (mg.post_norm) {
    f = ApplyNorm(mg.norm, x.reshape({-1, folded}), s.kernels);
  } else {
    f = (normed ? x : ApplyNorm(mg.norm, x, s.kernels)).reshape({-1, folded});
  }
  const Tensor hidden = mg.fc1(f);
  return mg.fc2(Activation(hidden, hidden.size(1), Act::kGelu, /*gated=*/false, s.kernels));
}

}  // namespace

std::int64_t TowerWeights::window_blocks() const {
  if (cfg.arch != VisionArch::kQwen25VL) return 0;
  return cfg.window_size / cfg.merge_size / cfg.patch_size;
}

std::shared_ptr<const ForwardMeta> BuildForwardMeta(const TowerWeights& w, std::span<const GridTHW> grids,
                                                    const ForwardSettings& settings) {
  RECORD_USER_SCOPE("epd::tower_metadata");
  const ForwardLayout layout = BuildForwardLayout(grids, w.cfg.merge_size, w.window_blocks());
  PackedInts packed;
  const SegmentSections frames = AddSegments(packed, layout.frames);
  const SegmentSections windows = AddSegments(packed, layout.windows);
  const PackedInts::Section order = packed.Add(layout.window_order);
  const PackedInts::Section inverse = packed.Add(layout.window_inverse);
  const PackedInts::Section positions = packed.Add(layout.positions);
  packed.Upload(w.device);

  auto meta = std::make_shared<ForwardMeta>();
  meta->patches = layout.patches;
  meta->frames = ToDevice(packed, layout.frames, frames);
  if (!layout.window_order.empty()) {
    meta->windows = ToDevice(packed, layout.windows, windows);
    meta->window_order = packed.Get(order);
    meta->window_inverse = packed.Get(inverse);
  }
  // angles [patches, head_dim / 2] = [row * inv_freq, column * inv_freq].
  const Tensor pos = packed.Get(positions).view({layout.patches, 2}).to(at::kFloat);
  const Tensor freq = w.inv_freq.unsqueeze(0);
  const Tensor angles = at::cat({pos.select(1, 0).unsqueeze(1) * freq, pos.select(1, 1).unsqueeze(1) * freq}, 1);
  meta->cos = angles.cos();
  meta->sin = angles.sin();
  if (!settings.kernels) {
    meta->cos_full = at::cat({meta->cos, meta->cos}, 1).to(w.compute);
    meta->sin_full = at::cat({meta->sin, meta->sin}, 1).to(w.compute);
  }
  if (w.pos_table.defined()) {
    std::vector<Tensor> parts;
    for (const GridTHW& g : grids) parts.push_back(LearnedPositions(w, g));
    meta->learned = parts.size() == 1 ? parts[0] : at::cat(parts, 0);
  }
  return meta;
}

std::pair<Tensor, Tensor> RunForward(const TowerWeights& w, const ForwardMeta& meta, const Tensor& pixels,
                                     const ForwardSettings& s) {
  RECORD_USER_SCOPE("epd::tower_forward");
  const VisionConfig& cfg = w.cfg;
  const std::int64_t unit = cfg.merge_size * cfg.merge_size;
  Tensor x = w.patch_embed(pixels);
  if (meta.learned.defined()) x.add_(meta.learned);
  const bool windowed = meta.window_order.defined();
  if (windowed) x = PermuteUnits(x, meta.window_order, unit);

  const std::vector<std::int64_t>& full = cfg.fullatt_block_indexes;
  const std::vector<std::int64_t>& taps = cfg.deepstack_visual_indexes;
  std::vector<Tensor> deep(taps.size());
  const std::size_t depth = w.blocks.size();
  Tensor h = ApplyNorm(depth > 0 ? w.blocks[0].norm1 : w.merger.norm, x, s.kernels);
  for (std::size_t i = 0; i < depth; ++i) {
    const Block& b = w.blocks[i];
    const auto index = static_cast<std::int64_t>(i);
    const bool window_block = windowed && std::find(full.begin(), full.end(), index) == full.end();
    const Tensor a = Attention(w, b, h, meta, window_block ? meta.windows : meta.frames, s);
    h = AddNorm(x, a, b.norm2, s.kernels);
    const Tensor m = MlpForward(w, b.mlp, h, s);
    h = AddNorm(x, m, i + 1 < depth ? w.blocks[i + 1].norm1 : w.merger.norm, s.kernels);
    for (std::size_t j = 0; j < taps.size(); ++j) {
      if (taps[j] == index) deep[j] = MergerForward(w.deepstack[j], x, unit, /*normed=*/false, s);
    }
  }
  Tensor main = MergerForward(w.merger, h, unit, /*normed=*/true, s);
  if (windowed) {
    main = main.index_select(0, meta.window_inverse);
    for (Tensor& d : deep) d = d.index_select(0, meta.window_inverse);
  }
  Tensor deepstack = deep.empty() ? at::empty({main.size(0), 0}, main.options()) : at::cat(deep, 1);
  return {main, deepstack};
}

}  // namespace epd::internal
