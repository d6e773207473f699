// epd/media/preprocess.h: Qwen2-VL image preprocessing: dynamic-resolution resize,
// normalisation and patchification into the rows a Qwen2-VL vision tower eats.
//
// Unlike a fixed-size ViT pipeline (resize everything to 224x224), Qwen2-VL
// keeps roughly the native resolution: each side is rounded to a multiple of
// factor = patch_size * merge_size = 28, and the area is scaled into
// [min_pixels, max_pixels]. The token count therefore depends on the image,
// and GridForImage() tells it from the header alone (ProbeImage + GridForImage)
// without decoding, which the scheduler uses to budget batches.
//
// Pipeline (Preprocess):
//   1. SmartResize(h, w) -> (H, W), both multiples of 28.
//   2. Resize RGB8 to W x H exactly as PIL's Image.resize(BICUBIC) does,
//      which the Hugging Face processor uses: Pillow's ImagingResample
//      (antialiased Catmull-Rom, a = -0.5, support widened by the scale when
//      downscaling, weights normalised over the taps inside the image,
//      22-bit fixed point; horizontal pass rounded to uint8 before the
//      vertical pass; an unchanged axis skipped), reimplemented with SIMD
//      (src/media/resample.h). The output equals Pillow 9.4's byte for byte.
//   3. x / 255, then (x - mean[c]) / std[c], float32.
//   4. The still image is repeated to temporal_patch_size frames and
//      patchified (see Preprocess below for the exact row layout).
// Steps 3 and 4 run on each band of merge_size * patch_size resized rows as
// the resize makes it, so no full-size float image exists; the resize's scratch is
// per thread and reused, so PreprocessInto allocates nothing once a thread
// has seen an image of the size (its scratch, up to 64 MiB, stays with the
// thread; above that it is freed after each image).
//
// Sources: transformers/models/qwen2_vl/image_processing_qwen2_vl.py
// (smart_resize, _preprocess) and the Qwen2-VL report (arXiv:2409.12191,
// section 2.1). mean/std are OpenAI CLIP's (OPENAI_CLIP_MEAN / OPENAI_CLIP_STD
// in transformers/utils/constants.py), the Qwen2-VL processor defaults.
//
// Complexity: O((h * W + H * W) * taps) for the resize, taps at most
// 2 * ceil(2 * max(1, h / H)) + 1 (bicubic); O(H * W) to normalise and patchify;
// SmartResize and GridForImage are O(1).
// Thread safety: all functions are thread-safe (pure functions of their
// arguments; the resize scratch is thread_local); PreprocessConfig is a
// value type.
//
// Example:
//   epd::PreprocessConfig cfg;                       // Qwen2-VL defaults
//   auto grid = epd::GridForImage(427, 640, cfg);    // {1, 30, 46}: 345 tokens
//   auto info = epd::ProbeImage(jpeg_bytes);         // header only
//   auto tokens = epd::GridForImage(*info, cfg);     // EXIF orientation included
//   auto pre = epd::DecodeAndPreprocess(jpeg_bytes, cfg);
//   if (!pre.ok()) return pre.status();
//   tower.Encode({{pre->patches.data(), pre->grid}});
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "epd/core/grid.h"
#include "epd/core/status.h"
#include "epd/media/image.h"

namespace epd {

// Resampling filter for step 2. Values are part of the content key: never
// renumber.
enum class Resample : std::uint8_t {
  kBicubic = 0,   // Catmull-Rom, a = -0.5 (PIL BICUBIC). Qwen2-VL's choice.
  kBilinear = 1,  // triangle filter (PIL BILINEAR).
};

struct PreprocessConfig {
  // Side of a square ViT patch, pixels. Qwen2-VL: 14.
  int patch_size = 14;
  // The merger folds merge_size x merge_size patches into one token. Qwen2-VL: 2.
  int merge_size = 2;
  // Frames per temporal patch; a still image is repeated to fill it. Qwen2-VL: 2.
  int temporal_patch_size = 2;
  // Target area bounds, pixels (after resize). Qwen2-VL: 56*56 and 28*28*1280.
  std::int64_t min_pixels = 3136;
  std::int64_t max_pixels = 1003520;
  // Per-channel (R, G, B) normalisation applied to x / 255. OpenAI CLIP values.
  std::array<float, 3> mean{0.48145466f, 0.4578275f, 0.40821073f};
  std::array<float, 3> std{0.26862954f, 0.26130258f, 0.27577711f};
  Resample resample = Resample::kBicubic;
  // DecodeAndPreprocess only: when on, a JPEG shown as stored whose resized
  // size is at most half its own on both axes is decoded by libjpeg-turbo's
  // DCT-domain scaling (1/2, 1/4 or 1/8: the smallest still at least the
  // resized size) and then resampled. Faster (1.62x at 2048x2048 ->
  // 980x980 in docs/BENCHMARKS.md), but not Pillow's pixels: docs/KEYS_AND_PREPROCESSING.md gives
  // the measured difference, which exceeds issue 42's parity bound, hence
  // off by default. Part of the content key when on.
  bool jpeg_dct_scaling = false;
  // How the encoded bytes become RGB before step 1: EXIF orientation and the
  // alpha policy (epd/media/image.h). Part of the content key, like every field
  // here. Defaults: orientation applied, RGBA composited on white (vLLM's
  // defaults).
  DecodeOptions decode;

  // patch_size * merge_size: both resized sides are multiples of it (28).
  std::int64_t factor() const { return std::int64_t{patch_size} * merge_size; }
  // Floats per patch row: 3 * temporal_patch_size * patch_size^2 (1176).
  std::int64_t patch_dim() const { return std::int64_t{3} * temporal_patch_size * patch_size * patch_size; }

  // kInvalidArgument naming the field unless: 1 <= patch_size <= 1024,
  // 1 <= merge_size <= 64, 1 <= temporal_patch_size <= 64,
  // 1 <= min_pixels <= max_pixels, factor()^2 <= max_pixels <= 2^40,
  // mean finite, std finite and > 0, resample a known value.
  Status Validate() const;
};

// A resized size in pixels; both are multiples of cfg.factor().
struct ResizedSize {
  std::int64_t height = 0;
  std::int64_t width = 0;
  friend bool operator==(const ResizedSize&, const ResizedSize&) = default;
};

// Qwen2-VL's smart_resize, with f = cfg.factor():
//   h' = max(f, round_half_even(h / f) * f), w' likewise;
//   if h' * w' > max_pixels: beta = sqrt(h * w / max_pixels),
//       h' = max(f, floor(h / beta / f) * f), w' likewise;
//   elif h' * w' < min_pixels: beta = sqrt(min_pixels / (h * w)),
//       h' = ceil(h * beta / f) * f, w' likewise.
// Arithmetic is IEEE double, as in the Python original, so results match it
// exactly. Examples (default config): 512x512 -> 504x504, 427x640 -> 420x644,
// 46x70 -> 56x56 (70 / 28 = 2.5 rounds to even 2).
// Errors (kInvalidArgument): height or width < 1 or > 2^31 - 1; aspect ratio
// max/min > 200 (Qwen2-VL's limit); invalid cfg.
StatusOr<ResizedSize> SmartResize(std::int64_t height, std::int64_t width, const PreprocessConfig& cfg);

// The grid a height x width image will have: {1, H' / patch, W' / patch} with
// (H', W') = SmartResize(height, width). Same errors as SmartResize. Cheap:
// with ProbeImage it gives the token count without decoding.
StatusOr<GridTHW> GridForImage(std::int64_t height, std::int64_t width, const PreprocessConfig& cfg);

// The grid of a probed image: GridForImage on its displayed size, i.e. with
// height and width swapped for EXIF orientations 5-8 when
// cfg.decode.apply_exif_orientation is set. Use this one with ProbeImage, so
// the header-only token count equals what DecodeAndPreprocess produces.
StatusOr<GridTHW> GridForImage(const ImageInfo& info, const PreprocessConfig& cfg);

// What an encoded image's header gives without decoding: its format and size
// (ImageInfo) and the grid it will have.
struct ProbedGrid {
  ImageInfo info;
  GridTHW grid;
};

// The header grid, the one function that turns an encoded image's header
// into its grid (and so its post-merge tokens: grid.tokens(cfg.merge_size)):
// ProbeImage, then CheckDecodeLimits, then GridForImage(info, cfg) (EXIF
// orientation included). So a header that
// probes fine here decodes under the same limits. Errors (kInvalidArgument):
// ProbeImage's (unknown format, zero size, truncated header), too many
// pixels, GridForImage's. Cost: a header parse, O(1) in the pixel count.
StatusOr<ProbedGrid> ProbeGrid(std::span<const std::uint8_t> bytes, const PreprocessConfig& cfg,
                               const DecodeLimits& limits = {});

// Resamples `src` to width x height with `filter` (see step 2 above; BILINEAR
// is Pillow's BILINEAR likewise). Errors (kInvalidArgument): src malformed
// (non-positive size or pixels.size() != width * height * 3), target size
// < 1, unknown filter. Returns a copy when sizes match.
StatusOr<RgbImage> ResizeRgb(const RgbImage& src, int width, int height, Resample filter);

// Preprocess output. Owns its floats.
struct PreprocessedImage {
  GridTHW grid;                 // {1, H/patch, W/patch}
  std::int64_t merge_size = 2;  // copied from the config, for tokens()
  std::int64_t patch_dim = 0;   // 3 * temporal * patch^2 (1176)
  // [grid.patches(), patch_dim] float32, row-major (layout: see Preprocess).
  std::vector<float> patches;

  // Post-merge tokens the tower will emit: grid.patches() / merge_size^2.
  std::int64_t tokens() const { return grid.tokens(merge_size); }
};

// Runs steps 1-4 on a decoded image. Row layout, identical to the Qwen2-VL
// image processor (so an exported Qwen2-VL tower accepts the rows): with
// T = temporal_patch_size, P = patch_size, m = merge_size, gh = H/P, gw = W/P,
// the normalised frames [T, 3, H, W] (all T equal) are viewed as
//   [1, T, 3, gh/m, m, P, gw/m, m, P],
// transposed to (0, 3, 6, 4, 7, 2, 1, 5, 8), i.e.
//   [1, gh/m, gw/m, m, m, 3, T, P, P],
// and flattened to [gh * gw, 3 * T * P * P]. So consecutive rows walk the
// m x m patches of one merge block before moving to the next block, blocks
// in raster order; within a row the order is channel, frame, y, x.
// Errors (kInvalidArgument): malformed image, invalid cfg, SmartResize errors.
StatusOr<PreprocessedImage> Preprocess(const RgbImage& image, const PreprocessConfig& cfg);

// Preprocess into caller-owned memory: `rows` must hold exactly
// GridForImage(image.height, image.width, cfg)->patches() * cfg.patch_dim()
// floats, written in Preprocess's layout. Allocates nothing once this thread
// has preprocessed an image of the same sizes (the scratch is reused).
// Errors (kInvalidArgument): Preprocess's, and a wrong rows.size() (the
// message gives the size needed).
Status PreprocessInto(const RgbImage& image, const PreprocessConfig& cfg, std::span<float> rows);

// DecodeImage(bytes, limits, cfg.decode) then Preprocess(image, cfg), with
// the same result and errors as both. A three-channel JPEG shown as stored
// (EXIF orientation 1, or not applied) decodes into a per-thread buffer
// instead of a new RgbImage; its result vector is the one allocation per
// image of ours (libjpeg-turbo still mallocs its own working memory).
StatusOr<PreprocessedImage> DecodeAndPreprocess(std::span<const std::uint8_t> bytes, const PreprocessConfig& cfg,
                                                const DecodeLimits& limits = {});

}  // namespace epd
