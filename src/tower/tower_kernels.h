// src/tower/tower_kernels.h (internal): the checkpoint towers' fused CUDA
// kernels (tower_kernels.cu), on raw device pointers, so that neither torch
// nor CUDA headers are needed to call them; tower_ops.cc wraps them for
// tensors. Compiled only with EPD_WITH_CUDA (nvcc, sm_90 by default).
//
// Common contract:
//   - every pointer is device memory; `stream` is a cudaStream_t (the
//     caller's current torch stream, so the kernels order with the ATen work
//     around them and are captured into CUDA graphs with it);
//   - dtype: the element type of the activations and of the norm weights;
//     the rotary tables are float32;
//   - arithmetic in float32, one rounding to dtype per stored value;
//   - rows are row-major; a vectorised path (16-byte loads) runs when the
//     widths and pointers allow it, a scalar path otherwise;
//   - returns nullptr on success, else a static message naming the kernel
//     and the CUDA error of the launch (cudaGetLastError); execution errors
//     surface at the next synchronising call, as for any CUDA kernel.
// Thread safety: stateless; launches from several threads are safe.
#pragma once

#include <cstdint>

namespace epd::tower_kernels {

enum class DType { kFloat32, kFloat16, kBFloat16 };

// Activations, numbered as tower_ops.h's Act.
enum class Activation { kQuickGelu = 0, kSilu = 1, kGeluTanh = 2, kGelu = 3 };

// The widest row the norm kernel holds in registers: 8192 elements (1024
// threads x 8). Wider rows return an error; tower_ops.cc falls back.
inline constexpr std::int64_t kMaxNormWidth = 8192;

// Per row of [rows, width]: if delta is non-null, residual += delta (stored
// rounded to dtype); then out = norm(residual). rms: RMSNorm,
// out = weight * round(x * rsqrt(mean(x^2) + eps)) (Qwen2RMSNorm's two
// roundings); else LayerNorm, out = (x - mean) * rsqrt(var + eps) * weight
// + bias (biased variance, one rounding). bias is ignored for rms.
// residual, delta and out are contiguous [rows, width]; out must not alias
// residual or delta. One block per row. O(rows * width).
const char* AddNorm(DType dtype, void* residual, const void* delta, void* out, const void* weight, const void* bias,
                    std::int64_t rows, std::int64_t width, float eps, bool rms, void* stream);

// Rotates q and k in place inside qkv [rows, row_stride] (q at column 0, k at
// heads * head_dim, each head's head_dim values contiguous): for pair
// j < head_dim / 2 of each head, (x1, x2) = (x[j], x[j + head_dim / 2]) ->
// (x1 cos - x2 sin, x2 cos + x1 sin), cos/sin [rows, head_dim / 2] float32.
// head_dim even. One block per row. O(rows * heads * head_dim).
const char* RotaryInPlace(DType dtype, void* qkv, std::int64_t rows, std::int64_t row_stride, std::int64_t heads,
                          std::int64_t head_dim, const float* cos, const float* sin, void* stream);

// out[r, c] = act(in[r, c]) * (gated ? in[r, width + c] : 1) for c < width.
// in [rows, in_stride] with in_stride >= (gated ? 2 : 1) * width; out
// [rows, width] contiguous; out may equal in when not gated (in place).
// One block per row. O(rows * width).
const char* ActivationForward(DType dtype, const void* in, void* out, std::int64_t rows, std::int64_t width,
                              std::int64_t in_stride, bool gated, Activation act, void* stream);

}  // namespace epd::tower_kernels
