// OpenCheckpoint on tiny random checkpoints in Hugging Face layout (written at
// build time by scripts/make_tiny_checkpoint.py), and on copies of them
// corrupted here. The expected tensor sets, byte ranges and token counts are
// computed in this file from the files themselves (headers parsed with
// nlohmann::json) or by hand, not by the loader.
#include "epd/model/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

namespace epd {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kCheckpoints = EPD_LOADER_TEST_CHECKPOINTS;

std::string ReadAll(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void WriteAll(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
}

std::uint64_t HeaderLength(const std::string& file) {
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= std::uint64_t{static_cast<unsigned char>(file[i])} << (8 * i);
  return n;
}

json Header(const fs::path& p) {
  const std::string bytes = ReadAll(p);
  return json::parse(bytes.substr(8, HeaderLength(bytes)));
}

// Rewrites the JSON header of a safetensors file, keeping its data bytes
// (and appending `more` after them).
void EditHeader(const fs::path& p, const std::function<void(json&)>& edit, const std::string& more = "") {
  const std::string bytes = ReadAll(p);
  const std::uint64_t n = HeaderLength(bytes);
  json h = json::parse(bytes.substr(8, n));
  edit(h);
  const std::string text = h.dump();
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((text.size() >> (8 * i)) & 0xff));
  WriteAll(p, out + text + bytes.substr(8 + n) + more);
}

// Adds tensor `to` to a safetensors file: `from`'s entry, over a copy of its
// bytes appended to the data (two entries may not share bytes).
void CopyTensor(const fs::path& p, const std::string& from, const std::string& to) {
  const std::string bytes = ReadAll(p);
  const std::uint64_t data = 8 + HeaderLength(bytes);
  const json offsets = Header(p)[from]["data_offsets"];
  const auto begin = offsets[0].get<std::uint64_t>(), end = offsets[1].get<std::uint64_t>();
  const std::uint64_t at = bytes.size() - data;
  EditHeader(
      p,
      [&](json& h) {
        h[to] = h[from];
        h[to]["data_offsets"] = {at, at + (end - begin)};
      },
      bytes.substr(data + begin, end - begin));
}

void EditJson(const fs::path& p, const std::function<void(json&)>& edit) {
  json j = json::parse(ReadAll(p));
  edit(j);
  WriteAll(p, j.dump(2));
}

// The vision entries of a single-file checkpoint's header, prefix removed.
std::map<std::string, json> VisionEntries(const fs::path& dir, const std::string& prefix) {
  std::map<std::string, json> out;
  const json header = Header(dir / "model.safetensors");
  for (auto& [name, entry] : header.items()) {
    if (name.rfind(prefix, 0) == 0) out[name.substr(prefix.size())] = entry;
  }
  return out;
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tmp_ = fs::temp_directory_path() / ("epd_ckpt_" + std::to_string(getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(tmp_);
    fs::create_directories(tmp_);
  }
  void TearDown() override { fs::remove_all(tmp_); }

  // A private copy of checkpoint `name` at tmp_/as.
  fs::path Copy(const std::string& name, const std::string& as = "copy") {
    fs::path dst = tmp_ / as;
    fs::copy(kCheckpoints / name, dst, fs::copy_options::recursive);
    return dst;
  }
  // Opens `dir`, expects `code` and every needle in the message.
  void ExpectError(const fs::path& dir, StatusCode code, std::initializer_list<std::string> needles) {
    auto ck = OpenCheckpoint(dir.string());
    ASSERT_FALSE(ck.ok());
    EXPECT_EQ(ck.status().code(), code) << ck.status().ToString();
    for (const std::string& n : needles) {
      EXPECT_NE(ck.status().message().find(n), std::string::npos) << "'" << n << "' not in: " << ck.status().message();
    }
  }

  fs::path tmp_;
};

struct ArchCase {
  const char* dir;
  const char* model_type;
  const char* prefix;
};

TEST_F(CheckpointTest, ExposesExactlyTheVisionTensorsOfEachArchitecture) {
  for (const ArchCase& c :
       {ArchCase{"qwen2_vl_f32", "qwen2_vl", "visual."}, ArchCase{"qwen2_5_vl_f32", "qwen2_5_vl", "visual."},
        ArchCase{"qwen3_vl_f32", "qwen3_vl", "model.visual."}}) {
    SCOPED_TRACE(c.dir);
    const fs::path dir = kCheckpoints / c.dir;
    auto ck = OpenCheckpoint(dir.string());
    ASSERT_TRUE(ck.ok()) << ck.status().ToString();
    EXPECT_EQ(VisionArchName((*ck)->vision().arch), c.model_type);
    EXPECT_EQ((*ck)->prefix(), c.prefix);
    const std::map<std::string, json> expected = VisionEntries(dir, c.prefix);
    ASSERT_EQ((*ck)->tensors().size(), expected.size());
    std::int64_t params = 0;
    const std::string file = ReadAll(dir / "model.safetensors");
    const std::size_t data = 8 + HeaderLength(file);
    for (const auto& [name, entry] : expected) {
      const TensorView* t = (*ck)->Tensor(name);
      ASSERT_NE(t, nullptr) << name;
      EXPECT_EQ(t->shape, entry["shape"].get<std::vector<std::int64_t>>()) << name;
      const auto begin = entry["data_offsets"][0].get<std::size_t>();
      const auto end = entry["data_offsets"][1].get<std::size_t>();
      ASSERT_EQ(t->bytes.size(), end - begin) << name;
      EXPECT_EQ(std::memcmp(t->bytes.data(), file.data() + data + begin, end - begin), 0) << name;
      std::int64_t n = 1;
      for (std::int64_t d : t->shape) n *= d;
      params += n;
    }
    EXPECT_EQ((*ck)->parameter_count(), params);
    // The generator also writes language-model tensors; none is exposed.
    std::size_t lm = 0;
    const json header = Header(dir / "model.safetensors");
    for (auto& [name, entry] : header.items()) {
      if (name != "__metadata__" && name.rfind(c.prefix, 0) != 0) ++lm;
    }
    EXPECT_GT(lm, 0u);
  }
}

TEST_F(CheckpointTest, ReadsBf16F16AndF32Tensors) {
  for (auto [dir, dtype] :
       {std::pair{"qwen2_5_vl_bf16", TensorDType::kBF16}, std::pair{"qwen3_vl_f16", TensorDType::kF16},
        std::pair{"qwen2_vl_f32", TensorDType::kF32}}) {
    auto ck = OpenCheckpoint((kCheckpoints / dir).string());
    ASSERT_TRUE(ck.ok()) << ck.status().ToString();
    for (const auto& [name, t] : (*ck)->tensors()) EXPECT_EQ(t.dtype, dtype) << dir << " " << name;
  }
}

TEST_F(CheckpointTest, ShardedCheckpointEqualsTheSingleFileOne) {
  auto single = OpenCheckpoint((kCheckpoints / "qwen2_5_vl_bf16").string());
  auto sharded = OpenCheckpoint((kCheckpoints / "qwen2_5_vl_bf16_3shards").string());
  ASSERT_TRUE(single.ok()) << single.status().ToString();
  ASSERT_TRUE(sharded.ok()) << sharded.status().ToString();
  EXPECT_EQ((*sharded)->weight_files().size(), 3u);
  ASSERT_EQ((*single)->tensors().size(), (*sharded)->tensors().size());
  for (const auto& [name, t] : (*single)->tensors()) {
    const TensorView* s = (*sharded)->Tensor(name);
    ASSERT_NE(s, nullptr) << name;
    ASSERT_EQ(s->bytes.size(), t.bytes.size());
    EXPECT_EQ(std::memcmp(s->bytes.data(), t.bytes.data(), t.bytes.size()), 0) << name;
  }
  EXPECT_EQ((*single)->model_id(), (*sharded)->model_id());
}

TEST_F(CheckpointTest, ModelIdFollowsTheVisionTensorsNotTheDirectory) {
  const fs::path a = Copy("qwen2_vl_f32", "a");
  const fs::path b = Copy("qwen2_vl_f32", "b");
  auto ida = OpenCheckpoint(a.string());
  auto idb = OpenCheckpoint(b.string());
  ASSERT_TRUE(ida.ok() && idb.ok());
  EXPECT_EQ((*ida)->model_id(), (*idb)->model_id());
  EXPECT_EQ((*ida)->model_id().rfind("qwen2_vl:", 0), 0u) << (*ida)->model_id();

  // One byte of one vision tensor changed: a different tower, a different id.
  const json h = Header(b / "model.safetensors");
  std::string bytes = ReadAll(b / "model.safetensors");
  const std::size_t data = 8 + HeaderLength(bytes);
  const std::size_t at = data + h["visual.blocks.0.attn.qkv.weight"]["data_offsets"][0].get<std::size_t>();
  bytes[at] = static_cast<char>(bytes[at] ^ 0x01);
  WriteAll(b / "model.safetensors", bytes);
  auto changed = OpenCheckpoint(b.string());
  ASSERT_TRUE(changed.ok());
  EXPECT_NE(changed.value()->model_id(), (*ida)->model_id());

  // A language-model byte changed: the tower and its id are the same.
  std::string lm_name;
  for (auto& [name, entry] : h.items()) {
    if (name != "__metadata__" && name.rfind("visual.", 0) != 0) lm_name = name;
  }
  ASSERT_FALSE(lm_name.empty());
  bytes = ReadAll(a / "model.safetensors");
  const std::size_t lm_at = data + h[lm_name]["data_offsets"][0].get<std::size_t>();
  bytes[lm_at] = static_cast<char>(bytes[lm_at] ^ 0x01);
  WriteAll(a / "model.safetensors", bytes);
  auto lm_changed = OpenCheckpoint(a.string());
  ASSERT_TRUE(lm_changed.ok());
  EXPECT_EQ(lm_changed.value()->model_id(), (*idb)->model_id());

  // The same architecture in another dtype is another id.
  auto bf16 = OpenCheckpoint((kCheckpoints / "qwen2_5_vl_bf16").string());
  auto f32 = OpenCheckpoint((kCheckpoints / "qwen2_5_vl_f32").string());
  ASSERT_TRUE(bf16.ok() && f32.ok());
  EXPECT_NE((*bf16)->model_id(), (*f32)->model_id());
}

// Token counts by hand from smart_resize (factor f = patch * merge):
//   Qwen3-VL, f = 32: 427 / 32 = 13.34 -> 13 * 32 = 416; 640 / 32 = 20 -> 640;
//     416 * 640 = 266240 lies in [65536, 16777216]; grid 26 x 40 = 1040
//     patches, / 4 = 260 tokens.
//   Qwen2 family, f = 28: 427 / 28 = 15.25 -> 420; 640 / 28 = 22.86 -> 644;
//     420 * 644 = 270480 in [3136, 12845056]; grid 30 x 46 = 1380 / 4 = 345.
TEST_F(CheckpointTest, PreprocessingComesFromThePreprocessorConfig) {
  auto q3 = OpenCheckpoint((kCheckpoints / "qwen3_vl_f32").string());
  ASSERT_TRUE(q3.ok()) << q3.status().ToString();
  const PreprocessConfig& c3 = (*q3)->preprocess();
  EXPECT_EQ(c3.patch_size, 16);
  EXPECT_EQ(c3.factor(), 32);
  EXPECT_EQ(c3.min_pixels, 65536);     // size.shortest_edge
  EXPECT_EQ(c3.max_pixels, 16777216);  // size.longest_edge
  EXPECT_EQ(c3.mean[0], 0.5f);
  EXPECT_EQ(c3.std[2], 0.5f);
  auto g3 = GridForImage(427, 640, c3);
  ASSERT_TRUE(g3.ok());
  EXPECT_EQ(g3->h, 26);
  EXPECT_EQ(g3->w, 40);
  EXPECT_EQ(g3->tokens(c3.merge_size), 260);

  for (const char* dir : {"qwen2_vl_f32", "qwen2_5_vl_f32"}) {
    auto ck = OpenCheckpoint((kCheckpoints / dir).string());
    ASSERT_TRUE(ck.ok()) << ck.status().ToString();
    const PreprocessConfig& c = (*ck)->preprocess();
    EXPECT_EQ(c.factor(), 28) << dir;
    EXPECT_EQ(c.max_pixels, 12845056) << dir;  // the file's, not PreprocessConfig's default 1003520
    EXPECT_FLOAT_EQ(c.mean[0], 0.48145466f);
    auto g = GridForImage(427, 640, c);
    ASSERT_TRUE(g.ok());
    EXPECT_EQ(g->tokens(c.merge_size), 345) << dir;
  }
}

TEST_F(CheckpointTest, TopLevelPixelBoundsWinOverSize) {
  const fs::path dir = Copy("qwen3_vl_f32");
  EditJson(dir / "preprocessor_config.json", [](json& j) { j["max_pixels"] = 200000; });
  auto ck = OpenCheckpoint(dir.string());
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  EXPECT_EQ((*ck)->preprocess().max_pixels, 200000);
  EXPECT_EQ((*ck)->preprocess().min_pixels, 65536);
}

TEST_F(CheckpointTest, MissingTensorIsNamed) {
  const fs::path dir = Copy("qwen2_5_vl_f32");
  EditHeader(dir / "model.safetensors", [](json& h) { h.erase("visual.blocks.1.attn.qkv.bias"); });
  ExpectError(dir, StatusCode::kInvalidArgument, {"missing tensor", "visual.blocks.1.attn.qkv.bias"});
}

TEST_F(CheckpointTest, WrongShapeIsNamed) {
  const fs::path dir = Copy("qwen2_vl_f32");
  std::vector<std::int64_t> shape;
  EditHeader(dir / "model.safetensors", [&](json& h) {
    json& e = h["visual.blocks.0.attn.proj.weight"];
    shape = e["shape"].get<std::vector<std::int64_t>>();  // [32, 32]: same bytes as [16, 64]
    e["shape"] = {shape[0] / 2, shape[1] * 2};
  });
  ExpectError(dir, StatusCode::kInvalidArgument,
              {"visual.blocks.0.attn.proj.weight", ShapeToString(std::vector<std::int64_t>{shape[0] / 2, shape[1] * 2}),
               "expected " + ShapeToString(shape)});
}

TEST_F(CheckpointTest, UnexpectedVisionTensorIsNamed) {
  const fs::path dir = Copy("qwen2_vl_f32");
  CopyTensor(dir / "model.safetensors", "visual.blocks.0.norm1.weight", "visual.blocks.0.attn.extra.weight");
  ExpectError(dir, StatusCode::kInvalidArgument, {"unexpected tensor", "visual.blocks.0.attn.extra.weight"});
}

TEST_F(CheckpointTest, NonFloatVisionTensorIsNamed) {
  const fs::path dir = Copy("qwen2_vl_f32");
  EditHeader(dir / "model.safetensors", [](json& h) { h["visual.merger.ln_q.weight"]["dtype"] = "I32"; });
  ExpectError(dir, StatusCode::kInvalidArgument, {"visual.merger.ln_q.weight", "I32"});
}

TEST_F(CheckpointTest, TruncatedShardIsAnError) {
  const fs::path dir = Copy("qwen2_vl_f32");
  const std::string bytes = ReadAll(dir / "model.safetensors");
  WriteAll(dir / "model.safetensors", bytes.substr(0, bytes.size() - 1000));
  ExpectError(dir, StatusCode::kInvalidArgument, {"model.safetensors", "truncated?"});
}

TEST_F(CheckpointTest, HeaderClaimingMoreBytesThanTheFileIsAnError) {
  const fs::path dir = Copy("qwen3_vl_f32");
  std::string bytes = ReadAll(dir / "model.safetensors");
  const std::uint64_t claim = bytes.size();  // 8 + claim > size
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((claim >> (8 * i)) & 0xff);
  WriteAll(dir / "model.safetensors", bytes);
  ExpectError(dir, StatusCode::kInvalidArgument, {"header length", "runs past the end"});

  // A tensor whose range ends past the file.
  const fs::path dir2 = Copy("qwen3_vl_f32", "copy2");
  const std::size_t size = fs::file_size(dir2 / "model.safetensors");
  EditHeader(dir2 / "model.safetensors", [&](json& h) {
    json& e = h["model.visual.pos_embed.weight"];
    const auto len = e["data_offsets"][1].get<std::uint64_t>() - e["data_offsets"][0].get<std::uint64_t>();
    e["data_offsets"] = {size, size + len};
  });
  ExpectError(dir2, StatusCode::kInvalidArgument, {"model.visual.pos_embed.weight", "past the end"});
}

TEST_F(CheckpointTest, IndexNamingAMissingShardIsAnError) {
  const fs::path dir = Copy("qwen2_5_vl_bf16_3shards");
  const json index = json::parse(ReadAll(dir / "model.safetensors.index.json"));
  std::set<std::string> shards;
  for (auto& [name, file] : index["weight_map"].items()) shards.insert(file.get<std::string>());
  ASSERT_EQ(shards.size(), 3u);
  const std::string victim = *std::next(shards.begin());
  fs::remove(dir / victim);
  ExpectError(dir, StatusCode::kInvalidArgument, {"names shard '" + victim + "'", "does not exist"});
}

TEST_F(CheckpointTest, IndexPuttingATensorInTheWrongShardIsAnError) {
  const fs::path dir = Copy("qwen2_5_vl_bf16_3shards");
  EditJson(dir / "model.safetensors.index.json", [](json& j) {
    std::string other;
    const std::string mine = j["weight_map"]["visual.merger.mlp.0.weight"];
    for (auto& [name, file] : j["weight_map"].items()) {
      if (file != mine) other = file;
    }
    j["weight_map"]["visual.merger.mlp.0.weight"] = other;
  });
  ExpectError(dir, StatusCode::kInvalidArgument, {"visual.merger.mlp.0.weight", "does not hold it"});
}

TEST_F(CheckpointTest, UnknownModelTypeIsNamedWithTheSupportedOnes) {
  const fs::path dir = Copy("qwen2_vl_f32");
  EditJson(dir / "config.json", [](json& j) { j["model_type"] = "llava"; });
  ExpectError(dir, StatusCode::kInvalidArgument, {"'llava'", "qwen2_vl, qwen2_5_vl, qwen3_vl"});
}

TEST_F(CheckpointTest, ArchitecturesDecideWithoutModelType) {
  const fs::path dir = Copy("qwen2_5_vl_f32");
  EditJson(dir / "config.json", [](json& j) { j.erase("model_type"); });
  auto ck = OpenCheckpoint(dir.string());
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  EXPECT_EQ((*ck)->vision().arch, VisionArch::kQwen25VL);

  EditJson(dir / "config.json", [](json& j) { j["architectures"] = {"LlavaForConditionalGeneration"}; });
  ExpectError(dir, StatusCode::kInvalidArgument, {"LlavaForConditionalGeneration", "qwen2_5_vl"});
}

TEST_F(CheckpointTest, VisionTensorsUnderBothPrefixesAreRejected) {
  const fs::path dir = Copy("qwen2_vl_f32");
  CopyTensor(dir / "model.safetensors", "visual.merger.ln_q.weight", "model.visual.merger.ln_q.weight");
  ExpectError(dir, StatusCode::kInvalidArgument, {"both"});
}

TEST_F(CheckpointTest, PreprocessorDisagreeingWithTheTowerIsAnError) {
  const fs::path dir = Copy("qwen2_vl_f32");
  EditJson(dir / "preprocessor_config.json", [](json& j) { j["patch_size"] = 16; });
  ExpectError(dir, StatusCode::kInvalidArgument, {"preprocessor_config.json", "disagree"});
}

TEST_F(CheckpointTest, MissingFilesAreNotFound) {
  const fs::path dir = Copy("qwen2_vl_f32");
  fs::remove(dir / "preprocessor_config.json");
  ExpectError(dir, StatusCode::kNotFound, {"preprocessor_config.json"});
  ExpectError(tmp_ / "absent", StatusCode::kNotFound, {"absent"});
  const fs::path no_weights = Copy("qwen2_vl_f32", "noweights");
  fs::remove(no_weights / "model.safetensors");
  ExpectError(no_weights, StatusCode::kNotFound, {"model.safetensors"});
}

TEST_F(CheckpointTest, MalformedConfigIsNamed) {
  const fs::path dir = Copy("qwen2_vl_f32");
  WriteAll(dir / "config.json", "{\"model_type\": ");
  ExpectError(dir, StatusCode::kInvalidArgument, {"config.json", "not valid JSON"});
  const fs::path dir2 = Copy("qwen2_vl_f32", "copy2");
  EditJson(dir2 / "config.json", [](json& j) { j["vision_config"]["depth"] = "three"; });
  ExpectError(dir2, StatusCode::kInvalidArgument, {"depth must be an integer"});
}

}  // namespace
}  // namespace epd
