// src/tower/tower_ops.h (internal to the checkpoint towers; includes
// libtorch): the steps of a Qwen-VL block that have a fused CUDA kernel
// (tower_kernels.cu) and a plain libtorch composition, behind one call each,
// and the one attention adapter over cu_seqlens.
//
// Every call takes `kernels`: true runs the CUDA kernel, which the caller
// asks for only when KernelsCompiled() and the tensors are on a CUDA device
// (the tower decides once, at load); false runs the ATen composition, which
// is what a CPU build always runs. Shapes are 2-D [rows, width], row-major
// and contiguous unless said otherwise; dtypes float32, float16 or bfloat16
// (the compute dtype); the norms' weights and biases are in the compute dtype.
// Numerics: the kernels read the compute dtype, accumulate in float32 and
// round once to the compute dtype per stored value, where the eager
// composition rounds after each ATen op; in float32 both are the same
// arithmetic up to reassociation.
// Errors: libtorch's c10::Error, or c10::Error naming the kernel and the CUDA
// error; the tower turns both into kInternal.
// Thread safety: stateless, except the flash probe (once per process).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace epd::internal {

using at::Tensor;

// Every norm of the three towers uses eps 1e-6 (modeling_qwen2_vl.py,
// modeling_qwen2_5_vl.py, modeling_qwen3_vl.py).
inline constexpr double kNormEps = 1e-6;

enum class Act { kQuickGelu, kSilu, kGeluTanh, kGelu };
// "quick_gelu", "silu", "gelu_pytorch_tanh"; anything else is GELU (erf).
Act ParseAct(const std::string& hidden_act);

// True when this build compiled the CUDA kernels in (EPD_WITH_CUDA with a
// CUDA libtorch).
bool KernelsCompiled();

// weight [out, in], bias [out] or undefined. operator() on x [rows, in]
// (2-D, contiguous) is one GEMM with the bias inside it: addmm(bias, x,
// weight^T), or mm without a bias. Result [rows, out].
struct Linear {
  Tensor weight;
  Tensor bias;
  Tensor operator()(const Tensor& x) const;
};

// LayerNorm (weight and bias) or RMSNorm (weight only) over the last dim.
struct Norm {
  Tensor weight;
  Tensor bias;  // undefined for RMSNorm
  bool rms = false;
};

// norm(x). RMSNorm: weight * to_dtype(x * rsqrt(mean(x^2) + eps)), the
// mean in float32 (Qwen2RMSNorm). LayerNorm: at::layer_norm.
Tensor ApplyNorm(const Norm& norm, const Tensor& x, bool kernels);

// x += delta in place (rounded to x's dtype, as eager addition rounds),
// then returns norm(x) as a new tensor. x, delta [rows, width].
Tensor AddNorm(Tensor& x, const Tensor& delta, const Norm& norm, bool kernels);

// The 2D rotary embedding of q and k (apply_rotary_pos_emb_vision): with
// x1, x2 the halves of a head, x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin.
// qkv [rows, 3 * heads * head_dim] (the fused QKV GEMM's output, q then k
// then v, each head contiguous); cos/sin: [rows, head_dim / 2] float32, the
// angle of each pair. With kernels, q and k are rotated in place inside qkv
// and returned as views of it; without, cos_full/sin_full ([rows, head_dim]
// in the compute dtype, the halves repeated) give new q and k tensors.
// Returns (q, k) as [rows, heads, head_dim].
std::pair<Tensor, Tensor> RotaryQK(Tensor& qkv, std::int64_t heads, std::int64_t head_dim, const Tensor& cos,
                                   const Tensor& sin, const Tensor& cos_full, const Tensor& sin_full, bool kernels);

// The MLP's activation. gated: in [rows, 2 * width] holds gate then up
// (the fused gate-up GEMM's output); returns act(gate) * up, [rows, width].
// Not gated: in [rows, width]; returns act(in) (in place with kernels).
Tensor Activation(const Tensor& in, std::int64_t width, Act act, bool gated, bool kernels);

// How attention over segments runs.
enum class AttentionImpl {
  kVarlen,    // one at::_flash_attention_forward call over cu_seqlens
  kGrouped,   // segments of one length stacked: one SDPA call per length
  kExplicit,  // the same groups as matmul + float32 softmax + matmul
};

// A group of equal-length segments on the tower's device (SegmentGroup).
struct DeviceGroup {
  std::int64_t length = 0;
  std::int64_t count = 0;
  std::int64_t begin = -1;  // first row when contiguous
  Tensor rows;              // int64 [count * length] when not contiguous
};

// The segments of one attention kind on the tower's device.
struct DeviceSegments {
  Tensor cu_seqlens;  // int32 [segments + 1]
  std::int64_t max_length = 0;
  std::int64_t rows = 0;
  std::vector<DeviceGroup> groups;
};

// Why flash varlen cannot run for tensors of `dtype` on `device`, or "" when
// it can: it needs a CUDA device, float16 or bfloat16, a libtorch whose
// _flash_attention_forward signature is pinned in tower_ops.cc, and a probe
// call that succeeds (once per process and dtype). Call outside CUDA graph
// capture.
std::string FlashVarlenUnavailable(const c10::Device& device, at::ScalarType dtype);

// Block-diagonal attention of q, k, v ([rows, heads, head_dim]; each may be
// a view with a row stride, the last dim contiguous) over `segments`: each
// row attends to the rows of its segment only, scaled by 1 / sqrt(head_dim).
// kVarlen is for callers that checked FlashVarlenUnavailable() == ""; in a
// build without the pinned signature it runs kGrouped. kGrouped uses SDPA on
// CUDA with libtorch >= 2, the explicit path otherwise. Returns
// [rows, heads * head_dim]. Reads nothing back to the host.
Tensor AttendSegments(const Tensor& q, const Tensor& k, const Tensor& v, const DeviceSegments& segments,
                      AttentionImpl impl);

}  // namespace epd::internal
