// The checkpoint towers through their public header, on the tiny generated
// checkpoints (src/model/CMakeLists.txt). Agreement with an independent
// reference forward is tested in Python (tests/python/
// test_checkpoint_towers.py); these tests check properties that hold for any
// correct implementation: items never influence each other, frames attend
// separately, windows matter exactly when the grid exceeds one window, and
// the metadata and errors follow the config and the contract.
#include "epd/checkpoint_tower/checkpoint_tower.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "float_rows.h"

namespace epd {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kCheckpoints = EPD_LOADER_TEST_CHECKPOINTS;

json ReadJson(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return json::parse(ss.str());
}

std::unique_ptr<VisionTower> Load(const fs::path& dir, DType output = DType::kFloat32) {
  CheckpointTowerOptions o;
  o.dir = dir.string();
  o.num_threads = 1;
  o.output_dtype = output;
  auto t = LoadCheckpointTower(o);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(*t) : nullptr;
}

// Random patch rows for `grid` (fixed seed per call site).
std::vector<float> Patches(const GridTHW& grid, std::int64_t patch_dim, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> v(static_cast<std::size_t>(grid.patches() * patch_dim));
  for (float& x : v) x = dist(rng);
  return v;
}

using test_util::Floats;
using test_util::RelDiff;

struct Item {
  GridTHW grid;
  std::vector<float> patches;
};

// (main, deepstack) rows of each item when `order` is encoded as one batch.
std::vector<std::pair<std::vector<float>, std::vector<float>>> EncodeBatch(VisionTower& tower,
                                                                           const std::vector<const Item*>& order) {
  std::vector<TowerItem> items;
  items.reserve(order.size());
  for (const Item* it : order) items.push_back({it->patches.data(), it->grid, tower.patch_dim()});
  auto out = tower.Encode(items);
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  std::vector<std::pair<std::vector<float>, std::vector<float>>> rows;
  if (!out.ok()) return rows;
  const std::vector<float> main = Floats(out->main);
  const std::vector<float> deep = Floats(out->deepstack);
  const std::int64_t dw = out->hidden * out->deepstack_layers;
  std::int64_t row = 0;
  for (const Item* it : order) {
    const std::int64_t n = it->grid.tokens(tower.merge_size());
    rows.emplace_back(std::vector<float>(main.begin() + row * out->hidden, main.begin() + (row + n) * out->hidden),
                      std::vector<float>(deep.begin() + row * dw, deep.begin() + (row + n) * dw));
    row += n;
  }
  EXPECT_EQ(row, out->tokens);
  return rows;
}

struct ArchCase {
  const char* dir;
  std::vector<GridTHW> grids;
};

TEST(CheckpointTowerTest, EachItemEncodesAsIfAlone) {
  // Qwen2.5-VL's first grid (18 x 22 patches = 9 x 11 merge blocks) cuts the
  // 4 x 4-block windows short at the right and bottom edges.
  for (const ArchCase& c : {ArchCase{"qwen2_vl_f32", {{1, 8, 12}, {1, 10, 6}, {2, 4, 4}}},
                            ArchCase{"qwen2_5_vl_f32", {{1, 18, 22}, {1, 10, 6}, {2, 4, 4}}},
                            ArchCase{"qwen3_vl_f32", {{1, 8, 12}, {1, 10, 6}, {2, 4, 4}}}}) {
    SCOPED_TRACE(c.dir);
    auto tower = Load(kCheckpoints / c.dir);
    ASSERT_NE(tower, nullptr);
    std::vector<Item> items;
    for (std::size_t i = 0; i < c.grids.size(); ++i) {
      items.push_back({c.grids[i], Patches(c.grids[i], tower->patch_dim(), 100 + static_cast<unsigned>(i))});
    }
    const auto forward = EncodeBatch(*tower, {&items[0], &items[1], &items[2]});
    const auto backward = EncodeBatch(*tower, {&items[2], &items[1], &items[0]});
    ASSERT_EQ(forward.size(), 3u);
    ASSERT_EQ(backward.size(), 3u);
    for (std::size_t i = 0; i < items.size(); ++i) {
      const auto alone = EncodeBatch(*tower, {&items[i]});
      ASSERT_EQ(alone.size(), 1u);
      EXPECT_LT(RelDiff(forward[i].first, alone[0].first), 1e-5) << "item " << i;
      EXPECT_LT(RelDiff(backward[2 - i].first, alone[0].first), 1e-5) << "item " << i;
      EXPECT_LT(RelDiff(forward[i].second, alone[0].second), 1e-5) << "item " << i;
    }
  }
}

TEST(CheckpointTowerTest, FramesOfAVideoItemAttendSeparately) {
  // Two identical frames: attention never crosses frames and positions repeat
  // per frame, so the second frame's tokens equal the first's.
  for (const char* dir : {"qwen2_vl_f32", "qwen2_5_vl_f32", "qwen3_vl_f32"}) {
    SCOPED_TRACE(dir);
    auto tower = Load(kCheckpoints / dir);
    ASSERT_NE(tower, nullptr);
    const GridTHW frame{1, 6, 10};
    std::vector<float> one = Patches(frame, tower->patch_dim(), 7);
    Item video{{2, 6, 10}, one};
    video.patches.insert(video.patches.end(), one.begin(), one.end());
    const auto rows = EncodeBatch(*tower, {&video});
    ASSERT_EQ(rows.size(), 1u);
    const std::size_t half = rows[0].first.size() / 2;
    EXPECT_LT(RelDiff(std::span(rows[0].first).first(half), std::span(rows[0].first).subspan(half)), 1e-5);
    EXPECT_GT(RelDiff(rows[0].first, std::vector<float>(rows[0].first.size(), 0.f)), 1e-3);  // not all zero
  }
}

TEST(CheckpointTowerTest, WindowAttentionMattersOnlyBeyondOneWindow) {
  // A copy whose every block attends fully. Inside one 8 x 8-patch window the
  // two must agree; on a grid of several (cut) windows they must not.
  const fs::path tmp = fs::temp_directory_path() / ("epd_ckpt_tower_" + std::to_string(getpid()));
  fs::remove_all(tmp);
  fs::copy(kCheckpoints / "qwen2_5_vl_f32", tmp, fs::copy_options::recursive);
  json config = ReadJson(tmp / "config.json");
  const std::int64_t depth = config["vision_config"]["depth"].get<std::int64_t>();
  ASSERT_EQ(config["vision_config"]["window_size"].get<std::int64_t>(), 112);
  std::vector<std::int64_t> all;
  for (std::int64_t i = 0; i < depth; ++i) all.push_back(i);
  ASSERT_NE(config["vision_config"]["fullatt_block_indexes"].get<std::vector<std::int64_t>>(), all);
  config["vision_config"]["fullatt_block_indexes"] = all;
  std::ofstream(tmp / "config.json") << config.dump(2);

  auto windowed = Load(kCheckpoints / "qwen2_5_vl_f32");
  auto full = Load(tmp);
  fs::remove_all(tmp);
  ASSERT_NE(windowed, nullptr);
  ASSERT_NE(full, nullptr);
  const Item inside{{1, 8, 8}, Patches({1, 8, 8}, windowed->patch_dim(), 3)};
  const Item beyond{{1, 18, 22}, Patches({1, 18, 22}, windowed->patch_dim(), 4)};
  EXPECT_LT(RelDiff(EncodeBatch(*windowed, {&inside})[0].first, EncodeBatch(*full, {&inside})[0].first), 1e-5);
  EXPECT_GT(RelDiff(EncodeBatch(*windowed, {&beyond})[0].first, EncodeBatch(*full, {&beyond})[0].first), 1e-3);
}

TEST(CheckpointTowerTest, MetadataFollowsTheConfig) {
  for (const char* dir : {"qwen2_vl_f32", "qwen2_5_vl_f32", "qwen3_vl_f32"}) {
    SCOPED_TRACE(dir);
    const json v = ReadJson(kCheckpoints / dir / "config.json")["vision_config"];
    auto tower = Load(kCheckpoints / dir);
    ASSERT_NE(tower, nullptr);
    const std::int64_t p = v["patch_size"];
    EXPECT_EQ(tower->patch_dim(), 3 * v["temporal_patch_size"].get<std::int64_t>() * p * p);
    EXPECT_EQ(tower->merge_size(), v["spatial_merge_size"].get<std::int64_t>());
    // Qwen2-VL calls the output width hidden_size; the others out_hidden_size.
    EXPECT_EQ(tower->hidden(), v.contains("out_hidden_size") ? v["out_hidden_size"].get<std::int64_t>()
                                                             : v["hidden_size"].get<std::int64_t>());
    EXPECT_EQ(tower->deepstack_layers(), v.contains("deepstack_visual_indexes")
                                             ? static_cast<std::int64_t>(v["deepstack_visual_indexes"].size())
                                             : 0);
    EXPECT_NE(tower->Describe().find(std::string("checkpoint:")), std::string::npos);
  }
}

std::uint16_t Bf16RoundNearestEven(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<std::uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

TEST(CheckpointTowerTest, Bfloat16OutputIsTheRoundedFloat32Output) {
  auto f32 = Load(kCheckpoints / "qwen3_vl_f32");
  auto bf16 = Load(kCheckpoints / "qwen3_vl_f32", DType::kBFloat16);
  ASSERT_NE(f32, nullptr);
  ASSERT_NE(bf16, nullptr);
  const Item item{{1, 4, 6}, Patches({1, 4, 6}, f32->patch_dim(), 9)};
  const TowerItem ti{item.patches.data(), item.grid, 0};
  auto a = f32->Encode({&ti, 1});
  auto b = bf16->Encode({&ti, 1});
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(b->dtype, DType::kBFloat16);
  const std::vector<float> main = Floats(a->main);
  ASSERT_EQ(b->main.size(), main.size() * 2);
  for (std::size_t i = 0; i < main.size(); ++i) {
    std::uint16_t got;
    std::memcpy(&got, b->main.data() + 2 * i, 2);
    ASSERT_EQ(got, Bf16RoundNearestEven(main[i])) << i;
  }
  EXPECT_EQ(b->deepstack.size(), a->deepstack.size() / 2);
}

TEST(CheckpointTowerTest, BadItemsAndOptionsAreRejected) {
  auto tower = Load(kCheckpoints / "qwen2_vl_f32");
  ASSERT_NE(tower, nullptr);
  const std::vector<float> rows(static_cast<std::size_t>(tower->patch_dim()) * 4 * 6);
  const TowerItem wrong_dim{rows.data(), {1, 4, 6}, tower->patch_dim() + 1};
  auto s = tower->Encode({&wrong_dim, 1});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("patch_dim"), std::string::npos);
  const TowerItem odd{rows.data(), {1, 3, 6}, 0};
  s = tower->Encode({&odd, 1});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("multiples of merge_size"), std::string::npos);

  CheckpointTowerOptions o;
  o.dir = "/nonexistent/checkpoint";
  EXPECT_EQ(LoadCheckpointTower(o).status().code(), StatusCode::kNotFound);
  o.dir = (kCheckpoints / "qwen2_vl_f32").string();
  o.device = "tpu";
  EXPECT_EQ(LoadCheckpointTower(o).status().code(), StatusCode::kInvalidArgument);
  o.device = "cpu";
  o.output_on_device = true;
  EXPECT_EQ(LoadCheckpointTower(o).status().code(), StatusCode::kInvalidArgument);
}

std::vector<float> MainRows(VisionTower& tower, const std::vector<const Item*>& order) {
  std::vector<float> rows;
  for (auto& [main, deep] : EncodeBatch(tower, order)) rows.insert(rows.end(), main.begin(), main.end());
  return rows;
}

TEST(CheckpointTowerTest, MetadataIsBuiltOncePerGridList) {
  // The forward's metadata (segments, window order, rotary tables) comes from
  // a cache keyed by the batch's grid list: a repeated list is a hit and
  // gives the same rows; another list (or the same grids in another order,
  // or another batch size) is a miss.
  auto tower = Load(kCheckpoints / "qwen2_5_vl_f32");
  ASSERT_NE(tower, nullptr);
  const Item a{{1, 18, 22}, Patches({1, 18, 22}, tower->patch_dim(), 11)};
  const Item b{{1, 8, 8}, Patches({1, 8, 8}, tower->patch_dim(), 12)};
  const std::vector<float> first = MainRows(*tower, {&a, &b});
  EXPECT_EQ(MainRows(*tower, {&a, &b}), first);  // bit for bit: same metadata, same forward
  MainRows(*tower, {&b, &a});
  MainRows(*tower, {&a});
  EXPECT_EQ(MainRows(*tower, {&a, &b}), first);
  const auto s = GetCheckpointTowerStats(*tower);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->forwards, 5);
  EXPECT_EQ(s->metadata_misses, 3);  // {a, b}, {b, a}, {a}
  EXPECT_EQ(s->metadata_hits, 2);
  EXPECT_EQ(s->metadata_entries, 3);
  EXPECT_EQ(s->metadata_evictions, 0);
  EXPECT_EQ(s->attention, "explicit");  // CPU
  EXPECT_FALSE(s->fused_kernels);
}

TEST(CheckpointTowerTest, MetadataCacheIsBoundedAndCanBeTurnedOff) {
  for (int capacity : {0, 2}) {
    SCOPED_TRACE(capacity);
    CheckpointTowerOptions o;
    o.dir = (kCheckpoints / "qwen3_vl_f32").string();
    o.num_threads = 1;
    o.metadata_cache_size = capacity;
    auto loaded = LoadCheckpointTower(o);
    ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
    VisionTower& tower = **loaded;
    auto reference = Load(kCheckpoints / "qwen3_vl_f32");  // default cache
    ASSERT_NE(reference, nullptr);
    const Item x{{1, 4, 6}, Patches({1, 4, 6}, tower.patch_dim(), 13)};
    const Item y{{1, 6, 4}, Patches({1, 6, 4}, tower.patch_dim(), 14)};
    const Item z{{2, 4, 4}, Patches({2, 4, 4}, tower.patch_dim(), 15)};
    for (const Item* it : {&x, &y, &z, &x}) EXPECT_EQ(MainRows(tower, {it}), MainRows(*reference, {it}));
    const auto s = GetCheckpointTowerStats(tower);
    ASSERT_TRUE(s.has_value());
    // Capacity 2 holds y and z when x comes back: x is evicted, and missed again.
    EXPECT_EQ(s->metadata_misses, 4);
    EXPECT_EQ(s->metadata_hits, 0);
    EXPECT_EQ(s->metadata_entries, capacity);
    EXPECT_EQ(s->metadata_evictions, capacity == 0 ? 0 : 2);
  }
}

TEST(CheckpointTowerTest, FusedPaddedMlpEqualsTheCheckpointsOwnGemms) {
  // The tiny Qwen2.5-VL and Qwen3-VL MLPs are 96 wide, padded to 128 when
  // fused; the unfused tower runs the checkpoint's GEMMs at width 96.
  for (const char* dir : {"qwen2_5_vl_f32", "qwen3_vl_f32", "qwen2_vl_f32"}) {
    SCOPED_TRACE(dir);
    CheckpointTowerOptions o;
    o.dir = (kCheckpoints / dir).string();
    o.num_threads = 1;
    o.mlp_fusion = false;
    auto unfused = LoadCheckpointTower(o);
    ASSERT_TRUE(unfused.ok()) << unfused.status().ToString();
    auto fused = Load(kCheckpoints / dir);
    ASSERT_NE(fused, nullptr);
    const Item it{{1, 10, 12}, Patches({1, 10, 12}, fused->patch_dim(), 16)};
    const auto want = EncodeBatch(**unfused, {&it});
    const auto got = EncodeBatch(*fused, {&it});
    ASSERT_EQ(want.size(), 1u);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_LT(RelDiff(got[0].first, want[0].first), 1e-5);
    EXPECT_LT(RelDiff(got[0].second, want[0].second), 1e-5);
  }
}

TEST(CheckpointTowerTest, RestructureOptionsAreChecked) {
  CheckpointTowerOptions o;
  o.dir = (kCheckpoints / "qwen2_vl_f32").string();
  o.metadata_cache_size = -1;
  auto s = LoadCheckpointTower(o);
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("metadata_cache_size"), std::string::npos);
  o.metadata_cache_size = 1;
  o.cuda_graph_max_batch = -2;
  EXPECT_EQ(LoadCheckpointTower(o).status().code(), StatusCode::kInvalidArgument);
  o.cuda_graph_max_batch = 4;
  o.cuda_graph_cache_size = 0;
  s = LoadCheckpointTower(o);
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("cuda_graph_cache_size"), std::string::npos);
  o.cuda_graph_max_batch = 0;  // graphs off: the graph cache size does not matter
  EXPECT_TRUE(LoadCheckpointTower(o).ok());
}

TEST(LoadModelTest, DecidesByWhatThePathIs) {
  ModelOptions o;
  o.num_threads = 1;
  o.path = (kCheckpoints / "qwen3_vl_f32").string();
  auto ck = LoadModel(o);
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  EXPECT_EQ(ck->kind, "checkpoint");
  auto opened = OpenCheckpoint(o.path);
  ASSERT_TRUE(opened.ok());
  EXPECT_EQ(ck->model_id, (*opened)->model_id());
  ASSERT_TRUE(ck->preprocess.has_value());
  EXPECT_EQ(ck->preprocess->patch_size, 16);
  EXPECT_EQ(ck->tower->deepstack_layers(), 2);

  o.path = EPD_DEFAULT_TOWER_NODS_PATH;
  auto ts = LoadModel(o);
  ASSERT_TRUE(ts.ok()) << ts.status().ToString();
  EXPECT_EQ(ts->kind, "torchscript");
  EXPECT_FALSE(ts->preprocess.has_value());
  EXPECT_TRUE(ts->model_id.empty());

  o.path = "/nonexistent/model";
  EXPECT_EQ(LoadModel(o).status().code(), StatusCode::kNotFound);
}

TEST(LoadModelTest, StatsExistOnlyForCheckpointTowers) {
  ModelOptions o;
  o.num_threads = 1;
  o.path = EPD_DEFAULT_TOWER_NODS_PATH;
  auto ts = LoadModel(o);
  ASSERT_TRUE(ts.ok()) << ts.status().ToString();
  EXPECT_FALSE(GetCheckpointTowerStats(*ts->tower).has_value());
  o.path = (kCheckpoints / "qwen2_vl_f32").string();
  auto ck = LoadModel(o);
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  EXPECT_TRUE(GetCheckpointTowerStats(*ck->tower).has_value());
}

}  // namespace
}  // namespace epd
