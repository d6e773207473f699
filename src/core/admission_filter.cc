// The doorkeeper is a plain Bloom filter over a power-of-two bit array; the
// sketch is kRows counter rows of one width. Both are indexed by one remixed
// 64-bit value m: probe i of the doorkeeper is (m_lo + i * m_hi) & mask (double
// hashing with an odd step, so the probes of one key differ), and row r of
// the sketch uses bits rotated by 16 r of m, so the rows are as independent as
// the 64 bits allow.
#include "epd/core/admission_filter.h"

#include <algorithm>
#include <bit>
#include <string>

#include "epd/core/status.h"

namespace epd {
namespace {

std::uint64_t Remix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::uint64_t Probe(std::uint64_t m, int i, std::uint64_t mask) {
  const std::uint64_t lo = m & 0xffffffffu;
  const std::uint64_t step = (m >> 32) | 1;
  return (lo + static_cast<std::uint64_t>(i) * step) & mask;
}

std::uint64_t SketchSlot(std::uint64_t m, int row, std::uint64_t mask) { return std::rotr(m, 16 * row) & mask; }

}  // namespace

AdmissionFilter::AdmissionFilter(const AdmissionFilterOptions& options) : options_(options) {
  if (options.window < 1) throw Error(Status(StatusCode::kInvalidArgument, "admission window must be >= 1"));
  if (options.bits_per_request < 1) {
    throw Error(Status(StatusCode::kInvalidArgument,
                       "admission bits_per_request must be >= 1, got " + std::to_string(options.bits_per_request)));
  }
  if (options.window > (std::uint64_t{1} << 40) / static_cast<std::uint64_t>(options.bits_per_request)) {
    throw Error(Status(StatusCode::kInvalidArgument,
                       "admission window " + std::to_string(options.window) + " is too large (over 2^40 bits)"));
  }
  const std::uint64_t nbits =
      std::bit_ceil(std::max<std::uint64_t>(64, options.window * static_cast<std::uint64_t>(options.bits_per_request)));
  bit_mask_ = nbits - 1;
  bits_.assign(nbits / 64, 0);
  const std::uint64_t width = std::bit_ceil(std::max<std::uint64_t>(16, options.window));
  width_mask_ = width - 1;
  sketch_.assign(width * kRows, 0);
}

bool AdmissionFilter::InDoorkeeper(std::uint64_t m) const {
  for (int i = 0; i < kProbes; ++i) {
    const std::uint64_t b = Probe(m, i, bit_mask_);
    if ((bits_[b >> 6] & (std::uint64_t{1} << (b & 63))) == 0) return false;
  }
  return true;
}

std::uint32_t AdmissionFilter::SketchMin(std::uint64_t m) const {
  std::uint32_t least = 255;
  const std::uint64_t width = width_mask_ + 1;
  for (int r = 0; r < kRows; ++r) {
    least = std::min<std::uint32_t>(least, sketch_[r * width + SketchSlot(m, r, width_mask_)]);
  }
  return least;
}

std::uint32_t AdmissionFilter::Record(std::uint64_t h) {
  const std::uint64_t m = Remix(h);
  std::uint32_t estimate;
  if (!InDoorkeeper(m)) {
    for (int i = 0; i < kProbes; ++i) {
      const std::uint64_t b = Probe(m, i, bit_mask_);
      bits_[b >> 6] |= std::uint64_t{1} << (b & 63);
    }
    estimate = 1 + SketchMin(m);
  } else {
    // Conservative update: only the rows at the minimum grow, which keeps
    // the other rows' overcount from compounding.
    const std::uint32_t least = SketchMin(m);
    const std::uint64_t width = width_mask_ + 1;
    for (int r = 0; r < kRows; ++r) {
      std::uint8_t& c = sketch_[r * width + SketchSlot(m, r, width_mask_)];
      if (c == least && c < 255) ++c;
    }
    estimate = 1 + std::min<std::uint32_t>(least + 1, 255);
  }
  if (++in_window_ >= options_.window) EndWindow();
  return estimate;
}

std::uint32_t AdmissionFilter::Estimate(std::uint64_t h) const {
  const std::uint64_t m = Remix(h);
  return (InDoorkeeper(m) ? 1 : 0) + SketchMin(m);
}

void AdmissionFilter::EndWindow() {
  std::fill(bits_.begin(), bits_.end(), 0);
  for (std::uint8_t& c : sketch_) c = static_cast<std::uint8_t>(c >> 1);
  in_window_ = 0;
  ++resets_;
}

}  // namespace epd
