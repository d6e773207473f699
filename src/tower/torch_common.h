// src/tower/torch_common.h (internal to the tower backends): what the
// TorchScript tower and the checkpoint towers share, so each rule has one
// home: libtorch error text, dtype mapping, host copies of outputs, the
// batch checks of the VisionTower contract, device parsing and the malloc
// tuning. Includes libtorch; include it only from the backends' .cc files.
#pragma once

#include <ATen/ATen.h>
#include <torch/cuda.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <cstring>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "epd/core/embedding.h"
#include "epd/core/status.h"
#include "epd/core/vision_tower.h"

namespace epd::internal {

// Guards the int64 arithmetic of the packed size: no real grid comes close.
inline constexpr std::int64_t kMaxGridSide = std::int64_t{1} << 20;
inline constexpr std::int64_t kMaxTotalPatches = std::int64_t{1} << 32;

// Raises glibc malloc's mmap and trim thresholds once per process, so the
// forward's large temporaries are reused instead of page-faulted back in on
// every call (measured in torch_tower.cc's design notes). 32 MiB is the largest mmap threshold glibc accepts on
// 64-bit (DEFAULT_MMAP_THRESHOLD_MAX); larger blocks are still mapped.
inline void TuneMallocOnce() {
#if defined(__GLIBC__)
  static std::once_flag once;
  std::call_once(once, [] {
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 256 << 20);
  });
#endif
}

inline std::string TorchMessage(const std::exception& e) {
  if (const auto* ce = dynamic_cast<const c10::Error*>(&e)) return ce->what_without_backtrace();
  return e.what();
}

inline std::string ShapeString(const at::Tensor& t) {
  std::string s = "[";
  for (std::int64_t d = 0; d < t.dim(); ++d) {
    if (d > 0) s += ", ";
    s += std::to_string(t.size(d));
  }
  return s + "]";
}

inline at::ScalarType ToScalarType(DType d) {
  switch (d) {
    case DType::kFloat32:
      return at::kFloat;
    case DType::kBFloat16:
      return at::kBFloat16;
    case DType::kFloat16:
      return at::kHalf;
  }
  return at::kFloat;
}

inline std::vector<std::byte> HostBytes(const at::Tensor& t, at::ScalarType dtype) {
  at::Tensor host = t.to(at::kCPU, dtype).contiguous();
  std::vector<std::byte> bytes(host.numel() * host.element_size());
  if (!bytes.empty()) std::memcpy(bytes.data(), host.data_ptr(), bytes.size());
  return bytes;
}

// Checks a batch against a tower of `patch_dim` floats per row and merge
// size `m`; sets the batch's patch and post-merge token totals.
inline Status ValidateTowerItems(std::span<const TowerItem> items, std::int64_t patch_dim, std::int64_t m,
                                 std::int64_t* patches, std::int64_t* tokens) {
  *patches = 0;
  *tokens = 0;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const TowerItem& item = items[i];
    const GridTHW& g = item.grid;
    const std::string where = "tower item " + std::to_string(i) + ": ";
    if (item.patches == nullptr) return InvalidArgument(where + "patches is null");
    if (item.patch_dim != 0 && item.patch_dim != patch_dim) {
      return InvalidArgument(where + "patch_dim " + std::to_string(item.patch_dim) + " does not match the tower's " +
                             std::to_string(patch_dim));
    }
    if (g.t < 1 || g.h < 1 || g.w < 1 || g.t > kMaxGridSide || g.h > kMaxGridSide || g.w > kMaxGridSide) {
      return InvalidArgument(where + "grid " + g.ToString() + " must have t, h, w in [1, 2^20]");
    }
    if (g.h % m != 0 || g.w % m != 0) {
      return InvalidArgument(where + "grid " + g.ToString() + ": h and w must be multiples of " + "merge_size " +
                             std::to_string(m));
    }
    *patches += g.patches();
    *tokens += g.tokens(m);
    if (*patches > kMaxTotalPatches) {
      return InvalidArgument(where + "the batch exceeds 2^32 patches");
    }
  }
  return Status::Ok();
}

// "cpu", "cuda" or "cuda:N" -> a device, checking that CUDA is usable.
inline StatusOr<c10::Device> ParseDevice(const std::string& spec) {
  std::optional<c10::Device> device;
  try {
    device.emplace(spec);
  } catch (const std::exception& e) {
    return InvalidArgument("torch tower device '" + spec +
                           "' is not a device (expected \"cpu\", "
                           "\"cuda\" or \"cuda:N\"): " +
                           TorchMessage(e));
  }
  if (device->is_cpu()) {
    if (device->has_index()) return InvalidArgument("torch tower device '" + spec + "': use \"cpu\"");
    return *device;
  }
  if (!device->is_cuda()) {
    return InvalidArgument("torch tower device '" + spec + "': only cpu and cuda are supported");
  }
  if (!torch::cuda::is_available()) {
    return FailedPrecondition("torch tower device '" + spec +
                              "' requested, but CUDA is not available (libtorch built without "
                              "CUDA, or no GPU visible)");
  }
  const auto count = static_cast<std::int64_t>(torch::cuda::device_count());
  const std::int64_t index = device->has_index() ? device->index() : 0;
  if (index >= count) {
    return FailedPrecondition("torch tower device '" + spec + "': only " + std::to_string(count) +
                              " CUDA device(s) visible");
  }
  return c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(index));
}

}  // namespace epd::internal
