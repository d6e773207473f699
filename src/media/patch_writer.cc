// PatchWriter (patchify.h): the fused normalise-and-patchify step.
//
// The table holds, per channel and byte value, (float(v * (1.0 / 255)) -
// mean[c]) / std[c] in float: the Hugging Face rescale (a float64 multiply,
// cast) and normalize (float32), exactly as NormalizeToPlanar computes them.
// Equal temporal frames (a still image's) are read once and each patch line
// is stored to every frame's place from registers. Qwen's patch sides (14,
// 16) get loops of fixed length, which GCC turns into whole-vector stores.
#include <cstring>

#include "patchify.h"

namespace epd::internal {
namespace {

// One patch of one run of equal frames: frame `src` (at the patch's top
// left pixel) into frames [t0, t0 + run) of the row at `dst`.
template <int kFixed>
void WritePatch(const std::uint8_t* src, std::size_t stride, int patch, int temporal, int t0, int run,
                const float (&lut)[3][256], float* dst) {
  const int P = kFixed > 0 ? kFixed : patch;
  const std::size_t block = static_cast<std::size_t>(P) * static_cast<std::size_t>(P);
  for (int py = 0; py < P; ++py, src += stride) {
    float* line = dst + static_cast<std::size_t>(py) * static_cast<std::size_t>(P);
    if constexpr (kFixed > 0) {
      float v[3][kFixed];
      for (int px = 0; px < kFixed; ++px) {
        for (int c = 0; c < 3; ++c) v[c][px] = lut[c][src[3 * px + c]];
      }
      for (int c = 0; c < 3; ++c) {
        for (int t = t0; t < t0 + run; ++t) std::memcpy(line + (c * temporal + t) * block, v[c], sizeof v[c]);
      }
    } else {
      for (int c = 0; c < 3; ++c) {
        for (int px = 0; px < P; ++px) {
          const float x = lut[c][src[3 * px + c]];
          for (int t = t0; t < t0 + run; ++t) line[(c * temporal + t) * block + static_cast<std::size_t>(px)] = x;
        }
      }
    }
  }
}

}  // namespace

PatchWriter::PatchWriter(const PreprocessConfig& cfg, int width)
    : patch_(cfg.patch_size),
      merge_(cfg.merge_size),
      temporal_(cfg.temporal_patch_size),
      width_(width),
      row_len_(static_cast<std::size_t>(cfg.patch_dim())) {
  for (int c = 0; c < 3; ++c) {
    for (int v = 0; v < 256; ++v) {
      const float x = static_cast<float>(v * (1.0 / 255.0));
      lut_[c][v] = (x - cfg.mean[c]) / cfg.std[c];
    }
  }
}

std::size_t PatchWriter::RowsPerBlockRow() const {
  return static_cast<std::size_t>(width_ / patch_) * static_cast<std::size_t>(merge_);
}

std::size_t PatchWriter::RowsBefore(int y) const {
  return static_cast<std::size_t>(y / (patch_ * merge_)) * RowsPerBlockRow();
}

void PatchWriter::Band(const std::uint8_t* const* frames, std::size_t stride, int y0, float* rows,
                       std::size_t row0) const {
  const int P = patch_, m = merge_, T = temporal_;
  const int gw = width_ / P, gy = y0 / P;
  const int by = gy / m, my = gy % m;
  for (int gx = 0; gx < gw; ++gx) {
    const int bx = gx / m, mx = gx % m;
    // Rows walk the m x m patches of a merge block, blocks in raster order.
    const std::size_t row = ((static_cast<std::size_t>(by) * static_cast<std::size_t>(gw / m) + bx) * m + my) * m + mx;
    float* dst = rows + (row - row0) * row_len_;
    const std::size_t x0 = static_cast<std::size_t>(gx) * static_cast<std::size_t>(P) * 3;
    for (int t0 = 0; t0 < T;) {
      int run = 1;
      while (t0 + run < T && frames[t0 + run] == frames[t0]) ++run;
      const std::uint8_t* src = frames[t0] + x0;
      if (P == 14) {
        WritePatch<14>(src, stride, P, T, t0, run, lut_, dst);
      } else if (P == 16) {
        WritePatch<16>(src, stride, P, T, t0, run, lut_, dst);
      } else {
        WritePatch<0>(src, stride, P, T, t0, run, lut_, dst);
      }
      t0 += run;
    }
  }
}

}  // namespace epd::internal
