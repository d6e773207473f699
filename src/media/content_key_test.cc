#include "epd/media/content_key.h"

#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "digest.h"
#include "epd/media/image.h"
#include "epd/media/preprocess.h"
#include "epd/media/video.h"

namespace epd {
namespace {

using Bytes = std::vector<std::uint8_t>;

Bytes B(std::string_view s) { return Bytes(s.begin(), s.end()); }

std::string HexOf(const std::array<std::uint8_t, 32>& d) {
  ContentKey k;
  k.bytes = d;
  return k.Hex();
}

// FIPS 180-2 appendix B.1 and the well-known empty-string digest.
TEST(Sha256Test, MatchesPublishedTestVectors) {
  auto abc = internal::NewSha256();
  abc->Update(B("abc"));
  EXPECT_EQ(HexOf(abc->Final()), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");

  auto empty = internal::NewSha256();
  EXPECT_EQ(HexOf(empty->Final()), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");

  // FIPS 180-2 B.2, fed in two pieces to exercise streaming.
  auto two = internal::NewSha256();
  two->Update(B("abcdbcdecdefdefgefghfghighijhijk"));
  two->Update(B("ijkljklmklmnlmnomnopnopq"));
  EXPECT_EQ(HexOf(two->Final()), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(ContentKeyTest, SameBytesAndConfigGiveSameKey) {
  PreprocessConfig cfg;
  const Bytes media = B("pretend these are jpeg bytes");
  EXPECT_EQ(ComputeContentKey("qwen2-vl", cfg, media), ComputeContentKey("qwen2-vl", cfg, Bytes(media)));
}

TEST(ContentKeyTest, DifferentMediaGiveDifferentKeys) {
  PreprocessConfig cfg;
  EXPECT_NE(ComputeContentKey("m", cfg, B("image-1")), ComputeContentKey("m", cfg, B("image-2")));
}

TEST(ContentKeyTest, EveryPreprocessingFieldAndTheModelIdChangeTheKey) {
  const PreprocessConfig base;
  const Bytes media = B("media");
  std::vector<PreprocessConfig> variants(11, base);
  variants[0].patch_size = 16;
  variants[1].merge_size = 3;
  variants[2].temporal_patch_size = 1;
  variants[3].min_pixels += 1;
  variants[4].max_pixels -= 1;
  variants[5].mean[1] = std::nextafter(base.mean[1], 1.0f);  // one ulp
  variants[6].std[2] = std::nextafter(base.std[2], 1.0f);
  variants[7].resample = Resample::kBilinear;
  variants[8].mean[0] = base.mean[1];  // values permuted across channels
  variants[8].mean[1] = base.mean[0];
  variants[9].std[0] = -0.0f;  // bit pattern, not value: -0 differs from any positive std
  variants[10].jpeg_dct_scaling = true;

  std::set<ContentKey> keys = {ComputeContentKey("qwen2-vl-7b", base, media),
                               ComputeContentKey("qwen2-vl-2b", base, media)};
  for (const auto& v : variants) keys.insert(ComputeContentKey("qwen2-vl-7b", v, media));
  EXPECT_EQ(keys.size(), 2 + variants.size());
}

TEST(ContentKeyTest, FieldBoundariesCannotCollide) {
  PreprocessConfig cfg;
  // ([AB], [C]) vs ([A], [BC]): the same concatenation, different split.
  EXPECT_NE(ComputeContentKey("AB", cfg, B("C")), ComputeContentKey("A", cfg, B("BC")));
  EXPECT_NE(ComputeContentKey("", cfg, B("x")), ComputeContentKey("x", cfg, B("")));
  auto c1 = CallerContentKey("AB", cfg, "C");
  auto c2 = CallerContentKey("A", cfg, "BC");
  ASSERT_TRUE(c1.ok() && c2.ok());
  EXPECT_NE(*c1, *c2);
}

TEST(ContentKeyTest, RawPixelKeyIncludesDimensions) {
  PreprocessConfig cfg;
  const Bytes pixels(std::size_t{30} * 150 * 3, 0x5a);
  auto wide = ComputeRawPixelKey("m", cfg, 150, 30, 3, pixels);
  auto tall = ComputeRawPixelKey("m", cfg, 30, 150, 3, pixels);
  ASSERT_TRUE(wide.ok() && tall.ok());
  EXPECT_NE(*wide, *tall);
  // Same bytes seen as 4-channel pixels: another shape, another key.
  auto rgba = ComputeRawPixelKey("m", cfg, 75, 45, 4, pixels);
  ASSERT_TRUE(rgba.ok());
  EXPECT_NE(*rgba, *wide);
}

TEST(ContentKeyTest, RawPixelKeyDiffersFromEncodedKeyOfSameBytes) {
  PreprocessConfig cfg;
  const Bytes pixels(std::size_t{4} * 3, 7);
  auto raw = ComputeRawPixelKey("m", cfg, 2, 2, 3, pixels);
  ASSERT_TRUE(raw.ok());
  EXPECT_NE(*raw, ComputeContentKey("m", cfg, pixels));
}

TEST(ContentKeyTest, RawPixelKeyRejectsSizeMismatch) {
  PreprocessConfig cfg;
  const Bytes pixels(10, 0);
  auto k = ComputeRawPixelKey("m", cfg, 2, 2, 3, pixels);
  ASSERT_FALSE(k.ok());
  EXPECT_EQ(k.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(k.status().message().find("do not match"), std::string::npos) << k.status().message();
  EXPECT_FALSE(ComputeRawPixelKey("m", cfg, 0, 2, 3, {}).ok());
  EXPECT_FALSE(ComputeRawPixelKey("m", cfg, 2, 2, 5, Bytes(20)).ok());
}

TEST(ContentKeyTest, CallerKeysNeverEqualComputedKeysOfTheSameBytes) {
  PreprocessConfig cfg;
  const std::string id = "sha256:0123abcd";
  auto caller = CallerContentKey("m", cfg, id);
  ASSERT_TRUE(caller.ok());
  EXPECT_NE(*caller, ComputeContentKey("m", cfg, B(id)));
  auto raw = ComputeRawPixelKey("m", cfg, static_cast<std::int64_t>(id.size()), 1, 1, B(id));
  ASSERT_TRUE(raw.ok());
  EXPECT_NE(*caller, *raw);
}

TEST(ContentKeyTest, CallerKeyDependsOnModelAndConfig) {
  PreprocessConfig cfg, other;
  other.max_pixels = 12845056;
  EXPECT_NE(*CallerContentKey("m", cfg, "k"), *CallerContentKey("n", cfg, "k"));
  EXPECT_NE(*CallerContentKey("m", cfg, "k"), *CallerContentKey("m", other, "k"));
  EXPECT_EQ(*CallerContentKey("m", cfg, "k"), *CallerContentKey("m", cfg, "k"));
}

TEST(ContentKeyTest, EmptyCallerKeyIsRejected) {
  auto k = CallerContentKey("m", PreprocessConfig{}, "");
  ASSERT_FALSE(k.ok());
  EXPECT_EQ(k.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(k.status().message().find("empty"), std::string::npos);
}

TEST(ContentKeyTest, FastModeIsDeterministicMarkedAndDistinctFromSha256) {
  PreprocessConfig cfg;
  const Bytes media = B("some media");
  const ContentKey fast = ComputeContentKey("m", cfg, media, KeyMode::kXxh3Fast);
  const ContentKey slow = ComputeContentKey("m", cfg, media);
  EXPECT_EQ(fast, ComputeContentKey("m", cfg, media, KeyMode::kXxh3Fast));
  EXPECT_NE(fast, slow);
  EXPECT_TRUE(IsFastContentKey(fast));
  EXPECT_FALSE(IsFastContentKey(slow));
  // The marker is exactly "epd:xxh3-128:v1\0" in the second half.
  EXPECT_EQ(fast.Hex().substr(32), "6570643a787868332d3132383a763100");
  EXPECT_NE(fast, ComputeContentKey("m", cfg, B("other media"), KeyMode::kXxh3Fast));
  PreprocessConfig c2 = cfg;
  c2.patch_size = 16;
  EXPECT_NE(fast, ComputeContentKey("m", c2, media, KeyMode::kXxh3Fast));
}

TEST(ContentKeyTest, HexIsSixtyFourLowerCaseDigitsAndRoundTrips) {
  ContentKey k;
  for (std::size_t i = 0; i < k.bytes.size(); ++i) k.bytes[i] = static_cast<std::uint8_t>(i * 17 + 3);
  const std::string hex = k.Hex();
  EXPECT_EQ(hex.substr(0, 8), "03142536");  // 3, 20, 37, 54
  EXPECT_EQ(hex.size(), 64u);
  auto back = ParseContentKeyHex(hex);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, k);
  std::string upper = hex;
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  EXPECT_EQ(*ParseContentKeyHex(upper), k);
}

TEST(ContentKeyTest, ParseHexRejectsBadInput) {
  auto short_hex = ParseContentKeyHex("abc");
  ASSERT_FALSE(short_hex.ok());
  EXPECT_EQ(short_hex.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(short_hex.status().message().find("64"), std::string::npos);
  std::string bad(64, '0');
  bad[10] = 'g';
  auto nonhex = ParseContentKeyHex(bad);
  ASSERT_FALSE(nonhex.ok());
  EXPECT_NE(nonhex.status().message().find("position 10"), std::string::npos) << nonhex.status().message();
}

// An independent re-encoding of the documented layout (content_key.cc's
// header comment): tag, 8-byte little-endian length, value.
void Field(Bytes& out, std::uint8_t tag, const Bytes& v) {
  out.push_back(tag);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::uint8_t>(std::uint64_t{v.size()} >> (8 * i)));
  out.insert(out.end(), v.begin(), v.end());
}

Bytes Le(std::uint64_t v, int n) {
  Bytes b;
  for (int i = 0; i < n; ++i) b.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
  return b;
}

Bytes Floats(const std::array<float, 3>& f) {
  Bytes b;
  for (float x : f) {
    std::uint32_t u;
    std::memcpy(&u, &x, 4);
    Bytes p = Le(u, 4);
    b.insert(b.end(), p.begin(), p.end());
  }
  return b;
}

// The fields every key starts with, for model "m" and the default config.
Bytes DefaultHeader(std::string_view domain) {
  const PreprocessConfig cfg;
  Bytes msg;
  Field(msg, 0x00, B(domain));
  Field(msg, 0x01, Le(2, 4));
  Field(msg, 0x02, B("m"));
  Field(msg, 0x10, Le(14, 8));
  Field(msg, 0x11, Le(2, 8));
  Field(msg, 0x12, Le(2, 8));
  Field(msg, 0x13, Le(3136, 8));
  Field(msg, 0x14, Le(1003520, 8));
  Field(msg, 0x15, Floats(cfg.mean));
  Field(msg, 0x16, Floats(cfg.std));
  Field(msg, 0x17, Le(0, 8));
  Field(msg, 0x18, Le(1, 8));                 // EXIF orientation applied
  Field(msg, 0x19, Bytes{1, 255, 255, 255});  // composite on white
  return msg;
}

ContentKey Sha256Key(const Bytes& msg) {
  auto sha = internal::NewSha256();
  sha->Update(msg);
  ContentKey key;
  key.bytes = sha->Final();
  return key;
}

// The key must not silently change between releases: a change would make
// every persisted cache entry miss. If this fails on purpose, bump
// kContentKeyVersion and update the expected value.
TEST(ContentKeyTest, EncodingIsStableForVersion2) {
  Bytes msg = DefaultHeader("epd/key/encoded");
  Field(msg, 0x30, B("xyz"));
  EXPECT_EQ(ComputeContentKey("m", PreprocessConfig{}, B("xyz")), Sha256Key(msg));
}

// A container's video key holds apply_rotation (tag 0x49) after the
// sampling fields; a frame list's does not (its frames follow EXIF instead).
TEST(VideoKeyTest, ContainerKeyEncodesTheRotationSwitchAndFrameListKeysDoNot) {
  auto sampling_fields = [](Bytes& msg) {
    const VideoSampling s;
    Field(msg, 0x40, Le(0x4000000000000000ull, 8));  // 2.0 as IEEE-754 bits
    Field(msg, 0x41, Le(static_cast<std::uint64_t>(-1), 8));
    for (const auto& [tag, v] :
         {std::pair{0x42, s.min_frames}, std::pair{0x43, s.max_frames}, std::pair{0x44, s.min_pixels},
          std::pair{0x45, s.max_pixels}, std::pair{0x46, s.total_pixels}}) {
      Field(msg, static_cast<std::uint8_t>(tag), Le(static_cast<std::uint64_t>(v), 8));
    }
    Field(msg, 0x47, Le(static_cast<std::uint64_t>(-1), 8));
    Field(msg, 0x48, Le(static_cast<std::uint64_t>(-1), 8));
  };
  const Bytes mp4 = B("mp4 bytes");
  const std::vector<std::span<const std::uint8_t>> parts = {mp4};
  for (const bool rotation : {true, false}) {
    Bytes msg = DefaultHeader("epd/key/video");
    sampling_fields(msg);
    Field(msg, 0x49, Le(rotation ? 1 : 0, 8));
    Field(msg, 0x33, mp4);
    VideoSampling s;
    s.apply_rotation = rotation;
    EXPECT_EQ(ComputeVideoKey("m", PreprocessConfig{}, s, parts, false), Sha256Key(msg)) << rotation;
  }
  Bytes frames = DefaultHeader("epd/key/video");
  sampling_fields(frames);
  Field(frames, 0x34, mp4);
  VideoSampling off;
  off.apply_rotation = false;
  EXPECT_EQ(ComputeVideoKey("m", PreprocessConfig{}, {}, parts, true), Sha256Key(frames));
  EXPECT_EQ(ComputeVideoKey("m", PreprocessConfig{}, off, parts, true), Sha256Key(frames));
}

TEST(ContentKeyTest, DecodeOptionsChangeTheKey) {
  const PreprocessConfig base;
  const ContentKey k = ComputeContentKey("m", base, B("xyz"));
  PreprocessConfig no_exif = base;
  no_exif.decode.apply_exif_orientation = false;
  EXPECT_NE(ComputeContentKey("m", no_exif, B("xyz")), k);
  PreprocessConfig black = base;
  black.decode.alpha.background = {0, 0, 0};
  EXPECT_NE(ComputeContentKey("m", black, B("xyz")), k);
  PreprocessConfig drop = base;
  drop.decode.alpha.composite = false;
  EXPECT_NE(ComputeContentKey("m", drop, B("xyz")), k);
  // With alpha dropped the background is irrelevant, and so not in the key.
  PreprocessConfig drop_black = drop;
  drop_black.decode.alpha.background = {0, 0, 0};
  EXPECT_EQ(ComputeContentKey("m", drop_black, B("xyz")), ComputeContentKey("m", drop, B("xyz")));
}

}  // namespace
}  // namespace epd

namespace epd {
namespace {

std::span<const std::uint8_t> AsSpan(const std::string& s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

TEST(VideoKeyTest, EverySamplingFieldChangesTheKey) {
  const PreprocessConfig cfg;
  const std::string mp4 = "not really an mp4";
  const std::vector<std::span<const std::uint8_t>> parts = {AsSpan(mp4)};
  std::set<std::string> keys;
  auto add = [&](const VideoSampling& s) { keys.insert(ComputeVideoKey("m", cfg, s, parts, false).Hex()); };
  VideoSampling s;
  add(s);
  s = {};
  s.fps = 1.0;
  add(s);
  s = {};
  s.nframes = 8;
  add(s);
  s = {};
  s.min_frames = 2;
  add(s);
  s = {};
  s.max_frames = 100;
  add(s);
  s = {};
  s.min_pixels = 1000;
  add(s);
  s = {};
  s.max_pixels = 200000;
  add(s);
  s = {};
  s.total_pixels = 1000000;
  add(s);
  s = {};
  s.resized_height = 224;
  s.resized_width = 224;
  add(s);
  s = {};
  s.apply_rotation = false;
  add(s);
  EXPECT_EQ(keys.size(), 10u);
}

TEST(VideoKeyTest, ContainerFrameListAndImageKeysOfTheSameBytesDiffer) {
  const PreprocessConfig cfg;
  const std::string bytes = "same bytes";
  const std::vector<std::span<const std::uint8_t>> one = {AsSpan(bytes)};
  const ContentKey container = ComputeVideoKey("m", cfg, {}, one, false);
  const ContentKey frames = ComputeVideoKey("m", cfg, {}, one, true);
  const ContentKey image = ComputeContentKey("m", cfg, AsSpan(bytes));
  EXPECT_NE(container, frames);
  EXPECT_NE(container, image);
  EXPECT_NE(frames, image);
  // Frame boundaries are part of the key: ("ab", "c") is not ("a", "bc").
  const std::string a = "ab", b = "c", c = "a", d = "bc";
  const std::vector<std::span<const std::uint8_t>> split1 = {AsSpan(a), AsSpan(b)};
  const std::vector<std::span<const std::uint8_t>> split2 = {AsSpan(c), AsSpan(d)};
  EXPECT_NE(ComputeVideoKey("m", cfg, {}, split1, true), ComputeVideoKey("m", cfg, {}, split2, true));
}

TEST(VideoKeyTest, ChunkKeyIsThePixelsSizeAndOrderOfItsFrames) {
  const PreprocessConfig cfg;
  auto frame = [](int w, int h, std::uint8_t v) {
    return RgbImage{w, h, std::vector<std::uint8_t>(static_cast<std::size_t>(w) * h * 3, v)};
  };
  const std::vector<RgbImage> ab = {frame(4, 2, 1), frame(4, 2, 2)};
  const std::vector<RgbImage> ba = {frame(4, 2, 2), frame(4, 2, 1)};
  const std::vector<RgbImage> tall = {frame(2, 4, 1), frame(2, 4, 2)};
  StatusOr<ContentKey> k1 = ComputeVideoChunkKey("m", cfg, ab);
  StatusOr<ContentKey> k2 = ComputeVideoChunkKey("m", cfg, ab);
  ASSERT_TRUE(k1.ok() && k2.ok());
  EXPECT_EQ(*k1, *k2);
  EXPECT_NE(*k1, *ComputeVideoChunkKey("m", cfg, ba));
  EXPECT_NE(*k1, *ComputeVideoChunkKey("m", cfg, tall));
  EXPECT_NE(*k1, *ComputeVideoChunkKey("other", cfg, ab));
  const std::vector<RgbImage> mixed = {frame(4, 2, 1), frame(2, 4, 1)};
  EXPECT_EQ(ComputeVideoChunkKey("m", cfg, mixed).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ComputeVideoChunkKey("m", cfg, {}).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace epd
