// SafetensorsFile on files built byte by byte here, so what the reader must
// accept or reject is written out independently of its writer.
#include "epd/model/safetensors_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "safetensors_bytes.h"

namespace epd {
namespace {

using test_util::FloatBytes;
using test_util::Le64;

class SafetensorsFileTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& bytes) {
    std::string path = (std::filesystem::temp_directory_path() /
                        ("epd_st_" + std::to_string(getpid()) + "_" + std::to_string(counter_++)))
                           .string();
    std::ofstream(path, std::ios::binary) << bytes;
    paths_.push_back(path);
    return path;
  }
  // A file with `header` as its JSON and `data` after it.
  std::string File(const std::string& header, const std::string& data) {
    return Write(Le64(header.size()) + header + data);
  }
  // Opens `bytes`, expects kInvalidArgument with `needle` in the message.
  void ExpectRejected(const std::string& bytes, const std::string& needle) {
    auto f = SafetensorsFile::Open(Write(bytes));
    ASSERT_FALSE(f.ok()) << needle;
    EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(f.status().message().find(needle), std::string::npos) << f.status().message();
  }
  void TearDown() override {
    for (const std::string& p : paths_) std::filesystem::remove(p);
  }

  int counter_ = 0;
  std::vector<std::string> paths_;
};

TEST_F(SafetensorsFileTest, ReadsAHandWrittenFile) {
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[1],"data_offsets":[8,10]},)"
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string data = FloatBytes({1.5f, -2.0f}) + std::string("\x80\x3f", 2);  // bf16 1.0 = 0x3f80
  auto f = SafetensorsFile::Open(File(header, data));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  ASSERT_EQ((*f)->tensors().size(), 2u);
  const TensorView* a = (*f)->Find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, TensorDType::kF32);
  EXPECT_EQ(a->shape, (std::vector<std::int64_t>{2}));
  float values[2];
  ASSERT_EQ(a->bytes.size(), 8u);
  std::memcpy(values, a->bytes.data(), 8);
  EXPECT_EQ(values[0], 1.5f);
  EXPECT_EQ(values[1], -2.0f);
  const TensorView* b = (*f)->Find("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->dtype, TensorDType::kBF16);
  EXPECT_EQ(static_cast<unsigned char>(b->bytes[1]), 0x3fu);
  EXPECT_EQ((*f)->metadata().at("format"), "pt");
  EXPECT_EQ((*f)->Find("c"), nullptr);
}

TEST_F(SafetensorsFileTest, WriterOutputReadsBack) {
  const std::string w = FloatBytes({1, 2, 3, 4, 5, 6});
  const std::int64_t ids[2] = {7, -1};
  std::vector<NamedTensor> tensors = {
      {"weight", {TensorDType::kF32, {2, 3}, std::as_bytes(std::span(w.data(), w.size()))}},
      {"grid", {TensorDType::kI64, {1, 2}, std::as_bytes(std::span(ids))}},
  };
  const std::string path = Write("");
  ASSERT_TRUE(WriteSafetensors(path, tensors, {{"k", "v"}}).ok());
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  const TensorView* t = (*f)->Find("weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->shape, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(t->bytes.data()), t->bytes.size()), w);
  // Data starts 8-byte aligned after the padded header.
  EXPECT_EQ((8 + (*f)->header().size()) % 8, 0u);
  EXPECT_EQ((*f)->Find("grid")->dtype, TensorDType::kI64);
  EXPECT_EQ((*f)->metadata().at("k"), "v");
}

TEST_F(SafetensorsFileTest, MissingFileIsNotFound) {
  auto f = SafetensorsFile::Open("/nonexistent/x.safetensors");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kNotFound);
}

TEST_F(SafetensorsFileTest, RejectsFilesShorterThanTheLengthField) { ExpectRejected("abc", "shorter than the 8-byte"); }

TEST_F(SafetensorsFileTest, RejectsAZeroHeaderLength) { ExpectRejected(Le64(0), "header length is 0"); }

TEST_F(SafetensorsFileTest, RejectsAHeaderLongerThanTheFile) { ExpectRejected(Le64(1000) + "{}", "runs past the end"); }

TEST_F(SafetensorsFileTest, RejectsAHeaderThatIsNotJson) {
  const std::string h = "{not json";
  ExpectRejected(Le64(h.size()) + h, "not valid JSON");
}

TEST_F(SafetensorsFileTest, RejectsAnUnknownDtype) {
  const std::string h = R"({"x":{"dtype":"F12","shape":[1],"data_offsets":[0,4]}})";
  ExpectRejected(Le64(h.size()) + h + FloatBytes({1}), "unknown dtype 'F12'");
}

TEST_F(SafetensorsFileTest, RejectsDataPastTheEndOfATruncatedFile) {
  const std::string h = R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  ExpectRejected(Le64(h.size()) + h + FloatBytes({1, 2}), "tensor 'x': data_offsets [0,16] run past the end");
}

TEST_F(SafetensorsFileTest, RejectsABytesCountThatDisagreesWithTheShape) {
  const std::string h = R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})";
  ExpectRejected(Le64(h.size()) + h + FloatBytes({1, 2}), "needs 12");
}

TEST_F(SafetensorsFileTest, RejectsOffsetsThatEndBeforeTheyBegin) {
  const std::string h = R"({"x":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}})";
  ExpectRejected(Le64(h.size()) + h + FloatBytes({1}), "end before they begin");
}

TEST_F(SafetensorsFileTest, RejectsNegativeDimensions) {
  const std::string h = R"({"x":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})";
  ExpectRejected(Le64(h.size()) + h + FloatBytes({1}), "not a non-negative integer");
}

TEST_F(SafetensorsFileTest, RejectsAShapeWhoseSizeOverflows) {
  const std::string h = R"({"x":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,4]}})";
  ExpectRejected(Le64(h.size()) + h + FloatBytes({1}), "overflows");
}

TEST_F(SafetensorsFileTest, RejectsNonStringMetadata) {
  const std::string h = R"({"__metadata__":{"n":3}})";
  ExpectRejected(Le64(h.size()) + h, "__metadata__ value 'n'");
}

TEST_F(SafetensorsFileTest, WriterRejectsBytesThatDisagreeWithTheShape) {
  const std::string w = FloatBytes({1, 2});
  std::vector<NamedTensor> tensors = {{"w", {TensorDType::kF32, {3}, std::as_bytes(std::span(w.data(), w.size()))}}};
  auto s = SerializeSafetensors(tensors);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("'w'"), std::string::npos);
}

}  // namespace
}  // namespace epd
