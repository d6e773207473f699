// The fused steps of a Qwen-VL block and the attention adapter (tower_ops.h).
//
// Build switches (set by src/tower/checkpoint_library.cmake):
//   EPD_TOWER_CUDA  1 when the CUDA kernels (tower_kernels.cu) are compiled
//                   in, which needs EPD_WITH_CUDA and a CUDA libtorch (its
//                   current stream orders the kernels with ATen's work).
// The flash-attention adapter is compiled for the libtorch versions whose
// at::_flash_attention_forward signature is pinned below; any other version
// runs the grouped path and says so in FlashVarlenUnavailable().
#include "tower_ops.h"

#include <torch/version.h>

#include <cmath>
#include <map>
#include <mutex>
#include <tuple>

#ifndef EPD_TOWER_CUDA
#define EPD_TOWER_CUDA 0
#endif

#if EPD_TOWER_CUDA
#include <ATen/cuda/CUDAContext.h>

#include "tower_kernels.h"
#endif

// aten::_flash_attention_forward(Tensor query, Tensor key, Tensor value,
//     Tensor? cum_seq_q, Tensor? cum_seq_k, SymInt max_q, SymInt max_k,
//     float dropout_p, bool is_causal, bool return_debug_mask, *,
//     float? scale=None, SymInt? window_size_left=None, ...) -> (Tensor output,
//     Tensor softmax_logsumexp, Tensor rng_state, Tensor unused, Tensor debug_attn_mask)
// (aten/src/ATen/native/native_functions.yaml). With cum_seq_* it runs the
// varlen kernel: q, k, v [total, heads, head_dim] with a unit-stride last dim,
// float16/bfloat16; cum_seq int32 [segments + 1] on the device; max_q/max_k
// the longest segment (host ints). Later keyword arguments have defaults, so
// the 11-argument call below is the same call in every pinned version.
// Pinned: 2.4 through 2.11 (2.11 is the GPU machine's).
#if EPD_TOWER_CUDA && TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4 && TORCH_VERSION_MINOR <= 11
#define EPD_TOWER_FLASH_VARLEN 1
#else
#define EPD_TOWER_FLASH_VARLEN 0
#endif

namespace epd::internal {
namespace {

Tensor EagerAct(Act act, const Tensor& x) {
  switch (act) {
    case Act::kQuickGelu:
      return x * at::sigmoid(1.702 * x);  // transformers' QuickGELUActivation
    case Act::kSilu:
      return at::silu(x);
    case Act::kGeluTanh:
      return at::gelu(x, "tanh");
    case Act::kGelu:
      return at::gelu(x);
  }
  return x;
}

Tensor EagerNorm(const Norm& norm, const Tensor& x) {
  if (norm.rms) {
    // Qwen2RMSNorm: the mean of squares accumulated in float32; [rows, 1].
    const Tensor rstd = at::rsqrt(at::mean(at::square(x), {-1}, /*keepdim=*/true, at::kFloat) + kNormEps);
    return norm.weight * (x * rstd.to(x.scalar_type()));
  }
  return at::layer_norm(x, {norm.weight.size(0)}, norm.weight, norm.bias, kNormEps);
}

Tensor RotateHalf(const Tensor& x) {
  const std::int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

#if EPD_TOWER_CUDA
tower_kernels::DType KernelType(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return tower_kernels::DType::kFloat32;
    case at::kHalf:
      return tower_kernels::DType::kFloat16;
    case at::kBFloat16:
      return tower_kernels::DType::kBFloat16;
    default:
      TORCH_CHECK(false, "tower kernels: unsupported dtype ", t);
  }
}

void* CurrentStream() { return at::cuda::getCurrentCUDAStream().stream(); }

void CheckLaunch(const char* error) { TORCH_CHECK(error == nullptr, error); }

void CheckKernelInput(const Tensor& t, const char* what) {
  TORCH_CHECK(t.is_cuda() && t.is_contiguous() && t.dim() == 2, "tower kernels: ", what,
              " must be a contiguous 2-D CUDA tensor");
}

Tensor KernelNorm(Tensor& x, const Tensor* delta, const Norm& norm) {
  CheckKernelInput(x, "the norm's input");
  if (delta != nullptr) {
    CheckKernelInput(*delta, "the residual delta");
    TORCH_CHECK(delta->sizes() == x.sizes() && delta->scalar_type() == x.scalar_type(),
                "tower kernels: residual delta differs from the residual");
  }
  Tensor out = at::empty_like(x);
  CheckLaunch(tower_kernels::AddNorm(KernelType(x.scalar_type()), x.data_ptr(),
                                     delta != nullptr ? delta->data_ptr() : nullptr, out.data_ptr(),
                                     norm.weight.data_ptr(), norm.rms ? nullptr : norm.bias.data_ptr(), x.size(0),
                                     x.size(1), static_cast<float>(kNormEps), norm.rms, CurrentStream()));
  return out;
}
#endif

#if EPD_TOWER_CUDA
bool KernelNormFits(const Tensor& x) { return x.size(1) <= tower_kernels::kMaxNormWidth; }
#endif

}  // namespace

Act ParseAct(const std::string& a) {
  return a == "quick_gelu"          ? Act::kQuickGelu
         : a == "silu"              ? Act::kSilu
         : a == "gelu_pytorch_tanh" ? Act::kGeluTanh
                                    : Act::kGelu;
}

bool KernelsCompiled() { return EPD_TOWER_CUDA != 0; }

Tensor Linear::operator()(const Tensor& x) const {
  if (bias.defined()) return at::addmm(bias, x, weight.t());
  return at::mm(x, weight.t());
}

Tensor ApplyNorm(const Norm& norm, const Tensor& x, bool kernels) {
#if EPD_TOWER_CUDA
  if (kernels && KernelNormFits(x)) {
    Tensor in = x;
    return KernelNorm(in, nullptr, norm);
  }
#endif
  (void)kernels;
  return EagerNorm(norm, x);
}

Tensor AddNorm(Tensor& x, const Tensor& delta, const Norm& norm, bool kernels) {
#if EPD_TOWER_CUDA
  if (kernels && KernelNormFits(x)) return KernelNorm(x, &delta, norm);
#endif
  (void)kernels;
  x.add_(delta);
  return EagerNorm(norm, x);
}

std::pair<Tensor, Tensor> RotaryQK(Tensor& qkv, std::int64_t heads, std::int64_t head_dim, const Tensor& cos,
                                   const Tensor& sin, const Tensor& cos_full, const Tensor& sin_full, bool kernels) {
  const std::int64_t n = qkv.size(0);
  const Tensor split = qkv.view({n, 3, heads, head_dim});
#if EPD_TOWER_CUDA
  if (kernels) {
    CheckKernelInput(qkv, "qkv");
    TORCH_CHECK(cos.scalar_type() == at::kFloat && cos.is_contiguous() && sin.is_contiguous() && cos.size(0) == n &&
                    cos.size(1) == head_dim / 2,
                "tower kernels: rotary tables must be contiguous float32 [rows, head_dim / 2]");
    CheckLaunch(tower_kernels::RotaryInPlace(KernelType(qkv.scalar_type()), qkv.data_ptr(), n, qkv.stride(0), heads,
                                             head_dim, cos.data_ptr<float>(), sin.data_ptr<float>(), CurrentStream()));
    return {split.select(1, 0), split.select(1, 1)};
  }
#endif
  (void)kernels;
  (void)cos;
  (void)sin;
  auto rotate = [&](const Tensor& t) { return t * cos_full.unsqueeze(1) + RotateHalf(t) * sin_full.unsqueeze(1); };
  return {rotate(split.select(1, 0)), rotate(split.select(1, 1))};
}

Tensor Activation(const Tensor& in, std::int64_t width, Act act, bool gated, bool kernels) {
#if EPD_TOWER_CUDA
  if (kernels) {
    CheckKernelInput(in, "the activation's input");
    Tensor out = gated ? at::empty({in.size(0), width}, in.options()) : in;
    CheckLaunch(tower_kernels::ActivationForward(KernelType(in.scalar_type()), in.data_ptr(), out.data_ptr(),
                                                 in.size(0), width, in.stride(0), gated,
                                                 static_cast<tower_kernels::Activation>(act), CurrentStream()));
    return out;
  }
#endif
  (void)kernels;
  if (gated) return EagerAct(act, in.narrow(1, 0, width)) * in.narrow(1, width, width);
  return EagerAct(act, in);
}

// --- attention -----------------------------------------------------------------

namespace {

#if EPD_TOWER_FLASH_VARLEN
Tensor FlashVarlen(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens,
                   std::int64_t max_length) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  auto result = at::_flash_attention_forward(q, k, v, cu_seqlens, cu_seqlens, max_length, max_length,
                                             /*dropout_p=*/0.0, /*is_causal=*/false,
                                             /*return_debug_mask=*/false, scale);
  return std::get<0>(result);
}
#endif

// Stacks a group's segments as [count, heads, length, head_dim].
Tensor Stack(const Tensor& t, const DeviceGroup& group) {
  const Tensor r =
      group.begin >= 0 ? t.narrow(0, group.begin, group.count * group.length) : t.index_select(0, group.rows);
  return r.view({group.count, group.length, t.size(1), t.size(2)}).permute({0, 2, 1, 3});
}

Tensor AttendGroup(const Tensor& q, const Tensor& k, const Tensor& v, const DeviceGroup& group, bool sdpa) {
  const Tensor qs = Stack(q, group);
  const Tensor ks = Stack(k, group);
  const Tensor vs = Stack(v, group);
  Tensor o;
#if TORCH_VERSION_MAJOR >= 2
  if (sdpa) o = at::scaled_dot_product_attention(qs, ks, vs);  // fused (flash / memory-efficient) kernels
#else
  (void)sdpa;
#endif
  if (!o.defined()) {
    const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(2)));
    const Tensor scores = at::matmul(qs, ks.transpose(-2, -1)) * scale;
    const Tensor probs = at::softmax(scores, -1, at::kFloat).to(q.scalar_type());
    o = at::matmul(probs, vs);
  }
  return o.permute({0, 2, 1, 3}).reshape({group.count * group.length, q.size(1) * q.size(2)});
}

}  // namespace

std::string FlashVarlenUnavailable(const c10::Device& device, at::ScalarType dtype) {
  if (!device.is_cuda()) return "flash varlen attention needs a CUDA device";
  if (dtype != at::kHalf && dtype != at::kBFloat16) return "flash varlen attention needs float16 or bfloat16";
#if EPD_TOWER_FLASH_VARLEN
  static std::mutex mu;
  static std::map<std::pair<int, int>, std::string> probed;
  std::lock_guard<std::mutex> lock(mu);
  const std::pair<int, int> key{device.index(), static_cast<int>(dtype)};
  if (const auto it = probed.find(key); it != probed.end()) return it->second;
  std::string why;
  try {
    // Two segments (8 and 16 rows) against the explicit path: catches a
    // build without flash kernels and any layout the adapter gets wrong.
    const auto opts = at::TensorOptions().device(device).dtype(dtype);
    const Tensor q = at::randn({24, 2, 64}, opts);
    const Tensor k = at::randn({24, 2, 64}, opts);
    const Tensor v = at::randn({24, 2, 64}, opts);
    const Tensor cu = at::tensor(std::vector<std::int32_t>{0, 8, 24}, at::kInt).to(device);
    const Tensor got = FlashVarlen(q, k, v, cu, 16).reshape({24, 128}).to(at::kFloat);
    DeviceSegments segs;
    segs.groups.resize(2);
    segs.groups[0].length = 8;
    segs.groups[0].count = 1;
    segs.groups[0].begin = 0;
    segs.groups[1].length = 16;
    segs.groups[1].count = 1;
    segs.groups[1].begin = 8;
    segs.rows = 24;
    const Tensor want = AttendSegments(q, k, v, segs, AttentionImpl::kExplicit).to(at::kFloat);
    const double err = (got - want).abs().max().item<double>() / want.abs().max().item<double>();
    if (!(err < 2e-2)) why = "the probe disagreed with explicit attention (relative error " + std::to_string(err) + ")";
  } catch (const std::exception& e) {
    why = std::string("the probe call failed: ") + e.what();
  }
  probed[key] = why;
  return why;
#else
  return "flash varlen attention: at::_flash_attention_forward is not pinned for libtorch " TORCH_VERSION
         " in this build (tower_ops.cc pins 2.4-2.11 with EPD_WITH_CUDA and a CUDA libtorch)";
#endif
}

Tensor AttendSegments(const Tensor& q, const Tensor& k, const Tensor& v, const DeviceSegments& segments,
                      AttentionImpl impl) {
  const std::int64_t n = q.size(0);
  const std::int64_t width = q.size(1) * q.size(2);
#if EPD_TOWER_FLASH_VARLEN
  if (impl == AttentionImpl::kVarlen) {
    return FlashVarlen(q, k, v, segments.cu_seqlens, segments.max_length).view({n, width});
  }
#endif
  const bool sdpa = impl != AttentionImpl::kExplicit && q.is_cuda();
  const std::vector<DeviceGroup>& groups = segments.groups;
  if (groups.size() == 1 && groups[0].begin == 0 && groups[0].count * groups[0].length == n) {
    return AttendGroup(q, k, v, groups[0], sdpa);
  }
  Tensor out = at::empty({n, width}, q.options());
  for (const DeviceGroup& group : groups) {
    const Tensor o = AttendGroup(q, k, v, group, sdpa);
    if (group.begin >= 0) {
      out.narrow(0, group.begin, o.size(0)).copy_(o);
    } else {
      out.index_copy_(0, group.rows, o);
    }
  }
  return out;
}

}  // namespace epd::internal
