// The resampler of resample.h. Design notes:
//
// Weights. ComputeAxisWeights follows Pillow's precompute_coeffs and
// normalize_coeffs_8bpc operation for operation in IEEE double (the library
// builds with -ffp-contract=off, so no fused multiply-add changes a
// rounding), so the int32 weights equal Pillow's and the integer sums that
// follow are Pillow's exactly.
//
// Horizontal pass. Along a row each output pixel has its own window start
// and weights, so a row does not vectorise without gathers. Across rows it
// does: 16 source rows are transposed (16 x 16 byte blocks, SSE2) into
// [column][row] order, so one output pixel's weights multiply 16 rows x 3
// channels = 48 contiguous bytes per tap; the 48 results are transposed
// back. The transposes cost two byte shuffles per source and output byte,
// against about 2 * ksize multiply-adds per output byte.
//
// Vertical pass. Every output pixel of a row shares the row's weights, so
// the sum runs along the row (64 bytes at a time), one broadcast weight per
// source row.
//
// Benefits: exact parity with Pillow; one kernel source for every
// instruction set (five vector operations each). Costs:
// the horizontal pass's output (source rows x output width x 3 bytes) is
// held between the passes, as Pillow holds it.
#include "resample.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__SSE2__) || (defined(__x86_64__) && defined(__GNUC__))
#include <immintrin.h>
#endif

namespace epd::internal {
namespace {

constexpr int kPrecisionBits = 22;  // Pillow's PRECISION_BITS: 32 - 8 - 2
constexpr std::int32_t kHalf = std::int32_t{1} << (kPrecisionBits - 1);
constexpr int kLanes = 16;               // source rows per horizontal block
constexpr int kBlockBytes = 3 * kLanes;  // one pixel column of a block
constexpr int kVerticalChunk = 64;       // bytes of a row per vertical step

inline std::uint8_t Clip8(std::int32_t sum) {
  const std::int32_t v = sum >> kPrecisionBits;
  return static_cast<std::uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

// Pillow's bicubic_filter (a = -0.5) and bilinear_filter, same operations.
double Bicubic(double x) {
  constexpr double kA = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((kA + 2.0) * x - (kA + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * kA;
  return 0.0;
}

double Bilinear(double x) {
  if (x < 0.0) x = -x;
  if (x < 1.0) return 1.0 - x;
  return 0.0;
}

#if defined(__SSE2__)
// out[m] = byte m of every in[r], i.e. a 16 x 16 byte transpose, in four
// rounds of interleaves (bytes, pairs, quads, octets).
void Transpose16(const __m128i in[16], __m128i out[16]) {
  __m128i a[16], b[16];
  for (std::ptrdiff_t g = 0; g < 8; ++g) {  // rows 2g, 2g+1: columns 0-7, 8-15
    a[2 * g] = _mm_unpacklo_epi8(in[2 * g], in[2 * g + 1]);
    a[2 * g + 1] = _mm_unpackhi_epi8(in[2 * g], in[2 * g + 1]);
  }
  for (int q = 0; q < 4; ++q) {  // rows 4q..4q+3; b[4q + k]: columns 4k..4k+3
    for (int h = 0; h < 2; ++h) {
      b[4 * q + 2 * h] = _mm_unpacklo_epi16(a[4 * q + h], a[4 * q + 2 + h]);
      b[4 * q + 2 * h + 1] = _mm_unpackhi_epi16(a[4 * q + h], a[4 * q + 2 + h]);
    }
  }
  for (int o = 0; o < 2; ++o) {  // rows 8o..8o+7; a[8o + m]: columns 2m, 2m+1
    for (int k = 0; k < 4; ++k) {
      a[8 * o + 2 * k] = _mm_unpacklo_epi32(b[8 * o + k], b[8 * o + 4 + k]);
      a[8 * o + 2 * k + 1] = _mm_unpackhi_epi32(b[8 * o + k], b[8 * o + 4 + k]);
    }
  }
  for (std::ptrdiff_t m = 0; m < 8; ++m) {
    out[2 * m] = _mm_unpacklo_epi64(a[m], a[8 + m]);
    out[2 * m + 1] = _mm_unpackhi_epi64(a[m], a[8 + m]);
  }
}
#endif

// block[j * 16 + r] = rows[r][j] for j < cols.
void TransposeIn(const std::uint8_t* const rows[kLanes], std::size_t cols, std::uint8_t* block) {
  std::size_t j = 0;
#if defined(__SSE2__)
  for (; j + kLanes <= cols; j += kLanes) {
    __m128i in[16], out[16];
    for (int r = 0; r < kLanes; ++r) in[r] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[r] + j));
    Transpose16(in, out);
    for (int m = 0; m < kLanes; ++m) _mm_storeu_si128(reinterpret_cast<__m128i*>(block + (j + m) * kLanes), out[m]);
  }
#endif
  for (; j < cols; ++j) {
    for (int r = 0; r < kLanes; ++r) block[j * kLanes + r] = rows[r][j];
  }
}

// rows[r][j] = block[j * 16 + r] for j < cols.
void TransposeOut(const std::uint8_t* block, std::size_t cols, std::uint8_t* const rows[kLanes]) {
  std::size_t j = 0;
#if defined(__SSE2__)
  for (; j + kLanes <= cols; j += kLanes) {
    __m128i in[16], out[16];
    for (int m = 0; m < kLanes; ++m)
      in[m] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + (j + m) * kLanes));
    Transpose16(in, out);
    for (int r = 0; r < kLanes; ++r) _mm_storeu_si128(reinterpret_cast<__m128i*>(rows[r] + j), out[r]);
  }
#endif
  for (; j < cols; ++j) {
    for (int r = 0; r < kLanes; ++r) rows[r][j] = block[j * kLanes + r];
  }
}

// The kernels, once per instruction set (resample_kernels.inc). The
// baseline is one lane of plain C++ (which GCC vectorises with SSE2 as it
// can).
namespace scalar {
using V = std::int32_t;
constexpr int kWidth = 1;
inline V Widen(const std::uint8_t* p) { return *p; }
inline V Splat(std::int32_t k) { return k; }
inline V MulAdd(V a, V x, V k) { return a + x * k; }
inline void Narrow(std::uint8_t* p, V a) { *p = Clip8(a); }
#include "resample_kernels.inc"
}  // namespace scalar

#if defined(__x86_64__) && defined(__GNUC__)
// Each block below is compiled for its instruction set: GCC's target
// pragma, or clang's equivalent (clang ignores GCC's).
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2")
#endif
namespace avx2 {
using V = __m256i;
constexpr int kWidth = 8;
inline V Widen(const std::uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
inline V Splat(std::int32_t k) { return _mm256_set1_epi32(k); }
inline V MulAdd(V a, V x, V k) { return _mm256_add_epi32(a, _mm256_mullo_epi32(x, k)); }
inline void Narrow(std::uint8_t* p, V a) {
  const V v = _mm256_srai_epi32(a, kPrecisionBits);
  // The two saturating packs clamp to [0, 255].
  const __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packus_epi16(w, w));
}
#include "resample_kernels.inc"
}  // namespace avx2
#if defined(__clang__)
#pragma clang attribute pop
#pragma clang attribute push(__attribute__((target("avx512f"))), apply_to = function)
#else
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f")
// GCC 12's AVX-512 intrinsics trip -Wmaybe-uninitialized on their own
// internal undefined operand; nothing of ours is uninitialised.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
namespace avx512 {
using V = __m512i;
constexpr int kWidth = 16;
inline V Widen(const std::uint8_t* p) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline V Splat(std::int32_t k) { return _mm512_set1_epi32(k); }
inline V MulAdd(V a, V x, V k) { return _mm512_add_epi32(a, _mm512_mullo_epi32(x, k)); }
inline void Narrow(std::uint8_t* p, V a) {
  // Negative sums to 0, then unsigned saturation to 255.
  const V v = _mm512_max_epi32(_mm512_srai_epi32(a, kPrecisionBits), _mm512_setzero_si512());
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtusepi32_epi8(v));
}
#include "resample_kernels.inc"
}  // namespace avx512
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif
#endif

// The widest kernels this CPU runs, chosen once.
struct Kernels {
  void (*horizontal)(const std::uint8_t*, const AxisWeights&, std::uint8_t*);
  void (*vertical)(const std::uint8_t*, std::size_t, const std::int32_t*, int, std::size_t, std::uint8_t*);
};

Kernels ChooseKernels() {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return {avx512::HorizontalTaps, avx512::VerticalRow};
  if (__builtin_cpu_supports("avx2")) return {avx2::HorizontalTaps, avx2::VerticalRow};
#endif
  return {scalar::HorizontalTaps, scalar::VerticalRow};
}

const Kernels& Simd() {
  static const Kernels kernels = ChooseKernels();
  return kernels;
}

// Rows [0, rows) of src through w into dst (3 * w.out_size bytes a row).
void HorizontalPass(const std::uint8_t* src, std::size_t src_stride, int rows, const AxisWeights& w, ResampleScratch& s,
                    std::uint8_t* dst) {
  const std::size_t in_cols = std::size_t{3} * static_cast<std::size_t>(w.in_size);
  const std::size_t out_cols = std::size_t{3} * static_cast<std::size_t>(w.out_size);
  s.block.resize(in_cols * kLanes);
  s.result.resize(out_cols * (kLanes + 1));  // the last row: a sink for padding lanes
  std::uint8_t* spare = s.result.data() + out_cols * kLanes;
  for (int y = 0; y < rows; y += kLanes) {
    const int n = std::min(kLanes, rows - y);
    const std::uint8_t* in[kLanes];
    std::uint8_t* out[kLanes];
    for (int r = 0; r < kLanes; ++r) {
      // A short last block repeats its last row and throws those lanes away.
      in[r] = src + static_cast<std::size_t>(y + std::min(r, n - 1)) * src_stride;
      out[r] = r < n ? dst + static_cast<std::size_t>(y + r) * out_cols : spare;
    }
    TransposeIn(in, in_cols, s.block.data());
    Simd().horizontal(s.block.data(), w, s.result.data());
    TransposeOut(s.result.data(), out_cols, out);
  }
}

// The vertical pass over `src`, whose row 0 is source row `first`.
void VerticalPass(const std::uint8_t* src, std::size_t stride, int first, std::size_t len, const AxisWeights& w,
                  int band_rows, ResampleScratch& s, BandSink& sink) {
  s.band.resize(len * static_cast<std::size_t>(band_rows));
  for (int y0 = 0; y0 < w.out_size; y0 += band_rows) {
    const int n = std::min(band_rows, w.out_size - y0);
    for (int y = y0; y < y0 + n; ++y) {
      const std::int32_t* k = w.k.data() + static_cast<std::size_t>(y) * static_cast<std::size_t>(w.ksize);
      Simd().vertical(src + static_cast<std::size_t>(w.lo[y] - first) * stride, stride, k, w.count[y], len,
                      s.band.data() + static_cast<std::size_t>(y - y0) * len);
    }
    sink.Band(s.band.data(), len, y0, n);
  }
}

template <typename T>
void Release(std::vector<T>& v) {
  if (v.capacity() * sizeof(T) > ResampleScratch::kKeepBytes) std::vector<T>().swap(v);
}

}  // namespace

void ComputeAxisWeights(int in_size, int out_size, Resample filter, AxisWeights& w) {
  const bool cubic = filter == Resample::kBicubic;
  // Pillow: scale = (double)(box1 - box0) / out, the box in float.
  const double scale = static_cast<double>(static_cast<float>(in_size) - 0.0f) / out_size;
  const double filterscale = scale < 1.0 ? 1.0 : scale;
  const double support = (cubic ? 2.0 : 1.0) * filterscale;
  const int ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  w.in_size = in_size;
  w.out_size = out_size;
  w.ksize = ksize;
  w.lo.resize(static_cast<std::size_t>(out_size));
  w.count.resize(static_cast<std::size_t>(out_size));
  w.k.assign(static_cast<std::size_t>(out_size) * static_cast<std::size_t>(ksize), 0);
  const double ss = 1.0 / filterscale;
  for (int i = 0; i < out_size; ++i) {
    const double center = 0.0 + (i + 0.5) * scale;
    // Pillow's own rounding (truncation after + 0.5), kept to the bit.
    const int lo = std::max(0, static_cast<int>(center - support + 0.5));        // NOLINT(bugprone-incorrect-roundings)
    const int hi = std::min(in_size, static_cast<int>(center + support + 0.5));  // NOLINT(bugprone-incorrect-roundings)
    const int n = hi - lo;
    // Pillow stores each weight, sums, then divides; evaluating the filter
    // twice gives the same doubles without a buffer.
    double ww = 0.0;
    for (int x = 0; x < n; ++x) {
      const double arg = (x + lo - center + 0.5) * ss;
      ww += cubic ? Bicubic(arg) : Bilinear(arg);
    }
    std::int32_t* k = w.k.data() + static_cast<std::size_t>(i) * static_cast<std::size_t>(ksize);
    for (int x = 0; x < n; ++x) {
      const double arg = (x + lo - center + 0.5) * ss;
      double v = cubic ? Bicubic(arg) : Bilinear(arg);
      if (ww != 0.0) v /= ww;
      const double scaled = v * (1 << kPrecisionBits);
      k[x] = static_cast<std::int32_t>(v < 0 ? -0.5 + scaled : 0.5 + scaled);
    }
    w.lo[static_cast<std::size_t>(i)] = lo;
    w.count[static_cast<std::size_t>(i)] = n;
  }
}

void ResampleScratch::Trim() {
  Release(between);
  Release(block);
  Release(result);
  Release(band);
}

ResampleScratch& ThreadScratch() {
  thread_local ResampleScratch scratch;
  return scratch;
}

void ResampleRgb(const std::uint8_t* src, int width, int height, std::size_t src_stride, int out_width, int out_height,
                 Resample filter, int band_rows, ResampleScratch& s, BandSink& sink) {
  const bool need_h = out_width != width, need_v = out_height != height;
  ComputeAxisWeights(height, out_height, filter, s.vertical);
  const std::uint8_t* rows = src;
  std::size_t stride = src_stride;
  int first = 0;
  if (need_h) {
    // Pillow resamples only the source rows the vertical pass reads.
    ComputeAxisWeights(width, out_width, filter, s.horizontal);
    const AxisWeights& v = s.vertical;
    first = v.lo.front();
    const int last = v.lo.back() + v.count.back();
    stride = std::size_t{3} * static_cast<std::size_t>(out_width);
    s.between.resize(stride * static_cast<std::size_t>(last - first));
    HorizontalPass(src + static_cast<std::size_t>(first) * src_stride, src_stride, last - first, s.horizontal, s,
                   s.between.data());
    rows = s.between.data();
  }
  const std::size_t len = std::size_t{3} * static_cast<std::size_t>(out_width);
  if (need_v) {
    VerticalPass(rows, stride, first, len, s.vertical, band_rows, s, sink);
  } else {
    // No vertical resampling: every row is its own output (first is 0).
    for (int y0 = 0; y0 < out_height; y0 += band_rows) {
      sink.Band(rows + static_cast<std::size_t>(y0) * stride, stride, y0, std::min(band_rows, out_height - y0));
    }
  }
}

}  // namespace epd::internal
