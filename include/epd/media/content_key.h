// epd/media/content_key.h: the functions that derive the 256-bit content key under
// which an image's embedding is cached. The key itself (ContentKey, its hash
// and hex form) is a core value type: epd/core/content_key_type.h.
//
// A key is a SHA-256 digest (OpenSSL libcrypto) over a domain-separated,
// length-prefixed encoding of: the key-format version, the model id, every
// preprocessing field that changes the embedding, and the media's encoded
// bytes. It is computed before decoding, so a cache hit skips decode and
// preprocessing entirely. The full 32 bytes are kept: truncating to 64 bits
// would make a collision (one image served another's embedding) likely at
// about 2^32 images (birthday bound), which a fleet reaches.
//
// Three namespaces for images (and two for videos: ComputeVideoKey,
// ComputeVideoChunkKey below), each with its own domain tag, so a key of one kind can
// never equal a key of another (short of a SHA-256 collision):
//   ComputeContentKey   encoded media bytes (JPEG, PNG, WebP, GIF, BMP as sent);
//   ComputeRawPixelKey  raw pixels, with width/height/channels in the key so
//                       30x150 and 150x30 with the same bytes differ;
//   CallerContentKey    a key the caller already has (e.g. a gateway's hash).
// Every field is written as tag (1 byte) || length (8 bytes LE) || value, so
// field boundaries are unambiguous: (model "AB", media "C") and (model "A",
// media "BC") hash different byte strings. The exact encoding and its version
// are in docs/KEYS_AND_PREPROCESSING.md; any change to it bumps
// kContentKeyVersion, which invalidates (misses) every old key rather than
// aliasing it.
//
// KeyMode::kXxh3Fast replaces SHA-256 by XXH3-128 (libxxhash) over the same
// encoding: several times faster, but XXH3 is NOT collision resistant against
// an adversary, who can craft two images with one key and so serve one
// tenant's embedding for another's image. Use it only for trusted,
// single-tenant deployments. A fast key holds the 16-byte XXH3 digest in
// bytes[0..16) and the fixed marker kFastKeyMarker in bytes[16..32), so
// IsFastContentKey() can tell them apart; a SHA-256 key has that suffix with
// probability 2^-128.
//
// Cost: one pass over the media bytes (SHA-256 via OpenSSL EVP, about
// 1-2 GB/s with SHA-NI), no allocation beyond the digest context.
//
// Thread safety: value type; the functions are thread-safe.
//
// Example:
//   epd::PreprocessConfig cfg;
//   epd::ContentKey k = epd::ComputeContentKey("qwen2-vl-7b", cfg, jpeg_bytes);
//   if (std::optional<epd::EmbeddingPtr> hit = cache.Get(k)) return *hit;
//   std::string name = k.Hex();     // 64 lower-case hex digits
//
// The Compute* functions are defined in the epd::media library.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <string_view>

#include "epd/core/content_key_type.h"
#include "epd/core/status.h"

namespace epd {

struct PreprocessConfig;  // epd/media/preprocess.h
struct RgbImage;          // epd/media/image.h
struct VideoSampling;     // epd/media/video.h

// Version of the byte encoding hashed into every key. Bump on any change.
// 2: the model id of a Hugging Face checkpoint is derived from its vision
// tensors (epd/model/checkpoint.h), no longer from a file name, and the decode
// options (EXIF orientation, alpha policy) are hashed as tags 0x18 and 0x19.
inline constexpr std::uint32_t kContentKeyVersion = 2;

enum class KeyMode : std::uint8_t {
  kSha256 = 0,    // default; collision resistant
  kXxh3Fast = 1,  // XXH3-128; trusted single-tenant use only (see above)
};

// "sha256" or "xxh3-fast": the mode as Health reports it and clients read it.
inline std::string_view KeyModeName(KeyMode mode) { return mode == KeyMode::kXxh3Fast ? "xxh3-fast" : "sha256"; }

// The mode KeyModeName(mode) names; kInvalidArgument naming the text otherwise.
inline StatusOr<KeyMode> ParseKeyMode(std::string_view text) {
  if (text == "sha256") return KeyMode::kSha256;
  if (text == "xxh3-fast") return KeyMode::kXxh3Fast;
  return InvalidArgument("key mode must be 'sha256' or 'xxh3-fast', got '" + std::string(text) + "'");
}

// bytes[16..32) of every KeyMode::kXxh3Fast key: "epd:xxh3-128:v1" and a NUL.
inline constexpr std::array<std::uint8_t, 16> kFastKeyMarker = {'e', 'p', 'd', ':', 'x', 'x', 'h', '3',
                                                                '-', '1', '2', '8', ':', 'v', '1', 0};

// Key of encoded media (the bytes as received, before decoding) for
// `model_id` preprocessed with `cfg` (every field of cfg is hashed; cfg need
// not be valid). Any byte string, including an empty one, has a key.
// Throws epd::Error(kInternal) only if libcrypto itself fails (out of memory).
ContentKey ComputeContentKey(std::string_view model_id, const PreprocessConfig& cfg,
                             std::span<const std::uint8_t> media, KeyMode mode = KeyMode::kSha256);

// Key of raw interleaved pixels, `channels` uint8 per pixel, row-major.
// Errors (kInvalidArgument): width, height or channels < 1, channels > 4, or
// pixels.size() != width * height * channels.
StatusOr<ContentKey> ComputeRawPixelKey(std::string_view model_id, const PreprocessConfig& cfg, std::int64_t width,
                                        std::int64_t height, int channels, std::span<const std::uint8_t> pixels,
                                        KeyMode mode = KeyMode::kSha256);

// Key for a caller-supplied content identifier (opaque bytes, e.g. a
// gateway's hash of the media), hashed in its own namespace with the model id
// and cfg, so it never equals a computed key and a config change still misses.
// Always SHA-256. The caller vouches that equal caller keys mean equal media.
// Errors (kInvalidArgument): caller_key empty (every request without a key
// would otherwise share one cache entry).
StatusOr<ContentKey> CallerContentKey(std::string_view model_id, const PreprocessConfig& cfg,
                                      std::string_view caller_key);

// Key of a whole video as received (domain "epd/key/video"): the model id,
// cfg, every VideoSampling field, and either the container bytes with
// apply_rotation (one part, frame_list false) or the encoded frame images in
// order (frame_list true; apply_rotation is not used, nor hashed).
// Computed before decoding, so an exact repeat of a video with the same
// sampling costs one lookup and no decode. Cost: one pass over the bytes.
ContentKey ComputeVideoKey(std::string_view model_id, const PreprocessConfig& cfg, const VideoSampling& sampling,
                           std::span<const std::span<const std::uint8_t>> parts, bool frame_list,
                           KeyMode mode = KeyMode::kSha256);

// Key of one temporal chunk of a video (domain "epd/key/video-chunk"): the
// RGB8 pixels of its temporal_patch_size sampled frames after resize, their
// size and count, with the model id and cfg. Two videos (or two clips of one
// video) whose chunks have the same resized pixels share the chunk's entry,
// whatever the container, timestamps or sampling that produced them.
// Errors (kInvalidArgument): no frames, a frame of size < 1, frames of
// different sizes or with a pixel buffer that is not width * height * 3.
StatusOr<ContentKey> ComputeVideoChunkKey(std::string_view model_id, const PreprocessConfig& cfg,
                                          std::span<const RgbImage> frames, KeyMode mode = KeyMode::kSha256);

// True when `key` carries kFastKeyMarker, i.e. came from KeyMode::kXxh3Fast.
bool IsFastContentKey(const ContentKey& key);

}  // namespace epd
