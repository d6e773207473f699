#include "epd/worker/safetensors.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

namespace epd {
namespace {

ContentKey Key(std::uint8_t fill) {
  ContentKey k;
  k.bytes.fill(fill);
  return k;
}

EmbeddingPtr MakeEmbedding(std::int64_t tokens, std::int64_t hidden, std::int64_t layers, DType dtype,
                           std::uint8_t seed) {
  auto e = std::make_shared<Embedding>();
  e->tokens = tokens;
  e->hidden = hidden;
  e->deepstack_layers = layers;
  e->dtype = dtype;
  const std::size_t main = static_cast<std::size_t>(tokens * hidden) * DTypeSize(dtype);
  for (std::size_t i = 0; i < main; ++i) e->main.push_back(static_cast<std::byte>(seed + i));
  for (std::size_t i = 0; i < main * layers; ++i)
    e->deepstack.push_back(static_cast<std::byte>(static_cast<std::size_t>(seed) * 3 + i));
  return e;
}

std::uint64_t HeaderLength(const std::string& bytes) {
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<std::uint8_t>(bytes[i]);
  return n;
}

TEST(SafetensorsTest, HeaderNamesEachKeyAndItsDeepstackWithOffsets) {
  std::vector<KeyedEmbedding> in = {{Key(0xbb), MakeEmbedding(2, 3, 0, DType::kFloat32, 1)},
                                    {Key(0xaa), MakeEmbedding(1, 2, 2, DType::kBFloat16, 7)}};
  auto bytes = SerializeEmbeddingsSafetensors(in, {{"model_id", "m"}});
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  const std::uint64_t n = HeaderLength(*bytes);
  EXPECT_EQ((8 + n) % 8, 0u);
  const std::string aa(64, 'a'), bb(64, 'b');
  // Written out by hand: aa (bf16) main 1x2 = 4 bytes, deepstack 1x4 = 8
  // bytes, then bb (f32) main 2x3 = 24 bytes; no deepstack tensor for bb.
  const std::string want = "{\"__metadata__\":{\"model_id\":\"m\"},\"" + aa +
                           "\":{\"data_offsets\":[0,4],\"dtype\":\"BF16\",\"shape\":[1,2]},\"" + aa +
                           ".deepstack\":{\"data_offsets\":[4,12],\"dtype\":\"BF16\",\"shape\":[1,4]},\"" + bb +
                           "\":{\"data_offsets\":[12,36],\"dtype\":\"F32\",\"shape\":[2,3]}}";
  std::string header = bytes->substr(8, n);
  EXPECT_EQ(header.substr(0, want.size()), want);
  EXPECT_EQ(header.find_first_not_of(' ', want.size()), std::string::npos);
  EXPECT_EQ(bytes->size(), 8 + n + 36);
  EXPECT_EQ(static_cast<std::uint8_t>((*bytes)[8 + n]), 7);  // aa main's first byte
}

TEST(SafetensorsTest, FileRoundTripsKeysShapesAndBytes) {
  std::vector<KeyedEmbedding> in = {{Key(0x01), MakeEmbedding(3, 4, 3, DType::kBFloat16, 5)},
                                    {Key(0x02), MakeEmbedding(5, 2, 0, DType::kFloat32, 9)},
                                    {Key(0x01), MakeEmbedding(3, 4, 3, DType::kBFloat16, 5)}};  // duplicate
  const std::string path = (std::filesystem::temp_directory_path() / "epd_safetensors_test.safetensors").string();
  ASSERT_TRUE(WriteEmbeddingsSafetensors(path, in, {{"a", "1"}, {"b", "two"}}).ok());
  auto back = ReadEmbeddingsSafetensors(path);
  std::remove(path.c_str());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->embeddings.size(), 2u);
  EXPECT_EQ(back->metadata, (std::map<std::string, std::string>{{"a", "1"}, {"b", "two"}}));
  for (std::size_t i = 0; i < 2; ++i) {
    const Embedding& got = *back->embeddings[i].embedding;
    const Embedding& want = *in[i].embedding;
    EXPECT_EQ(back->embeddings[i].key, in[i].key);
    EXPECT_EQ(got.tokens, want.tokens);
    EXPECT_EQ(got.hidden, want.hidden);
    EXPECT_EQ(got.deepstack_layers, want.deepstack_layers);
    EXPECT_EQ(got.dtype, want.dtype);
    EXPECT_TRUE(got.main == want.main);
    EXPECT_TRUE(got.deepstack == want.deepstack);
  }
}

// 8 bytes of `v`, little-endian, as the file must hold an I64.
std::string Le64(std::int64_t v) {
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((static_cast<std::uint64_t>(v) >> (8 * i)) & 0xff));
  return out;
}

TEST(SafetensorsTest, GridIsAnI64TensorBesideItsKey) {
  // 2 tokens of a 2x(2x2)-patch clip: t * h * w / 4 = 2 * 2 * 2 / 4.
  auto e = std::make_shared<Embedding>(*MakeEmbedding(2, 1, 0, DType::kFloat32, 3));
  e->grid = {2, 2, 2};
  std::vector<KeyedEmbedding> in = {{Key(0xcc), e}};
  auto bytes = SerializeEmbeddingsSafetensors(in);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  const std::uint64_t n = HeaderLength(*bytes);
  const std::string cc(64, 'c');
  // By hand: main 2x1 f32 = 8 bytes at [0, 8), then the grid, 3 x 8 bytes.
  const std::string want = "{\"" + cc + "\":{\"data_offsets\":[0,8],\"dtype\":\"F32\",\"shape\":[2,1]},\"" + cc +
                           ".grid_thw\":{\"data_offsets\":[8,32],\"dtype\":\"I64\",\"shape\":[3]}}";
  EXPECT_EQ(bytes->substr(8, want.size()), want);
  ASSERT_EQ(bytes->size(), 8 + n + 32);
  EXPECT_EQ(bytes->substr(8 + n + 8), Le64(2) + Le64(2) + Le64(2));

  auto back = ParseEmbeddingsSafetensors(*bytes);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->embeddings.size(), 1u);
  EXPECT_EQ(back->embeddings[0].embedding->grid, (GridTHW{2, 2, 2}));
}

TEST(SafetensorsTest, FileWithoutGridsReadsBackWithUnknownGrids) {
  // What a writer before grids produced: main and deepstack only.
  std::vector<KeyedEmbedding> in = {{Key(0x05), MakeEmbedding(1, 2, 1, DType::kFloat32, 4)}};
  auto bytes = SerializeEmbeddingsSafetensors(in);
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(bytes->find(".grid_thw"), std::string::npos);
  auto back = ParseEmbeddingsSafetensors(*bytes);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_FALSE(back->embeddings[0].embedding->grid.known());
}

TEST(SafetensorsTest, SameBytesUnderOneKeyWithDifferentGridsClash) {
  auto a = std::make_shared<Embedding>(*MakeEmbedding(1, 2, 0, DType::kFloat32, 1));
  auto b = std::make_shared<Embedding>(*a);
  a->grid = {1, 2, 2};
  b->grid = {1, 1, 4};
  std::vector<KeyedEmbedding> clash = {{Key(1), a}, {Key(1), b}};
  EXPECT_EQ(SerializeEmbeddingsSafetensors(clash).status().code(), StatusCode::kInvalidArgument);
}

TEST(SafetensorsTest, MalformedGridsAreErrorsNamingTheTensor) {
  const std::string k(64, 'd');
  // One f32 main tensor [1, 1] at [0, 4), then a grid tensor described by
  // `grid` over `payload`.
  auto file = [&](const std::string& grid, const std::string& payload) {
    std::string header = "{\"" + k + "\":{\"dtype\":\"F32\",\"shape\":[1,1],\"data_offsets\":[0,4]}" + grid + "}";
    return Le64(static_cast<std::int64_t>(header.size())) + header + std::string(4, '\0') + payload;
  };
  const std::string three = Le64(1) + Le64(2) + Le64(2);
  ASSERT_TRUE(ParseEmbeddingsSafetensors(
                  file(",\"" + k + ".grid_thw\":{\"dtype\":\"I64\",\"shape\":[3],\"data_offsets\":[4,28]}", three))
                  .ok());
  const std::vector<std::pair<std::string, std::string>> bad = {
      {",\"" + k + ".grid_thw\":{\"dtype\":\"I32\",\"shape\":[3],\"data_offsets\":[4,16]}", std::string(12, '\1')},
      {",\"" + k + ".grid_thw\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[4,20]}", Le64(1) + Le64(2)},
      {",\"" + k + ".grid_thw\":{\"dtype\":\"I64\",\"shape\":[3],\"data_offsets\":[4,28]}", three.substr(0, 20)},
      {",\"" + k + ".grid_thw\":{\"dtype\":\"I64\",\"shape\":[3],\"data_offsets\":[4,28]}",
       Le64(1) + Le64(0) + Le64(2)},
      {",\"" + std::string(64, 'e') + ".grid_thw\":{\"dtype\":\"I64\",\"shape\":[3],\"data_offsets\":[4,28]}", three},
  };
  for (const auto& [grid, payload] : bad) {
    auto r = ParseEmbeddingsSafetensors(file(grid, payload));
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << grid;
    EXPECT_NE(r.status().message().find("grid_thw"), std::string::npos) << r.status().message();
  }
}

TEST(SafetensorsTest, SameEntriesGiveSameBytesInAnyOrder) {
  auto a = MakeEmbedding(1, 2, 1, DType::kFloat32, 1), b = MakeEmbedding(2, 2, 1, DType::kFloat32, 2);
  std::vector<KeyedEmbedding> x = {{Key(1), a}, {Key(2), b}}, y = {{Key(2), b}, {Key(1), a}};
  EXPECT_EQ(*SerializeEmbeddingsSafetensors(x), *SerializeEmbeddingsSafetensors(y));
}

TEST(SafetensorsTest, RejectsInconsistentEntries) {
  auto e = MakeEmbedding(2, 2, 1, DType::kFloat32, 1);
  auto wrong = std::make_shared<Embedding>(*e);
  wrong->main.pop_back();
  std::vector<KeyedEmbedding> bad = {{Key(1), wrong}};
  EXPECT_EQ(SerializeEmbeddingsSafetensors(bad).status().code(), StatusCode::kInvalidArgument);
  std::vector<KeyedEmbedding> null = {{Key(1), nullptr}};
  EXPECT_EQ(SerializeEmbeddingsSafetensors(null).status().code(), StatusCode::kInvalidArgument);
  std::vector<KeyedEmbedding> clash = {{Key(1), e}, {Key(1), MakeEmbedding(2, 2, 1, DType::kFloat32, 2)}};
  auto s = SerializeEmbeddingsSafetensors(clash).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  std::string hex;
  for (int i = 0; i < 32; ++i) hex += "01";
  EXPECT_EQ(s.message(), "two different embeddings under key " + hex);
}

TEST(SafetensorsTest, MalformedFilesAreErrorsNotCrashes) {
  std::vector<KeyedEmbedding> in = {{Key(3), MakeEmbedding(2, 2, 1, DType::kFloat32, 1)}};
  const std::string good = *SerializeEmbeddingsSafetensors(in);
  EXPECT_TRUE(ParseEmbeddingsSafetensors(good).ok());
  const std::vector<std::string> bad = {
      "",                                                         // no length
      good.substr(0, 20),                                         // header cut
      good.substr(0, good.size() - 1),                            // data cut: offsets past the end
      std::string("\xff\xff\xff\xff\xff\xff\xff\xff", 8) + "{}",  // absurd header length
      std::string("\x02\0\0\0\0\0\0\0", 8) + "[]",                // not an object
      std::string("\x0b\0\0\0\0\0\0\0", 8) + "{\"x\":{}}   ",     // bad name
  };
  for (const std::string& b : bad) {
    auto r = ParseEmbeddingsSafetensors(b);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
  }
  EXPECT_EQ(ReadEmbeddingsSafetensors("/nonexistent/dir/x.safetensors").status().code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace epd
