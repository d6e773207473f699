// Tests of epd::LoadTorchScriptTower against the default tower, through the
// public header only (no torch include here).
//
// The default tower's numbers are arbitrary, so these tests check what must
// hold for any correct tower and backend: shapes from the grids, per-image
// independence (block-diagonal attention), determinism, dtype conversion,
// and the errors. Known-answer checks of the packing live in
// torch_tower_contract_test.cc, whose tiny modules have outputs computable
// by hand.
#include "epd/torch_tower/torch_tower.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

namespace epd {
namespace {

// The options make_default_tower.py uses by default (see its --help).
constexpr std::int64_t kPatchDim = 1176;
constexpr std::int64_t kMergeSize = 2;
constexpr std::int64_t kHidden = 512;
constexpr std::int64_t kDeepstack = 2;

// Deterministic pseudo-random patch rows in [-1, 1): a 64-bit LCG (Knuth's
// MMIX constants), so inputs do not depend on the standard library.
std::vector<float> Patches(const GridTHW& grid, std::uint64_t seed) {
  std::vector<float> v(static_cast<std::size_t>(grid.patches() * kPatchDim));
  std::uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (float& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<float>(static_cast<double>(s >> 11) * 0x1.0p-53 * 2.0 - 1.0);
  }
  return v;
}

std::vector<float> AsFloats(const std::vector<std::byte>& bytes) {
  std::vector<float> f(bytes.size() / sizeof(float));
  std::memcpy(f.data(), bytes.data(), f.size() * sizeof(float));
  return f;
}

// Round-to-nearest-even float32 -> bfloat16 bits, written from the format's
// definition (the top 16 bits of an IEEE binary32) rather than any library.
std::uint16_t ToBFloat16Bits(float f) {
  const auto bits = std::bit_cast<std::uint32_t>(f);
  if (std::isnan(f)) return static_cast<std::uint16_t>((bits >> 16) | 0x40);
  const std::uint32_t lsb = (bits >> 16) & 1u;
  return static_cast<std::uint16_t>((bits + 0x7FFFu + lsb) >> 16);
}

// Max |a - b| over rows [row0, row0 + rows) of a and [0, rows) of b, width w.
double MaxAbsDiff(const std::vector<float>& a, std::int64_t a_row0, const std::vector<float>& b, std::int64_t rows,
                  std::int64_t w) {
  double worst = 0;
  for (std::int64_t i = 0; i < rows * w; ++i) {
    worst = std::max(worst, std::fabs(static_cast<double>(a[a_row0 * w + i]) - b[i]));
  }
  return worst;
}

class DefaultTowerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    TorchTowerOptions opts;
    opts.model_path = EPD_DEFAULT_TOWER_PATH;
    opts.num_threads = 1;
    auto t = LoadTorchScriptTower(opts);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    tower_ = std::move(t).value().release();
  }
  static void TearDownTestSuite() {
    delete tower_;
    tower_ = nullptr;
  }
  static VisionTower* tower_;
};
VisionTower* DefaultTowerTest::tower_ = nullptr;

TEST_F(DefaultTowerTest, ReadsMetadataFromTheModule) {
  EXPECT_EQ(tower_->patch_dim(), kPatchDim);
  EXPECT_EQ(tower_->merge_size(), kMergeSize);
  EXPECT_EQ(tower_->hidden(), kHidden);
  EXPECT_EQ(tower_->deepstack_layers(), kDeepstack);
  EXPECT_EQ(tower_->dtype(), DType::kFloat32);
  const std::string d = tower_->Describe();
  EXPECT_NE(d.find(std::string("torchscript:") + EPD_DEFAULT_TOWER_PATH), std::string::npos) << d;
  EXPECT_NE(d.find("cpu, 1 thread, hidden 512, deepstack 2, float32"), std::string::npos) << d;
}

TEST_F(DefaultTowerTest, SmallImageGivesFourTokens) {
  const GridTHW grid{1, 4, 4};  // a 56x56 image
  const auto patches = Patches(grid, 1);
  auto out = tower_->Encode(std::vector<TowerItem>{{patches.data(), grid, kPatchDim}});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out->tokens, 4);
  EXPECT_EQ(out->hidden, kHidden);
  EXPECT_EQ(out->deepstack_layers, kDeepstack);
  EXPECT_EQ(out->dtype, DType::kFloat32);
  ASSERT_EQ(out->main.size(), 4u * kHidden * sizeof(float));
  ASSERT_EQ(out->deepstack.size(), 4u * kHidden * kDeepstack * sizeof(float));
  // A real forward ran: finite values, and distinct tokens differ.
  const auto main = AsFloats(out->main);
  for (float x : main) ASSERT_TRUE(std::isfinite(x));
  EXPECT_GT(MaxAbsDiff(main, 0, std::vector<float>(main.begin() + kHidden, main.end()), 1, kHidden), 1e-3);
  for (float x : AsFloats(out->deepstack)) ASSERT_TRUE(std::isfinite(x));
}

TEST_F(DefaultTowerTest, BatchRowsAreTheSumOfItemTokens) {
  const GridTHW a{1, 4, 4}, b{1, 6, 8}, c{2, 2, 2};  // 4 + 12 + 2 tokens
  const auto pa = Patches(a, 1), pb = Patches(b, 2), pc = Patches(c, 3);
  auto out = tower_->Encode(std::vector<TowerItem>{{pa.data(), a, 0}, {pb.data(), b, 0}, {pc.data(), c, 0}});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out->tokens, 18);
  EXPECT_EQ(out->main.size(), 18u * kHidden * 4);
  EXPECT_EQ(out->deepstack.size(), 18u * kHidden * kDeepstack * 4);
}

// Block-diagonal attention: an item's embedding must not depend on which
// items share its batch, nor on its position in the batch.
TEST_F(DefaultTowerTest, ItemEmbeddingDoesNotDependOnBatchMates) {
  const GridTHW a{1, 4, 6}, b{1, 8, 4};  // 6 and 8 tokens
  const auto pa = Patches(a, 11), pb = Patches(b, 12);
  auto alone_a = tower_->Encode(std::vector<TowerItem>{{pa.data(), a, 0}});
  auto alone_b = tower_->Encode(std::vector<TowerItem>{{pb.data(), b, 0}});
  auto ab = tower_->Encode(std::vector<TowerItem>{{pa.data(), a, 0}, {pb.data(), b, 0}});
  auto ba = tower_->Encode(std::vector<TowerItem>{{pb.data(), b, 0}, {pa.data(), a, 0}});
  ASSERT_TRUE(alone_a.ok() && alone_b.ok() && ab.ok() && ba.ok());
  const std::int64_t w = kHidden, wd = kHidden * kDeepstack;
  const auto a_main = AsFloats(alone_a->main), b_main = AsFloats(alone_b->main);
  const auto a_deep = AsFloats(alone_a->deepstack), b_deep = AsFloats(alone_b->deepstack);
  const auto ab_main = AsFloats(ab->main), ab_deep = AsFloats(ab->deepstack);
  const auto ba_main = AsFloats(ba->main), ba_deep = AsFloats(ba->deepstack);
  EXPECT_LE(MaxAbsDiff(ab_main, 0, a_main, 6, w), 1e-5);
  EXPECT_LE(MaxAbsDiff(ab_main, 6, b_main, 8, w), 1e-5);
  EXPECT_LE(MaxAbsDiff(ba_main, 0, b_main, 8, w), 1e-5);
  EXPECT_LE(MaxAbsDiff(ba_main, 8, a_main, 6, w), 1e-5);
  EXPECT_LE(MaxAbsDiff(ab_deep, 0, a_deep, 6, wd), 1e-5);
  EXPECT_LE(MaxAbsDiff(ab_deep, 6, b_deep, 8, wd), 1e-5);
  EXPECT_LE(MaxAbsDiff(ba_deep, 8, a_deep, 6, wd), 1e-5);
}

// Control for the test above: the outputs do depend on the input, so a
// backend that, say, encoded only the first item for every slot would fail.
TEST_F(DefaultTowerTest, DifferentImagesGiveDifferentEmbeddings) {
  const GridTHW g{1, 4, 4};
  const auto p1 = Patches(g, 21), p2 = Patches(g, 22);
  auto out = tower_->Encode(std::vector<TowerItem>{{p1.data(), g, 0}, {p2.data(), g, 0}});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  const auto main = AsFloats(out->main);
  const std::vector<float> second(main.begin() + 4 * kHidden, main.end());
  EXPECT_GT(MaxAbsDiff(main, 0, second, 4, kHidden), 1e-2);
}

TEST_F(DefaultTowerTest, SameInputGivesIdenticalBytes) {
  const GridTHW a{1, 6, 6}, b{1, 4, 2};
  const auto pa = Patches(a, 31), pb = Patches(b, 32);
  const std::vector<TowerItem> batch{{pa.data(), a, 0}, {pb.data(), b, 0}};
  auto first = tower_->Encode(batch);
  auto second = tower_->Encode(batch);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_TRUE(first->main == second->main);
  EXPECT_TRUE(first->deepstack == second->deepstack);
}

TEST_F(DefaultTowerTest, EmptyBatchGivesNoRows) {
  auto out = tower_->Encode({});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out->tokens, 0);
  EXPECT_EQ(out->hidden, kHidden);
  EXPECT_TRUE(out->main.empty());
  EXPECT_TRUE(out->deepstack.empty());
}

TEST_F(DefaultTowerTest, GridSideNotMultipleOfMergeSizeIsInvalid) {
  const GridTHW bad{1, 3, 4};
  const auto p = Patches(bad, 1);
  auto out = tower_->Encode(std::vector<TowerItem>{{p.data(), bad, 0}});
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(out.status().message().find("multiples of merge_size 2"), std::string::npos) << out.status().message();
}

TEST_F(DefaultTowerTest, EmptyGridIsInvalid) {
  const std::vector<float> p(kPatchDim * 4);
  for (const GridTHW& g : {GridTHW{0, 2, 2}, GridTHW{1, 0, 2}, GridTHW{1, 2, -2}}) {
    auto out = tower_->Encode(std::vector<TowerItem>{{p.data(), g, 0}});
    ASSERT_FALSE(out.ok());
    EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
  }
}

TEST_F(DefaultTowerTest, WrongPatchDimIsInvalid) {
  const GridTHW g{1, 2, 2};
  const auto p = Patches(g, 1);
  auto out = tower_->Encode(std::vector<TowerItem>{{p.data(), g, 588}});
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(out.status().message().find("patch_dim 588 does not match the tower's 1176"), std::string::npos)
      << out.status().message();
}

TEST_F(DefaultTowerTest, NullPatchesAreInvalidAndNameTheItem) {
  const GridTHW g{1, 2, 2};
  const auto p = Patches(g, 1);
  auto out = tower_->Encode(std::vector<TowerItem>{{p.data(), g, 0}, {nullptr, g, 0}});
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(out.status().message().find("item 1"), std::string::npos) << out.status().message();
}

TEST(TorchTowerOutputDtype, BFloat16IsTheRoundedFloat32Output) {
  TorchTowerOptions opts;
  opts.model_path = EPD_DEFAULT_TOWER_PATH;
  opts.num_threads = 1;
  auto f32 = LoadTorchScriptTower(opts);
  opts.output_dtype = DType::kBFloat16;
  auto bf16 = LoadTorchScriptTower(opts);
  ASSERT_TRUE(f32.ok() && bf16.ok());
  EXPECT_EQ((*bf16)->dtype(), DType::kBFloat16);

  const GridTHW g{1, 4, 6};
  const auto p = Patches(g, 41);
  const std::vector<TowerItem> batch{{p.data(), g, 0}};
  auto a = (*f32)->Encode(batch);
  auto b = (*bf16)->Encode(batch);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(b->dtype, DType::kBFloat16);
  ASSERT_EQ(b->main.size() * 2, a->main.size());
  ASSERT_EQ(b->deepstack.size() * 2, a->deepstack.size());

  auto expect_rounded = [](const std::vector<std::byte>& f32_bytes, const std::vector<std::byte>& bf16_bytes) {
    const auto f = AsFloats(f32_bytes);
    std::vector<std::uint16_t> h(bf16_bytes.size() / 2);
    std::memcpy(h.data(), bf16_bytes.data(), bf16_bytes.size());
    std::size_t mismatches = 0;
    for (std::size_t i = 0; i < f.size(); ++i) mismatches += h[i] != ToBFloat16Bits(f[i]);
    EXPECT_EQ(mismatches, 0u) << "of " << f.size();
  };
  expect_rounded(a->main, b->main);
  expect_rounded(a->deepstack, b->deepstack);
}

TEST(TorchTowerNoDeepstack, DeepstackOutputIsEmpty) {
  TorchTowerOptions opts;
  opts.model_path = EPD_DEFAULT_TOWER_NODS_PATH;
  opts.num_threads = 1;
  auto tower = LoadTorchScriptTower(opts);
  ASSERT_TRUE(tower.ok()) << tower.status().ToString();
  EXPECT_EQ((*tower)->deepstack_layers(), 0);
  const GridTHW g{1, 4, 4};
  const auto p = Patches(g, 1);
  auto out = (*tower)->Encode(std::vector<TowerItem>{{p.data(), g, 0}});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out->tokens, 4);
  EXPECT_EQ(out->deepstack_layers, 0);
  EXPECT_EQ(out->main.size(), 4u * kHidden * 4);
  EXPECT_TRUE(out->deepstack.empty());
}

TEST(TorchTowerLoad, MissingFileIsNotFound) {
  TorchTowerOptions opts;
  opts.model_path = "/nonexistent/epd/tower.pt";
  auto tower = LoadTorchScriptTower(opts);
  ASSERT_FALSE(tower.ok());
  EXPECT_EQ(tower.status().code(), StatusCode::kNotFound);
  EXPECT_NE(tower.status().message().find("/nonexistent/epd/tower.pt"), std::string::npos);
}

TEST(TorchTowerLoad, FileThatIsNotTorchScriptIsInvalid) {
  const auto path =
      std::filesystem::temp_directory_path() / ("epd_not_torchscript_" + std::to_string(::getpid()) + ".pt");
  std::ofstream(path) << "this is not a zip archive\n";
  TorchTowerOptions opts;
  opts.model_path = path.string();
  auto tower = LoadTorchScriptTower(opts);
  std::filesystem::remove(path);
  ASSERT_FALSE(tower.ok());
  EXPECT_EQ(tower.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(tower.status().message().find("as a TorchScript archive"), std::string::npos) << tower.status().message();
}

TEST(TorchTowerLoad, BadOptionsAreInvalid) {
  TorchTowerOptions opts;
  opts.model_path = EPD_DEFAULT_TOWER_PATH;
  opts.num_threads = -1;
  EXPECT_EQ(LoadTorchScriptTower(opts).status().code(), StatusCode::kInvalidArgument);
  opts.num_threads = 1;
  opts.device = "tpu:3";
  EXPECT_EQ(LoadTorchScriptTower(opts).status().code(), StatusCode::kInvalidArgument);
  opts.device = "cpu";
  opts.model_path = "";
  EXPECT_EQ(LoadTorchScriptTower(opts).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace epd
