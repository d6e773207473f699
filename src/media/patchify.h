// src/media/patchify.h (internal to epd::media): the Qwen2-VL patch layout,
// separated from resize/normalise so a test can feed it distinct floats, and
// the pieces of Preprocess that the video path (video_sampling.cc) shares
// with the image path, so a video chunk's rows are made by the same code as
// an image's.
//
// Thread safety: pure functions; thread-safe.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "epd/core/status.h"
#include "epd/media/image.h"
#include "epd/media/preprocess.h"

namespace epd::internal {

// Python's round(): the nearest integer, ties to even (smart_resize's and
// qwen-vl-utils' round_by_factor's rounding).
inline double RoundHalfEven(double x) {
  const double fl = std::floor(x);
  const double diff = x - fl;
  if (diff > 0.5) return fl + 1;
  if (diff < 0.5) return fl;
  return std::fmod(fl, 2.0) == 0.0 ? fl : fl + 1;
}

// `planar` is one normalised frame, [3, height, width] float32 (channel
// planes). Returns [gh * gw, 3 * T * P * P] rows in the layout documented at
// epd::Preprocess, the frame repeated T = cfg.temporal_patch_size times.
// REQUIRES: cfg valid; height and width multiples of cfg.factor();
// planar.size() == 3 * height * width.
std::vector<float> Patchify(const std::vector<float>& planar, int height, int width, const PreprocessConfig& cfg);

// The same layout over T distinct frames: frames[t] is temporal frame t of
// every row (Qwen2-VL's video patches). Patchify(planar) equals
// PatchifyFrames of T pointers to planar.
// REQUIRES: frames.size() == cfg.temporal_patch_size, each as for Patchify.
std::vector<float> PatchifyFrames(std::span<const std::vector<float>* const> frames, int height, int width,
                                  const PreprocessConfig& cfg);

// Step 3 of Preprocess: x / 255, then (x - mean[c]) / std[c], into planar
// [3, H, W] float32. REQUIRES: image well formed (pixels.size() == W*H*3).
std::vector<float> NormalizeToPlanar(const RgbImage& image, const PreprocessConfig& cfg);

// Steps 3 and 4 fused: normalises bands of patch_size rows of uint8 RGB
// frames straight into patch rows (the layout of epd::Preprocess), so no
// float image is ever whole. Values equal NormalizeToPlanar's then
// PatchifyFrames' bit for bit (the same float operations, through a table).
// Thread-compatible; holds a 3 x 256 float table.
class PatchWriter {
 public:
  // For frames `width` pixels wide. REQUIRES: cfg valid; width a multiple
  // of cfg.factor().
  PatchWriter(const PreprocessConfig& cfg, int width);

  // Writes every patch whose top row is y0 (a multiple of patch_size):
  // frames[t] points at row y0 of temporal frame t (cfg.temporal_patch_size
  // pointers; equal pointers are read once), rows 3 * width bytes, `stride`
  // bytes apart. Patch row r goes to rows + (r - row0) * patch_dim: the
  // rows of a band lie in [RowsBefore(y0), RowsBefore(y0) + RowsPerBlockRow())
  // (the merge-block row that y0 belongs to).
  void Band(const std::uint8_t* const* frames, std::size_t stride, int y0, float* rows, std::size_t row0) const;

  // Patch rows before the merge-block row holding output row y.
  std::size_t RowsBefore(int y) const;
  // Patch rows of one merge-block row: (width / P) * merge_size.
  std::size_t RowsPerBlockRow() const;

 private:
  int patch_, merge_, temporal_, width_;
  std::size_t row_len_;
  float lut_[3][256];
};

// smart_resize with explicit bounds (double, as the Python original's may be
// floats: qwen-vl-utils' video max_pixels is total_pixels / nframes * 2).
// Same formula and errors as epd::SmartResize, which calls it with
// cfg.min_pixels / cfg.max_pixels. REQUIRES: cfg valid, 0 < min_pixels <=
// max_pixels.
StatusOr<ResizedSize> SmartResizeWithBounds(std::int64_t height, std::int64_t width, const PreprocessConfig& cfg,
                                            double min_pixels, double max_pixels);

}  // namespace epd::internal
