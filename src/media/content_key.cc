// Content keys: a digest over a tagged, length-prefixed encoding.
//
// Encoding (version 2), every field written as
//   tag (1 byte) || length (uint64 little-endian) || value (length bytes)
// in this fixed order:
//   0x00 domain   ASCII: "epd/key/encoded" | "epd/key/raw-pixels" | "epd/key/caller"
//   0x01 version  uint32 LE, kContentKeyVersion
//   0x02 model id raw bytes
//   0x10..0x14    patch_size, merge_size, temporal_patch_size, min_pixels,
//                 max_pixels: int64 LE each
//   0x15, 0x16    mean, std: 3 x uint32 LE, the IEEE-754 bit patterns
//   0x17          resample: int64 LE of the enum value
//   0x18          decode.apply_exif_orientation: int64 LE, 0 or 1 (v2)
//   0x19          decode.alpha: 4 bytes: composite (0 or 1), then the
//                 background R, G, B (all 0 when composite is 0) (v2)
//   0x1a          jpeg_dct_scaling: int64 LE 1, written only when on (so
//                 every key made with it off is unchanged)
//   raw pixels only: 0x20 width, 0x21 height, 0x22 channels (int64 LE)
//   payload: 0x30 encoded media | 0x31 raw pixels | 0x32 caller key
// Video keys (same version) add, after the header:
//   "epd/key/video":        0x40..0x48 the VideoSampling fields (fps as the
//                           IEEE-754 bits of the double; absent optionals as
//                           -1), then for a container 0x49 apply_rotation
//                           (int64 LE, 0 or 1) and 0x33 the container bytes,
//                           or for a frame list 0x34 once per frame image
//                           (each length-prefixed, in order)
//   "epd/key/video-chunk":  0x20 width, 0x21 height, 0x23 frame count, then
//                           0x35 once per frame's RGB8 pixels, in order
// Because every value carries its length, the encoding is injective: two
// different (domain, fields...) tuples never produce the same byte string, so
// distinct inputs can collide only through the hash itself. Floats are hashed
// by bit pattern rather than by a decimal rendering, which could round two
// different configs to one string.
#include "epd/media/content_key.h"

#include <bit>
#include <cstring>
#include <memory>
#include <string>

#include "digest.h"
#include "epd/media/image.h"
#include "epd/media/preprocess.h"
#include "epd/media/video.h"

namespace epd {
namespace {

enum Tag : std::uint8_t {
  kTagDomain = 0x00,
  kTagVersion = 0x01,
  kTagModel = 0x02,
  kTagPatch = 0x10,
  kTagMerge = 0x11,
  kTagTemporal = 0x12,
  kTagMinPixels = 0x13,
  kTagMaxPixels = 0x14,
  kTagMean = 0x15,
  kTagStd = 0x16,
  kTagResample = 0x17,
  kTagExifOrientation = 0x18,
  kTagAlpha = 0x19,
  kTagDctScaling = 0x1a,
  kTagWidth = 0x20,
  kTagHeight = 0x21,
  kTagChannels = 0x22,
  kTagEncodedMedia = 0x30,
  kTagRawPixels = 0x31,
  kTagCallerKey = 0x32,
  kTagVideoContainer = 0x33,
  kTagVideoFrameImage = 0x34,
  kTagChunkFramePixels = 0x35,
  kTagFrames = 0x23,
  kTagSampleFps = 0x40,
  kTagSampleNframes = 0x41,
  kTagSampleMinFrames = 0x42,
  kTagSampleMaxFrames = 0x43,
  kTagSampleMinPixels = 0x44,
  kTagSampleMaxPixels = 0x45,
  kTagSampleTotalPixels = 0x46,
  kTagSampleResizedHeight = 0x47,
  kTagSampleResizedWidth = 0x48,
  kTagSampleRotation = 0x49,
};

constexpr std::string_view kDomainEncoded = "epd/key/encoded";
constexpr std::string_view kDomainRawPixels = "epd/key/raw-pixels";
constexpr std::string_view kDomainCaller = "epd/key/caller";
constexpr std::string_view kDomainVideo = "epd/key/video";
constexpr std::string_view kDomainVideoChunk = "epd/key/video-chunk";

void PutLe(std::uint64_t v, int n, std::uint8_t* out) {
  for (int i = 0; i < n; ++i) out[i] = static_cast<std::uint8_t>(v >> (8 * i));
}

class KeyEncoder {
 public:
  explicit KeyEncoder(std::unique_ptr<internal::Digest> digest) : digest_(std::move(digest)) {}

  void Bytes(Tag tag, std::span<const std::uint8_t> value) {
    std::uint8_t head[9];
    head[0] = tag;
    PutLe(value.size(), 8, head + 1);
    digest_->Update(head);
    digest_->Update(value);
  }
  void Text(Tag tag, std::string_view s) { Bytes(tag, {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()}); }
  void Int(Tag tag, std::int64_t v) {
    std::uint8_t buf[8];
    PutLe(static_cast<std::uint64_t>(v), 8, buf);
    Bytes(tag, buf);
  }
  void Floats(Tag tag, const std::array<float, 3>& v) {
    std::uint8_t buf[12];
    for (std::size_t i = 0; i < 3; ++i) PutLe(std::bit_cast<std::uint32_t>(v[i]), 4, buf + 4 * i);
    Bytes(tag, buf);
  }

  // The fields every kind of key starts with.
  void Header(std::string_view domain, std::string_view model_id, const PreprocessConfig& cfg) {
    Text(kTagDomain, domain);
    std::uint8_t version[4];
    PutLe(kContentKeyVersion, 4, version);
    Bytes(kTagVersion, version);
    Text(kTagModel, model_id);
    Int(kTagPatch, cfg.patch_size);
    Int(kTagMerge, cfg.merge_size);
    Int(kTagTemporal, cfg.temporal_patch_size);
    Int(kTagMinPixels, cfg.min_pixels);
    Int(kTagMaxPixels, cfg.max_pixels);
    Floats(kTagMean, cfg.mean);
    Floats(kTagStd, cfg.std);
    Int(kTagResample, static_cast<std::int64_t>(cfg.resample));
    Int(kTagExifOrientation, cfg.decode.apply_exif_orientation ? 1 : 0);
    // The background only matters when compositing: "none" has one key
    // whatever colour a caller left in the struct.
    const AlphaPolicy& alpha = cfg.decode.alpha;
    const std::uint8_t alpha_bytes[4] = {alpha.composite ? std::uint8_t{1} : std::uint8_t{0},
                                         alpha.composite ? alpha.background[0] : std::uint8_t{0},
                                         alpha.composite ? alpha.background[1] : std::uint8_t{0},
                                         alpha.composite ? alpha.background[2] : std::uint8_t{0}};
    Bytes(kTagAlpha, alpha_bytes);
    if (cfg.jpeg_dct_scaling) Int(kTagDctScaling, 1);
  }

  ContentKey Finish(KeyMode mode) {
    ContentKey key;
    key.bytes = digest_->Final();
    if (mode == KeyMode::kXxh3Fast) {
      std::memcpy(key.bytes.data() + 16, kFastKeyMarker.data(), kFastKeyMarker.size());
    }
    return key;
  }

 private:
  std::unique_ptr<internal::Digest> digest_;
};

std::unique_ptr<internal::Digest> NewDigest(KeyMode mode) {
  return mode == KeyMode::kXxh3Fast ? internal::NewXxh3_128() : internal::NewSha256();
}

}  // namespace

ContentKey ComputeContentKey(std::string_view model_id, const PreprocessConfig& cfg,
                             std::span<const std::uint8_t> media, KeyMode mode) {
  KeyEncoder enc(NewDigest(mode));
  enc.Header(kDomainEncoded, model_id, cfg);
  enc.Bytes(kTagEncodedMedia, media);
  return enc.Finish(mode);
}

StatusOr<ContentKey> ComputeRawPixelKey(std::string_view model_id, const PreprocessConfig& cfg, std::int64_t width,
                                        std::int64_t height, int channels, std::span<const std::uint8_t> pixels,
                                        KeyMode mode) {
  if (width < 1 || height < 1) {
    return InvalidArgument("raw pixel key: image size " + std::to_string(width) + "x" + std::to_string(height) +
                           " is not positive");
  }
  if (channels < 1 || channels > 4) {
    return InvalidArgument("raw pixel key: channels is " + std::to_string(channels) + ", expected 1 to 4");
  }
  // width, height >= 1 and channels <= 4: the division cannot overflow and
  // compares without forming a possibly-overflowing product.
  const std::uint64_t row = static_cast<std::uint64_t>(width) * static_cast<std::uint64_t>(channels);
  if (pixels.size() % row != 0 || pixels.size() / row != static_cast<std::uint64_t>(height)) {
    return InvalidArgument("raw pixel key: " + std::to_string(pixels.size()) + " pixel bytes do not match " +
                           std::to_string(width) + "x" + std::to_string(height) + "x" + std::to_string(channels));
  }
  KeyEncoder enc(NewDigest(mode));
  enc.Header(kDomainRawPixels, model_id, cfg);
  enc.Int(kTagWidth, width);
  enc.Int(kTagHeight, height);
  enc.Int(kTagChannels, channels);
  enc.Bytes(kTagRawPixels, pixels);
  return enc.Finish(mode);
}

StatusOr<ContentKey> CallerContentKey(std::string_view model_id, const PreprocessConfig& cfg,
                                      std::string_view caller_key) {
  if (caller_key.empty()) return InvalidArgument("caller content key is empty");
  KeyEncoder enc(NewDigest(KeyMode::kSha256));
  enc.Header(kDomainCaller, model_id, cfg);
  enc.Text(kTagCallerKey, caller_key);
  return enc.Finish(KeyMode::kSha256);
}

ContentKey ComputeVideoKey(std::string_view model_id, const PreprocessConfig& cfg, const VideoSampling& sampling,
                           std::span<const std::span<const std::uint8_t>> parts, bool frame_list, KeyMode mode) {
  KeyEncoder enc(NewDigest(mode));
  enc.Header(kDomainVideo, model_id, cfg);
  enc.Int(kTagSampleFps, static_cast<std::int64_t>(std::bit_cast<std::uint64_t>(sampling.fps)));
  enc.Int(kTagSampleNframes, sampling.nframes.value_or(-1));
  enc.Int(kTagSampleMinFrames, sampling.min_frames);
  enc.Int(kTagSampleMaxFrames, sampling.max_frames);
  enc.Int(kTagSampleMinPixels, sampling.min_pixels);
  enc.Int(kTagSampleMaxPixels, sampling.max_pixels);
  enc.Int(kTagSampleTotalPixels, sampling.total_pixels);
  enc.Int(kTagSampleResizedHeight, sampling.resized_height.value_or(-1));
  enc.Int(kTagSampleResizedWidth, sampling.resized_width.value_or(-1));
  // Only a container has a display matrix; a frame list's key is unchanged.
  if (!frame_list) enc.Int(kTagSampleRotation, sampling.apply_rotation ? 1 : 0);
  for (std::span<const std::uint8_t> part : parts) {
    enc.Bytes(frame_list ? kTagVideoFrameImage : kTagVideoContainer, part);
  }
  return enc.Finish(mode);
}

StatusOr<ContentKey> ComputeVideoChunkKey(std::string_view model_id, const PreprocessConfig& cfg,
                                          std::span<const RgbImage> frames, KeyMode mode) {
  if (frames.empty()) return InvalidArgument("video chunk key: no frames");
  const RgbImage& first = frames.front();
  if (first.width < 1 || first.height < 1) {
    return InvalidArgument("video chunk key: frame size " + std::to_string(first.width) + "x" +
                           std::to_string(first.height) + " is not positive");
  }
  const std::size_t bytes = static_cast<std::size_t>(first.width) * static_cast<std::size_t>(first.height) * 3;
  for (std::size_t i = 0; i < frames.size(); ++i) {
    const RgbImage& f = frames[i];
    if (f.width != first.width || f.height != first.height || f.pixels.size() != bytes) {
      return InvalidArgument("video chunk key: frame " + std::to_string(i) + " is " + std::to_string(f.width) + "x" +
                             std::to_string(f.height) + " with " + std::to_string(f.pixels.size()) +
                             " bytes, expected " + std::to_string(first.width) + "x" + std::to_string(first.height) +
                             " RGB8");
    }
  }
  KeyEncoder enc(NewDigest(mode));
  enc.Header(kDomainVideoChunk, model_id, cfg);
  enc.Int(kTagWidth, first.width);
  enc.Int(kTagHeight, first.height);
  enc.Int(kTagFrames, static_cast<std::int64_t>(frames.size()));
  for (const RgbImage& f : frames) enc.Bytes(kTagChunkFramePixels, f.pixels);
  return enc.Finish(mode);
}

bool IsFastContentKey(const ContentKey& key) {
  return std::memcmp(key.bytes.data() + 16, kFastKeyMarker.data(), kFastKeyMarker.size()) == 0;
}

}  // namespace epd
