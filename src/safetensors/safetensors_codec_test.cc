// The safetensors codec on bytes written out by hand (src/testing/
// safetensors_bytes.h): what the parser must accept, what it must refuse and
// with which words, and the writer's exact layout.
#include "epd/safetensors/safetensors_codec.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "safetensors_bytes.h"

namespace epd {
namespace {

using test_util::FloatBytes;
using test_util::Le64;
using test_util::SafetensorsBytes;

constexpr std::string_view kSource = "safetensors file /x/m.safetensors";

std::span<const std::byte> Bytes(const std::string& s) { return std::as_bytes(std::span(s.data(), s.size())); }

std::string Text(std::span<const std::byte> b) { return {reinterpret_cast<const char*>(b.data()), b.size()}; }

TEST(SafetensorsCodecTest, ParsesAHandWrittenFileIntoViewsOfItsBytes) {
  const std::string header =
      R"({"__metadata__":{"format":"pt","n":"2"},"b":{"dtype":"I64","shape":[1,1],"data_offsets":[8,16]},)"
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string file = SafetensorsBytes(header, FloatBytes({1.5f, -2.0f}) + Le64(7));
  auto p = ParseSafetensors(Bytes(file), kSource);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->header, header);
  EXPECT_EQ(p->metadata, (std::map<std::string, std::string>{{"format", "pt"}, {"n", "2"}}));
  ASSERT_EQ(p->tensors.size(), 2u);
  const TensorView& a = p->tensors.at("a");
  EXPECT_EQ(a.dtype, TensorDType::kF32);
  EXPECT_EQ(a.shape, (std::vector<std::int64_t>{2}));
  // A view, not a copy: the first data byte sits after the 8-byte prefix and the header.
  EXPECT_EQ(reinterpret_cast<const char*>(a.bytes.data()), file.data() + 8 + header.size());
  EXPECT_EQ(Text(a.bytes), FloatBytes({1.5f, -2.0f}));
  const TensorView& b = p->tensors.at("b");
  EXPECT_EQ(b.dtype, TensorDType::kI64);
  EXPECT_EQ(b.shape, (std::vector<std::int64_t>{1, 1}));
  EXPECT_EQ(Text(b.bytes), Le64(7));
}

TEST(SafetensorsCodecTest, WriterLayoutIsTheFormatsByHand) {
  const std::string a = FloatBytes({1, 2, 3});
  const std::string b = Le64(5) + Le64(6);
  const std::vector<NamedTensor> tensors = {{"b", {TensorDType::kI64, {1, 2}, Bytes(b)}},
                                            {"a", {TensorDType::kF32, {3}, Bytes(a)}}};
  auto out = SerializeSafetensors(tensors, {{"k", "v"}});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  // Keys sorted (nlohmann's object order, and the reference writer's): a's
  // 12 bytes first, then b's 16; 137 header bytes padded to 144.
  std::string header = R"({"__metadata__":{"k":"v"},"a":{"data_offsets":[0,12],"dtype":"F32","shape":[3]},)"
                       R"("b":{"data_offsets":[12,28],"dtype":"I64","shape":[1,2]}})";
  ASSERT_EQ(header.size(), 137u);
  header += std::string(7, ' ');
  EXPECT_EQ(*out, Le64(144) + header + a + b);
}

TEST(SafetensorsCodecTest, SameTensorsInAnyOrderGiveTheSameBytes) {
  const std::string x = FloatBytes({1}), y = FloatBytes({2, 3});
  const std::vector<NamedTensor> one = {{"x", {TensorDType::kF32, {1}, Bytes(x)}},
                                        {"y", {TensorDType::kF32, {2}, Bytes(y)}}};
  const std::vector<NamedTensor> two = {one[1], one[0]};
  EXPECT_EQ(*SerializeSafetensors(one), *SerializeSafetensors(two));
}

TEST(SafetensorsCodecTest, WriterOutputParsesBackToTheSameTensors) {
  const std::string w = FloatBytes({1, 2, 3, 4, 5, 6});
  const std::string h = "\x01\x02\x03\x04";  // BF16 [2]
  const std::vector<NamedTensor> tensors = {{"weight", {TensorDType::kF32, {2, 3}, Bytes(w)}},
                                            {"half", {TensorDType::kBF16, {2}, Bytes(h)}},
                                            {"empty", {TensorDType::kU8, {0, 4}, {}}}};
  auto file = SerializeSafetensors(tensors, {{"a", "b"}});
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(file->size() % 8, (w.size() + h.size()) % 8);  // the data starts 8-byte aligned
  auto p = ParseSafetensors(Bytes(*file), kSource);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_EQ(p->tensors.size(), 3u);
  for (const NamedTensor& t : tensors) {
    const TensorView& back = p->tensors.at(t.name);
    EXPECT_EQ(back.dtype, t.tensor.dtype) << t.name;
    EXPECT_EQ(back.shape, t.tensor.shape) << t.name;
    EXPECT_EQ(Text(back.bytes), Text(t.tensor.bytes)) << t.name;
  }
  EXPECT_EQ(p->metadata.at("a"), "b");
}

// One malformed file and a phrase its error must contain.
struct Malformed {
  std::string what;
  std::string bytes;
  std::string needle;
};

std::string Entry(const std::string& name, const std::string& dtype, const std::string& shape,
                  const std::string& offsets) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":" + offsets + "}";
}

// A header object of `entries`.
std::string Header(std::initializer_list<std::string> entries) {
  std::string h = "{";
  for (const std::string& e : entries) h.append(h.size() > 1 ? "," : "").append(e);
  return h.append("}");
}

std::vector<Malformed> MalformedFiles() {
  const std::string good = SafetensorsBytes(Header({Entry("x", "F32", "[2]", "[0,8]")}), FloatBytes({1, 2}));
  auto one = [](const std::string& entry, const std::string& data) { return SafetensorsBytes(Header({entry}), data); };
  return {
      {"empty", "", "is 0 bytes, shorter than the 8-byte header length"},
      {"prefix cut", "abc", "is 3 bytes, shorter than the 8-byte header length"},
      {"zero header length", Le64(0) + "{}", "header length is 0"},
      {"header over 100 MB", Le64(100'000'001) + "{}", "header length 100000001 exceeds 100 MB"},
      {"header cut (truncated file)", good.substr(0, 20), "runs past the end of the 20-byte file (truncated?)"},
      {"data cut (truncated file)", good.substr(0, good.size() - 1),
       "tensor 'x': data_offsets [0,8] run past the end of the data (7 bytes after the header; truncated?)"},
      {"not JSON", SafetensorsBytes("{\"x\":", ""), "header is not valid JSON"},
      {"not an object", SafetensorsBytes("[1,2]", ""), "header is not a JSON object"},
      {"entry not an object", SafetensorsBytes(R"({"x":3})", ""), "tensor 'x': entry is not an object"},
      {"empty name", one(Entry("", "F32", "[1]", "[0,4]"), FloatBytes({1})), "tensor '': the name is empty"},
      {"no dtype", SafetensorsBytes(R"({"x":{"shape":[1],"data_offsets":[0,4]}})", FloatBytes({1})),
       "tensor 'x': no string 'dtype'"},
      {"shape not an array", one(Entry("x", "F32", "4", "[0,4]"), FloatBytes({1})), "tensor 'x': no array 'shape'"},
      {"three offsets", one(Entry("x", "F32", "[1]", "[0,4,8]"), FloatBytes({1, 2})),
       "tensor 'x': no 2-element 'data_offsets'"},
      {"unknown dtype", one(Entry("x", "F12", "[1]", "[0,4]"), FloatBytes({1})), "tensor 'x': unknown dtype 'F12'"},
      {"negative dimension", one(Entry("x", "F32", "[-1]", "[0,4]"), FloatBytes({1})),
       "shape [-1] has an entry that is not a non-negative integer"},
      {"fractional dimension", one(Entry("x", "F32", "[1.5]", "[0,4]"), FloatBytes({1})),
       "shape [1.5] has an entry that is not a non-negative integer"},
      {"shape overflows", one(Entry("x", "F32", "[4294967296,4294967296,16]", "[0,4]"), FloatBytes({1})),
       "overflows 64 bits"},
      {"negative offset", one(Entry("x", "F32", "[1]", "[-4,0]"), FloatBytes({1})),
       "data_offsets [-4,0] are not non-negative integers"},
      {"offsets end before they begin", one(Entry("x", "F32", "[0]", "[4,0]"), FloatBytes({1})),
       "data_offsets [4,0] end before they begin"},
      {"offsets out of range", one(Entry("x", "F32", "[1]", "[8,12]"), FloatBytes({1, 2})),
       "tensor 'x': data_offsets [8,12] run past the end of the data (8 bytes after the header; truncated?)"},
      {"size mismatch", one(Entry("x", "F32", "[3]", "[0,8]"), FloatBytes({1, 2})),
       "tensor 'x': holds 8 bytes, but F32 [3] needs 12"},
      {"overlapping offsets",
       SafetensorsBytes(Header({Entry("a", "F32", "[2]", "[0,8]"), Entry("b", "F32", "[2]", "[4,12]")}),
                        FloatBytes({1, 2, 3})),
       "tensors 'a' (data_offsets [0,8]) and 'b' (data_offsets [4,12]) overlap"},
      {"one range inside another",
       SafetensorsBytes(Header({Entry("a", "F32", "[4]", "[0,16]"), Entry("b", "U8", "[4]", "[4,8]")}),
                        FloatBytes({1, 2, 3, 4})),
       "tensors 'a' (data_offsets [0,16]) and 'b' (data_offsets [4,8]) overlap"},
      {"metadata not an object", SafetensorsBytes(R"({"__metadata__":[1]})", ""), "__metadata__ is not an object"},
      {"metadata not strings", SafetensorsBytes(R"({"__metadata__":{"n":3}})", ""),
       "__metadata__ value 'n' is not a string"},
  };
}

TEST(SafetensorsCodecTest, MalformedFilesAreRefusedNamingTheSourceOnceAndWhatIsWrong) {
  for (const Malformed& m : MalformedFiles()) {
    auto p = ParseSafetensors(Bytes(m.bytes), kSource);
    ASSERT_FALSE(p.ok()) << m.what;
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument) << m.what;
    const std::string msg = p.status().message();
    EXPECT_EQ(msg.rfind(std::string(kSource) + ": ", 0), 0u) << m.what << ": " << msg;
    EXPECT_EQ(msg.find(kSource, 1), std::string::npos) << m.what << ": the source twice: " << msg;
    EXPECT_NE(msg.find(m.needle), std::string::npos) << m.what << ": " << msg;
  }
}

TEST(SafetensorsCodecTest, GapsAndEmptyTensorsInsideOthersAreAccepted) {
  // a [0,4), 4 unused bytes, b [8,12), an empty c at 2 (inside a), 4 trailing bytes.
  const std::string header = Header(
      {Entry("a", "F32", "[1]", "[0,4]"), Entry("b", "F32", "[1]", "[8,12]"), Entry("c", "F32", "[0]", "[2,2]")});
  const std::string file = SafetensorsBytes(header, FloatBytes({1, 9, 2, 9}));
  auto p = ParseSafetensors(Bytes(file), kSource);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(Text(p->tensors.at("b").bytes), FloatBytes({2}));
  EXPECT_TRUE(p->tensors.at("c").bytes.empty());
}

TEST(SafetensorsCodecTest, WriterRefusesWhatTheFormatCannotHold) {
  const std::string four = FloatBytes({1});
  const std::vector<std::pair<std::vector<NamedTensor>, std::string>> bad = {
      {{{"", {TensorDType::kF32, {1}, Bytes(four)}}}, "tensor name '' is reserved"},
      {{{"__metadata__", {TensorDType::kF32, {1}, Bytes(four)}}}, "tensor name '__metadata__' is reserved"},
      {{{"w", {TensorDType::kF32, {-1}, Bytes(four)}}}, "tensor 'w' has a negative dimension"},
      {{{"w", {TensorDType::kF32, {2}, Bytes(four)}}}, "tensor 'w': 4 bytes do not match F32 [2]"},
      {{{"w", {TensorDType::kU8, {4294967296, 4294967296, 16}, Bytes(four)}}},
       "tensor 'w': 4 bytes do not match U8 [4294967296, 4294967296, 16]"},
      {{{"w", {TensorDType::kF32, {1}, Bytes(four)}}, {"w", {TensorDType::kF32, {1}, Bytes(four)}}},
       "tensor 'w' appears twice"},
  };
  for (const auto& [tensors, message] : bad) {
    auto out = SerializeSafetensors(tensors);
    ASSERT_FALSE(out.ok()) << message;
    EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(out.status().message(), message);
  }
}

TEST(SafetensorsCodecTest, WriteSafetensorsReplacesTheFileWholeOrNamesWhyNot) {
  const std::string dir = (std::filesystem::temp_directory_path() / ("epd_codec_" + std::to_string(getpid()))).string();
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/t.safetensors";
  const std::string w = FloatBytes({4, 5});
  const std::vector<NamedTensor> tensors = {{"w", {TensorDType::kF32, {2}, Bytes(w)}}};
  ASSERT_TRUE(WriteSafetensors(path, tensors).ok());
  std::stringstream read;
  read << std::ifstream(path, std::ios::binary).rdbuf();
  EXPECT_EQ(read.str(), *SerializeSafetensors(tensors));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

  const Status s = WriteSafetensors(dir + "/no/such/dir/t.safetensors", tensors);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find(dir + "/no/such/dir/t.safetensors.tmp"), std::string::npos) << s.message();
  std::filesystem::remove_all(dir);
}

TEST(SafetensorsCodecTest, DTypesAreTheFormatsFifteenWithTheirSizes) {
  // The README's list, with each type's bytes per element.
  const std::vector<std::pair<std::string, std::size_t>> want = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
      {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"F64", 8},     {"I64", 8}, {"U64", 8}};
  for (const auto& [name, size] : want) {
    const std::optional<TensorDType> d = ParseTensorDType(name);
    ASSERT_TRUE(d.has_value()) << name;
    EXPECT_EQ(TensorDTypeName(*d), name);
    EXPECT_EQ(TensorDTypeSize(*d), size) << name;
  }
  EXPECT_FALSE(ParseTensorDType("f32").has_value());
  EXPECT_FALSE(ParseTensorDType("F8").has_value());
  EXPECT_EQ(ToTensorDType(DType::kBFloat16), TensorDType::kBF16);
  EXPECT_EQ(ToEmbeddingDType(TensorDType::kF16), DType::kFloat16);
  EXPECT_EQ(ToEmbeddingDType(TensorDType::kF32), DType::kFloat32);
  EXPECT_FALSE(ToEmbeddingDType(TensorDType::kI64).has_value());
}

}  // namespace
}  // namespace epd
