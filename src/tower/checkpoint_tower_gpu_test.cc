// The CUDA tower on a GPU (scripts/gpu-check.sh runs it; every test skips
// without a CUDA device, which gpu-check.sh counts as a failure there):
//   - each fused kernel (tower_ops.h with kernels on) against the plain
//     libtorch composition (kernels off) and a float64 reference;
//   - the flash varlen adapter against explicit and grouped attention;
//   - the whole tower on the tiny checkpoints: CUDA bf16 against CPU
//     float32, kernels on against off, CUDA graphs against eager, and items
//     in a batch against each alone with graphs on.
// Tolerances, as max |got - want| / max |want| unless said otherwise:
//   - bfloat16 kernels vs the composition: 1e-2. One bf16 rounding is up to
//     2^-9 = 2e-3 relative; the kernel rounds once where the composition
//     rounds after each of its 2-4 ops, and the eager rotary also rounds
//     cos/sin to bf16.
//   - bfloat16 kernels vs float64 on the same inputs: 5e-3 (one rounding of
//     the result, plus float32 arithmetic).
//   - float32: 1e-5 (reassociation only).
// EPD_TINY_CHECKPOINTS names the directory holding tiny-<arch>/
// (scripts/make_tiny_checkpoint.py); the full build defaults it to its
// models/ directory; the tower tests fail without one.
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "epd/checkpoint_tower/checkpoint_tower.h"
#include "tower_model.h"
#include "tower_ops.h"

namespace epd::internal {
namespace {

#define EPD_REQUIRE_CUDA() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

constexpr double kBf16Tol = 1e-2;
constexpr double kBf16VsExact = 5e-3;
constexpr double kF32Tol = 1e-5;

double Rel(const Tensor& got, const Tensor& want) {
  const Tensor g = got.to(at::kCPU, at::kDouble);
  const Tensor w = want.to(at::kCPU, at::kDouble);
  return (g - w).abs().max().item<double>() / w.abs().max().item<double>();
}

at::TensorOptions Cuda(at::ScalarType t) { return at::TensorOptions().device(at::kCUDA).dtype(t); }

double Tol(at::ScalarType t) { return t == at::kFloat ? kF32Tol : kBf16Tol; }

TEST(TowerKernelsGpuTest, AddNormMatchesTheComposition) {
  EPD_REQUIRE_CUDA();
  ASSERT_TRUE(KernelsCompiled());
  at::manual_seed(1);
  for (at::ScalarType t : {at::kBFloat16, at::kFloat}) {
    for (bool rms : {true, false}) {
      for (std::int64_t width : {1280, 1152, 96, 100}) {  // 100: the scalar path
        SCOPED_TRACE(std::string(c10::toString(t)) + (rms ? " rms " : " layernorm ") + std::to_string(width));
        const Tensor x = at::randn({777, width}, Cuda(t)) * 3 + 1;
        const Tensor delta = at::randn({777, width}, Cuda(t));
        Norm n;
        n.rms = rms;
        n.weight = at::randn({width}, Cuda(t)) * 0.5 + 1;
        if (!rms) n.bias = at::randn({width}, Cuda(t));
        Tensor xk = x.clone();
        Tensor xe = x.clone();
        const Tensor hk = AddNorm(xk, delta, n, /*kernels=*/true);
        const Tensor he = AddNorm(xe, delta, n, /*kernels=*/false);
        EXPECT_EQ(Rel(xk, xe), 0.0);  // the residual add rounds the same way
        EXPECT_LE(Rel(hk, he), Tol(t));
        EXPECT_LE(Rel(ApplyNorm(n, x, true), ApplyNorm(n, x, false)), Tol(t));
        // float64 on the same (rounded) residual.
        const Tensor r = xe.to(at::kDouble);
        const Tensor w = n.weight.to(at::kDouble);
        const Tensor want = rms ? w * r * at::rsqrt(r.square().mean(-1, true) + kNormEps)
                                : at::layer_norm(r, {width}, w, n.bias.to(at::kDouble), kNormEps);
        EXPECT_LE(Rel(hk, want), t == at::kFloat ? kF32Tol : 2 * kBf16VsExact);  // RMS rounds twice (HF)
      }
    }
  }
}

TEST(TowerKernelsGpuTest, RotaryInPlaceMatchesTheComposition) {
  EPD_REQUIRE_CUDA();
  at::manual_seed(2);
  for (at::ScalarType t : {at::kBFloat16, at::kFloat}) {
    SCOPED_TRACE(c10::toString(t));
    const std::int64_t rows = 500, heads = 16, hd = 80;
    const Tensor qkv = at::randn({rows, 3 * heads * hd}, Cuda(t));
    const Tensor angles = at::rand({rows, hd / 2}, Cuda(at::kFloat)) * 40;
    const Tensor cos = angles.cos(), sin = angles.sin();
    const Tensor cos_full = at::cat({cos, cos}, 1).to(t), sin_full = at::cat({sin, sin}, 1).to(t);
    Tensor qk = qkv.clone();
    Tensor qe = qkv.clone();
    auto [q1, k1] = RotaryQK(qk, heads, hd, cos, sin, cos_full, sin_full, /*kernels=*/true);
    auto [q2, k2] = RotaryQK(qe, heads, hd, cos, sin, cos_full, sin_full, /*kernels=*/false);
    EXPECT_LE(Rel(q1, q2), Tol(t));
    EXPECT_LE(Rel(k1, k2), Tol(t));
    // v is untouched, and q, k are views of qkv.
    EXPECT_EQ(Rel(qk.narrow(1, 2 * heads * hd, heads * hd), qkv.narrow(1, 2 * heads * hd, heads * hd)), 0.0);
    EXPECT_EQ(q1.data_ptr(), qk.data_ptr());
    // float64: x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin, per head.
    const Tensor x = qkv.to(at::kDouble).view({rows, 3, heads, hd}).select(1, 0);
    const Tensor x1 = x.narrow(2, 0, hd / 2), x2 = x.narrow(2, hd / 2, hd / 2);
    const Tensor c = cos.to(at::kDouble).unsqueeze(1), s = sin.to(at::kDouble).unsqueeze(1);
    const Tensor want = at::cat({x1 * c - x2 * s, x2 * c + x1 * s}, 2);
    EXPECT_LE(Rel(q1, want), t == at::kFloat ? kF32Tol : kBf16VsExact);
  }
}

TEST(TowerKernelsGpuTest, ActivationMatchesTheComposition) {
  EPD_REQUIRE_CUDA();
  at::manual_seed(3);
  struct Case {
    Act act;
    bool gated;
    std::int64_t width;
  };
  for (at::ScalarType t : {at::kBFloat16, at::kFloat}) {
    for (const Case& c :
         {Case{Act::kSilu, true, 3456}, Case{Act::kSilu, true, 100}, Case{Act::kQuickGelu, false, 5120},
          Case{Act::kGeluTanh, false, 4352}, Case{Act::kGelu, false, 100}, Case{Act::kGelu, false, 5120}}) {
      SCOPED_TRACE(std::string(c10::toString(t)) + " act " + std::to_string(static_cast<int>(c.act)) + " width " +
                   std::to_string(c.width));
      const Tensor in = at::randn({600, (c.gated ? 2 : 1) * c.width}, Cuda(t)) * 2;
      const Tensor eager = Activation(in.clone(), c.width, c.act, c.gated, /*kernels=*/false);
      const Tensor fused = Activation(in.clone(), c.width, c.act, c.gated, /*kernels=*/true);
      EXPECT_LE(Rel(fused, eager), Tol(t));
      const Tensor g = in.to(at::kDouble).narrow(1, 0, c.width);
      Tensor want = c.act == Act::kSilu        ? g * at::sigmoid(g)
                    : c.act == Act::kQuickGelu ? g * at::sigmoid(1.702 * g)
                    : c.act == Act::kGeluTanh  ? at::gelu(g, "tanh")
                                               : at::gelu(g);
      if (c.gated) want = want * in.to(at::kDouble).narrow(1, c.width, c.width);
      EXPECT_LE(Rel(fused, want), t == at::kFloat ? kF32Tol : kBf16VsExact);
    }
  }
}

std::filesystem::path TinyCheckpoint(const std::string& arch) {
  const char* dir = std::getenv("EPD_TINY_CHECKPOINTS");
#ifdef EPD_TINY_CHECKPOINTS_DEFAULT
  if (dir == nullptr || *dir == '\0') dir = EPD_TINY_CHECKPOINTS_DEFAULT;  // the full build's models/
#endif
  if (dir == nullptr || *dir == '\0') return {};
  return std::filesystem::path(dir) / ("tiny-" + arch);
}

TEST(TowerAttentionGpuTest, FlashVarlenMatchesExplicitAndGroupedAttention) {
  EPD_REQUIRE_CUDA();
  const std::string why = FlashVarlenUnavailable(c10::Device(c10::kCUDA, 0), at::kBFloat16);
  ASSERT_EQ(why, "") << "flash varlen is unavailable here";
  const std::filesystem::path dir = TinyCheckpoint("qwen2_5_vl");
  ASSERT_FALSE(dir.empty()) << "set EPD_TINY_CHECKPOINTS";
  auto ck = OpenCheckpoint(dir.string());
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  const TowerWeights w = LoadTowerWeights(**ck, c10::Device(c10::kCUDA, 0), at::kBFloat16, true);
  // A 512x512 image, a grid that cuts windows short, and a two-frame video.
  const std::vector<GridTHW> grids = {{1, 36, 36}, {1, 18, 22}, {2, 8, 8}};
  const auto meta = BuildForwardMeta(w, grids, ForwardSettings{});
  at::manual_seed(4);
  const std::int64_t heads = 16, hd = 80;
  const Tensor qkv = at::randn({meta->patches, 3 * heads * hd}, Cuda(at::kBFloat16));
  const Tensor split = qkv.view({meta->patches, 3, heads, hd});
  const Tensor q = split.select(1, 0), k = split.select(1, 1), v = split.select(1, 2);  // strided views
  for (const DeviceSegments* segs : {&meta->frames, &meta->windows}) {
    const Tensor flash = AttendSegments(q, k, v, *segs, AttentionImpl::kVarlen);
    EXPECT_LE(Rel(flash, AttendSegments(q, k, v, *segs, AttentionImpl::kExplicit)), kBf16Tol);
    EXPECT_LE(Rel(flash, AttendSegments(q, k, v, *segs, AttentionImpl::kGrouped)), kBf16Tol);
  }
}

// --- the whole tower ---------------------------------------------------------------

struct Item {
  GridTHW grid;
  std::vector<float> patches;
};

Item RandomItem(GridTHW grid, std::int64_t patch_dim, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  Item it{grid, std::vector<float>(static_cast<std::size_t>(grid.patches() * patch_dim))};
  for (float& x : it.patches) x = dist(rng);
  return it;
}

std::unique_ptr<VisionTower> Load(const std::string& arch, const std::string& device, DType compute, int graphs = 0,
                                  bool kernels = true, int graph_cache = 8) {
  CheckpointTowerOptions o;
  o.dir = TinyCheckpoint(arch).string();
  o.num_threads = 4;
  o.device = device;
  o.compute_dtype = compute;
  o.fused_kernels = kernels;
  o.cuda_graph_max_batch = graphs;
  o.cuda_graph_cache_size = graph_cache;
  auto t = LoadCheckpointTower(o);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(*t) : nullptr;
}

// The main rows of `items` encoded as one batch, as float32 [tokens, hidden].
Tensor Encode(VisionTower& tower, const std::vector<const Item*>& items) {
  std::vector<TowerItem> batch;
  for (const Item* it : items) batch.push_back({it->patches.data(), it->grid, 0});
  auto out = tower.Encode(batch);
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  if (!out.ok()) return {};
  return at::from_blob(out->main.data(), {out->tokens, out->hidden}, at::kFloat).clone();
}

double MeanRowCosine(const Tensor& a, const Tensor& b) {
  return at::cosine_similarity(a.to(at::kDouble), b.to(at::kDouble), 1).mean().item<double>();
}

double RelL2(const Tensor& got, const Tensor& want) {
  return (got.to(at::kDouble) - want.to(at::kDouble)).norm().item<double>() /
         want.to(at::kDouble).norm().item<double>();
}

class TowerGpuTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
    ASSERT_FALSE(TinyCheckpoint(GetParam()).empty()) << "set EPD_TINY_CHECKPOINTS";
  }
};

TEST_P(TowerGpuTest, Bf16OnCudaAgreesWithFloat32OnCpu) {
  auto cpu = Load(GetParam(), "cpu", DType::kFloat32);
  auto gpu = Load(GetParam(), "cuda", DType::kBFloat16, /*graphs=*/4);
  ASSERT_TRUE(cpu && gpu);
  const Item a = RandomItem({1, 16, 20}, cpu->patch_dim(), 1);
  const Item b = RandomItem({2, 8, 8}, cpu->patch_dim(), 2);
  const Tensor want = Encode(*cpu, {&a, &b});
  const Tensor got = Encode(*gpu, {&a, &b});
  EXPECT_GE(MeanRowCosine(got, want), 0.999);
  EXPECT_LE(RelL2(got, want), 3e-2);
  const auto stats = GetCheckpointTowerStats(*gpu);
  ASSERT_TRUE(stats.has_value());
  EXPECT_TRUE(stats->fused_kernels);
  EXPECT_EQ(stats->attention, "varlen") << stats->notes;
}

TEST_P(TowerGpuTest, KernelsOnAgreeWithKernelsOff) {
  auto on = Load(GetParam(), "cuda", DType::kBFloat16, 0, /*kernels=*/true);
  auto off = Load(GetParam(), "cuda", DType::kBFloat16, 0, /*kernels=*/false);
  ASSERT_TRUE(on && off);
  const Item a = RandomItem({1, 18, 22}, on->patch_dim(), 3);
  EXPECT_LE(RelL2(Encode(*on, {&a}), Encode(*off, {&a})), 2e-2);
}

TEST_P(TowerGpuTest, GraphReplaysEqualTheEagerForward) {
  auto graphed = Load(GetParam(), "cuda", DType::kBFloat16, /*graphs=*/4, true, /*graph_cache=*/1);
  auto eager = Load(GetParam(), "cuda", DType::kBFloat16, /*graphs=*/0);
  ASSERT_TRUE(graphed && eager);
  const Item a = RandomItem({1, 16, 16}, graphed->patch_dim(), 4);
  const Item b = RandomItem({1, 8, 12}, graphed->patch_dim(), 5);
  const Tensor want = Encode(*eager, {&a, &b});
  for (int i = 0; i < 3; ++i) {  // capture on the first call, replays after
    EXPECT_LE(Rel(Encode(*graphed, {&a, &b}), want), 1e-3) << "call " << i;
  }
  auto s = GetCheckpointTowerStats(*graphed);
  EXPECT_EQ(s->graph_captures, 1) << s->notes;
  EXPECT_EQ(s->graph_replays, 2);
  // Another shape is another graph; the cache of one evicts the first.
  EXPECT_LE(Rel(Encode(*graphed, {&b}), Encode(*eager, {&b})), 1e-3);
  s = GetCheckpointTowerStats(*graphed);
  EXPECT_EQ(s->graph_captures, 2);
  EXPECT_EQ(s->graph_evictions, 1);
  EXPECT_EQ(s->graph_entries, 1);
  // Different pixels through the same graph give their own output.
  const Item c = RandomItem({1, 16, 16}, graphed->patch_dim(), 6);
  EXPECT_GT(Rel(Encode(*graphed, {&c, &b}), want), 1e-2);
}

TEST_P(TowerGpuTest, ItemsNeverInfluenceEachOtherWithGraphsOn) {
  // float32 (no TF32 in libtorch's default) isolates the rounding; bf16 runs
  // the varlen path with the bf16 tolerance of GEMMs of other row counts.
  for (DType compute : {DType::kFloat32, DType::kBFloat16}) {
    SCOPED_TRACE(compute == DType::kFloat32 ? "float32" : "bfloat16");
    auto tower = Load(GetParam(), "cuda", compute, /*graphs=*/4);
    ASSERT_TRUE(tower);
    const std::vector<Item> items = {RandomItem({1, 18, 22}, tower->patch_dim(), 7),
                                     RandomItem({1, 10, 6}, tower->patch_dim(), 8),
                                     RandomItem({2, 4, 4}, tower->patch_dim(), 9)};
    const double tol = compute == DType::kFloat32 ? 1e-4 : 3e-2;
    for (int pass = 0; pass < 2; ++pass) {  // pass 1 replays the graphs of pass 0
      const Tensor batch = Encode(*tower, {&items[0], &items[1], &items[2]});
      std::int64_t row = 0;
      for (const Item& it : items) {
        const std::int64_t n = it.grid.tokens(tower->merge_size());
        EXPECT_LE(Rel(batch.narrow(0, row, n), Encode(*tower, {&it})), tol) << "pass " << pass;
        row += n;
      }
    }
    EXPECT_GT(GetCheckpointTowerStats(*tower)->graph_replays, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, TowerGpuTest, ::testing::Values("qwen2_vl", "qwen2_5_vl", "qwen3_vl"));

}  // namespace
}  // namespace epd::internal
