// Qwen2-VL preprocessing: smart resize, resample, normalise, patchify.
//
// SmartResize reproduces the Python reference operation for operation in
// IEEE double (Python floats are doubles), including round()'s half-to-even,
// so the token count a client computes with the Hugging Face processor equals
// ours. Exactness matters beyond numerics: the LLM side reserves one
// placeholder per token, so an off-by-one grid breaks the request.
//
// PreprocessInto resamples with Pillow's arithmetic (resample.h) and hands
// each band of patch_size output rows, still in cache, to the PatchWriter,
// which normalises it straight into patch rows: no full-size float image,
// and the scratch (the resampler's) is this thread's, reused from image to
// image. Preprocess is PreprocessInto on a vector it allocates (grown by
// copies of finished rows, never zero-filled). DecodeAndPreprocess decodes
// a JPEG shown as stored into a per-thread buffer too.
#include "epd/media/preprocess.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "image_internal.h"
#include "patchify.h"
#include "resample.h"

namespace epd {
namespace {

constexpr std::int64_t kMaxSide = std::numeric_limits<std::int32_t>::max();
// Qwen2-VL's MAX_RATIO.
constexpr std::int64_t kMaxAspectRatio = 200;

std::string Dims(std::int64_t h, std::int64_t w) { return std::to_string(h) + "x" + std::to_string(w); }

Status CheckImage(const RgbImage& img) {
  if (img.width < 1 || img.height < 1) {
    return InvalidArgument("image size " + std::to_string(img.width) + "x" + std::to_string(img.height) +
                           " (WxH) is not positive");
  }
  const std::size_t want = static_cast<std::size_t>(img.width) * static_cast<std::size_t>(img.height) * 3;
  if (img.pixels.size() != want) {
    return InvalidArgument("image has " + std::to_string(img.pixels.size()) + " pixel bytes, expected " +
                           std::to_string(want) + " for " + std::to_string(img.width) + "x" +
                           std::to_string(img.height) + " RGB8");
  }
  return Status::Ok();
}

// Copies each band into an RgbImage (ResizeRgb's output).
class ImageSink final : public internal::BandSink {
 public:
  explicit ImageSink(RgbImage& out) : out_(out) {}
  void Band(const std::uint8_t* rows, std::size_t stride, int y0, int n) override {
    const std::size_t len = std::size_t{3} * static_cast<std::size_t>(out_.width);
    for (int y = 0; y < n; ++y) {
      std::memcpy(out_.pixels.data() + static_cast<std::size_t>(y0 + y) * len,
                  rows + static_cast<std::size_t>(y) * stride, len);
    }
  }

 private:
  RgbImage& out_;
};

// Feeds each band of merge_size * patch_size rows (one merge-block row of
// patches) to a PatchWriter, a still image's one band standing for every
// temporal frame. Writes into `rows` (all the image's), or, with `append`,
// into `chunk` and then onto the end of *append: Preprocess's vector grows
// by copies of finished rows and is never zero-filled first.
class PatchSink final : public internal::BandSink {
 public:
  PatchSink(const PreprocessConfig& cfg, int width, float* rows, std::vector<float>* append, std::vector<float>* chunk)
      : writer_(cfg, width),
        patch_(cfg.patch_size),
        temporal_(cfg.temporal_patch_size),
        rows_(rows),
        append_(append),
        chunk_(chunk) {
    if (append_ != nullptr) chunk_->resize(writer_.RowsPerBlockRow() * static_cast<std::size_t>(cfg.patch_dim()));
  }
  void Band(const std::uint8_t* rows, std::size_t stride, int y0, int n) override {
    const std::uint8_t* frames[64];  // temporal_patch_size <= 64 (Validate)
    for (int y = y0; y < y0 + n; y += patch_) {
      for (int t = 0; t < temporal_; ++t) frames[t] = rows + static_cast<std::size_t>(y - y0) * stride;
      if (append_ == nullptr) {
        writer_.Band(frames, stride, y, rows_, 0);
      } else {
        writer_.Band(frames, stride, y, chunk_->data(), writer_.RowsBefore(y0));
      }
    }
    if (append_ != nullptr) append_->insert(append_->end(), chunk_->begin(), chunk_->end());
  }

 private:
  internal::PatchWriter writer_;
  int patch_, temporal_;
  float* rows_;
  std::vector<float>* append_;
  std::vector<float>* chunk_;
};

}  // namespace

Status PreprocessConfig::Validate() const {
  auto bad = [](const std::string& what) { return InvalidArgument("invalid PreprocessConfig: " + what); };
  if (patch_size < 1 || patch_size > 1024) return bad("patch_size " + std::to_string(patch_size) + " not in [1, 1024]");
  if (merge_size < 1 || merge_size > 64) return bad("merge_size " + std::to_string(merge_size) + " not in [1, 64]");
  if (temporal_patch_size < 1 || temporal_patch_size > 64) {
    return bad("temporal_patch_size " + std::to_string(temporal_patch_size) + " not in [1, 64]");
  }
  if (min_pixels < 1) return bad("min_pixels " + std::to_string(min_pixels) + " is not positive");
  if (max_pixels < min_pixels) {
    return bad("max_pixels " + std::to_string(max_pixels) + " is below min_pixels " + std::to_string(min_pixels));
  }
  if (max_pixels < factor() * factor()) {
    return bad("max_pixels " + std::to_string(max_pixels) +
               " is below factor^2 = " + std::to_string(factor() * factor()) + " (one merged token)");
  }
  if (max_pixels > (std::int64_t{1} << 40)) return bad("max_pixels " + std::to_string(max_pixels) + " above 2^40");
  for (int c = 0; c < 3; ++c) {
    if (!std::isfinite(mean[c])) return bad("mean[" + std::to_string(c) + "] is not finite");
    if (!std::isfinite(std[c]) || !(std[c] > 0))
      return bad("std[" + std::to_string(c) + "] is not finite and positive");
  }
  if (resample != Resample::kBicubic && resample != Resample::kBilinear) {
    return bad("resample " + std::to_string(static_cast<int>(resample)) + " is not a known filter");
  }
  return Status::Ok();
}

StatusOr<ResizedSize> SmartResize(std::int64_t height, std::int64_t width, const PreprocessConfig& cfg) {
  if (Status s = cfg.Validate(); !s.ok()) return s;
  return internal::SmartResizeWithBounds(height, width, cfg, static_cast<double>(cfg.min_pixels),
                                         static_cast<double>(cfg.max_pixels));
}

namespace internal {

StatusOr<ResizedSize> SmartResizeWithBounds(std::int64_t height, std::int64_t width, const PreprocessConfig& cfg,
                                            double min_pixels, double max_pixels) {
  if (height < 1 || width < 1) return InvalidArgument("zero-sized image: " + Dims(height, width) + " (HxW)");
  if (height > kMaxSide || width > kMaxSide) {
    return InvalidArgument("image side too large: " + Dims(height, width) + " (HxW), limit 2^31-1");
  }
  const std::int64_t lo = std::min(height, width), hi = std::max(height, width);
  if (hi > kMaxAspectRatio * lo) {
    return InvalidArgument("aspect ratio of " + Dims(height, width) + " (HxW) exceeds " +
                           std::to_string(kMaxAspectRatio) + ":1, which Qwen2-VL rejects");
  }
  // All quantities are < 2^62 and the doubles exact where Python's are.
  const double f = static_cast<double>(cfg.factor());
  const double h = static_cast<double>(height), w = static_cast<double>(width);
  double h_bar = std::max(f, internal::RoundHalfEven(h / f) * f);
  double w_bar = std::max(f, internal::RoundHalfEven(w / f) * f);
  if (h_bar * w_bar > max_pixels) {
    const double beta = std::sqrt(h * w / max_pixels);
    h_bar = std::max(f, std::floor(h / beta / f) * f);
    w_bar = std::max(f, std::floor(w / beta / f) * f);
  } else if (h_bar * w_bar < min_pixels) {
    const double beta = std::sqrt(min_pixels / (h * w));
    h_bar = std::ceil(h * beta / f) * f;
    w_bar = std::ceil(w * beta / f) * f;
  }
  return ResizedSize{static_cast<std::int64_t>(h_bar), static_cast<std::int64_t>(w_bar)};
}

}  // namespace internal

StatusOr<GridTHW> GridForImage(std::int64_t height, std::int64_t width, const PreprocessConfig& cfg) {
  auto size = SmartResize(height, width, cfg);
  if (!size.ok()) return size.status();
  return GridTHW{1, size->height / cfg.patch_size, size->width / cfg.patch_size};
}

StatusOr<GridTHW> GridForImage(const ImageInfo& info, const PreprocessConfig& cfg) {
  const bool apply = cfg.decode.apply_exif_orientation;
  return GridForImage(info.DisplayHeight(apply), info.DisplayWidth(apply), cfg);
}

StatusOr<ProbedGrid> ProbeGrid(std::span<const std::uint8_t> bytes, const PreprocessConfig& cfg,
                               const DecodeLimits& limits) {
  StatusOr<ImageInfo> info = ProbeImage(bytes);
  if (!info.ok()) return info.status();
  if (Status s = CheckDecodeLimits(*info, limits); !s.ok()) return s;
  StatusOr<GridTHW> grid = GridForImage(*info, cfg);
  if (!grid.ok()) return grid.status();
  return ProbedGrid{*info, *grid};
}

StatusOr<RgbImage> ResizeRgb(const RgbImage& src, int width, int height, Resample filter) {
  if (Status s = CheckImage(src); !s.ok()) return s;
  if (width < 1 || height < 1) {
    return InvalidArgument("resize target " + std::to_string(width) + "x" + std::to_string(height) +
                           " (WxH) is not positive");
  }
  if (width == src.width && height == src.height) return src;
  if (filter != Resample::kBicubic && filter != Resample::kBilinear) {
    return InvalidArgument("unknown resample filter " + std::to_string(static_cast<int>(filter)));
  }
  RgbImage out;
  out.width = width;
  out.height = height;
  out.pixels.resize(static_cast<std::size_t>(width) * static_cast<std::size_t>(height) * 3);
  ImageSink sink(out);
  internal::ResampleScratch& scratch = internal::ThreadScratch();
  internal::ResampleRgb(src.pixels.data(), src.width, src.height, std::size_t{3} * static_cast<std::size_t>(src.width),
                        width, height, filter, 64, scratch, sink);
  scratch.Trim();
  return out;
}

namespace internal {

std::vector<float> Patchify(const std::vector<float>& planar, int height, int width, const PreprocessConfig& cfg) {
  // A still image: every temporal frame is the same.
  const std::vector<const std::vector<float>*> frames(static_cast<std::size_t>(cfg.temporal_patch_size), &planar);
  return PatchifyFrames(frames, height, width, cfg);
}

std::vector<float> PatchifyFrames(std::span<const std::vector<float>* const> frames, int height, int width,
                                  const PreprocessConfig& cfg) {
  const std::int64_t P = cfg.patch_size, m = cfg.merge_size, T = cfg.temporal_patch_size;
  const std::int64_t gh = height / P, gw = width / P;
  const std::int64_t plane = std::int64_t{height} * width;
  const std::int64_t row_len = 3 * T * P * P;
  std::vector<float> out(static_cast<std::size_t>(gh * gw * row_len));
  float* dst = out.data();
  // Loop nest = the transposed axis order (block_y, block_x, my, mx | c, t, py, px),
  // so writes are sequential.
  for (std::int64_t by = 0; by < gh / m; ++by) {
    for (std::int64_t bx = 0; bx < gw / m; ++bx) {
      for (std::int64_t my = 0; my < m; ++my) {
        for (std::int64_t mx = 0; mx < m; ++mx) {
          const std::int64_t y0 = (by * m + my) * P, x0 = (bx * m + mx) * P;
          for (std::int64_t c = 0; c < 3; ++c) {
            for (std::int64_t t = 0; t < T; ++t) {
              const float* frame = frames[static_cast<std::size_t>(t)]->data();
              for (std::int64_t py = 0; py < P; ++py) {
                const float* src = frame + c * plane + (y0 + py) * width + x0;
                std::memcpy(dst, src, static_cast<std::size_t>(P) * sizeof(float));
                dst += P;
              }
            }
          }
        }
      }
    }
  }
  return out;
}

std::vector<float> NormalizeToPlanar(const RgbImage& image, const PreprocessConfig& cfg) {
  // x / 255 in double then rounded to float, then (x - mean) / std in float:
  // the Hugging Face rescale (float64 multiply, cast) and normalize (float32).
  std::array<std::array<float, 256>, 3> lut;
  for (int c = 0; c < 3; ++c) {
    for (int v = 0; v < 256; ++v) {
      const float x = static_cast<float>(v * (1.0 / 255.0));
      lut[c][v] = (x - cfg.mean[c]) / cfg.std[c];
    }
  }
  const std::size_t plane = static_cast<std::size_t>(image.height) * static_cast<std::size_t>(image.width);
  std::vector<float> planar(plane * 3);
  const std::uint8_t* px = image.pixels.data();
  for (std::size_t i = 0; i < plane; ++i) {
    planar[i] = lut[0][px[3 * i]];
    planar[plane + i] = lut[1][px[3 * i + 1]];
    planar[2 * plane + i] = lut[2][px[3 * i + 2]];
  }
  return planar;
}

}  // namespace internal

namespace {

// The resized size of a height x width image, checked to fit an int side.
StatusOr<ResizedSize> TargetSize(int height, int width, const PreprocessConfig& cfg) {
  auto size = SmartResize(height, width, cfg);
  if (!size.ok()) return size.status();
  // SmartResize output is bounded by about max_pixels (<= 2^40) per area, but
  // a single side could still exceed int for extreme configs.
  if (size->height > kMaxSide || size->width > kMaxSide) {
    return InvalidArgument("resized size " + Dims(size->height, size->width) + " exceeds 2^31-1");
  }
  return *size;
}

// Resample, normalise and patchify RGB8 `pixels` (width x height) into
// `rows` (or onto `append`, see PatchSink). REQUIRES: `size` is
// TargetSize's and rows the right length.
void ResampleIntoRows(const std::uint8_t* pixels, int width, int height, const ResizedSize& size,
                      const PreprocessConfig& cfg, float* rows, std::vector<float>* append) {
  thread_local std::vector<float> chunk;
  const int H = static_cast<int>(size.height), W = static_cast<int>(size.width);
  PatchSink sink(cfg, W, rows, append, &chunk);
  internal::ResampleScratch& scratch = internal::ThreadScratch();
  internal::ResampleRgb(pixels, width, height, std::size_t{3} * static_cast<std::size_t>(width), W, H, cfg.resample,
                        cfg.patch_size * cfg.merge_size, scratch, sink);
  scratch.Trim();
  if (chunk.capacity() * sizeof(float) > internal::ResampleScratch::kKeepBytes) std::vector<float>().swap(chunk);
}

// Preprocess on well-formed RGB8 pixels, resized to `size`.
StatusOr<PreprocessedImage> PreprocessPixels(const std::uint8_t* pixels, int width, int height, const ResizedSize& size,
                                             const PreprocessConfig& cfg) {
  PreprocessedImage out;
  out.grid = GridTHW{1, size.height / cfg.patch_size, size.width / cfg.patch_size};
  out.merge_size = cfg.merge_size;
  out.patch_dim = cfg.patch_dim();
  out.patches.reserve(static_cast<std::size_t>(out.grid.patches() * out.patch_dim));
  ResampleIntoRows(pixels, width, height, size, cfg, nullptr, &out.patches);
  return out;
}

// The least decoded size DCT scaling may give (jpeg_dct_scaling): the
// resized size when it is at most half the stored one on both axes, else
// {0, 0} (no scaling). `context` is the PreprocessConfig.
std::pair<int, int> DctMinSize(int width, int height, const void* context) {
  auto size = TargetSize(height, width, *static_cast<const PreprocessConfig*>(context));
  if (!size.ok() || 2 * size->width > width || 2 * size->height > height) return {0, 0};
  return {static_cast<int>(size->width), static_cast<int>(size->height)};
}

// DecodeAndPreprocess's JPEG path: the pixels decode into this thread's
// buffer. nullopt when the image takes DecodeImage instead (CMYK).
StatusOr<std::optional<PreprocessedImage>> JpegFastPath(std::span<const std::uint8_t> bytes,
                                                        const PreprocessConfig& cfg, const DecodeLimits& limits) {
  thread_local internal::PixelBuffer buffer;
  StatusOr<bool> decoded =
      internal::DecodeJpegRgbInto(bytes, limits, buffer, cfg.jpeg_dct_scaling ? DctMinSize : nullptr, &cfg);
  if (!decoded.ok()) return decoded.status();
  if (!*decoded) return std::optional<PreprocessedImage>();
  // The grid is the stored size's, also when the decode was scaled.
  auto size = TargetSize(buffer.stored_height, buffer.stored_width, cfg);
  if (!size.ok()) return size.status();
  auto pre = PreprocessPixels(buffer.data.get(), buffer.width, buffer.height, *size, cfg);
  if (!pre.ok()) return pre.status();
  return std::optional<PreprocessedImage>(std::move(*pre));
}

}  // namespace

Status PreprocessInto(const RgbImage& image, const PreprocessConfig& cfg, std::span<float> rows) {
  if (Status s = CheckImage(image); !s.ok()) return s;
  auto size = TargetSize(image.height, image.width, cfg);
  if (!size.ok()) return size.status();
  const std::int64_t patches = (size->height / cfg.patch_size) * (size->width / cfg.patch_size);
  const std::int64_t want = patches * cfg.patch_dim();
  if (static_cast<std::int64_t>(rows.size()) != want) {
    return InvalidArgument("PreprocessInto: rows has " + std::to_string(rows.size()) + " floats, the " +
                           Dims(size->height, size->width) + " (HxW) result needs " + std::to_string(patches) +
                           " rows of " + std::to_string(cfg.patch_dim()) + " = " + std::to_string(want));
  }
  ResampleIntoRows(image.pixels.data(), image.width, image.height, *size, cfg, rows.data(), nullptr);
  return Status::Ok();
}

StatusOr<PreprocessedImage> Preprocess(const RgbImage& image, const PreprocessConfig& cfg) {
  if (Status s = CheckImage(image); !s.ok()) return s;
  auto size = TargetSize(image.height, image.width, cfg);
  if (!size.ok()) return size.status();
  return PreprocessPixels(image.pixels.data(), image.width, image.height, *size, cfg);
}

StatusOr<PreprocessedImage> DecodeAndPreprocess(std::span<const std::uint8_t> bytes, const PreprocessConfig& cfg,
                                                const DecodeLimits& limits) {
  // Validate first: a bad config should not cost a decode.
  if (Status s = cfg.Validate(); !s.ok()) return s;
  // The common case, a JPEG shown as stored, decodes into this thread's
  // buffer (internal::DecodeJpegRgbInto); the rest takes DecodeImage, whose
  // checks and errors the fast path shares.
  const bool jpeg = bytes.size() >= 3 && bytes[0] == 0xff && bytes[1] == 0xd8 && bytes[2] == 0xff;
  if (jpeg && limits.max_pixels > 0 && (!cfg.decode.apply_exif_orientation || internal::JpegOrientation(bytes) == 1)) {
    auto fast = JpegFastPath(bytes, cfg, limits);
    if (!fast.ok()) return fast.status();
    if (fast->has_value()) return std::move(**fast);  // move: the rows are megabytes
  }
  auto image = DecodeImage(bytes, limits, cfg.decode);
  if (!image.ok()) return image.status();
  return Preprocess(*image, cfg);
}

}  // namespace epd
