// src/media/resample.h (internal to epd::media): the RGB8 resampler behind
// epd::ResizeRgb and epd::Preprocess, written to give Pillow's
// Image.resize(BICUBIC or BILINEAR) bit for bit.
//
// The arithmetic is Pillow 9.4's ImagingResample (libImaging/Resample.c),
// reimplemented: per axis, each output pixel i has a window of source pixels
// [lo, lo + n) around centre (i + 0.5) * scale, support = filter support *
// max(scale, 1), weights filter((j - centre + 0.5) / max(scale, 1))
// normalised to sum 1 in double, then rounded to fixed point with 22
// fractional bits (away from zero). A pass sums pixel * weight in int32
// from 2^21 and keeps clamp(sum >> 22, 0, 255). Pillow's order: the
// horizontal pass first, over the source rows the vertical pass reads, into
// uint8, then the vertical pass; an axis whose size is unchanged is skipped.
// Integer sums are exact, so the output equals Pillow's, not merely close
// (the parity tests check it against Pillow itself).
//
// Speed: the horizontal pass runs 16 source rows at a time, transposed so
// that the 16 rows are the SIMD lanes and every lane shares one output
// pixel's weights; the vertical pass runs along the row, one weight per
// source row. The multiply-accumulate loops are compiled for AVX-512, AVX2
// and baseline x86-64, the widest the CPU runs picked at first use.
//
// Output is delivered in bands of consecutive rows to a BandSink, so a
// caller (the patch writer) consumes each band while it is in cache and no
// full-size image follows the resize.
//
// Thread safety: a ResampleScratch is thread-compatible (one per thread;
// ThreadScratch() is this thread's). Everything else is pure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "epd/media/preprocess.h"

namespace epd::internal {

// Pillow's weights for one axis: output pixel i reads source pixels
// [lo[i], lo[i] + count[i]) with weights k[i * ksize + j], j < count[i].
struct AxisWeights {
  int in_size = 0;
  int out_size = 0;
  int ksize = 0;
  std::vector<int> lo;
  std::vector<int> count;
  std::vector<std::int32_t> k;  // 22 fractional bits
};

// Fills `w` for in_size -> out_size with `filter` (precompute_coeffs and
// normalize_coeffs_8bpc). Reuses w's capacity. REQUIRES: sizes >= 1.
void ComputeAxisWeights(int in_size, int out_size, Resample filter, AxisWeights& w);

// Receives the resampled image as bands of `rows` consecutive rows starting
// at row y0, each row 3 * width bytes, rows `stride` bytes apart. The memory
// is valid only during the call.
class BandSink {
 public:
  virtual ~BandSink() = default;
  virtual void Band(const std::uint8_t* rows, std::size_t stride, int y0, int n) = 0;
};

// Scratch the passes reuse from image to image: after the first image of a
// given size, a resize allocates nothing.
struct ResampleScratch {
  AxisWeights horizontal;
  AxisWeights vertical;
  std::vector<std::uint8_t> between;  // the horizontal pass's output rows
  std::vector<std::uint8_t> block;    // 16 rows transposed (and staging)
  std::vector<std::uint8_t> result;   // a block's output, transposed
  std::vector<std::uint8_t> band;     // the vertical pass's output band
  // Frees buffers above kKeepBytes, so one huge image does not pin its
  // scratch on the thread for good.
  void Trim();
  static constexpr std::size_t kKeepBytes = std::size_t{64} << 20;
};

// This thread's scratch.
ResampleScratch& ThreadScratch();

// Resamples src (RGB8, width x height, rows `src_stride` bytes apart) to
// out_width x out_height with `filter`, delivering bands of at most
// band_rows rows, in order, to `sink`. REQUIRES: all sizes >= 1,
// band_rows >= 1.
void ResampleRgb(const std::uint8_t* src, int width, int height, std::size_t src_stride, int out_width, int out_height,
                 Resample filter, int band_rows, ResampleScratch& scratch, BandSink& sink);

}  // namespace epd::internal
