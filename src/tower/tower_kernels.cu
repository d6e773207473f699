// The checkpoint towers' fused CUDA kernels (tower_kernels.h): residual add +
// norm, rotary in place on q and k, and the MLP activation (gated or not).
// Written for these shapes: rows are tokens (up to tens of thousands), widths
// are a ViT's (1152-1280 for the norms, 3456-4352 for the MLP), so each
// kernel gives one block to a row and keeps the row in registers.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "tower_kernels.h"

namespace epd::tower_kernels {
namespace {

template <typename T>
struct Cvt;
template <>
struct Cvt<float> {
  __device__ static float To(float x) { return x; }
  __device__ static float From(float x) { return x; }
};
template <>
struct Cvt<__half> {
  __device__ static float To(__half x) { return __half2float(x); }
  __device__ static __half From(float x) { return __float2half_rn(x); }
};
template <>
struct Cvt<__nv_bfloat16> {
  __device__ static float To(__nv_bfloat16 x) { return __bfloat162float(x); }
  __device__ static __nv_bfloat16 From(float x) { return __float2bfloat16_rn(x); }
};

// kVec elements moved as one aligned load or store (16 bytes when vectorised).
template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) Pack {
  T v[kVec];
};

template <typename T, int kVec>
__device__ Pack<T, kVec> Load(const T* p) {
  return *reinterpret_cast<const Pack<T, kVec>*>(p);
}
template <typename T, int kVec>
__device__ void Store(T* p, const Pack<T, kVec>& v) {
  *reinterpret_cast<Pack<T, kVec>*>(p) = v;
}

__device__ float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// The sum of v over the block (blockDim.x a multiple of 32), in every thread.
__device__ float BlockSum(float v, float* scratch) {
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const int warp = static_cast<int>(threadIdx.x >> 5u);
  v = WarpSum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = static_cast<int>((blockDim.x + 31u) >> 5u);
  const float total = WarpSum(lane < warps ? scratch[lane] : 0.f);
  __syncthreads();  // the next call may overwrite scratch
  return total;
}

template <typename T, int kVec, int kIters>
__global__ void AddNormKernel(T* residual, const T* delta, T* out, const T* weight, const T* bias, int width, float eps,
                              bool rms) {
  using C = Cvt<T>;
  __shared__ float scratch[32];
  const std::int64_t base = static_cast<std::int64_t>(blockIdx.x) * width;
  float x[kIters * kVec];
  float sum = 0.f;
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int col = (it * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x)) * kVec;
    if (col < width) {
      Pack<T, kVec> r = Load<T, kVec>(residual + base + col);
      if (delta != nullptr) {
        const Pack<T, kVec> d = Load<T, kVec>(delta + base + col);
#pragma unroll
        for (int k = 0; k < kVec; ++k) r.v[k] = C::From(C::To(r.v[k]) + C::To(d.v[k]));
        Store<T, kVec>(residual + base + col, r);
      }
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        x[it * kVec + k] = C::To(r.v[k]);
        sum += x[it * kVec + k];
      }
    } else {
#pragma unroll
      for (int k = 0; k < kVec; ++k) x[it * kVec + k] = 0.f;
    }
  }
  float mean = 0.f;
  float spread = 0.f;
  if (rms) {
#pragma unroll
    for (int i = 0; i < kIters * kVec; ++i) spread += x[i] * x[i];  // padding entries are 0
  } else {
    mean = BlockSum(sum, scratch) / static_cast<float>(width);
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int col = (it * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x)) * kVec;
      if (col < width) {
#pragma unroll
        for (int k = 0; k < kVec; ++k) spread += (x[it * kVec + k] - mean) * (x[it * kVec + k] - mean);
      }
    }
  }
  const float rstd = rsqrtf(BlockSum(spread, scratch) / static_cast<float>(width) + eps);
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int col = (it * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x)) * kVec;
    if (col >= width) continue;
    const Pack<T, kVec> w = Load<T, kVec>(weight + col);
    Pack<T, kVec> o;
    if (rms) {
#pragma unroll
      for (int k = 0; k < kVec; ++k) o.v[k] = C::From(C::To(w.v[k]) * C::To(C::From(x[it * kVec + k] * rstd)));
    } else {
      const Pack<T, kVec> b = Load<T, kVec>(bias + col);
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        o.v[k] = C::From((x[it * kVec + k] - mean) * rstd * C::To(w.v[k]) + C::To(b.v[k]));
      }
    }
    Store<T, kVec>(out + base + col, o);
  }
}

template <typename T>
__global__ void RotaryKernel(T* qkv, std::int64_t row_stride, int heads, int half, const float* cos, const float* sin) {
  using C = Cvt<T>;
  T* row = qkv + static_cast<std::int64_t>(blockIdx.x) * row_stride;
  const float* c = cos + static_cast<std::int64_t>(blockIdx.x) * half;
  const float* s = sin + static_cast<std::int64_t>(blockIdx.x) * half;
  const int pairs = 2 * heads * half;  // q's heads, then k's
  for (int i = static_cast<int>(threadIdx.x); i < pairs; i += static_cast<int>(blockDim.x)) {
    const int head = i / half;
    const int j = i - head * half;
    T* p = row + static_cast<std::int64_t>(head) * 2 * half;
    const float x1 = C::To(p[j]);
    const float x2 = C::To(p[j + half]);
    p[j] = C::From(x1 * c[j] - x2 * s[j]);
    p[j + half] = C::From(x2 * c[j] + x1 * s[j]);
  }
}

__device__ float Apply(Activation act, float g) {
  switch (act) {
    case Activation::kQuickGelu:
      return g / (1.f + expf(-1.702f * g));  // x * sigmoid(1.702 x)
    case Activation::kSilu:
      return g / (1.f + expf(-g));
    case Activation::kGeluTanh:
      return 0.5f * g * (1.f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
    case Activation::kGelu:
      return 0.5f * g * (1.f + erff(g * 0.7071067811865476f));
  }
  return g;
}

// No __restrict__: out may equal in (an activation in place).
template <typename T, int kVec, bool kGated>
__global__ void ActivationKernel(const T* in, T* out, int width, std::int64_t in_stride, Activation act) {
  using C = Cvt<T>;
  const T* src = in + static_cast<std::int64_t>(blockIdx.x) * in_stride;
  T* dst = out + static_cast<std::int64_t>(blockIdx.x) * width;
  for (int col = static_cast<int>(threadIdx.x) * kVec; col < width; col += static_cast<int>(blockDim.x) * kVec) {
    const Pack<T, kVec> g = Load<T, kVec>(src + col);
    Pack<T, kVec> o;
    if constexpr (kGated) {
      const Pack<T, kVec> u = Load<T, kVec>(src + width + col);
#pragma unroll
      for (int k = 0; k < kVec; ++k) o.v[k] = C::From(Apply(act, C::To(g.v[k])) * C::To(u.v[k]));
    } else {
#pragma unroll
      for (int k = 0; k < kVec; ++k) o.v[k] = C::From(Apply(act, C::To(g.v[k])));
    }
    Store<T, kVec>(dst + col, o);
  }
}

// --- launchers ---------------------------------------------------------------

const char* Report(const char* kernel) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return nullptr;
  thread_local char message[256];
  std::snprintf(message, sizeof(message), "tower kernel %s: %s (%s)", kernel, cudaGetErrorString(e),
                cudaGetErrorName(e));
  return message;
}

bool Aligned16(const void* p) { return p == nullptr || reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

int RoundUpWarp(std::int64_t n) { return static_cast<int>((n + 31) / 32 * 32); }

template <typename T, int kVec, int kIters>
void LaunchAddNormIters(void* residual, const void* delta, void* out, const void* weight, const void* bias,
                        std::int64_t rows, int width, float eps, bool rms, int threads, cudaStream_t stream) {
  AddNormKernel<T, kVec, kIters><<<static_cast<unsigned>(rows), static_cast<unsigned>(threads), 0, stream>>>(
      static_cast<T*>(residual), static_cast<const T*>(delta), static_cast<T*>(out), static_cast<const T*>(weight),
      static_cast<const T*>(bias), width, eps, rms);
}

template <typename T, int kVec>
const char* LaunchAddNormVec(void* residual, const void* delta, void* out, const void* weight, const void* bias,
                             std::int64_t rows, std::int64_t width, float eps, bool rms, cudaStream_t stream) {
  const std::int64_t slots = (width + kVec - 1) / kVec;  // kVec-element slots per row
  const int threads = RoundUpWarp(slots < 1024 ? slots : 1024);
  const std::int64_t iters = (slots + threads - 1) / threads;
  const int w = static_cast<int>(width);
  if (iters <= 1) {
    LaunchAddNormIters<T, kVec, 1>(residual, delta, out, weight, bias, rows, w, eps, rms, threads, stream);
  } else if (iters <= 2) {
    LaunchAddNormIters<T, kVec, 2>(residual, delta, out, weight, bias, rows, w, eps, rms, threads, stream);
  } else if (iters <= 4) {
    LaunchAddNormIters<T, kVec, 4>(residual, delta, out, weight, bias, rows, w, eps, rms, threads, stream);
  } else if (iters <= 8) {
    LaunchAddNormIters<T, kVec, 8>(residual, delta, out, weight, bias, rows, w, eps, rms, threads, stream);
  } else {
    return "tower kernel AddNorm: row too wide";
  }
  return Report("AddNorm");
}

template <typename T>
const char* LaunchAddNorm(void* residual, const void* delta, void* out, const void* weight, const void* bias,
                          std::int64_t rows, std::int64_t width, float eps, bool rms, cudaStream_t stream) {
  constexpr int kVec = static_cast<int>(16 / sizeof(T));
  const bool vec = width % kVec == 0 && Aligned16(residual) && Aligned16(delta) && Aligned16(out) &&
                   Aligned16(weight) && Aligned16(rms ? nullptr : bias);
  if (vec) return LaunchAddNormVec<T, kVec>(residual, delta, out, weight, bias, rows, width, eps, rms, stream);
  return LaunchAddNormVec<T, 1>(residual, delta, out, weight, bias, rows, width, eps, rms, stream);
}

template <typename T>
const char* LaunchRotary(void* qkv, std::int64_t rows, std::int64_t row_stride, std::int64_t heads,
                         std::int64_t head_dim, const float* cos, const float* sin, cudaStream_t stream) {
  const int half = static_cast<int>(head_dim / 2);
  const std::int64_t pairs = 2 * heads * half;
  const int threads = RoundUpWarp(pairs < 256 ? pairs : 256);
  RotaryKernel<T><<<static_cast<unsigned>(rows), static_cast<unsigned>(threads), 0, stream>>>(
      static_cast<T*>(qkv), row_stride, static_cast<int>(heads), half, cos, sin);
  return Report("RotaryInPlace");
}

template <typename T, int kVec>
void LaunchActivationVec(const void* in, void* out, std::int64_t rows, std::int64_t width, std::int64_t in_stride,
                         bool gated, Activation act, cudaStream_t stream) {
  const std::int64_t slots = (width + kVec - 1) / kVec;
  const int threads = RoundUpWarp(slots < 256 ? slots : 256);
  const auto* src = static_cast<const T*>(in);
  auto* dst = static_cast<T*>(out);
  const auto blocks = static_cast<unsigned>(rows);
  if (gated) {
    ActivationKernel<T, kVec, true>
        <<<blocks, static_cast<unsigned>(threads), 0, stream>>>(src, dst, static_cast<int>(width), in_stride, act);
  } else {
    ActivationKernel<T, kVec, false>
        <<<blocks, static_cast<unsigned>(threads), 0, stream>>>(src, dst, static_cast<int>(width), in_stride, act);
  }
}

template <typename T>
const char* LaunchActivation(const void* in, void* out, std::int64_t rows, std::int64_t width, std::int64_t in_stride,
                             bool gated, Activation act, cudaStream_t stream) {
  constexpr int kVec = static_cast<int>(16 / sizeof(T));
  const bool vec = width % kVec == 0 && in_stride % kVec == 0 && Aligned16(in) && Aligned16(out);
  if (vec) {
    LaunchActivationVec<T, kVec>(in, out, rows, width, in_stride, gated, act, stream);
  } else {
    LaunchActivationVec<T, 1>(in, out, rows, width, in_stride, gated, act, stream);
  }
  return Report("ActivationForward");
}

// Calls launch(Tag<T>{}) with T the element type of `dtype`.
template <typename T>
struct Tag {
  using type = T;
};
template <typename Launch>
const char* ByDType(DType dtype, const char* unknown, Launch&& launch) {
  switch (dtype) {
    case DType::kFloat32:
      return launch(Tag<float>{});
    case DType::kFloat16:
      return launch(Tag<__half>{});
    case DType::kBFloat16:
      return launch(Tag<__nv_bfloat16>{});
  }
  return unknown;
}

}  // namespace

const char* AddNorm(DType dtype, void* residual, const void* delta, void* out, const void* weight, const void* bias,
                    std::int64_t rows, std::int64_t width, float eps, bool rms, void* stream) {
  if (rows == 0) return nullptr;
  if (width < 1 || width > kMaxNormWidth) return "tower kernel AddNorm: width out of range [1, 8192]";
  if (!rms && bias == nullptr) return "tower kernel AddNorm: LayerNorm needs a bias";
  return ByDType(dtype, "tower kernel AddNorm: unknown dtype", [&](auto tag) {
    using T = typename decltype(tag)::type;
    return LaunchAddNorm<T>(residual, delta, out, weight, bias, rows, width, eps, rms,
                            static_cast<cudaStream_t>(stream));
  });
}

const char* RotaryInPlace(DType dtype, void* qkv, std::int64_t rows, std::int64_t row_stride, std::int64_t heads,
                          std::int64_t head_dim, const float* cos, const float* sin, void* stream) {
  if (rows == 0) return nullptr;
  if (head_dim < 2 || head_dim % 2 != 0 || heads < 1) return "tower kernel RotaryInPlace: bad heads or head_dim";
  if (row_stride < 2 * heads * head_dim) return "tower kernel RotaryInPlace: row_stride below 2 * heads * head_dim";
  return ByDType(dtype, "tower kernel RotaryInPlace: unknown dtype", [&](auto tag) {
    using T = typename decltype(tag)::type;
    return LaunchRotary<T>(qkv, rows, row_stride, heads, head_dim, cos, sin, static_cast<cudaStream_t>(stream));
  });
}

const char* ActivationForward(DType dtype, const void* in, void* out, std::int64_t rows, std::int64_t width,
                              std::int64_t in_stride, bool gated, Activation act, void* stream) {
  if (rows == 0 || width == 0) return nullptr;
  if (in_stride < (gated ? 2 : 1) * width) return "tower kernel ActivationForward: in_stride too small";
  return ByDType(dtype, "tower kernel ActivationForward: unknown dtype", [&](auto tag) {
    using T = typename decltype(tag)::type;
    return LaunchActivation<T>(in, out, rows, width, in_stride, gated, act, static_cast<cudaStream_t>(stream));
  });
}

}  // namespace epd::tower_kernels
